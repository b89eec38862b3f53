"""Exact-arithmetic (sympy rational) policy evaluation and occupancy for tiny MDPs.

spec: specs/mdp.md sections 2-3 (the same equations as :mod:`tabular.evaluation`, solved over the
rationals QQ with sympy's ``DomainMatrix``). Used by the tests to check the float64 path to 1e-12
and by the report to print exact numbers. Inputs may be ints, ``fractions.Fraction``, sympy
Rationals, or floats (a float is taken as the exact binary rational it stores, so a float MDP
and its exact copy describe the same problem). Results are numpy object arrays of
``sympy.Rational`` (scalars: ``sympy.Rational``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import sympy
from sympy.polys.domains import QQ
from sympy.polys.matrices import DomainMatrix

from tabular.evaluation import _nonterminal_states as float_nonterminal_states
from tabular.mdp import MDP

__all__ = [
    "to_rational",
    "rational_array",
    "ExactMDP",
    "exact_policy_evaluation",
    "exact_q_values",
    "exact_advantages",
    "exact_expected_return",
    "exact_state_occupancy",
    "exact_state_action_occupancy",
]


def to_rational(x) -> sympy.Rational:
    """Exact ``sympy.Rational`` of an int, Fraction, sympy Rational or finite float (its binary value)."""
    if isinstance(x, (bool, np.bool_)):
        raise TypeError("expected a number, got a bool")
    if isinstance(x, Fraction):
        return sympy.Rational(x.numerator, x.denominator)
    if isinstance(x, (int, np.integer)):
        return sympy.Integer(int(x))
    if isinstance(x, (float, np.floating)):
        if not np.isfinite(x):
            raise ValueError(f"expected a finite number, got {x!r}")
        num, den = float(x).as_integer_ratio()
        return sympy.Rational(num, den)
    if isinstance(x, sympy.Rational):
        return x
    raise TypeError(f"expected an int, float, Fraction or sympy Rational, got {type(x).__name__}")


def rational_array(x) -> np.ndarray:
    """Numpy object array of ``sympy.Rational`` with the shape of ``x``."""
    arr = np.asarray(x, dtype=object)
    out = np.empty(arr.shape, dtype=object)
    for idx in np.ndindex(arr.shape):
        out[idx] = to_rational(arr[idx])
    return out


def _to_float(arr: np.ndarray) -> np.ndarray:
    return np.vectorize(float, otypes=[np.float64])(arr)


@dataclass(frozen=True, eq=False)
class ExactMDP:
    """Rational copy of a finite MDP (same conventions as :class:`tabular.MDP`).

    Build with :meth:`from_mdp` or :meth:`from_arrays` (which also builds and validates the float
    MDP, available as ``.mdp``). ``r`` is the expected reward ``[S, A]`` (an ``[S, A, S]`` input is
    reduced exactly).
    """

    P: np.ndarray
    r: np.ndarray
    rho0: np.ndarray
    gamma: sympy.Rational
    terminal: np.ndarray
    mdp: MDP

    @classmethod
    def from_arrays(cls, P, r, rho0, gamma, terminal=None) -> ExactMDP:
        P_q, r_q, rho0_q = rational_array(P), rational_array(r), rational_array(rho0)
        gamma_q = to_rational(gamma)
        # The float copy runs every validation of tabular.MDP (shapes, signs, row sums, terminal).
        mdp = MDP(_to_float(P_q), _to_float(r_q), _to_float(rho0_q), float(gamma_q), terminal=terminal)
        if r_q.ndim == 3:
            r_q = np.sum(P_q * r_q, axis=2)
        return cls(P=P_q, r=r_q, rho0=rho0_q, gamma=gamma_q, terminal=mdp.terminal.copy(), mdp=mdp)

    @classmethod
    def from_mdp(cls, mdp: MDP) -> ExactMDP:
        """The exact binary rationals of a float MDP's arrays (``r`` already reduced to ``[S, A]``)."""
        return cls.from_arrays(mdp.P, mdp.r, mdp.rho0, mdp.gamma, mdp.terminal)

    @property
    def num_states(self) -> int:
        return self.P.shape[0]

    @property
    def num_actions(self) -> int:
        return self.P.shape[1]

    def policy(self, pi) -> np.ndarray:
        """``pi`` as a rational ``[S, A]`` array after the float checks of ``MDP.validate_policy``."""
        pi_q = rational_array(pi)
        self.mdp.validate_policy(_to_float(pi_q))
        return pi_q


def _nonterminal_states(emdp: ExactMDP, pi_q: np.ndarray) -> np.ndarray:
    # Same states and the same episodic check as the float path (the support graph is identical).
    return float_nonterminal_states(emdp.mdp, _to_float(pi_q))


def _solve(M: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact solution of ``M x = b`` over QQ (M: object ``[n, n]``, b: object ``[n]``)."""
    n = b.shape[0]
    if n == 0:
        return np.empty(0, dtype=object)
    Md = DomainMatrix([[QQ.from_sympy(M[i, j]) for j in range(n)] for i in range(n)], (n, n), QQ)
    bd = DomainMatrix([[QQ.from_sympy(b[i])] for i in range(n)], (n, 1), QQ)
    x = Md.lu_solve(bd).to_Matrix()
    return np.array([sympy.Rational(x[i, 0]) for i in range(n)], dtype=object)


def _policy_matrices(emdp: ExactMDP, pi_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    P_pi = np.einsum("sa,sat->st", pi_q, emdp.P)
    r_pi = np.einsum("sa,sa->s", pi_q, emdp.r)
    return P_pi, r_pi


def exact_policy_evaluation(emdp: ExactMDP, pi) -> np.ndarray:
    """Exact ``V_pi [S]`` from ``(I - gamma P_pi) V = r_pi`` (spec: mdp.md eq. (7); Sutton & Barto 2018,
    section 3.5)."""
    pi_q = emdp.policy(pi)
    P_pi, r_pi = _policy_matrices(emdp, pi_q)
    idx = _nonterminal_states(emdp, pi_q)  # (terminal: V = 0, mdp.md eq. (3))
    V = np.array([sympy.Integer(0)] * emdp.num_states, dtype=object)
    M = -emdp.gamma * P_pi[np.ix_(idx, idx)]
    M[np.diag_indices(idx.size)] += 1
    V[idx] = _solve(M, r_pi[idx])
    return V


def exact_q_values(emdp: ExactMDP, pi) -> np.ndarray:
    """Exact ``Q_pi [S, A] = r + gamma P V_pi`` (spec: mdp.md eq. (8); Sutton & Barto 2018, section 3.5)."""
    V = exact_policy_evaluation(emdp, pi)
    return emdp.r + emdp.gamma * np.einsum("sat,t->sa", emdp.P, V)


def exact_advantages(emdp: ExactMDP, pi) -> np.ndarray:
    """Exact ``A_pi [S, A] = Q_pi - V_pi`` (spec: mdp.md eq. (9); Schulman et al. 2016, section 2)."""
    V = exact_policy_evaluation(emdp, pi)
    return emdp.r + emdp.gamma * np.einsum("sat,t->sa", emdp.P, V) - V[:, None]


def exact_expected_return(emdp: ExactMDP, pi) -> sympy.Rational:
    """Exact ``J(pi) = rho0 . V_pi`` (spec: mdp.md eq. (10))."""
    return sympy.Rational(np.dot(emdp.rho0, exact_policy_evaluation(emdp, pi)))


def exact_state_occupancy(emdp: ExactMDP, pi, normalized: bool = True) -> np.ndarray:
    """Exact state occupancy ``[S]`` from the flow equation ``rho = rho0 + gamma P_pi^T rho``
    (spec: mdp.md eq. (11)-(12)); conventions as :func:`tabular.state_occupancy`, which solves on the
    non-terminal states and gives a terminal state T, for gamma < 1, ``(rho0(T) + gamma sum_s
    P_pi(s, T) rho(s)) / (1 - gamma)``: its self-loop is 1 (mdp.md eq. (3)) whatever the rounding of
    the policy's row there."""
    pi_q = emdp.policy(pi)
    P_pi, _ = _policy_matrices(emdp, pi_q)
    idx = _nonterminal_states(emdp, pi_q)
    rho = np.array([sympy.Integer(0)] * emdp.num_states, dtype=object)
    M = -emdp.gamma * P_pi[np.ix_(idx, idx)].T
    M[np.diag_indices(idx.size)] += 1
    rho[idx] = _solve(M, emdp.rho0[idx])
    if emdp.gamma < 1:
        for end in np.flatnonzero(emdp.mdp.terminal):
            inflow = sum((P_pi[s, end] * rho[s] for s in idx), sympy.Integer(0))
            rho[end] = (emdp.rho0[end] + emdp.gamma * inflow) / (1 - emdp.gamma)
    if not normalized:
        return rho
    total = sum(rho, sympy.Integer(0))
    if total <= 0:
        raise ValueError("the normalised occupancy is undefined: every start state is terminal")
    return np.array([x / total for x in rho], dtype=object)


def exact_state_action_occupancy(emdp: ExactMDP, pi, normalized: bool = True) -> np.ndarray:
    """Exact ``[S, A]`` occupancy ``rho_pi(s) pi(a|s)`` (spec: mdp.md eq. (13))."""
    pi_q = emdp.policy(pi)
    return exact_state_occupancy(emdp, pi_q, normalized)[:, None] * pi_q

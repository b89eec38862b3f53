"""Exact rational spec of finite MDPs: policy evaluation, occupancy, optimal control, and the
performance-difference identity (spec: specs/mdp.md sections 1-5; Sutton & Barto 2018, chapter 3;
Kakade & Langford 2002, Lemma 6.1).

Every number is a ``sympy.Rational`` and every linear system is solved exactly over the
rationals (``sympy.Matrix.LUsolve``), so the results are exact, not 50-digit approximations.
Inputs may be ints, ``fractions.Fraction``, sympy Rationals, strings ``"p/q"`` or decimal
strings (exact), or floats (taken as the exact binary value they store, ``specs._exact.exact``).

Conventions (mdp.md, the same as ``tabular``'s): ``P [S][A][S]``, rewards ``r [S][A]`` or
``[S][A][S]`` (reduced to ``r(s, a) = sum_s' P(s'|s, a) r(s, a, s')``, eq. (2)), ``rho0 [S]``,
``gamma`` in [0, 1], ``terminal [S]`` absorbing zero-reward states (eq. (3)); policies ``[S][A]``.
Stochastic arrays must be stochastic *exactly* (non-negative, rows summing to exactly 1): this is
the spec, so there is no tolerance (``tabular`` accepts row sums within 1e-9 of 1).

**Normalisation.** The primary occupancy is the unnormalised ``rho_pi(s) = sum_t gamma^t
P(s_t = s)`` (mdp.md eq. (11)); ``normalized=True`` divides by its total, which is ``1/(1 - gamma)``
for gamma < 1, so it is Kakade & Langford 2002's ``d_pi = (1 - gamma) rho_pi`` (Kakade & Langford 2002;
Schulman et al. 2015, section 2). The
performance-difference identity (mdp.md eq. (22), Kakade & Langford 2002, Lemma 6.1; Schulman et al. 2015,
eq. (1)-(2)) is therefore written
``J(pi') - J(pi) = sum_s rho_{pi'}(s) sum_a pi'(a|s) A_pi(s, a)``, which for gamma < 1 is
``1/(1 - gamma) E_{s ~ d_{pi'}, a ~ pi'}[A_pi(s, a)]``, and stays meaningful at gamma = 1.

**gamma = 1** (episodic): a policy must be proper (absorbed in a terminal state with probability 1
from every state, mdp.md eq. (6)). The spec decides this algebraically, independently of
``tabular``'s graph search: with ``Q_pi`` the restriction of ``P_pi`` to the non-terminal states
(a non-negative substochastic matrix), absorption is certain from every state iff the spectral
radius of ``Q_pi`` is < 1, and by Perron-Frobenius the spectral radius is itself an eigenvalue, so
iff ``det(I - Q_pi) != 0``. The systems are then solved on the non-terminal states; terminal
states have value 0 and occupancy 0 (mdp.md section 1).

**Optimal control** (mdp.md section 4, eq. (15)-(18)): exact policy iteration over deterministic
policies, starting from the greedy policy of ``r`` (lowest index among the maximisers), switching
the action at a state only on a strict improvement (so it terminates: each switch strictly
increases V). ``V*`` is the value of the final policy, ``Q* = r + gamma P V*``, the optimal action
set at s is ``{a : Q*(s, a) = max_b Q*(s, b)}`` (exact ties), and ``pi*`` takes the LOWEST index in
it -- a canonical choice that does not depend on the path policy iteration took. At gamma = 1
every policy the iteration meets must be proper (e.g. a DAG), else ``ValueError``.

Imports neither ``refimpl`` nor ``tabular`` (docs/architecture.md).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import sympy as sp

from specs._exact import exact

__all__ = [
    "FiniteMDP",
    "finite_mdp",
    "check_policy",
    "policy_transition_matrix",
    "policy_reward_vector",
    "is_proper",
    "values",
    "q_values",
    "advantages",
    "expected_return",
    "state_occupancy",
    "state_action_occupancy",
    "bellman_backup",
    "OptimalControl",
    "optimal_control",
    "PerformanceDifference",
    "performance_difference",
]

Vector = tuple  # tuple[sp.Rational, ...]
Matrix2 = tuple  # tuple[tuple[sp.Rational, ...], ...]

_ZERO, _ONE = sp.Integer(0), sp.Integer(1)


def _dot(x, y) -> sp.Rational:
    return sum((a * b for a, b in zip(x, y, strict=True)), _ZERO)


def _rational(x, name: str) -> sp.Rational:
    """One exact number: int, Fraction, Rational, "p/q" or decimal string, or a float's binary value."""
    if isinstance(x, bool):
        raise TypeError(f"{name} must hold numbers, got a bool")
    if isinstance(x, str):
        if x.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
            raise ValueError(f"{name} contains NaN or inf")
        try:
            q = Fraction(x)
        except ValueError as exc:
            raise ValueError(f"{name} holds {x!r}, which is not a decimal or 'p/q' string") from exc
        return sp.Rational(q.numerator, q.denominator)
    if hasattr(x, "__len__"):
        raise ValueError(f"{name} must be a number, got a sequence (too many dimensions)")
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError(f"{name} contains NaN or inf")
    try:
        value = exact(x)
    except (TypeError, ValueError, sp.SympifyError) as exc:
        raise TypeError(f"{name} must hold numbers, got {type(x).__name__}") from exc
    if not value.is_Rational:
        raise TypeError(f"{name} must hold rational numbers, got {value}")
    return value


def _array(x, name: str, shape: tuple[int, ...]) -> tuple:
    """Nested tuples of Rationals with exactly the given shape (no broadcasting); errors name the
    argument, its expected shape and the offending entry."""

    def build(item, index: tuple[int, ...]):
        axis = len(index)
        label = name + "".join(f"[{i}]" for i in index)
        if axis == len(shape):
            return _rational(item, label)
        if isinstance(item, (str, bytes)) or not hasattr(item, "__len__") or len(item) != shape[axis]:
            got = len(item) if hasattr(item, "__len__") and not isinstance(item, (str, bytes)) else "a scalar"
            raise ValueError(f"{name} must have shape {list(shape)}, got {got} entries at {label}")
        return tuple(build(sub, (*index, i)) for i, sub in enumerate(item))

    return build(x, ())


def _check_distribution(row: Vector, name: str) -> None:
    for i, p in enumerate(row):
        if p < 0:
            raise ValueError(f"{name}[{i}] is a negative probability {p}")
    total = sum(row, _ZERO)
    if total != 1:
        raise ValueError(f"{name} must sum to exactly 1, sums to {total}")


@dataclass(frozen=True)
class FiniteMDP:
    """A validated exact MDP (mdp.md eq. (1)-(3)); build it with :func:`finite_mdp`.

    ``P [S][A][S]``, ``r [S][A]`` (expected reward, eq. (2)), ``rho0 [S]``: nested tuples of
    ``sympy.Rational``; ``gamma``: Rational in [0, 1]; ``terminal``: tuple of bool."""

    P: tuple
    r: tuple
    rho0: tuple
    gamma: sp.Rational
    terminal: tuple

    @property
    def num_states(self) -> int:
        return len(self.P)

    @property
    def num_actions(self) -> int:
        return len(self.P[0])


def _shape_of_P(P) -> tuple[int, int]:
    try:
        S, A = len(P), len(P[0])
    except (TypeError, IndexError) as exc:
        raise ValueError("P must have shape [S, A, S] with S, A >= 1") from exc
    if S == 0 or A == 0:
        raise ValueError("P must have shape [S, A, S] with S, A >= 1")
    return S, A


def finite_mdp(P, r, rho0, gamma, terminal=None) -> FiniteMDP:
    """Validate an MDP exactly (mdp.md eq. (1)-(3)) and reduce ``r [S][A][S]`` to ``r [S][A]``.

    Raises ``ValueError`` (naming the argument) for wrong shapes, negative probabilities, rows of
    ``P`` or ``rho0`` that do not sum to exactly 1, gamma outside [0, 1], and a terminal state that
    is not absorbing or pays a reward; ``TypeError`` for non-numbers.
    """
    S, A = _shape_of_P(P)
    P_q = _array(P, "P", (S, A, S))
    for s in range(S):
        for a in range(A):
            _check_distribution(P_q[s][a], f"P[{s}][{a}]")
    try:
        r_ndim = 3 if hasattr(r[0][0], "__len__") and not isinstance(r[0][0], str) else 2
    except (TypeError, IndexError) as exc:
        raise ValueError(f"r must have shape [S, A] = {[S, A]} or [S, A, S]") from exc
    r_q = _array(r, "r", (S, A) if r_ndim == 2 else (S, A, S))
    if r_ndim == 3:  # eq. (2): a transition reward is reduced to its expectation
        r_q = tuple(
            tuple(sum((P_q[s][a][t] * r_q[s][a][t] for t in range(S)), _ZERO) for a in range(A))
            for s in range(S)
        )
    rho0_q = _array(rho0, "rho0", (S,))
    _check_distribution(rho0_q, "rho0")
    gamma_q = _rational(gamma, "gamma")
    if not 0 <= gamma_q <= 1:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma_q}")
    if terminal is None:
        terminal_t = (False,) * S
    else:
        is_bool = [isinstance(t, bool) or type(t).__name__ == "bool_" for t in terminal]  # numpy bools too
        if len(terminal) != S or not all(is_bool):
            raise ValueError(f"terminal must be {S} bools, got {terminal!r}")
        terminal_t = tuple(bool(t) for t in terminal)
    for s in range(S):
        if terminal_t[s]:
            if any(P_q[s][a][s] != 1 for a in range(A)):
                raise ValueError(f"terminal state {s} must be absorbing: P[{s}][a][{s}] = 1 for every a")
            if any(x != 0 for x in r_q[s]):
                raise ValueError(f"terminal state {s} must pay zero reward, got r[{s}] = {list(r_q[s])}")
    return FiniteMDP(P=P_q, r=r_q, rho0=rho0_q, gamma=gamma_q, terminal=terminal_t)


def check_policy(mdp: FiniteMDP, pi, name: str = "pi") -> tuple:
    """``pi [S][A]`` as Rationals after checking that every row is a distribution, exactly."""
    pi_q = _array(pi, name, (mdp.num_states, mdp.num_actions))
    for s, row in enumerate(pi_q):
        _check_distribution(row, f"{name}[{s}]")
    return pi_q


def policy_transition_matrix(mdp: FiniteMDP, pi) -> sp.Matrix:
    """``P_pi[s, s'] = sum_a pi(a|s) P(s'|s, a)`` (mdp.md eq. (5)), an exact ``S x S`` Matrix."""
    pi = check_policy(mdp, pi)
    S, A = mdp.num_states, mdp.num_actions
    return sp.Matrix(S, S, lambda s, t: sum((pi[s][a] * mdp.P[s][a][t] for a in range(A)), _ZERO))


def policy_reward_vector(mdp: FiniteMDP, pi) -> sp.Matrix:
    """``r_pi[s] = sum_a pi(a|s) r(s, a)`` (mdp.md eq. (5)), an exact ``S x 1`` Matrix."""
    pi = check_policy(mdp, pi)
    A = mdp.num_actions
    return sp.Matrix(mdp.num_states, 1, lambda s, _: sum((pi[s][a] * mdp.r[s][a] for a in range(A)), _ZERO))


def _non_terminal(mdp: FiniteMDP) -> list[int]:
    return [s for s in range(mdp.num_states) if not mdp.terminal[s]]


def is_proper(mdp: FiniteMDP, pi) -> bool:
    """mdp.md eq. (6): whether ``pi`` reaches a terminal state with probability 1 from every state,
    decided as ``det(I - Q_pi) != 0`` with ``Q_pi`` = ``P_pi`` on the non-terminal states (module
    docstring: Perron-Frobenius)."""
    idx = _non_terminal(mdp)
    if not idx:
        return True
    Q = policy_transition_matrix(mdp, pi).extract(idx, idx)
    return (sp.eye(len(idx)) - Q).det(method="bareiss") != 0


def _solved_states(mdp: FiniteMDP, pi) -> list[int]:
    """All states for gamma < 1; at gamma = 1 the non-terminal ones, after checking ``pi`` is proper."""
    if mdp.gamma < 1:
        return list(range(mdp.num_states))
    if not is_proper(mdp, pi):
        raise ValueError(
            "pi must reach a terminal state with probability 1 from every state when gamma = 1 "
            "(an improper policy has no finite undiscounted value)"
        )
    return _non_terminal(mdp)


def _solve(M: sp.Matrix, b: sp.Matrix) -> sp.Matrix:
    return M.LUsolve(b) if M.rows else sp.zeros(0, 1)


def _scatter(idx: list[int], x: sp.Matrix, size: int) -> Vector:
    out = [_ZERO] * size
    for k, s in enumerate(idx):
        out[s] = sp.Rational(x[k])
    return tuple(out)


def values(mdp: FiniteMDP, pi) -> Vector:
    """``V_pi [S]``: the exact solution of ``(I - gamma P_pi) V = r_pi`` (mdp.md eq. (7);
    Sutton & Barto 2018, section 3.5); at gamma = 1 on the non-terminal states, with ``V = 0`` on terminal
    ones."""
    return _values(mdp, check_policy(mdp, pi))


@functools.lru_cache(maxsize=512)  # pure function of hashable exact inputs; shared by Q, A, J, PDL
def _values(mdp: FiniteMDP, pi: tuple) -> Vector:
    idx = _solved_states(mdp, pi)
    P_pi, r_pi = policy_transition_matrix(mdp, pi), policy_reward_vector(mdp, pi)
    M = sp.eye(len(idx)) - mdp.gamma * P_pi.extract(idx, idx)
    return _scatter(idx, _solve(M, r_pi.extract(idx, [0])), mdp.num_states)


def bellman_backup(mdp: FiniteMDP, V) -> Matrix2:
    """``Q_V(s, a) = r(s, a) + gamma sum_s' P(s'|s, a) V(s')`` for any ``V [S]`` (mdp.md eq. (8), (16);
    Sutton & Barto 2018, section 3.5)."""
    V = _array(V, "V", (mdp.num_states,))
    return tuple(
        tuple(mdp.r[s][a] + mdp.gamma * _dot(mdp.P[s][a], V) for a in range(mdp.num_actions))
        for s in range(mdp.num_states)
    )


def q_values(mdp: FiniteMDP, pi) -> Matrix2:
    """``Q_pi [S][A] = r + gamma P V_pi`` (mdp.md eq. (8); Sutton & Barto 2018, section 3.5)."""
    return bellman_backup(mdp, values(mdp, pi))


def advantages(mdp: FiniteMDP, pi) -> Matrix2:
    """``A_pi [S][A] = Q_pi(s, a) - V_pi(s)`` (mdp.md eq. (9); Schulman et al. 2016, section 2)."""
    V = values(mdp, pi)
    return tuple(tuple(q - v for q in Q_s) for Q_s, v in zip(bellman_backup(mdp, V), V, strict=True))


def expected_return(mdp: FiniteMDP, pi) -> sp.Rational:
    """``J(pi) = sum_s rho0(s) V_pi(s)`` (mdp.md eq. (10); Sutton & Barto 2018, section 3.3)."""
    return _dot(mdp.rho0, values(mdp, pi))


def state_occupancy(mdp: FiniteMDP, pi, normalized: bool = False) -> Vector:
    """State occupancy ``[S]`` (mdp.md eq. (11)-(12); Kakade & Langford 2002; Schulman et al. 2015,
    section 2).

    ``normalized=False`` (default): ``rho_pi``, the exact solution of the flow equation
    ``(I - gamma P_pi^T) rho = rho0`` (at gamma = 1 on the non-terminal states, 0 on terminal ones:
    the expected number of visits). ``normalized=True``: ``rho_pi / sum_s rho_pi(s)``, which for
    gamma < 1 is ``d_pi = (1 - gamma) rho_pi``; ``ValueError`` when the total is 0 (gamma = 1 and
    every start state terminal).
    """
    rho = _occupancy(mdp, check_policy(mdp, pi))
    if not normalized:
        return rho
    total = sum(rho, _ZERO)
    if total == 0:
        raise ValueError("rho0 puts all its mass on terminal states: the normalised occupancy is undefined")
    return tuple(x / total for x in rho)


@functools.lru_cache(maxsize=512)
def _occupancy(mdp: FiniteMDP, pi: tuple) -> Vector:
    idx = _solved_states(mdp, pi)
    M = sp.eye(len(idx)) - mdp.gamma * policy_transition_matrix(mdp, pi).extract(idx, idx).T
    rho0 = sp.Matrix(len(idx), 1, [mdp.rho0[s] for s in idx])
    return _scatter(idx, _solve(M, rho0), mdp.num_states)


def state_action_occupancy(mdp: FiniteMDP, pi, normalized: bool = False) -> Matrix2:
    """``[S][A]`` occupancy ``rho_pi(s) pi(a|s)``, or ``d_pi(s) pi(a|s)`` when normalised (mdp.md
    eq. (13); Kakade & Langford 2002; Schulman et al. 2015, section 2)."""
    pi_q = check_policy(mdp, pi)
    rho = state_occupancy(mdp, pi_q, normalized)
    return tuple(tuple(x * p for p in row) for x, row in zip(rho, pi_q, strict=True))


@dataclass(frozen=True)
class OptimalControl:
    """Result of :func:`optimal_control` (exact).

    ``V [S]`` = V*, ``Q [S][A]`` = Q* = r + gamma P V*, ``policy [S]``: pi*(s) as an action index
    (the lowest optimal action), ``optimal_actions [S]``: every action attaining ``max_a Q*(s, a)``,
    ``iterations``: policy evaluations performed."""

    V: Vector
    Q: Matrix2
    policy: tuple
    optimal_actions: tuple
    iterations: int


def _one_hot(actions, num_actions: int) -> Matrix2:
    return tuple(tuple(_ONE if a == b else _ZERO for b in range(num_actions)) for a in actions)


def _argmax_set(row) -> tuple[int, ...]:
    best = max(row)
    return tuple(a for a, q in enumerate(row) if q == best)


def optimal_control(mdp: FiniteMDP, max_iterations: int = 1000) -> OptimalControl:
    """``V*``, ``Q*``, ``pi*`` by exact policy iteration (mdp.md eq. (15)-(18); tie rule in the module
    docstring: switch only on a strict improvement, report the lowest optimal index)."""
    actions = [_argmax_set(r_s)[0] for r_s in mdp.r]
    for iteration in range(1, max_iterations + 1):
        V = values(mdp, _one_hot(actions, mdp.num_actions))
        Q = bellman_backup(mdp, V)
        # keep the current action unless another is strictly better; then the lowest maximiser
        improved = [a if Q[s][a] == max(Q[s]) else _argmax_set(Q[s])[0] for s, a in enumerate(actions)]
        if improved == actions:
            optimal = tuple(_argmax_set(Q_s) for Q_s in Q)
            return OptimalControl(V, Q, tuple(o[0] for o in optimal), optimal, iteration)
        actions = improved
    raise RuntimeError(f"policy iteration did not stop within {max_iterations} iterations")


@dataclass(frozen=True)
class PerformanceDifference:
    """Terms of the performance-difference identity for an old policy ``pi`` and a new ``pi_new``
    (mdp.md eq. (21)-(24); Kakade & Langford 2002, Lemma 6.1; Schulman et al. 2015, eq. (1)-(2), eq. (3),
    eq. (2) minus eq. (3)); all exact.

    ``expected_advantage [S]``: ``abar(s) = sum_a pi_new(a|s) A_pi(s, a)``; ``rho_pi_new``,
    ``rho_pi [S]``: unnormalised occupancies; ``J_pi``, ``J_pi_new``; ``difference = J_pi_new - J_pi``;
    ``pdl_sum = sum_s rho_pi_new(s) abar(s)`` (equal to ``difference``: the identity);
    ``surrogate = J_pi + sum_s rho_pi(s) abar(s)``; ``distribution_shift_penalty =
    sum_s (rho_pi_new(s) - rho_pi(s)) abar(s)`` (``J_pi_new = surrogate + penalty``)."""

    J_pi: sp.Rational
    J_pi_new: sp.Rational
    difference: sp.Rational
    expected_advantage: Vector
    rho_pi: Vector
    rho_pi_new: Vector
    pdl_sum: sp.Rational
    surrogate: sp.Rational
    distribution_shift_penalty: sp.Rational


def performance_difference(mdp: FiniteMDP, pi, pi_new) -> PerformanceDifference:
    """Both sides of ``J(pi_new) - J(pi) = sum_s rho_{pi_new}(s) sum_a pi_new(a|s) A_pi(s, a)``
    (mdp.md eq. (22); Kakade & Langford 2002, Lemma 6.1; Schulman et al. 2015, eq. (1)-(2) with ``1/(1 -
    gamma) E_{d_pi_new}`` = ``sum_s rho_pi_new(s)``),
    the surrogate (eq. (23); Schulman et al. 2015, eq. (3)) and the distribution-shift penalty (eq. (24);
    Schulman et al. 2015, eq. (2) minus eq. (3))."""
    pi_q = check_policy(mdp, pi, "pi")
    new_q = check_policy(mdp, pi_new, "pi_new")
    A = advantages(mdp, pi_q)
    abar = tuple(_dot(p_s, A_s) for p_s, A_s in zip(new_q, A, strict=True))
    rho, rho_new = state_occupancy(mdp, pi_q), state_occupancy(mdp, new_q)
    J, J_new = expected_return(mdp, pi_q), expected_return(mdp, new_q)

    return PerformanceDifference(
        J_pi=J,
        J_pi_new=J_new,
        difference=J_new - J,
        expected_advantage=abar,
        rho_pi=rho,
        rho_pi_new=rho_new,
        pdl_sum=_dot(rho_new, abar),
        surrogate=J + _dot(rho, abar),
        distribution_shift_penalty=_dot(tuple(a - b for a, b in zip(rho_new, rho, strict=True)), abar),
    )

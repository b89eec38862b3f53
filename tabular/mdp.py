"""Finite MDPs and their validation (spec: specs/mdp.md section 1; Sutton & Barto 2018, chapter 3).

Conventions (contract, docs/architecture.md): transitions ``P [S, A, S]``, rewards ``r [S, A]`` or
``r [S, A, S]`` (the latter reduced to the expected reward ``r(s, a) = sum_s' P(s'|s,a) r(s,a,s')``),
start distribution ``rho0 [S]``, discount ``gamma`` in [0, 1], and ``terminal [S]`` marking
absorbing zero-reward states. Policies are ``[S, A]`` row-stochastic arrays.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "MDP",
    "STOCHASTIC_ATOL",
    "validate_policy",
    "policy_transition_matrix",
    "policy_reward_vector",
    "reaches_terminal_surely",
]

#: Absolute tolerance on row sums of stochastic arrays (float64 arrays built by division).
STOCHASTIC_ATOL = 1e-9


def _is_real_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (str, bytes))


def _as_finite_float_array(x, name: str, ndim: int | tuple[int, ...]) -> np.ndarray:
    """``x`` as a float64 copy (the MDP freezes its arrays, not the caller's): real numbers only.
    Strings are not parsed and a complex part is not dropped (numpy would do both, the latter with
    only a warning): TypeError naming the argument."""
    try:
        raw = np.asarray(x)
    except (TypeError, ValueError) as exc:  # ragged nesting
        raise TypeError(f"{name} must be a numeric array, got {type(x).__name__}") from exc
    kind = raw.dtype.kind
    if kind == "c" or (kind == "O" and any(isinstance(v, complex) for v in raw.flat)):
        raise TypeError(f"{name} must be real, got complex numbers")
    if kind not in "biuf" and not (kind == "O" and all(_is_real_number(v) for v in raw.flat)):
        got = (type(x).__name__ if isinstance(x, (str, bytes))
               else f"dtype {raw.dtype} (strings are not parsed)")
        raise TypeError(f"{name} must be a numeric array, got {got}")
    try:
        arr = np.array(raw, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"{name} must be a numeric array, got {type(x).__name__}") from exc
    dims = (ndim,) if isinstance(ndim, int) else ndim
    if arr.ndim not in dims:
        raise ValueError(f"{name} must have {' or '.join(map(str, dims))} dimensions, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def _check_distribution_rows(arr: np.ndarray, name: str) -> None:
    if np.any(arr < 0):
        idx = tuple(int(i) for i in np.argwhere(arr < 0)[0])
        raise ValueError(f"{name} has a negative probability {arr[idx]!r} at index {idx}")
    sums = arr.sum(axis=-1)
    bad = np.abs(sums - 1.0) > STOCHASTIC_ATOL
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} rows must sum to 1; row {idx} sums to {sums[idx]!r}")


@dataclass(frozen=True, eq=False)
class MDP:
    """A finite discounted or episodic MDP (spec: mdp.md eq. (1)-(3); Sutton & Barto 2018, section 3.1).

    Args:
        P: ``[S, A, S]`` transition probabilities ``P(s'|s, a)``; each ``P[s, a]`` a distribution.
        r: ``[S, A]`` expected rewards, or ``[S, A, S]`` rewards ``r(s, a, s')`` paid on the
            transition (reduced to ``r(s, a) = sum_s' P(s'|s,a) r(s,a,s')``; the reward-on-arrival
            convention on arrival is ``r[s, a, s'] = R(s')``).
        rho0: ``[S]`` start-state distribution.
        gamma: discount in [0, 1]. ``gamma = 1`` is the episodic case: evaluating a policy then
            requires that it reaches a terminal state with probability 1 from every state.
        terminal: ``[S]`` bool, absorbing zero-reward states (``P[s, a, s] = 1``, ``r(s, a) = 0``).

    Attributes ``P``, ``r`` (the expected ``[S, A]`` reward), ``rho0``, ``gamma``, ``terminal``
    are read-only float64/bool numpy arrays.
    """

    P: np.ndarray
    r: np.ndarray
    rho0: np.ndarray
    gamma: float
    terminal: np.ndarray | None = field(default=None)

    def __post_init__(self) -> None:
        P = _as_finite_float_array(self.P, "P", 3)
        S, A, S2 = P.shape
        if S != S2 or S == 0 or A == 0:
            raise ValueError(f"P must have shape [S, A, S] with S, A >= 1, got {P.shape}")
        _check_distribution_rows(P, "P")
        r = _as_finite_float_array(self.r, "r", (2, 3))
        if r.shape not in ((S, A), (S, A, S)):
            raise ValueError(f"r must have shape [S, A] = {(S, A)} or [S, A, S] = {(S, A, S)}, got {r.shape}")
        if r.ndim == 3:
            r = np.einsum("ijk,ijk->ij", P, r)
        rho0 = _as_finite_float_array(self.rho0, "rho0", 1)
        if rho0.shape != (S,):
            raise ValueError(f"rho0 must have shape [S] = ({S},), got {rho0.shape}")
        _check_distribution_rows(rho0, "rho0")
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, (int, float, np.floating, np.integer)):
            raise TypeError(f"gamma must be a real number, got {type(self.gamma).__name__}")
        gamma = float(self.gamma)
        if not (0.0 <= gamma <= 1.0):
            raise ValueError(f"gamma must lie in [0, 1], got {gamma!r}")
        if self.terminal is None:
            terminal = np.zeros(S, dtype=bool)
        else:
            terminal = np.asarray(self.terminal)
            if terminal.shape != (S,):
                raise ValueError(f"terminal must have shape [S] = ({S},), got {terminal.shape}")
            if terminal.dtype != np.bool_:
                raise TypeError(f"terminal must be a bool array, got dtype {terminal.dtype}")
            terminal = terminal.copy()
        for s in np.flatnonzero(terminal):
            if not np.allclose(P[s, :, s], 1.0, rtol=0.0, atol=STOCHASTIC_ATOL):
                raise ValueError(f"terminal state {s} must be absorbing: P[{s}, a, {s}] = 1 for every a")
            if np.any(r[s] != 0.0):
                raise ValueError(f"terminal state {s} must pay zero reward, got r[{s}] = {r[s]}")
        for name, arr in (("P", P), ("r", r), ("rho0", rho0), ("terminal", terminal)):
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "gamma", gamma)

    @property
    def num_states(self) -> int:
        return self.P.shape[0]

    @property
    def num_actions(self) -> int:
        return self.P.shape[1]

    def validate_policy(self, pi, name: str = "pi") -> np.ndarray:
        """Return ``pi`` as a float64 ``[S, A]`` array after checking it is row-stochastic."""
        return validate_policy(pi, self.num_states, self.num_actions, name)


def validate_policy(pi, num_states: int, num_actions: int, name: str = "pi") -> np.ndarray:
    """Check that ``pi`` is a finite row-stochastic ``[S, A]`` array; return it as float64."""
    arr = _as_finite_float_array(pi, name, 2)
    if arr.shape != (num_states, num_actions):
        raise ValueError(f"{name} must have shape [S, A] = {(num_states, num_actions)}, got {arr.shape}")
    _check_distribution_rows(arr, name)
    return arr


def policy_transition_matrix(mdp: MDP, pi) -> np.ndarray:
    """``P_pi[s, s'] = sum_a pi(a|s) P(s'|s, a)`` (spec: mdp.md eq. (5)), ``[S, S]``."""
    pi = mdp.validate_policy(pi)
    return np.einsum("sa,sat->st", pi, mdp.P)


def policy_reward_vector(mdp: MDP, pi) -> np.ndarray:
    """``r_pi[s] = sum_a pi(a|s) r(s, a)`` (spec: mdp.md eq. (5)), ``[S]``."""
    pi = mdp.validate_policy(pi)
    return np.einsum("sa,sa->s", pi, mdp.r)


def reaches_terminal_surely(mdp: MDP, pi) -> np.ndarray:
    """``[S]`` bool: whether a terminal state is reached with probability 1 from each state.

    Decided combinatorially on the support graph of ``P_pi``: in a finite Markov chain absorption
    is certain from s iff every state reachable from s can itself reach a terminal state.
    """
    P_pi = policy_transition_matrix(mdp, pi)
    edges = P_pi > 0
    S = mdp.num_states
    # can_reach_terminal: backward closure from the terminal set.
    can = mdp.terminal.copy()
    changed = True
    while changed:
        new = can | (edges & can[None, :]).any(axis=1)
        changed = bool(np.any(new != can))
        can = new
    # reachable[s, t]: t reachable from s (transitive closure by repeated squaring on booleans).
    reach = edges | np.eye(S, dtype=bool)
    for _ in range(max(1, int(np.ceil(np.log2(max(S, 2)))))):
        reach = reach | ((reach.astype(np.int64) @ reach.astype(np.int64)) > 0)
    return ~np.any(reach & ~can[None, :], axis=1)

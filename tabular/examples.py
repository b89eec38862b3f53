"""Example MDPs: the two pathologies of mdp.md sections 7.1-7.2, the 8x8 grid world of mdp.md section 7.3, a
seeded random-MDP generator and a chain.

spec: specs/mdp.md section 7. Example parameters may be given as decimal floats or as
``fractions.Fraction``; the pathology examples also carry exact rational copies of their arrays
(``exact``: numpy object arrays of ``Fraction``, a decimal float ``x`` read as ``Fraction(repr(x))``)
for the exact-arithmetic path of :mod:`tabular.exact`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from tabular.mdp import MDP

__all__ = [
    "ExactArrays",
    "PolicyPairExample",
    "distribution_shift_example",
    "trajectory_is_example",
    "is_weight_variance",
    "GRID_ACTIONS",
    "GridWorld",
    "grid_world",
    "random_mdp",
    "random_policy",
    "chain_mdp",
]


def _fraction(x) -> Fraction:
    """Exact rational of a parameter: Fractions/ints as they are, floats by their decimal repr."""
    if isinstance(x, Fraction):
        return x
    if isinstance(x, (bool, np.bool_)):
        raise TypeError("expected a number, got a bool")
    if isinstance(x, (int, np.integer)):
        return Fraction(int(x))
    if isinstance(x, (float, np.floating)):
        if not np.isfinite(x):
            raise ValueError(f"expected a finite number, got {x!r}")
        return Fraction(repr(float(x)))
    raise TypeError(f"expected an int, float or Fraction, got {type(x).__name__}")


def _floats(arr: np.ndarray) -> np.ndarray:
    return np.vectorize(float, otypes=[np.float64])(arr)


@dataclass(frozen=True)
class ExactArrays:
    """Exact rational arrays (numpy object arrays of ``Fraction``) of an example MDP and policies."""

    P: np.ndarray
    r: np.ndarray
    rho0: np.ndarray
    gamma: Fraction
    terminal: np.ndarray
    pi: np.ndarray
    pi_new: np.ndarray


@dataclass(frozen=True)
class PolicyPairExample:
    """An example MDP with an old policy ``pi`` and a new policy ``pi_new`` (float64 ``[S, A]``)."""

    mdp: MDP
    pi: np.ndarray
    pi_new: np.ndarray
    exact: ExactArrays


def distribution_shift_example(gamma=0.9, M=100, eta=1e-4, eta2=1e-3) -> PolicyPairExample:
    """mdp.md section 7.1: the surrogate predicts improvement while J collapses.

    States ``0 = s0`` (start), ``1 = s1``, ``2 = s_perp`` (terminal). Actions at s0: ``0 = a0``
    (to s_perp), ``1 = a1`` (to s1); at s1: ``0 = g`` (reward 1), ``1 = b`` (reward -M), both to
    s_perp; at s_perp both actions stay (one action there in the original statement, duplicated so every state
    has A = 2). ``pi``: ``pi(a1|s0) = eta``, ``pi(b|s1) = eta2``, uniform at s_perp; ``pi_new``: a1
    then b. With the defaults: ``J(pi) = 8.091e-5``, ``J(pi_new) = -90``,
    ``L_pi(pi_new) - J(pi) = 0.79993818`` exactly (first stated rounded, 0.79994).
    """
    g, M, eta, eta2 = (_fraction(x) for x in (gamma, M, eta, eta2))
    if not (0 <= g < 1):
        raise ValueError(f"gamma must lie in [0, 1), got {gamma!r}")
    if not (0 < eta < 1 and 0 < eta2 < 1):
        raise ValueError(f"eta and eta2 must lie in (0, 1), got {eta!r}, {eta2!r}")
    if not M > 0:
        raise ValueError(f"M must be positive, got {M!r}")
    zero, one = Fraction(0), Fraction(1)
    P = np.full((3, 2, 3), zero, dtype=object)
    P[0, 0, 2] = one
    P[0, 1, 1] = one
    P[1, :, 2] = one
    P[2, :, 2] = one
    r = np.full((3, 2), zero, dtype=object)
    r[1, 0], r[1, 1] = one, -M
    rho0 = np.array([one, zero, zero], dtype=object)
    terminal = np.array([False, False, True])
    half = Fraction(1, 2)
    pi = np.array([[1 - eta, eta], [1 - eta2, eta2], [half, half]], dtype=object)
    pi_new = np.array([[zero, one], [zero, one], [half, half]], dtype=object)
    exact = ExactArrays(P=P, r=r, rho0=rho0, gamma=g, terminal=terminal, pi=pi, pi_new=pi_new)
    mdp = MDP(_floats(P), _floats(r), _floats(rho0), float(g), terminal=terminal)
    return PolicyPairExample(mdp=mdp, pi=_floats(pi), pi_new=_floats(pi_new), exact=exact)


def trajectory_is_example(H: int, p=0.5, q=0.9, gamma=0.9, reward: str = "absorbing") -> PolicyPairExample:
    """mdp.md section 7.2: an H-step episode where trajectory IS weights have variance
    ``(q^2/p + (1-q)^2/(1-p))^H - 1`` (:func:`is_weight_variance`).

    A single state s is not Markov with a deterministic cut after H actions, so the step
    counter is part of the state: states ``0 .. H-1`` are "s at step t" (both actions move to t+1,
    reward 0), state ``H`` is s_perp. Behaviour ``pi(1|s) = p``, target ``pi_new(1|s) = q``.

    ``reward="absorbing"``: as first stated, ``r(s_perp, .) = 1`` at every step, so the
    return is ``gamma^H / (1 - gamma)`` (errata.md entry 2: not ``gamma^H``).
    ``reward="once"``: s_perp pays 1 once and moves to a terminal state ``H + 1``, so the return is
    ``gamma^H``, the value first stated. Either way the return is the same for every trajectory.
    """
    if isinstance(H, bool) or not isinstance(H, (int, np.integer)) or H < 0:
        raise ValueError(f"H must be a non-negative int, got {H!r}")
    if reward not in ("absorbing", "once"):
        raise ValueError(f"reward must be 'absorbing' or 'once', got {reward!r}")
    g, p, q = _fraction(gamma), _fraction(p), _fraction(q)
    if not (0 <= g < 1):
        raise ValueError(f"gamma must lie in [0, 1), got {gamma!r}")
    if not (0 < p < 1 and 0 <= q <= 1):
        raise ValueError(f"need p in (0, 1) and q in [0, 1], got p={p!r}, q={q!r}")
    zero, one, half = Fraction(0), Fraction(1), Fraction(1, 2)
    S = H + 1 if reward == "absorbing" else H + 2
    P = np.full((S, 2, S), zero, dtype=object)
    r = np.full((S, 2), zero, dtype=object)
    for t in range(H):
        P[t, :, t + 1] = one
    if reward == "absorbing":
        P[H, :, H] = one
        r[H, :] = one
    else:
        P[H, :, H + 1] = one
        r[H, :] = one
        P[H + 1, :, H + 1] = one
    terminal = np.zeros(S, dtype=bool)
    if reward == "once":
        terminal[H + 1] = True
    rho0 = np.full(S, zero, dtype=object)
    rho0[0] = one
    pi = np.array([[1 - p, p] if t < H else [half, half] for t in range(S)], dtype=object)
    pi_new = np.array([[1 - q, q] if t < H else [half, half] for t in range(S)], dtype=object)
    exact = ExactArrays(P=P, r=r, rho0=rho0, gamma=g, terminal=terminal, pi=pi, pi_new=pi_new)
    mdp = MDP(_floats(P), _floats(r), _floats(rho0), float(g), terminal=terminal)
    return PolicyPairExample(mdp=mdp, pi=_floats(pi), pi_new=_floats(pi_new), exact=exact)


def is_weight_variance(p, q, H: int):
    """``Var_pi[w] = (q^2/p + (1-q)^2/(1-p))^H - 1`` for the trajectory IS weight of mdp.md section 7.2,
    mdp.md section 7.2 (eq. (39)). Exact (a ``Fraction``) when ``p``, ``q`` are Fractions
    or ints, else a float."""
    if isinstance(H, bool) or not isinstance(H, (int, np.integer)) or H < 0:
        raise ValueError(f"H must be a non-negative int, got {H!r}")
    if not (0 < p < 1 and 0 <= q <= 1):
        raise ValueError(f"need p in (0, 1) and q in [0, 1], got p={p!r}, q={q!r}")
    return (q * q / p + (1 - q) * (1 - q) / (1 - p)) ** int(H) - 1


#: Grid-world actions (row delta, column delta), in action-index order.
GRID_ACTIONS: tuple[tuple[str, int, int], ...] = (
    ("up", -1, 0),
    ("right", 0, 1),
    ("down", 1, 0),
    ("left", 0, -1),
)


@dataclass(frozen=True)
class GridWorld:
    """The grid world MDP plus its geometry; state ``s = row * size + col``."""

    mdp: MDP
    size: int
    goal: tuple[int, int]
    trap: tuple[int, int]

    def state(self, row: int, col: int) -> int:
        return row * self.size + col

    def cell(self, s: int) -> tuple[int, int]:
        return divmod(int(s), self.size)


def grid_world(size: int = 8, goal=(0, 7), trap=(3, 3), gamma: float = 0.9, start=None) -> GridWorld:
    """The 8x8 grid world of mdp.md section 7.3.

    ``size x size`` cells; actions up/right/down/left (:data:`GRID_ACTIONS`) move deterministically,
    a move into a wall stays put. Reward on ARRIVAL (``R(s')``, errata.md entry 3): ``+1`` for a step that
    enters ``goal``, ``-1`` for one that enters ``trap``, 0 otherwise, i.e. ``r[s, a, s'] = R(s')``
    for non-terminal ``s``. Goal and trap are terminal (absorbing, zero reward afterwards).
    ``rho0``: uniform over non-terminal cells, or the cell ``start``. Both special cells can be
    moved (``goal``, ``trap``); ``gamma`` defaults to 0.9.
    """
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 2:
        raise ValueError(f"size must be an int >= 2, got {size!r}")
    cells = {"goal": tuple(goal), "trap": tuple(trap)}
    for name, (row, col) in cells.items():
        if not (0 <= row < size and 0 <= col < size):
            raise ValueError(f"{name} {(row, col)} lies outside the {size}x{size} grid")
    if cells["goal"] == cells["trap"]:
        raise ValueError(f"goal and trap must be different cells, both are {cells['goal']}")
    S, A = size * size, len(GRID_ACTIONS)
    goal_s = cells["goal"][0] * size + cells["goal"][1]
    trap_s = cells["trap"][0] * size + cells["trap"][1]
    arrival_reward = np.zeros(S)
    arrival_reward[goal_s], arrival_reward[trap_s] = 1.0, -1.0
    terminal = np.zeros(S, dtype=bool)
    terminal[[goal_s, trap_s]] = True
    P = np.zeros((S, A, S))
    r = np.zeros((S, A, S))
    for s in range(S):
        row, col = divmod(s, size)
        for a, (_, dr, dc) in enumerate(GRID_ACTIONS):
            if terminal[s]:
                P[s, a, s] = 1.0
                continue
            nr, nc = row + dr, col + dc
            nxt = nr * size + nc if (0 <= nr < size and 0 <= nc < size) else s
            P[s, a, nxt] = 1.0
            r[s, a, nxt] = arrival_reward[nxt]
    if start is None:
        rho0 = (~terminal).astype(np.float64) / np.count_nonzero(~terminal)
    else:
        row, col = start
        if not (0 <= row < size and 0 <= col < size):
            raise ValueError(f"start {(row, col)} lies outside the {size}x{size} grid")
        rho0 = np.zeros(S)
        rho0[row * size + col] = 1.0
    mdp = MDP(P, r, rho0, gamma, terminal=terminal)
    return GridWorld(mdp=mdp, size=int(size), goal=cells["goal"], trap=cells["trap"])


def _generator(seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or a numpy Generator, got {type(seed).__name__}")
    return np.random.default_rng(int(seed))


def random_mdp(
    seed,
    num_states: int = 5,
    num_actions: int = 3,
    gamma: float = 0.9,
    zero_fraction: float = 0.0,
    num_terminal: int = 0,
    termination_prob: float = 0.2,
    reward_shape: str = "sa",
) -> MDP:
    """A random MDP from ``seed`` (int or ``numpy.random.Generator``) (mdp.md section 7.4).

    Transition rows are Dirichlet(1) draws; a fraction ``zero_fraction`` of entries is then set to
    exactly 0 (each row keeps at least one positive entry). Rewards are uniform on [-1, 1], shape
    ``[S, A]`` or ``[S, A, S]`` (``reward_shape="sas"``). With ``num_terminal > 0`` the last
    ``num_terminal`` states are terminal and every non-terminal ``(s, a)`` moves to a uniformly
    chosen terminal state with probability at least ``termination_prob``, so every policy is proper
    and ``gamma = 1`` is allowed. ``rho0`` is a Dirichlet(1) draw over the non-terminal states.
    """
    rng = _generator(seed)
    S, A, T = int(num_states), int(num_actions), int(num_terminal)
    if S < 1 or A < 1 or not (0 <= T < S):
        raise ValueError(
            f"need num_states >= 1, num_actions >= 1, 0 <= num_terminal < num_states; got {S}, {A}, {T}"
        )
    if not (0.0 <= zero_fraction < 1.0):
        raise ValueError(f"zero_fraction must lie in [0, 1), got {zero_fraction!r}")
    if T > 0 and not (0.0 < termination_prob <= 1.0):
        raise ValueError(f"termination_prob must lie in (0, 1], got {termination_prob!r}")
    if reward_shape not in ("sa", "sas"):
        raise ValueError(f"reward_shape must be 'sa' or 'sas', got {reward_shape!r}")
    N = S - T
    P = rng.dirichlet(np.ones(S), size=(S, A))
    if zero_fraction > 0.0:
        keep = rng.random((S, A, S)) >= zero_fraction
        keep[np.arange(S)[:, None], np.arange(A)[None, :], P.argmax(axis=2)] = True
        P = np.where(keep, P, 0.0)
        P /= P.sum(axis=2, keepdims=True)
    if T > 0:
        to_terminal = np.zeros((N, A, S))
        to_terminal[:, :, N:] = 1.0 / T
        P[:N] = (1.0 - termination_prob) * P[:N] + termination_prob * to_terminal
        P[N:] = 0.0
        P[np.arange(N, S), :, np.arange(N, S)] = 1.0
    shape = (S, A) if reward_shape == "sa" else (S, A, S)
    r = rng.uniform(-1.0, 1.0, size=shape)
    r[N:] = 0.0
    rho0 = np.zeros(S)
    rho0[:N] = rng.dirichlet(np.ones(N))
    terminal = np.arange(S) >= N
    return MDP(P, r, rho0, gamma, terminal=terminal)


def random_policy(seed, num_states: int, num_actions: int, concentration: float = 1.0) -> np.ndarray:
    """A random ``[S, A]`` policy, each row a Dirichlet(concentration) draw."""
    rng = _generator(seed)
    if not concentration > 0:
        raise ValueError(f"concentration must be positive, got {concentration!r}")
    return rng.dirichlet(np.full(int(num_actions), float(concentration)), size=int(num_states))


def chain_mdp(
    num_states: int = 6,
    gamma: float = 0.9,
    slip: float = 0.0,
    small_reward: float = 0.1,
    large_reward: float = 1.0,
) -> MDP:
    """A chain (mdp.md section 7.5): states ``0 .. n-1``, start in state 0, action 0 = left,
    action 1 = right. Moving left from state 0 pays ``small_reward`` (a tempting local optimum);
    moving right from the last state pays ``large_reward``; each move goes the other way with
    probability ``slip`` (walls keep the agent in place)."""
    n = int(num_states)
    if n < 2:
        raise ValueError(f"num_states must be >= 2, got {num_states!r}")
    if not (0.0 <= slip <= 1.0):
        raise ValueError(f"slip must lie in [0, 1], got {slip!r}")
    P = np.zeros((n, 2, n))
    for s in range(n):
        left, right = max(s - 1, 0), min(s + 1, n - 1)
        P[s, 0, left] += 1.0 - slip
        P[s, 0, right] += slip
        P[s, 1, right] += 1.0 - slip
        P[s, 1, left] += slip
    r = np.zeros((n, 2))
    r[0, 0] = small_reward
    r[n - 1, 1] = large_reward
    rho0 = np.zeros(n)
    rho0[0] = 1.0
    return MDP(P, r, rho0, gamma)

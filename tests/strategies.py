"""Shared hypothesis strategies (docs/architecture.md "Tests and CI" and "Style").

Composable and shrink-friendly: probabilities are built from small non-negative integer weights
(which shrink towards 0, i.e. towards sparse, readable examples) normalised per row, so zero
probabilities, absorbing states and deterministic rows arise naturally. Every strategy returns
float64 numpy arrays or a ``tabular.MDP``. Other test files append their own strategies below,
each in its own section.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from tabular import MDP

__all__ = [
    "distributions",
    "stochastic_arrays",
    "rewards",
    "gammas",
    "mdps",
    "episodic_mdps",
    "policies",
    "policy_pairs",
    "softmax_params",
]

# ----------------------------------------------------------------------------------- tabular MDPs
#: Integer weights 0..MAX_WEIGHT give probabilities that are multiples of 1/(sum of weights).
MAX_WEIGHT = 4


@st.composite
def distributions(draw, size: int, allow_zeros: bool = True) -> np.ndarray:
    """A probability vector of length ``size`` from integer weights (zeros allowed by default)."""
    low = 0 if allow_zeros else 1
    weights = draw(st.lists(st.integers(low, MAX_WEIGHT), min_size=size, max_size=size))
    w = np.asarray(weights, dtype=np.float64)
    if w.sum() == 0.0:
        w[0] = 1.0  # shrinks to a point mass on the first entry
    return w / w.sum()


@st.composite
def stochastic_arrays(draw, shape: tuple[int, ...], allow_zeros: bool = True) -> np.ndarray:
    """An array of ``shape`` whose last axis is a probability vector."""
    rows = int(np.prod(shape[:-1]))
    out = [draw(distributions(shape[-1], allow_zeros)) for _ in range(rows)]
    return np.asarray(out, dtype=np.float64).reshape(shape)


def rewards(shape: tuple[int, ...], bound: float = 1.0) -> st.SearchStrategy[np.ndarray]:
    """Rewards uniform-ish in [-bound, bound] (finite floats, shrinking to 0), float64 ``shape``."""
    n = int(np.prod(shape))
    return st.lists(
        st.floats(-bound, bound, allow_nan=False, allow_infinity=False), min_size=n, max_size=n
    ).map(lambda xs: np.asarray(xs, dtype=np.float64).reshape(shape))


def gammas(min_value: float = 0.0, max_value: float = 0.95) -> st.SearchStrategy[float]:
    """Discounts in [min_value, max_value] (the endpoints included, so 0 is tried)."""
    return st.one_of(st.sampled_from([min_value, max_value]), st.floats(min_value, max_value))


def _draw_gamma(draw, gamma, default: st.SearchStrategy[float]) -> float:
    """``gamma`` as given (a float or a strategy to draw from), or drawn from ``default`` if None."""
    if gamma is None:
        return draw(default)
    if isinstance(gamma, st.SearchStrategy):
        return draw(gamma)
    return float(gamma)


@st.composite
def mdps(
    draw,
    min_states: int = 1,
    max_states: int = 5,
    min_actions: int = 1,
    max_actions: int = 3,
    gamma: st.SearchStrategy[float] | float | None = None,
    reward_shape: str | None = None,
    allow_zeros: bool = True,
) -> MDP:
    """Discounted MDPs (gamma < 1 by default, drawn from :func:`gammas`).

    Transitions with zero-probability entries and, with ``allow_zeros``, absorbing states
    (``P(s|s, a) = 1`` for every a; each state is made absorbing with probability ~1/4, shrinking
    to not absorbing); rewards ``[S, A]`` or ``[S, A, S]`` (``reward_shape`` "sa"/"sas", drawn
    when None); ``rho0`` may have zeros.
    """
    S = draw(st.integers(min_states, max_states))
    A = draw(st.integers(min_actions, max_actions))
    P = draw(stochastic_arrays((S, A, S), allow_zeros))
    if allow_zeros:
        absorbing = draw(st.lists(st.integers(0, 3).map(lambda k: k == 3), min_size=S, max_size=S))
        for s in np.flatnonzero(absorbing):
            P[s] = 0.0
            P[s, :, s] = 1.0
    shape = draw(st.sampled_from(["sa", "sas"])) if reward_shape is None else reward_shape
    r = draw(rewards((S, A) if shape == "sa" else (S, A, S)))
    rho0 = draw(distributions(S, allow_zeros))
    return MDP(P, r, rho0, _draw_gamma(draw, gamma, gammas()))


@st.composite
def episodic_mdps(
    draw,
    min_states: int = 2,
    max_states: int = 5,
    min_actions: int = 1,
    max_actions: int = 3,
    gamma: st.SearchStrategy[float] | float | None = None,
) -> MDP:
    """Episodic MDPs with 1-2 terminal states (absorbing, zero reward) in which EVERY policy is
    proper: each non-terminal ``(s, a)`` row gives a terminal state positive weight. ``gamma`` is
    drawn from {1, 0.9, [0.5, 1]} by default, so the episodic case gamma = 1 is tried first."""
    S = draw(st.integers(max(min_states, 2), max_states))
    T = draw(st.integers(1, min(2, S - 1)))
    N = S - T
    A = draw(st.integers(min_actions, max_actions))
    P = np.zeros((S, A, S))
    for s in range(N):
        for a in range(A):
            w = np.asarray(draw(st.lists(st.integers(0, MAX_WEIGHT), min_size=S, max_size=S)), float)
            w[N + draw(st.integers(0, T - 1))] += draw(st.integers(1, MAX_WEIGHT))
            P[s, a] = w / w.sum()
    P[np.arange(N, S), :, np.arange(N, S)] = 1.0
    r = draw(rewards((S, A)))
    r[N:] = 0.0
    rho0 = np.zeros(S)
    rho0[:N] = draw(distributions(N))
    episodic_gammas = st.one_of(st.just(1.0), st.just(0.9), st.floats(0.5, 1.0))
    return MDP(P, r, rho0, _draw_gamma(draw, gamma, episodic_gammas), terminal=np.arange(S) >= N)


@st.composite
def policies(draw, num_states: int, num_actions: int, kind: str | None = None) -> np.ndarray:
    """``[S, A]`` policies of one ``kind``: "stochastic" (integer weights, zeros allowed),
    "positive" (every action has probability > 0), "deterministic" (one-hot), or
    "near_deterministic" (one action has 1 - eps, eps in [1e-9, 1e-3], spread over the others).
    Drawn among all four when ``kind`` is None."""
    kinds = ["stochastic", "positive", "deterministic", "near_deterministic"]
    k = draw(st.sampled_from(kinds)) if kind is None else kind
    S, A = num_states, num_actions
    if k == "stochastic":
        return draw(stochastic_arrays((S, A)))
    if k == "positive":
        return draw(stochastic_arrays((S, A), allow_zeros=False))
    actions = draw(st.lists(st.integers(0, A - 1), min_size=S, max_size=S))
    pi = np.zeros((S, A))
    pi[np.arange(S), actions] = 1.0
    if k == "deterministic" or A == 1:
        return pi
    if k != "near_deterministic":
        raise ValueError(f"unknown policy kind {k!r}")
    eps = draw(st.floats(1e-9, 1e-3))
    return pi * (1.0 - eps) + (1.0 - pi) * (eps / (A - 1))


def policy_pairs(mdp: MDP, kind: str | None = None) -> st.SearchStrategy[tuple[np.ndarray, np.ndarray]]:
    """Two policies for ``mdp`` (old, new), each drawn by :func:`policies`."""
    S, A = mdp.num_states, mdp.num_actions
    return st.tuples(policies(S, A, kind), policies(S, A, kind))


def softmax_params(num_states: int, num_actions: int, scale: float = 3.0) -> st.SearchStrategy[np.ndarray]:
    """``[S, A]`` softmax logits ``theta`` with entries in [-scale, scale] (shrinking to 0 = uniform)."""
    n = num_states * num_actions
    return st.lists(
        st.floats(-scale, scale, allow_nan=False, allow_infinity=False), min_size=n, max_size=n
    ).map(lambda xs: np.asarray(xs, dtype=np.float64).reshape(num_states, num_actions))


# ------------------------------------------------------------- token trees (tabular.sequences)
def token_tree_shapes(max_sequences: int = 15) -> st.SearchStrategy[tuple[int, int, int]]:
    """``(vocab_size, max_len, eos)`` of a token tree with at most ``max_sequences`` responses
    (V in 2..4, L in 1..3; shrinks towards V = 2, L = 1, eos = 0)."""

    def responses(v: int, length: int) -> int:
        return sum((v - 1) ** t for t in range(length)) + (v - 1) ** length

    shapes = [(v, n) for v in (2, 3, 4) for n in (1, 2, 3) if responses(v, n) <= max_sequences]
    return st.sampled_from(shapes).flatmap(lambda s: st.integers(0, s[0] - 1).map(lambda e: (s[0], s[1], e)))


def tree_logits(num_states: int, vocab_size: int, scale: float = 2.0) -> st.SearchStrategy[np.ndarray]:
    """``[S, V]`` logit table of a token-tree policy (entries in [-scale, scale])."""
    return softmax_params(num_states, vocab_size, scale)


def sequence_rewards(num_sequences: int, binary: bool = False) -> st.SearchStrategy[np.ndarray]:
    """``[Y]`` rewards per response: multiples of 1/4 in [-2, 2], or 0/1 when ``binary``."""
    values = st.integers(0, 1) if binary else st.integers(-8, 8).map(lambda k: k / 4)
    return st.lists(values, min_size=num_sequences, max_size=num_sequences).map(
        lambda xs: np.asarray(xs, dtype=np.float64)
    )


@st.composite
def grouped_rewards(draw, max_size: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """``(rewards [N], group_ids [N])``: uneven, non-contiguous groups with arbitrary integer labels
    (negative, gaps); rewards mix small integers (so ties and zero-variance groups occur) and floats."""
    n = draw(st.integers(1, max_size))
    labels = draw(st.lists(st.integers(-3, 40), min_size=1, max_size=5, unique=True))
    group_ids = draw(st.lists(st.sampled_from(labels), min_size=n, max_size=n))
    value = st.one_of(st.integers(-2, 2).map(float), st.floats(-10, 10, allow_nan=False))
    rewards = draw(st.lists(value, min_size=n, max_size=n))
    return np.asarray(rewards, dtype=np.float64), np.asarray(group_ids, dtype=np.int64)


# ----------------------------------------------------------------------------------- rollout rows
@st.composite
def rollout_batches(draw, max_rows: int = 3, max_steps: int = 6) -> dict[str, np.ndarray]:
    """A batch of rollout rows (refimpl.estimators inputs), float64 / bool ``[N, T]`` arrays:
    ``rewards``, ``values``, ``next_values``, ``terminated``, ``truncated``. Each step ends its
    episode by termination, by truncation or not at all (never both), so one row may hold several
    episodes; inside an episode ``next_values[t] == values[t + 1]`` (the consistency GAE's
    telescoping identities need); after a truncation ``next_values`` is the final observation's
    own value, unrelated to the next row entry."""
    N = draw(st.integers(1, max_rows))
    T = draw(st.integers(1, max_steps))
    ends = draw(st.lists(st.sampled_from(["none", "none", "term", "trunc"]), min_size=N * T, max_size=N * T))
    ends = np.asarray(ends).reshape(N, T)
    value = st.floats(-3, 3, allow_nan=False, allow_infinity=False)
    rewards = np.asarray(draw(st.lists(value, min_size=N * T, max_size=N * T))).reshape(N, T)
    values = np.asarray(draw(st.lists(value, min_size=N * T, max_size=N * T))).reshape(N, T)
    final = np.asarray(draw(st.lists(value, min_size=N * T, max_size=N * T))).reshape(N, T)
    next_values = np.concatenate([values[:, 1:], final[:, -1:]], axis=1)
    cut = ends != "none"
    next_values = np.where(cut, final, next_values)
    return {"rewards": rewards, "values": values, "next_values": next_values,
            "terminated": ends == "term", "truncated": ends == "trunc"}


# ------------------------------------------------------ seeded random MDPs (tabular.examples.random_mdp)
@st.composite
def seeded_random_mdps(
    draw,
    max_states: int = 6,
    max_actions: int = 4,
    gammas: tuple[float, ...] = (0.0, 0.5, 0.9),
    zero_fractions: tuple[float, ...] = (0.0, 0.5),
) -> MDP:
    """``tabular.examples.random_mdp`` from a drawn seed: Dirichlet(1) transition rows (a drawn
    fraction of entries zeroed), rewards uniform on [-1, 1], and ``rho0`` a Dirichlet(1) draw, so
    it has full support (d > 0 everywhere, as the natural-gradient and CPI closed forms need)."""
    from tabular.examples import random_mdp

    seed = draw(st.integers(0, 2**31 - 1))
    S = draw(st.integers(1, max_states))
    A = draw(st.integers(2, max_actions))
    return random_mdp(seed, S, A, gamma=draw(st.sampled_from(gammas)),
                      zero_fraction=draw(st.sampled_from(zero_fractions)))


# ---------------------------------------------------------- policy-loss batches (refimpl.losses)
@st.composite
def policy_loss_batches(draw, boundaries: tuple[float, ...], ratio: str = "token", max_rows: int = 4,
                        max_width: int = 4) -> dict:
    """A padded batch for ``policy_loss``: float64 arrays ``logp``, ``old_logp`` [N, T], bool
    ``mask`` (random, so rows are ragged and may be empty), ``advantages`` [N] (group-mean-centred
    rewards over a random uneven partition into groups) or [N, T] (token ratio levels only), with
    NaN / 1e3 garbage at masked entries; and ``boundary``: {(i, t): (multiple, b)} for entries whose
    log-ratio is ``multiple * fl(log b)`` with ``old_logp = 0`` (b a clip boundary or 1).

    Token kinds: random log-ratio in [-0.7, 0.7], far (|log r| in {1.5, 3}) or exactly on a boundary
    b. For sequence ratios ("sequence_mean", "gspo_token", "sequence_product") the boundary sits on
    the sequence ratio: one token carries n * log b (n the row length; 1 for the product) and the
    rest 0, used only when n * fl(log b) / n is exact (n in {1, 2, 4}). Callers pass boundaries b
    whose float64 ``exp(log b)`` round-trips to b exactly (``math.log`` is used, as in the tests).
    """
    import math  # local: this section's only use

    n_rows, width = draw(st.integers(1, max_rows)), draw(st.integers(1, max_width))
    mask = np.array(draw(st.lists(st.lists(st.booleans(), min_size=width, max_size=width),
                                  min_size=n_rows, max_size=n_rows)), dtype=bool).reshape(n_rows, width)
    logp = np.full((n_rows, width), np.nan)
    old = np.full((n_rows, width), 1e3)
    boundary: dict = {}
    sequence_level = ratio != "token"
    for i in range(n_rows):
        cols = [t for t in range(width) if mask[i, t]]
        n = len(cols)
        on_boundary = sequence_level and n in ((1, 2, 4) if ratio != "sequence_product" else range(1, 99))
        on_boundary = on_boundary and draw(st.booleans())
        b = draw(st.sampled_from(boundaries))
        multiple = 1 if ratio == "sequence_product" else n
        for k, t in enumerate(cols):
            if on_boundary:
                old[i, t] = 0.0
                logp[i, t] = multiple * math.log(b) if k == 0 else 0.0
                boundary[(i, t)] = (multiple, b) if k == 0 else (0, 1.0)
                continue
            kind = draw(st.sampled_from(["random", "random", "far", "boundary"]))
            if kind == "boundary" and not sequence_level:
                b = draw(st.sampled_from(boundaries))
                old[i, t], logp[i, t] = 0.0, math.log(b)
                boundary[(i, t)] = (1, b)
                continue
            old[i, t] = draw(st.floats(-3.0, -0.01))
            far = st.sampled_from([-3.0, -1.5, 1.5, 3.0])
            log_r = draw(far) if kind == "far" else draw(st.floats(-0.7, 0.7))
            logp[i, t] = old[i, t] + log_r
    adv_values = st.one_of(st.floats(-2.0, 2.0), st.sampled_from([0.0, 1.0, -1.0]))
    if ratio in ("token", "gspo_token") and draw(st.booleans()):
        advantages = np.array(draw(st.lists(adv_values, min_size=n_rows * width, max_size=n_rows * width)),
                               dtype=np.float64).reshape(n_rows, width)
    else:
        rewards_ = np.array(draw(st.lists(st.floats(-2, 2), min_size=n_rows, max_size=n_rows)),
                            dtype=np.float64)
        groups = np.array(draw(st.lists(st.integers(0, 1), min_size=n_rows, max_size=n_rows)))
        advantages = rewards_.copy()
        for g in np.unique(groups):
            advantages[groups == g] -= rewards_[groups == g].mean()
    return {"logp": logp, "old_logp": old, "advantages": advantages, "mask": mask, "boundary": boundary}

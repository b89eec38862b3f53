"""The LLM as an MDP on a token tree, enumerated exactly (Ouyang et al. 2022, eq. (2); kl.md section 1).

A *token tree* has a vocabulary ``{0, ..., V-1}`` containing an end token ``eos`` and a maximum
length ``L``. States are prefixes of non-EOS tokens of length ``0 .. L-1`` (the prompt x is fixed
and left implicit); the action is the next token; a response ends when EOS is emitted or when it
reaches ``L`` tokens (then it is *truncated*: no EOS). A policy is a ``[S, V]`` row-stochastic
table, usually ``softmax(logits)`` with one logit row per prefix, and a reward is a number per
complete response ``R(y)``.

Everything here is exact enumeration in float64: sequence probabilities (86), J = E[R], its
gradient in the logits, state-visit probabilities, per-state and sequence-level KL and their
gradients, the KL-regularised optimum (the Gibbs distribution), and the exact expectation of any
function of a group of G i.i.d. responses (multisets with multinomial weights).
This module imports neither ``refimpl`` nor ``specs`` (docs/architecture.md, contract).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tabular.gradients import softmax_policy  # one row-wise softmax for MDPs and token trees

__all__ = [
    "TokenTree",
    "make_token_tree",
    "validate_tree_policy",
    "sequence_probabilities",
    "sequence_token_logprobs",
    "state_visit_probabilities",
    "expected_sequence_reward",
    "expected_reward_gradient",
    "sequence_probability_gradients",
    "chain_token_gradients",
    "per_state_kl",
    "sequence_kl",
    "path_kl",
    "sequence_kl_gradient",
    "path_kl_gradient",
    "group_multisets",
    "group_expectation",
    "gibbs_sequence_distribution",
    "policy_from_sequence_distribution",
    "kl_regularised_objective",
]


@dataclass(frozen=True, eq=False)
class TokenTree:
    """The enumerated token tree (spec: kl.md section 1). Build with ``make_token_tree``.

    Attributes:
        vocab_size: V (EOS included). eos: the EOS token id. max_len: L, the maximum response length.
        prefixes: the states, ``prefixes[s]`` a tuple of tokens; ``prefixes[0] == ()`` (the prompt).
        sequences: the complete responses, each a tuple of tokens (ending in EOS unless truncated).
        seq_states: ``[Y, L]`` int, the state (prefix index) before each token, -1 past the end.
        seq_tokens: ``[Y, L]`` int, the tokens, -1 past the end.
        lengths: ``[Y]`` int, the number of tokens T(y) (EOS counts as a token).
        truncated: ``[Y]`` bool, responses that reached L tokens without EOS.
    """

    vocab_size: int
    eos: int
    max_len: int
    prefixes: tuple[tuple[int, ...], ...]
    sequences: tuple[tuple[int, ...], ...]
    seq_states: np.ndarray
    seq_tokens: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray

    @property
    def num_states(self) -> int:
        return len(self.prefixes)

    @property
    def num_sequences(self) -> int:
        return len(self.sequences)


def make_token_tree(vocab_size: int, max_len: int, eos: int = 0) -> TokenTree:
    """Enumerate the prefixes and complete responses of a token tree (kl.md section 1).

    ``sum_{t<L} (V-1)^t`` states and ``sum_{t<L} (V-1)^t + (V-1)^L`` responses; keep V and L small.
    """
    for value, name, low in ((vocab_size, "vocab_size", 2), (max_len, "max_len", 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if isinstance(eos, bool) or not isinstance(eos, int) or not 0 <= eos < vocab_size:
        raise ValueError(f"eos must be an int in [0, {vocab_size}), got {eos!r}")
    if (vocab_size - 1) ** max_len > 100_000:
        raise ValueError(f"tree too large to enumerate: (V-1)^L = {(vocab_size - 1) ** max_len}")
    words = [v for v in range(vocab_size) if v != eos]
    prefixes = [p for t in range(max_len) for p in itertools.product(words, repeat=t)]
    index = {p: i for i, p in enumerate(prefixes)}
    sequences = [p + (eos,) for p in prefixes] + list(itertools.product(words, repeat=max_len))
    num = len(sequences)
    seq_states = np.full((num, max_len), -1, dtype=np.int64)
    seq_tokens = np.full((num, max_len), -1, dtype=np.int64)
    lengths = np.array([len(y) for y in sequences], dtype=np.int64)
    truncated = np.array([y[-1] != eos for y in sequences], dtype=bool)
    for k, y in enumerate(sequences):
        for t, token in enumerate(y):
            seq_states[k, t] = index[y[:t]]
            seq_tokens[k, t] = token
    for arr in (seq_states, seq_tokens, lengths, truncated):
        arr.setflags(write=False)
    return TokenTree(vocab_size, eos, max_len, tuple(prefixes), tuple(sequences),
                     seq_states, seq_tokens, lengths, truncated)


def validate_tree_policy(tree: TokenTree, policy, name: str = "policy") -> np.ndarray:
    """Return ``policy`` as a float64 ``[S, V]`` array after checking shape and stochasticity."""
    pi = np.asarray(policy, dtype=np.float64)
    if pi.shape != (tree.num_states, tree.vocab_size):
        raise ValueError(f"{name} must have shape [S, V] = {(tree.num_states, tree.vocab_size)}, "
                         f"got {pi.shape}")
    if not np.all(np.isfinite(pi)) or np.any(pi < 0):
        raise ValueError(f"{name} must be finite and non-negative")
    if np.any(np.abs(pi.sum(axis=1) - 1.0) > 1e-9):
        raise ValueError(f"{name} rows must sum to 1")
    return pi


def _check_sequence_values(tree: TokenTree, values, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (tree.num_sequences,):
        raise ValueError(f"{name} must have shape [Y] = ({tree.num_sequences},), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def sequence_token_logprobs(tree: TokenTree, policy) -> np.ndarray:
    """``[Y, L]`` ``log pi(y_t | y_<t)`` per token, 0 past the end of each response."""
    pi = validate_tree_policy(tree, policy)
    valid = tree.seq_states >= 0
    with np.errstate(divide="ignore"):
        logp = np.log(pi[np.where(valid, tree.seq_states, 0), np.where(valid, tree.seq_tokens, 0)])
    return np.where(valid, logp, 0.0)


def sequence_probabilities(tree: TokenTree, policy) -> np.ndarray:
    """``[Y]`` ``pi(y) = prod_t pi(y_t | y_<t)`` (Ouyang et al. 2022); sums to 1."""
    pi = validate_tree_policy(tree, policy)
    valid = tree.seq_states >= 0
    probs = pi[np.where(valid, tree.seq_states, 0), np.where(valid, tree.seq_tokens, 0)]
    return np.prod(np.where(valid, probs, 1.0), axis=1)


def state_visit_probabilities(tree: TokenTree, policy) -> np.ndarray:
    """``[S]`` probability that a response passes through each prefix (1 for the root)."""
    probs = sequence_probabilities(tree, policy)
    visits = np.zeros(tree.num_states)
    for t in range(tree.max_len):
        states = tree.seq_states[:, t]
        np.add.at(visits, states[states >= 0], probs[states >= 0])
    return visits


def expected_sequence_reward(tree: TokenTree, policy, rewards) -> float:
    """``J = sum_y pi(y) R(y)`` (Ouyang et al. 2022, eq. (2) with beta = 0)."""
    return float(sequence_probabilities(tree, policy) @ _check_sequence_values(tree, rewards, "rewards"))


def chain_token_gradients(tree: TokenTree, policy, seq_indices, token_grads) -> np.ndarray:
    """Chain rule from per-token log-prob gradients to the logits of a softmax tree policy.

    For responses ``y^(i) = sequences[seq_indices[i]]`` and ``g[i, t] = d loss / d log pi(y^(i)_t |
    y^(i)_<t)``, returns ``[S, V]`` ``sum_{i,t} g[i,t] (onehot(y_t) - pi(.|s_t))`` placed at row s_t,
    using ``d log softmax(z)_a / d z_b = 1[a = b] - pi_b``. ``token_grads [n, >= T(y^(i))]``;
    entries past each response's end are ignored.
    """
    pi = validate_tree_policy(tree, policy)
    idx = np.asarray(seq_indices, dtype=np.int64)
    g = np.asarray(token_grads, dtype=np.float64)
    if idx.ndim != 1 or g.ndim != 2 or g.shape[0] != idx.shape[0] or g.shape[1] < 1:
        raise ValueError(f"seq_indices must be [n] and token_grads [n, T]; got {idx.shape} and {g.shape}")
    width = min(g.shape[1], tree.max_len)
    if np.any(tree.lengths[idx] > g.shape[1]):
        raise ValueError("token_grads is narrower than a response it refers to")
    states = tree.seq_states[idx, :width]
    tokens = tree.seq_tokens[idx, :width]
    valid = states >= 0
    w = np.where(valid, g[:, :width], 0.0)
    s = np.where(valid, states, 0)
    grad = np.zeros_like(pi)
    np.add.at(grad, (s, np.where(valid, tokens, 0)), w)
    per_state = np.zeros(tree.num_states)
    np.add.at(per_state, s, w)
    return grad - per_state[:, None] * pi


def sequence_probability_gradients(tree: TokenTree, logits) -> np.ndarray:
    """``[Y, S, V]`` ``d pi(y) / d logits = pi(y) sum_t (onehot(y_t) - pi(.|s_t))`` at row s_t."""
    pi = softmax_policy(logits)
    probs = sequence_probabilities(tree, pi)
    out = np.zeros((tree.num_sequences, tree.num_states, tree.vocab_size))
    for k in range(tree.num_sequences):
        ones = np.ones((1, tree.max_len))
        out[k] = probs[k] * chain_token_gradients(tree, pi, [k], ones)
    return out


def expected_reward_gradient(tree: TokenTree, logits, rewards) -> np.ndarray:
    """``[S, V]`` exact ``grad J = sum_y R(y) grad pi(y)`` in the logits (score function, Williams 1992)."""
    r = _check_sequence_values(tree, rewards, "rewards")
    return np.tensordot(r, sequence_probability_gradients(tree, logits), axes=1)


def per_state_kl(policy, ref_policy) -> np.ndarray:
    """``[S]`` ``KL(pi(.|s) || pi_ref(.|s)) = sum_a pi log(pi / pi_ref)``.

    ``0 log 0 = 0``; ``inf`` where pi puts mass outside the support of pi_ref."""
    p = np.asarray(policy, dtype=np.float64)
    q = np.asarray(ref_policy, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 2:
        raise ValueError(f"policy and ref_policy must be [S, V] of equal shape, got {p.shape} and {q.shape}")
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0)
    return terms.sum(axis=1)


def sequence_kl(tree: TokenTree, policy, ref_policy) -> float:
    """Sequence-level ``KL(pi(.|x) || pi_ref(.|x)) = sum_y pi(y) log(pi(y) / pi_ref(y))`` by enumeration."""
    p = sequence_probabilities(tree, policy)
    q = sequence_probabilities(tree, validate_tree_policy(tree, ref_policy, "ref_policy"))
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0).sum())


def path_kl(tree: TokenTree, policy, ref_policy) -> float:
    """``E_{y ~ pi}[sum_t KL(pi(.|s_t) || pi_ref(.|s_t))] = sum_s d_pi(s) KL_s`` (per-state KLs
    along the path). Equals ``sequence_kl`` by the chain rule of KL."""
    return float(state_visit_probabilities(tree, policy) @ per_state_kl(policy, ref_policy))


def sequence_kl_gradient(tree: TokenTree, logits, ref_policy) -> np.ndarray:
    """``[S, V]`` exact ``grad KL(pi_theta(.|x) || pi_ref(.|x))`` in the logits:
    ``sum_y grad pi(y) log(pi(y) / pi_ref(y))`` (the ``sum_y pi grad log pi`` term is 0)."""
    pi = softmax_policy(logits)
    q = sequence_probabilities(tree, validate_tree_policy(tree, ref_policy, "ref_policy"))
    log_ratio = np.log(sequence_probabilities(tree, pi)) - np.log(q)
    return np.tensordot(log_ratio, sequence_probability_gradients(tree, logits), axes=1)


def path_kl_gradient(tree: TokenTree, logits, ref_policy, *, reverse: bool = False) -> np.ndarray:
    """``[S, V]`` ``E_{y ~ pi}[sum_t grad KL_t]`` with the path distribution held fixed:
    ``d_pi(s) grad_{z_s} KL(pi(.|s) || pi_ref(.|s)) = d_pi(s) pi_s (log(pi_s / ref_s) - KL_s)``, or for
    ``reverse=True`` the per-state ``KL(pi_ref(.|s) || pi(.|s))``: ``d_pi(s) (pi_s - ref_s)``."""
    pi = softmax_policy(logits)
    ref = validate_tree_policy(tree, ref_policy, "ref_policy")
    visits = state_visit_probabilities(tree, pi)
    if reverse:
        per_state = pi - ref
    else:
        log_ratio = np.log(pi) - np.log(ref)
        per_state = pi * (log_ratio - per_state_kl(pi, ref)[:, None])
    return visits[:, None] * per_state


def group_multisets(num_outcomes: int, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """All multisets of ``group_size`` outcomes from ``num_outcomes``, and their multiplicities.

    Returns ``(indices [M, G]`` sorted ascending per row, ``counts [M]`` the number of ordered
    G-tuples with that multiset: ``G! / prod_k c_k!``). ``M = C(num_outcomes + G - 1, G)``.
    """
    for value, name in ((num_outcomes, "num_outcomes"), (group_size, "group_size")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    combos = np.array(list(itertools.combinations_with_replacement(range(num_outcomes), group_size)),
                      dtype=np.int64)
    counts = np.array([math.factorial(group_size) // math.prod(math.factorial(c) for c in
                       np.unique(row, return_counts=True)[1]) for row in combos], dtype=np.float64)
    return combos, counts


def group_expectation(probs, group_size: int, fn: Callable[[np.ndarray], object]) -> np.ndarray:
    """Exact ``E[f(y^(1), ..., y^(G))]`` for ``y^(i)`` i.i.d. with ``P(y = k) = probs[k]``.

    ``fn`` receives the outcome indices of one group (``[G]``, sorted) and returns a number or
    array; it must be symmetric in its arguments (as every group loss here is: sums over i), since
    each multiset is evaluated once with weight ``G! / prod c_k! * prod_i probs[y^(i)]``.
    Returns the expectation as a float64 array (0-d for scalar ``fn``).
    """
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 1 or np.any(p < 0) or abs(p.sum() - 1.0) > 1e-9:
        raise ValueError("probs must be a probability vector [Y]")
    combos, counts = group_multisets(p.shape[0], group_size)
    weights = counts * np.prod(p[combos], axis=1)
    total = None
    for row, w in zip(combos, weights, strict=True):
        if w == 0.0:
            continue
        value = w * np.asarray(fn(row), dtype=np.float64)
        total = value if total is None else total + value
    return np.asarray(total, dtype=np.float64)


def gibbs_sequence_distribution(tree: TokenTree, ref_policy, rewards, beta: float) -> np.ndarray:
    """``[Y]`` ``pi*(y) = pi_ref(y) exp(R(y) / beta) / Z``, the maximiser of ``J - beta KL``.

    Rafailov et al. 2023, eq. (4) (closed form of the KL-regularised objective)."""
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")
    q = sequence_probabilities(tree, validate_tree_policy(tree, ref_policy, "ref_policy"))
    with np.errstate(divide="ignore"):
        logits = np.log(q) + _check_sequence_values(tree, rewards, "rewards") / beta
    w = np.exp(logits - logits.max())
    return w / w.sum()


def policy_from_sequence_distribution(tree: TokenTree, seq_probs) -> np.ndarray:
    """``[S, V]`` the autoregressive factorisation ``pi(a|s) = P(prefix s+a) / P(prefix s)`` of a
    distribution over responses (uniform rows at unreachable prefixes)."""
    q = _check_sequence_values(tree, seq_probs, "seq_probs")
    if np.any(q < 0) or abs(q.sum() - 1.0) > 1e-9:
        raise ValueError("seq_probs must be a probability vector over the responses")
    mass = np.zeros((tree.num_states, tree.vocab_size))
    for t in range(tree.max_len):
        valid = tree.seq_states[:, t] >= 0
        np.add.at(mass, (tree.seq_states[valid, t], tree.seq_tokens[valid, t]), q[valid])
    totals = mass.sum(axis=1, keepdims=True)
    uniform = np.full_like(mass, 1.0 / tree.vocab_size)
    return np.where(totals > 0, mass / np.where(totals > 0, totals, 1.0), uniform)


def kl_regularised_objective(tree: TokenTree, policy, ref_policy, rewards, beta: float) -> float:
    """``J_beta = E_pi[R] - beta KL(pi(.|x) || pi_ref(.|x))`` (Ouyang et al. 2022, eq. (2), in expectation;
    Rafailov et al. 2023, eq. (3))."""
    return expected_sequence_reward(tree, policy, rewards) - beta * sequence_kl(tree, policy, ref_policy)

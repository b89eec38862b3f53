"""tabular.sequences: the LLM-as-MDP token tree (kl.md section 1), checked against
independent recursions over prefixes, finite differences and exact identities."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabular.sequences import (
    chain_token_gradients,
    expected_reward_gradient,
    expected_sequence_reward,
    gibbs_sequence_distribution,
    group_expectation,
    group_multisets,
    kl_regularised_objective,
    make_token_tree,
    path_kl,
    path_kl_gradient,
    per_state_kl,
    policy_from_sequence_distribution,
    sequence_kl,
    sequence_kl_gradient,
    sequence_probabilities,
    sequence_token_logprobs,
    softmax_policy,
    state_visit_probabilities,
)
from tests.strategies import sequence_rewards, token_tree_shapes, tree_logits


@st.composite
def tree_cases(draw, max_sequences=15, binary=False):
    v, length, eos = draw(token_tree_shapes(max_sequences))
    tree = make_token_tree(v, length, eos)
    logits = draw(tree_logits(tree.num_states, v))
    rewards = draw(sequence_rewards(tree.num_sequences, binary))
    return tree, logits, rewards


def recursive_sequence_probs(tree, pi):
    """Independent recursion: walk the tree from the root, multiplying probabilities."""
    index = {p: i for i, p in enumerate(tree.prefixes)}
    out = {}

    def walk(prefix, prob):
        s = index[prefix]
        for a in range(tree.vocab_size):
            y = prefix + (a,)
            if a == tree.eos or len(y) == tree.max_len:
                out[y] = prob * pi[s, a]
            else:
                walk(y, prob * pi[s, a])

    walk((), 1.0)
    return np.array([out[y] for y in tree.sequences])


def q_value_gradient(tree, logits, rewards):
    """grad J by the policy-gradient theorem on the tree: d(s) pi(a|s) (Q(s,a) - V(s))."""
    pi = softmax_policy(logits)
    index = {p: i for i, p in enumerate(tree.prefixes)}
    reward_of = dict(zip(tree.sequences, rewards, strict=True))
    values = {}

    def value(prefix):
        s = index[prefix]
        q = np.array([reward_of[prefix + (a,)] if (a == tree.eos or len(prefix) + 1 == tree.max_len)
                      else value(prefix + (a,)) for a in range(tree.vocab_size)])
        values[s] = q
        return float(pi[s] @ q)

    value(())
    visits = state_visit_probabilities(tree, pi)
    grad = np.zeros_like(pi)
    for s, q in values.items():
        grad[s] = visits[s] * pi[s] * (q - pi[s] @ q)
    return grad


def finite_difference(fn, x, h=1e-6):
    grad = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += h
        down[idx] -= h
        grad[idx] = (fn(up) - fn(down)) / (2 * h)
    return grad


def test_tree_enumeration_counts_and_structure():
    tree = make_token_tree(3, 2, eos=1)
    assert tree.prefixes == ((), (0,), (2,))
    assert set(tree.sequences) == {(1,), (0, 1), (2, 1), (0, 0), (0, 2), (2, 0), (2, 2)}
    assert tree.num_sequences == 7
    assert list(tree.truncated) == [y[-1] != 1 for y in tree.sequences]
    assert list(tree.lengths) == [len(y) for y in tree.sequences]
    big = make_token_tree(4, 3)
    assert big.num_states == 1 + 3 + 9 and big.num_sequences == 13 + 27


@given(tree_cases())
def test_sequence_probabilities_match_recursion(case):
    tree, logits, _ = case
    pi = softmax_policy(logits)
    probs = sequence_probabilities(tree, pi)
    np.testing.assert_allclose(probs, recursive_sequence_probs(tree, pi), rtol=1e-12, atol=0)
    assert abs(probs.sum() - 1) < 1e-12
    logp = sequence_token_logprobs(tree, pi)
    np.testing.assert_allclose(np.exp(logp.sum(axis=1)), probs, rtol=1e-12)


@given(tree_cases())
def test_visit_probabilities_flow_conservation(case):
    tree, logits, _ = case
    pi = softmax_policy(logits)
    visits = state_visit_probabilities(tree, pi)
    index = {p: i for i, p in enumerate(tree.prefixes)}
    assert visits[0] == pytest.approx(1.0, abs=1e-14)
    for prefix, s in index.items():
        if prefix:
            parent = index[prefix[:-1]]
            assert visits[s] == pytest.approx(visits[parent] * pi[parent, prefix[-1]], rel=1e-12, abs=1e-15)


@given(tree_cases())
def test_reward_gradient_equals_q_form_and_finite_differences(case):
    tree, logits, rewards = case
    grad = expected_reward_gradient(tree, logits, rewards)
    np.testing.assert_allclose(grad, q_value_gradient(tree, logits, rewards), rtol=1e-10, atol=1e-12)
    fd = finite_difference(lambda z: expected_sequence_reward(tree, softmax_policy(z), rewards), logits)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


@given(tree_cases())
def test_chain_token_gradients_is_the_logit_jacobian(case):
    tree, logits, _ = case
    rng = np.random.default_rng(0)
    idx = rng.integers(0, tree.num_sequences, size=3)
    g = rng.normal(size=(3, tree.max_len))

    def weighted_logp(z):
        logp = sequence_token_logprobs(tree, softmax_policy(z))[idx]
        return float((g * logp).sum())

    np.testing.assert_allclose(chain_token_gradients(tree, softmax_policy(logits), idx, g),
                               finite_difference(weighted_logp, logits), rtol=1e-6, atol=1e-8)


@given(tree_cases(), st.integers(0, 2**31 - 1))
def test_sequence_kl_chain_rule_and_gradients(case, seed):
    tree, logits, _ = case
    rng = np.random.default_rng(seed)
    ref = softmax_policy(rng.normal(size=logits.shape))
    pi = softmax_policy(logits)
    # chain rule of KL: the sequence-level KL equals the per-state KLs summed along the path
    assert sequence_kl(tree, pi, ref) == pytest.approx(path_kl(tree, pi, ref), rel=1e-10, abs=1e-13)
    fd = finite_difference(lambda z: sequence_kl(tree, softmax_policy(z), ref), logits)
    np.testing.assert_allclose(sequence_kl_gradient(tree, logits, ref), fd, rtol=1e-6, atol=1e-8)
    # path version: visit probabilities frozen at pi
    visits = state_visit_probabilities(tree, pi)
    fd_fixed = finite_difference(lambda z: visits @ per_state_kl(softmax_policy(z), ref), logits)
    np.testing.assert_allclose(path_kl_gradient(tree, logits, ref), fd_fixed, rtol=1e-6, atol=1e-8)
    fd_reverse = finite_difference(lambda z: visits @ per_state_kl(ref, softmax_policy(z)), logits)
    np.testing.assert_allclose(path_kl_gradient(tree, logits, ref, reverse=True), fd_reverse,
                               rtol=1e-6, atol=1e-8)


def test_per_state_kl_zero_mass_conventions():
    p = np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    q = np.array([[0.25, 0.25, 0.5], [0.0, 0.5, 0.5]])
    kl = per_state_kl(p, q)
    assert kl[0] == pytest.approx(math.log(2), rel=1e-14, abs=0.0)
    assert kl[1] == math.inf


@pytest.mark.parametrize("num_outcomes,group_size", [(1, 3), (3, 1), (4, 2), (5, 3), (3, 4)])
def test_group_multisets_cover_ordered_tuples(num_outcomes, group_size):
    combos, counts = group_multisets(num_outcomes, group_size)
    assert len(combos) == math.comb(num_outcomes + group_size - 1, group_size)
    assert counts.sum() == num_outcomes ** group_size
    ordered = {}
    for t in itertools.product(range(num_outcomes), repeat=group_size):
        key = tuple(sorted(t))
        ordered[key] = ordered.get(key, 0) + 1
    assert {tuple(c): n for c, n in zip(combos.tolist(), counts, strict=True)} == ordered


@given(tree_cases(max_sequences=7), st.integers(2, 3))
def test_group_expectation_equals_ordered_enumeration(case, group_size):
    tree, logits, rewards = case
    probs = sequence_probabilities(tree, softmax_policy(logits))

    def spread(group):  # symmetric, non-linear: population variance of the group's rewards
        return np.var(rewards[list(group)])

    ordered = sum(np.prod(probs[list(t)]) * spread(t)
                  for t in itertools.product(range(tree.num_sequences), repeat=group_size))
    exact = group_expectation(probs, group_size, spread)
    assert float(exact) == pytest.approx(ordered, rel=1e-10, abs=1e-13)
    # E[population variance of G iid draws] = (1 - 1/G) Var[R]
    var = probs @ rewards**2 - (probs @ rewards) ** 2
    assert float(exact) == pytest.approx((1 - 1 / group_size) * var, rel=1e-9, abs=1e-12)


@given(tree_cases())
def test_factorisation_round_trip(case):
    tree, logits, _ = case
    pi = softmax_policy(logits)
    np.testing.assert_allclose(policy_from_sequence_distribution(tree, sequence_probabilities(tree, pi)), pi,
                               rtol=1e-10, atol=1e-13)


@given(tree_cases(), st.floats(0.1, 5.0), st.integers(0, 2**31 - 1))
def test_gibbs_policy_maximises_kl_regularised_objective(case, beta, seed):
    tree, logits, rewards = case
    rng = np.random.default_rng(seed)
    ref = softmax_policy(rng.normal(size=logits.shape))
    gibbs = gibbs_sequence_distribution(tree, ref, rewards, beta)
    star = policy_from_sequence_distribution(tree, gibbs)
    np.testing.assert_allclose(sequence_probabilities(tree, star), gibbs, rtol=1e-10, atol=1e-14)
    q = sequence_probabilities(tree, ref)
    log_z = math.log(float(q @ np.exp(rewards / beta)))
    best = kl_regularised_objective(tree, star, ref, rewards, beta)
    # J - beta KL sums Y sequences' p(y) (R(y) - beta log(pi* / ref)(y)); beta |log(pi* / ref)| per token is
    # bounded by 2 max|R| (pi*(a|s) is a ratio of soft values), so the terms are up to (1 + 2 L) max|R|;
    # beta log Z rounds the Y-term sum q @ exp(R / beta) (beta Y u when R = 0)
    terms = (1 + 2 * tree.max_len) * float(np.abs(rewards).max()) + beta
    floor = 8 * 2.0**-53 * tree.num_sequences * terms
    assert best == pytest.approx(beta * log_z, rel=1e-10, abs=floor)
    # J_beta(pi*) - J_beta(pi) = beta KL(pi || pi*) >= 0, exactly
    pi = softmax_policy(logits)
    gap = best - kl_regularised_objective(tree, pi, ref, rewards, beta)
    assert gap == pytest.approx(beta * sequence_kl(tree, pi, star), rel=1e-8, abs=1e-11)


def test_bad_inputs_raise():
    tree = make_token_tree(3, 2)
    with pytest.raises(ValueError, match="policy"):
        sequence_probabilities(tree, np.full((3, 3), 0.5))
    with pytest.raises(ValueError, match="rewards"):
        expected_sequence_reward(tree, np.full((3, 3), 1 / 3), np.zeros(5))
    with pytest.raises(ValueError, match="eos"):
        make_token_tree(3, 2, eos=3)
    with pytest.raises(ValueError, match="beta"):
        gibbs_sequence_distribution(tree, np.full((3, 3), 1 / 3), np.zeros(7), 0.0)
    with pytest.raises(ValueError, match="probs"):
        group_expectation(np.array([0.5, 0.6]), 2, lambda g: 0.0)

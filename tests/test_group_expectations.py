"""Exact expected gradients of the GRPO family on token trees (specs/advantages.md section 3).

No sampling: every multiset of G i.i.d. responses is enumerated with its multinomial weight
(tabular.group_expectation), the batch goes through refimpl's group_advantages and policy_loss at
theta = theta_old with beta = 0, autograd gives d loss / d logp, and tabular's chain rule maps it
to the logits. The results are compared with closed forms derived independently:
-grad J / L_max (Dr. GRPO + RLOO), -(1 - 1/G) grad J / L_max (Dr. GRPO + mean-centred), the
length-biased forms (11)-(12) for GRPO and DAPO aggregation, and the difficulty factor c_G(p) (13)
for std-scaled advantages.
"""

import dataclasses
import itertools

import numpy as np
import pytest
import sympy as sp
import torch

from refimpl.advantages import group_advantages
from refimpl.losses import get_preset, policy_loss
from specs.advantages import binary_reward_gradient_factor, conditional_binary_advantage
from tabular.sequences import (
    chain_token_gradients,
    expected_reward_gradient,
    expected_sequence_reward,
    group_expectation,
    make_token_tree,
    sequence_probabilities,
    sequence_probability_gradients,
    sequence_token_logprobs,
    softmax_policy,
)

F64 = torch.float64
L_MAX = 5  # Dr. GRPO's constant: larger than any response here, as in practice
TOL = dict(rtol=1e-10, atol=1e-13)


def mean_centred(rewards):
    return group_advantages(rewards, torch.zeros(len(rewards), dtype=torch.long), scale="none",
                            singleton="error")


def rloo(rewards):
    return group_advantages(rewards, torch.zeros(len(rewards), dtype=torch.long), scale="none",
                            singleton="error", leave_one_out=True)


def population_std_scaled(rewards):
    return group_advantages(rewards, torch.zeros(len(rewards), dtype=torch.long), scale="group",
                            std="population", eps=0.0, eps_inside_sqrt=True, zero_variance="zero",
                            singleton="error")


def variant(name):
    preset = get_preset(name)
    return dataclasses.replace(preset, max_length=L_MAX) if preset.aggregation == "seq_sum" else preset


def expected_loss_gradient(tree, logits, rewards, group_size, loss_variant, advantage_fn):
    """[S, V] exact E[grad_logits loss] over groups of G i.i.d. responses at theta = theta_old."""
    pi = softmax_policy(logits)
    token_logp = sequence_token_logprobs(tree, pi)
    positions = np.arange(tree.max_len)

    def group_gradient(group):
        logp = torch.tensor(token_logp[group], dtype=F64, requires_grad=True)
        mask = torch.as_tensor(positions[None, :] < tree.lengths[group][:, None])
        advantages = advantage_fn(torch.tensor(rewards[group], dtype=F64))
        loss, _ = policy_loss(logp, logp.detach(), advantages, mask, loss_variant)
        (grad,) = torch.autograd.grad(loss, logp)
        return chain_token_gradients(tree, pi, group, grad.numpy())

    return group_expectation(sequence_probabilities(tree, pi), group_size, group_gradient)


def tree_case(seed, vocab=3, max_len=2, binary=False):
    tree = make_token_tree(vocab, max_len)
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(tree.num_states, vocab))
    rewards = rng.integers(0, 2, tree.num_sequences).astype(float) if binary else rng.normal(
        size=tree.num_sequences)
    return tree, logits, rewards


@pytest.mark.parametrize("seed,group_size", [(0, 2), (1, 3), (2, 4)])
def test_dr_grpo_with_rloo_is_unbiased_and_mean_centring_shrinks_by_1_minus_1_over_g(seed, group_size):
    tree, logits, rewards = tree_case(seed)
    grad_j = expected_reward_gradient(tree, logits, rewards)
    dr = variant("dr_grpo")
    np.testing.assert_allclose(expected_loss_gradient(tree, logits, rewards, group_size, dr, rloo),
                               -grad_j / L_MAX, **TOL)
    np.testing.assert_allclose(expected_loss_gradient(tree, logits, rewards, group_size, dr, mean_centred),
                               -(1 - 1 / group_size) * grad_j / L_MAX, **TOL)


def length_weighted_gradient(tree, logits, rewards):
    """advantages.md eq. (11) without its (1 - 1/G): sum_y grad pi(y) (R(y) - J) / T(y)."""
    j = expected_sequence_reward(tree, softmax_policy(logits), rewards)
    weights = (rewards - j) / tree.lengths
    return np.tensordot(weights, sequence_probability_gradients(tree, logits), axes=1)


@pytest.mark.parametrize("seed,group_size,max_len", [(3, 2, 3), (4, 3, 2)])
def test_grpo_aggregation_has_the_length_bias_of_eq_11(seed, group_size, max_len):
    tree, logits, rewards = tree_case(seed, max_len=max_len)
    grpo = variant("grpo")
    biased = length_weighted_gradient(tree, logits, rewards)
    got = expected_loss_gradient(tree, logits, rewards, group_size, grpo, mean_centred)
    np.testing.assert_allclose(got, -(1 - 1 / group_size) * biased, **TOL)
    np.testing.assert_allclose(expected_loss_gradient(tree, logits, rewards, group_size, grpo, rloo),
                               -biased, **TOL)
    # the deviation is real: not parallel to grad J
    grad_j = expected_reward_gradient(tree, logits, rewards).ravel()
    cosine = -got.ravel() @ grad_j / (np.linalg.norm(got) * np.linalg.norm(grad_j))
    assert cosine < 1 - 1e-4


def token_mean_gradient(tree, logits, rewards, group_size, advantage):
    """advantages.md eq. (12), by enumerating the other G - 1 responses as ordered tuples:
    -G sum_y grad pi(y) E[A_1 / (T(y) + sum_{j >= 2} T_j) | y_1 = y]."""
    probs = sequence_probabilities(tree, softmax_policy(logits))
    grads = sequence_probability_gradients(tree, logits)
    conditional = np.zeros(tree.num_sequences)
    for y in range(tree.num_sequences):
        for others in itertools.product(range(tree.num_sequences), repeat=group_size - 1):
            group = [y, *others]
            weight = np.prod(probs[list(others)])
            conditional[y] += weight * advantage(rewards[group]) / tree.lengths[group].sum()
    return -group_size * np.tensordot(conditional, grads, axes=1)


def first_mean_centred(r):
    return r[0] - r.mean()


def first_rloo(r):
    return r[0] - r[1:].mean()


@pytest.mark.parametrize("seed,group_size", [(5, 2), (6, 3)])
@pytest.mark.parametrize("preset", ["dapo", "bnpo"])
def test_token_mean_aggregation_matches_eq_12(seed, group_size, preset):
    tree, logits, rewards = tree_case(seed, max_len=3 if group_size == 2 else 2)
    got = expected_loss_gradient(tree, logits, rewards, group_size, variant(preset), mean_centred)
    expected = token_mean_gradient(tree, logits, rewards, group_size, first_mean_centred)
    np.testing.assert_allclose(got, expected, **TOL)
    got_rloo = expected_loss_gradient(tree, logits, rewards, group_size, variant(preset), rloo)
    np.testing.assert_allclose(got_rloo, token_mean_gradient(tree, logits, rewards, group_size, first_rloo),
                               **TOL)
    grad_j = expected_reward_gradient(tree, logits, rewards).ravel()
    cosine = -got_rloo.ravel() @ grad_j / (np.linalg.norm(got_rloo) * np.linalg.norm(grad_j))
    assert cosine < 1 - 1e-4  # biased even with the leave-one-out baseline


@pytest.mark.parametrize("seed,group_size", [(7, 2), (8, 3), (9, 4)])
def test_std_scaled_advantages_have_the_difficulty_factor_of_eq_13(seed, group_size):
    tree, logits, rewards = tree_case(seed, binary=True)
    pi = softmax_policy(logits)
    p = expected_sequence_reward(tree, pi, rewards)
    grad_j = expected_reward_gradient(tree, logits, rewards)
    conv = dict(scale="group", std="population", eps=0, eps_inside_sqrt=True)
    factor = float(binary_reward_gradient_factor(group_size, sp.Float(p, 30), **conv))
    got = expected_loss_gradient(tree, logits, rewards, group_size, variant("dr_grpo"), population_std_scaled)
    np.testing.assert_allclose(got, -factor * grad_j / L_MAX, **TOL)
    # GRPO aggregation: -sum_y grad pi(y) a(R(y)) / T(y)
    a = {r: float(conditional_binary_advantage(r, group_size, sp.Float(p, 30), **conv)) for r in (0, 1)}
    weights = np.array([a[int(r)] for r in rewards]) / tree.lengths
    expected = -np.tensordot(weights, sequence_probability_gradients(tree, logits), axes=1)
    got_grpo = expected_loss_gradient(tree, logits, rewards, group_size, variant("grpo"),
                                      population_std_scaled)
    np.testing.assert_allclose(got_grpo, expected, **TOL)


def test_difficulty_factor_depends_on_p_from_g_4():
    """For G = 4 the std-scaled factor differs between an easy and a balanced prompt (eq. (13))."""
    conv = dict(scale="group", std="population", eps=0, eps_inside_sqrt=True)
    c = [binary_reward_gradient_factor(4, sp.Rational(k, 10), **conv) for k in (1, 5)]
    # c_4(p) = sqrt(3) - (2 sqrt(3) - 3) p (1 - p): c_4(0.1) - c_4(0.5) = (2 sqrt(3) - 3)(0.25 - 0.09)
    assert sp.simplify(c[0] - c[1] - (2 * sp.sqrt(3) - 3) * sp.Rational(16, 100)) == 0
    assert float(c[0] - c[1]) > 0.07
    c3 = [float(binary_reward_gradient_factor(3, sp.Rational(k, 10), **conv)) for k in (1, 5)]
    assert c3[0] == pytest.approx(c3[1], rel=1e-14)


@pytest.mark.parametrize("preset,form", [("grpo", "length"), ("gspo", "length"), ("gspo_token", "length"),
                                         ("sapo", "length"), ("dapo", "token"), ("cispo", "token"),
                                         ("ppo", "token")])
def test_every_preset_at_ratio_one_follows_its_aggregation(preset, form):
    """At theta = theta_old every gate of the family has derivative A (hard clip, SAPO's
    sech^2(0) = 1, CISPO's sg(clip(1)) = 1) and GSPO's sequence ratio has gradient
    (1/T) grad log pi(y): the expected gradient is fixed by the aggregation alone, eq. (11) for
    sequence-mean presets and eq. (12) for token-mean presets."""
    group_size = 2
    tree, logits, rewards = tree_case(10, max_len=3)
    got = expected_loss_gradient(tree, logits, rewards, group_size, variant(preset), mean_centred)
    if form == "length":
        expected = -(1 - 1 / group_size) * length_weighted_gradient(tree, logits, rewards)
    else:
        expected = token_mean_gradient(tree, logits, rewards, group_size, first_mean_centred)
    np.testing.assert_allclose(got, expected, **TOL)

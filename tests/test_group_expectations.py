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

from refimpl.advantages import (
    dynamic_sampling_mask,
    dynamic_sampling_weights,
    group_advantages,
    oversampled_advantages,
)
from refimpl.losses import get_preset, loss_normalizer, policy_loss, upweighted_normalizer
from specs.advantages import (
    binary_reward_gradient_factor,
    conditional_binary_advantage,
    group_advantages_float64,
    signal_probability,
    upweighted_gradient_scale,
    upweighted_group_weight,
)
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
    assert c3[0] == pytest.approx(c3[1], rel=1e-14, abs=0.0)


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


# ---------------------------------------------------------------------------------------------
# "divide by sqrt(G)" (policy_losses.md eq. (27))


@pytest.mark.parametrize("seed,group_size", [(11, 2), (12, 3), (13, 4)])
def test_sqrt_g_aggregation_scales_grpo_s_expected_gradient_by_sqrt_g(seed, group_size):
    """E[grad loss] of seq_sqrt_token_mean = sqrt(G) times GRPO's eq. (11): the sum of the
    per-sequence token means divided by sqrt(G) instead of G."""
    tree, logits, rewards = tree_case(seed, max_len=3 if group_size == 2 else 2)
    sqrt_g = dataclasses.replace(get_preset("grpo"), aggregation="seq_sqrt_token_mean", group_size=group_size)
    biased = length_weighted_gradient(tree, logits, rewards)
    got = expected_loss_gradient(tree, logits, rewards, group_size, sqrt_g, mean_centred)
    np.testing.assert_allclose(got, -np.sqrt(group_size) * (1 - 1 / group_size) * biased, **TOL)
    got_rloo = expected_loss_gradient(tree, logits, rewards, group_size, sqrt_g, rloo)
    np.testing.assert_allclose(got_rloo, -np.sqrt(group_size) * biased, **TOL)


# ---------------------------------------------------------------------------------------------
# dynamic sampling upweighted by 1 / (1 - f) (advantages.md eq. (16)-(17)) and the
# oversampled baseline (eq. (18))


def batch_gradient(tree, pi, token_logp, seqs, rewards, group_ids, loss_variant, advantage_fn, upweight):
    """[S, V] grad_logits of one batch's loss at theta = theta_old: advantages per group, and with
    ``upweight`` the zero-signal groups filtered and the rest upweighted by 1 / (1 - f)."""
    positions = np.arange(tree.max_len)
    logp = torch.tensor(token_logp[seqs], dtype=F64, requires_grad=True)
    mask = torch.as_tensor(positions[None, :] < tree.lengths[seqs][:, None])
    r = torch.tensor(rewards, dtype=F64)
    ids = torch.as_tensor(group_ids)
    advantages = advantage_fn(r, ids)
    normalizer = None
    if upweight:
        keep = dynamic_sampling_mask(r, ids)
        normalizer = upweighted_normalizer(mask, loss_variant, keep)
        mask = mask & keep[:, None]
    loss, _ = policy_loss(logp, logp.detach(), advantages, mask, loss_variant, normalizer=normalizer)
    (grad,) = torch.autograd.grad(loss, logp)
    return chain_token_gradients(tree, pi, seqs, grad.numpy())


def grouped_mean_centred(r, ids):
    return group_advantages(r, ids, scale="none", singleton="error")


def expected_multi_prompt_gradient(tree, logits, prompt_rewards, group_size, loss_variant, upweight=True):
    """Exact E[grad loss] for one group of G i.i.d. responses per prompt (prompts share the
    policy and differ in their rewards), enumerating every prompt's group (nested multisets)."""
    pi = softmax_policy(logits)
    token_logp = sequence_token_logprobs(tree, pi)
    probs = sequence_probabilities(tree, pi)

    def nested(chosen):
        b = len(chosen)
        if b == len(prompt_rewards):
            seqs = np.concatenate(chosen)
            rewards = np.concatenate([prompt_rewards[k][c] for k, c in enumerate(chosen)])
            ids = np.repeat(np.arange(b), group_size)
            return batch_gradient(tree, pi, token_logp, seqs, rewards, ids, loss_variant,
                                  grouped_mean_centred, upweight)
        return group_expectation(probs, group_size, lambda group: nested([*chosen, group]))

    return nested([])


def binary_prompts(seed, count, max_len=2, vocab=2):
    tree = make_token_tree(vocab, max_len)
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(tree.num_states, vocab))
    prompts = []
    while len(prompts) < count:  # distinct, non-constant 0/1 reward functions
        r = rng.integers(0, 2, tree.num_sequences).astype(float)
        if 0 < r.sum() < len(r) and not any(np.array_equal(r, p) for p in prompts):
            prompts.append(r)
    return tree, logits, prompts


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo"])
@pytest.mark.parametrize("seed,num_prompts,group_size,max_len", [(20, 2, 2, 3), (21, 3, 2, 2), (22, 2, 3, 2)])
def test_upweighted_dynamic_sampling_has_the_exact_ratio_estimator_expectation_of_eq_17(
        preset, seed, num_prompts, group_size, max_len):
    """E[grad] = sum_b w_b E[H_b], w_b = E[1 / (1 + K_{-b})] (eq. (17)): each prompt weighted by how
    often the *other* prompts are filtered; not E[grad unfiltered] / E[1 - f] unless every prompt
    has the same q, and then still short by the factor 1 - (1 - q)^B (an empty batch gets 0)."""
    tree, logits, prompts = binary_prompts(seed, num_prompts, max_len)
    v = variant(preset)
    pi = softmax_policy(logits)
    p = [expected_sequence_reward(tree, pi, r) for r in prompts]
    q = [float(signal_probability(group_size, sp.Float(pb, 30))) for pb in p]
    # E[H_b]: one prompt's group alone (eq. (10) / (11) with mean-centred advantages)
    if preset == "grpo":
        single = [-(1 - 1 / group_size) * length_weighted_gradient(tree, logits, r) for r in prompts]
    else:
        single = [-(1 - 1 / group_size) * expected_reward_gradient(tree, logits, r) / L_MAX for r in prompts]
    weights = [float(upweighted_group_weight([sp.Float(qc, 30) for c, qc in enumerate(q) if c != b]))
               for b in range(num_prompts)]
    expected = sum(w * h for w, h in zip(weights, single, strict=True))
    got = expected_multi_prompt_gradient(tree, logits, prompts, group_size, v)
    np.testing.assert_allclose(got, expected, **TOL)
    unfiltered = expected_multi_prompt_gradient(tree, logits, prompts, group_size, v, upweight=False)
    np.testing.assert_allclose(unfiltered, sum(single) / num_prompts, **TOL)
    # the ratio of expectations E[g] / E[1 - f] is a different vector (the prompts' q differ)
    target = unfiltered / np.mean(q)
    assert np.abs(got - target).max() > 1e-3 * np.abs(target).max()


@pytest.mark.parametrize("num_groups,group_size", [(2, 2), (3, 2), (2, 3)])
def test_upweighting_one_prompt_scales_the_unfiltered_gradient_by_1_minus_1_minus_q_to_the_b_over_q(
        num_groups, group_size):
    """Same prompt in every group: E[grad] = (1 - (1 - q)^B) / q E[grad unfiltered], i.e. the ratio
    of expectations E[g] / E[1 - f] = E[g] / q times 1 - (1 - q)^B (bias -(1 - q)^B E[g] / q)."""
    tree, logits, (rewards,) = binary_prompts(23 + num_groups, 1)
    v = variant("grpo")
    p = expected_sequence_reward(tree, softmax_policy(logits), rewards)
    q = float(signal_probability(group_size, sp.Float(p, 30)))
    scale = float(upweighted_gradient_scale(sp.Float(q, 30), num_groups))
    prompts = [rewards] * num_groups
    got = expected_multi_prompt_gradient(tree, logits, prompts, group_size, v)
    unfiltered = expected_multi_prompt_gradient(tree, logits, prompts, group_size, v, upweight=False)
    np.testing.assert_allclose(got, scale * unfiltered, **TOL)
    np.testing.assert_allclose(got - unfiltered / q, -(1 - q) ** num_groups * unfiltered / q, **TOL)
    assert scale > 1 + 1e-3  # the filtered groups' dilution is undone


def test_upweighting_weights_are_exact_rationals_by_enumerating_the_kept_groups():
    """eq. (17) with rational signal probabilities, by enumerating every kept / filtered pattern in
    exact arithmetic: E[k_b / K] (0 when K = 0) = q_b w_b, and one prompt's scale (1 - (1 - q)^B) / q."""
    q = [sp.Rational(1, 3), sp.Rational(3, 4), sp.Rational(2, 5)]
    for b in range(len(q)):
        total = sp.Integer(0)
        for pattern in itertools.product((0, 1), repeat=len(q)):
            prob = sp.prod([qc if k else 1 - qc for qc, k in zip(q, pattern, strict=True)])
            if pattern[b]:
                total += prob / sum(pattern)
        w = upweighted_group_weight([qc for c, qc in enumerate(q) if c != b])
        assert total == q[b] * w
    # by hand: int_0^1 (1/4 + 3x/4)(3/5 + 2x/5) dx = 3/20 + (1/10 + 9/20) / 2 + (3/10) / 3 = 21/40
    assert upweighted_group_weight([sp.Rational(3, 4), sp.Rational(2, 5)]) == sp.Rational(21, 40)
    for num_groups in (1, 2, 5):
        qq = sp.Rational(2, 7)
        total = sp.Integer(0)
        for kept in range(1, num_groups + 1):  # E[B k_1 / K] / q: the scale of eq. (17)
            total += sp.binomial(num_groups - 1, kept - 1) * qq**kept * (1 - qq) ** (num_groups - kept) / kept
        assert num_groups * total / qq == upweighted_gradient_scale(qq, num_groups)


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "dapo", "gspo", "sapo"])
def test_weights_and_the_upweighted_normalizer_give_the_same_loss(preset):
    """advantages.md eq. (16): multiplying each sequence's advantage by keep / (1 - f)
    (dynamic_sampling_weights; every gate is positively homogeneous in A) equals filtering the rows
    and dividing by (1 - f) D (upweighted_normalizer); under a sequence mean that is the kept rows'
    own D, under token_mean it is not."""
    g = torch.Generator().manual_seed(3)
    n, t = 8, 4
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 2.0, 0.5], dtype=F64)
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    mask = torch.rand(n, t, generator=g) < 0.8
    mask[:, 0] = True
    old = -torch.rand(n, t, generator=g, dtype=F64)
    logp = (old + 0.1 * torch.randn(n, t, generator=g, dtype=F64)).requires_grad_(True)
    v = variant(preset)
    adv = grouped_mean_centred(rewards, ids)
    weights = dynamic_sampling_weights(rewards, ids)
    assert weights.tolist() == [0.0, 0.0, 2.0, 2.0, 0.0, 0.0, 2.0, 2.0]  # f = 1/2
    keep = dynamic_sampling_mask(rewards, ids)
    a, _ = policy_loss(logp, old, adv * weights, mask, v)
    upweighted = upweighted_normalizer(mask, v, keep)
    b, _ = policy_loss(logp, old, adv, mask & keep[:, None], v, normalizer=upweighted)
    ga, gb = (torch.autograd.grad(x, logp)[0] for x in (a, b))
    assert float(a.detach()) == pytest.approx(float(b.detach()), rel=1e-13, abs=0.0)
    assert torch.allclose(ga, gb, rtol=1e-13, atol=1e-16)
    local = loss_normalizer(mask & keep[:, None], v)
    assert (float(upweighted) == float(local)) == (v.aggregation != "token_mean")


def test_dynamic_sampling_options_reject_bad_input():
    r = torch.tensor([1.0, 0.0])
    ids = torch.tensor([0, 0])
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(TypeError, match="group_ids must be an integer"):
        dynamic_sampling_weights(r, torch.zeros(2))
    with pytest.raises(TypeError, match="selected must be a bool"):
        oversampled_advantages(r, ids, torch.ones(2), scale="none", singleton="error")
    with pytest.raises(ValueError, match=r"selected must have the shape of rewards \(2,\), got \(3,\)"):
        oversampled_advantages(r, ids, torch.ones(3, dtype=torch.bool), scale="none", singleton="error")
    with pytest.raises(ValueError, match="rewards contains NaN or inf"):
        dynamic_sampling_weights(torch.tensor([1.0, float("nan")]), ids)
    assert dynamic_sampling_weights(torch.ones(4), torch.tensor([0, 0, 1, 1])).tolist() == [0.0] * 4
    everything_dropped = upweighted_normalizer(mask, get_preset("dapo"), torch.zeros(2, dtype=torch.bool))
    assert float(everything_dropped) == 6.0


def expected_subset_gradient(tree, logits, rewards, oversampled, subset, loss_variant, advantage_kwargs):
    """[S, V] exact E[grad loss] when G' = ``oversampled`` i.i.d. responses form the baseline and a
    uniformly random subset of ``subset`` of them (equivalently the first ones) enters the loss."""
    pi = softmax_policy(logits)
    token_logp = sequence_token_logprobs(tree, pi)
    positions = np.arange(tree.max_len)

    def group_gradient(group):
        total = 0.0
        choices = list(itertools.combinations(range(oversampled), subset))
        for chosen in choices:
            selected = torch.zeros(oversampled, dtype=torch.bool)
            selected[list(chosen)] = True
            seqs = group[list(chosen)]
            adv = oversampled_advantages(torch.tensor(rewards[group], dtype=F64), torch.zeros(
                oversampled, dtype=torch.long), selected, **advantage_kwargs)
            logp = torch.tensor(token_logp[seqs], dtype=F64, requires_grad=True)
            mask = torch.as_tensor(positions[None, :] < tree.lengths[seqs][:, None])
            loss, _ = policy_loss(logp, logp.detach(), adv, mask, loss_variant)
            (grad,) = torch.autograd.grad(loss, logp)
            total = total + chain_token_gradients(tree, pi, seqs, grad.numpy())
        return total / len(choices)

    return group_expectation(sequence_probabilities(tree, pi), oversampled, group_gradient)


@pytest.mark.parametrize("seed,oversampled,subset", [(30, 4, 2), (31, 3, 1), (32, 4, 3)])
def test_oversampled_baseline_has_the_bias_of_g_prime_not_of_the_subset(seed, oversampled, subset):
    """eq. (18): the baseline from all G' samples, the loss on G of them: mean-centred
    -(1 - 1/G') grad J / L_max, leave-one-out -grad J / L_max (unbiased), whatever G."""
    tree, logits, rewards = tree_case(seed, vocab=2, max_len=3)
    grad_j = expected_reward_gradient(tree, logits, rewards)
    dr = variant("dr_grpo")
    centred = expected_subset_gradient(tree, logits, rewards, oversampled, subset, dr,
                                       dict(scale="none", singleton="error"))
    np.testing.assert_allclose(centred, -(1 - 1 / oversampled) * grad_j / L_MAX, **TOL)
    loo = expected_subset_gradient(tree, logits, rewards, oversampled, subset, dr,
                                   dict(scale="none", singleton="error", leave_one_out=True))
    np.testing.assert_allclose(loo, -grad_j / L_MAX, **TOL)
    grpo = expected_subset_gradient(tree, logits, rewards, oversampled, subset, variant("grpo"),
                                    dict(scale="none", singleton="error"))
    np.testing.assert_allclose(grpo, -(1 - 1 / oversampled) * length_weighted_gradient(tree, logits, rewards),
                               **TOL)


def test_oversampled_std_scaled_baseline_has_the_difficulty_factor_of_g_prime():
    """eq. (18) with the group std of all G' = 4 samples (population, eps = 0): c_4(p), not c_2(p)."""
    tree, logits, rewards = tree_case(33, vocab=2, max_len=3, binary=True)
    p = expected_sequence_reward(tree, softmax_policy(logits), rewards)
    conv = dict(scale="group", std="population", eps=0, eps_inside_sqrt=True)
    got = expected_subset_gradient(tree, logits, rewards, 4, 2, variant("dr_grpo"),
                                   dict(conv, zero_variance="zero", singleton="error"))
    factor = float(binary_reward_gradient_factor(4, sp.Float(p, 30), **conv))
    np.testing.assert_allclose(got, -factor * expected_reward_gradient(tree, logits, rewards) / L_MAX, **TOL)
    assert abs(factor - float(binary_reward_gradient_factor(2, sp.Float(p, 30), **conv))) > 1e-2


def test_a_reward_dependent_subset_is_biased():
    """Selecting the G most atypical of G' rewards depends on the rewards:
    the exact expectation (an ordered-tuple loop written here from eq. (18)) is not along grad J."""
    tree, logits, rewards = tree_case(34)
    pi = softmax_policy(logits)
    probs = sequence_probabilities(tree, pi)
    grads = sequence_probability_gradients(tree, logits) / probs[:, None, None]  # grad log pi(y)
    oversampled, subset = 3, 1
    expected = np.zeros_like(grads[0])
    for draw in itertools.product(range(tree.num_sequences), repeat=oversampled):
        r = rewards[list(draw)]
        centred = r - r.mean()
        chosen = sorted(range(oversampled), key=lambda i: (-abs(centred[i]), i))[:subset]
        for i in chosen:
            expected -= np.prod(probs[list(draw)]) * centred[i] * grads[draw[i]] / (subset * L_MAX)

    def most_atypical(group):
        r = torch.tensor(rewards[group], dtype=F64)
        everyone = torch.ones(oversampled, dtype=torch.bool)
        adv = oversampled_advantages(r, torch.zeros(oversampled, dtype=torch.long), everyone, scale="none",
                                     singleton="error")
        order = sorted(range(oversampled), key=lambda i: (-abs(float(adv[i])), i))[:subset]
        seqs = group[order]
        logp = torch.tensor(sequence_token_logprobs(tree, pi)[seqs], dtype=F64, requires_grad=True)
        mask = torch.as_tensor(np.arange(tree.max_len)[None, :] < tree.lengths[seqs][:, None])
        loss, _ = policy_loss(logp, logp.detach(), adv[order], mask, variant("dr_grpo"))
        (grad,) = torch.autograd.grad(loss, logp)
        return chain_token_gradients(tree, pi, seqs, grad.numpy())

    got = group_expectation(probs, oversampled, most_atypical)
    np.testing.assert_allclose(got, expected, **TOL)
    grad_j = expected_reward_gradient(tree, logits, rewards).ravel()
    cosine = -got.ravel() @ grad_j / (np.linalg.norm(got) * np.linalg.norm(grad_j))
    assert cosine < 1 - 1e-4


def test_oversampled_advantages_are_the_spec_s_over_all_g_prime_samples():
    """eq. (18): the selected samples' advantages equal specs.advantages.group_advantages_exact over
    all samples of each group (correctly rounded), in the order of the selection."""
    rewards = [0.5, 1.0, 0.0, 1.0, 0.25, 0.75, 0.0, 1.0]
    ids = [0, 0, 0, 0, 1, 1, 1, 1]
    selected = torch.tensor([True, False, True, False, False, True, True, False])
    for conv in (dict(scale="none", singleton="error"),
                 dict(scale="none", singleton="error", leave_one_out=True),
                 dict(scale="group", std="sample", eps=1e-4, eps_inside_sqrt=False, zero_variance="zero",
                      singleton="error")):
        got = oversampled_advantages(torch.tensor(rewards, dtype=F64), torch.tensor(ids), selected, **conv)
        exact = group_advantages_float64(rewards, ids, **conv)
        want = torch.tensor([e for e, s in zip(exact, selected.tolist(), strict=True) if s], dtype=F64)
        assert torch.allclose(got, want, rtol=1e-14, atol=0), conv  # a few roundings of O(1) values

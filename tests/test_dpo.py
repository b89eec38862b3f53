"""refimpl.losses.dpo: values and gradients against the formulas of kl.md section 5, and the
tabular facts: the Gibbs policy maximises the KL-regularised objective, and the DPO loss on exact
Bradley-Terry preference probabilities is minimised there (bandit and token tree)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from refimpl.losses.dpo import bradley_terry_loss, dpo_loss
from tabular.sequences import (
    expected_reward_gradient,
    gibbs_sequence_distribution,
    make_token_tree,
    policy_from_sequence_distribution,
    sequence_kl_gradient,
    sequence_probabilities,
    softmax_policy,
)
from tests.test_kl import tree_path_logprobs

F64 = torch.float64


def softplus_neg(x: float) -> float:
    """-log sigma(x), computed stably in float64."""
    return math.log1p(math.exp(-x)) if x > 0 else -x + math.log1p(math.exp(x))


pairs = st.lists(st.tuples(*[st.floats(-60, 0)] * 4), min_size=1, max_size=6)


@given(pairs, st.floats(0.01, 5.0))
def test_dpo_value_and_gradient_match_the_formula(rows, beta):
    pc, pr, rc, rr = (torch.tensor(col, dtype=F64) for col in zip(*rows, strict=True))
    pc.requires_grad_(True)
    pr.requires_grad_(True)
    loss, metrics = dpo_loss(pc, pr, rc, rr, beta=beta)
    margins = [beta * ((a - c) - (b - d)) for a, b, c, d in rows]
    assert loss.item() == pytest.approx(sum(softplus_neg(m) for m in margins) / len(rows), rel=1e-12, abs=0.0)
    g_chosen, g_rejected = torch.autograd.grad(loss, (pc, pr))
    sig = [1 / (1 + math.exp(m)) if m > -700 else 1.0 for m in margins]  # sigma(-m)
    expected = np.array([beta * s / len(rows) for s in sig])
    np.testing.assert_allclose(g_chosen.numpy(), -expected, rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(g_rejected.numpy(), expected, rtol=1e-10, atol=1e-300)
    # a mean margin near 0 cancels: each margin rounds its 4 log-probs (sum |row|) a few times, the mean
    # adds one rounding per row
    floor = 4 * 2.0**-53 * beta * (3 + len(rows)) * max(sum(map(abs, row)) for row in rows)
    assert metrics["reward_margin"].item() == pytest.approx(sum(margins) / len(rows), rel=1e-10, abs=floor)
    assert metrics["reward_accuracy"].item() == sum(m > 0 for m in margins) / len(rows)
    assert not metrics["chosen_reward"].requires_grad


def test_bradley_terry_value_gradient_and_weights():
    rc = torch.tensor([2.0, -1.0, 0.5], dtype=F64, requires_grad=True)
    rr = torch.tensor([1.0, 1.0, 0.5], dtype=F64)
    w = torch.tensor([1.0, 3.0, 0.0], dtype=F64)
    loss, metrics = bradley_terry_loss(rc, rr, weights=w)
    expected = (softplus_neg(1.0) + 3 * softplus_neg(-2.0)) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-14, abs=0.0)
    (g,) = torch.autograd.grad(loss, rc)
    expected_grad = [-1 / (1 + math.e) / 4, -3 / (1 + math.exp(-2.0)) / 4, 0.0]
    np.testing.assert_allclose(g.numpy(), expected_grad, rtol=1e-12)
    assert metrics["reward_accuracy"].item() == pytest.approx(0.25, rel=1e-14, abs=0.0)


def test_extreme_margins_and_low_precision_are_finite():
    big = torch.tensor([-200.0, 200.0], dtype=torch.bfloat16, requires_grad=True)
    zeros = torch.zeros(2, dtype=torch.bfloat16)
    loss, _ = dpo_loss(big, zeros, zeros, zeros, beta=1.0)
    (g,) = torch.autograd.grad(loss, big)
    assert loss.dtype == torch.float32 and torch.isfinite(loss) and torch.isfinite(g).all()
    assert loss.item() == pytest.approx(100.0, rel=1e-6, abs=0.0)  # (200 + ~0) / 2
    empty = torch.zeros(0, dtype=F64, requires_grad=True)
    loss, _ = bradley_terry_loss(empty, torch.zeros(0, dtype=F64))
    assert loss.item() == 0.0


def test_bad_inputs_raise():
    a = torch.zeros(3, dtype=F64)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(a, a, a, a, beta=0.0)
    with pytest.raises(ValueError, match="ref_rejected_logps"):
        dpo_loss(a, a, a, torch.zeros(2, dtype=F64), beta=0.1)
    with pytest.raises(ValueError, match="NaN"):
        bradley_terry_loss(a, torch.tensor([0.0, math.nan, 0.0], dtype=F64))
    with pytest.raises(ValueError, match="weights"):
        bradley_terry_loss(a, a, weights=torch.tensor([1.0, -1.0, 0.0], dtype=F64))
    with pytest.raises(TypeError):
        dpo_loss(a, a, a, a, 0.1)  # beta is keyword-only


# ----------------------------------------------------------------------- tabular: Gibbs and DPO
def population_dpo_loss(tree, logits, ref_logits, rewards, beta, pair_probs):
    """Expected DPO loss over all ordered pairs (y, y'), y != y', drawn with probability
    mu(y) mu(y') and labelled y > y' with the exact Bradley-Terry probability sigma(R - R')."""
    logp, mask = tree_path_logprobs(tree, logits)
    ref_logp, _ = tree_path_logprobs(tree, ref_logits)
    seq_logp, seq_ref = (logp * mask).sum(-1), (ref_logp * mask).sum(-1)
    y, y2 = np.nonzero(~np.eye(tree.num_sequences, dtype=bool))
    bt = 1 / (1 + np.exp(-(rewards[y] - rewards[y2])))
    weights = torch.tensor(pair_probs[y] * pair_probs[y2] * bt, dtype=F64)
    loss, _ = dpo_loss(seq_logp[y], seq_logp[y2], seq_ref[y], seq_ref[y2], beta=beta, weights=weights)
    return loss


@pytest.mark.parametrize("vocab,max_len,seed", [(4, 1, 0), (5, 1, 1), (3, 2, 2)])
def test_dpo_is_minimised_at_the_gibbs_policy(vocab, max_len, seed):
    """Bandit (max_len = 1) and a two-step token tree: pi* = pi_ref exp(R / beta) / Z is a
    stationary point of J_beta, the population DPO loss has zero gradient there, is larger at
    perturbed policies, and minimising it from a random start recovers pi*."""
    tree = make_token_tree(vocab, max_len)
    rng = np.random.default_rng(seed)
    beta = 0.7
    ref_logits = rng.normal(size=(tree.num_states, vocab))
    rewards = rng.normal(size=tree.num_sequences)
    ref = softmax_policy(ref_logits)
    gibbs = gibbs_sequence_distribution(tree, ref, rewards, beta)
    star_logits = np.log(policy_from_sequence_distribution(tree, gibbs))
    # stationarity of J_beta = J - beta KL at pi* (exact gradients from tabular)
    grad_j_beta = (expected_reward_gradient(tree, star_logits, rewards)
                   - beta * sequence_kl_gradient(tree, star_logits, ref))
    # 0 exactly; in float64 each gradient sums Y = num_sequences terms p(y) R(y) d log p(y) and
    # beta p(y) log(pi* / ref)(y) d log p(y), with beta |log(pi* / ref)| = |R - beta log Z| <= 2 max|R|
    floor = 4 * 2.0**-53 * tree.num_sequences * 3 * float(np.abs(rewards).max())
    np.testing.assert_allclose(grad_j_beta, 0.0, atol=floor)

    pair_probs = sequence_probabilities(tree, ref)  # pairs sampled from the reference policy
    ref_t = torch.tensor(ref_logits, dtype=F64)
    z_star = torch.tensor(star_logits, dtype=F64, requires_grad=True)
    loss_star = population_dpo_loss(tree, z_star, ref_t, rewards, beta, pair_probs)
    (grad,) = torch.autograd.grad(loss_star, z_star)
    assert grad.abs().max().item() < 1e-12
    for _ in range(5):
        z = torch.tensor(star_logits + 0.3 * rng.normal(size=star_logits.shape), dtype=F64)
        assert np.abs(sequence_probabilities(tree, softmax_policy(z.numpy())) - gibbs).max() > 1e-3
        assert population_dpo_loss(tree, z, ref_t, rewards, beta, pair_probs).item() > loss_star.item()

    z = torch.tensor(rng.normal(size=star_logits.shape), dtype=F64, requires_grad=True)
    opt = torch.optim.LBFGS([z], lr=1.0, max_iter=500, tolerance_grad=1e-13, tolerance_change=1e-15,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = population_dpo_loss(tree, z, ref_t, rewards, beta, pair_probs)
        loss.backward()
        return loss

    opt.step(closure)
    found = sequence_probabilities(tree, softmax_policy(z.detach().numpy()))
    np.testing.assert_allclose(found, gibbs, atol=1e-6)


def test_bradley_terry_reward_model_recovers_rewards_up_to_a_constant():
    rng = np.random.default_rng(3)
    k = 5
    true = rng.normal(size=k)
    y, y2 = np.nonzero(~np.eye(k, dtype=bool))
    bt = torch.tensor(1 / (1 + np.exp(-(true[y] - true[y2]))), dtype=F64)
    r = torch.zeros(k, dtype=F64, requires_grad=True)
    opt = torch.optim.LBFGS([r], lr=1.0, max_iter=500, tolerance_grad=1e-13, tolerance_change=1e-15,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss, _ = bradley_terry_loss(r[y], r[y2], weights=bt)
        loss.backward()
        return loss

    opt.step(closure)
    learned = r.detach().numpy()
    np.testing.assert_allclose(learned - learned.mean(), true - true.mean(), atol=1e-6)

"""The smaller loss modules (refimpl/losses: kl_control, value, dpo, logprobs): every error names
its argument in full (anchored match), and the branches mutation testing found unobserved (the
normaliser passed through ppo_combined_loss, entropy over many chunks)."""

from __future__ import annotations

import math

import pytest
import torch

from refimpl.losses import (
    PPO,
    AdaptiveKLController,
    DualAscentKLController,
    bradley_terry_loss,
    entropy_bonus_loss,
    policy_loss,
    ppo_combined_loss,
    token_entropy,
    token_logprobs,
    value_loss,
)

F64 = torch.float64


@pytest.mark.parametrize(
    ("make", "error", "pattern"),
    [(lambda: AdaptiveKLController("0.1", 0.01), TypeError,
      r"^beta must be a real number or a scalar tensor, got str$"),
     (lambda: AdaptiveKLController(torch.ones(2), 0.01), ValueError,
      r"^beta must be a scalar, got shape \(2,\)$"),
     (lambda: AdaptiveKLController(0.1, math.nan), ValueError, r"^target_kl must be finite, got nan$"),
     (lambda: AdaptiveKLController(0.1, 0.01, factor=True), TypeError,
      r"^factor must be a real number or a scalar tensor, got bool$"),
     (lambda: AdaptiveKLController(0.1, 0.01, band=None), TypeError,
      r"^band must be a real number or a scalar tensor, got NoneType$"),
     (lambda: DualAscentKLController(None, 0.01, 0.1), TypeError,
      r"^coef must be a real number or a scalar tensor, got NoneType$"),
     (lambda: DualAscentKLController(0.0, None, 0.1), TypeError,
      r"^target_kl must be a real number or a scalar tensor, got NoneType$"),
     (lambda: DualAscentKLController(0.0, 0.01, None), TypeError,
      r"^lr must be a real number or a scalar tensor, got NoneType$"),
     (lambda: DualAscentKLController(0.0, 0.01, 0.0), ValueError,
      r"^target_kl and lr must be > 0, got target_kl=0.01, lr=0.0$"),
     (lambda: DualAscentKLController(0.0, 0.0, 0.1), ValueError,
      r"^target_kl and lr must be > 0, got target_kl=0.0, lr=0.1$"),
     (lambda: AdaptiveKLController(0.1, 0.01).update("x"), TypeError,
      r"^kl must be a real number or a scalar tensor, got str$")],
)
def test_kl_controller_errors_name_the_argument(make, error, pattern):
    with pytest.raises(error, match=pattern):
        make()


def _value_batch():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    values = torch.tensor([[0.5, -1.0, 9.0], [2.0, 9.0, 9.0]], dtype=F64)
    return mask, values


def test_value_and_entropy_errors_name_the_argument():
    mask, values = _value_batch()
    bad = values.clone()
    bad[0, 0] = math.nan
    with pytest.raises(ValueError, match=r"^entropy contains NaN or inf at unmasked positions$"):
        entropy_bonus_loss(bad, mask)
    with pytest.raises(ValueError, match=r"^old_values must be given exactly when clip_eps is given$"):
        value_loss(values, values, mask, clip_eps=0.2)
    args = (values, values, values, values, values, values, mask)
    for name in ("value_coef", "entropy_coef"):
        coefs = {"value_coef": 0.5, "entropy_coef": 0.01, name: -1.0}
        with pytest.raises(ValueError, match=rf"^{name} must be a number >= 0, got -1.0$"):
            ppo_combined_loss(*args, **coefs)


def test_ppo_combined_loss_passes_the_global_normalizer_to_every_part():
    """md eq. (24) with normalizer=D: each part divides its sum by D (here 10, not the 3 tokens)."""
    mask, values = _value_batch()
    logp = torch.tensor([[-1.0, -0.5, 0.0], [-2.0, 0.0, 0.0]], dtype=F64)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    entropy = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]], dtype=F64)
    returns = values + 1.0
    loss, metrics = ppo_combined_loss(logp, logp, adv, values, returns, entropy, mask, value_coef=0.5,
                                      entropy_coef=0.25, normalizer=10.0)
    pi, _ = policy_loss(logp, logp, adv, mask, PPO, normalizer=10.0)
    # ratio 1: policy sum -(1 + 1 - 1) / 10; value (returns - values)^2 = 1 per token; H sum 6
    assert float(pi) == pytest.approx(-0.1, rel=1e-15)
    assert float(metrics["value_loss"]) == pytest.approx(3 * 1.0 / 10, rel=1e-15)
    assert float(metrics["entropy_loss"]) == pytest.approx(-6.0 / 10, rel=1e-15)
    assert float(loss) == pytest.approx(-0.1 + 0.5 * 0.3 - 0.25 * 0.6, rel=1e-14)


def test_bradley_terry_errors_name_each_reward():
    good = torch.zeros(3, dtype=F64)
    with pytest.raises(TypeError, match=r"^rejected_rewards must be a floating-point torch.Tensor$"):
        bradley_terry_loss(good, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^rejected_rewards contains NaN or inf$"):
        bradley_terry_loss(good, torch.tensor([0.0, math.inf, 0.0], dtype=F64))
    with pytest.raises(ValueError, match=r"^chosen_rewards contains NaN or inf$"):
        bradley_terry_loss(torch.tensor([math.nan, 0.0, 0.0], dtype=F64), good)


@pytest.mark.parametrize("chunk_elements", [None, 8, 5])
def test_token_entropy_over_many_chunks_equals_the_direct_formula(chunk_elements):
    """H = -sum p log p per row, with rows split into chunks of chunk_elements // V rows (here 1
    or 2 rows of V = 4, so 7 rows take 4 to 7 chunks); float64, a few roundings: 1e-14."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 4, generator=g, dtype=F64)
    logits[3, 1] = -math.inf
    p = torch.softmax(logits, dim=-1)
    direct = -(p * torch.log_softmax(logits, dim=-1)).nan_to_num().sum(dim=-1)
    got = token_entropy(logits, chunk_elements=chunk_elements)
    assert torch.allclose(got, direct, rtol=1e-14, atol=0)


def test_value_loss_checks_clip_eps_and_names_old_values():
    mask, values = _value_batch()
    with pytest.raises(ValueError, match=r"^clip_eps must be a positive number, got 0.0$"):
        value_loss(values, values, mask, old_values=values, clip_eps=0.0)
    bad = values.clone()
    bad[1, 0] = math.inf
    with pytest.raises(ValueError, match=r"^old_values contains NaN or inf at unmasked positions$"):
        value_loss(values, values, mask, old_values=bad, clip_eps=0.2)
    pattern = r"^old_values must have shape \(2, 3\) \(no broadcasting\), got \(2,\)$"
    with pytest.raises(ValueError, match=pattern):
        value_loss(values, values, mask, old_values=values[:, 0], clip_eps=0.2)


def test_logits_checks_and_their_smallest_legal_inputs():
    """A single distribution ([V], ndim 1) and chunks of one element are legal; integer logits,
    empty vocabularies and mis-shaped tokens are rejected by name."""
    logits = torch.tensor([0.0, math.log(3.0)], dtype=F64)  # p = (1/4, 3/4)
    exact = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert float(token_entropy(logits)) == pytest.approx(exact, rel=1e-15)
    assert float(token_entropy(logits.reshape(1, 2), chunk_elements=1)[0]) == pytest.approx(exact, rel=1e-15)
    with pytest.raises(TypeError, match=r"^logits must be a floating-point torch.Tensor$"):
        token_entropy(torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"^tokens must be an integer torch.Tensor$"):
        token_logprobs(torch.zeros(2, 3), torch.zeros(2))
    with pytest.raises(ValueError, match=r"^tokens must have shape \(2,\) \(logits without V\), got \(3,\)$"):
        token_logprobs(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long))


def test_value_loss_metrics_and_normalizer():
    """values (0.5, -1) and 2 against returns +1 each: squared errors 0.25, 4, 1 (md eq. (22))."""
    mask, values = _value_batch()
    returns = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=F64)
    loss, metrics = value_loss(values, returns, mask)
    assert float(loss) == pytest.approx((0.25 + 4.0 + 1.0) / 3, rel=1e-15)
    assert float(metrics["value_error"]) == pytest.approx((0.25 + 4.0 + 1.0) / 3, rel=1e-15)
    assert float(metrics["value_mean"]) == pytest.approx((0.5 - 1.0 + 2.0) / 3, rel=1e-15)
    assert float(value_loss(values, returns, mask, normalizer=7.0)[0]) == pytest.approx(5.25 / 7, rel=1e-15)
    pattern = r"^normalizer must be a positive number or a scalar tensor, got 0.0$"
    with pytest.raises(ValueError, match=pattern):
        value_loss(values, returns, mask, normalizer=0.0)


def test_preference_weights_errors_and_dpo_inputs_by_name():
    from refimpl.losses import dpo_loss

    z = torch.zeros(2, dtype=F64)
    with pytest.raises(TypeError, match=r"^weights must be a floating-point torch.Tensor$"):
        bradley_terry_loss(z, z, weights=torch.ones(2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^weights must be finite and >= 0$"):
        bradley_terry_loss(z, z, weights=torch.tensor([1.0, -0.5], dtype=F64))
    with pytest.raises(ValueError, match=r"^weights must have a positive sum$"):
        bradley_terry_loss(z, z, weights=torch.zeros(2, dtype=F64))
    bad = torch.tensor([0.0, math.nan], dtype=F64)
    with pytest.raises(ValueError, match=r"^ref_rejected_logps contains NaN or inf$"):
        dpo_loss(z, z, z, bad, beta=0.1)
    # implicit rewards beta log(pi / pi_ref): chosen (0.1 * 1, 0.1 * 3), rejected (0.1 * -2, 0.1 * 0)
    _, metrics = dpo_loss(torch.tensor([1.0, 3.0], dtype=F64), torch.tensor([-2.0, 0.0], dtype=F64), z, z,
                          beta=0.1)
    assert float(metrics["chosen_reward"]) == pytest.approx(0.2, rel=1e-15)
    assert float(metrics["rejected_reward"]) == pytest.approx(-0.1, rel=1e-15)

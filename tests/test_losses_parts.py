"""The smaller loss modules (refimpl/losses: kl_control, value, dpo, logprobs): every error names
its argument in full (anchored match), and the branches mutation testing found unobserved (the
normaliser passed through ppo_combined_loss, entropy over many chunks)."""

from __future__ import annotations

import dataclasses
import math
import re

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
      r"^kl must be a real number or a scalar tensor, got str$"),
     # the boundaries of each range check (0 and 1 are excluded) and each operand of the `or`
     (lambda: AdaptiveKLController(0.1, 0.0), ValueError, r"^target_kl must be > 0, got 0.0$"),
     (lambda: AdaptiveKLController(0.1, 0.01, factor=1.0), ValueError,
      r"^factor and band must be > 1, got factor=1.0, band=1.5$"),
     (lambda: AdaptiveKLController(0.1, 0.01, band=1), ValueError,
      r"^factor and band must be > 1, got factor=2.0, band=1.0$"),
     (lambda: AdaptiveKLController(0.1, 0.01).update(-0.5), ValueError, r"^kl must be >= 0, got -0.5$"),
     (lambda: DualAscentKLController(0.0, 0.01, 0.1).update(None), TypeError,
      r"^kl must be a real number or a scalar tensor, got NoneType$")],
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
    assert float(pi) == pytest.approx(-0.1, rel=1e-15, abs=0.0)
    assert float(metrics["value_loss"]) == pytest.approx(3 * 1.0 / 10, rel=1e-15, abs=0.0)
    assert float(metrics["entropy_loss"]) == pytest.approx(-6.0 / 10, rel=1e-15, abs=0.0)
    assert float(loss) == pytest.approx(-0.1 + 0.5 * 0.3 - 0.25 * 0.6, rel=1e-14, abs=0.0)


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
    assert float(token_entropy(logits)) == pytest.approx(exact, rel=1e-15, abs=0.0)
    assert float(token_entropy(logits.reshape(1, 2), chunk_elements=1)[0]) == pytest.approx(
        exact, rel=1e-15, abs=0.0
    )
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
    assert float(loss) == pytest.approx((0.25 + 4.0 + 1.0) / 3, rel=1e-15, abs=0.0)
    assert float(metrics["value_error"]) == pytest.approx((0.25 + 4.0 + 1.0) / 3, rel=1e-15, abs=0.0)
    assert float(metrics["value_mean"]) == pytest.approx((0.5 - 1.0 + 2.0) / 3, rel=1e-15, abs=0.0)
    assert float(value_loss(values, returns, mask, normalizer=7.0)[0]) == pytest.approx(
        5.25 / 7, rel=1e-15, abs=0.0
    )
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
    assert float(metrics["chosen_reward"]) == pytest.approx(0.2, rel=1e-15, abs=0.0)
    assert float(metrics["rejected_reward"]) == pytest.approx(-0.1, rel=1e-15, abs=0.0)


@pytest.mark.parametrize("position", range(4))
def test_dpo_errors_name_each_input(position):
    from refimpl.losses import dpo_loss

    names = ["policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps"]
    z = torch.zeros(2, dtype=F64)
    args = [z] * 4
    args[position] = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(TypeError, match=rf"^{names[position]} must be a floating-point torch.Tensor$"):
        dpo_loss(*args, beta=0.1)
    if position:  # the first tensor sets the device: the meta device exists on every build
        args[position] = torch.zeros(2, dtype=F64, device="meta")
        with pytest.raises(ValueError, match=rf"^{names[position]} must be on cpu, got meta$"):
            dpo_loss(*args, beta=0.1)


@pytest.mark.parametrize("beta", [True, "0.1", math.inf, math.nan, 0, -1.0])
def test_dpo_beta_must_be_a_finite_positive_number(beta):
    z = torch.zeros(2, dtype=F64)
    from refimpl.losses import dpo_loss

    with pytest.raises(ValueError, match=rf"^beta must be a finite number > 0, got {re.escape(repr(beta))}$"):
        dpo_loss(z, z, z, z, beta=beta)


def test_preference_weights_shape_and_device_are_checked():
    from refimpl.losses import dpo_loss

    z = torch.zeros(2, dtype=F64)
    with pytest.raises(ValueError, match=r"^weights must have shape \(2,\) on cpu, got \(3,\) on cpu$"):
        bradley_terry_loss(z, z, weights=torch.ones(3, dtype=F64))
    with pytest.raises(ValueError, match=r"^weights must have shape \(2,\) on cpu, got \(2,\) on meta$"):
        bradley_terry_loss(z, z, weights=torch.ones(2, dtype=F64, device="meta"))
    with pytest.raises(ValueError, match=r"^weights must be finite and >= 0$"):
        dpo_loss(z, z, z, z, beta=0.1, weights=torch.tensor([1.0, -0.5], dtype=F64))


def test_preference_weights_apply_to_the_loss_and_every_metric():
    """Weights (1, 3) on two pairs: every reported mean is sum(w x) / 4 (dyadic values: exact)."""
    from refimpl.losses import dpo_loss

    w = torch.tensor([1.0, 3.0], dtype=F64)
    rc, rr = torch.tensor([2.0, -1.0], dtype=F64), torch.tensor([1.0, 1.0], dtype=F64)
    _, metrics = bradley_terry_loss(rc, rr, weights=w)
    assert float(metrics["reward_margin"]) == (1.0 * 1 + 3 * -2.0) / 4
    assert float(metrics["reward_accuracy"]) == 0.25
    # beta 0.5: chosen rewards 0.5 * (1, 3), rejected 0.5 * (-2, 2), margins (1.5, 0.5)
    z = torch.zeros(2, dtype=F64)
    loss, metrics = dpo_loss(torch.tensor([1.0, 3.0], dtype=F64), torch.tensor([-2.0, 2.0], dtype=F64), z, z,
                             beta=0.5, weights=w)
    assert float(metrics["chosen_reward"]) == (0.5 + 3 * 1.5) / 4
    assert float(metrics["rejected_reward"]) == (-1.0 + 3 * 1.0) / 4
    assert float(metrics["reward_margin"]) == (1.5 + 3 * 0.5) / 4
    assert float(metrics["reward_accuracy"]) == 1.0
    expected = (math.log1p(math.exp(-1.5)) + 3 * math.log1p(math.exp(-0.5))) / 4
    # a few float64 roundings (eps = 2.2e-16)
    assert float(loss) == pytest.approx(expected, rel=1e-15, abs=0.0)


def test_preference_loss_dtype_ignores_the_weights_dtype():
    """The loss is in promote_types(input dtype, float32); float64 weights do not widen it."""
    r = torch.tensor([0.5, -0.25], dtype=torch.float32)
    loss, metrics = bradley_terry_loss(r, -r, weights=torch.tensor([1.0, 2.0], dtype=F64))
    assert loss.dtype == torch.float32 and metrics["reward_margin"].dtype == torch.float32


def test_logits_and_tokens_errors_in_full():
    with pytest.raises(ValueError, match=r"^logits must be \[\.\.\., V\] with V >= 1, got shape \(\)$"):
        token_entropy(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"^logits must be \[\.\.\., V\] with V >= 1, got shape \(2, 0\)$"):
        token_logprobs(torch.zeros(2, 0), torch.zeros(2, dtype=torch.long))
    pattern = r"^tokens must have shape \(2, 3\) \(logits without V\), got \(2, 4\)$"
    with pytest.raises(ValueError, match=pattern):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^tokens must be on the device of logits \(cpu\), got meta$"):
        token_logprobs(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long, device="meta"))
    bad = torch.zeros(2, 3)
    bad[1, 2] = math.nan
    message = r"^logits contains NaN or \+inf \(or a row that is all -inf\)$"
    with pytest.raises(ValueError, match=message):
        token_logprobs(bad, torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=message):
        token_entropy(bad)
    for elements in (True, 0, 2.0):
        with pytest.raises(ValueError, match=rf"^chunk_elements must be a positive int, got {elements!r}$"):
            token_logprobs(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), chunk_elements=elements)


@pytest.mark.parametrize("vocab", [1, 2, 3, 7])
@pytest.mark.parametrize("chunk_elements", [1, 2, 5, 6, 7, 1 << 22])
def test_rows_per_chunk_bounds_the_working_chunk(vocab, chunk_elements):
    """The chunk holds at most chunk_elements elements (one row when a row alone exceeds it), and one
    more row would exceed it (the default, from the device and a memory bound:
    tests/test_logprobs_chunks.py)."""
    from refimpl.losses.logprobs import _rows_per_chunk

    elements = chunk_elements
    rows = _rows_per_chunk(vocab, chunk_elements)
    assert rows >= 1 and (rows == 1 or rows * vocab <= elements)
    assert (rows + 1) * vocab > elements


def test_forward_allocates_on_the_device_of_logits():
    """The meta device exists on every build: results (and the saved logsumexp) follow the logits."""
    meta = torch.zeros(2, 3, device="meta")
    out = token_entropy(meta, check_finite=False)
    assert out.device.type == "meta" and out.shape == (2,)
    empty = torch.zeros(0, 3, device="meta")
    out = token_logprobs(empty, torch.zeros(0, dtype=torch.long, device="meta"))
    assert out.device.type == "meta" and out.shape == (0,)


def test_value_and_entropy_type_and_name_errors_in_full():
    mask, values = _value_batch()
    with pytest.raises(TypeError, match=r"^values must be a torch.Tensor, got list$"):
        value_loss([[0.0] * 3] * 2, values, mask)
    with pytest.raises(TypeError, match=r"^values must be a floating-point tensor, got dtype torch.int64$"):
        value_loss(values.long(), values, mask)
    bad = values.clone()
    bad[1, 0] = math.inf
    with pytest.raises(ValueError, match=r"^values contains NaN or inf at unmasked positions$"):
        value_loss(bad, values, mask)
    with pytest.raises(ValueError, match=r"^returns must be on device cpu, got meta$"):
        value_loss(values, values.to("meta"), mask)
    with pytest.raises(ValueError, match=r"^clip_eps must be a positive number, got True$"):
        value_loss(values, values, mask, old_values=values, clip_eps=True)
    with pytest.raises(TypeError, match=r"^entropy must be a torch.Tensor, got list$"):
        entropy_bonus_loss([[0.0] * 3] * 2, mask)
    with pytest.raises(TypeError, match=r"^entropy must be a floating-point tensor, got dtype torch.int64$"):
        entropy_bonus_loss(values.long(), mask)
    for normalizer in (True, 0.0, -1.0, "2"):
        with pytest.raises(ValueError, match=rf"^normalizer must be a positive number or a scalar tensor, "
                                             rf"got {re.escape(repr(normalizer))}$"):
            entropy_bonus_loss(values, mask, normalizer=normalizer)


def test_value_loss_of_a_single_sample_and_normalizers_below_one_or_tensors():
    """One unmasked sample: the mean is that sample's squared error (the count is 1, not clamped
    higher); a normaliser may be any positive number, also below 1, or a scalar tensor."""
    mask = torch.tensor([[False, True, False]])
    values = torch.tensor([[9.0, 0.5, 9.0]], dtype=F64)
    returns = torch.tensor([[0.0, 2.0, 0.0]], dtype=F64)
    loss, metrics = value_loss(values, returns, mask)
    assert float(loss) == 2.25 and float(metrics["value_error"]) == 2.25
    assert float(metrics["value_mean"]) == 0.5
    old = torch.tensor([[0.0, 0.0, 0.0]], dtype=F64)
    # clipped: old + clip(0.5, -0.25, 0.25) = 0.25 -> (0.25 - 2)^2 = 3.0625 > 2.25: the clipped branch
    loss, metrics = value_loss(values, returns, mask, old_values=old, clip_eps=0.25)
    assert float(loss) == 3.0625 and float(metrics["value_clip_fraction"]) == 1.0
    assert float(value_loss(values, returns, mask, normalizer=0.5)[0]) == 4.5
    assert float(entropy_bonus_loss(values, mask, normalizer=0.25)[0]) == -2.0
    loss = value_loss(values, returns, mask, normalizer=torch.tensor(4.0, dtype=F64))[0]
    assert float(loss) == 2.25 / 4


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
def test_value_and_entropy_losses_are_computed_in_at_least_float32(low):
    """The loss dtype is promote_types(values.dtype, float32) whatever the dtypes of returns,
    old_values and a tensor normaliser (md section 10; docstrings)."""
    mask = torch.tensor([[True, True, False]])
    values = torch.tensor([[0.5, -1.0, 3.0]], dtype=low)
    wide = torch.tensor([[1.0, 1.0 + 2.0**-40, 0.0]], dtype=F64)  # 2^-40 is lost in float32
    loss, metrics = value_loss(values, wide, mask, old_values=wide, clip_eps=0.5,
                               normalizer=torch.tensor(2.0, dtype=F64))
    assert loss.dtype == torch.float32 and all(m.dtype == torch.float32 for m in metrics.values())
    # values 0.5, -1 against float32(returns) 1, 1: errors 0.25 and 4; the clipped values old + clip(v - old,
    # -0.5, 0.5) = 0.5, 0.5 give 0.25 and 0.25; the larger of each pair, over the normaliser 2
    assert float(loss) == (0.25 + 4.0) / 2
    ent_loss, ent = entropy_bonus_loss(values, mask)
    assert ent_loss.dtype == torch.float32 and float(ent_loss) == 0.25


def _combined_batch():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    logp = torch.tensor([[-1.0, -0.5, 0.0], [-2.0, 0.0, 0.0]], dtype=F64)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    values = torch.tensor([[0.5, -1.0, 0.0], [2.0, 0.0, 0.0]], dtype=F64)
    entropy = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]], dtype=F64)
    return mask, logp, adv, values, entropy


def test_ppo_combined_loss_passes_the_value_clip_and_checks_its_arguments():
    mask, logp, adv, values, entropy = _combined_batch()
    returns, old = values + 1.0, values - 1.0
    _, metrics = ppo_combined_loss(logp, logp, adv, values, returns, entropy, mask, value_coef=0.5,
                                   entropy_coef=0.0, old_values=old, value_clip_eps=0.5)
    clipped, _ = value_loss(values, returns, mask, old_values=old, clip_eps=0.5)
    # old + clip(1, -0.5, 0.5) = values - 0.5: squared error 2.25 > 1 on every sample
    assert float(metrics["value_loss"]) == float(clipped) == 2.25
    args = (logp, logp, adv, values, returns, entropy, mask)
    with pytest.raises(TypeError, match=r"^variant must be a PolicyLossVariant, got str$"):
        ppo_combined_loss(*args, value_coef=0.5, entropy_coef=0.0, variant="ppo")
    pattern = (r"^variant must have aggregation='token_mean', entropy_coef=0 and kl_coef=0 "
               r"\(Schulman et al\. 2017, eq\. \(9\)\), got PolicyLossVariant\(")
    for change in ({"kl_coef": 0.1}, {"entropy_coef": 0.1}, {"aggregation": "seq_mean"}):
        with pytest.raises(ValueError, match=pattern):
            ppo_combined_loss(*args, value_coef=0.5, entropy_coef=0.0,
                              variant=dataclasses.replace(PPO, **change))
    for name in ("value_coef", "entropy_coef"):
        coefs = {"value_coef": 0.5, "entropy_coef": 0.0, name: True}
        with pytest.raises(ValueError, match=rf"^{name} must be a number >= 0, got True$"):
            ppo_combined_loss(*args, **coefs)

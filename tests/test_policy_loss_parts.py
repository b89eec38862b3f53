"""Each part of the policy-loss family on its own, against hand-derived closed forms of
specs/policy_losses.md: the entropy bonus without a KL term, the clip gate without a lower bound,
CISPO without an upper bound or at the sequence level, numeric 0/1 masks, and the exact wording of
every error (the contract: one line naming the argument; anchored so that a changed message fails).

Inputs are binary fractions and log-ratios whose exp is computed once, so the expected values
carry at most a few roundings: tolerances are 8 u (u = 2^-53) relative, stated per test.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from refimpl.losses import CISPO, GRPO, PPO, loss_normalizer, policy_loss

F64 = torch.float64
REL = 8 * 2.0**-53  # a few roundings of float64 (exp, products, one sum)


def _run(v, logp, old, adv, mask, **extras):
    x = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(x, old, adv, mask, v, **extras)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad, metrics


# ---------------------------------------------------------------------------------------------
# entropy bonus without KL (md eq. (12): loss = -surrogate + kl_coef KL - entropy_coef H)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean"])
def test_entropy_bonus_without_kl_is_subtracted(aggregation):
    """kl_coef = 0, entropy_coef = 0.25, ratio 1 everywhere (logp = old_logp), A = 0: the policy
    term is 0 and the loss is exactly -0.25 times the aggregated entropy; its gradient w.r.t. the
    entropy is -0.25 times the aggregation weights. A flipped sign, or a bonus dropped when no KL
    is present, changes both."""
    v = dataclasses.replace(PPO, aggregation=aggregation, entropy_coef=0.25)
    logp = torch.full((2, 3), -1.0, dtype=F64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    entropy = torch.tensor([[1.0, 2.0, 99.0], [0.5, 0.5, 2.0]], dtype=F64, requires_grad=True)
    loss, _ = policy_loss(logp, logp, torch.zeros(2, dtype=F64), mask, v, entropy=entropy)
    (grad,) = torch.autograd.grad(loss, entropy)
    weights = {  # d aggregate / d H[i, t]
        "token_mean": torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=F64) / 5,
        "seq_mean_token_mean": torch.tensor([[1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3]], dtype=F64) / 2,
        "seq_mean": torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=F64) / 2,
    }[aggregation]
    h = entropy.detach() * mask
    assert float(loss) == pytest.approx(-0.25 * float((weights * h).sum()), rel=REL, abs=0.0)
    assert torch.allclose(grad, -0.25 * weights, rtol=REL, atol=0)


def test_entropy_bonus_adds_to_the_policy_term():
    """With a non-zero surrogate: loss = -(r A) mean - 0.25 H mean (token_mean, one row)."""
    v = dataclasses.replace(PPO, entropy_coef=0.25)
    logp = torch.tensor([[math.log(1.125), 0.0]], dtype=F64)
    old = torch.zeros(1, 2, dtype=F64)
    entropy = torch.tensor([[2.0, 4.0]], dtype=F64)
    ones = torch.ones(1, 2, dtype=torch.bool)
    loss, grad, metrics = _run(v, logp, old, torch.tensor([1.0], dtype=F64), ones, entropy=entropy)
    assert float(loss) == pytest.approx(-(1.125 + 1.0) / 2 - 0.25 * 3.0, rel=REL, abs=0.0)
    assert torch.allclose(grad, torch.tensor([[-1.125 / 2, -0.5]], dtype=F64), rtol=REL, atol=0)
    assert float(metrics["entropy"]) == 3.0 and "kl" not in metrics


# ---------------------------------------------------------------------------------------------
# clip gate without a lower bound (md eq. (6): None removes that side)


@pytest.mark.parametrize("dual_clip", [None, 4.0])
def test_clip_gate_without_a_lower_bound_keeps_small_ratios_for_negative_advantages(dual_clip):
    """eps_low = None: for A <= 0 the gate stays open at any r <= c (r A, gradient r A); A > 0 is
    still clipped at 1 + eps_high. Ratios 1/8, 1/2, 2 and 8 with A = -1, and 2 with A = +1."""
    v = dataclasses.replace(PPO, eps_low=None, eps_high=0.25, dual_clip=dual_clip)
    ratios = [0.125, 0.5, 2.0, 8.0, 2.0]
    logp = torch.tensor([[math.log(r) for r in ratios]], dtype=F64)
    adv = torch.tensor([[-1.0, -1.0, -1.0, -1.0, 1.0]], dtype=F64)
    loss, grad, metrics = _run(v, logp, torch.zeros(1, 5, dtype=F64), adv, torch.ones(1, 5, dtype=torch.bool))
    c = math.inf if dual_clip is None else dual_clip
    terms = [-0.125, -0.5, -2.0, -min(8.0, c), 1.25]
    open_ = [True, True, True, 8.0 <= c, False]
    assert float(loss) == pytest.approx(-sum(terms) / 5, rel=REL, abs=0.0)
    expected = [-(r * a) / 5 if o else 0.0 for r, a, o in zip(ratios, adv[0].tolist(), open_, strict=True)]
    assert torch.allclose(grad, torch.tensor([expected], dtype=F64), rtol=REL, atol=0)
    assert float(metrics["clip_fraction"]) == pytest.approx(open_.count(False) / 5, rel=REL, abs=0.0)


def test_clip_gate_without_an_upper_bound_keeps_large_ratios_for_positive_advantages():
    """eps_high = None: A > 0 is never clipped (r A at r = 8); A < 0 is clipped below 1 - eps_low."""
    v = dataclasses.replace(PPO, eps_low=0.25, eps_high=None)
    logp = torch.tensor([[math.log(8.0), math.log(0.5)]], dtype=F64)
    adv = torch.tensor([[1.0, -1.0]], dtype=F64)
    loss, grad, _ = _run(v, logp, torch.zeros(1, 2, dtype=F64), adv, torch.ones(1, 2, dtype=torch.bool))
    assert float(loss) == pytest.approx(-(8.0 - 0.75) / 2, rel=REL, abs=0.0)
    assert torch.allclose(grad, torch.tensor([[-4.0, 0.0]], dtype=F64), rtol=REL, atol=0)


# ---------------------------------------------------------------------------------------------
# CISPO variants (md eq. (9): sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp)


@pytest.mark.parametrize(("eps_low", "eps_high", "weights"),
                         [(None, None, [0.5, 4.0]), (0.25, None, [0.75, 4.0]), (None, 0.25, [0.5, 1.25]),
                          (0.25, 0.25, [0.75, 1.25])])
def test_cispo_weight_is_the_ratio_clipped_on_the_given_sides(eps_low, eps_high, weights):
    """r = 1/2 and 4 with A = 1: the weight is r clipped only on the sides that are given, the loss
    -sum(w A logp) / 2 and the gradient -w A / 2 (the weight is detached)."""
    v = dataclasses.replace(CISPO, eps_low=eps_low, eps_high=eps_high)
    old = torch.tensor([[-2.0, -3.0]], dtype=F64)
    logp = old + torch.tensor([[math.log(0.5), math.log(4.0)]], dtype=F64)
    adv = torch.tensor([1.0], dtype=F64)
    loss, grad, _ = _run(v, logp, old, adv, torch.ones(1, 2, dtype=torch.bool))
    w = torch.tensor([weights], dtype=F64)
    assert float(loss) == pytest.approx(float(-(w * logp).sum() / 2), rel=REL, abs=0.0)
    assert torch.allclose(grad, -w / 2, rtol=REL, atol=0)


def test_cispo_at_the_sequence_level_uses_the_sequence_ratio_and_mean_logp():
    """ratio='sequence_mean': one unit per sequence with s = exp(mean log r) and unit log-prob
    mean(logp); loss = -(1/N) sum_i sg(clip(s_i)) A_i mean(logp_i); each token of row i gets
    -clip(s_i) A_i / (n_i N)."""
    v = dataclasses.replace(CISPO, ratio="sequence_mean", aggregation="seq_mean", eps_low=None, eps_high=0.25)
    old = torch.tensor([[-1.0, -2.0], [-0.5, -0.25]], dtype=F64)
    log_r = torch.tensor([[math.log(4.0), math.log(4.0)], [math.log(0.5), 0.0]], dtype=F64)
    mask = torch.tensor([[True, True], [True, False]])
    logp = old + log_r
    adv = torch.tensor([2.0, -1.0], dtype=F64)
    loss, grad, metrics = _run(v, logp, old, adv, mask)
    s = [4.0, 0.5]  # exp(mean log r) of each row
    w = [min(x, 1.25) for x in s]
    mean_logp = [float(logp[0].mean()), float(logp[1, 0])]
    objective = w[0] * 2.0 * mean_logp[0] + w[1] * -1.0 * mean_logp[1]
    assert float(loss) == pytest.approx(-objective / 2, rel=REL, abs=0.0)
    expected = torch.tensor([[-w[0] * 2.0 / 4, -w[0] * 2.0 / 4], [-w[1] * -1.0 / 2, 0.0]], dtype=F64)
    assert torch.allclose(grad, expected, rtol=REL, atol=0)
    assert float(metrics["ratio_mean"]) == pytest.approx(sum(s) / 2, rel=REL, abs=0.0)


# ---------------------------------------------------------------------------------------------
# numeric 0/1 masks (docs/architecture.md: mask [N, T] bool or 0/1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int64, torch.uint8])
@pytest.mark.parametrize("variant", [PPO, GRPO, dataclasses.replace(GRPO, ratio="sequence_mean")],
                         ids=["ppo", "grpo", "gspo_like"])
def test_numeric_zero_one_masks_equal_bool_masks(dtype, variant):
    g = torch.Generator().manual_seed(7)
    logp = -torch.rand(3, 4, generator=g, dtype=F64)
    old = logp + 0.1 * torch.randn(3, 4, generator=g, dtype=F64)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    padded_logp = torch.where(mask, logp, float("nan"))
    want = _run(variant, padded_logp, old, adv, mask)
    got = _run(variant, padded_logp, old, adv, mask.to(dtype))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert float(loss_normalizer(mask.to(dtype), variant)) == float(loss_normalizer(mask, variant))


def test_masks_other_than_zero_one_are_rejected():
    logp = torch.zeros(1, 2, dtype=F64)
    adv = torch.zeros(1, dtype=F64)
    with pytest.raises(ValueError, match=r"^mask must contain only 0 and 1$"):
        policy_loss(logp, logp, adv, torch.tensor([[1.0, 0.5]]), PPO)
    with pytest.raises(ValueError, match=r"^mask must contain only 0 and 1$"):
        loss_normalizer(torch.tensor([[2, 0]]), PPO)
    with pytest.raises(TypeError, match=r"^mask must be bool or real 0/1, got dtype torch.complex64$"):
        policy_loss(logp, logp, adv, torch.ones(1, 2, dtype=torch.complex64), PPO)


# ---------------------------------------------------------------------------------------------
# every error names its argument, in full (anchored: a changed message is a failure)


def _batch():
    logp = torch.zeros(2, 3, dtype=F64)
    return logp, logp.clone(), torch.zeros(2, dtype=F64), torch.ones(2, 3, dtype=torch.bool)


def test_error_messages_name_the_argument_exactly():
    logp, old, adv, mask = _batch()
    cases = [
        (lambda: loss_normalizer(torch.ones(3, dtype=torch.bool), PPO), ValueError,
         r"^mask must be a 2-D \[N, T\] tensor$"),
        (lambda: loss_normalizer(mask, "ppo"), TypeError, r"^variant must be a PolicyLossVariant, got str$"),
        (lambda: loss_normalizer([[True]], PPO), ValueError, r"^mask must be a 2-D \[N, T\] tensor$"),
        (lambda: policy_loss(logp, old, adv, mask, dataclasses.replace(GRPO, aggregation="seq_sum")),
         ValueError, r"^variant.max_length \(L_max\) is required by aggregation 'seq_sum' \(Dr. GRPO\); "
                     r"use dataclasses.replace\(variant, max_length=...\)$"),
        (lambda: policy_loss(logp, old, adv, mask, GRPO, ref_logp=logp, kl=logp), ValueError,
         r"^give either ref_logp \(KL via variant.kl_estimator\) or kl \(exact\), not both$"),
        (lambda: policy_loss(logp, old, adv, mask, PPO, normalizer=-1.0), ValueError,
         r"^normalizer must be finite and > 0$"),
        (lambda: policy_loss(logp, old, adv, mask, PPO, normalizer=torch.ones(2)), ValueError,
         r"^normalizer must be a scalar, got shape \(2,\)$"),
        (lambda: policy_loss(logp, old, adv, mask, PPO, normalizer=True), TypeError,
         r"^normalizer must be None, a positive number or a scalar tensor, got bool$"),
        (lambda: policy_loss(logp, old, adv, [[True] * 3] * 2, PPO), TypeError,
         r"^mask must be a torch.Tensor, got list$"),
        (lambda: policy_loss(logp, old, adv, mask[:, :2], PPO), ValueError,
         r"^mask must have shape \(2, 3\) like logp, got \(2, 2\)$"),
        (lambda: policy_loss(logp, old, adv, mask, PPO, entropy=logp.float()[:, :2]), ValueError,
         r"^entropy must have shape \(2, 3\) \(no broadcasting\), got \(2, 2\)$"),
        (lambda: policy_loss(logp, [0.0], adv, mask, PPO), TypeError,
         r"^old_logp must be a torch.Tensor, got list$"),
        (lambda: policy_loss(logp, old, adv.long(), mask, PPO), TypeError,
         r"^advantages must be a floating-point tensor, got dtype torch.int64$"),
        (lambda: policy_loss(logp, old, torch.zeros(3, dtype=F64), mask, PPO), ValueError,
         r"^advantages must have shape \(2,\) or \(2, 3\), got \(3,\)$"),
        (lambda: policy_loss(logp, old, adv, mask, PPO, behavior_logp=logp), ValueError,
         r"^behavior_logp must be given exactly when variant.behavior_correction != 'none' "
         r"\(got behavior_correction='none', behavior_logp given\)$"),
        (lambda: policy_loss(logp, old, adv, mask, dataclasses.replace(PPO, behavior_correction="mask")),
         ValueError, r"^behavior_logp must be given exactly when variant.behavior_correction != 'none' "
                     r"\(got behavior_correction='mask', behavior_logp missing\)$"),
    ]
    for call, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            call()


def test_non_finite_inputs_name_the_argument():
    logp, old, adv, mask = _batch()
    for name in ("logp", "old_logp", "advantages", "ref_logp", "entropy", "behavior_logp"):
        args = {"logp": logp.clone(), "old_logp": old.clone(), "advantages": adv.clone()}
        extras = {"ref_logp": logp.clone(), "entropy": logp.clone(), "behavior_logp": logp.clone()}
        target = args if name in args else extras
        target[name][0, ...] = math.inf if name != "advantages" else math.nan
        v = dataclasses.replace(GRPO, kl_coef=0.1, entropy_coef=0.1, behavior_correction="truncate")
        with pytest.raises(ValueError, match=rf"^{name} contains NaN or inf at unmasked positions$"):
            policy_loss(args["logp"], args["old_logp"], args["advantages"], mask, v, **extras)


def test_inputs_on_another_device_are_rejected_by_name():
    """No silent device mixing: every tensor must be on logp's device. Tensors on torch's 'meta'
    device stand in for another device on a CPU-only machine (the check compares devices)."""
    logp, old, adv, mask = _batch()
    meta = {"old_logp": old.to("meta"), "advantages": adv.to("meta"), "mask": mask.to("meta")}
    for name, other in meta.items():
        args = {"old_logp": old, "advantages": adv, "mask": mask, name: other}
        with pytest.raises(ValueError, match=rf"^{name} must be on device cpu, got meta$"):
            policy_loss(logp, args["old_logp"], args["advantages"], args["mask"], PPO)
    for name in ("ref_logp", "behavior_logp", "entropy", "kl"):
        v = dataclasses.replace(PPO, behavior_correction="truncate" if name == "behavior_logp" else "none")
        with pytest.raises(ValueError, match=rf"^{name} must be on device cpu, got meta$"):
            policy_loss(logp, old, adv, mask, v, **{name: logp.to("meta")})
    with pytest.raises(ValueError, match=r"^mask must be on device cpu, got meta$"):
        policy_loss(logp, old, adv, mask.float().to("meta"), PPO)


def test_loss_normalizer_is_a_float32_count():
    """md eq. (11): tokens, non-empty sequences, or sequences x L_max, as a float32 scalar."""
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 1]], dtype=torch.int64)
    expected = {"token_mean": 4.0, "seq_mean_token_mean": 2.0, "seq_mean": 2.0, "seq_sum": 14.0,
                "seq_mean_token_sum": 2.0}
    for aggregation, value in expected.items():
        v = dataclasses.replace(PPO, aggregation=aggregation, max_length=7)
        d = loss_normalizer(mask, v)
        assert d.dtype == torch.float32 and d.shape == () and float(d) == value


# ---------------------------------------------------------------------------------------------
# variant validation: the legal edge values pass, the illegal ones fail with the full message


def test_variant_accepts_its_edge_values():
    """Inclusive lower bounds are inclusive (eps 0, dual clip exactly 1 + eps_high, tau 1e-30,
    coefficients 0, max_length 1: a legal L_max, which seq_sum then requires of every sequence's
    length, tests/test_bad_inputs.py); exclusive ones are not tested here (see below)."""
    v = dataclasses.replace(PPO, eps_low=0.0, eps_high=0.0, dual_clip=1.0 + 0.0 + 1e-12, kl_coef=0.0,
                            entropy_coef=0.0, max_length=1, behavior_cap=1e-300)
    assert v.eps_low == 0.0 and v.max_length == 1
    assert dataclasses.replace(PPO, dual_clip=1.25, eps_high=0.25).dual_clip == 1.25  # c = 1 + eps_high
    assert dataclasses.replace(PPO, gate="sapo", tau_pos=1e-30, tau_neg=1e-30).tau_neg == 1e-30
    assert dataclasses.replace(PPO, eps_low=0.5, eps_high=None, dual_clip=1.5).dual_clip == 1.5


@pytest.mark.parametrize(
    ("fields", "error", "pattern"),
    [({"ratio": "tokens"}, ValueError,
      r"^variant.ratio must be one of \('token', 'sequence_mean', 'gspo_token', 'sequence_product'\), "
      r"got 'tokens'$"),
     ({"eps_low": True}, ValueError, r"^variant.eps_low must be a finite real number, got True$"),
     ({"eps_high": "0.2"}, ValueError, r"^variant.eps_high must be a finite real number, got '0.2'$"),
     ({"eps_low": 1.0}, ValueError, r"^variant.eps_low must be < 1 \(so 1 - eps_low > 0\), got 1.0$"),
     ({"eps_high": -0.5}, ValueError, r"^variant.eps_high must be >= 0.0, got -0.5$"),
     ({"dual_clip": 1.0, "eps_high": None}, ValueError, r"^variant.dual_clip must be > 1.0, got 1.0$"),
     ({"dual_clip": 1.1}, ValueError, r"^variant.dual_clip must be >= 1 \+ eps_high = 1.2, got 1.1$"),
     ({"gate": "cispo", "dual_clip": 3.0}, ValueError,
      r"^variant.dual_clip needs gate='clip', got gate='cispo'$"),
     ({"max_length": True}, ValueError, r"^variant.max_length must be a positive int or None, got True$"),
     ({"max_length": 2.0}, ValueError, r"^variant.max_length must be a positive int or None, got 2.0$"),
     ({"max_length": 0}, ValueError, r"^variant.max_length must be a positive int or None, got 0$"),
     ({"behavior_cap": 0.0}, ValueError, r"^variant.behavior_cap must be > 0.0, got 0.0$"),
     ({"kl_coef": -0.1}, ValueError, r"^variant.kl_coef must be >= 0.0, got -0.1$"),
     ({"kl_coef": None}, ValueError, r"^variant.kl_coef must be a finite real number, got None$"),
     ({"entropy_coef": None}, ValueError, r"^variant.entropy_coef must be a finite real number, got None$"),
     ({"tau_pos": None}, ValueError, r"^variant.tau_pos must be a finite real number, got None$"),
     ({"behavior_cap": None}, ValueError, r"^variant.behavior_cap must be a finite real number, got None$"),
     ({"entropy_coef": math.inf}, ValueError,
      r"^variant.entropy_coef must be a finite real number, got inf$")],
)
def test_variant_rejects_bad_fields_with_the_full_message(fields, error, pattern):
    with pytest.raises(error, match=pattern):
        dataclasses.replace(PPO, **fields)


def test_get_preset_rejects_a_non_string_name():
    from refimpl.losses import get_preset

    with pytest.raises(TypeError, match=r"^name must be a str, got int$"):
        get_preset(3)
    assert get_preset("  GSPO-Token ") is get_preset("gspo_token")


@pytest.mark.parametrize("ratio", ["sequence_mean", "gspo_token", "sequence_product"])
def test_approx_kl_metric_of_sequence_ratios_is_the_per_token_k3_mean(ratio):
    """approx_kl = mean over unmasked tokens of r - 1 - log r with the token's own log-ratio,
    whatever the ratio level (log r = log 2 and -log 2 here, 3 tokens: (1 - log 2 + log 2 - 1/2
    + 0) / 3)."""
    v = dataclasses.replace(GRPO, ratio=ratio, aggregation="seq_mean")
    old = torch.zeros(2, 2, dtype=F64)
    logp = torch.tensor([[math.log(2.0), -math.log(2.0)], [0.0, 5.0]], dtype=F64)
    mask = torch.tensor([[True, True], [True, False]])
    _, _, metrics = _run(v, logp, old, torch.tensor([1.0, -1.0], dtype=F64), mask)
    expected = ((2.0 - 1.0 - math.log(2.0)) + (0.5 - 1.0 + math.log(2.0)) + 0.0) / 3
    assert float(metrics["approx_kl"]) == pytest.approx(expected, rel=REL, abs=0.0)


def test_a_global_normalizer_below_one_and_its_dtype():
    """normalizer = 0.5 is legal (> 0): loss = sum / 0.5; a float64 normalizer tensor does not
    change the loss's dtype (float32 inputs give a float32 loss)."""
    logp = torch.tensor([[math.log(1.125), 0.0]], dtype=torch.float32)
    old, adv, mask = torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool)
    loss, metrics = policy_loss(logp, old, adv, mask, PPO, normalizer=0.5)
    assert float(loss) == pytest.approx(-(1.125 + 1.0) / 0.5, rel=4 * 2.0**-24, abs=0.0)
    loss64, metrics64 = policy_loss(logp, old, adv, mask, PPO, normalizer=torch.tensor(0.5, dtype=F64))
    assert loss64.dtype == torch.float32 and metrics64["normalizer"].dtype == torch.float32
    assert float(loss64) == float(loss)


# ---------------------------------------------------------------------------------------------
# metrics: approx_kl at tiny log-ratios, clip_fraction without a hard gate


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("ratio", ["token", "sequence_mean"])
def test_approx_kl_metric_keeps_its_digits_at_tiny_log_ratios(ratio, dtype):
    """approx_kl = mean of k3 = expm1(l) - l ~ l^2 / 2 (kl.md eq. (4)). At |l| ~ 1e-8 the form
    ``r - 1 - l`` with the rounded r = exp(l) loses every digit (r - 1 carries an error of u ~ 1e-16
    against l^2 / 2 ~ 5e-17), so the metric must use the cancellation-free k3. The exact value of
    each token's k3 is taken with mpmath at 50 digits from the exact binary inputs (logp = l,
    old_logp = 0, so the log-ratio carries no rounding); the metric adds two terms and divides
    by 2: 8 unit roundoffs of the dtype relative."""
    import mpmath

    logs = [1e-8, -3e-9] if dtype == F64 else [3e-4, -1e-4]
    logp = torch.tensor([logs], dtype=dtype)
    with mpmath.workdps(50):
        exact = sum(mpmath.expm1(mpmath.mpf(float(x))) - mpmath.mpf(float(x)) for x in logp[0]) / 2
    v = dataclasses.replace(GRPO, ratio=ratio, aggregation="token_mean" if ratio == "token" else "seq_mean")
    _, _, metrics = _run(v, logp, torch.zeros_like(logp), torch.tensor([1.0], dtype=dtype),
                         torch.ones(1, 2, dtype=torch.bool))
    eps = torch.finfo(dtype).eps / 2
    assert float(metrics["approx_kl"]) == pytest.approx(float(exact), rel=8 * eps, abs=0.0)


_UNGATED = [dataclasses.replace(GRPO, gate="none", eps_low=None, eps_high=None), CISPO,
            dataclasses.replace(GRPO, gate="sapo", eps_low=None, eps_high=None, tau_pos=1.0, tau_neg=1.05)]


@pytest.mark.parametrize("variant", _UNGATED, ids=["none", "cispo", "sapo"])
def test_clip_fraction_is_zero_without_a_hard_gate(variant):
    """Only gate='clip' (and 'log_clip') closes units: with no gate, CISPO's clipped weight or SAPO's
    soft gate the clip fraction is exactly 0, even with ratios far outside 1 +- eps."""
    logp = torch.tensor([[2.0, -2.0, 0.5]], dtype=F64)
    _, _, metrics = _run(variant, logp, torch.zeros_like(logp), torch.tensor([1.0], dtype=F64),
                         torch.ones(1, 3, dtype=torch.bool))
    assert float(metrics["clip_fraction"]) == 0.0


@pytest.mark.parametrize("field,choices", [
    ("ratio", "RATIO_LEVELS"), ("gate", "GATES"), ("aggregation", "AGGREGATIONS"),
    ("kl_estimator", "KL_ESTIMATORS"), ("kl_scale", "KL_SCALES"),
    ("behavior_correction", "BEHAVIOR_CORRECTIONS")])
def test_every_choice_field_is_named_with_its_choices_in_the_error(field, choices):
    """The contract's one-line error names the field (a mutated name in any _check_choice call fails)."""
    import re

    from refimpl.losses import policy as policy_module

    allowed = getattr(policy_module, choices)
    pattern = rf"^variant\.{field} must be one of {re.escape(repr(allowed))}, got 'bogus'$"
    with pytest.raises(ValueError, match=pattern):
        dataclasses.replace(PPO, **{field: "bogus"})


@pytest.mark.parametrize("adv", [1.5, -1.5])
def test_sapo_with_temperatures_other_than_one_against_its_closed_form(adv):
    """Gao et al. 2025 (policy_losses.md eq. (8)): f(r) A = 4 / tau sigmoid(tau (r - 1)) A, tau = tau_pos for
    A > 0 and
    tau_neg otherwise; d/dlogp = 4 A sigmoid' (tau (r - 1)) r. With tau_pos = 2 and tau_neg = 0.5 a
    swapped temperature, 4 tau for 4 / tau or one tau for both signs changes the value (every test
    before used tau_pos = 1, where 4 / tau = 4 tau). Reference: mpmath at 50 digits from the exact
    binary log-ratios (logp = +-0.25, old_logp = 0); token_mean over 2 tokens. The float64 chain is
    about 8 roundings plus exp's condition |log r| = 0.25: 16 u relative, no absolute slack."""
    import mpmath

    v = dataclasses.replace(PPO, gate="sapo", eps_low=None, eps_high=None, tau_pos=2.0, tau_neg=0.5)
    logp = torch.tensor([[0.25, -0.25]], dtype=F64)
    loss, grad, _ = _run(v, logp, torch.zeros_like(logp), torch.tensor([adv], dtype=F64),
                         torch.ones(1, 2, dtype=torch.bool))
    tau = mpmath.mpf(2.0 if adv > 0 else 0.5)
    with mpmath.workdps(50):
        rs = [mpmath.exp(mpmath.mpf(x)) for x in (0.25, -0.25)]
        s = [1 / (1 + mpmath.exp(-tau * (r - 1))) for r in rs]
        want_loss = -sum(4 / tau * si * adv for si in s) / 2
        want_grad = [-4 * si * (1 - si) * r * adv / 2 for si, r in zip(s, rs, strict=True)]
    u = 2.0**-53
    assert float(loss) == pytest.approx(float(want_loss), rel=16 * u, abs=0.0)
    for got, want in zip(grad[0].tolist(), want_grad, strict=True):
        assert got == pytest.approx(float(want), rel=16 * u, abs=0.0)


@pytest.mark.parametrize("rows", [1, 2])
def test_policy_objective_and_ratio_mean_average_over_sequence_units(rows):
    """At the sequence level the units are the non-empty rows: with one row the means divide by 1
    (a floor of 2 halves them), with two by 2 (a product instead of a quotient doubles them).
    Ungated sequence_mean ratio s_i = exp(mean_t log r_it), policy_objective = sum_i s_i A_i / rows,
    ratio_mean = 1 + sum_i (s_i - 1) / rows (md section 5); an empty third row counts for nothing.
    A few float64 roundings of exp and the sums: 8 u relative, no absolute slack."""
    v = dataclasses.replace(GRPO, ratio="sequence_mean", gate="none", eps_low=None, eps_high=None,
                            aggregation="seq_mean")
    logp = torch.tensor([[0.125, -0.0625], [0.25, 0.0], [0.0, 0.0]], dtype=F64)[[0, 1, 2][:rows] + [2]]
    mask = torch.tensor([[True, True], [True, False], [False, False]])[[0, 1, 2][:rows] + [2]]
    adv = torch.tensor([1.5, -0.5, 0.0], dtype=F64)[[0, 1, 2][:rows] + [2]]
    _, _, metrics = _run(v, logp, torch.zeros_like(logp), adv, mask)
    s = [math.exp((0.125 - 0.0625) / 2), math.exp(0.25)][:rows]
    objective = sum(si * a for si, a in zip(s, [1.5, -0.5], strict=False)) / rows
    assert float(metrics["policy_objective"]) == pytest.approx(objective, rel=REL, abs=0.0)
    assert float(metrics["ratio_mean"]) == pytest.approx(1 + sum(si - 1 for si in s) / rows, rel=REL, abs=0.0)

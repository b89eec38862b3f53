"""No silent non-finite values in policy_loss (issue 11; ARCHITECTURE.md "no silent NaN"):
regressions for the cases found, each against its exact value.

Exact values here are closed forms of md eqs. (6)-(9): a closed hard gate gives the bound times A,
a saturated SAPO gate gives 4 / tau * A, a zero advantage gives a zero term; the expected float is
the closed form rounded once to the dtype, and the implementation computes it with one rounding
too (the bound or 4 / tau is rounded to the dtype and multiplied by A = +-1 exactly), so the
comparisons are exact. Where the exact loss exceeds the dtype's range, a ValueError is the
documented answer.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from refimpl.losses import CISPO, GRPO, GSPO, GSPO_TOKEN, PPO, SAPO, PolicyLossVariant, policy_loss

DTYPES = (torch.float32, torch.float64)
# log-ratios just past the largest finite exp of the dtype (88.72 for float32, 709.78 for float64)
PAST_EXP_RANGE = {torch.float32: 100.0, torch.float64: 1000.0}


def _loss_and_grad(v: PolicyLossVariant, logp, old, adv, mask, **extras):
    x = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(x, old, adv, mask, v, **extras)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad, metrics


def _rounded(value: float, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pad", [0.0, math.nan, math.inf, -math.inf, 1e30])
def test_gspo_token_padded_row_past_exp_range_equals_the_unpadded_row(dtype, pad):
    """Issue 11: GSPO-token on a padded row at log-ratio past exp's range gave NaN (the padding's
    A = 0 times the row's overflowing ratio). A > 0 and s > 1 + eps_high: the gate is closed, the
    loss is -(1 + eps_high) A exactly and the gradient 0 (md eq. (6))."""
    x = PAST_EXP_RANGE[dtype]
    adv = torch.tensor([1.0], dtype=dtype)
    padded = _loss_and_grad(GSPO_TOKEN, torch.tensor([[x, pad]], dtype=dtype), torch.zeros(1, 2, dtype=dtype),
                            adv, torch.tensor([[True, False]]))
    unpadded = _loss_and_grad(GSPO_TOKEN, torch.tensor([[x]], dtype=dtype), torch.zeros(1, 1, dtype=dtype),
                              adv, torch.ones(1, 1, dtype=torch.bool))
    expected = -_rounded(1.0 + GSPO_TOKEN.eps_high, dtype)
    assert padded[0] == expected and unpadded[0] == expected
    assert torch.equal(padded[1], torch.zeros(1, 2, dtype=dtype))
    assert torch.equal(unpadded[1], torch.zeros(1, 1, dtype=dtype))
    assert not any(bool(torch.isnan(m)) for m in padded[2].values())


# (variant, exact loss): row 2 has A = 1 at r = 1, where clip / none give r A = 1 per unit, SAPO
# 4 / tau sigmoid(0) A = 2 and CISPO sg(r) A logp = -0.5 per token (md eqs. (6)-(10)).
ZERO_ADVANTAGE_CASES = {
    "ppo": (PPO, -2.0 / 4),  # token_mean over 4 tokens
    "gspo": (GSPO, -1.0 / 2),  # seq_mean over 2 sequences
    "gspo_token": (GSPO_TOKEN, -1.0 / 2),  # seq_mean_token_mean
    "no_gate": (dataclasses.replace(PPO, gate="none"), -2.0 / 4),
    "cispo_no_upper": (dataclasses.replace(CISPO, eps_high=None), 1.0 / 4),
    "sapo": (SAPO, -2.0 / 2),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(ZERO_ADVANTAGE_CASES))
def test_zero_advantage_at_an_overflowing_ratio_contributes_exactly_zero(dtype, name):
    """A = 0 (a zero-variance group) on tokens whose ratio overflows the dtype: the term is
    0 * r = 0 in value and gradient (md eqs. (6)-(9)), not 0 * inf = NaN."""
    variant, expected = ZERO_ADVANTAGE_CASES[name]
    x = PAST_EXP_RANGE[dtype]
    logp = torch.tensor([[x, x], [-0.5, -0.5]], dtype=dtype)
    old = torch.tensor([[0.0, 0.0], [-0.5, -0.5]], dtype=dtype)
    adv = torch.tensor([0.0, 1.0], dtype=dtype)
    loss, grad, metrics = _loss_and_grad(variant, logp, old, adv, torch.ones(2, 2, dtype=torch.bool))
    assert float(loss) == expected  # every step exact: products of +-1, 0.5 and divisions by 2, 4
    assert torch.equal(grad[0], torch.zeros(2, dtype=dtype))
    assert bool(torch.isfinite(grad).all())
    assert not any(bool(torch.isnan(m)) for m in metrics.values())


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_behaviour_weight_at_an_overflowing_ratio_contributes_exactly_zero(dtype):
    """md eq. (13): a behaviour weight above the cap is 0 under 'mask', so its token's term is
    0 * (r A) = 0 even where r overflows (it was 0 * inf = NaN)."""
    v = dataclasses.replace(PPO, gate="none", behavior_correction="mask", behavior_cap=2.0)
    x = PAST_EXP_RANGE[dtype]
    logp = torch.tensor([[x, 0.0]], dtype=dtype)
    old = torch.zeros(1, 2, dtype=dtype)
    behavior = torch.tensor([[-1.0, 0.0]], dtype=dtype)  # w = e > 2 (masked), then w = 1
    adv = torch.tensor([-1.0], dtype=dtype)
    loss, grad, _ = _loss_and_grad(v, logp, old, adv, torch.ones(1, 2, dtype=torch.bool),
                                   behavior_logp=behavior)
    assert float(loss) == 0.5  # -(0 + 1 * 1 * -1) / 2 tokens
    assert torch.equal(grad, torch.tensor([[0.0, 0.5]], dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_sapo_past_exp_range_has_the_saturated_value_and_zero_gradient(dtype, sign):
    """Issue 11: SAPO's gradient was NaN once exp(log r) overflowed (sigmoid' = 0 times inf).
    There the gate is saturated: f(r) A = 4 / tau * A exactly (sigmoid rounds to 1) and the exact
    gradient 4 A sigmoid (1 - sigmoid) r ~ 4 r exp(-tau (r - 1)) is below every subnormal, so 0."""
    tau = SAPO.tau_pos if sign > 0 else SAPO.tau_neg
    expected = -_rounded(4.0 / tau, dtype) * sign
    limit = math.log(torch.finfo(dtype).max)
    for x in (limit - 1.0, limit - 0.5, limit + 0.5, 89.0, 100.0, 710.0, 1000.0, 1e30):
        loss, grad, _ = _loss_and_grad(SAPO, torch.tensor([[x]], dtype=dtype), torch.zeros(1, 1, dtype=dtype),
                                       torch.tensor([sign], dtype=dtype), torch.ones(1, 1, dtype=torch.bool))
        assert loss == expected, x
        assert grad.abs().max() == 0.0, x


@pytest.mark.parametrize("dtype", DTYPES)
def test_sapo_gradient_is_finite_and_exact_across_the_whole_log_ratio_range(dtype):
    """d loss / d log r = -4 A sigmoid(z) (1 - sigmoid(z)) r, z = tau (r - 1) (md eq. (15)), from
    -1e3 to 1e3: evaluated in float64 with sigmoid(z) (1 - sigmoid(z)) = exp(-|z|) / (1 +
    exp(-|z|))^2 (no cancellation), it is the reference; float32 agrees to a few units of its
    roundoff times the conditioning |log r| of exp (the log-ratio itself is exact here), and
    absolutely to u * r A for sigmoid's 1 - sigmoid, whose absolute error is u (sigmoid ~ 1)."""
    u = torch.finfo(dtype).eps / 2
    xs = [s * m for m in (0.0, 1e-3, 0.5, 2.0, 4.0, 20.0, 88.0, 88.7, 89.0, 700.0, 709.0, 710.0, 1e3)
          for s in (1.0, -1.0)]
    for a in (1.0, -1.0):
        tau = SAPO.tau_pos if a > 0 else SAPO.tau_neg
        x = torch.tensor([xs], dtype=dtype)
        _, grad, _ = _loss_and_grad(SAPO, x, torch.zeros_like(x), torch.tensor([a], dtype=dtype),
                                    torch.ones_like(x, dtype=torch.bool))
        n = len(xs)
        for k, lr in enumerate(xs):
            r = math.exp(min(lr, 709.0))
            z = tau * math.expm1(min(lr, 709.0))
            e = math.exp(-abs(z))
            exact = -4.0 * a * e / (1.0 + e) ** 2 * r / n if z < 800 else 0.0
            # absolute errors: 1 - sigmoid has absolute error ~u where sigmoid ~ 1 (resolved only
            # while z < 40), and torch's expm1 backward forms exp(x) as expm1(x) + 1 (absolute
            # error ~u where r << 1); each times 4 |A| sigmoid (1 - sigmoid) <= |A| per token
            r_eff = max(min(r, 1.0 + 40.0 / tau), 1.0)
            tol = 8 * u * (1.0 + abs(lr)) * abs(exact) + 8 * u * r_eff / n
            assert math.isfinite(float(grad[0, k])), lr
            assert abs(float(grad[0, k]) - exact) <= tol, (lr, float(grad[0, k]), exact)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_loss_past_the_dtype_range_raises_a_clear_error(dtype):
    """A > 0 is clipped, but A < 0 keeps r A (md eq. (6), no dual clip): -r A = e^x exceeds the
    dtype's range, so no finite answer exists: ValueError naming the dtype and logp."""
    x = PAST_EXP_RANGE[dtype]
    for v in (PPO, GRPO, GSPO, GSPO_TOKEN):
        with pytest.raises(ValueError, match=f"loss overflows {dtype}.*logp"):
            policy_loss(torch.tensor([[x]], dtype=dtype), torch.zeros(1, 1, dtype=dtype),
                        torch.tensor([-1.0], dtype=dtype), torch.ones(1, 1, dtype=torch.bool), v)


def test_the_same_inputs_in_float64_give_the_exact_large_value():
    """x = 100: float32 overflows (above), float64 holds -r A = e^100 (one rounding of exp, one of
    the log-ratio: exact to a few ulps times |x| = 100)."""
    f64 = torch.float64
    loss, grad, _ = _loss_and_grad(PPO, torch.tensor([[100.0]], dtype=f64), torch.zeros(1, 1, dtype=f64),
                                   torch.tensor([-1.0], dtype=f64), torch.ones(1, 1, dtype=torch.bool))
    assert float(loss) == pytest.approx(math.exp(100.0), rel=4e-16)
    assert float(grad) == pytest.approx(math.exp(100.0), rel=4e-16)


@pytest.mark.parametrize("field", ["tau_pos", "tau_neg"])
def test_sapo_temperature_below_1e_30_is_rejected(field):
    """tau >= 1e-30 keeps SAPO's gate saturated before exp(log r) leaves float32's range."""
    with pytest.raises(ValueError, match=f"variant.{field} must be >= 1e-30"):
        dataclasses.replace(SAPO, **{field: 1e-31})
    dataclasses.replace(SAPO, **{field: 1e-30})

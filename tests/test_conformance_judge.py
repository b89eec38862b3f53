"""The kit's judge pinned (issue 31): ``refimpl.conformance.tolerance`` against the rule of
docs/conformance.md ("Tolerances") written out as plain loops, and the verdicts of ``judge_policy``
just inside and just outside each bound.

The half-precision bound (tolerance.py's docstring; policy_losses.md eqs. (2)-(12) for the terms):

    |got - expected| <= ((K + kappa) u + gamma_n(u_32)) S + u |expected|,  gamma_n(u) = n u / (1 - n u)

with ``K = 8``, ``kappa`` the largest |unit log-ratio| over the tokens (rows) that count, ``S`` the
loss of |terms| (each term |A| times the largest factor its gate can apply) and ``n`` the elements
plus rows. ``reference_half_tolerance`` below computes it token by token in Python floats; the kit's
vectorised version must agree to float64 rounding on every ratio level x gate x aggregation x KL x
compute dtype, with padding holding huge values, inf and NaN (padding may not move the bound).
A wrong result by 1.01x the bound must fail and by 0.99x must pass.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from refimpl.conformance.case_types import PolicyLossCase, clip_bounds
from refimpl.conformance.conventions import Convention
from refimpl.conformance.expected import convention_normalizer, effective_variant, expected_policy_loss
from refimpl.conformance.policy_check import judge_policy
from refimpl.conformance.tolerance import (
    DEFAULT_RTOL,
    ELEMENTWISE_ROUNDINGS,
    UNIT_ROUNDOFF,
    fixed_tolerances,
    half_tolerance,
    is_half,
    kl_gradient_slack,
    relative_error,
)
from refimpl.losses import PolicyLossVariant, get_preset

U32 = 2.0**-24
LOOSE, INPUT, F32 = Convention(), Convention(compute_dtype="input"), Convention(compute_dtype="float32")


# ---------------------------------------------------------------------------------------------
# relative_error and the fixed tolerances
# ---------------------------------------------------------------------------------------------


def t(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def test_relative_error_is_the_largest_difference_over_the_largest_expected_plus_the_floor():
    """Kills (issue 31) the denominator ``scale + floor`` changed to ``scale - floor``: against an
    expected value of 0 the error would turn negative and any wrong result pass."""
    # max |got - expected| = 5 (second entry), max |expected| = 4: 5 / (4 + 0.5)
    assert relative_error(t([3.0, 1.0]), t([2.0, -4.0]), 0.5) == 5.0 / 4.5
    # an expected value of 0 is compared on the floor alone: a wrong result is never "within" it
    assert relative_error(t(1e-3), t(0.0), 1e-3) == 1.0
    assert relative_error(t([0.0, -2e-3]), t([0.0, 0.0]), 1e-3) == 2.0
    # half-precision results are read in float64
    assert relative_error(t([1.5], torch.bfloat16), t([1.0]), 0.0) == 0.5


def test_relative_error_of_non_finite_and_mismatched_results():
    inf, nan = math.inf, math.nan
    assert relative_error(t([1.0, 2.0]), t([1.0]), 1.0) == math.inf  # shapes differ
    assert relative_error(t([[1.0]]), t([1.0]), 1.0) == math.inf
    assert relative_error(t([inf, 1.0]), t([inf, 1.0]), 1.0) == 0.0  # the same infinity
    assert relative_error(t([-inf, 1.0]), t([-inf, 1.0]), 1.0) == 0.0
    assert relative_error(t([nan, 1.0]), t([nan, 1.0]), 1.0) == 0.0  # NaN where NaN is expected
    assert relative_error(t([-inf, 1.0]), t([inf, 1.0]), 1.0) == math.inf  # the other infinity
    assert relative_error(t([nan, 1.0]), t([inf, 1.0]), 1.0) == math.inf
    assert relative_error(t([inf, 1.0]), t([2.0, 1.0]), 1.0) == math.inf  # inf where finite is expected
    assert relative_error(t([nan]), t([2.0]), 1.0) == math.inf
    assert relative_error(t([2.0, 1.0]), t([inf, 1.0]), 1.0) == math.inf  # finite where inf is expected
    # the scale is the largest finite expected value; the infinite entries (matched) do not count
    assert relative_error(t([inf, 1.5]), t([inf, 1.0]), 1.0) == 0.5 / 2.0
    assert relative_error(t([nan, 3.0]), t([nan, -1.0]), 0.25) == 4.0 / 1.25
    assert relative_error(t([]), t([]), 1.0) == 0.0  # nothing to compare


def test_the_unit_roundoffs_are_half_the_machine_epsilons():
    """Kills (issue 31) a halved fp16 (or any) unit roundoff, which no bound on the tested data
    was tight enough to notice."""
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        assert UNIT_ROUNDOFF[dtype] == torch.finfo(dtype).eps / 2
    assert ELEMENTWISE_ROUNDINGS == 8 and DEFAULT_RTOL == 1e-8


def test_fixed_tolerances_of_half_golden_vectors_and_full_precision():
    """Kills (issue 31) a halved bf16 (or fp16) gradient rtol ``HALF_GRAD_RTOL``."""
    # bf16 / fp16: value 1e-4, gradient the dtype's machine epsilon (2u), --rtol can only loosen them
    assert fixed_tolerances(torch.bfloat16, 1e-8) == (1e-4, 2.0**-7)
    assert fixed_tolerances(torch.float16, 1e-8) == (1e-4, 2.0**-10)
    assert fixed_tolerances(torch.float16, 0.5) == (0.5, 0.5)
    assert fixed_tolerances(torch.bfloat16, 3e-3) == (3e-3, 2.0**-7)
    assert fixed_tolerances(torch.float32, 3e-3) == (3e-3, 3e-3)
    assert fixed_tolerances(torch.float64, 1e-8) == (1e-8, 1e-8)
    assert is_half(torch.float16) and is_half(torch.bfloat16)
    assert not is_half(torch.float32) and not is_half(torch.float64)


# ---------------------------------------------------------------------------------------------
# the half-precision bound as loops
# ---------------------------------------------------------------------------------------------


def reference_magnitudes(case: PolicyLossCase, v: PolicyLossVariant, conv: Convention) -> dict:
    """S, the unnormalised sum, kappa, the largest ratio, the largest weighted KL term and the largest
    |logp| + |old_logp| (or + |ref_logp|), from the tokens (rows) that count, one at a time."""
    mask = case.mask.tolist()
    logp, old = case.logp.double().tolist(), case.old_logp.double().tolist()
    ref = None if case.ref_logp is None else case.ref_logp.double().tolist()
    adv = case.advantages.double().tolist()
    rows = len(mask)
    lengths = [sum(m) for m in mask]
    denominator = max(convention_normalizer(case.mask, v, conv), 1.0)
    lower, upper, dual = clip_bounds(v)

    def factor(ratio, unit_logp):
        if v.gate == "clip":
            return max(ratio, upper or 1.0, dual or 1.0, 1.0)
        if v.gate == "sapo":
            return 4.0 / min(v.tau_pos, v.tau_neg)
        if v.gate == "cispo":
            clipped = max(ratio, lower) if lower is not None else ratio
            return (min(clipped, upper) if upper is not None else clipped) * abs(unit_logp)
        return ratio

    def a(i, j):
        return abs(adv[i][j] if isinstance(adv[i], list) else adv[i])

    tokens = [(i, j) for i in range(rows) for j in range(len(mask[i])) if mask[i][j]]
    row_x = [sum(logp[i][j] - old[i][j] for j in range(len(mask[i])) if mask[i][j]) for i in range(rows)]
    s_abs = total = kappa = 0.0
    ratios, unit_ratio = [], {}
    if v.sequence_level:
        for i in (i for i in range(rows) if lengths[i]):
            x = row_x[i] / lengths[i] if v.ratio == "sequence_mean" else row_x[i]
            unit_logp = sum(logp[i][j] for j in range(len(mask[i])) if mask[i][j]) / lengths[i]
            term = abs(adv[i]) * factor(math.exp(x), unit_logp)
            weight = (lengths[i] if v.per_token_copies else 1.0) / denominator
            s_abs, total = s_abs + weight * term, total + term
            kappa = max(kappa, abs(x))
            ratios.append(math.exp(x))
            unit_ratio.update({(i, j): math.exp(x) for j in range(len(mask[i]))})
    else:
        for i, j in tokens:
            x = row_x[i] / lengths[i] if v.ratio == "gspo_token" else logp[i][j] - old[i][j]
            term = a(i, j) * factor(math.exp(x), logp[i][j])
            per_row = lengths[i] if v.aggregation == "seq_mean_token_mean" else 1.0
            s_abs, total = s_abs + term / per_row / denominator, total + term
            kappa = max(kappa, abs(x))
            ratios.append(math.exp(x))
            unit_ratio[(i, j)] = math.exp(x)
    kl_grad = 0.0
    inputs = [abs(logp[i][j]) + abs(old[i][j]) for i, j in tokens]
    if v.kl_coef > 0 and ref is not None:
        for i, j in tokens:
            log_r = ref[i][j] - logp[i][j]
            kl = {"k1": abs(log_r), "k2": log_r**2 / 2, "k3": math.exp(log_r) + abs(log_r) + 1.0}
            term = v.kl_coef * kl[v.kl_estimator] * (unit_ratio[(i, j)] if conv.kl_importance_weight else 1.0)
            per_row = lengths[i] if v.aggregation == "seq_mean_token_mean" else 1.0
            s_abs, total = s_abs + term / per_row / denominator, total + term
            kl_grad = max(kl_grad, term / per_row / denominator)
        inputs += [abs(logp[i][j]) + abs(ref[i][j]) for i, j in tokens]
    finite = [x for x in inputs if math.isfinite(x)]
    return {"S": s_abs, "sum": total, "kappa": kappa, "max_ratio": max(ratios, default=1.0),
            "kl_grad": kl_grad, "inputs": max(finite, default=0.0)}


def reference_half_tolerance(case, v, conv, expected_loss):
    """(value tolerance, gradient rtol, may overflow, KL gradient slack): tolerance.py's docstring."""
    m = reference_magnitudes(case, v, conv)
    dtype = case.logp.dtype
    u_in = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24,
            torch.float64: 2.0**-53}[dtype]
    u = u_in if conv.compute_dtype == "input" else U32
    u_grad = max(u_in, U32) if conv.compute_dtype == "float32" else u_in
    n = case.logp.shape[0] * case.logp.shape[1] + case.logp.shape[0]
    k = ELEMENTWISE_ROUNDINGS + m["kappa"]
    rounded64 = conv.compute_dtype == "float32" and dtype == torch.float64
    if rounded64:
        k += m["inputs"]
    value = (k * u + n * U32 / (1 - n * U32)) * m["S"] + u * abs(expected_loss)
    grad = (k + 2) * u_grad if conv.compute_dtype == "input" else 2 * u_grad + k * U32
    grad += m["inputs"] * U32 if rounded64 else 0.0
    fmax = torch.finfo(dtype).max
    overflow = conv.compute_dtype == "input" and (m["sum"] > fmax or m["max_ratio"] > fmax)
    slack = (ELEMENTWISE_ROUNDINGS + m["kappa"] + 2) * u * m["kl_grad"] if u != 2.0**-53 else 0.0
    return value, grad, overflow, slack if v.kl_coef > 0 and case.ref_logp is not None else 0.0


def padded_case(dtype, *, padding=1e4, per_token_adv=False, ref=False) -> PolicyLossCase:
    """Four rows of lengths 4, 2, 0, 1 (width 5) whose padding holds ``padding`` (huge, inf or NaN) in
    logp, old_logp and ref_logp; log-ratios up to |0.9375|, |ref_logp| > |old_logp|, exact in
    ``dtype``."""
    x = [[0.25, -0.5, 0.875, -0.125], [-0.9375, 0.375], [], [0.0625]]
    olds = [[-1.5, -0.25, -2.0, -0.75], [-3.0, -1.125], [], [-0.5]]
    logp = torch.full((4, 5), padding, dtype=torch.float64)
    old = torch.full((4, 5), -padding, dtype=torch.float64)
    ref_logp = torch.full((4, 5), padding, dtype=torch.float64)
    mask = torch.zeros((4, 5), dtype=torch.bool)
    for i, (xs, os) in enumerate(zip(x, olds, strict=True)):
        for j, (xv, ov) in enumerate(zip(xs, os, strict=True)):
            old[i, j], logp[i, j], ref_logp[i, j], mask[i, j] = ov, ov + xv, ov - 0.5 - xv / 2, True
    adv = torch.tensor([[0.75, -0.5, 1.25, 0.5, 9.0], [-1.5, 0.25, 9.0, 9.0, 9.0], [9.0] * 5,
                        [0.25, 9.0, 9.0, 9.0, 9.0]]
                       if per_token_adv else [0.75, -1.5, 0.5, 0.25], dtype=torch.float64)
    return PolicyLossCase("judge", 0, logp.to(dtype), old.to(dtype), adv.to(dtype), mask, adv,
                          torch.tensor([0, 0, 1, 1]), ref_logp.to(dtype) if ref else None, None, "")


VARIANTS = {
    "ppo_dual": dataclasses.replace(get_preset("ppo"), dual_clip=3.0),
    "dapo": get_preset("dapo"),
    "grpo": get_preset("grpo"),
    "dr_grpo": dataclasses.replace(get_preset("dr_grpo"), max_length=6),
    "gspo": get_preset("gspo"),
    "gspo_token_mean": dataclasses.replace(get_preset("gspo"), aggregation="token_mean"),
    "gspo_token": get_preset("gspo_token"),
    "product": PolicyLossVariant(ratio="sequence_product", gate="clip", eps_low=0.2, eps_high=0.3,
                                 aggregation="seq_mean"),
    "product_none": PolicyLossVariant(ratio="sequence_product", gate="none",
                                      aggregation="seq_mean_token_sum"),
    "sapo": get_preset("sapo"),
    "sapo_tau": dataclasses.replace(get_preset("sapo"), tau_pos=0.5, tau_neg=2.0),
    "cispo": get_preset("cispo"),
    "cispo_low": dataclasses.replace(get_preset("cispo"), eps_low=0.1, eps_high=None),
    "cispo_both": dataclasses.replace(get_preset("cispo"), eps_low=0.1),
    "cispo_sequence": dataclasses.replace(get_preset("cispo"), ratio="sequence_mean", aggregation="seq_mean"),
    "cispo_product": dataclasses.replace(get_preset("cispo"), ratio="sequence_product", eps_low=0.3,
                                         aggregation="token_mean"),
    "cispo_gspo_token": dataclasses.replace(get_preset("cispo"), ratio="gspo_token"),
    "none": PolicyLossVariant(gate="none", aggregation="seq_mean_token_mean"),
    "upper_only": PolicyLossVariant(eps_low=None, eps_high=0.5, aggregation="token_mean"),
    "lower_only": PolicyLossVariant(eps_low=0.5, eps_high=None, aggregation="token_mean"),
}
KL = {f"{name}_{k}": dataclasses.replace(VARIANTS[name], kl_coef=c, kl_estimator=k)
      for name, k, c in (("grpo", "k3", 0.04), ("dapo", "k1", 0.5), ("gspo", "k2", 0.25),
                         ("gspo_token", "k3", 0.125), ("cispo", "k2", 2.0), ("sapo", "k1", 0.3))}
CONVENTIONS = {"float32_min": LOOSE, "input": INPUT, "float32": F32,
               "importance": Convention(kl_importance_weight=True, compute_dtype="input")}


def _grid():
    for name, v in {**VARIANTS, **KL}.items():
        for conv_name, conv in CONVENTIONS.items():
            if conv_name == "importance" and (v.kl_coef == 0 or v.ratio not in ("token", "sequence_mean")):
                continue
            half = (torch.bfloat16, torch.float16)
            dtypes = (torch.float64, torch.bfloat16) if conv_name == "float32" else half
            for dtype in dtypes:
                yield pytest.param(v, conv, dtype, id=f"{name}-{conv_name}-{str(dtype)[6:]}")


@pytest.mark.parametrize(("variant", "conv", "dtype"), list(_grid()))
def test_the_half_bound_is_the_documented_rule_on_every_ratio_level_and_gate(variant, conv, dtype):
    """Every ratio level x gate x aggregation x KL estimator x compute dtype the family allows, on a
    batch with an empty row, a row of one token and padding holding 1e4 (its log-ratio 2e4 must not
    reach kappa); reference log-probs are given also without a KL term (they must not count).
    Kills (issue 31) the deleted ``unit_logp`` of a sequence-level ratio, which only a CISPO gate
    reads (``cispo_sequence``, ``cispo_product``)."""
    for case in (padded_case(dtype, ref=True),
                 padded_case(dtype, ref=True, per_token_adv=not variant.sequence_level)):
        expected_loss = -0.3125
        value, grad, overflow = half_tolerance(case, variant, conv, expected_loss)
        reference = reference_half_tolerance(case, variant, conv, expected_loss)
        ref_value, ref_grad, ref_overflow, ref_slack = reference
        # a sum in another order: float64 rounding of sums of < 100 positive terms (1e-13 relative)
        assert value == pytest.approx(ref_value, rel=1e-12, abs=0.0)
        assert grad == pytest.approx(ref_grad, rel=1e-12, abs=0.0)
        assert overflow is ref_overflow is False
        assert kl_gradient_slack(case, variant, conv) == pytest.approx(ref_slack, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("padding", [math.nan, math.inf, -math.inf, 6e4])
@pytest.mark.parametrize("name", ["gspo", "gspo_token", "dapo", "cispo_sequence"])
def test_padding_cannot_loosen_or_poison_the_half_bound(name, padding):
    """NaN / inf / huge values at masked positions leave the bound what it is with finite junk.
    Kills (issue 31) the mask dropped from kappa's ``torch.where(mask, logp - old, 0)``."""
    v = dataclasses.replace(VARIANTS[name], kl_coef=0.1)
    for conv in (INPUT, LOOSE, Convention(kl_importance_weight=True)):
        if conv.kl_importance_weight and v.ratio == "gspo_token":
            continue
        plain = half_tolerance(padded_case(torch.float16, padding=-1.0, ref=True), v, conv, 0.5)
        padded = half_tolerance(padded_case(torch.float16, padding=padding, ref=True), v, conv, 0.5)
        assert padded == pytest.approx(plain, rel=1e-12, abs=0.0)
    f64 = [half_tolerance(padded_case(torch.float64, padding=p, ref=True), v, F32, 0.5)
           for p in (-1.0, padding)]
    assert f64[1] == pytest.approx(f64[0], rel=1e-12, abs=0.0)


def test_kappa_of_a_sequence_ratio_is_the_mean_log_ratio_and_of_a_product_the_sum():
    """Row 0's log-ratios sum to 0.5 over 4 tokens, row 1's to -0.5625 over 2: GSPO's kappa is
    max(0.125, 0.28125), the product's 0.5625; the bf16 gradient bound (K + kappa + 2) u.
    Kills (issue 31) the sequence mean's ``/ lengths`` changed to ``* lengths``."""
    case = padded_case(torch.bfloat16)
    u = 2.0**-8
    assert half_tolerance(case, VARIANTS["gspo"], INPUT, 0.0)[1] == (10 + 0.28125) * u
    assert half_tolerance(case, VARIANTS["gspo_token"], INPUT, 0.0)[1] == (10 + 0.28125) * u
    assert half_tolerance(case, VARIANTS["product"], INPUT, 0.0)[1] == (10 + 0.5625) * u
    assert half_tolerance(case, VARIANTS["dapo"], INPUT, 0.0)[1] == (10 + 0.9375) * u
    # float32_min: 2 u_in + (K + kappa) u_32
    assert half_tolerance(case, VARIANTS["dapo"], LOOSE, 0.0)[1] == 2 * u + 8.9375 * U32


def test_a_half_loss_that_overflows_its_dtype_is_allowed_only_when_computed_in_it():
    # fp16: a ratio exp(11.5) = 98 715 > 65 504; the sum of terms 3 x 30 000 > 65 504 with ratios ~1
    big_ratio = padded_case(torch.float16)
    big_ratio.logp[0, 2] = big_ratio.old_logp[0, 2] + 11.5
    v = VARIANTS["none"]
    assert half_tolerance(big_ratio, v, INPUT, 1.0)[2] is True
    assert half_tolerance(big_ratio, v, LOOSE, 1.0)[2] is False
    big_sum = dataclasses.replace(padded_case(torch.float16),
                                  advantages=t([3e4, -3e4, 3e4, 3e4], torch.float16))
    assert half_tolerance(big_sum, v, INPUT, 1.0)[2] is True
    assert half_tolerance(big_sum, v, LOOSE, 1.0)[2] is False
    # the sum of the policy and KL terms overflows, each alone does not; a large ratio of a small term
    kl = dataclasses.replace(v, kl_coef=1.0, kl_estimator="k2")
    base = padded_case(torch.float16, ref=True)
    far_ref = torch.where(base.mask, base.logp - 120.0, base.ref_logp)  # k2 = 7200 per token
    half_sum = dataclasses.replace(base, advantages=t([9e3, -9e3, 0.0, 1.0], torch.float16), ref_logp=far_ref)
    sums = [reference_magnitudes(half_sum, w, INPUT)["sum"] for w in (v, kl)]
    assert sums[0] < 65504.0 < sums[1]
    assert half_tolerance(half_sum, kl, INPUT, 1.0)[2] is True
    small = dataclasses.replace(big_ratio, advantages=t([1e-3, 1e-3, 1e-3, 1e-3], torch.float16))
    assert reference_magnitudes(small, v, INPUT)["sum"] < 65504.0
    assert half_tolerance(small, v, INPUT, 1.0)[2] is True
    assert half_tolerance(padded_case(torch.float16), v, INPUT, 1.0)[2] is False


def test_the_kl_gradient_slack_is_zero_without_a_kl_term_or_in_float64():
    v = KL["grpo_k3"]
    assert kl_gradient_slack(padded_case(torch.bfloat16, ref=False), v, INPUT) == 0.0
    assert kl_gradient_slack(padded_case(torch.bfloat16, ref=True), VARIANTS["grpo"], INPUT) == 0.0
    assert kl_gradient_slack(padded_case(torch.float64, ref=True), v, INPUT) == 0.0
    assert kl_gradient_slack(padded_case(torch.float64, ref=True), v, F32) > 0.0  # rounded to float32


# ---------------------------------------------------------------------------------------------
# verdicts just inside and just outside each bound
# ---------------------------------------------------------------------------------------------


def _verdicts(case, v, conv, factor):
    """judge_policy's (value ok, grad ok) for a loss off by ``factor`` x the value bound and a
    gradient entry off by ``factor`` x the gradient bound (relative to max |gradient| + its floor)."""
    exp_loss, exp_grad = expected_policy_loss(case, v, conv)
    value_tol, grad_rtol, _, slack = reference_half_tolerance(case, v, conv, float(exp_loss))
    floor = 1e-3 * max(float(case.advantages.double().abs().max()), 1e-3)
    grad_floor = floor / max(convention_normalizer(case.mask, v, conv), 1.0)
    scale = float(exp_grad.abs().max())
    grad_rtol = max(grad_rtol, slack / (scale + grad_floor))
    got_grad = exp_grad.clone()
    got_grad[0, 1] += factor * grad_rtol * (scale + grad_floor)
    got_loss = exp_loss - factor * value_tol
    _, _, value_ok, grad_ok, departure = judge_policy(
        case, got_loss, got_grad, exp_loss, exp_grad, v, conv, DEFAULT_RTOL)
    assert departure is None
    return value_ok, grad_ok


@pytest.mark.parametrize(("name", "conv"), [
    ("gspo_token", INPUT), ("gspo", INPUT), ("dapo", LOOSE), ("sapo", INPUT), ("cispo", LOOSE),
    ("grpo_k3", INPUT), ("product", LOOSE), ("dr_grpo", F32), ("gspo_k2", F32),
])
def test_a_result_wrong_by_1_01_bounds_fails_and_by_0_99_passes(name, conv):
    v = effective_variant({**VARIANTS, **KL}[name], conv)
    dtype = torch.float64 if conv is F32 else torch.bfloat16
    case = padded_case(dtype, ref=v.kl_coef > 0)
    assert _verdicts(case, v, conv, 0.99) == (True, True)
    assert _verdicts(case, v, conv, 1.01) == (False, False)
    assert _verdicts(case, v, conv, -1.01) == (False, False)


def test_a_wrong_result_against_an_expected_value_near_zero_fails():
    """Advantages of 0: every term is 0, the bound 0, and the loss is judged on the floor
    1e-3 x 1e-3 (adv scale clamped at 1e-3), float64 and half alike."""
    v = VARIANTS["dapo"]
    for dtype in (torch.float64, torch.bfloat16):
        case = dataclasses.replace(padded_case(dtype), advantages=torch.zeros(4, dtype=dtype))
        exp_loss, exp_grad = expected_policy_loss(case, v, LOOSE)
        assert float(exp_loss) == 0.0
        for got, ok in ((1e-6 * 0.99 * DEFAULT_RTOL, True), (1e-6 * 1.01 * DEFAULT_RTOL, False),
                        (1e-3, False), (-1e-3, False)):
            verdict = judge_policy(case, t(got), exp_grad, exp_loss, exp_grad, v, LOOSE, DEFAULT_RTOL)
            assert verdict[2] is ok, (dtype, got)


@pytest.mark.parametrize("name", ["gspo", "dapo", "grpo_k3", "cispo_sequence"])
def test_a_step_without_a_token_has_the_bound_of_its_rounding_alone(name):
    """All rows padding: no term, kappa 0, S 0, ratio 1 (no overflow); the bound is u |expected|."""
    v = {**VARIANTS, **KL}[name]
    case = padded_case(torch.float16, ref=v.kl_coef > 0)
    case = dataclasses.replace(case, mask=torch.zeros_like(case.mask))
    value, grad, overflow = half_tolerance(case, v, INPUT, -0.75)
    assert (value, grad, overflow) == (0.75 * 2.0**-11, 10 * 2.0**-11, False)
    assert half_tolerance(case, v, LOOSE, -0.75) == (0.75 * U32, 2 * 2.0**-11 + 8 * U32, False)
    assert kl_gradient_slack(case, v, INPUT) == 0.0
    # no position at all (width 0): the same
    empty = dataclasses.replace(case, logp=case.logp[:, :0], old_logp=case.old_logp[:, :0],
                                mask=case.mask[:, :0],
                                ref_logp=None if case.ref_logp is None else case.ref_logp[:, :0])
    assert half_tolerance(empty, v, INPUT, -0.75) == (0.75 * 2.0**-11, 10 * 2.0**-11, False)
    assert kl_gradient_slack(empty, v, INPUT) == 0.0  # no KL term to round (kills kl_grad 1.0 there)
    f64 = dataclasses.replace(empty, logp=empty.logp.double(), old_logp=empty.old_logp.double())
    assert half_tolerance(f64, v, F32, 0.0) == (0.0, 2 * U32 + 8 * U32, False)


def test_reference_log_probs_do_not_count_without_a_kl_term():
    """A case may carry ref_logp for a variant without a KL term: even one whose k3 overflows
    (log r = 800) leaves the bound what it is without it."""
    case = padded_case(torch.bfloat16, ref=True)
    far = dataclasses.replace(case, ref_logp=torch.where(case.mask, case.logp + 800.0, case.ref_logp))
    for conv in (INPUT, LOOSE):
        plain = half_tolerance(padded_case(torch.bfloat16), VARIANTS["grpo"], conv, 0.5)
        assert half_tolerance(far, VARIANTS["grpo"], conv, 0.5) == plain
        assert math.isfinite(plain[0])


@pytest.mark.parametrize("name", ["dapo", "gspo", "grpo_k3", "cispo_sequence"])
def test_the_half_bound_of_a_step_whose_normaliser_is_one(name):
    """Only row 3 (one token) counts: every aggregation's normaliser is 1 (one token, one row), so
    S is the sum of |terms| itself. Kills ``_term_magnitudes``'s ``max(normaliser, 1)`` changed to
    ``max(normaliser, 2)``."""
    v = {**VARIANTS, **KL}[name]
    case = padded_case(torch.float16, ref=True)
    mask = torch.zeros_like(case.mask)
    mask[3, 0] = True
    case = dataclasses.replace(case, mask=mask)
    assert convention_normalizer(case.mask, v, INPUT) == 1.0
    value, grad, overflow = half_tolerance(case, v, INPUT, -0.75)
    ref_value, ref_grad, ref_overflow, _ = reference_half_tolerance(case, v, INPUT, -0.75)
    assert value == pytest.approx(ref_value, rel=1e-12, abs=0.0)
    assert grad == pytest.approx(ref_grad, rel=1e-12, abs=0.0) and overflow is ref_overflow is False
    assert reference_magnitudes(case, v, INPUT)["S"] > 0.0


def test_a_sum_of_terms_exactly_the_largest_finite_value_is_no_overflow():
    """Ratios 1 (logp = old) and advantages 16376, 0, 0, 0 in fp16: row 0's four terms sum to exactly
    65504, fp16's largest finite value, which the dtype holds. Kills ``m["sum"] > fmax`` changed to
    ``>=``."""
    base = padded_case(torch.float16)
    case = dataclasses.replace(base, logp=base.old_logp.clone(),
                               advantages=t([16376.0, 0.0, 0.0, 0.0], torch.float16))
    assert reference_magnitudes(case, VARIANTS["none"], INPUT)["sum"] == 65504.0
    assert half_tolerance(case, VARIANTS["none"], INPUT, 1.0)[2] is False


def test_the_half_bound_follows_the_cases_device_not_the_default_one():
    """The bound's zero is made on the case's device: under a meta default device (as under
    ``torch.set_default_device("cuda")``) a CPU case's bound is the plain one. Kills
    ``_term_magnitudes``' ``device=mask.device`` dropped or None (fifth pass)."""
    for name, conv in (("gspo", INPUT), ("grpo_k3", LOOSE), ("cispo", F32)):
        v = {**VARIANTS, **KL}[name]
        dtype = torch.float64 if conv is F32 else torch.float16
        case = padded_case(dtype, ref=True)
        plain = half_tolerance(case, v, conv, 0.5), kl_gradient_slack(case, v, conv)
        with torch.device("meta"):
            on_meta = half_tolerance(case, v, conv, 0.5), kl_gradient_slack(case, v, conv)
        assert on_meta == plain

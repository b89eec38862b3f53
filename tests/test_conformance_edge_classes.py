"""Issue 27's case classes and judgements, pinned: ``ratio_overflow`` (a closed gate on a ratio past the
dtype's range), ``zero_rows`` (a batch without rows), the subdifferential at a dual-clip tie (any value
inside it passes, with a note), SkyRL's Dr. GRPO denominator (``seq_sum_extra``), the advantage cases of
a trailing partial group and of constant groups on a large offset, and the matrix's rule that a
finding shows only on a departure its flag alone reproduces."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from refimpl.advantages import group_advantages
from refimpl.conformance.cases import CASE_CLASSES, advantage_cases
from refimpl.conformance.conventions import Convention
from refimpl.conformance.edge_cases import ratio_overflows
from refimpl.conformance.expected import convention_normalizer, expected_policy_loss
from refimpl.conformance.matrix import _noted, _shows
from refimpl.conformance.policy_cases import policy_loss_cases
from refimpl.conformance.policy_check import TIE_NOTE, differences_report, judge_policy
from refimpl.losses import get_preset

DAPO = get_preset("dapo")
PPO_DUAL = dataclasses.replace(get_preset("ppo"), dual_clip=3.0)


def test_ratio_overflow_cases_are_exact_in_their_dtype_and_close_the_gate():
    cases = policy_loss_cases(DAPO, Convention(), classes=("ratio_overflow",))
    assert [c.logp.dtype for c in cases] == [torch.float32, torch.bfloat16, torch.float16]
    for case in cases:
        x = torch.where(case.mask, case.logp.double() - case.old_logp.double(), 0.0)
        limit = math.log(torch.finfo(case.logp.dtype).max)
        big = x > limit
        assert bool(big.any()) and ratio_overflows(case, case.logp.dtype)
        # every overflowing token has A > 0 above 1 + eps_high: the gate is closed, the gradient 0
        assert bool((case.advantages.double().unsqueeze(-1).expand_as(x)[big] > 0).all())
        loss, grad = expected_policy_loss(case, DAPO, Convention())
        assert math.isfinite(float(loss)) and bool((grad[big] == 0).all())
    assert not ratio_overflows(cases[2], torch.float32)  # fp16's 12 fits float32
    assert not ratio_overflows(cases[0], torch.float64)
    # no case where no gate closes (eps_high None) and with a dual clip a closed A < 0 row too
    assert policy_loss_cases(dataclasses.replace(DAPO, eps_high=None), Convention(),
                             classes=("ratio_overflow",)) == []
    dual = policy_loss_cases(PPO_DUAL, Convention(), classes=("ratio_overflow",))[0]
    assert float(dual.advantages[-1]) < 0 and float(dual.logp[-1, 0] - dual.old_logp[-1, 0]) == 95.0


def _overflowing_exp(case):
    """A float32 DAPO loss that exponentiates the raw log-ratio: NaN gradient where the gate is closed."""
    logp = case.logp.detach().float().requires_grad_(True)
    mask = case.mask
    x = torch.where(mask, logp - case.old_logp.float(), 0.0)
    ratio = torch.exp(x)
    a = case.advantages.float().unsqueeze(-1)
    per_token = torch.where(mask, -torch.min(ratio * a, torch.clamp(ratio, 0.8, 1.28) * a), 0.0)
    loss = per_token.sum() / mask.sum()
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def test_a_nan_gradient_under_a_closed_gate_fails_the_spec_and_is_named_under_its_flag():
    case = policy_loss_cases(DAPO, Convention(), classes=("ratio_overflow",))[0]
    loss, grad = _overflowing_exp(case)
    assert bool(torch.isnan(grad).any())
    exp_loss, exp_grad = expected_policy_loss(case, DAPO, Convention())
    verdict = judge_policy(case, loss, grad, exp_loss, exp_grad, DAPO, Convention(), 1e-8)
    assert verdict[2] and not verdict[3] and verdict[4] is None
    # computing in the input dtype never excuses a ratio past float32's range
    conv = Convention(compute_dtype="input")
    assert judge_policy(case, loss, grad, exp_loss, exp_grad, DAPO, conv, 1e-8)[3] is False
    named = Convention(compute_dtype="input", ratio_overflow="nan")
    assert judge_policy(case, loss, grad, exp_loss, exp_grad, DAPO, named, 1e-8)[2:] == (
        True, True, "ratio_overflow='nan'")


def test_zero_rows_has_loss_zero_and_a_nan_is_named_under_its_flag():
    (case,) = policy_loss_cases(DAPO, Convention(), classes=("zero_rows",))
    assert tuple(case.logp.shape) == (0, 3) and case.advantages.numel() == 0
    loss, grad = expected_policy_loss(case, DAPO, Convention())
    assert float(loss) == 0.0 and tuple(grad.shape) == (0, 3)
    nan = torch.tensor(math.nan, dtype=torch.float64)
    assert judge_policy(case, nan, grad, loss, grad, DAPO, Convention(), 1e-8)[2] is False
    assert judge_policy(case, nan, grad, loss, grad, DAPO, Convention(zero_rows="nan"), 1e-8)[2:] == (
        True, True, "zero_rows='nan'")


def test_any_gradient_inside_the_dual_clip_ties_subdifferential_passes_with_a_note():
    """policy_losses.md eq. (7): max(r A, c A) has a kink at r = c; every value between the one-sided
    derivatives (0 and A r) is a subgradient: the inclusive gate's end, the half, zero, not beyond."""
    conv = Convention()
    (case,) = policy_loss_cases(PPO_DUAL, conv, classes=("dual_clip_tie",))
    loss, inclusive = expected_policy_loss(case, PPO_DUAL, conv)
    _, half = expected_policy_loss(case, PPO_DUAL, Convention(dual_clip_tie="half"))
    tie = inclusive != half
    assert int(tie.sum()) == 2
    zero = torch.where(tie, 0.0, inclusive)
    for got, note in ((inclusive, None), (half, TIE_NOTE), (zero, TIE_NOTE)):
        assert judge_policy(case, loss, got, loss, inclusive, PPO_DUAL, conv, 1e-8)[2:] == (True, True, note)
    beyond = torch.where(tie, 2 * inclusive, inclusive)  # outside the interval
    assert judge_policy(case, loss, beyond, loss, inclusive, PPO_DUAL, conv, 1e-8)[3] is False
    off_tie = torch.where(tie, inclusive, 0.5 * inclusive)  # halved away from the tie: not a subgradient
    assert judge_policy(case, loss, off_tie, loss, inclusive, PPO_DUAL, conv, 1e-8)[3] is False
    # a profile that names the halving keeps it exact (no note needed)
    named = Convention(dual_clip_tie="half")
    assert judge_policy(case, loss, half, loss, half, PPO_DUAL, named, 1e-8)[2:] == (True, True, None)


def test_seq_sum_extra_adds_the_prompt_budget_to_dr_grpos_constant():
    dr = dataclasses.replace(get_preset("dr_grpo"), max_length=16)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert convention_normalizer(mask, dr, Convention()) == 2 * 16
    assert convention_normalizer(mask, dr, Convention(seq_sum_extra=512)) == 2 * (16 + 512)
    with pytest.raises(ValueError, match="seq_sum_extra must be an int >= 0"):
        Convention(seq_sum_extra=-1)


def test_partial_and_large_offset_group_cases():
    cases = {c.case_class: c for c in advantage_cases()}
    assert {"partial_group", "constant_large_offset"} <= set(CASE_CLASSES["group_advantages"])
    partial = cases["partial_group"]
    assert torch.bincount(partial.group_ids).tolist() == [4, 4, 2]
    offset = cases["constant_large_offset"]
    a = group_advantages(offset.rewards, offset.group_ids, scale="group", singleton="zero", std="population",
                         eps=1e-6, eps_inside_sqrt=True, zero_variance="formula")
    assert a[:4].tolist() == [0.0] * 4  # a constant group: exactly 0 (two-pass, exact here)
    r = offset.rewards[4:].float()  # spread 0.25 on 1e6, exact in float32; variance 1/64
    one_pass = (r * r).mean() - r.mean() ** 2  # E[x^2] - E[x]^2: 1e12 cancels in float32
    two_pass = ((r - r.mean()) ** 2).mean()
    assert float(two_pass) == 1 / 64 and float(one_pass) == 0.0  # all of the variance lost


def test_a_finding_shows_only_where_its_flag_alone_reproduces_the_departure():
    alone = {"case_class": "empty_step", "explanation": "flag empty_step='nan'"}
    paired = {"case_class": "padding_micro_batch",
              "explanation": "flags empty_step='nan', micro_batch='local_mean'"}
    assert _shows("empty_step", alone) and _shows("empty_step='nan'", alone)
    assert not _shows("empty_step", paired) and not _shows("micro_batch", paired)
    assert _shows("micro_batch", paired, "value_only")  # other classes: within the smallest set
    assert _shows("padding_micro_batch", paired)  # a key that is no flag: the departing class itself
    # a key that is a flag and a class: the flag decides (a ratio_overflow departure by compute_dtype
    # is not the ratio_overflow finding)
    by_dtype = {"case_class": "ratio_overflow", "explanation": "flag compute_dtype='input'"}
    assert not _shows("ratio_overflow", by_dtype)
    entry = {"reference": {"notes": [f"dual_clip_tie: {TIE_NOTE}"]}}
    assert _noted("dual_clip_tie", entry) and not _noted("empty_step", entry)


def test_differences_count_no_subgradient_and_name_the_new_flags():
    half = Convention(name="half", dual_clip_tie="half")
    report = differences_report("ppo", PPO_DUAL, PPO_DUAL, half, seed=0, rtol=1e-8)
    tie = report.case_class("dual_clip_tie")
    assert tie.ok and tie.departures == (TIE_NOTE,)
    nan = Convention(name="nan", ratio_overflow="nan", zero_rows="nan")
    report = differences_report("dapo", DAPO, DAPO, nan, seed=0, rtol=1e-8)
    assert {"ratio_overflow", "zero_rows"} <= set(report.failing_classes())
    assert report.case_class("zero_rows").departures == ("zero_rows='nan'",)

"""Behaviours a profile names that the kit learnt from Tunix and SkyRL's CISPO (no JAX needed here):
``clip_bound_tie="three_quarters"`` (3/4 of the gradient at a ratio on a clip bound, token and
GSPO-token ratios), ``zero_rows="raise"`` (a raise on a batch without rows, a departure, never a pass
otherwise), GSPO-token's ``log_ratio_clamp`` inside ``sg(log s)`` only, ``whiten_sample_single="nan"``,
and a KL computed in float32 judged as a float32 evaluation."""

from __future__ import annotations

import dataclasses
import math

import torch

from refimpl.conformance.cases import kl_cases
from refimpl.conformance.checks import check_policy_loss
from refimpl.conformance.conventions import Convention
from refimpl.conformance.expected import effective_variant, expected_kl, expected_policy_loss
from refimpl.conformance.kinds.whitening import WhiteningFlags, expected_whitening, whitening_cases
from refimpl.conformance.policy_cases import policy_loss_cases
from refimpl.conformance.simple_checks import run_kl_check
from refimpl.losses import get_preset, policy_loss

REF = Convention()
DAPO = get_preset("dapo")
QUARTERS = Convention(clip_bound_tie="three_quarters")


def _on_bound(case, variant):
    r = torch.where(case.mask, case.logp - case.old_logp, 0.0).exp()
    return case.mask & ((r == 1.0 - variant.eps_low) | (r == 1.0 + variant.eps_high))


def test_clip_bound_tie_takes_three_quarters_of_the_gradient_on_either_bound_and_nothing_else():
    for case in policy_loss_cases(DAPO, REF, classes=("on_boundary",)):
        loss, spec = expected_policy_loss(case, DAPO, REF)
        got_loss, got = expected_policy_loss(case, DAPO, QUARTERS)
        bound = _on_bound(case, DAPO)
        assert int(bound.sum()) == 4 and float(got_loss) == float(loss)  # two rows, both bounds
        assert torch.equal(got[bound], 0.75 * spec[bound]) and torch.equal(got[~bound], spec[~bound])
    (inside,) = policy_loss_cases(DAPO, REF, classes=("inside_clip",))[:1]
    _, plain = expected_policy_loss(inside, DAPO, REF)
    assert torch.equal(expected_policy_loss(inside, DAPO, QUARTERS)[1], plain)


def test_clip_bound_tie_on_gspo_tokens_sequence_ratio():
    gspo = get_preset("gspo")
    token = effective_variant(gspo, Convention(sequence_ratio_gradient="token"))
    assert token.ratio == "gspo_token"
    case = policy_loss_cases(gspo, REF, classes=("on_boundary",))[0]  # length-1 rows on each bound
    _, spec = expected_policy_loss(case, token, REF)
    _, got = expected_policy_loss(case, token, dataclasses.replace(QUARTERS, sequence_ratio_gradient="token"))
    bound = _on_bound(case, gspo) & (case.mask.sum(dim=-1, keepdim=True) == 1)
    assert int(bound.sum()) == 2
    assert torch.equal(got[bound], 0.75 * spec[bound]) and torch.equal(got[~bound], spec[~bound])


def test_gspo_tokens_clamp_acts_inside_the_detached_sequence_ratio_only():
    """log_ratio_clamp 20 under GSPO-token: log s from the clamped log-ratios, every token's gradient
    through logp - sg(logp) kept (eq. (5)); the spec's with the clamped log-ratios, not a zero."""
    token = dataclasses.replace(get_preset("gspo"), ratio="gspo_token")
    case = policy_loss_cases(token, REF, classes=("extreme_log_ratio",))[0]
    conv = Convention(log_ratio_clamp=20.0)
    loss, grad = expected_policy_loss(case, token, conv)
    clamped = case.old_logp + (case.logp - case.old_logp).clamp(-20.0, 20.0)
    want, want_grad = expected_policy_loss(dataclasses.replace(case, logp=clamped), token, REF)
    assert bool(((case.logp - case.old_logp).abs() > 20)[case.mask].any())
    assert torch.allclose(loss, want, rtol=1e-12, atol=0)
    assert torch.allclose(grad, want_grad, rtol=1e-12, atol=0)
    big = case.mask & ((case.logp - case.old_logp).abs() > 20)
    assert bool((grad[big] != 0).any())  # a clamped token keeps its gradient


def test_a_raise_on_a_batch_without_rows_is_a_named_departure_only_under_its_flag():
    def raises_on_no_rows(logp, old_logp, advantages, mask, **_):
        if logp.shape[0] == 0:
            raise ValueError("zero-size array to reduction operation max")
        loss, _ = policy_loss(logp, old_logp, advantages, mask, DAPO)
        return loss

    named = Convention(name="raises", zero_rows="raise")
    both = ("inside_clip", "zero_rows")
    report = check_policy_loss(raises_on_no_rows, "dapo", convention=named, classes=both)
    assert report.ok and report.case_class("zero_rows").departures == ("zero_rows='raise'",)
    report = check_policy_loss(raises_on_no_rows, "dapo", classes=("zero_rows",))
    assert report.failing_classes() == ["zero_rows"]
    explained = check_policy_loss(raises_on_no_rows, "dapo", classes=("zero_rows",),
                                  explain={"zero_rows": "raise"})
    assert {r.explanation for r in explained.results} == {"flag zero_rows='raise'"}


def test_a_sample_variance_of_one_entry_is_an_error_or_nan_as_named():
    (single,) = [c for c in whitening_cases() if c.case_class == "single_token"]
    nan = expected_whitening(single, WhiteningFlags(whiten_std="sample", whiten_sample_single="nan"))
    assert bool(torch.isnan(nan["advantages"].values).all())
    try:
        expected_whitening(single, WhiteningFlags(whiten_std="sample"))
    except ValueError as exc:
        assert "two counted entries" in str(exc)
    else:
        raise AssertionError("a sample variance of one entry must be refused by default")
    assert not bool(torch.isnan(expected_whitening(single, WhiteningFlags())["advantages"].values).any())


class _Given(torch.autograd.Function):
    """``value`` with the gradient ``slope`` in ``logp``."""

    @staticmethod
    def forward(ctx, logp, value, slope):
        ctx.save_for_backward(slope)
        return value.clone()

    @staticmethod
    def backward(ctx, grad):
        (slope,) = ctx.saved_tensors
        return grad * slope, None, None


def test_a_float32_kl_is_judged_as_a_float32_evaluation():
    """Another float32 evaluation of the naive k3 (exp one ulp off, as XLA's) passes; an error of a few
    hundred ulps fails; at an infinite log-ratio any non-finite value is the naive form's inf - inf."""
    conv = Convention(kl_compute_dtype="float32", kl_k3_form="naive")

    def k3(logp, ref_logp, exp):  # a float32 naive k3 whose exp is ``exp``, its gradient 1 - e^d
        d = ref_logp.float() - logp.detach().float()
        value = torch.where(d == math.inf, -math.inf, exp(d) - d - 1)  # XLA's -inf at inf - inf
        return _Given.apply(logp, value.double(), (1 - torch.exp(d)).double())

    def one_ulp_off(logp, ref_logp):
        return k3(logp, ref_logp, lambda d: torch.nextafter(torch.exp(d), torch.tensor(math.inf)))

    def far_off(logp, ref_logp):
        return k3(logp, ref_logp, lambda d: torch.exp(d) * (1 + 3e-5))

    classes = ("tiny_log_ratio", "moderate_log_ratio", "infinite_log_ratio")
    assert run_kl_check(one_ulp_off, "k3", conv, rtol=1e-8, classes=classes).failing_classes() == []
    far = run_kl_check(far_off, "k3", conv, rtol=1e-8, classes=classes)
    assert "moderate_log_ratio" in far.failing_classes()
    strict = run_kl_check(one_ulp_off, "k3", Convention(kl_k3_form="naive"), rtol=1e-8, classes=classes)
    assert "infinite_log_ratio" in strict.failing_classes()  # float64: no such allowance
    case = next(c for c in kl_cases() if c.case_class == "infinite_log_ratio")
    assert bool(torch.isnan(expected_kl(case, "k3", conv)[0]).any())

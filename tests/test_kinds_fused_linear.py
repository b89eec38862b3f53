"""The fused lm head + loss kind (refimpl/conformance/kinds/fused_linear.py): its expected values are
the spec written out independently (a plain float64 log-softmax of hidden @ weight.T and PPO's clipped
surrogate, token mean: policy_losses.md eqs. (6), (10)), a correct float32 implementation passes every
class, and a weight gradient summed chunk by chunk in bf16 fails the 64-chunk bf16 class only, named
by ``fused_weight_grad`` alone."""

from __future__ import annotations

import pytest
import torch

from refimpl.conformance.kinds import attribute, get_kind, run_kind_check
from refimpl.conformance.kinds.fused_linear import FusedLinearFlags, expected_fused_linear, fused_linear_cases

KIND = get_kind("fused_linear")


def _spec(case):
    """The loss and gradients written out: float64 log-softmax, clipped surrogate, token mean."""
    x, eps = case.inputs, case.params["eps"]
    hidden = x["hidden"].double().requires_grad_(True)
    weight = x["weight"].double().requires_grad_(True)
    logp = torch.log_softmax(hidden @ weight.T, dim=-1).gather(-1, x["tokens"][..., None])[..., 0]
    ratio = torch.exp(logp - x["old_logp"].double())
    adv = x["advantages"].double()[:, None]
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
    loss = torch.where(x["mask"], per_token, 0.0).sum() / x["mask"].sum()
    return (loss, *torch.autograd.grad(loss, (hidden, weight)))


@pytest.mark.parametrize("case", fused_linear_cases(), ids=lambda c: c.case_class)
def test_the_expected_values_are_the_spec_written_out(case):
    want = _spec(case)
    got = expected_fused_linear(case, FusedLinearFlags())
    for name, w in zip(("loss", "grad_hidden", "grad_weight"), want, strict=True):
        # float64 through a handful of operations on O(1) values: 1e-12 is ~5e3 unit roundoffs
        torch.testing.assert_close(got[name].values, w.detach(), rtol=0, atol=1e-12)


def _fused(accumulate: bool):
    """A chunked implementation in float32: each row chunk's loss and gradients at once (as fused
    kernels do); the weight gradient summed in the weight's dtype (``accumulate``) or in float32."""

    class Fused(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, weight, tokens, old_logp, advantages, mask, eps, chunks):
            grads_h, total = [], torch.zeros((), dtype=torch.float32)
            grad_w = torch.zeros(weight.shape, dtype=weight.dtype if accumulate else torch.float32)
            count = mask.sum().clamp(min=1)
            for rows in torch.chunk(torch.arange(hidden.shape[0]), chunks):
                with torch.enable_grad():  # forward of an autograd.Function runs without grad mode
                    h = hidden[rows].detach().float().requires_grad_(True)
                    w = weight.detach().float().requires_grad_(True)
                    logp = torch.log_softmax(h @ w.T, -1).gather(-1, tokens[rows][..., None])[..., 0]
                    r, a = torch.exp(logp - old_logp[rows]), advantages[rows][:, None]
                    per_token = -torch.minimum(r * a, r.clamp(1 - eps, 1 + eps) * a)
                    part = torch.where(mask[rows], per_token, 0.0).sum() / count
                    gh, gw = torch.autograd.grad(part, (h, w))
                grads_h.append(gh.to(hidden.dtype))
                grad_w += gw.to(grad_w.dtype)
                total += part.detach()
            ctx.save_for_backward(torch.cat(grads_h), grad_w.to(weight.dtype))
            return total

        @staticmethod
        def backward(ctx, grad):
            grad_h, grad_w = ctx.saved_tensors
            return grad_h * grad, grad_w * grad, None, None, None, None, None, None

    def fn(hidden, weight, tokens, old_logp, advantages, mask, *, eps, chunks):
        return Fused.apply(hidden, weight, tokens, old_logp, advantages, mask, eps, chunks)

    return fn


def test_a_float32_chunked_implementation_passes_every_class():
    report = run_kind_check(KIND, _fused(accumulate=False))
    assert report.ok, report.failing_classes()


def test_a_bf16_weight_gradient_sum_fails_only_the_64_chunk_class_and_is_named():
    fn = _fused(accumulate=True)
    report = run_kind_check(KIND, fn)
    assert list(report.failing_classes()) == ["bf16_row_chunks"]
    named = attribute(report, {"fused_weight_grad": "accumulated"},
                      lambda flags: run_kind_check(KIND, fn, flags))
    (departure,) = [r for r in named.results if not r.ok]
    assert departure.explanation == "flag fused_weight_grad='accumulated'"
    assert departure.grad_error > 2 * 2.0**-8  # past the bf16 tolerance, not a rounding at its edge


def test_a_denominator_without_the_mask_fails_the_ragged_classes():
    def per_position_mean(hidden, weight, tokens, old_logp, advantages, mask, *, eps, chunks):
        logp = torch.log_softmax(hidden.float() @ weight.float().T, -1).gather(-1, tokens[..., None])[..., 0]
        r, a = torch.exp(logp - old_logp), advantages[:, None]
        return torch.where(mask, -torch.minimum(r * a, r.clamp(1 - eps, 1 + eps) * a), 0.0).mean()

    failing = set(run_kind_check(KIND, per_position_mean).failing_classes())
    assert {"one_chunk", "uneven_chunks", "empty_rows"} <= failing
    assert "bf16_row_chunks" not in failing  # every row full there: the plain mean is the token mean

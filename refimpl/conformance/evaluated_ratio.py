"""The importance ratio as a framework evaluates it (flags ``ratio_dtype`` and ``dual_clip_tie`` of
``conventions.RatioFlags``), for the expected values of ``refimpl.conformance.expected``.

The expected value is the spec's ``policy_loss`` (float64) on a ``logp`` whose float64 ratio
``exp(logp - old)`` is the ratio the framework evaluates:

* ``ratio_dtype="input"`` with float64 inputs: the exact ratio (``logp`` unchanged);
* float32 inputs, ``ratio_dtype="float32"`` (SkyRL's ``_safe_exp_delta``: ``exp(float32(x))`` cast
  back to the input dtype, whose gradient is rounded to float32 on its way back) or
  ``"float32_gate"`` (Liger: the ratio and the clip bounds it is compared with in float32):
  ``float32(exp(float32(x)))``, its gradient kept (``logp``'s, scaled or rounded as below).

A ratio exactly on a bound of the clip gate (``1 + eps_high`` for A > 0, ``1 - eps_low`` or the dual
clip ``c`` for A < 0; in float32 such ties are common: float32(exp(log 3)) is exactly 3.0) is placed
on the gate's open side of the float64 bound (the spec's inclusive gate, policy_losses.md eqs.
(6)-(7), evaluated on the framework's ratio), and under ``dual_clip_tie="half"`` the gradient at
``r == c`` is halved (a ``torch.min`` / ``torch.max`` tie splits it in two); under
``clip_bound_tie="three_quarters"`` the gradient at ``r == 1 - eps_low`` or ``1 + eps_high`` is 3/4 of
the spec's, whatever the sign of A (``jnp.clip``'s half derivative at the bound plus ``jnp.maximum``'s
half at the tie it makes; GSPO-token's ratio ``s_i`` likewise).
"""

from __future__ import annotations

import math

import torch

from refimpl.losses import PolicyLossVariant

__all__ = ["evaluated_ratio_logp", "evaluated_weight_old"]


def _float32_ratio(convention, input_dtype: torch.dtype) -> bool:
    return convention.ratio_dtype != "input" or input_dtype == torch.float32


def _float32_bounds(convention, input_dtype: torch.dtype) -> bool:
    """The gate compares the ratio with float32 bounds (float32 tensors compared with Python floats)."""
    return convention.ratio_dtype == "float32_gate" or input_dtype == torch.float32


class _Float32RatioGradient(torch.autograd.Function):
    """Identity forward; backward ``float32(float32(g / r) * r)``: the gradient ``g = g_r r`` that
    reaches ``logp`` through a ratio ``r`` evaluated in float32 and cast back (``exp``'s backward
    multiplies the float32-rounded ``g_r`` by ``r`` in float32)."""

    @staticmethod
    def forward(ctx, logp, ratio):
        ctx.save_for_backward(ratio)
        return logp.clone()

    @staticmethod
    def backward(ctx, grad):
        (ratio,) = ctx.saved_tensors
        upstream = (grad / ratio).float()
        return torch.where(ratio > 0, (upstream * ratio.float()).double(), grad), None


def evaluated_ratio_logp(logp, old, adv, mask, variant: PolicyLossVariant, convention, input_dtype):
    """``logp`` for the token ratio the framework evaluates (see the module docstring); ``logp`` as
    it is for other ratios and gates, and when nothing is rounded or tied."""
    float32 = _float32_ratio(convention, input_dtype)
    if variant.ratio == "gspo_token" and variant.gate == "clip" and convention.clip_bound_tie != "inclusive":
        return _gspo_token_bound_ties(logp, old, mask, variant)
    if variant.ratio != "token" or variant.gate not in ("clip", "sapo"):
        return logp
    ties = (convention.dual_clip_tie == "half" and variant.dual_clip is not None) or (
        convention.clip_bound_tie != "inclusive" and variant.gate == "clip")
    if not float32 and not ties:
        return logp
    x = (logp - old).detach()
    ratio = torch.exp(x.float()).double() if float32 else torch.exp(x)
    usable = mask & (ratio > 0) & torch.isfinite(ratio)
    target = logp.detach()
    if float32:
        target = torch.where(usable, old + torch.log(torch.where(usable, ratio, 1.0)), target)
    grad_scale = torch.ones_like(x)
    if variant.gate == "clip":
        bounds32 = _float32_bounds(convention, input_dtype)
        target, on_dual = _ties_on_open_side(target, old, ratio, usable, adv, variant, bounds32)
        if convention.dual_clip_tie == "half":
            grad_scale = torch.where(on_dual, 0.5, 1.0)
        if convention.clip_bound_tie == "three_quarters":
            grad_scale = torch.where(usable & _on_clip_bound(ratio, variant, bounds32), 0.75 * grad_scale,
                                     grad_scale)
    out = target + grad_scale * (logp - logp.detach())
    if convention.ratio_dtype == "float32" and input_dtype == torch.float64:
        out = _Float32RatioGradient.apply(out, torch.where(usable, ratio, 0.0))
    return out


def _gspo_token_bound_ties(logp, old, mask, variant):
    """GSPO-token's ratio is ``s_i`` at every token of row i (policy_losses.md eq. (5)), its gradient
    through ``logp[i, t]`` alone: under ``clip_bound_tie="three_quarters"`` 3/4 of it on the tokens of a
    row whose ``s_i`` equals a clip bound."""
    x = torch.where(mask, (logp - old).detach(), 0.0)
    s = torch.exp(x.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1))
    on = mask & _on_clip_bound(s, variant, False).unsqueeze(-1)
    return logp.detach() + torch.where(on, 0.75, 1.0) * (logp - logp.detach())


def _on_clip_bound(ratio, variant, float32_bounds: bool):
    """Where ``ratio`` equals ``1 - eps_low`` or ``1 + eps_high`` (rounded to float32 when
    ``float32_bounds``), whatever the sign of A."""
    bounds = [1.0 - e for e in (variant.eps_low,) if e is not None]
    bounds += [1.0 + e for e in (variant.eps_high,) if e is not None]
    on = torch.zeros_like(ratio, dtype=torch.bool)
    for bound in bounds:
        on = on | (ratio == (float(torch.tensor(bound, dtype=torch.float32)) if float32_bounds else bound))
    return on


def _ties_on_open_side(target, old, ratio, usable, adv, variant, float32_bounds: bool):
    """``target`` moved, where the evaluated ``ratio`` equals a bound of the clip gate (the bound
    rounded to float32 when ``float32_bounds``), onto the open side of the float64 bound; and the
    mask of the ties with the dual clip."""

    def rounded(bound: float) -> float:
        return float(torch.tensor(bound, dtype=torch.float32, device="cpu")) if float32_bounds else bound

    lower = 1.0 - (0.0 if variant.eps_low is None else variant.eps_low)
    upper = math.inf if variant.eps_high is None else 1.0 + variant.eps_high
    dual = math.inf if variant.dual_clip is None else variant.dual_clip
    negative = (adv < 0) if adv.ndim == 2 else (adv < 0).unsqueeze(-1).expand_as(ratio)
    on_upper = usable & ~negative & (ratio == rounded(upper))
    on_lower = usable & negative & (ratio == rounded(lower))
    on_dual = usable & negative & (ratio == rounded(dual))
    target = torch.where(on_upper, old + math.log(upper) if math.isfinite(upper) else target, target)
    target = torch.where(on_lower, old + math.log(lower) if lower > 0 else target, target)
    target = torch.where(on_dual, old + math.log(dual) if math.isfinite(dual) else target, target)
    for _ in range(16):  # a few float64 ulps at most
        r = torch.exp(target - old)
        low_side = (on_upper & (r > upper)) | (on_dual & (r > dual))
        high_side = on_lower & (r < lower)
        if not bool((low_side | high_side).any()):
            break
        down = torch.nextafter(target, torch.full_like(target, -math.inf))
        up = torch.nextafter(target, torch.full_like(target, math.inf))
        target = torch.where(low_side, down, torch.where(high_side, up, target))
    return target, on_dual


def evaluated_weight_old(logp, old, mask, convention, input_dtype):
    """CISPO's ``old`` such that its detached weight ``exp(logp - old)`` is the ratio evaluated in
    float32 (see the module docstring); ``old`` unchanged otherwise."""
    if not _float32_ratio(convention, input_dtype):
        return old
    ratio = torch.exp((logp - old).detach().float()).double()
    usable = mask & (ratio > 0) & torch.isfinite(ratio)
    return torch.where(usable, (logp - torch.log(torch.where(usable, ratio, 1.0))).detach(), old)

"""Tolerance maths of the kit (the one home): errors, float64 tolerances, half-precision bounds.

Tolerances (float64 inputs): a case passes when ``|got - expected| <= rtol * (|expected| + s)``
elementwise-max, with ``rtol = 1e-8`` and a small magnitude floor ``s`` (1e-3 of the inputs' scale)
so that a loss that is ~0 by cancellation is compared on the scale of its terms (the installed
TRL / verl / OpenRLHF stay within 4e-15 of it; why 1e-8 is not replaced by a derived float64 bound:
docs/conformance.md, "Tolerances"). Half-precision
cases (bf16 / fp16 inputs): the expected value is the exact float64 value on the rounded inputs and
the tolerance a forward-error bound (``half_tolerance``): with ``u`` the unit roundoff of the
dtype the loss is computed in (float32 under ``compute_dtype="float32_min"``, the input dtype under
``"input"``), ``kappa = max |log-ratio|`` (the condition number of ``exp``), ``S`` the loss of the
absolute values of the terms and ``n`` the number of summed elements,

    |got - expected| <= ((K + kappa) u + gamma_n(u_32)) S + u |expected|,  gamma_n(u) = n u / (1 - n u),

with ``K = 8`` rounded elementwise operations per term; the gradient (elementwise, returned in the
input dtype) to ``(K + kappa + 2) u_in`` under "input", ``2 u_in + (K + kappa) u_32`` otherwise.
"""

from __future__ import annotations

import math

import torch

from refimpl.losses import PolicyLossVariant

from . import case_types as _cases
from .conventions import Convention
from .expected import convention_normalizer

__all__ = [
    "DEFAULT_RTOL",
    "UNIT_ROUNDOFF",
    "ELEMENTWISE_ROUNDINGS",
    "relative_error",
    "fixed_tolerances",
    "half_tolerance",
    "kl_gradient_slack",
    "is_half",
]

DEFAULT_RTOL = 1e-8
HALF_GRAD_RTOL = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
#: unit roundoff u = 2^-p of each floating dtype (p = significand bits incl. the implicit one)
UNIT_ROUNDOFF = {
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
    torch.float32: 2.0**-24,
    torch.float64: 2.0**-53,
}
#: rounded elementwise operations per term of the family's longest chain (SAPO: subtract is in
#: kappa; expm1, x tau, sigmoid, x 4/tau, x A, / length, row-sum rounding, / normaliser)
ELEMENTWISE_ROUNDINGS = 8


def relative_error(got: torch.Tensor, expected: torch.Tensor, floor: float) -> float:
    """max |got - expected| / (max |expected| + floor); inf when shapes differ or got is not finite
    where expected is."""
    if tuple(got.shape) != tuple(expected.shape):
        return math.inf
    if not expected.numel():
        return 0.0
    g, e = got.detach().cpu().double(), expected.cpu().double()
    both_inf = (torch.isinf(e) & (g == e)) | (torch.isnan(e) & torch.isnan(g))
    if bool((~torch.isfinite(g) & ~both_inf).any()):
        return math.inf
    diff = torch.where(both_inf, torch.zeros_like(e), g - e).abs()
    scale = torch.where(torch.isfinite(e), e, torch.zeros_like(e)).abs().max()
    return float(diff.max() / (scale + floor))


def fixed_tolerances(dtype: torch.dtype, rtol: float) -> tuple[float, float]:
    if dtype in HALF_GRAD_RTOL:
        return max(rtol, 1e-4), max(rtol, HALF_GRAD_RTOL[dtype])
    return rtol, rtol


def _term_magnitudes(case, variant: PolicyLossVariant, conv: Convention) -> dict[str, float]:
    """Magnitudes of the loss's terms on ``case`` (float64 of the rounded inputs): ``S`` the loss
    of |terms| (each term bounded by |A| x the largest factor its gate can apply, plus the KL's
    intermediates), ``sum`` their unnormalised sum (the largest partial sum a sum-then-divide
    forms), ``kappa`` the largest |unit log-ratio| and ``max_ratio``."""
    mask = case.mask
    logp, old = case.logp.double(), case.old_logp.double()
    zero = torch.zeros((), dtype=torch.float64, device=mask.device)
    x = torch.where(mask, logp - old, zero)
    lengths = mask.sum(-1).double()
    adv = case.advantages.double().abs()
    denominator = max(convention_normalizer(mask, variant, conv), 1.0)
    if variant.sequence_level:
        valid = lengths > 0
        unit_x = x.sum(-1) / (lengths.clamp(min=1.0) if variant.ratio == "sequence_mean" else 1.0)
        unit_logp = torch.where(mask, logp, zero).sum(-1) / lengths.clamp(min=1.0)
        unit_adv = adv
        weight = (lengths if variant.per_token_copies else torch.ones_like(lengths)) / denominator
    else:
        valid = mask
        unit_x = x
        if variant.ratio == "gspo_token":
            unit_x = torch.where(mask, (x.sum(-1) / lengths.clamp(min=1.0)).unsqueeze(-1), zero)
        unit_logp = torch.where(mask, logp, zero)
        unit_adv = adv if adv.ndim == 2 else adv.unsqueeze(-1).expand_as(x)
        per_row = variant.aggregation == "seq_mean_token_mean"
        weight = (1.0 / (lengths.clamp(min=1.0).unsqueeze(-1) if per_row else 1.0)) / denominator
    ratio = torch.exp(unit_x)
    lower, upper, dual = _cases.clip_bounds(variant)
    if variant.gate == "clip":
        factor = torch.clamp(ratio, min=max(upper or 1.0, dual or 1.0, 1.0))
    elif variant.gate == "sapo":
        factor = torch.full_like(ratio, 4.0 / min(variant.tau_pos, variant.tau_neg))
    elif variant.gate == "cispo":
        factor = ratio.clamp(min=lower, max=upper) * unit_logp.abs()
    else:
        factor = ratio
    terms = torch.where(valid, unit_adv * factor, zero)
    s_abs = float((weight * terms).sum())
    total = float(terms.sum())
    if variant.kl_coef > 0 and case.ref_logp is not None:
        log_r = torch.where(mask, case.ref_logp.double() - logp, zero)
        kl = {"k1": log_r.abs(), "k2": log_r**2 / 2, "k3": torch.exp(log_r) + log_r.abs() + 1.0}
        kl_terms = torch.where(mask, variant.kl_coef * kl[variant.kl_estimator], zero)
        if conv.kl_importance_weight:  # TRL: each KL term times the unit's ratio (may overflow fp16)
            unit_ratio = ratio.unsqueeze(-1) if ratio.ndim == 1 else ratio
            kl_terms = kl_terms * torch.where(mask, unit_ratio.expand_as(kl_terms), zero)
        per_row = variant.aggregation == "seq_mean_token_mean"
        kl_weight = (1.0 / (lengths.clamp(min=1.0).unsqueeze(-1) if per_row else 1.0)) / denominator
        s_abs += float((kl_weight * kl_terms).sum())
        total += float(kl_terms.sum())
    kl_grad = 0.0
    inputs = torch.where(mask, logp.abs() + old.abs(), zero)
    if variant.kl_coef > 0 and case.ref_logp is not None:
        kl_grad = float((kl_weight * kl_terms).max()) if kl_terms.numel() else 0.0
        inputs = torch.maximum(inputs, torch.where(mask, logp.abs() + case.ref_logp.double().abs(), zero))
    finite_x = unit_x[valid]
    return {
        "S": s_abs,
        "sum": total,
        "kappa": float(finite_x.abs().max()) if finite_x.numel() else 0.0,
        "max_ratio": float(ratio[valid].max()) if finite_x.numel() else 1.0,
        "kl_grad": kl_grad,
        "inputs": float(inputs[torch.isfinite(inputs)].max()) if bool(torch.isfinite(inputs).any()) else 0.0,
    }


def _compute_roundoff(dtype: torch.dtype, conv: Convention) -> tuple[float, float]:
    """(u of the dtype the loss is computed in, u of the gradient returned): the input dtype under
    ``compute_dtype="input"``, float32 under "float32_min" (half inputs), and float32 for every input
    under "float32" (float64 inputs are rounded: their gradient carries float32's roundoff too)."""
    u32 = UNIT_ROUNDOFF[torch.float32]
    u_in = UNIT_ROUNDOFF[dtype]
    if conv.compute_dtype == "float32":
        return u32, max(u_in, u32)
    return (u_in if conv.compute_dtype == "input" else u32), u_in


def kl_gradient_slack(case, variant: PolicyLossVariant, conv: Convention) -> float:
    """An absolute bound on the rounding of a KL term's gradient in a reduced compute dtype: k3's
    gradient ``1 - exp(log r)`` (times the ratio under ``kl_importance_weight``) is a difference of
    terms of size ``exp(|log r|)``, so its error is ``(K + kappa + 2) u`` times their largest weighted
    size (kl.md eq. (4)), however small the difference; 0 without a KL term (``kl_grad`` is 0) or in
    float64."""
    u, _ = _compute_roundoff(case.logp.dtype, conv)
    if u == UNIT_ROUNDOFF[torch.float64]:
        return 0.0
    m = _term_magnitudes(case, variant, conv)
    return (ELEMENTWISE_ROUNDINGS + m["kappa"] + 2) * u * m["kl_grad"]


def half_tolerance(
    case, variant: PolicyLossVariant, conv: Convention, expected_loss: float
) -> tuple[float, float, bool]:
    """(absolute value tolerance, relative gradient tolerance, may overflow) of a half-precision case.

    The rule (docs/conformance.md, "Tolerances"): ``u`` is the unit roundoff of the compute dtype
    (float32 under ``compute_dtype="float32_min"``, the input dtype under ``"input"``). Each term
    goes through at most K = ``ELEMENTWISE_ROUNDINGS`` rounded operations, each a relative error
    <= u, and through ``exp`` of a log-ratio whose own rounding (u |x|) becomes a relative error
    kappa u (kappa = max |x|); the sum of n elements accumulated in float32 (torch's reductions of
    half tensors accumulate in float32) adds gamma_n(u_32) = n u_32 / (1 - n u_32) times the sum
    of |terms|, and rounding the result to the dtype u |loss| (a first-order bound: products of u
    terms are far below it for these sizes):

        |got - expected| <= ((K + kappa) u + gamma_n(u_32)) S + u |expected|.

    The gradient is elementwise (no reduction) and returned in the input dtype:
    ``(K + kappa + 2) u_in`` under "input", ``2 u_in + (K + kappa) u_32`` otherwise, relative to its
    largest entry. Under "input", a case whose unnormalised sum of |terms| or largest ratio exceeds
    the dtype's largest finite value may overflow (inf / NaN then allowed, reported as a departure).
    """
    m = _term_magnitudes(case, variant, conv)
    u32 = UNIT_ROUNDOFF[torch.float32]
    u, u_in = _compute_roundoff(case.logp.dtype, conv)
    n = case.logp.numel() + case.logp.shape[0]
    gamma = n * u32 / (1 - n * u32)
    k = ELEMENTWISE_ROUNDINGS + m["kappa"]
    if conv.compute_dtype == "float32" and case.logp.dtype == torch.float64:
        k += m["inputs"]  # log-probs rounded to float32: the log-ratio moves by u (|logp| + |old|)
    value = (k * u + gamma) * m["S"] + u * abs(expected_loss)
    grad = (k + 2) * u_in if conv.compute_dtype == "input" else 2 * u_in + k * u32
    if conv.compute_dtype == "float32" and case.logp.dtype == torch.float64:
        grad += m["inputs"] * u32
    fmax = torch.finfo(case.logp.dtype).max
    overflow = conv.compute_dtype == "input" and (m["sum"] > fmax or m["max_ratio"] > fmax)
    return value, grad, overflow



def is_half(dtype: torch.dtype) -> bool:
    """bf16 / fp16: the dtypes judged by ``half_tolerance`` (or ``fixed_tolerances``)."""
    return dtype in HALF_GRAD_RTOL

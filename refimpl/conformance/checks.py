"""The checkers: feed every case class to a user's function and compare value and gradient.

``check_policy_loss(fn, preset, *, convention="reference", adapter=None)`` and friends return a
``CheckReport`` (table per case class, smallest failing case in full). The user's function is
called through an *adapter* ``adapter(fn, call) -> result`` that maps our call object to the
user's calling convention; the default adapters use the contract signatures of ARCHITECTURE.md.

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

import dataclasses
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

from refimpl.losses import PolicyLossVariant, get_preset, policy_loss

from . import cases as _cases
from .conventions import Convention, profile
from .expected import (
    convention_loss,
    convention_normalizer,
    effective_variant,
    expected_group_advantages,
    expected_kl,
    expected_policy_loss,
    expected_token_logprobs,
    masked_nonfinite_reaches_loss,
)
from .golden import golden_cases
from .report import CaseResult, CheckReport, tensor_text

__all__ = [
    "PolicyLossCall",
    "contract_adapter",
    "check_policy_loss",
    "check_group_advantages",
    "check_kl",
    "check_token_logprobs",
    "reference_policy_loss_fn",
    "convention_differences",
    "resolve_preset",
    "DEFAULT_RTOL",
    "SignatureError",
    "half_tolerance",
    "case_line",
    "POLICY_LOSS_SIGNATURE",
    "SIGNATURES",
    "advantage_convention",
]

DEFAULT_RTOL = 1e-8
_HALF_GRAD_RTOL = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
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
POLICY_LOSS_SIGNATURE = (
    "fn(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None) -> scalar loss tensor "
    "(or give an adapter(fn, call: PolicyLossCall))"
)


class SignatureError(TypeError):
    """The function (through its adapter) cannot be called on the plainest case, or does not
    return a scalar tensor: the check stops before running any case class."""


@dataclass(frozen=True)
class PolicyLossCall:
    """What an adapter receives for one (micro-)batch.

    ``logp`` is a leaf tensor with ``requires_grad=True`` (the kit differentiates the returned loss
    w.r.t. it); ``mask`` is bool; ``normalizer`` is the global denominator (a float) when the batch
    is a micro-batch under the global-normaliser convention, else None; ``config`` holds the
    variant's fields (every ``PolicyLossVariant`` field: eps_low, eps_high, dual_clip, tau_pos,
    tau_neg, aggregation, max_length, group_size, kl_coef, kl_estimator, kl_scale, ratio, gate,
    ...) plus ``preset``, ``convention`` (the flag dict) and ``framework_config`` (TRL / verl keys
    under those profiles, else an empty dict).

    Micro-batches (gradient accumulation): ``micro_batch_index`` in ``range(micro_batch_count)``
    (0 and 1 without micro-batches); ``global_tokens`` = ``mask.sum()`` over the whole batch,
    ``global_sequences`` its non-empty rows, ``global_rows`` all its rows (empty ones included),
    the counts frameworks use for a global normaliser (e.g. TRL's ``num_items_in_batch``, verl's
    ``global_batch_info``); for a single batch they are this batch's counts. The kit sums the
    micro-batch losses; under ``micro_batch="local_mean"`` it then divides by their number, unless
    the adapter has the attribute ``scaled_for_accumulation = True`` (it returns each micro-batch's
    loss already divided by ``micro_batch_count``, as TRL's gradient accumulation does).
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logp: torch.Tensor | None
    rewards: torch.Tensor
    group_ids: torch.Tensor
    normalizer: float | None
    config: dict
    micro_batch_index: int = 0
    micro_batch_count: int = 1
    global_tokens: int = 0
    global_sequences: int = 0
    global_rows: int = 0


def contract_adapter(fn: Callable, call: PolicyLossCall) -> torch.Tensor:
    """Call ``fn(logp, old_logp, advantages, mask, *, ref_logp=..., normalizer=...)`` (the contract
    signature of ``refimpl.losses.policy_loss`` without the variant; keywords passed only when
    given) and return the loss (the first element if ``fn`` returns a tuple)."""
    kwargs = {}
    if call.ref_logp is not None:
        kwargs["ref_logp"] = call.ref_logp
    if call.normalizer is not None:
        kwargs["normalizer"] = call.normalizer
    out = fn(call.logp, call.old_logp, call.advantages, call.mask, **kwargs)
    return out[0] if isinstance(out, (tuple, list)) else out


def resolve_preset(
    preset: str | PolicyLossVariant, *, kl_coef: float | None = None, max_length: int | None = None
) -> tuple[str, PolicyLossVariant]:
    """(name, variant) for a preset name or a variant; ``seq_sum`` variants without ``max_length``
    get L_max = 16 (wider than every case, so the padded width and L_max differ)."""
    if isinstance(preset, PolicyLossVariant):
        from refimpl.losses import PRESETS

        name = next(
            (
                k
                for k, v in PRESETS.items()
                if v == dataclasses.replace(preset, kl_coef=v.kl_coef, max_length=v.max_length)
            ),
            "custom",
        )
        variant = preset
    else:
        name, variant = preset.strip().lower().replace("-", "_"), get_preset(preset)
    if kl_coef is not None:
        variant = dataclasses.replace(variant, kl_coef=kl_coef)
    if max_length is not None or (variant.aggregation == "seq_sum" and variant.max_length is None):
        variant = dataclasses.replace(variant, max_length=max_length or 16)
    return name, variant


def reference_policy_loss_fn(
    variant: PolicyLossVariant, convention: Convention | str = "reference", preset: str = "grpo"
) -> Callable:
    """Our own implementation of ``variant`` under ``convention`` with the contract signature
    ``fn(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None) -> loss``: plain
    ``policy_loss`` for the reference convention, the flag interpreter otherwise."""
    conv = profile(convention, preset)
    v = effective_variant(variant, conv)
    if conv == Convention():

        def reference(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None):
            kwargs = {"ref_logp": ref_logp} if ref_logp is not None and v.kl_coef > 0 else {}
            return policy_loss(logp, old_logp, advantages, mask, v, normalizer=normalizer, **kwargs)[0]

        return reference

    def with_convention(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None):
        mask = mask.bool()
        denominator = normalizer if normalizer is not None else convention_normalizer(mask, v, conv)
        return convention_loss(logp, old_logp, advantages, mask, ref_logp, v, conv, denominator)

    return with_convention


def _err(got: torch.Tensor, expected: torch.Tensor, floor: float) -> float:
    """max |got - expected| / (max |expected| + floor); inf when shapes differ or got is not finite
    where expected is."""
    if tuple(got.shape) != tuple(expected.shape):
        return math.inf
    g, e = got.detach().cpu().double(), expected.cpu().double()
    both_inf = torch.isinf(e) & (g == e)
    if bool((~torch.isfinite(g) & ~both_inf).any()):
        return math.inf
    diff = torch.where(both_inf, torch.zeros_like(e), g - e).abs()
    scale = (
        torch.where(torch.isinf(e), torch.zeros_like(e), e).abs().max() if e.numel() else torch.tensor(0.0)
    )
    return float(diff.max() / (scale + floor)) if e.numel() else 0.0


def _tolerances(dtype: torch.dtype, rtol: float) -> tuple[float, float]:
    if dtype in _HALF_GRAD_RTOL:
        return max(rtol, 1e-4), max(rtol, _HALF_GRAD_RTOL[dtype])
    return rtol, rtol


def _term_magnitudes(case, variant: PolicyLossVariant, conv: Convention) -> dict[str, float]:
    """Magnitudes of the loss's terms on ``case`` (float64 of the rounded inputs): ``S`` the loss
    of |terms| (each term bounded by |A| x the largest factor its gate can apply, plus the KL's
    intermediates), ``sum`` their unnormalised sum (the largest partial sum a sum-then-divide
    forms), ``kappa`` the largest |unit log-ratio| and ``max_ratio``."""
    mask = case.mask
    logp, old = case.logp.double(), case.old_logp.double()
    zero = torch.zeros((), dtype=torch.float64)
    x = torch.where(mask, logp - old, zero)
    lengths = mask.sum(-1).double()
    adv = case.advantages.double().abs()
    denominator = max(convention_normalizer(mask, variant, conv), 1.0)
    if variant.sequence_level:
        valid = lengths > 0
        unit_x = x.sum(-1) / (lengths.clamp(min=1.0) if variant.ratio == "sequence_mean" else 1.0)
        unit_logp = torch.where(mask, logp, zero).sum(-1) / lengths.clamp(min=1.0)
        unit_adv = adv
        copies = variant.aggregation in ("token_mean", "seq_sum")
        weight = (lengths if copies else torch.ones_like(lengths)) / denominator
    else:
        valid = mask
        unit_x = x
        if variant.ratio == "gspo_token":
            unit_x = torch.where(mask, (x.sum(-1) / lengths.clamp(min=1.0)).unsqueeze(-1), zero)
        unit_logp = torch.where(mask, logp, zero)
        unit_adv = adv if adv.ndim == 2 else adv.unsqueeze(-1).expand_as(x)
        per_row = variant.aggregation == "seq_mean_token_mean"
        weight = (1.0 / (lengths.clamp(min=1.0).unsqueeze(-1) if per_row else 1.0)) / denominator
        weight = weight * torch.ones_like(x)
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
    finite_x = unit_x[valid]
    return {
        "S": s_abs,
        "sum": total,
        "kappa": float(finite_x.abs().max()) if finite_x.numel() else 0.0,
        "max_ratio": float(ratio[valid].max()) if finite_x.numel() else 1.0,
    }


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
    u_in = UNIT_ROUNDOFF[case.logp.dtype]
    u = u_in if conv.compute_dtype == "input" else u32
    n = case.logp.numel() + case.logp.shape[0]
    gamma = n * u32 / (1 - n * u32)
    k = ELEMENTWISE_ROUNDINGS + m["kappa"]
    value = (k * u + gamma) * m["S"] + u * abs(expected_loss)
    grad = (k + 2) * u_in if conv.compute_dtype == "input" else 2 * u_in + k * u32
    fmax = torch.finfo(case.logp.dtype).max
    overflow = conv.compute_dtype == "input" and (m["sum"] > fmax or m["max_ratio"] > fmax)
    return value, grad, overflow


def _case_text(case, extra: list[str]) -> str:
    lines = [
        f"  {tensor_text(f, getattr(case, f))}"
        for f in (
            "logp",
            "old_logp",
            "ref_logp",
            "advantages",
            "mask",
            "rewards",
            "group_ids",
            "logits",
            "tokens",
        )
        if hasattr(case, f) and getattr(case, f) is not None
    ]
    if getattr(case, "note", ""):
        lines.insert(0, f"  ({case.note})")
    if getattr(case, "micro_batches", None):
        lines.append(f"  micro_batches = {case.micro_batches}")
    return "\n".join(lines + [f"  {x}" for x in extra])


def _run_user(case, compute) -> tuple[object, str | None]:
    try:
        return compute(), None
    except SignatureError:
        raise
    except Exception as exc:  # the user's function may fail on an edge case: report it
        return None, f"{type(exc).__name__}: {exc} ({traceback.extract_tb(exc.__traceback__)[-1].name})"


def _user_policy_loss(
    fn,
    adapter,
    case: _cases.PolicyLossCase,
    variant,
    conv,
    config,
    normalizer=None,
    device: torch.device | str = "cpu",
):
    """The user's loss (summed / averaged over micro-batches as the convention says) and its
    gradient w.r.t. logp, computed on ``device`` and returned on the CPU."""
    logp = case.logp.detach().to(device).clone().requires_grad_(True)
    parts = case.micro_batches or (tuple(range(case.logp.shape[0])),)
    split = case.micro_batches is not None
    total_norm = sum(convention_normalizer(case.mask[list(p)], variant, conv) for p in parts)
    counts = {
        "global_tokens": int(case.mask.sum()),
        "global_sequences": int(case.mask.any(dim=-1).sum()),
        "global_rows": int(case.mask.shape[0]),
    }
    if normalizer is not None:  # a golden vector: one part of a larger batch, described by its normaliser
        counts = _counts_from_normalizer(normalizer, variant, counts)

    def on_device(x: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
        return None if x is None else x.to(device)[rows]

    loss = None
    for k, p in enumerate(parts):
        i = torch.tensor(p, dtype=torch.long, device=logp.device)
        call = PolicyLossCall(
            logp[i] if split else logp,
            on_device(case.old_logp, i),
            on_device(case.advantages, i),
            on_device(case.mask, i),
            on_device(case.ref_logp, i),
            on_device(case.rewards, i),
            on_device(case.group_ids, i),
            max(total_norm, 1.0) if split and conv.micro_batch == "global" else normalizer,
            config,
            micro_batch_index=k,
            micro_batch_count=len(parts),
            **counts,
        )
        part = adapter(fn, call)
        if not isinstance(part, torch.Tensor) or part.numel() != 1:
            shape = f" of shape {tuple(part.shape)}" if isinstance(part, torch.Tensor) else ""
            raise SignatureError(
                f"the function must return a scalar loss tensor, got {type(part).__name__}{shape}; "
                f"expected {POLICY_LOSS_SIGNATURE}"
            )
        loss = part.reshape(()) if loss is None else loss + part.reshape(())
    if split and conv.micro_batch == "local_mean" and not getattr(adapter, "scaled_for_accumulation", False):
        loss = loss / len(parts)
    if not loss.requires_grad:
        grad = torch.zeros_like(logp)
    else:
        (grad,) = torch.autograd.grad(loss, logp, allow_unused=True)
    return loss.detach().cpu(), (torch.zeros_like(logp) if grad is None else grad).cpu()


def _counts_from_normalizer(normalizer: float, variant: PolicyLossVariant, counts: dict) -> dict:
    """The global counts of the batch a given normaliser describes (policy_losses.md eq. (11)):
    tokens for token_mean, sequences (= rows) for the sequence means, sequences x L_max for seq_sum."""
    if variant.aggregation == "token_mean":
        return {**counts, "global_tokens": int(round(normalizer))}
    sequences = normalizer / variant.max_length if variant.aggregation == "seq_sum" else normalizer
    return {**counts, "global_sequences": int(round(sequences)), "global_rows": int(round(sequences))}


def _preflight(fn, adapter, variant, conv, config, device) -> None:
    """Call the function once on the plainest case (inside_clip/0, float64): a wrong signature, an
    exception or a non-scalar return stops the check here with the expected signature, instead of
    a table of failures."""
    case = _cases.policy_loss_cases(variant, conv, classes=("inside_clip",))[0]
    try:
        _user_policy_loss(fn, adapter, case, variant, conv, config, None, device)
    except SignatureError:
        raise
    except Exception as exc:
        name = getattr(fn, "__qualname__", type(fn).__name__)
        raise SignatureError(
            f"{name} fails on the plainest case inside_clip/0 with {type(exc).__name__}: {exc}; "
            f"expected {POLICY_LOSS_SIGNATURE}"
        ) from exc


def _finite(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all())


def _judge_policy(case, got_loss, got_grad, exp_loss, exp_grad, v, conv, rtol: float, normalizer=None):
    """(value error, grad error, value ok, grad ok, departure) of one policy-loss case under ``conv``."""
    allowed = None
    if conv.masked_nonfinite == "propagate" and masked_nonfinite_reaches_loss(case, v):
        allowed = "masked_nonfinite='propagate'"
    half = case.logp.dtype in UNIT_ROUNDOFF and case.logp.dtype not in (torch.float64, torch.float32)
    adv_scale = float(case.advantages.double().abs().max()) if case.advantages.numel() else 1.0
    floor = 1e-3 * max(adv_scale, 1e-3)
    if half and normalizer is None:
        abs_tol, grad_rtol, overflow = half_tolerance(case, v, conv, float(exp_loss))
        value_rtol = max(abs_tol / (abs(float(exp_loss)) + floor), rtol)  # --rtol can only loosen it
        grad_rtol = max(grad_rtol, rtol)
        if overflow:
            allowed = "compute_dtype='input' (overflow)"
    elif half:  # golden vectors in half precision (own normaliser): the former fixed tolerance
        value_rtol, grad_rtol = _tolerances(case.logp.dtype, rtol)
    else:
        value_rtol = grad_rtol = rtol
    value_error = _err(got_loss.reshape(()), exp_loss, floor)
    if allowed and not (_finite(got_loss) and _finite(got_grad)):
        return value_error, math.inf, True, True, allowed
    denom = max(convention_normalizer(case.mask, v, conv), 1.0) if normalizer is None else normalizer
    grad_error = _err(got_grad, exp_grad, floor / max(denom, 1.0))
    return value_error, grad_error, value_error <= value_rtol, grad_error <= grad_rtol, None


def _number_text(x: float) -> str:
    return repr(x) if math.isfinite(x) else f'float("{x}")'


def _nested_text(v) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_nested_text(x) for x in v) + "]"
    if isinstance(v, float):
        return _number_text(v)
    return str(v)


def case_line(case, extra: dict[str, object] | None = None) -> str:
    """The case's inputs as one line of Python (``torch.tensor(...)`` with the dtype), e.g. for a
    regression test: ``logp = torch.tensor([[...]], dtype=torch.float64); ...``."""
    parts = []
    for name in (
        "logp",
        "old_logp",
        "ref_logp",
        "advantages",
        "mask",
        "rewards",
        "group_ids",
        "logits",
        "tokens",
    ):
        x = getattr(case, name, None)
        if x is None:
            continue
        values = x.detach().double().tolist() if x.is_floating_point() else x.tolist()
        parts.append(f"{name} = torch.tensor({_nested_text(values)}, dtype={x.dtype})")
    if getattr(case, "micro_batches", None):
        parts.append(f"micro_batches = {case.micro_batches}")
    for key, value in (extra or {}).items():
        parts.append(f"{key} = {_number_text(value) if isinstance(value, float) else value!r}")
    return "; ".join(parts)


def _diagnosis_candidates(v: PolicyLossVariant, conv: Convention, name: str, explain: dict | None):
    """(label, variant, convention) alternatives tried on a failing case, the named flags first."""
    from refimpl.losses import AGGREGATIONS

    out = []
    flags = dict(explain or {})
    for flag, value in flags.items():
        try:
            out.append((f"flag {flag}={value!r}", v, dataclasses.replace(conv, **{flag: value})))
        except (TypeError, ValueError):
            continue
    if len(flags) > 1:
        try:
            label = "flags " + ", ".join(f"{k}={val!r}" for k, val in flags.items())
            out.append((label, v, dataclasses.replace(conv, **flags)))
        except (TypeError, ValueError):
            pass
    for agg in AGGREGATIONS:
        if agg == v.aggregation:
            continue
        try:
            extra = {"max_length": v.max_length or 16} if agg == "seq_sum" else {}
            out.append((f"aggregation {agg!r}", dataclasses.replace(v, aggregation=agg, **extra), conv))
        except ValueError:
            continue
    if explain is None:
        generic = {
            "empty_rows": "keep",
            "seq_sum_width": "padded_width",
            "seq_sum_rows": "all",
            "micro_batch": "local_mean" if conv.micro_batch == "global" else "global",
            "log_ratio_clamp": 20.0,
            "dual_clip": 3.0,
            "sequence_ratio_gradient": "token",
            "masked_nonfinite": "propagate",
            "compute_dtype": "input",
        }
        for flag, value in generic.items():
            if getattr(conv, flag) != value:
                out.append((f"flag {flag}={value!r}", v, dataclasses.replace(conv, **{flag: value})))
        for profile_name in ("trl", "verl", "openrlhf"):
            try:
                out.append((f"the {profile_name!r} profile", v, profile(profile_name, name)))
            except ValueError:
                continue
    return out


def _explain(case, got_loss, got_grad, v, conv, name, rtol, explain) -> str | None:
    """Which alternative (a convention flag, another aggregation, a shipped profile) reproduces the
    failing case's loss and gradient to the check's tolerance; None when none does."""
    for label, variant, candidate in _diagnosis_candidates(v, conv, name, explain):
        try:
            ev = effective_variant(variant, candidate)
            exp_loss, exp_grad = expected_policy_loss(case, ev, candidate)
        except (ValueError, TypeError, RuntimeError):
            continue
        _, _, value_ok, grad_ok, _ = _judge_policy(
            case, got_loss, got_grad, exp_loss, exp_grad, ev, candidate, rtol
        )
        if value_ok and grad_ok:
            return f"matches {label}"
    if case.micro_batches and conv.micro_batch == "global":
        # the kit passed the global normaliser and summed the parts: a function that ignores
        # ``normalizer`` returns the sum of the micro-batches' local means
        local = dataclasses.replace(conv, micro_batch="local_mean")
        exp_loss, exp_grad = expected_policy_loss(case, v, local)
        parts = len(case.micro_batches)
        _, _, value_ok, grad_ok, _ = _judge_policy(
            case, got_loss, got_grad, exp_loss * parts, exp_grad * parts, v, local, rtol
        )
        if value_ok and grad_ok:
            return "matches local means per micro-batch: the normalizer argument is ignored"
    return None


def check_policy_loss(
    fn: Callable,
    preset: str | PolicyLossVariant,
    *,
    convention: str | Convention = "reference",
    adapter: Callable | None = None,
    classes: tuple[str, ...] | None = None,
    kl_coef: float | None = None,
    rtol: float = DEFAULT_RTOL,
    seed: int = 0,
    device: torch.device | str = "cpu",
    explain: dict | None = None,
    framework_config: dict | None = None,
    header: tuple[str, ...] = (),
) -> CheckReport:
    """Check a user's policy loss against ``preset`` under ``convention`` on every case class.

    Args:
        fn: the user's loss function (called through ``adapter``).
        preset: a preset name ("dapo", "grpo", ...) or a ``PolicyLossVariant``.
        convention: "reference" (the spec), "trl", "verl" or a ``Convention``.
        adapter: ``adapter(fn, call: PolicyLossCall) -> scalar loss``; default ``contract_adapter``.
        classes: restrict to these case classes (default: all that apply).
        kl_coef: override the preset's KL weight (> 0 adds the ``kl_penalty`` class).
        rtol: float64 tolerance (see the module docstring).
        device: where the user's function runs (inputs are moved there; expected values are
            computed on the CPU in float64).
        explain: convention flags ({flag: value}, e.g. a framework mode's profile) tried first on
            each failing class's smallest case: a flag (or all of them together) that reproduces
            the function's loss and gradient is named in ``CaseResult.explanation``; None tries
            the other aggregations, common flags and the shipped profiles ("diagnosis").
        framework_config: ``call.config["framework_config"]`` (default: the trl / verl keys
            under those profiles, else ``{}``).
        header: lines printed above the report (e.g. the framework's version and source hash).

    Under the reference convention the class ``golden_vectors`` adds the 50-digit vectors of
    ``specs/vectors/policy_loss.json`` whose variant equals the checked one (when the file exists).

    Raises:
        SignatureError (a TypeError): the function cannot be called on the plainest case or does
            not return a scalar tensor (the expected signature is in the message).
    Returns:
        a ``CheckReport``; ``report.ok`` is True when every case passed.
    """
    name, variant = resolve_preset(preset, kl_coef=kl_coef)
    conv = profile(convention, name if name != "custom" else "grpo")
    v = effective_variant(variant, conv)
    adapter = adapter or contract_adapter
    config = {**dataclasses.asdict(v), "preset": name, "convention": dataclasses.asdict(conv)}
    if framework_config is None:
        framework_config = {}
        if conv.name in ("trl", "verl"):
            from .conventions import framework_config as _framework_config

            try:
                framework_config = _framework_config(conv.name, name, v)
            except (KeyError, ValueError):
                framework_config = {}
    config["framework_config"] = framework_config
    _preflight(fn, adapter, v, conv, config, device)
    jobs = [
        (case, *expected_policy_loss(case, v, conv), None)
        for case in _cases.policy_loss_cases(v, conv, seed=seed, classes=classes)
    ]
    if conv == Convention() and (classes is None or "golden_vectors" in classes):
        jobs += [(g.case, g.expected_loss, g.expected_grad, g.normalizer) for g in golden_cases(v)]
    results, got_by_id = [], {}
    for case, exp_loss, exp_grad, normalizer in jobs:
        (got, error) = _run_user(
            case,
            lambda case=case, n=normalizer: _user_policy_loss(fn, adapter, case, v, conv, config, n, device),
        )
        base = {"dtype": str(case.logp.dtype).replace("torch.", ""), "expected": float(exp_loss)}
        if got is None:
            detail = _case_text(case, [f"expected loss = {float(exp_loss)!r}"])
            results.append(
                dataclasses.replace(_raised(case, detail, error), **base, case_line=case_line(case))
            )
            continue
        got_loss, got_grad = got
        got_by_id[case.case_id] = (case, got_loss, got_grad)
        value_error, grad_error, value_ok, grad_ok, departure = _judge_policy(
            case, got_loss, got_grad, exp_loss, exp_grad, v, conv, rtol, normalizer
        )
        detail = _case_text(
            case,
            [
                f"expected loss = {float(exp_loss)!r}",
                f"got loss      = {float(got_loss)!r}",
                tensor_text("expected d loss / d logp", exp_grad),
                tensor_text("got d loss / d logp", got_grad),
            ],
        )
        line = case_line(case, {"expected_loss": float(exp_loss), "got_loss": float(got_loss)})
        results.append(
            CaseResult(
                case.case_id,
                case.case_class,
                case.size,
                value_error,
                grad_error,
                value_ok,
                grad_ok,
                detail,
                None,
                departure,
                got=float(got_loss),
                case_line=line,
                **base,
            )
        )
    results = _with_explanations(results, got_by_id, v, conv, name, rtol, explain)
    notes = [f"{k}: reference {a!r} -> {conv.name} {b!r}" for k, (a, b) in conv.differences().items()]
    title = f"policy loss: preset {name} ({_describe(v)}), convention {conv.name}, {len(results)} cases"
    return CheckReport(title, tuple(results), tuple(notes), tuple(header), explain is not None)


def _with_explanations(results, got_by_id, v, conv, name, rtol, explain):
    """Diagnose the smallest failing case of each failing class (see ``_explain``)."""
    smallest: dict[str, CaseResult] = {}
    for r in results:
        if not r.ok and r.case_id in got_by_id and r.case_class != "golden_vectors":
            if r.case_class not in smallest or (r.size, r.case_id) < (
                smallest[r.case_class].size,
                smallest[r.case_class].case_id,
            ):
                smallest[r.case_class] = r
    explained = {}
    for r in smallest.values():
        case, got_loss, got_grad = got_by_id[r.case_id]
        explained[r.case_id] = _explain(case, got_loss, got_grad, v, conv, name, rtol, explain) or (
            "unexplained" if explain is not None else None
        )
    return [
        dataclasses.replace(r, explanation=explained[r.case_id]) if r.case_id in explained else r
        for r in results
    ]


def _value_only(case, value_error: float, ok: bool, detail: str, error: str | None = None) -> CaseResult:
    return CaseResult(case.case_id, case.case_class, case.size, value_error, None, ok, None, detail, error)


def _raised(case, detail: str, error: str | None) -> CaseResult:
    return CaseResult(
        case.case_id, case.case_class, case.size, math.inf, math.inf, False, False, detail, error
    )


def _judged(
    case, value_error: float, grad_error: float, value_rtol: float, grad_rtol: float, detail: str
) -> CaseResult:
    return CaseResult(
        case.case_id,
        case.case_class,
        case.size,
        value_error,
        grad_error,
        value_error <= value_rtol,
        grad_error <= grad_rtol,
        detail,
    )


def _cases_denominator(case, variant, conv) -> float:
    return convention_normalizer(case.mask, variant, conv)


def _describe(v: PolicyLossVariant) -> str:
    parts = [f"ratio={v.ratio}", f"gate={v.gate}", f"aggregation={v.aggregation}"]
    if v.gate in ("clip", "cispo"):
        parts.append(f"eps_low={v.eps_low}, eps_high={v.eps_high}")
    if v.dual_clip is not None:
        parts.append(f"dual_clip={v.dual_clip}")
    if v.gate == "sapo":
        parts.append(f"tau_pos={v.tau_pos}, tau_neg={v.tau_neg}")
    if v.max_length is not None:
        parts.append(f"max_length={v.max_length}")
    if v.kl_coef:
        parts.append(f"kl_coef={v.kl_coef} ({v.kl_estimator})")
    return ", ".join(parts)


#: the contract signature of each kind without an adapter, and the adapter's (one API for every kind:
#: ``adapter(fn, *inputs)`` receives the function and exactly the inputs the kit would pass it)
SIGNATURES = {
    "policy_loss": POLICY_LOSS_SIGNATURE,
    "kl": "fn(logp [N, T], ref_logp [N, T]) -> per-token KL [N, T] (or give an adapter(fn, logp, ref_logp))",
    "group_advantages": "fn(rewards [N], group_ids [N]) -> advantages [N] "
    "(or give an adapter(fn, rewards, group_ids))",
    "token_logprobs": "fn(logits [N, T, V], tokens [N, T]) -> log-probs [N, T] "
    "(or give an adapter(fn, logits, tokens))",
}


def _call(fn, adapter, *inputs):
    return adapter(fn, *inputs) if adapter is not None else fn(*inputs)


def _preflight_simple(kind: str, fn, compute, shape: tuple[int, ...]) -> None:
    """Run ``compute()`` on the first case of a checker: an exception or an output that is not a
    tensor of ``shape`` stops the check with the expected signature (SignatureError)."""
    name = getattr(fn, "__qualname__", type(fn).__name__)
    try:
        out = compute()
    except Exception as exc:
        raise SignatureError(
            f"{name} fails on the plainest case with {type(exc).__name__}: {exc}; expected {SIGNATURES[kind]}"
        ) from exc
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape:
        got = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise SignatureError(f"{name} returned {got}, expected a tensor of shape {shape}: {SIGNATURES[kind]}")


def check_group_advantages(
    fn: Callable,
    *,
    convention: str | Convention = "reference",
    adapter: Callable | None = None,
    rtol: float = DEFAULT_RTOL,
    seed: int = 0,
    preset: str | None = None,
    header: tuple[str, ...] = (),
) -> CheckReport:
    """Check ``fn(rewards [N], group_ids [N]) -> advantages [N]`` (or ``adapter(fn, rewards,
    group_ids)``) against ``group_advantages`` with the convention's std / eps / degenerate-group /
    leave-one-out flags. ``preset`` selects the profile's flags for that preset (e.g. Dr. GRPO:
    no std scaling; under the reference convention ``dr_grpo`` sets ``adv_scale="none"``). A case
    where the convention raises (e.g. TRL's singleton groups) expects the user's function to raise
    too. Values only (advantages carry no gradient). Raises SignatureError as ``check_policy_loss``."""
    conv = advantage_convention(convention, preset)
    cases = _cases.advantage_cases(seed=seed)
    first = cases[0]
    _preflight_simple(
        "group_advantages",
        fn,
        lambda: _call(fn, adapter, first.rewards.clone(), first.group_ids.clone()),
        tuple(first.rewards.shape),
    )
    results = []
    for case in cases:
        try:
            expected, expected_error = expected_group_advantages(case, conv), None
        except ValueError as exc:
            expected, expected_error = None, str(exc)
        got, error = _run_user(
            case, lambda case=case: _call(fn, adapter, case.rewards.clone(), case.group_ids.clone())
        )
        line = case_line(case)
        if expected is None:  # the convention rejects the batch: the user's function must raise too
            detail = _case_text(case, [f"expected: an error ({expected_error})"])
            ok = error is not None
            results.append(
                dataclasses.replace(_value_only(case, 0.0 if ok else math.inf, ok, detail), case_line=line)
            )
            continue
        if got is None:
            detail = _case_text(case, [tensor_text("expected", expected)])
            results.append(
                dataclasses.replace(_value_only(case, math.inf, False, detail, error), case_line=line)
            )
            continue
        got_t = got if isinstance(got, torch.Tensor) else torch.as_tensor(got, dtype=torch.float64)
        value_error = _err(got_t, expected, 1e-3)
        detail = _case_text(
            case, [tensor_text("expected advantages", expected), tensor_text("got advantages", got_t)]
        )
        results.append(
            dataclasses.replace(_value_only(case, value_error, value_error <= rtol, detail), case_line=line)
        )
    title = (
        f"group advantages: convention {conv.name} (std={conv.adv_std}, eps={conv.adv_eps}, "
        f"eps_inside_sqrt={conv.adv_eps_inside_sqrt}, scale={conv.adv_scale}, "
        f"leave_one_out={conv.adv_leave_one_out})"
    )
    notes = [f"{k}: reference {a!r} -> {conv.name} {b!r}" for k, (a, b) in conv.differences().items()]
    return CheckReport(title, tuple(results), tuple(notes), tuple(header))


def advantage_convention(convention: str | Convention, preset: str | None) -> Convention:
    """The convention of a group-advantage check: ``profile(convention, preset)``; under the
    reference convention the ``dr_grpo`` preset drops the std scaling (Dr. GRPO, advantages.md)."""
    if preset is None:
        return profile(convention)
    key = resolve_preset(preset)[0]
    conv = profile(convention, key)
    if key == "dr_grpo" and conv.name == "reference":
        conv = dataclasses.replace(conv, adv_scale="none")
    return conv


def check_kl(
    fn: Callable,
    estimator: str = "k3",
    *,
    convention: str | Convention = "reference",
    adapter: Callable | None = None,
    rtol: float = DEFAULT_RTOL,
    seed: int = 0,
    header: tuple[str, ...] = (),
) -> CheckReport:
    """Check a per-token KL estimator ``fn(logp, ref_logp) -> [N, T]`` (or ``adapter(fn, logp,
    ref_logp)``; k1 / k2 / k3 of kl.md with ``log r = ref_logp - logp``; the convention's k3
    clamps) by value and by its gradient in logp. Raises SignatureError as ``check_policy_loss``."""
    if estimator not in ("k1", "k2", "k3"):
        raise ValueError(f"estimator must be 'k1', 'k2' or 'k3', got {estimator!r}")
    conv = profile(convention)
    cases = _cases.kl_cases(seed=seed)
    first = cases[0]
    _preflight_simple(
        "kl",
        fn,
        lambda: _call(fn, adapter, first.logp.clone(), first.ref_logp.clone()),
        tuple(first.logp.shape),
    )
    results = []
    for case in cases:
        exp_value, exp_grad = expected_kl(case, estimator, conv)

        def compute(case=case):
            logp = case.logp.clone().requires_grad_(True)
            out = _call(fn, adapter, logp, case.ref_logp.clone())
            if not out.requires_grad:
                return out.detach(), torch.zeros_like(logp)
            (grad,) = torch.autograd.grad(out.sum(), logp, allow_unused=True)
            return out.detach(), torch.zeros_like(logp) if grad is None else grad

        got, error = _run_user(case, compute)
        if got is None:
            results.append(
                dataclasses.replace(_raised(case, _case_text(case, []), error), case_line=case_line(case))
            )
            continue
        floor = 1e-4
        value_error, grad_error = _err(got[0], exp_value, floor), _err(got[1], exp_grad, floor)
        detail = _case_text(
            case,
            [
                tensor_text("expected", exp_value),
                tensor_text("got", got[0]),
                tensor_text("expected d/d logp", exp_grad),
                tensor_text("got d/d logp", got[1]),
            ],
        )
        results.append(
            dataclasses.replace(
                _judged(case, value_error, grad_error, rtol, rtol, detail), case_line=case_line(case)
            )
        )
    notes = [f"{k}: reference {a!r} -> {conv.name} {b!r}" for k, (a, b) in conv.differences().items()]
    return CheckReport(
        f"KL estimator {estimator}: convention {conv.name}", tuple(results), tuple(notes), tuple(header)
    )


def check_token_logprobs(
    fn: Callable,
    *,
    adapter: Callable | None = None,
    rtol: float = DEFAULT_RTOL,
    seed: int = 0,
    header: tuple[str, ...] = (),
) -> CheckReport:
    """Check ``fn(logits [N, T, V], tokens [N, T]) -> [N, T]`` (or ``adapter(fn, logits, tokens)``)
    against the float64 ``log_softmax(logits).gather(tokens)`` and its gradient in the logits (for a
    fixed cotangent). Raises SignatureError as ``check_policy_loss``."""
    cases = _cases.logprob_cases(seed=seed)
    first = cases[0]
    _preflight_simple(
        "token_logprobs",
        fn,
        lambda: _call(fn, adapter, first.logits.clone(), first.tokens.clone()),
        tuple(first.tokens.shape),
    )
    results = []
    for case in cases:
        exp_value, exp_grad = expected_token_logprobs(case)

        def compute(case=case):
            logits = case.logits.clone().requires_grad_(True)
            out = _call(fn, adapter, logits, case.tokens.clone())
            (grad,) = torch.autograd.grad((out.double() * case.weights).sum(), logits)
            return out.detach(), grad

        got, error = _run_user(case, compute)
        value_rtol, grad_rtol = _tolerances(case.logits.dtype, rtol)
        if case.logits.dtype in _HALF_GRAD_RTOL:
            value_rtol = 1e-6  # log-probs of rounded logits, computed in float32
        if got is None:
            results.append(_raised(case, _case_text(case, []), error))
            continue
        value_error, grad_error = _err(got[0], exp_value, 1e-3), _err(got[1], exp_grad, 1e-3)
        detail = _case_text(case, [tensor_text("expected", exp_value), tensor_text("got", got[0])])
        results.append(_judged(case, value_error, grad_error, value_rtol, grad_rtol, detail))
    return CheckReport("token_logprobs", tuple(results), (), tuple(header))


def convention_differences(
    preset: str | PolicyLossVariant,
    convention: str | Convention,
    *,
    kl_coef: float | None = None,
    seed: int = 0,
    rtol: float = DEFAULT_RTOL,
) -> CheckReport:
    """Where and by how much ``convention`` departs from the spec for ``preset``: for every case,
    the expected loss and gradient under the convention compared with those of the reference
    convention (same inputs; errors normalised as in the checks). A "FAIL" row is a case class on
    which the framework's numerics differ from the spec by more than ``rtol``."""
    name, variant = resolve_preset(preset, kl_coef=kl_coef)
    conv = profile(convention, name if name != "custom" else "grpo")
    reference = Convention()
    v_conv, v_ref = effective_variant(variant, conv), effective_variant(variant, reference)
    results = []
    for case in _cases.policy_loss_cases(v_conv, conv, seed=seed):
        ref_loss, ref_grad = expected_policy_loss(case, v_ref, reference)
        conv_loss, conv_grad = expected_policy_loss(case, v_conv, conv)
        value_rtol, grad_rtol = _tolerances(case.logp.dtype, rtol)
        floor = 1e-3 * max(float(case.advantages.double().abs().max()), 1e-3)
        value_error = _err(conv_loss, ref_loss, floor)
        grad_error = _err(conv_grad, ref_grad, floor / max(_cases_denominator(case, v_ref, reference), 1.0))
        detail = _case_text(
            case,
            [
                f"spec loss = {float(ref_loss)!r}",
                f"{conv.name} loss = {float(conv_loss)!r}",
                tensor_text("spec d loss / d logp", ref_grad),
                tensor_text(f"{conv.name} d loss / d logp", conv_grad),
            ],
        )
        result = _judged(case, value_error, grad_error, value_rtol, grad_rtol, detail)
        if conv.masked_nonfinite == "propagate" and masked_nonfinite_reaches_loss(case, v_conv):
            result = dataclasses.replace(result, value_ok=False, departure="masked_nonfinite='propagate'")
        results.append(result)
    notes = [f"{k}: reference {a!r} -> {conv.name} {b!r}" for k, (a, b) in conv.differences().items()]
    title = f"spec vs {conv.name} for preset {name}: errors of the {conv.name} numerics relative to the spec"
    return CheckReport(title, tuple(results), tuple(notes))

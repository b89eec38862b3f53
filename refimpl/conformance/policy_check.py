"""The policy-loss checker: the engine's loop with the policy loss's expected value, call and
judgement (value and gradient in logp, micro-batches, half precision, golden vectors).

``run_policy_check`` takes a ``Convention`` value and a resolved variant; the public
``checks.check_policy_loss`` resolves preset and convention names and calls it.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from refimpl.losses import PolicyLossVariant

from . import policy_cases as _cases
from .contract import POLICY_LOSS_SIGNATURE, PolicyLossCall, SignatureError, contract_adapter
from .conventions import Convention
from .diagnosis import with_explanations
from .edge_cases import ratio_overflows
from .engine import case_line, case_text, judged, raised, run_cases
from .expected import (
    convention_normalizer,
    expected_policy_loss,
    masked_nonfinite_reaches_loss,
)
from .golden import golden_cases
from .kinks import TIE_NOTE, kink_subgradient_note
from .report import CaseResult, CheckReport, tensor_text
from .tolerance import fixed_tolerances, half_tolerance, kl_gradient_slack, relative_error
from .user_code import UserCodeFailure, guarded

__all__ = ["run_policy_check", "judge_policy", "kink_note", "TIE_NOTE", "user_policy_loss",
           "describe_variant", "differences_report"]

def user_policy_loss(
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
        part = guarded(lambda call=call: adapter(fn, call), _name(fn))
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


def _name(fn) -> str:
    return getattr(fn, "__qualname__", type(fn).__name__)


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
    name = _name(fn)
    try:
        guarded(lambda: user_policy_loss(fn, adapter, case, variant, conv, config, None, device), name)
    except SignatureError:
        raise
    except UserCodeFailure as exc:
        raise SignatureError(f"{exc} on the plainest case inside_clip/0") from None
    except Exception as exc:
        raise SignatureError(
            f"{name} fails on the plainest case inside_clip/0 with {type(exc).__name__}: {exc}; "
            f"expected {POLICY_LOSS_SIGNATURE}"
        ) from exc


def _finite(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all())


def _ratio_dtype(case, conv: Convention) -> torch.dtype:
    """The dtype a framework under ``conv`` evaluates the ratio's ``exp`` in (for ``ratio_overflows``)."""
    if case.logp.dtype == torch.float64:
        return torch.float32 if conv.compute_dtype == "float32" else torch.float64
    return case.logp.dtype if conv.compute_dtype == "input" else torch.float32


def _allowance(case, v, conv: Convention) -> str | None:
    """The named flag of ``conv`` under which a non-finite result of ``case`` is the framework's
    expected behaviour (reported as a departure), None when none applies."""
    allowed = None
    if conv.masked_nonfinite == "propagate" and masked_nonfinite_reaches_loss(case, v):
        allowed = "masked_nonfinite='propagate'"
    if conv.empty_step == "nan" and not bool(case.mask.any()):
        allowed = "empty_step='nan'"
    if conv.zero_rows == "nan" and case.mask.shape[0] == 0:
        allowed = "zero_rows='nan'"
    if conv.ratio_overflow == "nan" and (ratio_overflows(case, case.logp.dtype)
                                         or ratio_overflows(case, _ratio_dtype(case, conv))):
        allowed = "ratio_overflow='nan'"
    return allowed


_RAISES = "zero_rows='raise'"


def _raise_allowed(case, zero_rows) -> bool:
    """A raise is the named behaviour of ``zero_rows="raise"`` on a batch without rows."""
    return zero_rows == "raise" and case.mask.shape[0] == 0


def judge_policy(case, got_loss, got_grad, exp_loss, exp_grad, v, conv, rtol: float, normalizer=None):
    """(value error, grad error, value ok, grad ok, departure) of one policy-loss case under ``conv``.
    A gradient inside the subdifferential at a kink of the objective passes, noted (``kink_note``)."""
    allowed = _allowance(case, v, conv)
    # a reduced compute precision: half / float32 inputs, or a loss computed in float32 whatever the inputs
    half = case.logp.dtype != torch.float64 or conv.compute_dtype == "float32"
    adv_scale = float(case.advantages.double().abs().max()) if case.advantages.numel() else 1.0
    floor = 1e-3 * max(adv_scale, 1e-3)
    grad_slack = 0.0
    if half and normalizer is None:
        abs_tol, grad_rtol, overflow = half_tolerance(case, v, conv, float(exp_loss))
        value_rtol = max(abs_tol / (abs(float(exp_loss)) + floor), rtol)  # --rtol can only loosen it
        grad_rtol = max(grad_rtol, rtol)
        grad_slack = kl_gradient_slack(case, v, conv)
        # the input dtype's overflow excuses what float32 would hold, never a ratio past float32's range
        if overflow and not ratio_overflows(case, torch.float32):
            allowed = "compute_dtype='input' (overflow)"
    elif half:  # golden vectors in half precision (own normaliser): the former fixed tolerance
        value_rtol, grad_rtol = fixed_tolerances(case.logp.dtype, rtol)
    else:
        value_rtol = grad_rtol = rtol
    value_error = relative_error(got_loss.reshape(()), exp_loss, floor)
    if allowed and not (_finite(got_loss) and _finite(got_grad)):
        return value_error, math.inf, True, True, allowed
    denom = max(convention_normalizer(case.mask, v, conv), 1.0) if normalizer is None else normalizer
    grad_floor = floor / max(denom, 1.0)
    grad_error = relative_error(got_grad, exp_grad, grad_floor)
    if grad_slack:
        finite = exp_grad[torch.isfinite(exp_grad)]
        scale = float(finite.abs().max()) if finite.numel() else 0.0
        grad_rtol = max(grad_rtol, grad_slack / (scale + grad_floor))
    grad_ok = grad_error <= grad_rtol
    if not grad_ok and value_error <= value_rtol:
        note = kink_note(case, got_grad, exp_grad, v, conv, grad_rtol, grad_floor)
        if note:
            return value_error, grad_error, True, True, note
    return value_error, grad_error, value_error <= value_rtol, grad_ok, None


def kink_note(case, got_grad, exp_grad, v, conv, grad_rtol: float, grad_floor: float) -> str | None:
    """The note of a gradient inside the subdifferential at the kinks ``case`` sits on
    (policy_losses.md section 3, ``kinks.kink_subgradient_note``), None when it is not; the ratio is
    "on" a kink within the rounding of the dtype ``conv`` evaluates it in, the gradient inside within
    ``grad_rtol`` of the expected gradient's scale."""
    if not _finite(exp_grad):
        return None
    slack = grad_rtol * (float(exp_grad.abs().max()) + grad_floor) if exp_grad.numel() else 0.0
    return kink_subgradient_note(case, got_grad, exp_grad, v, conv, _ratio_dtype(case, conv), slack)


def run_policy_check(
    fn,
    name: str,
    variant: PolicyLossVariant,
    conv: Convention,
    *,
    adapter=None,
    classes: tuple[str, ...] | None = None,
    rtol: float,
    seed: int = 0,
    device: torch.device | str = "cpu",
    explain: dict | None = None,
    candidates: tuple = (),
    framework_config: dict | None = None,
    header: tuple[str, ...] = (),
) -> CheckReport:
    """The policy-loss check of ``fn`` on ``variant`` (already effective under ``conv``; ``name``
    its preset name) under ``conv`` (see ``checks.check_policy_loss``). ``candidates``: extra
    ``(label, variant, convention)`` alternatives the diagnosis tries (e.g. shipped profiles)."""
    v = variant
    adapter = adapter or contract_adapter
    config = {**dataclasses.asdict(v), "preset": name, "convention": {"name": conv.name, **conv.flags()}}
    config["framework_config"] = dict(framework_config or {})
    _preflight(fn, adapter, v, conv, config, device)
    # a job: (case, its normaliser, its golden vector); the golden vectors' expected values are stored
    jobs = [(case, None, None) for case in _cases.policy_loss_cases(v, conv, seed=seed, classes=classes)]
    if conv == Convention() and (classes is None or "golden_vectors" in classes):
        jobs += [(g.case, g.normalizer, g) for g in golden_cases(v)]

    def expect(job):
        case, _, golden = job
        if golden is not None:
            return golden.expected_loss, golden.expected_grad
        return expected_policy_loss(case, v, conv)

    def judge(job, expected, got, error):
        case, normalizer = job[0], job[1]
        exp_loss, exp_grad = expected
        base = {"dtype": str(case.logp.dtype).replace("torch.", ""), "expected": float(exp_loss)}
        if got is None:
            detail = case_text(case, [f"expected loss = {float(exp_loss)!r}"])
            result = dataclasses.replace(raised(case, detail, error), **base, case_line=case_line(case))
            if _raise_allowed(case, conv.zero_rows):  # the framework's named behaviour: a departure
                return dataclasses.replace(result, value_ok=True, grad_ok=True, error=None,
                                           detail=f"{detail}\n  raised {error}", departure=_RAISES)
            if explain and _raise_allowed(case, explain.get("zero_rows")):
                return dataclasses.replace(result, explanation=f"flag {_RAISES}")
            return result
        got_loss, got_grad = got
        value_error, grad_error, value_ok, grad_ok, departure = judge_policy(
            case, got_loss, got_grad, exp_loss, exp_grad, v, conv, rtol, normalizer
        )
        detail = case_text(
            case,
            [
                f"expected loss = {float(exp_loss)!r}",
                f"got loss      = {float(got_loss)!r}",
                tensor_text("expected d loss / d logp", exp_grad),
                tensor_text("got d loss / d logp", got_grad),
            ],
        )
        line = case_line(case, {"expected_loss": float(exp_loss), "got_loss": float(got_loss)})
        return CaseResult(
            case.case_id, case.case_class, case.size, value_error, grad_error, value_ok, grad_ok, detail,
            None, departure, got=float(got_loss), case_line=line, **base,
        )

    outcomes = run_cases(
        jobs,
        expect=expect,
        call=lambda job: user_policy_loss(fn, adapter, job[0], v, conv, config, job[1], device),
        judge=judge,
        device=device,
        what=_name(fn),
    )
    got_by_id = {o.item[0].case_id: (o.item[0], *o.got) for o in outcomes if o.got is not None}
    results = with_explanations(
        [o.result for o in outcomes], got_by_id, v, conv, name, rtol, explain, candidates, judge_policy,
        device,
    )
    notes = [f"{k}: reference {a!r} -> {conv.name} {b!r}" for k, (a, b) in conv.differences().items()]
    title = (
        f"policy loss: preset {name} ({describe_variant(v)}), convention {conv.name}, {len(results)} cases"
    )
    return CheckReport(title, tuple(results), tuple(notes), tuple(header), explain is not None)


def describe_variant(v: PolicyLossVariant) -> str:
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


def differences_report(
    name: str, v_conv, v_ref, conv: Convention, *, seed: int, rtol: float
) -> CheckReport:
    """Where ``conv``'s expected values depart from the spec's for one variant (``v_conv`` /
    ``v_ref``: the variant made effective under ``conv`` / the reference): see
    ``checks.convention_differences``."""
    reference = Convention()
    results = []
    for case in _cases.policy_loss_cases(v_conv, conv, seed=seed):
        ref_loss, ref_grad = expected_policy_loss(case, v_ref, reference)
        conv_loss, conv_grad = expected_policy_loss(case, v_conv, conv)
        value_rtol, grad_rtol = fixed_tolerances(case.logp.dtype, rtol)
        adv_scale = float(case.advantages.double().abs().max()) if case.advantages.numel() else 0.0
        floor = 1e-3 * max(adv_scale, 1e-3)
        value_error = relative_error(conv_loss, ref_loss, floor)
        denominator = max(convention_normalizer(case.mask, v_ref, reference), 1.0)
        grad_error = relative_error(conv_grad, ref_grad, floor / denominator)
        detail = case_text(
            case,
            [
                f"spec loss = {float(ref_loss)!r}",
                f"{conv.name} loss = {float(conv_loss)!r}",
                tensor_text("spec d loss / d logp", ref_grad),
                tensor_text(f"{conv.name} d loss / d logp", conv_grad),
            ],
        )
        result = judged(case, value_error, grad_error, value_rtol, grad_rtol, detail)
        note = result.value_ok and not result.grad_ok and kink_note(
            case, conv_grad, ref_grad, v_ref, reference, grad_rtol, floor / denominator)
        if note:
            result = dataclasses.replace(result, grad_ok=True, departure=note)  # not a departure
        allowed = _allowance(case, v_conv, conv)
        if _raise_allowed(case, conv.zero_rows):
            allowed = _RAISES
        if allowed in ("masked_nonfinite='propagate'", "ratio_overflow='nan'", "zero_rows='nan'", _RAISES):
            result = dataclasses.replace(result, value_ok=False, departure=allowed)
        results.append(result)
    notes = [f"{k}: reference {a!r} -> {conv.name} {b!r}" for k, (a, b) in conv.differences().items()]
    title = f"spec vs {conv.name} for preset {name}: errors of the {conv.name} numerics relative to the spec"
    return CheckReport(title, tuple(results), tuple(notes))

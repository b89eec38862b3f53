"""The checkers: feed every case class to a user's function and compare value and gradient.

``check_policy_loss(fn, preset, *, convention="reference", adapter=None)`` and friends return a
``CheckReport`` (table per case class, smallest failing case in full). The user's function is
called through an *adapter* ``adapter(fn, call) -> result`` that maps our call object to the
user's calling convention; the default adapters use the contract signatures of ARCHITECTURE.md.

Tolerances (float64 inputs): a case passes when ``|got - expected| <= rtol * (|expected| + s)``
elementwise-max, with ``rtol = 1e-8`` and a small magnitude floor ``s`` (1e-3 of the inputs' scale)
so that a loss that is ~0 by cancellation is compared on the scale of its terms. Half-precision
classes: the loss (a reduction, computed in at least float32 by contract) to ``1e-4``; the
gradient, returned in the input dtype, to two units in the last place of that dtype.
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
]

DEFAULT_RTOL = 1e-8
_HALF_VALUE_RTOL = 1e-4
_HALF_GRAD_RTOL = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


@dataclass(frozen=True)
class PolicyLossCall:
    """What an adapter receives for one (micro-)batch.

    ``logp`` is a leaf tensor with ``requires_grad=True`` (the kit differentiates the returned loss
    w.r.t. it); ``mask`` is bool; ``normalizer`` is the global denominator (a float) when the batch
    is a micro-batch under the global-normaliser convention, else None; ``config`` holds the
    variant's fields (eps_low, eps_high, dual_clip, tau_pos, tau_neg, aggregation, max_length,
    kl_coef, kl_estimator, ratio, gate) plus ``convention`` (the flag dict) and
    ``framework_config`` (TRL / verl keys for those profiles).
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
        return max(rtol, _HALF_VALUE_RTOL), max(rtol, _HALF_GRAD_RTOL[dtype])
    return rtol, rtol


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

    def on_device(x: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
        return None if x is None else x.to(device)[rows]

    loss = None
    for p in parts:
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
        )
        part = adapter(fn, call)
        if not isinstance(part, torch.Tensor) or part.numel() != 1:
            raise TypeError(f"the function must return a scalar loss tensor, got {type(part).__name__}")
        loss = part.reshape(()) if loss is None else loss + part.reshape(())
    if split and conv.micro_batch == "local_mean":
        loss = loss / len(parts)
    (grad,) = torch.autograd.grad(loss, logp, allow_unused=True)
    return loss.detach().cpu(), (torch.zeros_like(logp) if grad is None else grad).cpu()


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
) -> CheckReport:
    """Check a user's policy loss against ``preset`` under ``convention`` on every case class.

    Args:
        fn: the user's loss function (called through ``adapter``).
        preset: a preset name ("dapo", "grpo", ...) or a ``PolicyLossVariant``.
        convention: "reference" (the spec), "trl", "verl" or a ``Convention``.
        adapter: ``adapter(fn, call: PolicyLossCall) -> scalar loss``; default ``contract_adapter``.
        classes: restrict to these case classes (default: all that apply).
        kl_coef: override the preset's KL weight (> 0 adds the ``kl_penalty`` class).

    Under the reference convention the class ``golden_vectors`` adds the 50-digit vectors of
    ``specs/vectors/policy_loss.json`` whose variant equals the checked one (when the file exists).
        rtol: float64 tolerance (see the module docstring).
        device: where the user's function runs (inputs are moved there; expected values are
            computed on the CPU in float64).
    Returns:
        a ``CheckReport``; ``report.ok`` is True when every case passed.
    """
    name, variant = resolve_preset(preset, kl_coef=kl_coef)
    conv = profile(convention, name if name != "custom" else "grpo")
    v = effective_variant(variant, conv)
    adapter = adapter or contract_adapter
    config = {**dataclasses.asdict(v), "preset": name, "convention": dataclasses.asdict(conv)}
    if conv.name in ("trl", "verl"):
        from .conventions import framework_config

        config["framework_config"] = framework_config(conv.name, name, v)
    jobs = [
        (case, *expected_policy_loss(case, v, conv), None)
        for case in _cases.policy_loss_cases(v, conv, seed=seed, classes=classes)
    ]
    if conv == Convention() and (classes is None or "golden_vectors" in classes):
        jobs += [(g.case, g.expected_loss, g.expected_grad, g.normalizer) for g in golden_cases(v)]
    results = []
    for case, exp_loss, exp_grad, normalizer in jobs:
        (got, error) = _run_user(
            case,
            lambda case=case, n=normalizer: _user_policy_loss(fn, adapter, case, v, conv, config, n, device),
        )
        value_rtol, grad_rtol = _tolerances(case.logp.dtype, rtol)
        adv_scale = float(case.advantages.double().abs().max()) if case.advantages.numel() else 1.0
        floor = 1e-3 * max(adv_scale, 1e-3)
        if got is None:
            results.append(_raised(case, _case_text(case, [f"expected loss = {float(exp_loss)!r}"]), error))
            continue
        got_loss, got_grad = got
        value_error = _err(got_loss.reshape(()), exp_loss, floor)
        denom = max(_cases_denominator(case, v, conv), 1.0)
        grad_error = _err(got_grad, exp_grad, floor / denom)
        detail = _case_text(
            case,
            [
                f"expected loss = {float(exp_loss)!r}",
                f"got loss      = {float(got_loss)!r}",
                tensor_text("expected d loss / d logp", exp_grad),
                tensor_text("got d loss / d logp", got_grad),
            ],
        )
        results.append(_judged(case, value_error, grad_error, value_rtol, grad_rtol, detail))
    notes = [f"{k}: reference {a!r} -> {conv.name} {b!r}" for k, (a, b) in conv.differences().items()]
    title = f"policy loss: preset {name} ({_describe(v)}), convention {conv.name}, {len(results)} cases"
    return CheckReport(title, tuple(results), tuple(notes))


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


def check_group_advantages(
    fn: Callable,
    *,
    convention: str | Convention = "reference",
    adapter: Callable | None = None,
    rtol: float = DEFAULT_RTOL,
    seed: int = 0,
) -> CheckReport:
    """Check ``fn(rewards [N], group_ids [N]) -> advantages [N]`` (or via ``adapter(fn, case,
    convention)``) against ``group_advantages`` with the convention's std / eps / degenerate-group
    flags. A case where the convention raises (e.g. TRL's singleton groups) expects the user's
    function to raise too. Values only (advantages carry no gradient)."""
    conv = profile(convention)
    results = []
    for case in _cases.advantage_cases(seed=seed):
        try:
            expected, expected_error = expected_group_advantages(case, conv), None
        except ValueError as exc:
            expected, expected_error = None, str(exc)
        call = (
            (lambda case=case: adapter(fn, case, conv))
            if adapter
            else (lambda case=case: fn(case.rewards.clone(), case.group_ids.clone()))
        )
        got, error = _run_user(case, call)
        if expected is None:  # the convention rejects the batch: the user's function must raise too
            detail = _case_text(case, [f"expected: an error ({expected_error})"])
            ok = error is not None
            results.append(_value_only(case, 0.0 if ok else math.inf, ok, detail))
            continue
        if got is None:
            results.append(
                _value_only(
                    case, math.inf, False, _case_text(case, [tensor_text("expected", expected)]), error
                )
            )
            continue
        got_t = got if isinstance(got, torch.Tensor) else torch.as_tensor(got, dtype=torch.float64)
        value_error = _err(got_t, expected, 1e-3)
        detail = _case_text(
            case, [tensor_text("expected advantages", expected), tensor_text("got advantages", got_t)]
        )
        results.append(_value_only(case, value_error, value_error <= rtol, detail))
    title = (
        f"group advantages: convention {conv.name} (std={conv.adv_std}, eps={conv.adv_eps}, "
        f"eps_inside_sqrt={conv.adv_eps_inside_sqrt}, scale={conv.adv_scale})"
    )
    return CheckReport(title, tuple(results))


def check_kl(
    fn: Callable,
    estimator: str = "k3",
    *,
    convention: str | Convention = "reference",
    adapter: Callable | None = None,
    rtol: float = DEFAULT_RTOL,
    seed: int = 0,
) -> CheckReport:
    """Check a per-token KL estimator ``fn(logp, ref_logp) -> [N, T]`` (k1 / k2 / k3 of kl.md with
    ``log r = ref_logp - logp``; the convention's k3 clamps) by value and by its gradient in logp."""
    if estimator not in ("k1", "k2", "k3"):
        raise ValueError(f"estimator must be 'k1', 'k2' or 'k3', got {estimator!r}")
    conv = profile(convention)
    results = []
    for case in _cases.kl_cases(seed=seed):
        exp_value, exp_grad = expected_kl(case, estimator, conv)

        def compute(case=case):
            logp = case.logp.clone().requires_grad_(True)
            out = adapter(fn, logp, case.ref_logp.clone()) if adapter else fn(logp, case.ref_logp.clone())
            (grad,) = torch.autograd.grad(out.sum(), logp, allow_unused=True)
            return out.detach(), torch.zeros_like(logp) if grad is None else grad

        got, error = _run_user(case, compute)
        if got is None:
            results.append(_raised(case, _case_text(case, []), error))
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
        results.append(_judged(case, value_error, grad_error, rtol, rtol, detail))
    return CheckReport(f"KL estimator {estimator}: convention {conv.name}", tuple(results))


def check_token_logprobs(fn: Callable, *, rtol: float = DEFAULT_RTOL, seed: int = 0) -> CheckReport:
    """Check ``fn(logits [N, T, V], tokens [N, T]) -> [N, T]`` against the float64
    ``log_softmax(logits).gather(tokens)`` and its gradient in the logits (for a fixed cotangent)."""
    results = []
    for case in _cases.logprob_cases(seed=seed):
        exp_value, exp_grad = expected_token_logprobs(case)

        def compute(case=case):
            logits = case.logits.clone().requires_grad_(True)
            out = fn(logits, case.tokens.clone())
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
    return CheckReport("token_logprobs", tuple(results))


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
        results.append(_judged(case, value_error, grad_error, value_rtol, grad_rtol, detail))
    notes = [f"{k}: reference {a!r} -> {conv.name} {b!r}" for k, (a, b) in conv.differences().items()]
    title = f"spec vs {conv.name} for preset {name}: errors of the {conv.name} numerics relative to the spec"
    return CheckReport(title, tuple(results), tuple(notes))

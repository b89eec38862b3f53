"""The checkers of the kinds without a variant: group advantages, KL estimators, token log-probs.

Each is the engine's loop (``engine.run_cases``) with the kind's expected value, call and
judgement; each takes a ``Convention`` value (``checks`` resolves profile names), may be
restricted to some case classes (``classes``) and runs on a ``device`` (the function's inputs and
the float64 expected values computed there, judged on the CPU).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from . import cases as _cases
from .contract import SIGNATURES, call
from .conventions import Convention
from .engine import case_line, case_text, judged, preflight_first, raised, run_cases, value_only
from .expected import expected_kl, expected_token_logprobs
from .report import CheckReport, tensor_text
from .token_groups import expected_advantages
from .tolerance import HALF_GRAD_RTOL, fixed_tolerances, relative_error

__all__ = ["run_advantage_check", "run_kl_check", "run_logprob_check", "select_classes", "REFUSES_INFINITE"]

# the departure of a KL estimator that raises ValueError on the infinite_log_ratio class
REFUSES_INFINITE = "refuses an infinite log-probability (ValueError)"


def select_classes(cases: list, classes: tuple[str, ...] | None, kind: str) -> list:
    """The cases of ``classes`` (None: all); ValueError naming unknown classes."""
    if classes is None:
        return cases
    known = _cases.CASE_CLASSES[kind]
    unknown = sorted(set(classes) - set(known))
    if unknown:
        raise ValueError(f"unknown case classes {unknown}; valid: {known}")
    return [c for c in cases if c.case_class in classes]


def _tensor(out, kind: str) -> torch.Tensor:
    """``out`` when it is a tensor, else a one-line TypeError (the case's failure) with the contract."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"returned {'None' if out is None else 'a ' + type(out).__name__}, expected "
                        f"{SIGNATURES[kind]}")
    return out


def _notes(conv: Convention) -> tuple[str, ...]:
    return tuple(f"{k}: reference {a!r} -> {conv.name} {b!r}" for k, (a, b) in conv.differences().items())


def run_advantage_check(
    fn,
    conv: Convention,
    *,
    adapter=None,
    rtol: float,
    seed: int = 0,
    classes: tuple[str, ...] | None = None,
    header: tuple[str, ...] = (),
    device: torch.device | str = "cpu",
) -> CheckReport:
    """``fn(rewards [N], group_ids [N]) -> advantages [N]`` against ``group_advantages`` with the
    convention's advantage flags (see ``checks.check_group_advantages``)."""
    all_cases = _cases.advantage_cases(seed=seed)
    preflight_first(
        "group_advantages", fn, adapter, all_cases[0], ("rewards", "group_ids"), "rewards", device
    )

    def expect(case):
        try:
            return expected_advantages(case, conv), None
        except ValueError as exc:
            return None, str(exc)

    def judge(case, expected, got, error):
        expected, expected_error = expected
        line = case_line(case)
        if expected is None:  # the convention rejects the batch: the user's function must raise too
            detail = case_text(case, [f"expected: an error ({expected_error})"])
            ok = error is not None
            return dataclasses.replace(value_only(case, 0.0 if ok else math.inf, ok, detail), case_line=line)
        if got is None:
            detail = case_text(case, [tensor_text("expected", expected)])
            return dataclasses.replace(value_only(case, math.inf, False, detail, error), case_line=line)
        got_t = got if isinstance(got, torch.Tensor) else torch.as_tensor(got, dtype=torch.float64)
        value_error = relative_error(got_t, expected, 1e-3)
        detail = case_text(
            case, [tensor_text("expected advantages", expected), tensor_text("got advantages", got_t)]
        )
        return dataclasses.replace(value_only(case, value_error, value_error <= rtol, detail), case_line=line)

    outcomes = run_cases(
        select_classes(all_cases, classes, "group_advantages"),
        expect=expect,
        call=lambda case: call(fn, adapter, *_advantage_inputs(case, adapter)),
        judge=judge,
        device=device,
        what=getattr(fn, "__qualname__", type(fn).__name__),
    )
    title = (
        f"group advantages: convention {conv.name} (std={conv.adv_std}, eps={conv.adv_eps}, "
        f"eps_inside_sqrt={conv.adv_eps_inside_sqrt}, scale={conv.adv_scale}, "
        f"leave_one_out={conv.adv_leave_one_out})"
    )
    return CheckReport(title, tuple(o.result for o in outcomes), _notes(conv), tuple(header))


def _advantage_inputs(case, adapter) -> tuple:
    """``(rewards, group_ids)``, and the responses' token counts for an adapter that takes them
    (``adapter.takes_lengths``: a framework whose advantages are per token; one token each when the
    case has none)."""
    inputs = (case.rewards.clone(), case.group_ids.clone())
    if not getattr(adapter, "takes_lengths", False):
        return inputs
    lengths = torch.ones_like(case.group_ids) if case.lengths is None else case.lengths.clone()
    return (*inputs, lengths.to(case.rewards.device))


def _float32_evaluation(case, got, expected):
    """``got`` with each entry that another float32 evaluation of the naive k3 ``exp(d) - d - 1`` may
    give taken as the expected one (``kl_compute_dtype="float32"``, ``kl_k3_form="naive"``: the expected
    value is torch's float32 evaluation, rounding noise at small ``d = ref - logp``, kl.md eq. (4)). Its
    terms ``exp(d)``, ``d`` and 1 meet in two rounded subtractions, ``exp`` within one ulp (XLA's and
    torch's differ there): the entry is within ``4 u (exp(d) + |d| + 1)``, u = 2^-24, of torch's. At
    ``d = +inf`` the form is ``inf - inf``, indeterminate: any non-finite value is that form's (torch
    gives NaN, XLA's compiled form -inf). The accurate form (expm1) and k1 / k2 are judged as before."""
    d = (case.ref_logp.float() - case.logp.float()).double()
    finite = torch.isfinite(d)
    slack = 4 * 2.0**-24 * torch.where(finite, d.exp() + d.abs() + 1, math.inf)
    out = []
    for g, e in zip(got, expected, strict=True):
        g64, e64 = g.detach().double(), e.double()
        close = finite & torch.isfinite(g64) & ((g64 - e64).abs() <= slack)
        close = close | (torch.isnan(e64) & ~torch.isfinite(g64) & ~finite)
        out.append(torch.where(close, e64, g64))
    return tuple(out)


def run_kl_check(
    fn,
    estimator: str,
    conv: Convention,
    *,
    adapter=None,
    rtol: float,
    seed: int = 0,
    classes: tuple[str, ...] | None = None,
    header: tuple[str, ...] = (),
    device: torch.device | str = "cpu",
) -> CheckReport:
    """A per-token KL estimator ``fn(logp, ref_logp) -> [N, T]`` by value and gradient in logp
    (see ``checks.check_kl``)."""
    all_cases = _cases.kl_cases(seed=seed)
    preflight_first("kl", fn, adapter, all_cases[0], ("logp", "ref_logp"), "logp", device)

    def compute(case):
        logp = case.logp.clone().requires_grad_(True)
        out = _tensor(call(fn, adapter, logp, case.ref_logp.clone()), "kl")
        if not out.requires_grad:
            return out.detach(), torch.zeros_like(logp)
        (grad,) = torch.autograd.grad(out.sum(), logp, allow_unused=True)
        return out.detach(), torch.zeros_like(logp) if grad is None else grad

    def judge(case, expected, got, error):
        if got is None and case.case_class == "infinite_log_ratio" and error.startswith("ValueError"):
            # an estimator may refuse an infinite log-probability in one line (refimpl.kl does): no
            # silent NaN; a clamp (verl) or the limit is checked on the value it returns instead
            refused = value_only(case, 0.0, True, case_text(case, []))
            return dataclasses.replace(refused, case_line=case_line(case), departure=REFUSES_INFINITE)
        if got is None:
            return dataclasses.replace(raised(case, case_text(case, []), error), case_line=case_line(case))
        exp_value, exp_grad = expected
        if conv.kl_compute_dtype == "float32" and conv.kl_k3_form == "naive" and estimator == "k3":
            got = _float32_evaluation(case, got, expected)
        floor = 1e-4
        value_error, grad_error = (
            relative_error(got[0], exp_value, floor),
            relative_error(got[1], exp_grad, floor),
        )
        detail = case_text(
            case,
            [
                tensor_text("expected", exp_value),
                tensor_text("got", got[0]),
                tensor_text("expected d/d logp", exp_grad),
                tensor_text("got d/d logp", got[1]),
            ],
        )
        return dataclasses.replace(
            judged(case, value_error, grad_error, rtol, rtol, detail), case_line=case_line(case)
        )

    outcomes = run_cases(
        select_classes(all_cases, classes, "kl"),
        expect=lambda case: expected_kl(case, estimator, conv),
        call=compute,
        judge=judge,
        device=device,
        what=getattr(fn, "__qualname__", type(fn).__name__),
    )
    return CheckReport(
        f"KL estimator {estimator}: convention {conv.name}",
        tuple(o.result for o in outcomes),
        _notes(conv),
        tuple(header),
    )


def run_logprob_check(
    fn,
    *,
    adapter=None,
    rtol: float,
    seed: int = 0,
    classes: tuple[str, ...] | None = None,
    header: tuple[str, ...] = (),
    device: torch.device | str = "cpu",
) -> CheckReport:
    """``fn(logits [N, T, V], tokens [N, T]) -> [N, T]`` against the float64 log-softmax and its
    gradient (see ``checks.check_token_logprobs``)."""
    all_cases = _cases.logprob_cases(seed=seed)
    preflight_first("token_logprobs", fn, adapter, all_cases[0], ("logits", "tokens"), "tokens", device)

    def compute(case):
        logits = case.logits.clone().requires_grad_(True)
        out = _tensor(call(fn, adapter, logits, case.tokens.clone()), "token_logprobs")
        (grad,) = torch.autograd.grad((out.double() * case.weights).sum(), logits)
        return out.detach(), grad

    def judge(case, expected, got, error):
        value_rtol, grad_rtol = fixed_tolerances(case.logits.dtype, rtol)
        if case.logits.dtype in HALF_GRAD_RTOL:
            value_rtol = 1e-6  # log-probs of rounded logits, computed in float32
        if got is None:
            return raised(case, case_text(case, []), error)
        exp_value, exp_grad = expected
        value_error, grad_error = (
            relative_error(got[0], exp_value, 1e-3),
            relative_error(got[1], exp_grad, 1e-3),
        )
        detail = case_text(case, [tensor_text("expected", exp_value), tensor_text("got", got[0])])
        return judged(case, value_error, grad_error, value_rtol, grad_rtol, detail)

    outcomes = run_cases(
        select_classes(all_cases, classes, "token_logprobs"),
        expect=expected_token_logprobs,
        call=compute,
        judge=judge,
        device=device,
        what=getattr(fn, "__qualname__", type(fn).__name__),
    )
    return CheckReport("token_logprobs", tuple(o.result for o in outcomes), (), tuple(header))

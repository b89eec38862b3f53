"""Diagnosis: which simple alternative reproduces a failing case exactly.

For the smallest failing case of each failing class, the alternatives are tried in order: the
flags of a framework mode's profile (``explain``: one at a time, then all together), the other
aggregations, and, for a user's function (``explain`` None), the common mistakes (``mistakes``: no
clip-higher, float32 arithmetic, a missing KL term or another estimator; then a flipped sign of the
loss or of the advantages), common framework flags and the ``candidates`` the caller adds (the
shipped profiles). The first whose expected loss and gradient pass the check's own judgement is
named in ``CaseResult.explanation``. For kinds without a per-case diagnosis ``explained_by_rerun``
reruns the check with each flag. The alternatives' expected values are computed on the check's
device, as the check's own (``engine.expected_on``).
"""

from __future__ import annotations

import dataclasses

from refimpl.losses import AGGREGATIONS, PolicyLossVariant

from .conventions import Convention
from .engine import expected_on
from .expected import effective_variant, expected_policy_loss
from .report import CaseResult

__all__ = ["diagnosis_candidates", "mistakes", "explain_case", "with_explanations", "explained_by_rerun"]

KL_ESTIMATORS = ("k1", "k2", "k3")


def mistakes(v: PolicyLossVariant, conv: Convention) -> list:
    """(label, variant, convention) of the common mistakes in writing ``v`` (the variant changed to
    what the mistaken code computes): clip-higher missing (eps_high = eps_low; DAPO, Yu et al. 2025),
    the loss computed in float32 whatever the inputs, the KL term missing or of another estimator
    (kl.md eqs. (2)-(4))."""
    out = []
    if v.gate == "clip" and None not in (v.eps_low, v.eps_high) and v.eps_high != v.eps_low:
        out.append(("eps_high = eps_low (no clip-higher)", dataclasses.replace(v, eps_high=v.eps_low), conv))
    if conv.compute_dtype != "float32":
        out.append(("float32 arithmetic (flag compute_dtype='float32')", v,
                    dataclasses.replace(conv, compute_dtype="float32")))
    if v.kl_coef > 0:
        out.append(("no KL term (kl_coef 0)", dataclasses.replace(v, kl_coef=0.0), conv))
        out.extend((f"the KL estimator {k!r}", dataclasses.replace(v, kl_estimator=k), conv)
                   for k in KL_ESTIMATORS if k != v.kl_estimator)
    return out


def diagnosis_candidates(
    v: PolicyLossVariant, conv: Convention, explain: dict | None, candidates: tuple = ()
):
    """(label, variant, convention) alternatives tried on a failing case, the named flags first."""
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
        out.extend(mistakes(v, conv))
        generic = {
            "empty_rows": "keep",
            "seq_sum_width": "padded_width",
            "token_sum_rows": "all",
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
        out.extend(candidates)
    return out


def explain_case(
    case, got_loss, got_grad, v, conv, rtol, explain, candidates, judge, device="cpu"
) -> str | None:
    """Which alternative (a convention flag, another aggregation, a shipped profile) reproduces the
    failing case's loss and gradient to the check's tolerance; None when none does. Expected values
    are computed on ``device`` (the check's)."""
    for label, variant, candidate in diagnosis_candidates(v, conv, explain, candidates):
        try:
            ev = effective_variant(variant, candidate)
            exp_loss, exp_grad = expected_on(device, expected_policy_loss, case, ev, candidate)
        except (ValueError, TypeError, RuntimeError):
            continue
        _, _, value_ok, grad_ok, _ = judge(
            case, got_loss, got_grad, exp_loss, exp_grad, ev, candidate, rtol
        )
        if value_ok and grad_ok:
            return f"matches {label}"
    if explain is None:
        flipped = _sign_flip(case, got_loss, got_grad, v, conv, rtol, judge, device)
        if flipped:
            return flipped
    if case.micro_batches and conv.micro_batch == "global":
        # the kit passed the global normaliser and summed the parts: a function that ignores
        # ``normalizer`` returns the sum of the micro-batches' local means
        local = dataclasses.replace(conv, micro_batch="local_mean")
        exp_loss, exp_grad = expected_on(device, expected_policy_loss, case, v, local)
        parts = len(case.micro_batches)
        _, _, value_ok, grad_ok, _ = judge(
            case, got_loss, got_grad, exp_loss * parts, exp_grad * parts, v, local, rtol
        )
        if value_ok and grad_ok:
            return "matches local means per micro-batch: the normalizer argument is ignored"
    return None


def _sign_flip(case, got_loss, got_grad, v, conv, rtol, judge, device) -> str | None:
    """A flipped sign: of the whole loss (expected loss and gradient negated) or of the advantages
    (the expected value of the case with -A); inside the clip the two agree, and the label says so."""
    def passes(c, loss, grad):
        _, _, value_ok, grad_ok, _ = judge(c, got_loss, got_grad, loss, grad, v, conv, rtol)
        return value_ok and grad_ok

    try:
        exp_loss, exp_grad = expected_on(device, expected_policy_loss, case, v, conv)
        negated = dataclasses.replace(case, advantages=-case.advantages)
        adv_loss, adv_grad = expected_on(device, expected_policy_loss, negated, v, conv)
    except (ValueError, TypeError, RuntimeError):
        return None
    loss_flip = passes(case, -exp_loss, -exp_grad)
    adv_flip = passes(negated, adv_loss, adv_grad)
    if loss_flip and adv_flip:
        return "matches a flipped sign (of the advantages or of the loss: the same on this case)"
    if adv_flip:
        return "matches the advantages' sign flipped"
    return "matches the loss's sign flipped" if loss_flip else None


def with_explanations(
    results, got_by_id, v, conv, name, rtol, explain, candidates, judge, device="cpu"
) -> list[CaseResult]:
    """Diagnose the smallest failing case of each failing class (``explain_case``, on ``device``)."""
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
        explained[r.case_id] = explain_case(
            case, got_loss, got_grad, v, conv, rtol, explain, candidates, judge, device
        ) or (
            "unexplained" if explain is not None else None
        )
    return [
        dataclasses.replace(r, explanation=explained[r.case_id]) if r.case_id in explained else r
        for r in results
    ]


def explained_by_rerun(report, conv, flags: dict, run):
    """Name, for each failing class of ``report``, the first of ``flags`` (one at a time, then all
    together) under which ``run(conv + flag)`` passes that class, or ``unexplained``; the report then
    lists every departure (for the kinds whose values carry no per-case diagnosis)."""
    trials = [{k: v} for k, v in flags.items()] + ([flags] if len(flags) > 1 else [])
    passing = []
    for trial in trials:
        try:
            candidate = dataclasses.replace(conv, **trial)
        except (TypeError, ValueError):
            continue
        label = ("flag " if len(trial) == 1 else "flags ") + ", ".join(f"{k}={v!r}" for k, v in trial.items())
        passing.append((label, {c.case_class for c in run(candidate).by_class() if c.ok}))
    why = {
        name: next((label for label, ok in passing if name in ok), "unexplained")
        for name in report.failing_classes()
    }
    results = tuple(
        dataclasses.replace(r, explanation=why[r.case_class]) if not r.ok and r.case_class in why else r
        for r in report.results
    )
    return dataclasses.replace(report, results=results, list_departures=True)

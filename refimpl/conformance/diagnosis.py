"""Diagnosis: which simple alternative reproduces a failure exactly.

Two uses, one set of alternatives (each computes the expected loss and gradient of a case as the
alternative would, judged by the check's own ``judge``):

* a framework mode under the reference (``explain``: the mode's profile flags): each failing class is
  a departure, attributed to the **smallest** set of the profile's flags that reproduces its smallest
  failing case exactly: each flag alone, then each pair, then, when only more flags together do,
  the whole set shrunk one flag at a time to an irreducible subset; never "all of the mode's
  flags" when fewer do. Then the other aggregations; ``unexplained`` when none does.
* a user's function (``explain`` None): one diagnosis for the whole report, printed only when a
  single alternative reproduces the smallest failing case of **every** failing class (a
  per-class guess misleads: a loose half-precision tolerance "explains" many a bug). The
  alternatives, in order: each convention flag alone (generic values and every shipped profile's
  values, ``candidates``), the other aggregations, the common mistakes (``mistakes``: no
  clip-higher, float32 arithmetic, a missing KL term, another estimator, a KL term averaged over
  every position padding included, a detached ratio, a ``ratio.detach()`` in one branch of the
  clip), a flipped sign (of the loss or of the advantages), the normaliser ignored by
  micro-batches, then the shipped profiles themselves. When none reproduces every failing class
  the smallest failing case says so (``NO_DIAGNOSIS``).

For kinds without a per-case diagnosis ``explained_by_rerun`` reruns the check with each flag. The
alternatives' expected values are computed on the check's device (``engine.expected_on``).
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from refimpl.kl import kl_k1, kl_k2, kl_k3
from refimpl.losses import AGGREGATIONS, PolicyLossVariant

from .conventions import Convention
from .engine import expected_on
from .expected import effective_variant, expected_policy_loss
from .report import CaseResult

__all__ = ["diagnosis_candidates", "mistakes", "explain_case", "with_explanations", "explained_by_rerun",
           "minimal_flags", "NO_DIAGNOSIS"]

KL_ESTIMATORS = ("k1", "k2", "k3")
_KL = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
NO_DIAGNOSIS = ("no single flag, aggregation, common mistake or profile reproduces every failing class "
                "(a combination, or another mistake)")
#: flags a user's function often departs by, with the value tried (besides the shipped profiles')
_GENERIC = {
    "empty_rows": "keep",
    "seq_sum_width": "padded_width",
    "token_sum_rows": "all",
    "log_ratio_clamp": 20.0,
    "dual_clip": 3.0,
    "sequence_ratio_gradient": "token",
    "masked_nonfinite": "propagate",
    "compute_dtype": "input",
}


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


def _flag_label(flags: dict) -> str:
    return ("flag " if len(flags) == 1 else "flags ") + ", ".join(f"{k}={val!r}" for k, val in flags.items())


def _with_flags(v, conv: Convention, flags: dict):
    """(label, variant, convention) with ``flags`` set, None when a flag or value is invalid."""
    try:
        return (_flag_label(flags), v, dataclasses.replace(conv, **flags))
    except (TypeError, ValueError):
        return None


def _aggregations(v: PolicyLossVariant, conv: Convention) -> list:
    out = []
    for agg in AGGREGATIONS:  # every aggregation is valid with any variant (seq_sum given an L_max)
        if agg == v.aggregation:
            continue
        extra = {"max_length": v.max_length or 16} if agg == "seq_sum" else {}
        out.append((f"aggregation {agg!r}", dataclasses.replace(v, aggregation=agg, **extra), conv))
    return out


def _user_flag_values(conv: Convention, candidates: tuple) -> list[tuple[str, object]]:
    """(flag, value) pairs a user's function is tried with, one flag at a time: the generic values,
    then each shipped profile's values that differ from ``conv`` (so that a profile is named by the
    flag that makes the difference, never as a whole when one flag does)."""
    values = {flag: [value] for flag, value in _GENERIC.items()}
    values["micro_batch"] = ["local_mean" if conv.micro_batch == "global" else "global"]
    for _, _, other in candidates:
        for flag, value in other.flags().items():
            if value != getattr(conv, flag) and value not in values.setdefault(flag, []):
                values[flag].append(value)
    return [(flag, value) for flag, options in values.items() for value in options
            if getattr(conv, flag) != value]


def _user_flags(v, conv: Convention, candidates: tuple) -> list:
    pairs = _user_flag_values(conv, candidates)
    return [alt for flag, value in pairs if (alt := _with_flags(v, conv, {flag: value}))]


def diagnosis_candidates(
    v: PolicyLossVariant, conv: Convention, explain: dict | None, candidates: tuple = ()
):
    """(label, variant, convention) alternatives tried on a failing case. A framework mode
    (``explain``): its flags one at a time, then in pairs, then the other aggregations. A user's
    function: single flags (``_user_flags``), the aggregations, the mistakes, the shipped profiles."""
    if explain is not None:
        flags = {k: val for k, val in explain.items() if _with_flags(v, conv, {k: val})}  # valid ones
        subsets = [dict([p]) for p in flags.items()]
        subsets += [dict(pair) for pair in itertools.combinations(flags.items(), 2)]
        return [alt for s in subsets if (alt := _with_flags(v, conv, s))] + _aggregations(v, conv)
    return [*_user_flags(v, conv, candidates), *_aggregations(v, conv), *mistakes(v, conv), *candidates]


_FLOAT32_MAX = torch.finfo(torch.float32).max


def _reproduces(case, got_loss, got_grad, expected, ev, candidate, rtol, judge) -> bool | None:
    """True / False: the alternative's ``expected`` reproduces the got values or not; None when the
    case cannot tell (a reduced-precision case whose alternative value lies past float32's range,
    e.g. a flipped sign opening the gate on a ratio of e^95: no float32 code can return it)."""
    exp_loss, exp_grad = expected
    if case.logp.dtype != torch.float64:
        big = max(abs(float(exp_loss)), float(exp_grad.abs().max()) if exp_grad.numel() else 0.0)
        if not big <= _FLOAT32_MAX:
            return None
    _, _, value_ok, grad_ok, _ = judge(case, got_loss, got_grad, exp_loss, exp_grad, ev, candidate, rtol)
    return value_ok and grad_ok


def _variant_check(variant, candidate, device, parts_local: bool = False):
    """``check(case, got_loss, got_grad, rtol, judge) -> bool | None`` of one (variant, convention).
    ``parts_local`` (another aggregation): on micro-batches the kit hands the checked aggregation's
    global normaliser, which means nothing to another one: the sum of each part's own value matches,
    and any other value cannot tell (None)."""
    def check(case, got_loss, got_grad, rtol, judge):
        try:
            ev = effective_variant(variant, candidate)
            expected = expected_on(device, expected_policy_loss, case, ev, candidate)
        except (ValueError, TypeError, RuntimeError):
            return False
        out = _reproduces(case, got_loss, got_grad, expected, ev, candidate, rtol, judge)
        if out is False and parts_local and case.micro_batches and candidate.micro_batch == "global":
            # the sum of local values, or a function that divided by a normaliser it was handed for
            # another aggregation: the case cannot tell (None)
            return _ignored_normaliser(ev, candidate, device)(case, got_loss, got_grad, rtol, judge) or None
        return out
    return check


def minimal_flags(case, got_loss, got_grad, v, conv, rtol, flags: dict, judge, device="cpu") -> dict | None:
    """The whole set ``flags`` shrunk one flag at a time (in order) while it still reproduces the
    case: an irreducible subset (no flag can be dropped), None when the whole set does not reproduce."""
    def works(subset):
        alt = _with_flags(v, conv, subset) if subset else None
        check = _variant_check(alt[1], alt[2], device) if alt is not None else None
        return check is not None and check(case, got_loss, got_grad, rtol, judge)

    if len(flags) < 3 or not works(flags):
        return None
    kept = dict(flags)
    for flag in list(flags):
        trial = {k: val for k, val in kept.items() if k != flag}
        if trial and works(trial):
            kept = trial
    return kept


def explain_case(
    case, got_loss, got_grad, v, conv, rtol, explain, candidates, judge, device="cpu"
) -> str | None:
    """Which alternative reproduces the failing case's loss and gradient to the check's tolerance
    (``diagnosis_candidates``, then for a framework the irreducible subset of its flags, for a user
    the special mistakes and the ignored normaliser); None when none does. Expected values are
    computed on ``device`` (the check's)."""
    for label, check in _alternatives(v, conv, explain, candidates, device, case):
        if check(case, got_loss, got_grad, rtol, judge):  # None (cannot tell) is no match here
            return f"matches {label}"
    if explain:
        kept = minimal_flags(case, got_loss, got_grad, v, conv, rtol, explain, judge, device)
        if kept:
            return f"matches {_flag_label(kept)}"
    return None


def _alternatives(v, conv, explain, candidates, device, case=None):
    """(label, check) of every alternative, in the order of the module docstring."""
    out = [(label, _variant_check(variant, candidate, device, label.startswith("aggregation")))
           for label, variant, candidate in diagnosis_candidates(v, conv, explain, candidates)]
    if explain is not None:
        return out + [("local means per micro-batch: the normalizer argument is ignored",
                       _ignored_normaliser(v, conv, device))]
    flags_end = len(_user_flags(v, conv, candidates)) + len(_aggregations(v, conv)) + len(mistakes(v, conv))
    special = [*_special_mistakes(v, conv, device), *_sign_flips(v, conv, device),
               ("local means per micro-batch: the normalizer argument is ignored",
                _ignored_normaliser(v, conv, device))]
    return out[:flags_end] + special + out[flags_end:]


def _ignored_normaliser(v, conv, device):
    """The kit passed the global normaliser and summed the parts: a function that ignores
    ``normalizer`` returns the sum of the micro-batches' local means."""
    def check(case, got_loss, got_grad, rtol, judge):
        if not case.micro_batches or conv.micro_batch != "global":
            return False
        local = dataclasses.replace(conv, micro_batch="local_mean")
        exp_loss, exp_grad = expected_on(device, expected_policy_loss, case, v, local)
        parts = len(case.micro_batches)
        summed = (exp_loss * parts, exp_grad * parts)
        return _reproduces(case, got_loss, got_grad, summed, v, local, rtol, judge)
    return check


def _sign_flips(v, conv, device):
    """A flipped sign: of the advantages (the expected value of the case with -A) or of the whole loss
    (expected loss and gradient negated); inside the clip the two agree."""
    def loss_flip(case, got_loss, got_grad, rtol, judge):
        exp_loss, exp_grad = expected_on(device, expected_policy_loss, case, v, conv)
        return _reproduces(case, got_loss, got_grad, (-exp_loss, -exp_grad), v, conv, rtol, judge)

    def adv_flip(case, got_loss, got_grad, rtol, judge):
        negated = dataclasses.replace(case, advantages=-case.advantages)
        expected = expected_on(device, expected_policy_loss, negated, v, conv)
        return _reproduces(negated, got_loss, got_grad, expected, v, conv, rtol, judge)

    def both(case, got_loss, got_grad, rtol, judge):
        return bool(loss_flip(case, got_loss, got_grad, rtol, judge)
                    and adv_flip(case, got_loss, got_grad, rtol, judge))

    return [("a flipped sign (of the advantages or of the loss: the same on this case)", both),
            ("the advantages' sign flipped", adv_flip), ("the loss's sign flipped", loss_flip)]


def _special_mistakes(v, conv, device):
    """Mistakes that no variant or flag expresses: no gradient at all (a detached ratio or loss);
    ``torch.clamp(ratio.detach(), ...)`` in the clipped branch (``torch.min`` splits the gradient of
    every tied token, inside the clip band and on its bounds: half of it there); the KL term
    averaged over every position of the padded batch (``kl.mean()``, padding included)."""
    def scaled(scale_of):
        def check(case, got_loss, got_grad, rtol, judge):
            exp_loss, exp_grad = expected_on(device, expected_policy_loss, case, v, conv)
            scale = scale_of(case)
            if scale is None:
                return False
            return _reproduces(case, got_loss, got_grad, (exp_loss, exp_grad * scale), v, conv, rtol, judge)
        return check

    def tied(case):  # tokens whose clamp is inactive: r inside [1 - eps_low, 1 + eps_high]
        if v.gate != "clip" or v.ratio != "token" or None in (v.eps_low, v.eps_high):
            return None
        r = torch.exp(case.logp.double() - case.old_logp.double())
        inside = case.mask & (r >= 1.0 - v.eps_low) & (r <= 1.0 + v.eps_high)
        return torch.where(inside, 0.5, 1.0) if bool(inside.any()) else None

    out = [("no gradient at all (a detached ratio or loss)", scaled(lambda case: 0.0)),
           ("ratio.detach() in the clipped branch (the gradient halved where the two branches tie)",
            scaled(tied))]
    if v.kl_coef > 0:
        out.append(("the KL term averaged over every position, padding included (kl.mean())",
                    _unmasked_kl(v, conv, device)))
    return out


def _unmasked_kl(v, conv, device):
    policy = dataclasses.replace(v, kl_coef=0.0)

    def expected(case):
        loss, grad = expected_policy_loss(case, policy, conv)
        logp = case.logp.detach().double().requires_grad_(True)
        parts = case.micro_batches or (tuple(range(case.logp.shape[0])),)
        term = sum(_KL[v.kl_estimator](logp[list(p)], case.ref_logp.double()[list(p)], check_finite=False)
                   .mean() * v.kl_coef for p in parts)  # a mean over no position is NaN, as in the code
        if conv.micro_batch == "local_mean":
            term = term / len(parts)
        if not torch.is_tensor(term):
            return loss, grad
        (extra,) = torch.autograd.grad(term, logp)
        return loss + term.detach(), grad + extra

    def check(case, got_loss, got_grad, rtol, judge):
        if case.ref_logp is None:
            return False
        try:
            exp = expected_on(device, expected, case)
        except (ValueError, TypeError, RuntimeError):
            return False
        return _reproduces(case, got_loss, got_grad, exp, v, conv, rtol, judge)
    return check


def _smallest_failures(results, got_by_id) -> dict[str, CaseResult]:
    smallest: dict[str, CaseResult] = {}
    for r in results:
        if not r.ok and r.case_id in got_by_id and r.case_class != "golden_vectors":
            if r.case_class not in smallest or (r.size, r.case_id) < (
                smallest[r.case_class].size,
                smallest[r.case_class].case_id,
            ):
                smallest[r.case_class] = r
    return smallest


def with_explanations(
    results, got_by_id, v, conv, name, rtol, explain, candidates, judge, device="cpu"
) -> list[CaseResult]:
    """Diagnose the smallest failing case of each failing class: per class for a framework mode
    (``explain_case``), for a user's function one alternative for every class (module docstring)."""
    smallest = _smallest_failures(results, got_by_id)
    explained = {}
    if explain is not None:
        for r in smallest.values():
            case, got_loss, got_grad = got_by_id[r.case_id]
            explained[r.case_id] = explain_case(
                case, got_loss, got_grad, v, conv, rtol, explain, candidates, judge, device
            ) or "unexplained"
    elif smallest:
        ordered = sorted(smallest.values(), key=lambda r: (r.size, r.case_id))  # cheapest first
        label = _global_diagnosis([got_by_id[r.case_id] for r in ordered], v, conv, rtol,
                                  candidates, judge, device)
        explained = {r.case_id: f"matches {label}" if label else NO_DIAGNOSIS for r in smallest.values()}
    return [
        dataclasses.replace(r, explanation=explained[r.case_id]) if r.case_id in explained else r
        for r in results
    ]


def _flag_pairs(v, conv: Convention, candidates: tuple, device, failures):
    """(label, check) of two different flags of ``_user_flag_values`` together, each of which alone
    changes the expected value of some failing case (a flag that changes none cannot help a pair):
    tried only when no single alternative reproduces every failing class (e.g. verl's loss called
    without its global batch info: empty rows dropped and each micro-batch its own mean)."""
    def expected(candidate, case):
        try:
            return expected_on(device, expected_policy_loss, case, effective_variant(v, candidate), candidate)
        except (ValueError, TypeError, RuntimeError):
            return None

    base = [expected(conv, case) for case, _, _ in failures]
    useful = []
    for flag, value in _user_flag_values(conv, candidates):
        alt = _with_flags(v, conv, {flag: value})
        if alt is None:
            continue
        for (case, _, _), ref in zip(failures, base, strict=True):
            got = expected(alt[2], case)
            if got is not None and ref is not None and not (
                    torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])):
                useful.append((flag, value))
                break
    out = []
    for (a, va), (b, vb) in itertools.combinations(useful, 2):
        if a != b and (alt := _with_flags(v, conv, {a: va, b: vb})):
            out.append((alt[0], _variant_check(alt[1], alt[2], device)))
    return out


def _global_diagnosis(failures, v, conv, rtol, candidates, judge, device) -> str | None:
    """The first alternative that reproduces every ``(case, got_loss, got_grad)`` (single ones first,
    then two flags together); None if none does."""
    label = _first_reproducing(_alternatives(v, conv, None, candidates, device), failures, rtol, judge)
    if label is None:
        label = _first_reproducing(_flag_pairs(v, conv, candidates, device, failures), failures, rtol, judge)
    return label


def _first_reproducing(alternatives, failures, rtol, judge) -> str | None:
    """The label of the first alternative that reproduces every failure (None: a case that cannot
    tell; at least one must)."""
    for label, check in alternatives:
        verdicts = []
        try:
            for case, loss, grad in failures:  # stops at the first case it does not reproduce
                verdicts.append(check(case, loss, grad, rtol, judge))
                if verdicts[-1] is False:
                    break
        except (ValueError, TypeError, RuntimeError):
            continue
        if True in verdicts and False not in verdicts:
            return label.replace("on this case", "on these cases") if len(failures) > 1 else label
    return None


def explained_by_rerun(report, conv, flags: dict, run):
    """Name, for each failing class of ``report``, the smallest set of ``flags`` (one at a time, then
    in pairs, then all together) under which ``run(conv + flags)`` passes that class, or
    ``unexplained``; the report then lists every departure (for the kinds whose values carry no
    per-case diagnosis)."""
    items = list(flags.items())
    trials = [dict([p]) for p in items]
    if len(items) > 1:
        trials += [dict(pair) for pair in itertools.combinations(items, 2)]
    if len(items) > 2:
        trials.append(dict(flags))
    passing = []
    for trial in trials:
        try:
            candidate = dataclasses.replace(conv, **trial)
        except (TypeError, ValueError):
            continue
        passing.append((_flag_label(trial), {c.case_class for c in run(candidate).by_class() if c.ok}))
    why = {
        name: next((label for label, ok in passing if name in ok), "unexplained")
        for name in report.failing_classes()
    }
    results = tuple(
        dataclasses.replace(r, explanation=why[r.case_class]) if not r.ok and r.case_class in why else r
        for r in report.results
    )
    return dataclasses.replace(report, results=results, list_departures=True)

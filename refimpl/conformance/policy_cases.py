"""The policy-loss case classes (``POLICY_CASE_CLASSES``): one generator per class.

Each generator returns the cases of one class for a variant, built in float64 from a fixed seed;
see ``refimpl.conformance.case_types`` for the conventions every case follows.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from refimpl.advantages import group_advantages
from refimpl.losses import PolicyLossVariant

from .case_types import (
    _JUNK_REF,
    POLICY_CASE_CLASSES,
    PolicyLossCase,
    _assemble,
    _band,
    _gen,
    _rows_with_sequence_mean,
    _uniform,
    clip_bounds,
)
from .edge_cases import (
    dual_clip_tie_cases,
    empty_step_cases,
    half_overflow_cases,
    ratio_overflow_cases,
    zero_rows_cases,
)

__all__ = ["policy_loss_cases"]


def _inside(variant, seq, g, index):
    lo, hi = _band(variant)
    margin = 0.15 * (hi - lo)
    lengths = [4, 3, 5, 2]
    adv = [0.9, -1.3, 0.4, -0.7]
    if seq:
        targets = [float(v) for v in _uniform(g, (4,), lo + margin, hi - margin)]
        spread = 0.1 * (hi - lo)
        rows = []
        for length, target in zip(lengths, targets, strict=True):
            noise = _uniform(g, (length,), -spread, spread)
            rows.append([float(target + v - noise.mean()) for v in noise])
    else:
        rows = [[float(v) for v in _uniform(g, (n,), lo + margin, hi - margin)] for n in lengths]
    return [_assemble("inside_clip", index, lengths, rows, adv, g)]


def _outside(variant, seq, g, index):
    lower, upper, _ = clip_bounds(variant)
    hi = math.log(upper) if upper is not None else 0.5
    lo = math.log(lower) if lower is not None else -0.5
    cases = []
    for k, adv in enumerate(([1.1, -0.8, 0.6, -1.4], [-0.5, 0.75, -1.0, 2.0])):
        lengths = [3, 4, 2, 3]
        if seq:
            targets = [hi + 0.3, lo - 0.4, lo - 0.2, hi + 0.6]
            rows = _rows_with_sequence_mean(g, lengths, targets)
        else:
            rows = []
            for i, n in enumerate(lengths):
                above = _uniform(g, (n,), hi + 0.05, hi + 0.8)
                below = _uniform(g, (n,), lo - 0.8, lo - 0.05)
                rows.append([float(above[t] if (t + i) % 2 == 0 else below[t]) for t in range(n)])
        cases.append(_assemble("outside_clip", index + k, lengths, rows, list(adv), g))
    return cases


def _boundary(variant, seq, g, index):
    lower, upper, dual = clip_bounds(variant)
    ratios = [b for b in (lower, upper, dual) if b is not None] or [1.0]
    cases = []
    for k, sign in enumerate((1.0, -1.0)):
        if seq:  # length-1 rows make the sequence mean exactly the token's log-ratio
            lengths = [1] * len(ratios) + [3]
            exact = {(i, 0): b for i, b in enumerate(ratios)}
            rows = [[0.0] for _ in ratios] + [[0.01, -0.02, 0.005]]
            adv = [sign * (0.5 + 0.25 * i) for i in range(len(ratios))] + [-sign * 0.8]
        else:
            lengths = [len(ratios) + 1, len(ratios) + 2]
            exact = {(i, t): b for i in range(2) for t, b in enumerate(ratios)}
            rows = [[0.0] * n for n in lengths]
            rows[0][-1] = 0.01
            rows[1][-2:] = [-0.03, 0.02]
            adv = [sign * 0.9, sign * 1.7]
        cases.append(_assemble("on_boundary", index + k, lengths, rows, adv, g, exact_logp=exact))
    return cases


def _extreme(g, index):
    lengths = [3, 2, 4, 1]
    values = [[50.0, -50.0, 20.5], [-30.0, 45.0], [-50.0, 0.1, 49.5, -20.5], [50.0]]
    adv = [1.0, -0.6, -1.2, 0.8]
    cases = [_assemble("extreme_log_ratio", index, lengths, values, adv, g)]
    values2 = [[-50.0, -49.0, -48.0], [50.0, 50.0], [25.0, 30.0, 35.0, 40.0], [-50.0]]
    cases.append(_assemble("extreme_log_ratio", index + 1, lengths, values2, [-1.0, 1.0, -0.3, -2.0], g))
    return cases


def _mixed_rows(variant, g, lengths):
    lo, hi = _band(variant)
    return [[float(v) for v in _uniform(g, (n,), lo - 0.3, hi + 0.3)] for n in lengths]


def _ragged(variant, g, index):
    cases = []
    for k, lengths in enumerate(([1, 6, 3, 2, 5, 4], [7, 1, 1, 4])):
        adv = [float(v) for v in _uniform(g, (len(lengths),), -1.5, 1.5)]
        cases.append(_assemble("ragged", index + k, lengths, _mixed_rows(variant, g, lengths), adv, g))
    return cases


def _empty(variant, g, index):
    cases = []
    for k, lengths in enumerate(([3, 0, 5, 2], [0, 4, 0, 1, 2, 0])):
        adv = [float(v) for v in _uniform(g, (len(lengths),), -1.5, 1.5)]
        cases.append(_assemble("empty_rows", index + k, lengths, _mixed_rows(variant, g, lengths), adv, g))
    return cases


def _group_cases(variant, g, index, case_class, rewards, group_ids, convention):
    advantages = group_advantages(
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(group_ids),
        scale="group",
        std=convention.adv_std,
        eps=convention.adv_eps,
        eps_inside_sqrt=convention.adv_eps_inside_sqrt,
        zero_variance=convention.adv_zero_variance,
        singleton="zero",
    )
    lengths = [2 + (i * 3) % 4 for i in range(len(rewards))]
    return _assemble(
        case_class,
        index,
        lengths,
        _mixed_rows(variant, g, lengths),
        [float(a) for a in advantages],
        g,
        group_ids=group_ids,
        rewards=rewards,
    )


def _zero_variance(variant, g, index, convention):
    return [
        _group_cases(
            variant,
            g,
            index,
            "zero_variance_group",
            [1.0, 1.0, 1.0, 0.0, 1.0, 0.5],
            [0, 0, 0, 1, 1, 1],
            convention,
        ),
        _group_cases(
            variant, g, index + 1, "zero_variance_group", [0.3, 0.3, 0.3, 0.3], [5, 5, 7, 7], convention
        ),
    ]


def _singleton(variant, g, index, convention):
    return [
        _group_cases(
            variant, g, index, "singleton_group", [1.0, 0.0, 1.0, 0.25, 0.75], [0, 1, 1, 2, 2], convention
        ),
        _group_cases(variant, g, index + 1, "singleton_group", [2.0, 0.5, -1.0], [3, 1, 2], convention),
    ]


def _half(variant, seq, g, index, dtype):
    """Moderate log-ratios kept >= 1 % away from every boundary (after rounding to ``dtype``,
    at the ratio's level), cast to ``dtype``; expected values use the rounded inputs."""
    lower, upper, dual = clip_bounds(variant)
    bounds = [math.log(b) for b in (lower, upper, dual) if b is not None]
    lengths = [5, 3, 6, 2]
    adv = [0.8, -1.1, 1.4, -0.5]
    name = "bf16" if dtype == torch.bfloat16 else "fp16"
    for _ in range(100):
        rows = [[float(x) for x in _uniform(g, (n,), -0.6, 0.6)] for n in lengths]
        case = _assemble(name, index, lengths, rows, adv, g)
        logp, old = case.logp.to(dtype), case.old_logp.to(dtype)
        log_ratio = torch.where(case.mask, logp.double() - old.double(), 0.0)
        if seq:
            log_ratio = log_ratio.sum(-1) / case.mask.sum(-1)
            units = log_ratio.flatten().tolist()
        else:
            units = log_ratio[case.mask].tolist()
        if all(abs(x - b) > 0.01 for x in units for b in bounds):
            return [
                PolicyLossCase(
                    name,
                    index,
                    logp,
                    old,
                    case.advantages.to(dtype),
                    case.mask,
                    case.rewards,
                    case.group_ids,
                    None,
                    None,
                    f"inputs rounded to {dtype}",
                )
            ]
    raise RuntimeError("could not draw half-precision ratios away from the clip boundaries")


def _micro(variant, g, index):
    lengths = [3, 5, 0, 2, 4, 1]
    adv = [float(v) for v in _uniform(g, (6,), -1.5, 1.5)]
    parts = ((0, 1), (2, 3), (4, 5))
    case = _assemble(
        "micro_batch",
        index,
        lengths,
        _mixed_rows(variant, g, lengths),
        adv,
        g,
        micro_batches=parts,
        note="3 micro-batches of 2 rows; global normaliser",
    )
    lengths2 = [6, 1, 2, 2]
    adv2 = [float(v) for v in _uniform(g, (4,), -1.5, 1.5)]
    case2 = _assemble(
        "micro_batch",
        index + 1,
        lengths2,
        _mixed_rows(variant, g, lengths2),
        adv2,
        g,
        micro_batches=((0, 1), (2, 3)),
        note="2 micro-batches, very different token counts",
    )
    return [case, case2]


def _kl(variant, g, index):
    lengths = [3, 2, 4, 1]
    adv = [0.7, -1.2, 0.3, -0.4]
    rows = _mixed_rows(variant, g, lengths)
    case = _assemble("kl_penalty", index, lengths, rows, adv, g, with_ref=True)
    # large reference log-ratios (|log r| up to 24) to exercise clamps of the KL term
    ref = case.ref_logp.clone()
    ref[0, 0] = case.logp[0, 0] + 24.0
    ref[2, 1] = case.logp[2, 1] - 22.0
    return [
        PolicyLossCase(
            "kl_penalty",
            index,
            case.logp,
            case.old_logp,
            case.advantages,
            case.mask,
            case.rewards,
            case.group_ids,
            ref,
            None,
            "ref log-ratios up to |24|",
        )
    ]


def _masked_nonfinite(variant, g, index):
    """NaN, +inf and -inf at every masked position of logp, old_logp and (with a KL term) ref_logp
    (one value per case; an all-masked row included); with a KL term, a fourth case with NaN in
    ref_logp only. The
    spec's loss and gradient are those of the same case with finite junk (0 gradient there)."""
    lengths = [3, 0, 4, 2]
    adv = [0.9, -0.4, -1.2, 0.6]
    base = _assemble(
        "masked_nonfinite", index, lengths, _mixed_rows(variant, g, lengths), adv, g, with_ref=True
    )
    values = [("NaN", math.nan), ("+inf", math.inf), ("-inf", -math.inf)]
    cases = []
    for k, (label, value) in enumerate(values):
        fill = torch.full_like(base.logp, value)
        cases.append(
            dataclasses.replace(
                base,
                index=index + k,
                logp=torch.where(base.mask, base.logp, fill),
                old_logp=torch.where(base.mask, base.old_logp, fill),
                ref_logp=torch.where(base.mask, base.ref_logp, fill) if variant.kl_coef > 0 else None,
                note=f"{label} at every masked position of logp, old_logp"
                + (", ref_logp" if variant.kl_coef > 0 else ""),
            )
        )
    if variant.kl_coef > 0:
        cases.append(
            dataclasses.replace(
                base,
                index=index + 3,
                ref_logp=torch.where(base.mask, base.ref_logp, torch.full_like(base.logp, math.nan)),
                note="NaN at the masked positions of ref_logp only",
            )
        )
    return cases


def _padding_micro(variant, g, index):
    """Micro-batches of which one holds only padding (all rows fully masked): it contributes 0 to
    the loss and to the gradient, and 0 to the global normaliser."""
    lengths = [3, 2, 0, 0, 4, 1]
    adv = [float(v) for v in _uniform(g, (6,), -1.5, 1.5)]
    first = _assemble(
        "padding_micro_batch",
        index,
        lengths,
        _mixed_rows(variant, g, lengths),
        adv,
        g,
        micro_batches=((0, 1), (2, 3), (4, 5)),
        note="3 micro-batches; the second is all padding",
    )
    lengths2 = [2, 5, 0]
    adv2 = [float(v) for v in _uniform(g, (3,), -1.5, 1.5)]
    second = _assemble(
        "padding_micro_batch",
        index + 1,
        lengths2,
        _mixed_rows(variant, g, lengths2),
        adv2,
        g,
        micro_batches=((0, 1), (2,)),
        note="2 micro-batches; the last is one empty row",
    )
    return [first, second]


def policy_loss_cases(
    variant: PolicyLossVariant, convention, *, seed: int = 0, classes: tuple[str, ...] | None = None
) -> list[PolicyLossCase]:
    """All cases of the requested classes (default: every class that applies to ``variant``:
    ``kl_penalty`` only when ``variant.kl_coef > 0``). Deterministic in ``seed``."""
    seq = variant.sequence_level
    wanted = POLICY_CASE_CLASSES if classes is None else classes
    unknown = set(wanted) - set(POLICY_CASE_CLASSES)
    if unknown:
        raise ValueError(f"unknown case classes {sorted(unknown)}; valid: {POLICY_CASE_CLASSES}")
    makers = {
        "inside_clip": lambda g: _inside(variant, seq, g, 0),
        "outside_clip": lambda g: _outside(variant, seq, g, 0),
        "on_boundary": lambda g: _boundary(variant, seq, g, 0),
        "extreme_log_ratio": lambda g: _extreme(g, 0),
        "ragged": lambda g: _ragged(variant, g, 0),
        "empty_rows": lambda g: _empty(variant, g, 0),
        "zero_variance_group": lambda g: _zero_variance(variant, g, 0, convention),
        "singleton_group": lambda g: _singleton(variant, g, 0, convention),
        "bf16": lambda g: _half(variant, seq, g, 0, torch.bfloat16),
        "fp16": lambda g: _half(variant, seq, g, 0, torch.float16),
        "micro_batch": lambda g: _micro(variant, g, 0),
        "kl_penalty": lambda g: _kl(variant, g, 0),
        "masked_nonfinite": lambda g: _masked_nonfinite(variant, g, 0),
        "padding_micro_batch": lambda g: _padding_micro(variant, g, 0),
        "half_overflow": lambda g: half_overflow_cases(variant, seq, g, 0),
        "dual_clip_tie": lambda g: dual_clip_tie_cases(variant, seq, g, 0),
        "empty_step": lambda g: empty_step_cases(variant, seq, g, 0),
        "ratio_overflow": lambda g: ratio_overflow_cases(variant, seq, g, 0),
        "zero_rows": lambda g: zero_rows_cases(variant, seq, g, 0),
        "golden_vectors": lambda g: [],  # read from specs/vectors by the checker (refimpl.conformance.golden)
    }
    cases = []
    for k, name in enumerate(POLICY_CASE_CLASSES):
        if name not in wanted or (name == "kl_penalty" and variant.kl_coef == 0):
            continue
        cases.extend(makers[name](_gen(1000 * seed + k)))
    if variant.kl_coef > 0:  # a KL term needs reference log-probs in every case
        cases = [
            c if c.ref_logp is not None else _with_reference(c, _gen(1000 * seed + 99 + i))
            for i, c in enumerate(cases)
        ]
    return cases


def _with_reference(case: PolicyLossCase, g: torch.Generator) -> PolicyLossCase:
    noise = _uniform(g, tuple(case.old_logp.shape), -0.6, 0.6).to(case.old_logp.dtype)
    ref = torch.where(case.mask, case.old_logp + noise, torch.full_like(case.old_logp, _JUNK_REF))
    return dataclasses.replace(case, ref_logp=ref)

"""Golden test vectors from the sympy specs: ``python -m specs.golden`` writes ``specs/vectors/*.json``.

Every expected value is the exact spec (``specs.policy_losses.build_policy_loss``,
``specs.kl.k_estimator``, ``specs.advantages.group_advantages_exact``, ``specs.estimators``,
``specs.policy_losses.token_logprob_exprs``) correctly rounded to 50 significant digits (169
bits, ``specs._exact.to_digits``: the working precision is raised until they are certain);
inputs are dyadic rationals (multiples of 1/1024, or integers such as +-50), so their decimal
strings are exactly the binary float64 values an implementation receives, and most of them are
exact in bfloat16/float16 too. Schema version 2 (``specs/vectors/SCHEMA.md``): every vector has
``flags`` (``specs.golden_flags.FLAGS``) and a ``result`` (valid / invalid / acceptable). Case ids
are stable. Regeneration is bit-identical: the inputs come from fixed ``random.Random`` seeds,
the numbers are printed by sympy at a fixed precision, and the JSON is written with sorted keys.

This module imports neither ``refimpl`` nor ``tabular`` (the preset parameters and the
frameworks' convention flags below are data; tests check that they equal refimpl's).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import random
import struct
from fractions import Fraction
from pathlib import Path

import sympy as sp

from specs._exact import decisions, enclose, sign, to_digits, to_float64
from specs.advantages import _std, group_advantages_exact
from specs.golden_flags import FLAGS, RESULTS
from specs.golden_values import (  # noqa: F401 (re-exported: the vector files' shared primitives)
    _GRID,
    DIGITS,
    NAN,
    NEG_INF,
    POS_INF,
    _digits,
    _dyadic,
    _num,
    _subnormal,
    vector,
)
from specs.kl import k_estimator
from specs.policy_losses import (
    LossSpec,
    _nonsmooth_atoms,
    _substitution,
    build_policy_loss,
    hard_clip_term,
    sapo_term,
)

__all__ = [
    "SCHEMA_VERSION",
    "DIGITS",
    "FLAGS",
    "GOLDEN_PRESETS",
    "GOLDEN_VARIANTS",
    "GOLDEN_POINTS",
    "VARIANT_MODES",
    "ADVANTAGE_CONVENTIONS",
    "CONVENTION_FLAGS",
    "vector",
    "policy_loss_vectors",
    "convention_vectors",
    "kl_vectors",
    "advantage_vectors",
    "vector_builders",
    "all_vector_files",
    "document",
    "dumps",
    "write_vectors",
    "main",
]

SCHEMA_VERSION = 2
VECTOR_DIR = Path(__file__).resolve().parent / "vectors"

#: The presets of policy_losses.md table 2 (L_max = 16 for Dr. GRPO's seq_sum).
GOLDEN_PRESETS: dict[str, LossSpec] = {
    "ppo": LossSpec(aggregation="token_mean"),
    "grpo": LossSpec(aggregation="seq_mean_token_mean"),
    "dr_grpo": LossSpec(aggregation="seq_sum", max_length=16),
    "dapo": LossSpec(eps_high=0.28, aggregation="token_mean"),
    "bnpo": LossSpec(aggregation="token_mean"),
    "gspo": LossSpec(ratio="sequence_mean", eps_low=3e-4, eps_high=4e-4, aggregation="seq_mean"),
    "gspo_token": LossSpec(
        ratio="gspo_token", eps_low=3e-4, eps_high=4e-4, aggregation="seq_mean_token_mean"
    ),
    "sapo": LossSpec(gate="sapo", eps_low=None, eps_high=None, aggregation="seq_mean_token_mean"),
    "cispo": LossSpec(gate="cispo", eps_low=None, eps_high=0.28, aggregation="token_mean"),
}

#: Points of the family beyond table 2 that get the same case classes: a preset with the aggregation
#: seq_mean_token_sum (each sequence's token sum averaged over the sequences, policy_losses.md
#: eqs. (10)-(11)), at the token level (Dr. GRPO's ratio and clip; verl's seq-mean-token-sum) and the
#: sequence level (GSPO's ratio, its term once per token; TRL's and Liger-Kernel's luspo).
GOLDEN_VARIANTS: dict[str, LossSpec] = {
    "dr_grpo+token_sum": dataclasses.replace(
        GOLDEN_PRESETS["dr_grpo"], aggregation="seq_mean_token_sum", max_length=None
    ),
    "gspo+token_sum": dataclasses.replace(GOLDEN_PRESETS["gspo"], aggregation="seq_mean_token_sum"),
}
#: every point of the family the vectors cover, by the name in their ``preset`` field
GOLDEN_POINTS: dict[str, LossSpec] = {**GOLDEN_PRESETS, **GOLDEN_VARIANTS}

#: group_advantages conventions of the advantage vectors (the kit's profiles; ``trl_batch`` is TRL's
#: ``scale_rewards="batch"``, advantages.md eq. (14)).
ADVANTAGE_CONVENTIONS: dict[str, dict[str, object]] = {
    "reference": dict(
        scale="group",
        std="population",
        eps=1e-6,
        eps_inside_sqrt=True,
        zero_variance="zero",
        singleton="zero",
    ),
    "trl": dict(
        scale="group",
        std="sample",
        eps=1e-4,
        eps_inside_sqrt=False,
        zero_variance="formula",
        singleton="error",
    ),
    "trl_batch": dict(
        scale="batch_rewards",
        std="sample",
        eps=1e-4,
        eps_inside_sqrt=False,
        zero_variance="formula",
        singleton="zero",
    ),
    "verl": dict(
        scale="group",
        std="sample",
        eps=1e-6,
        eps_inside_sqrt=False,
        zero_variance="formula",
        singleton="raw",  # verl: a one-sample group has mean 0 and std 1 (advantages.md eq. (15))
    ),
    "dr_grpo": dict(scale="none", singleton="zero"),
    "rloo": dict(scale="none", singleton="zero", leave_one_out=True),
}

# ---------------------------------------------------------------------------------------------
# policy loss (policy_losses.md)


@dataclasses.dataclass
class _Batch:
    """The inputs of one policy-loss vector (ragged rows of exact numbers)."""

    case_class: str
    lengths: list[int]
    adv: list
    logp: list[list]
    old: list[list]
    ref: list[list] | None = None
    normalizer: Fraction | None = None
    dtype: str = "float64"
    padding_value: str | None = None
    flags: tuple[str, ...] = ()
    index: int = 0
    invalid: str | None = None  # the reason an invalid vector must be rejected
    dual_clip: float | None = None  # the variant's dual-clip constant c for this batch (else the preset's)
    kl_estimator: str = "k3"  # of the KL penalty (convention vectors)


def _ragged_inputs(rng: random.Random, lengths, log_ratio_range, kl: bool):
    logp, old, ref = [], [], []
    for n in lengths:
        o = [_dyadic(rng, -3.0, -0.125) for _ in range(n)]
        x = [_dyadic(rng, *log_ratio_range) for _ in range(n)]
        old.append(o)
        logp.append([a + b for a, b in zip(o, x, strict=True)])
        ref.append([a + _dyadic(rng, -0.5, 0.5) for a in o] if kl else None)
    return logp, old, (ref if kl else None)


def _unit_log_ratios(spec: LossSpec, b: _Batch) -> list[tuple[Fraction, Fraction]]:
    """(log-ratio, advantage) per unit: tokens (GSPO-token: the row's mean), or non-empty rows."""
    units = []
    for lrow, orow, a in zip(b.logp, b.old, b.adv, strict=True):
        x = [Fraction(l_) - Fraction(o) for l_, o in zip(lrow, orow, strict=True)]
        if not x:
            continue
        if spec.ratio == "token":
            units += [(xt, Fraction(a)) for xt in x]
        elif spec.ratio == "gspo_token":
            units += [(sum(x) / len(x), Fraction(a))] * len(x)
        else:
            units.append((sum(x) / (len(x) if spec.ratio == "sequence_mean" else 1), Fraction(a)))
    return units


def _policy_flags(spec: LossSpec, b: _Batch) -> set[str]:
    """The flags that follow from the inputs (a boundary vector adds its own)."""
    flags = set(b.flags)
    nonempty = [n for n in b.lengths if n]
    if len(set(nonempty)) > 1:
        flags.add("ragged_lengths")
    if nonempty and len(nonempty) < len(b.lengths):
        flags.add("empty_row")
    if not nonempty:
        flags.add("all_rows_empty")
    if b.lengths == [1]:
        flags.add("single_token")
    if b.normalizer is not None:
        flags.add("global_normalizer")
    if b.dtype == "bfloat16":
        flags.add("bf16_exact_inputs")
    if b.padding_value is not None:
        flags.add("nonfinite_padding")
    if b.ref is not None:
        flags.add(f"kl_{spec.kl_estimator}")
    if b.invalid is not None:
        return flags
    xs = [
        Fraction(l_) - Fraction(o)
        for lr, orow in zip(b.logp, b.old, strict=True)
        for l_, o in zip(lr, orow, strict=True)
    ]
    if xs and all(x == 0 for x in xs):
        flags.add("ratio_one")
    if any(Fraction(a) == 0 for a in b.adv):
        flags.add("zero_advantage")
    if xs and max(abs(x) for x in xs) > 20:
        flags.add("log_ratio_20")
    if xs and max(abs(x) for x in xs) >= 50:
        flags.add("log_ratio_50")
    numbers = [Fraction(v) for row in b.logp + b.old + (b.ref or []) for v in row] + [
        Fraction(a) for a in b.adv
    ]
    if any(0 < abs(v) < Fraction(1, 2**1022) for v in numbers):
        flags.add("subnormal_input")
    margin = 1e-12  # boundary vectors (within one rounding of a bound) carry their own flag
    for x, a in _unit_log_ratios(spec, b):
        if spec.gate not in ("clip", "cispo"):
            continue
        if spec.eps_high is not None and a > 0 and float(x) > math.log1p(spec.eps_high) + margin:
            flags.add("ratio_above_upper_clip")
        if spec.eps_low is not None and a < 0 and float(x) < math.log1p(-spec.eps_low) - margin:
            flags.add("ratio_below_lower_clip")
        if spec.dual_clip is not None and a < 0 and float(x) > math.log(spec.dual_clip) + margin:
            flags.add("dual_clip_active")
    return flags


def _exact_rows(rows):
    return [[sp.Rational(v) for v in row] for row in rows]


def _near_tie(atom, subs) -> bool:
    """A relational between a log-prob expression and a bound that holds within 2^-40: the
    boundary vectors' gates (an implementation's float64 exp may land on either side)."""
    with sp.evaluate(False):
        difference = (atom.lhs - atom.rhs).xreplace(subs)
    interval = enclose(difference, 128)
    return abs(float(interval.mid)) < 2.0**-40


def _policy_expected(spec: LossSpec, b: _Batch, built, *, boundary: bool):
    """(loss, grad, abs_scale, other-side grad or None) as 50-digit strings: the spec at the exact
    inputs (policy_losses.md eq. (12)); for a boundary vector also the gradient with every gate that
    ties within 2^-40 flipped (the other side of the clip bound)."""
    values = {
        "logp": _exact_rows(b.logp),
        "old_logp": _exact_rows(b.old),
        "advantages": [sp.Rational(a) for a in b.adv],
    }
    if b.ref is not None:
        values["ref_logp"] = _exact_rows(b.ref)
    if b.normalizer is not None:
        values["normalizer"] = sp.Rational(b.normalizer)
    subs = _substitution(built, values)
    evaluators: dict = {}
    decided = decisions(_nonsmooth_atoms(built), subs, evaluators)

    def num(expr, chosen) -> str:
        with sp.evaluate(False):
            value = expr.xreplace({**subs, **chosen})
        return _digits(value, evaluators)

    point = {**subs, **decided}
    loss = num(built.loss, decided)
    grad = [[num(g, decided) for g in row] for row in built.gradient]
    scale = num(built.abs_scale, decided)
    if not boundary:
        return loss, grad, scale, None
    logp_symbols = {s for row in built.logp for s in row} | {s for row in built.logp_sg for s in row}
    flipped = {
        atom: (sp.false if choice is sp.true else sp.true)
        for atom, choice in decided.items()
        if isinstance(atom, sp.core.relational.Relational)
        and atom.free_symbols & logp_symbols
        and _near_tie(atom, point)
    }
    if not flipped:
        if spec.gate == "cispo":  # a detached clipped weight: continuous, no gate to flip
            return loss, grad, scale, None
        raise AssertionError(f"boundary case {b.case_class}: no gate ties at the inputs")
    other = {**decided, **flipped}
    return loss, grad, scale, [[num(g, other) for g in row] for row in built.gradient]


def _policy_inputs_json(b: _Batch) -> dict:
    return {
        "dtype": b.dtype,
        "lengths": list(b.lengths),
        "logp": [[_num(v) for v in row] for row in b.logp],
        "old_logp": [[_num(v) for v in row] for row in b.old],
        "ref_logp": None if b.ref is None else [[_num(v) for v in row] for row in b.ref],
        "advantages": [_num(a) for a in b.adv],
        "normalizer": None if b.normalizer is None else _num(b.normalizer),
        "padding_value": b.padding_value,
    }


def _policy_vector(name: str, spec: LossSpec, b: _Batch) -> dict:
    """A reference-convention policy vector (schema 2): valid, acceptable (a gate on a clip
    bound) or invalid (``b.invalid``)."""
    if b.ref is not None and spec.kl_coef == 0:
        spec = dataclasses.replace(spec, kl_coef=0.0625)
    flags = _policy_flags(spec, b)
    common = dict(
        preset=name,
        case_class=b.case_class,
        convention="reference",
        variant=dataclasses.asdict(spec),
        inputs=_policy_inputs_json(b),
    )
    vid = f"policy_loss/{name}/{b.case_class}/{b.index}"
    if b.invalid is not None:
        return vector(vid, flags, "invalid", b.invalid, expected=None, **common)
    boundary = bool(flags & {"ratio_on_upper_clip", "ratio_on_lower_clip", "ratio_on_dual_clip"})
    built = build_policy_loss(
        spec, tuple(b.lengths), False, "ref" if b.ref is not None else "none", False, b.normalizer is not None
    )
    loss, grad, scale, other = _policy_expected(spec, b, built, boundary=boundary)
    metrics = {k: _digits(v) for k, v in sorted(_metrics(spec, b.logp, b.old, b.adv).items())}
    if _subnormal([loss, *(g for row in grad for g in row)]):
        flags.add("subnormal_result")
    expected = {"loss": loss, "grad_logp": grad, "abs_scale": scale, "metrics": metrics}
    if other is None:
        return vector(vid, flags, expected=expected, **common)
    del metrics["clip_fraction"]  # counts the gate, so it depends on the side too
    expected["grad_logp_other_side"] = other
    reason = (
        "a unit's ratio lies within one float64 rounding of a clip bound: the loss is continuous there, "
        "the gradient of that unit may be either expected.grad_logp (the spec at the exact inputs) "
        "or expected.grad_logp_other_side (the gate on the other side of the bound)"
    )
    return vector(vid, flags, "acceptable", reason, expected=expected, **common)


def _band(spec: LossSpec) -> tuple[float, float]:
    if spec.gate in ("clip", "cispo") and spec.eps_high is not None and spec.eps_high < 0.01:
        return -0.001, 0.001  # GSPO: sequence ratios straddle its narrow band
    return -0.5, 0.5


def _v1_batches(name: str, spec: LossSpec, seed: int) -> list[_Batch]:
    """The five case classes of schema version 1 (and its KL penalty for GRPO / BNPO), drawn from
    the same random stream, so their inputs and values are unchanged."""
    rng = random.Random(f"{seed}/{name}")
    band = _band(spec)
    out = []
    lengths = [3, 1, 4, 2]
    logp, old, _ = _ragged_inputs(rng, lengths, band, False)
    adv = [
        _dyadic(rng, 0.25, 1.5),
        -_dyadic(rng, 0.25, 1.5),
        _dyadic(rng, -1.5, 1.5),
        -_dyadic(rng, 0.25, 1.5),
    ]
    out.append(_Batch("mixed", lengths, adv, logp, old))
    lengths = [5, 2, 0, 3, 1]
    logp, old, _ = _ragged_inputs(rng, lengths, (band[0] * 2, band[1] * 2), False)
    adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
    out.append(_Batch("ragged_empty_row", lengths, adv, logp, old))
    old = [[Fraction(-1), Fraction(-2), Fraction(-1, 2)], [Fraction(-3, 2), Fraction(-1)]]
    logp = [[Fraction(49), Fraction(-52), Fraction(39, 2)], [Fraction(-43, 2), Fraction(29)]]
    out.append(_Batch("extreme_log_ratio", [3, 2], [Fraction(3, 4), Fraction(-5, 4)], logp, old))
    lengths = [2, 3]
    logp, old, _ = _ragged_inputs(rng, lengths, band, False)
    adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
    out.append(_Batch("micro_batch_global_normalizer", lengths, adv, logp, old, normalizer=Fraction(11)))
    lengths = [2, 3]
    logp = [[Fraction(rng.randint(-96, -8), 32) for _ in range(n)] for n in lengths]
    old = [[Fraction(rng.randint(-96, -8), 32) for _ in range(n)] for n in lengths]
    if spec.eps_high is not None and spec.eps_high < 0.01:
        old = [list(row) for row in logp]
        old[0][0] += Fraction(1, 32)
    adv = [Fraction(rng.randint(-48, 48), 32) for _ in lengths]
    out.append(_Batch("bf16_exact_inputs", lengths, adv, logp, old, dtype="bfloat16"))
    if name in ("grpo", "bnpo"):
        lengths = [3, 2, 4]
        logp, old, ref = _ragged_inputs(rng, lengths, band, True)
        adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
        out.append(_Batch("kl_penalty", lengths, adv, logp, old, ref))
    return out


def _on_bound(log_bound: float, old: Fraction = Fraction(-1)) -> tuple[Fraction, Fraction]:
    """(logp, old_logp) with ``logp = fl(old + log_bound)`` (float64 nearest of the exact sum): the
    exact log-ratio ``logp - old`` is a float64 within one rounding of the bound's logarithm."""
    logp = Fraction(to_float64(sp.Rational(old) + sp.log(sp.Rational(log_bound))))
    return logp, old


def _new_batches(name: str, spec: LossSpec, seed: int) -> list[_Batch]:
    """The case classes added in schema version 2 (a separate random stream per preset)."""
    rng = random.Random(f"{seed}/{name}/v2")
    band = _band(spec)
    out = []
    if name not in ("grpo", "bnpo"):  # their k3 penalty is a version-1 vector
        lengths = [3, 2, 4]
        logp, old, ref = _ragged_inputs(rng, lengths, band, True)
        out.append(_Batch("kl_penalty", lengths, [_dyadic(rng, -1.5, 1.5) for _ in lengths], logp, old, ref))
    for estimator in ("k1", "k2"):
        lengths = [2, 3]
        logp, old, ref = _ragged_inputs(rng, lengths, band, True)
        ref[1][0] = logp[1][0] + 21  # |log r| > 20 on one token
        adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
        out.append(_Batch(f"kl_{estimator}_penalty", lengths, adv, logp, old, ref, flags=("log_ratio_20",)))
    logp, old, _ = _ragged_inputs(rng, [1], band, False)
    out.append(_Batch("single_token", [1], [_dyadic(rng, 0.25, 1.5)], logp, old))
    out.append(_Batch("all_rows_empty", [0, 0], [Fraction(1, 2), Fraction(-3, 4)], [[], []], [[], []]))
    lengths = [2, 3, 1]
    logp, old, _ = _ragged_inputs(rng, lengths, band, False)
    out.append(
        _Batch("zero_advantage", lengths, [Fraction(0), _dyadic(rng, 0.25, 1.5), Fraction(0)], logp, old)
    )
    lengths = [3, 2]
    _, old, _ = _ragged_inputs(rng, lengths, band, False)
    out.append(_Batch("ratio_one", lengths, [_dyadic(rng, 0.25, 1.5), -_dyadic(rng, 0.25, 1.5)], old, old))
    # a unit within one rounding of a clip bound (token level: one token; sequence level: a row of one)
    hard = spec.gate in ("clip", "cispo")
    if hard and spec.eps_high is not None:
        lp, o = _on_bound(1 + sp.Rational(spec.eps_high))
        logp2, old2, _ = _ragged_inputs(rng, [2], band, False)
        out.append(
            _Batch(
                "on_upper_clip",
                [1, 2],
                [Fraction(5, 4), _dyadic(rng, -1.5, 1.5)],
                [[lp]] + logp2,
                [[o]] + old2,
                flags=("ratio_on_upper_clip",),
            )
        )
    if hard and spec.eps_low is not None:
        lp, o = _on_bound(1 - sp.Rational(spec.eps_low))
        logp2, old2, _ = _ragged_inputs(rng, [2], band, False)
        out.append(
            _Batch(
                "on_lower_clip",
                [1, 2],
                [Fraction(-3, 4), _dyadic(rng, -1.5, 1.5)],
                [[lp]] + logp2,
                [[o]] + old2,
                flags=("ratio_on_lower_clip",),
            )
        )
    lengths = [2, 1]
    logp, old, _ = _ragged_inputs(rng, lengths, band, False)
    tiny = [Fraction(3, 2**1061), -Fraction(5, 2**1063)]  # advantages below 2^-1022
    out.append(_Batch("subnormal_result", lengths, tiny, logp, old))
    for index, padding in enumerate((NAN, NEG_INF)):
        lengths = [3, 1, 0]
        logp, old, _ = _ragged_inputs(rng, lengths, band, False)
        adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
        out.append(_Batch("nonfinite_padding", lengths, adv, logp, old, padding_value=padding, index=index))
    # invalid inputs (no expected values): the implementation must raise
    lengths = [2, 2]
    logp, old, _ = _ragged_inputs(rng, lengths, band, False)
    adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
    bad = [list(row) for row in logp]
    bad[1][0] = NAN
    out.append(
        _Batch(
            "nan_logp",
            lengths,
            adv,
            bad,
            old,
            flags=("nan_input",),
            invalid="logp holds NaN at an unmasked position",
        )
    )
    bad = [list(row) for row in old]
    bad[0][1] = POS_INF
    out.append(
        _Batch(
            "inf_old_logp",
            lengths,
            adv,
            logp,
            bad,
            flags=("inf_input",),
            invalid="old_logp holds +inf at an unmasked position",
        )
    )
    out.append(
        _Batch(
            "nan_advantage",
            lengths,
            [adv[0], NAN],
            logp,
            old,
            flags=("nan_input",),
            invalid="an advantage is NaN",
        )
    )
    out.append(
        _Batch(
            "advantages_length_mismatch",
            lengths,
            adv + [Fraction(1, 2)],
            logp,
            old,
            flags=("shape_mismatch",),
            invalid="3 advantages for 2 rows (no silent broadcasting)",
        )
    )
    out.append(
        _Batch(
            "zero_normalizer",
            lengths,
            adv,
            logp,
            old,
            normalizer=Fraction(0),
            flags=("bad_argument",),
            invalid="normalizer must be > 0",
        )
    )
    return out


#: The dual-clip constant of the dual-clip case classes (verl's clip_ratio_c, OpenRLHF's dual_clip).
DUAL_CLIP = 3.0

#: The presets with a token-level hard clip that get the dual-clip case classes (verl applies
#: clip_ratio_c to these; OpenRLHF has dual-clip modes for ppo and grpo).
_DUAL_CLIP_PRESETS = ("ppo", "grpo", "dapo")


def _dual_clip_batches(name: str, spec: LossSpec, seed: int) -> list[_Batch]:
    """The dual-clip case classes (policy_losses.md eq. (7), c = ``DUAL_CLIP``; a separate random
    stream per preset): a unit within one rounding of each bound of the dual-clip gate (A > 0 at
    1 + eps_high, A < 0 at 1 - eps_low and at c: acceptable either side, since the inclusive gate
    is open on the bound, policy_losses.md eq. (6)) and one valid batch with every region of the gate (A < 0
    beyond c, A < 0 between 1 + eps_high and c where the plain clip leaves the ratio unclipped, A < 0
    below 1 - eps_low, A > 0 above 1 + eps_high)."""
    if name not in _DUAL_CLIP_PRESETS:
        return []
    rng = random.Random(f"{seed}/{name}/dual_clip")
    band = _band(spec)
    out = []
    bounds = (
        ("dual_clip_on_upper_clip", 1 + sp.Rational(spec.eps_high), Fraction(5, 4), "ratio_on_upper_clip"),
        ("dual_clip_on_lower_clip", 1 - sp.Rational(spec.eps_low), Fraction(-3, 4), "ratio_on_lower_clip"),
        ("dual_clip_on_bound", sp.Rational(DUAL_CLIP), Fraction(-5, 4), "ratio_on_dual_clip"),
    )
    for case_class, bound, adv, flag in bounds:
        lp, o = _on_bound(bound)
        logp2, old2, _ = _ragged_inputs(rng, [2], band, False)
        out.append(
            _Batch(
                case_class,
                [1, 2],
                [adv, _dyadic(rng, -1.5, 1.5)],
                [[lp]] + logp2,
                [[o]] + old2,
                flags=(flag,),
                dual_clip=DUAL_CLIP,
            )
        )
    # log-ratios 3/2 (r = 4.48 > c), 3/4 (r = 2.12, between 1 + eps_high and c), -1/2 (r = 0.61)
    old = [[_dyadic(rng, -3.0, -0.125) for _ in range(n)] for n in (3, 2)]
    shifts = [[Fraction(3, 2), Fraction(3, 4), Fraction(-1, 2)], [Fraction(1, 2), _dyadic(rng, -0.5, 0.5)]]
    logp = [[o + x for o, x in zip(orow, xrow, strict=True)] for orow, xrow in zip(old, shifts, strict=True)]
    adv = [-_dyadic(rng, 0.25, 1.5), _dyadic(rng, 0.25, 1.5)]
    out.append(_Batch("dual_clip_active", [3, 2], adv, logp, old, dual_clip=DUAL_CLIP))
    return out


def policy_loss_vectors(
    presets: tuple[str, ...] | None = None,
    *,
    seed: int = 20251121,
    case_classes: tuple[str, ...] | None = None,
) -> list[dict]:
    """Reference-convention vectors per preset x case class: the version-1 classes (mixed ratios on
    both sides of the band, ragged lengths with an empty row, log-ratios +-50 and +-20, a micro-batch
    with a global normaliser, bfloat16-exact inputs, k3 KL), the KL penalty with each estimator, a
    single token, all rows empty, zero advantages, ratio 1, a ratio within one rounding of each clip
    bound (``acceptable``), subnormal results, NaN / -inf padding, five invalid inputs, and (ppo, grpo,
    dapo) the dual-clip classes of ``_dual_clip_batches``; also for the points of ``GOLDEN_VARIANTS``."""
    out = []
    for name in presets or tuple(GOLDEN_POINTS):
        spec = GOLDEN_POINTS[name]
        batches = _v1_batches(name, spec, seed) + _new_batches(name, spec, seed)
        for b in batches + _dual_clip_batches(name, spec, seed):
            if case_classes is not None and b.case_class not in case_classes:
                continue
            est = b.case_class[3:5] if b.case_class.startswith("kl_k") else "k3"
            case_spec = dataclasses.replace(spec, kl_estimator=est) if b.ref is not None else spec
            if b.dual_clip is not None:
                case_spec = dataclasses.replace(case_spec, dual_clip=b.dual_clip)
            out.append(_policy_vector(name, case_spec, b))
    return out


def _unit_ratios(spec: LossSpec, logp, old, adv) -> list[tuple[sp.Expr, sp.Expr, sp.Expr]]:
    """(ratio, advantage, log-prob) per unit: tokens for token levels (GSPO-token: each token carries
    its sequence ratio s_i, md eq. (4)), non-empty sequences for sequence levels (md eqs. (2)-(5))."""
    units = []
    for lrow, orow, a in zip(logp, old, adv, strict=True):
        x = [sp.Rational(l_ - o) for l_, o in zip(lrow, orow, strict=True)]
        a = sp.Rational(a)
        if spec.ratio == "token":
            units += [(sp.exp(xt), a, sp.Rational(l_)) for xt, l_ in zip(x, lrow, strict=True)]
        elif spec.ratio == "gspo_token" and x:
            units += [(sp.exp(sum(x) / len(x)), a, sp.Rational(l_)) for l_ in lrow]
        elif x:
            total = sum(x) / (len(x) if spec.ratio == "sequence_mean" else 1)
            mean_logp = sum(sp.Rational(l_) for l_ in lrow) / (len(x) if spec.ratio == "sequence_mean" else 1)
            units.append((sp.exp(total), a, mean_logp))
    return units


def _metrics(spec: LossSpec, logp, old, adv) -> dict[str, sp.Expr]:
    """The diagnostics of ``policy_loss`` (no behaviour correction): over units, the ratio mean /
    min / max (1 for no units), the fraction of units whose hard-clip gate (inclusive,
    policy_losses.md eq. (6)) is closed (0 for the other gates) and the mean surrogate ``policy_objective``;
    over
    tokens, ``approx_kl`` = mean of ``exp(x) - 1 - x`` with ``x = logp - old_logp`` (k3 of
    KL(old || new) from samples of old)."""
    units = _unit_ratios(spec, logp, old, adv)
    ratios = [r for r, _, _ in units]
    lower = None if spec.eps_low is None else 1 - sp.Rational(spec.eps_low)
    upper = None if spec.eps_high is None else 1 + sp.Rational(spec.eps_high)
    c = None if spec.dual_clip is None else sp.Rational(spec.dual_clip)

    def closed(r, a) -> bool:
        if spec.gate != "clip":
            return False
        if a > 0:
            return bool(upper is not None and sign(r - upper) > 0)
        return bool((lower is not None and sign(r - lower) < 0) or (c is not None and sign(r - c) > 0))

    def surrogate(r, a, unit_logp):
        if spec.gate == "clip":
            return hard_clip_term(r, a, lower and 1 - lower, upper and upper - 1, c)
        if spec.gate == "sapo":
            return sapo_term(r, a, sp.Rational(spec.tau_pos), sp.Rational(spec.tau_neg))
        if spec.gate == "cispo":
            w = r if lower is None else sp.Max(r, lower)
            return (w if upper is None else sp.Min(w, upper)) * a * unit_logp
        return r * a

    tokens = [
        sp.Rational(l_ - o)
        for lrow, orow in zip(logp, old, strict=True)
        for l_, o in zip(lrow, orow, strict=True)
    ]
    n = max(len(units), 1)
    return {
        "ratio_mean": sum(ratios) / n if units else sp.Integer(1),
        "ratio_min": _extreme(ratios, -1) if units else sp.Integer(1),
        "ratio_max": _extreme(ratios, 1) if units else sp.Integer(1),
        "clip_fraction": sp.Rational(sum(closed(r, a) for r, a, _ in units), n),
        "policy_objective": sum((surrogate(r, a, lp) for r, a, lp in units), sp.Integer(0)) / n,
        "approx_kl": sum((sp.exp(x) - 1 - x for x in tokens), sp.Integer(0)) / max(len(tokens), 1),
    }


def _extreme(values: list[sp.Expr], direction: int) -> sp.Expr:
    """The largest (direction 1) or smallest (-1) of exact numbers, by proven signs (the first on
    a tie)."""
    best = values[0]
    for v in values[1:]:
        if sign(v - best) == direction:
            best = v
    return best


# ---------------------------------------------------------------------------------------------
# policy loss under the frameworks' conventions

_TRL = dict(
    log_ratio_clamp=None,
    dual_clip=None,
    kl_log_ratio_clamp=None,
    kl_value_clamp=None,
    empty_rows="keep",
    seq_sum_width="max_length",
    token_sum_rows="all",
    kl_importance_weight=True,
    sapo_tau_float32=False,
    sequence_ratio_gradient="sequence",
    sequence_log_ratio_cap=None,
)
_VERL = dict(
    log_ratio_clamp=20.0,
    dual_clip=3.0,
    kl_log_ratio_clamp=20.0,
    kl_value_clamp=10.0,
    empty_rows="drop",
    seq_sum_width="max_length",
    token_sum_rows="all",
    kl_importance_weight=False,
    sapo_tau_float32=False,
    sequence_ratio_gradient="sequence",
    sequence_log_ratio_cap=None,
)
_VERL_GSPO = dict(
    _VERL,
    log_ratio_clamp=None,
    dual_clip=None,
    empty_rows="keep",
    token_sum_rows="nonempty",
    sequence_ratio_gradient="token",
    sequence_log_ratio_cap=10.0,
)
_OPENRLHF = dict(
    log_ratio_clamp=20.0,
    dual_clip=None,
    kl_log_ratio_clamp=None,
    kl_value_clamp=10.0,
    empty_rows="drop",
    seq_sum_width="max_length",
    token_sum_rows="nonempty",
    kl_importance_weight=False,
    sapo_tau_float32=False,
    sequence_ratio_gradient="sequence",
    sequence_log_ratio_cap=None,
)

#: The numerical flags of each framework's profile per preset that the convention vectors use (data
#: that mirrors ``refimpl.conformance.profile(framework, preset)``; a test checks that they agree).
CONVENTION_FLAGS: dict[str, dict[str, dict[str, object]]] = {
    "trl": {
        **{p: dict(_TRL) for p in ("ppo", "grpo", "dr_grpo", "dapo", "bnpo", "gspo", "cispo")},
        "sapo": dict(_TRL, sapo_tau_float32=True),
        "gspo+token_sum": dict(_TRL),
    },
    # verl 0.9.1 as its trainer drives it: global_batch_size counts every row (empty ones too),
    # Dr. GRPO's loss_scale_factor set to L_max (refimpl.conformance.frameworks.verl)
    "verl": {
        **{p: dict(_VERL) for p in ("ppo", "bnpo", "dapo", "dr_grpo", "dr_grpo+token_sum")},
        "grpo": dict(_VERL, empty_rows="keep"),
        "gspo": dict(_VERL_GSPO),
        "gspo_token": dict(_VERL_GSPO),
        "sapo": dict(_VERL, dual_clip=None, empty_rows="keep", token_sum_rows="nonempty"),
        "cispo": dict(_VERL, dual_clip=None, token_sum_rows="nonempty"),
    },
    # OpenRLHF 0.11.2: its KL is evaluated in float32 (flag kl_compute_dtype); its KL vectors use inputs
    # on which that is exact and carry CONVENTION_KL_FLAGS
    "openrlhf": {
        **{p: dict(_OPENRLHF) for p in ("ppo", "bnpo", "dapo", "grpo")},
        "gspo": dict(_OPENRLHF, log_ratio_clamp=None),
    },
}

#: The framework mode whose profile a point of ``GOLDEN_VARIANTS`` has in ``CONVENTION_FLAGS`` (a
#: preset's is the framework's profile for the preset): TRL's loss_type="luspo", verl's
#: loss_agg_mode="seq-mean-token-sum" (refimpl.conformance.frameworks).
VARIANT_MODES: dict[str, dict[str, str]] = {
    "trl": {"gspo+token_sum": "luspo"},
    "verl": {"dr_grpo+token_sum": "vanilla/seq-mean-token-sum"},
}

#: Frameworks whose k3 KL term the exact spec describes at any inputs (the kl_penalty class).
_KL_CONVENTIONS = ("trl", "verl")

#: The KL flags a framework's KL vectors carry beyond ``CONVENTION_FLAGS`` (mirrors
#: ``refimpl.conformance.profile``; a test checks that they agree). OpenRLHF's ``compute_approx_kl``
#: evaluates every estimator in float32 (k3 as ``exp(-x) - 1 + x`` with ``x = logp - ref`` bounded
#: below by -10, i.e. ``log r`` above by 10), clamps every estimator's value to [-10, 10], and its
#: training step adds the KL as a global token mean whatever the policy term's aggregation. Its KL
#: vectors (``_float32_exact_kl_batches``) use inputs on which that float32 arithmetic is exact.
CONVENTION_KL_FLAGS: dict[str, dict[str, object]] = {
    "openrlhf": dict(
        kl_log_ratio_max=10.0,
        kl_value_clamp_scope="all",
        kl_aggregation="token_mean",
        kl_compute_dtype="float32",
        kl_k3_form="naive",
    ),
}
# the reference values of those flags (refimpl.conformance.Convention's defaults)
_KL_FLAG_DEFAULTS = dict(
    kl_log_ratio_max=None,
    kl_value_clamp_scope="k3",
    kl_aggregation="policy",
    kl_compute_dtype="input",
    kl_k3_form="accurate",
)


def _kl_value(estimator: str, logp: sp.Expr, ref: sp.Expr, flags: dict) -> sp.Expr:
    """One token's KL estimate under the flags (kl.md eqs. (2)-(4), ``log r = ref - logp``): k3 with
    ``log r`` clamped to [-c, c] (``kl_log_ratio_clamp``) and above at ``kl_log_ratio_max``; the
    value clamped to [-c, c] (``kl_value_clamp``) for k3, or for every estimator under
    ``kl_value_clamp_scope="all"``. The compute dtype and k3's form are not modelled: the vectors
    that carry them have inputs on which they make no difference."""
    f = {**_KL_FLAG_DEFAULTS, **flags}
    log_r = ref - logp
    if estimator == "k3":
        log_r = _clamp(log_r, f["kl_log_ratio_clamp"])
        if f["kl_log_ratio_max"] is not None:
            log_r = sp.Min(log_r, sp.Rational(f["kl_log_ratio_max"]))
        value = sp.exp(log_r) - 1 - log_r
    elif estimator == "k2":
        value = log_r**2 / 2
    else:
        value = -log_r
    if estimator == "k3" or f["kl_value_clamp_scope"] == "all":
        value = _clamp(value, f["kl_value_clamp"])
    return value


def _clamp(x: sp.Expr, c) -> sp.Expr:
    return x if c is None else sp.Max(sp.Min(x, sp.Rational(c)), -sp.Rational(c))


def _float32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _convention_spec(spec: LossSpec, flags: dict) -> LossSpec:
    """The variant a framework runs for ``spec`` (mirrors ``refimpl.conformance.effective_variant``):
    its dual clip on token-level hard clips, float32 SAPO temperatures, GSPO's token-form ratio."""
    if (
        flags["dual_clip"] is not None
        and spec.gate == "clip"
        and spec.ratio == "token"
        and spec.dual_clip is None
    ):
        spec = dataclasses.replace(spec, dual_clip=max(flags["dual_clip"], 1.0 + (spec.eps_high or 0.0)))
    if flags["sapo_tau_float32"] and spec.gate == "sapo":
        spec = dataclasses.replace(spec, tau_pos=_float32(spec.tau_pos), tau_neg=_float32(spec.tau_neg))
    if spec.ratio == "sequence_mean" and flags["sequence_ratio_gradient"] == "token":
        aggregation = "seq_mean_token_mean" if spec.aggregation == "seq_mean" else spec.aggregation
        spec = dataclasses.replace(spec, ratio="gspo_token", aggregation=aggregation)
    return spec


def _convention_denominator(spec: LossSpec, lengths, flags) -> sp.Expr:
    """policy_losses.md eq. (11) with the flags: empty rows kept or dropped from sequence means; the
    token sums (seq_sum, seq_mean_token_sum) over all, the non-empty or no rows, Dr. GRPO's times
    L_max or the padded width (= the longest row here)."""
    nonempty, rows = sum(1 for n in lengths if n), len(lengths)
    if spec.aggregation == "token_mean":
        return sp.Integer(max(sum(lengths), 1))
    if spec.aggregation not in ("seq_sum", "seq_mean_token_sum"):
        return sp.Integer(max(rows if flags["empty_rows"] == "keep" else nonempty, 1))
    count = {"all": rows, "nonempty": nonempty, "none": 1}[flags["token_sum_rows"]]
    if spec.aggregation == "seq_sum":
        count *= spec.max_length if flags["seq_sum_width"] == "max_length" else max(lengths)
    return sp.Integer(max(count, 1))


def _row_log_ratios(b: _Batch) -> list[Fraction | None]:
    """Each row's exact mean log-ratio ``log s_i`` (policy_losses.md eq. (2)); None for an empty row."""
    return [
        sum((Fraction(l_) - Fraction(o) for l_, o in zip(lrow, orow, strict=True)), Fraction(0)) / len(lrow)
        if lrow
        else None
        for lrow, orow in zip(b.logp, b.old, strict=True)
    ]


def _clamps_active(b: _Batch, flags: dict, estimator: str = "k3") -> bool:
    """Whether a clamp of the convention changes the value (a log-ratio or KL log-ratio beyond its
    clamp, a k3 value beyond the value clamp, or a row's ``log s_i`` beyond the sequence cap)."""
    c, kc, vc = flags["log_ratio_clamp"], flags["kl_log_ratio_clamp"], flags["kl_value_clamp"]
    f = {**_KL_FLAG_DEFAULTS, **flags}
    kmax, every = f["kl_log_ratio_max"], f["kl_value_clamp_scope"] == "all"
    cap = flags["sequence_log_ratio_cap"]
    if cap is not None and any(x is not None and x > Fraction(cap) for x in _row_log_ratios(b)):
        return True
    for i, row in enumerate(b.logp):
        for t, l_ in enumerate(row):
            x = Fraction(l_) - Fraction(b.old[i][t])
            if c is not None and abs(x) > c:
                return True
            if b.ref is not None:
                log_r = float(Fraction(b.ref[i][t]) - Fraction(l_))
                if estimator != "k3":
                    value = -log_r if estimator == "k1" else log_r * log_r / 2
                    if vc is not None and every and abs(value) > vc:
                        return True
                    continue
                if (kc is not None and abs(log_r) > kc) or (kmax is not None and log_r > kmax):
                    return True
                k3 = math.expm1(min(log_r, 700.0)) - log_r
                if vc is not None and abs(k3) > vc:
                    return True
    return False


def _capped_rows(built, row_log_ratios: list[Fraction | None], cap: float) -> dict:
    """verl's GSPO cap (``torch.clamp(logp - sg(logp) + sg(log s_i), max=cap)`` per token, then exp):
    on a row whose exact ``log s_i`` exceeds ``cap`` every token's ratio is ``exp(cap)`` with zero
    gradient (the clamp is active), so ``logp`` and ``sg(logp)`` of the row's tokens are replaced by
    ``K_t = sg(logp_t) - (log s_i - cap)``: no ``logp`` left, and ``mean_t (K_t - old_t) = cap``. A
    row exactly on the cap keeps its gradient (torch.clamp passes it on the bound, as the spec's
    inclusive gates do)."""
    subs = {}
    rows = zip(built.logp, built.logp_sg, built.old_logp, row_log_ratios, strict=True)
    for row_l, row_s, row_o, log_s in rows:
        if log_s is None or log_s <= Fraction(cap):
            continue
        mean_sg = sum((s_ - o for s_, o in zip(row_s, row_o, strict=True)), sp.Integer(0)) / len(row_s)
        for lsym, ssym in zip(row_l, row_s, strict=True):
            subs[lsym] = subs[ssym] = ssym - (mean_sg - sp.Rational(cap))
    return subs


def _convention_vector(name: str, convention: str, b: _Batch) -> dict:
    """A policy vector under a framework's flags: the spec's loss with the global denominator of the
    flags, ``logp - old_logp`` clamped before exp in the surrogate (CISPO: in its detached weight
    only, ``A * logp`` keeps ``logp``), and the k3 KL with its log-ratio
    and value clamps (substituted into the exact-KL symbols), times the unit's ratio under
    ``kl_importance_weight``, differentiated after substitution."""
    flags = CONVENTION_FLAGS[convention][name]
    spec = _convention_spec(GOLDEN_POINTS[name], flags)
    if b.ref is not None:
        flags = {**flags, **CONVENTION_KL_FLAGS.get(convention, {})}
        spec = dataclasses.replace(spec, kl_coef=0.0625, kl_estimator=b.kl_estimator)
    token_mean_kl = b.ref is not None and flags.get("kl_aggregation") == "token_mean"
    cap = flags["sequence_log_ratio_cap"]
    if cap is not None and spec.ratio != "gspo_token":
        raise AssertionError(f"{convention}/{name}: sequence_log_ratio_cap needs the GSPO-token ratio")
    lengths = b.lengths
    kl_source = "exact" if b.ref is not None and not token_mean_kl else "none"
    built = build_policy_loss(
        dataclasses.replace(spec, kl_coef=0.0) if token_mean_kl else spec,
        tuple(lengths),
        False,
        kl_source,
        False,
        True,
    )
    subs = {}
    for row_l, row_s, row_o in zip(built.logp, built.logp_sg, built.old_logp, strict=True):
        for lsym, ssym, osym in zip(row_l, row_s, row_o, strict=True):
            # CISPO's log-ratio is only in its detached weight (logp_sg); A * logp keeps logp raw
            if spec.gate != "cispo":
                subs[lsym] = osym + _clamp(lsym - osym, flags["log_ratio_clamp"])
            subs[ssym] = osym + _clamp(ssym - osym, flags["log_ratio_clamp"])
    if cap is not None:
        subs.update(_capped_rows(built, _row_log_ratios(b), cap))
    loss, abs_scale = built.loss.xreplace(subs), built.abs_scale.xreplace(subs)
    if kl_source == "exact":
        kl_subs = {}
        rows = zip(built.kl, built.logp, built.ref_logp, built.old_logp, strict=True)
        for row_k, row_l, row_r, row_o in rows:
            row_ratio = sum((l_ - o for l_, o in zip(row_l, row_o, strict=True)), sp.Integer(0)) / max(
                len(row_l), 1
            )
            for ksym, lsym, rsym, osym in zip(row_k, row_l, row_r, row_o, strict=True):
                kl_subs[ksym] = _kl_value(spec.kl_estimator, lsym, rsym, flags)
                if flags["kl_importance_weight"]:  # TRL use_bias_correction_kl: k3 x the unit's ratio
                    unit_log_ratio = row_ratio if spec.ratio == "sequence_mean" else lsym - osym
                    kl_subs[ksym] = kl_subs[ksym] * sp.exp(unit_log_ratio)
        loss, abs_scale = loss.xreplace(kl_subs), abs_scale.xreplace(kl_subs)
    if token_mean_kl:  # kl_aggregation "token_mean": beta * sum of every token's KL / the tokens
        beta, tokens = sp.Rational(spec.kl_coef), max(sum(lengths), 1)
        row_kls = [
            sum(
                (_kl_value(spec.kl_estimator, l_, r_, flags) for l_, r_ in zip(rl, rr, strict=True)),
                sp.Integer(0),
            )
            for rl, rr in zip(built.logp, built.ref_logp, strict=True)
        ]
        loss = loss + beta * sum(row_kls, sp.Integer(0)) / tokens
        abs_scale = abs_scale + beta * sum((sp.Abs(k) for k in row_kls), sp.Integer(0)) / tokens
    denominator = _convention_denominator(spec, lengths, flags)
    loss, abs_scale = (x.xreplace({built.normalizer: denominator}) for x in (loss, abs_scale))
    values = {built.logp: b.logp, built.logp_sg: b.logp, built.old_logp: b.old, built.advantages: b.adv}
    if b.ref is not None:
        values[built.ref_logp] = b.ref
    point = {}
    for symbols, numbers in values.items():
        for sym, num in zip(symbols, numbers, strict=True):
            if isinstance(sym, tuple):
                point.update({s_: sp.Rational(n_) for s_, n_ in zip(sym, num, strict=True)})
            else:
                point[sym] = sp.Rational(num)
    evaluators: dict = {}  # the gradient entries share sub-expressions

    def num(expr: sp.Expr) -> str:
        return _num(to_digits(expr.xreplace(point), DIGITS, evaluators))

    grad = [[num(sp.diff(loss, lsym)) for lsym in row] for row in built.logp]
    vector_flags = _policy_flags(spec, b)
    if _clamps_active(b, flags, spec.kl_estimator):
        vector_flags.add("convention_clamp_active")
    return vector(
        f"policy_loss/{convention}/{name}/{b.case_class}/{b.index}",
        vector_flags,
        preset=name,
        case_class=b.case_class,
        convention=convention,
        convention_flags=dict(sorted(flags.items())),
        variant=dataclasses.asdict(spec),
        inputs=_policy_inputs_json(b),
        expected={"loss": num(loss), "grad_logp": grad, "abs_scale": num(abs_scale)},
    )


def _v1_convention_batches(convention: str, seed: int) -> dict[tuple[str, str], _Batch]:
    """The convention vectors of schema version 1 (TRL and verl; GRPO, DAPO, Dr. GRPO and GRPO's k3
    KL), drawn from the same per-convention random stream, so their inputs and values are unchanged."""
    rng = random.Random(f"{seed}/{convention}")
    out = {}
    for name in ("grpo", "dapo", "dr_grpo"):
        lengths = [4, 0, 2, 3]
        logp, old, _ = _ragged_inputs(rng, lengths, (-0.8, 0.8), False)
        adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
        out[name, "ragged_empty_row"] = _Batch("ragged_empty_row", lengths, adv, logp, old)
    lengths = [3, 2]
    logp, old, ref = _ragged_inputs(rng, lengths, (-0.5, 0.5), True)
    ref[0][0] = logp[0][0] + 24
    ref[1][1] = logp[1][1] - 23
    adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
    out["grpo", "kl_penalty"] = _Batch("kl_penalty", lengths, adv, logp, old, ref)
    return out


def _convention_batches(convention: str, name: str, seed: int) -> list[_Batch]:
    v1 = _v1_convention_batches(convention, seed) if convention in ("trl", "verl") else {}
    rng = random.Random(f"{seed}/{convention}/{name}")
    band = _band(GOLDEN_POINTS[name])
    out = []
    lengths = [4, 0, 2, 3]
    logp, old, _ = _ragged_inputs(rng, lengths, (band[0] * 1.6, band[1] * 1.6), False)
    adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
    out.append(v1.get((name, "ragged_empty_row")) or _Batch("ragged_empty_row", lengths, adv, logp, old))
    lengths = [3, 1, 2]
    logp, old, _ = _ragged_inputs(rng, lengths, band, False)
    adv = [_dyadic(rng, 0.25, 1.5), -_dyadic(rng, 0.25, 1.5), _dyadic(rng, -1.5, 1.5)]
    out.append(_Batch("mixed", lengths, adv, logp, old))
    old = [[Fraction(-1), Fraction(-2)], [Fraction(-3, 2), Fraction(-1), Fraction(-2)]]
    logp = [[Fraction(49), Fraction(-52)], [Fraction(-51, 2), Fraction(23), Fraction(-9, 4)]]
    out.append(_Batch("extreme_log_ratio", [2, 3], [Fraction(-3, 4), Fraction(5, 4)], logp, old))
    # ratio 1 on ragged rows with an empty one: the gradient is -A u_i / D (policy_losses.md eq. (17)),
    # which isolates the convention's denominator; and one token, where every convention agrees
    lengths = [3, 0, 1, 2]
    _, old, _ = _ragged_inputs(rng, lengths, band, False)
    adv = [_dyadic(rng, 0.25, 1.5), Fraction(1, 2), -_dyadic(rng, 0.25, 1.5), _dyadic(rng, -1.5, 1.5)]
    out.append(_Batch("ratio_one", lengths, adv, old, old))
    logp, old, _ = _ragged_inputs(rng, [1], band, False)
    out.append(_Batch("single_token", [1], [-_dyadic(rng, 0.25, 1.5)], logp, old))
    if convention in _KL_CONVENTIONS:
        lengths = [3, 2]
        logp, old, ref = _ragged_inputs(rng, lengths, band, True)
        ref[0][0] = logp[0][0] + 24
        ref[1][1] = logp[1][1] - 23
        adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
        out.append(v1.get((name, "kl_penalty")) or _Batch("kl_penalty", lengths, adv, logp, old, ref))
    if CONVENTION_FLAGS[convention][name]["sequence_log_ratio_cap"] is not None:
        out += _sequence_cap_batches(convention, name, seed)
    if convention in CONVENTION_KL_FLAGS:
        out += _float32_exact_kl_batches(convention, name, seed)
    return out


def _float32_exact_kl_batches(convention: str, name: str, seed: int) -> list[_Batch]:
    """A KL penalty with each estimator (``kl_k1_penalty``, ``kl_k2_penalty``, ``kl_penalty`` for k3;
    a separate random stream) for a framework that evaluates its KL in float32 with a global token
    mean (OpenRLHF): inputs on which every float32 operation of that KL is exact
    (``_check_float32_exact_kl``), so the exact spec with the convention's clamps is also the
    framework's float32 result. ``x = logp - ref`` (OpenRLHF's log-ratio, ``-log r``): k1 and k2 at
    multiples of 1/64 in [-4, 4] (k2's square then has at most 16 bits) plus values beyond the
    value clamp of 10 (k1: 12 and -11.5; k2: 5); k3 only where float32 is exact: x = 0, and values
    far beyond the clamp (x >= 11: k3 > 10 whatever exp rounds to; x <= -3, including x <= -10
    where OpenRLHF's bound of log r at 10 acts). Rows [3, 0, 1, 4]: 8 tokens, so the token mean
    divides exactly."""
    rng = random.Random(f"{seed}/{convention}/{name}/kl")
    band = _band(GOLDEN_POINTS[name])
    lengths = [3, 0, 1, 4]

    def grid() -> Fraction:
        return Fraction(rng.randint(-256, 256), 64)

    shifts = {
        "k1": [grid(), grid(), Fraction(12), grid(), grid(), Fraction(-23, 2), grid(), grid()],
        "k2": [grid(), Fraction(5), grid(), grid(), grid(), grid(), grid(), grid()],
        "k3": [Fraction(v) for v in (0, 11, -3, 0, 25, Fraction(-21, 2), -22, 0)],
    }
    out = []
    for estimator, case_class in (("k1", "kl_k1_penalty"), ("k2", "kl_k2_penalty"), ("k3", "kl_penalty")):
        logp, old, _ = _ragged_inputs(rng, lengths, band, False)
        xs = iter(shifts[estimator])
        ref = [[l_ - next(xs) for l_ in row] for row in logp]
        adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
        flags = ("log_ratio_20",) if any(abs(x) > 20 for x in shifts[estimator]) else ()
        b = _Batch(case_class, lengths, adv, logp, old, ref, flags=flags, kl_estimator=estimator)
        _check_float32_exact_kl(b, 0.0625)
        out.append(b)
    return out


def _check_float32_exact_kl(b: _Batch, kl_coef: float) -> None:
    """Raise unless OpenRLHF's float32 KL term is exact on ``b``: log-probs and ``x = logp - ref``
    are float32 numbers; k2's ``x^2 / 2`` too; k3 only at x = 0 (exp(0) = 1) or where its value
    exceeds the clamp of 10 by far more than a float32 rounding (x >= 11, x <= -3); the clamped
    values lie on a grid 2^-k with sum |v| < 2^(24 - k), so every partial sum, in any order, is
    exact; the token count and ``kl_coef`` are powers of two (the mean and the scaling are exact)."""

    def f32(x: Fraction) -> bool:
        return Fraction(_float32(float(x))) == x

    values = []
    for lrow, rrow in zip(b.logp, b.ref, strict=True):
        for l_, r_ in zip(lrow, rrow, strict=True):
            x = Fraction(l_) - Fraction(r_)
            if not (f32(Fraction(l_)) and f32(Fraction(r_)) and f32(x)):
                raise AssertionError(f"{b.case_class}: {l_}, {r_} or their difference is not a float32")
            if b.kl_estimator == "k3" and not (x == 0 or x >= 11 or x <= -3):
                raise AssertionError(f"{b.case_class}: float32 k3 is not exact at x = {x}")
            value = {"k1": x, "k2": x * x / 2, "k3": Fraction(10) if x else Fraction(0)}[b.kl_estimator]
            if not f32(value):
                raise AssertionError(f"{b.case_class}: the KL value {value} is not a float32")
            values.append(max(min(value, Fraction(10)), Fraction(-10)))
    denominator = max(v.denominator for v in values)
    tokens = len(values)
    exact_sums = sum(abs(v) for v in values) * denominator < 2**24
    if not exact_sums or tokens & (tokens - 1) or Fraction(kl_coef).numerator != 1:
        raise AssertionError(f"{b.case_class}: the float32 token mean of the KL is not exact")


def _sequence_cap_batches(convention: str, name: str, seed: int) -> list[_Batch]:
    """verl GSPO's cap of ``log s_i`` at 10 (``sequence_log_ratio_cap``; a separate random stream):
    rows beyond the cap with A < 0 (the ratio becomes exp(10) with zero gradient) and A > 0 (clipped
    either way), a row with token log-ratios of +25 and -20 whose mean stays below the cap (GSPO has
    no per-token clamp), and a row exactly on the cap (log s = 10, exact in float64 too: the
    clamp passes the gradient on its bound)."""
    rng = random.Random(f"{seed}/{convention}/{name}/sequence_cap")
    band = _band(GOLDEN_POINTS[name])

    def row(shifts: list[Fraction]) -> tuple[list[Fraction], list[Fraction]]:
        old = [_dyadic(rng, -3.0, -0.125) for _ in shifts]
        return [o + x for o, x in zip(old, shifts, strict=True)], old

    rows = [
        row([Fraction(12), Fraction(9), Fraction(21, 2)]),  # log s = 10.5
        row([Fraction(23, 2), Fraction(21, 2)]),  # log s = 11
        row([Fraction(25), Fraction(-20)]),  # log s = 2.5
    ]
    logp2, old2, _ = _ragged_inputs(rng, [3], band, False)
    adv = [-_dyadic(rng, 0.25, 1.5), _dyadic(rng, 0.25, 1.5), -_dyadic(rng, 0.25, 1.5)]
    adv.append(_dyadic(rng, -1.5, 1.5))
    beyond = _Batch(
        "sequence_log_ratio_cap",
        [3, 2, 2, 3],
        adv,
        [r[0] for r in rows] + logp2,
        [r[1] for r in rows] + old2,
        flags=("log_ratio_20",),
    )
    on_cap = row([Fraction(19, 2), Fraction(21, 2)])  # log s = 10 exactly
    logp2, old2, _ = _ragged_inputs(rng, [2], band, False)
    tie = _Batch(
        "sequence_log_ratio_on_cap",
        [2, 2],
        [-_dyadic(rng, 0.25, 1.5), _dyadic(rng, -1.5, 1.5)],
        [on_cap[0]] + logp2,
        [on_cap[1]] + old2,
        flags=("log_ratio_on_cap",),
    )
    return [beyond, tie]


def convention_vectors(
    conventions: tuple[str, ...] | None = None,
    presets: tuple[str, ...] | None = None,
    *,
    seed: int = 20251121,
) -> list[dict]:
    """Policy vectors under each framework's profile (``CONVENTION_FLAGS``: TRL, verl, OpenRLHF) for
    every preset the framework profiles and the token-sum points of its modes (``VARIANT_MODES``): an
    empty row with ragged lengths, mixed ratios, log-ratios of
    +-50 and +-24 (beyond verl's / OpenRLHF's +-20 clamps), (TRL, verl) a k3 KL with |log r| > 20,
    (verl GSPO) rows beyond and on its cap of log s (``_sequence_cap_batches``) and (OpenRLHF) a KL
    with each estimator on inputs where its float32 KL is exact (``_float32_exact_kl_batches``)."""
    out = []
    for convention in conventions or tuple(CONVENTION_FLAGS):
        for name in presets or tuple(CONVENTION_FLAGS[convention]):
            if name not in CONVENTION_FLAGS[convention]:
                continue
            for b in _convention_batches(convention, name, seed):
                out.append(_convention_vector(name, convention, b))
    return out


# ---------------------------------------------------------------------------------------------
# KL estimators (kl.md) and group advantages (advantages.md)


def _kl_point_flags(logp, ref) -> set[str]:
    if isinstance(logp, str) or isinstance(ref, str):
        return {"nan_input" if NAN in (logp, ref) else "inf_input"}
    log_r = Fraction(ref) - Fraction(logp)
    flags = set()
    if log_r == 0:
        flags.add("log_ratio_zero")
    elif abs(log_r) <= Fraction(1, 2**20):
        flags.add("log_ratio_tiny")
    if abs(log_r) > 20:
        flags.add("log_ratio_20")
    if abs(log_r) >= 50:
        flags.add("log_ratio_50")
    if log_r >= 40 * math.log(2):
        flags.add("large_ratio")
    if any(0 < abs(Fraction(v)) < Fraction(1, 2**1022) for v in (logp, ref)):
        flags.add("subnormal_input")
    return flags


def kl_vectors(*, seed: int = 20251121) -> list[dict]:
    """k1, k2, k3 (kl.md eqs. (1)-(4)) and d/d logp at dyadic points: |log r| from 0 and 2^-52 to
    50 on both sides, subnormal log-probs, and NaN / inf inputs that must be rejected."""
    x, y = sp.symbols("logp ref_logp", real=True)
    rng = random.Random(f"{seed}/kl")
    points = [
        (Fraction(-1), Fraction(-1)),
        (Fraction(-1), Fraction(-1) + Fraction(1, 1024)),
        (Fraction(-2), Fraction(48)),
        (Fraction(-3, 2), Fraction(-103, 2)),
        (Fraction(-1, 4), Fraction(-81, 4)),
    ]
    points += [(_dyadic(rng, -4, -0.125), _dyadic(rng, -4, -0.125)) for _ in range(5)]
    # schema 2: tiny log-ratios (k3 cancels), the +-20 clamps, large ratios, subnormal inputs
    points += [
        (Fraction(-1), Fraction(-1) + Fraction(1, 2**21)),
        (Fraction(-1, 2), Fraction(-1, 2) - Fraction(1, 2**30)),
        (Fraction(-1, 2), Fraction(-1, 2) + Fraction(1, 2**52)),
        (Fraction(-3), Fraction(-3) + Fraction(1, 2**40)),
        (Fraction(-22), Fraction(-1, 2)),
        (Fraction(-1, 2), Fraction(-45, 2)),
        (Fraction(-30), Fraction(0)),
        (Fraction(-60), Fraction(-1, 8)),
        (Fraction(-1, 8), Fraction(-60)),
        (Fraction(-1, 2**1040), Fraction(-1, 4)),
        (Fraction(-1, 4), Fraction(-1, 2**1040)),
        (Fraction(0), Fraction(0)),
    ]
    points += [(_dyadic(rng, -12, -0.125), _dyadic(rng, -12, -0.125)) for _ in range(3)]
    # a magnitude sweep: log r = +-2^k from 2^-52 to 2^6 (the conditioning of each estimator)
    half = Fraction(-1, 2)
    points += [
        (half, half + s_ * Fraction(2) ** k)
        for k in (-52, -40, -30, -24, -16, -8, -2, 0, 2, 4, 5, 6)
        for s_ in (1, -1)
    ]
    invalid = [(NAN, Fraction(-1)), (Fraction(-1), NAN), (NEG_INF, Fraction(-1)), (Fraction(-1), POS_INF)]
    out = []
    for name in ("k1", "k2", "k3"):
        expr = k_estimator(name, x, y)
        deriv = sp.diff(expr, x)
        for index, (logp, ref) in enumerate(points):
            subs = {x: sp.Rational(logp), y: sp.Rational(ref)}
            value, slope = _digits(expr.xreplace(subs)), _digits(deriv.xreplace(subs))
            flags = _kl_point_flags(logp, ref)
            if _subnormal([value, slope]):
                flags.add("subnormal_result")
            out.append(
                vector(
                    f"kl/{name}/{index}",
                    flags,
                    estimator=name,
                    inputs={"logp": _num(logp), "ref_logp": _num(ref)},
                    # no absolute floor: kl.md's estimators are computed without cancellation
                    expected={"value": value, "d_value_d_logp": slope, "abs_scale": "0.0"},
                )
            )
        for index, (logp, ref) in enumerate(invalid, start=len(points)):
            out.append(
                vector(
                    f"kl/{name}/{index}",
                    _kl_point_flags(logp, ref),
                    "invalid",
                    "a log-prob is NaN or infinite",
                    estimator=name,
                    inputs={"logp": _num(logp), "ref_logp": _num(ref)},
                    expected=None,
                )
            )
    return out


def _advantage_batches(seed: int) -> dict[str, tuple[list, list[int], tuple[str, ...]]]:
    """case class -> (rewards, group ids, flags that the inputs carry by construction)."""
    rng = random.Random(f"{seed}/advantages")
    batches = {
        "unequal_groups": ([_dyadic(rng, -1, 2) for _ in range(9)], [4, 1, 4, 1, 1, 9, 9, 4, 9], ()),
        "binary_rewards": ([Fraction(v) for v in (1, 0, 0, 1, 1, 1, 0, 1)], [0, 0, 0, 0, 1, 1, 1, 1], ()),
        "zero_variance_group": (
            [Fraction(1, 2)] * 3 + [Fraction(1), Fraction(0), Fraction(1)],
            [0, 0, 0, 1, 1, 1],
            (),
        ),
        "singleton_group": ([Fraction(1), Fraction(0), Fraction(1), Fraction(1, 4)], [0, 1, 1, 2], ()),
    }
    rng = random.Random(f"{seed}/advantages/v2")
    batches.update(
        {
            "single_group": ([_dyadic(rng, -2, 2) for _ in range(5)], [7] * 5, ()),
            "pairs": ([_dyadic(rng, -1, 1) for _ in range(6)], [0, 0, 1, 1, 2, 2], ()),
            "all_singletons": ([Fraction(1), Fraction(-1, 2), Fraction(3, 4)], [0, 1, 2], ()),
            "tiny_variance": (
                [Fraction(1), Fraction(1) + Fraction(1, 2**20), Fraction(1), Fraction(0), Fraction(1)],
                [0, 0, 0, 1, 1],
                ("tiny_variance",),
            ),
            "large_rewards": (
                [Fraction(2**20) * _dyadic(rng, -4, 4) for _ in range(6)],
                [0, 1, 0, 1, 0, 1],
                (),
            ),
            "negative_group_ids": ([_dyadic(rng, -1, 1) for _ in range(5)], [-3, 5, -3, 5, -3], ()),
            "binary_all_zero_but_one": (
                [Fraction(v) for v in (0, 0, 0, 1, 0, 0, 0, 0)],
                [0] * 4 + [1] * 4,
                (),
            ),
            "subnormal_rewards": (
                [Fraction(3, 2**1060), Fraction(0), Fraction(-1, 2**1062), Fraction(5, 2**1061)],
                [0, 0, 1, 1],
                (),
            ),
        }
    )
    return batches


def _advantage_flags(rewards, ids, arguments) -> set[str]:
    groups: dict[int, list] = {}
    for r, g in zip(rewards, ids, strict=True):
        groups.setdefault(g, []).append(Fraction(r))
    flags = set()
    sizes = [len(v) for v in groups.values()]
    if any(n == 1 for n in sizes):
        flags.add("singleton_group")
    if any(len(v) >= 2 and len(set(v)) == 1 for v in groups.values()):
        flags.add("zero_variance_group")
    if len(set(sizes)) > 1:
        flags.add("unequal_groups")
    if len(groups) == 1:
        flags.add("single_group")
    if any(ids[i] != ids[i + 1] and ids[i] in ids[i + 2 :] for i in range(len(ids) - 1)):
        flags.add("non_contiguous_groups")
    if all(Fraction(r) in (0, 1) for r in rewards):
        flags.add("binary_rewards")
    if max(abs(Fraction(r)) for r in rewards) >= 2**20:
        flags.add("large_rewards")
    if any(0 < abs(Fraction(r)) < Fraction(1, 2**1022) for r in rewards):
        flags.add("subnormal_input")
    if arguments.get("leave_one_out"):
        flags.add("leave_one_out")
    return flags


def _advantage_abs_scale(rewards, ids, arguments) -> sp.Expr:
    """The sum over samples of the absolute terms of eqs. (1)-(5), ``(|R_i| + mean_j |R_j|) / s``
    (the baseline's own mean over the group, or over the others for leave-one-out): a centred reward
    is a difference of numbers of that size, so its rounding error scales with it (large when a
    tiny variance meets a small eps)."""
    r = [sp.Rational(x) for x in rewards]
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(ids):
        groups.setdefault(g, []).append(i)
    scale, total = arguments["scale"], sp.Integer(0)
    for members in groups.values():
        values = [r[i] for i in members]
        n = len(members)
        if n == 1:
            if arguments["singleton"] == "raw":
                eps = sp.Rational(arguments.get("eps") or 0)
                unit = (
                    1 if scale == "none" else (sp.sqrt(1 + eps) if arguments["eps_inside_sqrt"] else 1 + eps)
                )
                total += abs(values[0]) / unit
            continue
        if scale == "none":
            s = sp.Integer(1)
        else:
            pool = values if scale == "group" else r
            s = _std(pool, arguments["std"], arguments["eps"], arguments["eps_inside_sqrt"])
        if s == 0:
            continue
        for i in members:
            others = [abs(r[j]) for j in members if j != i or not arguments.get("leave_one_out")]
            total += (abs(r[i]) + sum(others) / len(others)) / s
    return total


def advantage_vectors(*, seed: int = 20251121) -> list[dict]:
    """group_advantages_exact (advantages.md eqs. (1)-(6), (14)-(15)) under each convention, with
    unequal non-contiguous groups, zero-variance and singleton groups (valid, or invalid where the
    convention rejects them), tiny variances, large and subnormal rewards, and invalid inputs (NaN,
    inf, a length mismatch)."""
    out = []
    batches = _advantage_batches(seed)
    for conv_name, kwargs in ADVANTAGE_CONVENTIONS.items():
        for case_class, (rewards, ids, extra) in batches.items():
            flags = _advantage_flags(rewards, ids, kwargs) | set(extra)
            common = dict(
                convention=conv_name,
                arguments=kwargs,
                case_class=case_class,
                inputs={"rewards": [_num(r) for r in rewards], "group_ids": ids},
            )
            vid = f"advantages/{conv_name}/{case_class}"
            try:
                values = group_advantages_exact([sp.Rational(r) for r in rewards], ids, **kwargs)
            except ValueError as exc:
                flags.add("rejected_by_convention")
                out.append(
                    vector(
                        vid,
                        flags,
                        "invalid",
                        f"the convention rejects the batch: {exc}",
                        expected=None,
                        **common,
                    )
                )
                continue
            evaluators: dict = {}
            advantages = [_digits(v, evaluators) if v != 0 else "0" for v in values]  # "0": as in version 1
            if _subnormal(advantages):
                flags.add("subnormal_result")
            scale = _digits(_advantage_abs_scale(rewards, ids, kwargs), evaluators)
            out.append(vector(vid, flags, expected={"advantages": advantages, "abs_scale": scale}, **common))
        invalid = {
            "nan_reward": ([Fraction(1), NAN, Fraction(0)], [0, 0, 1], "nan_input", "a reward is NaN"),
            "inf_reward": ([Fraction(1), Fraction(0), NEG_INF], [0, 0, 0], "inf_input", "a reward is -inf"),
            "length_mismatch": (
                [Fraction(1), Fraction(0), Fraction(1)],
                [0, 0],
                "shape_mismatch",
                "3 rewards and 2 group ids",
            ),
        }
        for case_class, (rewards, ids, flag, reason) in invalid.items():
            out.append(
                vector(
                    f"advantages/{conv_name}/{case_class}",
                    {flag},
                    "invalid",
                    reason,
                    expected=None,
                    convention=conv_name,
                    arguments=kwargs,
                    case_class=case_class,
                    inputs={"rewards": [_num(r) for r in rewards], "group_ids": ids},
                )
            )
    return out


# ---------------------------------------------------------------------------------------------
# files


_TABULAR = Path(__file__).resolve().with_name("golden_tabular.py")


def _tabular_vectors() -> list[dict]:
    """The tabular MDP family (``specs.golden_tabular.tabular_vectors``; its flags and reasons are
    that module's ``FLAGS`` / ``REASONS``, documented there), with ``reason`` null where valid."""
    module = importlib.import_module("specs.golden_tabular")
    flags, reasons = set(module.FLAGS), set(getattr(module, "REASONS", ()))
    out = []
    for v in module.tabular_vectors():
        if not set(v["flags"]) <= flags or v["result"] not in RESULTS:
            raise ValueError(f"tabular vector {v['id']}: flags or result outside the vocabulary")
        if v["result"] == "invalid" and reasons and v.get("reason") not in reasons:
            raise ValueError(f"tabular vector {v['id']}: reason {v.get('reason')!r} outside REASONS")
        out.append({**v, "flags": sorted(v["flags"]), "reason": v.get("reason")})
    return out


def vector_builders() -> dict[str, tuple[str, object]]:
    """``{file name: (kind, builder)}`` for every vector file; the tabular file only when
    ``specs.golden_tabular`` exists."""
    from specs import golden_estimators as est

    builders: dict[str, tuple[str, object]] = {
        "policy_loss.json": ("policy_loss", policy_loss_vectors),
        "policy_loss_conventions.json": ("policy_loss_conventions", convention_vectors),
        "kl.json": ("kl", kl_vectors),
        "advantages.json": ("advantages", advantage_vectors),
        "logprobs.json": ("logprobs", est.logprob_vectors),
        "returns.json": ("returns", est.returns_vectors),
        "importance.json": ("importance", est.importance_vectors),
    }
    if _TABULAR.is_file():  # this checkout's file (an installed copy elsewhere must not be picked up)
        builders["tabular.json"] = ("tabular", _tabular_vectors)
    return builders


def document(kind: str, vectors: list[dict]) -> dict:
    """The top level of a vector file (schema version 2)."""
    return {
        "schema": "rl-oracle-golden-vectors",
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "digits": DIGITS,
        "generator": "python -m specs.golden",
        "vectors": vectors,
    }


def all_vector_files() -> dict[str, dict]:
    """``{file name: document}`` for every vector file."""
    return {name: document(kind, build()) for name, (kind, build) in vector_builders().items()}


def dumps(doc: dict) -> str:
    """The canonical serialisation (sorted keys, one-space indent, trailing newline)."""
    return json.dumps(doc, sort_keys=True, indent=1) + "\n"


def write_vectors(directory: Path = VECTOR_DIR, only: tuple[str, ...] | None = None) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for file_name, (kind, build) in vector_builders().items():
        if only and file_name not in only:
            continue
        path = directory / file_name
        path.write_text(dumps(document(kind, build())))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specs.golden", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=VECTOR_DIR, help="output directory")
    parser.add_argument(
        "--only",
        action="append",
        metavar="FILE",
        help="write only this file (repeatable), e.g. --only kl.json",
    )
    args = parser.parse_args(argv)
    for path in write_vectors(args.out, tuple(args.only or ())):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

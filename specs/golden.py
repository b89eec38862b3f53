"""Golden test vectors from the sympy specs: ``python -m specs.golden`` writes ``specs/vectors/*.json``.

Every expected value is the exact spec (``specs.policy_losses.build_policy_loss``,
``specs.kl.k_estimator``, ``specs.advantages.group_advantages_exact``) correctly rounded to 50
significant digits (169 bits, ``specs._exact.to_digits``: the working precision is raised until
they are certain); inputs are dyadic rationals (multiples of 1/1024, or integers such as +-50), so their
decimal strings are exactly the binary float64 values an implementation receives, and most of
them are exact in bfloat16/float16 too. The schema is documented and versioned in
``specs/vectors/SCHEMA.md``; case ids are stable. Regeneration is bit-identical: the inputs come
from a fixed ``random.Random`` seed, the numbers are printed by sympy at a fixed precision, and
the JSON is written with sorted keys.

This module imports neither ``refimpl`` nor ``tabular`` (the preset parameters below are data;
a test checks that they equal refimpl's presets).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from fractions import Fraction
from pathlib import Path

import sympy as sp

from specs._exact import sign, to_digits
from specs.advantages import group_advantages_exact
from specs.kl import k_estimator
from specs.policy_losses import LossSpec, build_policy_loss, evaluate, hard_clip_term, sapo_term

__all__ = [
    "SCHEMA_VERSION",
    "DIGITS",
    "GOLDEN_PRESETS",
    "ADVANTAGE_CONVENTIONS",
    "policy_loss_vectors",
    "CONVENTION_FLAGS",
    "convention_vectors",
    "kl_vectors",
    "advantage_vectors",
    "all_vector_files",
    "write_vectors",
    "main",
]

SCHEMA_VERSION = 1
DIGITS = 50
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

#: group_advantages conventions of the advantage vectors (the kit's profiles).
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

_GRID = 1024  # inputs are multiples of 1 / _GRID


def _dyadic(rng: random.Random, low: float, high: float) -> Fraction:
    return Fraction(rng.randint(int(low * _GRID), int(high * _GRID)), _GRID)


def _num(x: sp.Expr | Fraction | int) -> str:
    """A number as a decimal string: inputs exactly (dyadic), outputs at DIGITS significant digits."""
    if isinstance(x, (Fraction, int)):
        return repr(float(x)) if Fraction(float(x)) == Fraction(x) else str(x)
    return str(sp.Float(x, DIGITS))


def _ragged_inputs(rng: random.Random, lengths, log_ratio_range, kl: bool):
    logp, old, ref = [], [], []
    for n in lengths:
        o = [_dyadic(rng, -3.0, -0.125) for _ in range(n)]
        x = [_dyadic(rng, *log_ratio_range) for _ in range(n)]
        old.append(o)
        logp.append([a + b for a, b in zip(o, x, strict=True)])
        ref.append([a + _dyadic(rng, -0.5, 0.5) for a in o] if kl else None)
    return logp, old, (ref if kl else None)


def _policy_case(
    name: str,
    spec: LossSpec,
    case_class: str,
    index: int,
    lengths,
    adv,
    logp,
    old,
    ref=None,
    normalizer=None,
    dtype="float64",
):
    built = build_policy_loss(
        spec, tuple(lengths), False, "ref" if ref is not None else "none", False, normalizer is not None
    )
    values = {
        "logp": [[sp.Rational(v) for v in row] for row in logp],
        "old_logp": [[sp.Rational(v) for v in row] for row in old],
        "advantages": [sp.Rational(a) for a in adv],
    }
    if ref is not None:
        values["ref_logp"] = [[sp.Rational(v) for v in row] for row in ref]
    if normalizer is not None:
        values["normalizer"] = sp.Rational(normalizer)
    loss, grad, abs_scale = evaluate(built, values, DIGITS)
    return {
        "id": f"policy_loss/{name}/{case_class}/{index}",
        "preset": name,
        "case_class": case_class,
        "variant": {k: v for k, v in dataclasses.asdict(spec).items()},
        "inputs": {
            "dtype": dtype,
            "lengths": list(lengths),
            "logp": [[_num(v) for v in row] for row in logp],
            "old_logp": [[_num(v) for v in row] for row in old],
            "ref_logp": None if ref is None else [[_num(v) for v in row] for row in ref],
            "advantages": [_num(a) for a in adv],
            "normalizer": None if normalizer is None else _num(normalizer),
        },
        "expected": {
            "loss": _num(loss),
            "grad_logp": [[_num(g) for g in row] for row in grad],
            "abs_scale": _num(abs_scale),
            "metrics": {
                k: _num(to_digits(v, DIGITS)) for k, v in sorted(_metrics(spec, logp, old, adv).items())
            },
        },
        "convention": "reference",
    }


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
    min / max (1 for no units), the fraction of units whose hard-clip gate (inclusive, seed 001
    (116)) is closed (0 for the other gates) and the mean surrogate ``policy_objective``; over
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


def _band(spec: LossSpec) -> tuple[float, float]:
    if spec.gate in ("clip", "cispo") and spec.eps_high is not None and spec.eps_high < 0.01:
        return -0.001, 0.001  # GSPO: sequence ratios straddle its narrow band
    return -0.5, 0.5


def policy_loss_vectors(presets: tuple[str, ...] | None = None, *, seed: int = 20251121) -> list[dict]:
    """Vectors per preset: mixed ratios (inside / outside the band, both advantage signs), ragged
    lengths, an empty row, extreme log-ratios (+-50, +-20), a micro-batch with a global normaliser,
    inputs exact in bfloat16, and (GRPO / BNPO) a k3 KL penalty. No input sits exactly on a clip
    boundary (a dyadic log-ratio never exponentiates to 1 +- eps); the kit covers exact ties."""
    out = []
    for name in presets or tuple(GOLDEN_PRESETS):
        spec = GOLDEN_PRESETS[name]
        rng = random.Random(f"{seed}/{name}")
        band = _band(spec)
        specs_and_cases = []
        lengths = [3, 1, 4, 2]
        logp, old, _ = _ragged_inputs(rng, lengths, band, False)
        adv = [
            _dyadic(rng, 0.25, 1.5),
            -_dyadic(rng, 0.25, 1.5),
            _dyadic(rng, -1.5, 1.5),
            -_dyadic(rng, 0.25, 1.5),
        ]
        specs_and_cases.append(("mixed", lengths, adv, logp, old, None, None, "float64"))
        lengths = [5, 2, 0, 3, 1]
        logp, old, _ = _ragged_inputs(rng, lengths, (band[0] * 2, band[1] * 2), False)
        adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
        specs_and_cases.append(("ragged_empty_row", lengths, adv, logp, old, None, None, "float64"))
        lengths = [3, 2]
        old = [[Fraction(-1), Fraction(-2), Fraction(-1, 2)], [Fraction(-3, 2), Fraction(-1)]]
        logp = [[Fraction(49), Fraction(-52), Fraction(39, 2)], [Fraction(-43, 2), Fraction(29)]]
        specs_and_cases.append(
            (
                "extreme_log_ratio",
                lengths,
                [Fraction(3, 4), Fraction(-5, 4)],
                logp,
                old,
                None,
                None,
                "float64",
            )
        )
        lengths = [2, 3]
        logp, old, _ = _ragged_inputs(rng, lengths, band, False)
        adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
        specs_and_cases.append(
            ("micro_batch_global_normalizer", lengths, adv, logp, old, None, Fraction(11), "float64")
        )
        lengths = [2, 3]
        logp = [[Fraction(rng.randint(-96, -8), 32) for _ in range(n)] for n in lengths]
        old = [[Fraction(rng.randint(-96, -8), 32) for _ in range(n)] for n in lengths]
        if spec.eps_high is not None and spec.eps_high < 0.01:
            old = [list(row) for row in logp]
            old[0][0] += Fraction(1, 32)
        adv = [Fraction(rng.randint(-48, 48), 32) for _ in lengths]
        specs_and_cases.append(("bf16_exact_inputs", lengths, adv, logp, old, None, None, "bfloat16"))
        for case_class, lengths, adv, logp, old, ref, normalizer, dtype in specs_and_cases:
            out.append(
                _policy_case(name, spec, case_class, 0, lengths, adv, logp, old, ref, normalizer, dtype)
            )
        if name in ("grpo", "bnpo"):
            kl_spec = dataclasses.replace(spec, kl_coef=0.0625)
            lengths = [3, 2, 4]
            logp, old, ref = _ragged_inputs(rng, lengths, band, True)
            adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
            vector = _policy_case(name, kl_spec, "kl_penalty", 0, lengths, adv, logp, old, ref)
            out.append(vector)
    return out


#: The numerical flags of the frameworks' profiles that the convention vectors exercise (data that
#: mirrors ``refimpl.conformance.profile``; a test checks that they agree).
CONVENTION_FLAGS: dict[str, dict[str, object]] = {
    "trl": dict(
        log_ratio_clamp=None,
        dual_clip=None,
        kl_log_ratio_clamp=None,
        kl_value_clamp=None,
        empty_rows="keep",
        seq_sum_width="max_length",
        seq_sum_rows="all",
        kl_importance_weight=True,
    ),
    # verl 0.9.1 as its trainer drives it: global_batch_size counts every row (empty ones too),
    # Dr. GRPO's loss_scale_factor set to L_max (refimpl.conformance.frameworks.verl)
    "verl": dict(
        log_ratio_clamp=20.0,
        dual_clip=3.0,
        kl_log_ratio_clamp=20.0,
        kl_value_clamp=10.0,
        empty_rows="keep",
        seq_sum_width="max_length",
        seq_sum_rows="all",
    ),
}


def _clamp(x: sp.Expr, c) -> sp.Expr:
    return x if c is None else sp.Max(sp.Min(x, sp.Rational(c)), -sp.Rational(c))


def _convention_denominator(spec: LossSpec, lengths, flags) -> sp.Expr:
    """policy_losses.md eq. (11) with the flags: empty rows kept or dropped from sequence means; Dr.
    GRPO over all or non-empty rows times L_max or the padded width (= the longest row here)."""
    nonempty, rows = sum(1 for n in lengths if n), len(lengths)
    if spec.aggregation == "token_mean":
        return sp.Integer(max(sum(lengths), 1))
    if spec.aggregation == "seq_sum":
        width = spec.max_length if flags["seq_sum_width"] == "max_length" else max(lengths)
        return sp.Integer(max((rows if flags["seq_sum_rows"] == "all" else nonempty) * width, 1))
    return sp.Integer(max(rows if flags["empty_rows"] == "keep" else nonempty, 1))


def _convention_case(
    name: str, convention: str, spec: LossSpec, case_class: str, lengths, adv, logp, old, ref=None
) -> dict:
    """A policy vector under a framework's flags: the spec's loss with the global denominator of the
    flags, ``logp - old_logp`` clamped before exp in the surrogate, and the k3 KL with its log-ratio
    and value clamps (substituted into the exact-KL symbols), times the token ratio
    ``exp(logp - old_logp)`` under ``kl_importance_weight``, differentiated after substitution."""
    flags = CONVENTION_FLAGS[convention]
    if flags["dual_clip"] is not None and spec.gate == "clip" and spec.ratio == "token":
        spec = dataclasses.replace(spec, dual_clip=flags["dual_clip"])
    built = build_policy_loss(
        spec, tuple(lengths), False, "exact" if ref is not None else "none", False, True
    )
    subs = {}
    for row_l, row_s, row_o in zip(built.logp, built.logp_sg, built.old_logp, strict=True):
        for lsym, ssym, osym in zip(row_l, row_s, row_o, strict=True):
            subs[lsym] = osym + _clamp(lsym - osym, flags["log_ratio_clamp"])
            subs[ssym] = osym + _clamp(ssym - osym, flags["log_ratio_clamp"])
    loss, abs_scale = built.loss.xreplace(subs), built.abs_scale.xreplace(subs)
    if ref is not None:
        kl_subs = {}
        rows = zip(built.kl, built.logp, built.ref_logp, built.old_logp, strict=True)
        for row_k, row_l, row_r, row_o in rows:
            for ksym, lsym, rsym, osym in zip(row_k, row_l, row_r, row_o, strict=True):
                log_r = _clamp(rsym - lsym, flags["kl_log_ratio_clamp"])
                kl_subs[ksym] = _clamp(sp.exp(log_r) - 1 - log_r, flags["kl_value_clamp"])
                if flags.get("kl_importance_weight", False):  # TRL use_bias_correction_kl: k3 x ratio
                    kl_subs[ksym] = kl_subs[ksym] * sp.exp(lsym - osym)
        loss, abs_scale = loss.xreplace(kl_subs), abs_scale.xreplace(kl_subs)
    denominator = _convention_denominator(spec, lengths, flags)
    loss, abs_scale = (x.xreplace({built.normalizer: denominator}) for x in (loss, abs_scale))
    values = {built.logp: logp, built.logp_sg: logp, built.old_logp: old, built.advantages: adv}
    if ref is not None:
        values[built.ref_logp] = ref
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
    return {
        "id": f"policy_loss/{convention}/{name}/{case_class}/0",
        "preset": name,
        "case_class": case_class,
        "convention": convention,
        "convention_flags": dict(sorted(flags.items())),
        "variant": dataclasses.asdict(spec),
        "inputs": {
            "dtype": "float64",
            "lengths": list(lengths),
            "logp": [[_num(v) for v in row] for row in logp],
            "old_logp": [[_num(v) for v in row] for row in old],
            "ref_logp": None if ref is None else [[_num(v) for v in row] for row in ref],
            "advantages": [_num(a) for a in adv],
            "normalizer": None,
        },
        "expected": {
            "loss": num(loss),
            "grad_logp": grad,
            "abs_scale": num(abs_scale),
        },
    }


def convention_vectors(*, seed: int = 20251121) -> list[dict]:
    """Policy vectors under the TRL and verl flags (``CONVENTION_FLAGS``) for GRPO, DAPO, Dr. GRPO
    (L_max = 16) and GRPO with a k3 KL (beta = 1/16): an empty row and ragged lengths, and log-ratios
    of +-50 and +-24 (beyond verl's +-20 clamps)."""
    out = []
    for convention in ("trl", "verl"):
        rng = random.Random(f"{seed}/{convention}")
        for name in ("grpo", "dapo", "dr_grpo"):
            spec = GOLDEN_PRESETS[name]
            lengths = [4, 0, 2, 3]
            logp, old, _ = _ragged_inputs(rng, lengths, (-0.8, 0.8), False)
            adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
            out.append(_convention_case(name, convention, spec, "ragged_empty_row", lengths, adv, logp, old))
            old = [[Fraction(-1), Fraction(-2)], [Fraction(-3, 2), Fraction(-1), Fraction(-2)]]
            logp = [[Fraction(49), Fraction(-52)], [Fraction(-51, 2), Fraction(23), Fraction(-9, 4)]]
            out.append(
                _convention_case(
                    name,
                    convention,
                    spec,
                    "extreme_log_ratio",
                    [2, 3],
                    [Fraction(-3, 4), Fraction(5, 4)],
                    logp,
                    old,
                )
            )
        kl_spec = dataclasses.replace(GOLDEN_PRESETS["grpo"], kl_coef=0.0625)
        lengths = [3, 2]
        logp, old, ref = _ragged_inputs(rng, lengths, (-0.5, 0.5), True)
        ref[0][0] = logp[0][0] + 24
        ref[1][1] = logp[1][1] - 23
        adv = [_dyadic(rng, -1.5, 1.5) for _ in lengths]
        out.append(_convention_case("grpo", convention, kl_spec, "kl_penalty", lengths, adv, logp, old, ref))
    return out


def kl_vectors(*, seed: int = 20251121) -> list[dict]:
    """k1, k2, k3 (kl.md eqs. (1)-(4)) and d/d logp at dyadic points, |log r| from 2^-10 to 50."""
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
    out = []
    for name in ("k1", "k2", "k3"):
        expr = k_estimator(name, x, y)
        deriv = sp.diff(expr, x)
        for index, (logp, ref) in enumerate(points):
            subs = {x: sp.Rational(logp), y: sp.Rational(ref)}
            out.append(
                {
                    "id": f"kl/{name}/{index}",
                    "estimator": name,
                    "inputs": {"logp": _num(logp), "ref_logp": _num(ref)},
                    "expected": {
                        "value": _num(to_digits(expr.xreplace(subs), DIGITS)),
                        "d_value_d_logp": _num(to_digits(deriv.xreplace(subs), DIGITS)),
                    },
                }
            )
    return out


def advantage_vectors(*, seed: int = 20251121) -> list[dict]:
    """group_advantages_exact (advantages.md eqs. (1)-(6)) under each convention, with unequal
    non-contiguous groups, a zero-variance group and a singleton (where the convention allows)."""
    rng = random.Random(f"{seed}/advantages")
    batches = {
        "unequal_groups": ([_dyadic(rng, -1, 2) for _ in range(9)], [4, 1, 4, 1, 1, 9, 9, 4, 9]),
        "binary_rewards": ([Fraction(v) for v in (1, 0, 0, 1, 1, 1, 0, 1)], [0, 0, 0, 0, 1, 1, 1, 1]),
        "zero_variance_group": (
            [Fraction(1, 2)] * 3 + [Fraction(1), Fraction(0), Fraction(1)],
            [0, 0, 0, 1, 1, 1],
        ),
        "singleton_group": ([Fraction(1), Fraction(0), Fraction(1), Fraction(1, 4)], [0, 1, 1, 2]),
    }
    out = []
    for conv_name, kwargs in ADVANTAGE_CONVENTIONS.items():
        for case_class, (rewards, ids) in batches.items():
            try:
                values = group_advantages_exact([sp.Rational(r) for r in rewards], ids, **kwargs)
                expected = {
                    "advantages": [_num(to_digits(v, DIGITS)) if v != 0 else "0" for v in values],
                    "error": None,
                }
            except ValueError as exc:
                expected = {"advantages": None, "error": str(exc)}
            out.append(
                {
                    "id": f"advantages/{conv_name}/{case_class}",
                    "convention": conv_name,
                    "arguments": kwargs,
                    "case_class": case_class,
                    "inputs": {"rewards": [_num(r) for r in rewards], "group_ids": ids},
                    "expected": expected,
                }
            )
    return out


def _document(kind: str, vectors: list[dict]) -> dict:
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
    return {
        "policy_loss.json": _document("policy_loss", policy_loss_vectors()),
        "policy_loss_conventions.json": _document("policy_loss_conventions", convention_vectors()),
        "kl.json": _document("kl", kl_vectors()),
        "advantages.json": _document("advantages", advantage_vectors()),
    }


def dumps(document: dict) -> str:
    """The canonical serialisation (sorted keys, one-space indent, trailing newline)."""
    return json.dumps(document, sort_keys=True, indent=1) + "\n"


def write_vectors(directory: Path = VECTOR_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for file_name, document in all_vector_files().items():
        path = directory / file_name
        path.write_text(dumps(document))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specs.golden", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=VECTOR_DIR, help="output directory")
    args = parser.parse_args(argv)
    for path in write_vectors(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The primitives every golden-vector file shares: exact numbers as decimal strings, the non-finite
spellings, the dyadic input grid and the schema-2 vector record (specs/vectors/SCHEMA.md).

Kept apart from ``specs.golden`` (the policy-loss, KL and advantage vectors and the generator's
command line) so that ``specs.golden_estimators`` can use them without importing ``specs.golden``,
which imports it: no import circle.
"""

from __future__ import annotations

import random
from fractions import Fraction

import sympy as sp

from specs._exact import to_digits
from specs.golden_flags import FLAGS, RESULTS

__all__ = ["DIGITS", "NAN", "NEG_INF", "POS_INF", "vector"]

DIGITS = 50
_GRID = 1024  # inputs are multiples of 1 / _GRID
NAN, POS_INF, NEG_INF = "NaN", "Infinity", "-Infinity"  # non-finite inputs (parse in Python and JS)


def _dyadic(rng: random.Random, low: float, high: float) -> Fraction:
    return Fraction(rng.randint(int(low * _GRID), int(high * _GRID)), _GRID)


def _num(x) -> str:
    """A number as a decimal string: inputs exactly (dyadic: the shortest round-trip repr of the
    float64), outputs at DIGITS significant digits, the non-finite strings unchanged."""
    if isinstance(x, str):
        return x
    if isinstance(x, float):
        x = Fraction(x)
    if isinstance(x, (Fraction, int)):
        if Fraction(float(x)) != Fraction(x):
            raise ValueError(f"input {x} is not exactly a float64")
        return repr(float(x))
    return str(sp.Float(x, DIGITS))


def _digits(expr, evaluators: dict | None = None) -> str:
    """The exact value of ``expr`` as a 50-digit string ("0.0" for an exact zero, as in version 1)."""
    value = to_digits(expr, DIGITS, evaluators)
    return "0.0" if value == 0 else _num(value)


def vector(vid: str, flags, result: str = "valid", reason: str | None = None, **fields) -> dict:
    """One schema-2 vector: ``id``, ``flags`` (sorted, from ``FLAGS``), ``result`` and ``reason``
    (null for valid vectors), plus the family's fields."""
    unknown = sorted(set(flags) - set(FLAGS))
    if unknown:
        raise ValueError(f"vector {vid}: unknown flags {unknown}")
    if result not in RESULTS:
        raise ValueError(f"vector {vid}: result must be one of {RESULTS}, got {result!r}")
    if (result == "valid") != (reason is None):
        raise ValueError(f"vector {vid}: reason is required exactly for invalid / acceptable vectors")
    return {"id": vid, "flags": sorted(set(flags)), "result": result, "reason": reason, **fields}


def _subnormal(values: list[str]) -> bool:
    return any(0 < abs(float(v)) < 2.0**-1022 or (v not in ("0", "0.0") and float(v) == 0.0) for v in values)

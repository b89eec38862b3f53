"""Evaluation of spec expressions at guaranteed accuracy (docs/architecture.md "Exactness").

A sympy expression with exact numeric leaves (integers, rationals, the exact binary value of a
float) is evaluated in interval arithmetic: + - * / and integer powers by ``mpmath.iv`` (bounds
rounded outward), exp / log / sqrt by mpmath's value at each bound widened by 4 ulp or more (mpmath
computes them with guard bits to within 1 ulp; ``mpmath.iv.exp`` itself is not used: it returns the
point interval ``1 + x`` for tiny x, which excludes the true value). So the true value is always
inside the computed interval. The working precision is
doubled until every number in the interval rounds to the same result, so the answer is *proven*
correctly rounded -- whatever cancellation the expression has (``exp(x) - 1 - x`` at x = 1e-177
needs about 1200 bits) and at any magnitude:

- ``to_float64(expr)``: the correctly rounded float64 (round to nearest, ties to even), with
  gradual underflow (a subnormal, or a signed 0 below half the smallest subnormal) and +-inf
  where the exact value overflows (|x| >= 2^1024 (1 - 2^-54)).
- ``to_digits(expr, digits)``: the value correctly rounded to ``dps_to_prec(digits)`` bits (169
  bits for 50 digits, the precision sympy's ``N(expr, 50)`` returns) as a sympy Float; the
  Integer 0 for an exact zero.
- ``sign(expr)``: -1, 0 or 1, proven.
- ``decisions(atoms, subs)``: proven values of ``Min``, ``Max``, ``Abs`` and relationals (the
  conditions of a ``Piecewise`` gate) at a point, to substitute before sympy compares numbers.

Rational expressions take an exact path (``fractions``); an expression that is exactly zero or
exactly on a rounding tie without being rational is settled by sympy's zero test after the
interval has shrunk below ``2^-MAX_PREC`` relative to its terms; if that fails the functions
raise ``PrecisionExhausted`` -- they never return digits that are not certain. Sub-results are
cached per working precision, so the many gradient entries of one loss share their work.
Imports neither ``refimpl`` nor ``tabular``.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import mpmath
import sympy as sp
from mpmath import iv
from mpmath.libmp import (
    dps_to_prec,
    finf,
    fnan,
    fninf,
    from_man_exp,
    fzero,
    mpf_abs,
    mpf_add,
    mpf_cmp,
    mpf_exp,
    mpf_log,
    mpf_pi,
    mpf_pos,
    mpf_shift,
    mpf_sign,
    mpf_sqrt,
    mpf_sub,
)
from sympy.core.evalf import PrecisionExhausted

__all__ = [
    "PrecisionExhausted",
    "MAX_PREC",
    "exact",
    "enclose",
    "to_float64",
    "to_digits",
    "sign",
    "decisions",
    "Evaluator",
]

#: The largest working precision (bits) before the zero test / PrecisionExhausted.
MAX_PREC = 1 << 15
_START_GUARD = 32  # bits above the target precision for the first attempt
_HUGE_MAG = 4096  # exp of an argument with |x| >= 2^_HUGE_MAG is bounded, not computed


def exact(value) -> sp.Expr:
    """A float becomes its exact binary value (``exact(0.1) != 1/10``), a Fraction its Rational;
    sympy objects and ints are sympified unchanged."""
    if isinstance(value, float):
        return sp.Rational(value)
    if isinstance(value, Fraction):
        return sp.Rational(value.numerator, value.denominator)
    return sp.sympify(value)


class Evaluator:
    """Interval enclosures of sympy expressions at one working precision, cached by expression."""

    def __init__(self, prec: int):
        self.prec = prec
        self._cache: dict[sp.Basic, object] = {}

    def __call__(self, expr: sp.Basic):
        saved = iv.prec  # mpmath.iv has no workprec context manager
        iv.prec = self.prec
        try:
            return self._eval(expr)
        finally:
            iv.prec = saved

    def _eval(self, expr: sp.Basic):
        hit = self._cache.get(expr)
        if hit is not None:
            return hit
        value = self._node(expr)
        self._cache[expr] = value
        return value

    def _node(self, e: sp.Basic):
        if e.is_Integer:
            return iv.mpf(int(e))
        if e.is_Rational:
            return iv.mpf(int(e.p)) / iv.mpf(int(e.q))
        if e.is_Float:
            return iv.make_mpf((e._mpf_, e._mpf_))
        if e is sp.pi:  # (iv.pi / iv.e do not follow iv.prec)
            pi = mpf_pi(self.prec, "n")
            return iv.make_mpf((_widen(pi, self.prec, "f"), _widen(pi, self.prec, "c")))
        if e is sp.E:
            return self._exp(iv.mpf(1))
        if isinstance(e, sp.Piecewise):  # conditions decided beforehand (``decisions``)
            for value, condition in e.args:
                if _truth(condition):
                    return self._eval(value)
            raise PrecisionExhausted(f"no piece of {e} applies")
        if e.is_Add:
            args = [self._eval(a) for a in e.args]
            total = args[0]
            for a in args[1:]:
                total = total + a
            return total
        if e.is_Mul:
            args = [self._eval(a) for a in e.args]
            total = args[0]
            for a in args[1:]:
                total = total * a
            return total
        if e.is_Pow:
            base, power = e.args
            if power.is_Integer:
                return self._eval(base) ** int(power)
            if power == sp.Rational(1, 2):
                return self._monotone(mpf_sqrt, self._eval(base))
            if power == sp.Rational(-1, 2):
                return 1 / self._monotone(mpf_sqrt, self._eval(base))
            return self._exp(self._eval(power) * self._log(self._eval(base)))
        if isinstance(e, sp.exp):
            return self._exp(self._eval(e.args[0]))
        if isinstance(e, sp.log):
            return self._log(self._eval(e.args[0]))
        if isinstance(e, sp.Abs):
            return abs(self._eval(e.args[0]))
        if isinstance(e, (sp.Max, sp.Min)):
            bounds = [self._eval(a)._mpi_ for a in e.args]
            pick = mpf_max if isinstance(e, sp.Max) else mpf_min
            return iv.make_mpf((pick(lo for lo, _ in bounds), pick(hi for _, hi in bounds)))
        raise PrecisionExhausted(f"cannot evaluate {type(e).__name__} numerically: {e}")

    def _monotone(self, fn, x):
        """An increasing elementary function on an interval: mpmath's round-to-nearest value at
        each bound (mpmath computes them with guard bits, accurate to 1 ulp), widened outward by
        |y| 2^(3 - prec) (at least 4 ulp). Not mpmath.iv's own functions: ``iv.exp(x)`` returns
        the point interval ``1 + x`` for tiny x, which excludes the true value."""
        a, b = x._mpi_
        lo, hi = fn(a, self.prec, "n"), fn(b, self.prec, "n")
        return iv.make_mpf((_widen(lo, self.prec, "f"), _widen(hi, self.prec, "c")))

    def _log(self, x):
        a, b = x._mpi_
        if mpf_sign(b) <= 0:
            raise PrecisionExhausted("log of a non-positive number")
        if mpf_sign(a) <= 0:  # not yet separated from 0: no lower bound at this precision
            return iv.make_mpf((fninf, _widen(mpf_log(b, self.prec, "n"), self.prec, "c")))
        return self._monotone(mpf_log, x)

    def _exp(self, x):
        """exp on an interval; bounds beyond +-2^_HUGE_MAG get a valid bound instead of an mpf
        with an astronomically long exponent (exp(-2^4096) < 2^-(2^4096))."""
        a, b = x._mpi_
        huge, neg_huge = from_man_exp(1, _HUGE_MAG), from_man_exp(-1, _HUGE_MAG)

        def bound(v, side):
            if mpf_cmp(v, neg_huge) <= 0:
                return fzero if side == "f" else from_man_exp(1, -(1 << _HUGE_MAG))
            if mpf_cmp(v, huge) >= 0:
                return from_man_exp(1, 1 << _HUGE_MAG) if side == "f" else finf
            return _widen(mpf_exp(v, self.prec, "n"), self.prec, side)

        return iv.make_mpf((bound(a, "f"), bound(b, "c")))


def _truth(condition) -> bool:
    """A Piecewise condition built from true / false (``decisions``) with And / Or / Not."""
    if condition is sp.true or condition is True:
        return True
    if condition is sp.false or condition is False:
        return False
    if isinstance(condition, sp.And):
        return all(_truth(c) for c in condition.args)
    if isinstance(condition, sp.Or):
        return any(_truth(c) for c in condition.args)
    if isinstance(condition, sp.Not):
        return not _truth(condition.args[0])
    raise PrecisionExhausted(f"undecided condition {condition} (decide it with specs._exact.decisions)")


def _widen(y: tuple, prec: int, side: str) -> tuple:
    """``y -+ |y| 2^(3 - prec)``, rounded outward (side "f": down, "c": up)."""
    if y in (fzero, finf, fninf):
        return y
    delta = mpf_shift(mpf_abs(y), 3 - prec)
    return mpf_sub(y, delta, prec, "f") if side == "f" else mpf_add(y, delta, prec, "c")


def enclose(expr, prec: int):
    """An ``mpmath.iv`` interval that contains the exact value of ``expr``, at ``prec`` bits."""
    return Evaluator(prec)(exact(expr))


def mpf_max(values):
    return functools.reduce(lambda x, y: y if mpf_cmp(y, x) > 0 else x, values)


def mpf_min(values):
    return functools.reduce(lambda x, y: y if mpf_cmp(y, x) < 0 else x, values)


def _mpf_to_float64(x: tuple) -> float:
    """The correctly rounded float64 of a raw mpf tuple (gradual underflow, +-inf on overflow)."""
    if x in (finf, fninf):
        return float("inf") if x == finf else float("-inf")
    if x == fnan:
        raise PrecisionExhausted("interval bound is NaN")
    if x == fzero:
        return 0.0
    sign_bit, man, exp, bc = x
    mag = exp + bc  # 2^(mag - 1) <= |x| < 2^mag
    if mag > 1026:
        return float("-inf") if sign_bit else float("inf")
    if mag < -1080:  # below 2^-1076 < half the smallest subnormal
        return -0.0 if sign_bit else 0.0
    value = Fraction(man * 2**exp) if exp >= 0 else Fraction(man, 2**-exp)
    try:
        out = float(value)  # Fraction -> float is correctly rounded, subnormals included
    except OverflowError:
        out = float("inf")
    return -out if sign_bit else out


def _fraction_to_float64(q: Fraction) -> float:
    try:
        return float(q)
    except OverflowError:
        return float("inf") if q > 0 else float("-inf")


def _schedule(target: int):
    prec = target + _START_GUARD
    while prec <= MAX_PREC:
        yield prec
        prec *= 2


def _settle(expr: sp.Expr, round_interval, round_rational, evaluators: dict[int, Evaluator] | None,
            target: int):
    """Evaluate at doubling precision until ``round_interval`` returns a certain result; rational
    and provably-zero expressions are rounded exactly by ``round_rational``."""
    expr = exact(expr)
    if expr.is_Rational:
        return round_rational(Fraction(int(expr.p), int(expr.q)))
    if expr.free_symbols:
        raise ValueError(f"expression has free symbols {sorted(map(str, expr.free_symbols))}")
    evaluators = {} if evaluators is None else evaluators
    for prec in _schedule(target):
        ev = evaluators.setdefault(prec, Evaluator(prec))
        result = round_interval(ev(expr))
        if result is not None:
            return result
    # The interval never separated: an exact zero or an exact tie written in a non-rational form.
    simplified = sp.simplify(expr)
    if simplified.is_Rational:
        return round_rational(Fraction(int(simplified.p), int(simplified.q)))
    if expr.equals(0) is True:
        return round_rational(Fraction(0))
    raise PrecisionExhausted(f"value of {expr} not certain at {MAX_PREC} bits")


def to_float64(expr, evaluators: dict[int, Evaluator] | None = None) -> float:
    """The exact value of ``expr`` correctly rounded to float64 (see the module docstring).

    ``evaluators``: an optional dict shared by several calls so they share cached sub-results."""

    def round_interval(x):
        lo, hi = (_mpf_to_float64(b) for b in x._mpi_)
        if lo != hi:
            return None
        # -0.0 == 0.0: the whole interval rounds to zero; its sign is certain only if both agree
        return lo if math.copysign(1.0, lo) == math.copysign(1.0, hi) else 0.0

    return _settle(expr, round_interval, _fraction_to_float64, evaluators, 53)


def to_digits(expr, digits: int = 50, evaluators: dict[int, Evaluator] | None = None) -> sp.Float:
    """The exact value of ``expr`` correctly rounded to ``dps_to_prec(digits)`` bits, as a sympy
    Float of that precision (an exact zero: ``sympy.S.Zero``, as ``sympy.N`` returns it)."""
    prec = dps_to_prec(digits)

    def as_float(mpf_tuple) -> sp.Float:
        return sp.Float._new(mpf_tuple, prec)

    def round_interval(x):
        a, b = x._mpi_
        if a == fzero and b == fzero:
            return sp.S.Zero
        if mpf_sign(a) <= 0 <= mpf_sign(b):
            return None
        lo, hi = mpf_pos(a, prec, "n"), mpf_pos(b, prec, "n")
        return as_float(lo) if lo == hi else None

    def round_rational(q: Fraction) -> sp.Float:
        if q == 0:
            return sp.S.Zero
        return as_float(mpmath.libmp.from_rational(q.numerator, q.denominator, prec, "n"))

    return _settle(expr, round_interval, round_rational, evaluators, prec)


def sign(expr, evaluators: dict[int, Evaluator] | None = None) -> int:
    """The sign of the exact value of ``expr`` (-1, 0 or 1), proven."""

    def round_interval(x):
        a, b = x._mpi_
        if mpf_sign(a) > 0:
            return 1
        if mpf_sign(b) < 0:
            return -1
        return None

    def round_rational(q: Fraction) -> int:
        return (q > 0) - (q < 0)

    return _settle(expr, round_interval, round_rational, evaluators, 53)


_RELATIONS = {
    sp.StrictGreaterThan: lambda s: s > 0,
    sp.GreaterThan: lambda s: s >= 0,
    sp.StrictLessThan: lambda s: s < 0,
    sp.LessThan: lambda s: s <= 0,
    sp.Equality: lambda s: s == 0,
    sp.Unequality: lambda s: s != 0,
}


def _node_count(expr: sp.Basic) -> int:
    return sum(1 for _ in sp.preorder_traversal(expr))


def decisions(atoms, subs: dict, evaluators: dict[int, Evaluator] | None = None) -> dict:
    """Proven replacements, at the point ``subs``, for the non-smooth atoms of an expression
    (``Min``, ``Max``, ``Abs`` and relationals such as the conditions of a ``Piecewise``): each
    maps to its chosen argument / signed argument / ``true`` or ``false``, decided by ``sign``.

    Merge the result into ``subs`` before ``xreplace``: sympy would otherwise compare the
    numbers itself, with a fixed low precision first and slowly at large magnitudes (exp(1e300)).
    ``atoms``: e.g. ``expr.atoms(sp.Min, sp.Max, sp.Abs, sp.core.relational.Relational)``;
    inner atoms are decided first, so an outer one sees their decisions."""
    evaluators = {} if evaluators is None else evaluators
    out: dict = {}
    for atom in sorted(atoms, key=_node_count):
        point = {**subs, **out}
        if isinstance(atom, (sp.Min, sp.Max)):
            direction = -1 if isinstance(atom, sp.Min) else 1
            args = [a.xreplace(point) for a in atom.args]
            best = args[0]
            for a in args[1:]:
                if sign(a - best, evaluators) == direction:
                    best = a
            out[atom] = best
        elif isinstance(atom, sp.Abs):
            arg = atom.args[0].xreplace(point)
            out[atom] = -arg if sign(arg, evaluators) < 0 else arg
        elif type(atom) in _RELATIONS:
            s = sign((atom.lhs - atom.rhs).xreplace(point), evaluators)
            out[atom] = sp.true if _RELATIONS[type(atom)](s) else sp.false
    return out

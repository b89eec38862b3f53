"""Executable specifications: sympy expressions that evaluate each quantity exactly (rationals)
or at a working precision raised until the requested digits are certain (``specs._exact``:
``to_float64`` correctly rounded, ``to_digits``, ``sign``), and differentiate it. The Markdown
files beside each module state the definitions with numbered equations. This layer imports
neither ``refimpl`` nor ``tabular``."""

from specs._exact import PrecisionExhausted, exact, sign, to_digits, to_float64

__all__ = ["PrecisionExhausted", "exact", "sign", "to_digits", "to_float64"]

"""Executable specifications: sympy expressions that evaluate each quantity exactly (rationals)
or to 50 digits, and differentiate it. The Markdown files beside each module state the
definitions with numbered equations. This layer imports neither ``refimpl`` nor ``tabular``."""

"""Results of a conformance check: one row per case class, the smallest failing case in full."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

__all__ = ["CaseResult", "ClassResult", "CheckReport", "what_failed"]


@dataclass(frozen=True)
class CaseResult:
    """Outcome of one case: errors are normalised (see ``refimpl.conformance.checks.relative_error``);
    ``error`` holds an exception message when the user's function raised."""

    case_id: str
    case_class: str
    size: int
    value_error: float
    grad_error: float | None
    value_ok: bool
    grad_ok: bool | None
    detail: str = field(default="", repr=False)
    error: str | None = None
    departure: str | None = None  # the named convention flag under which a non-spec result passed
    dtype: str = "float64"
    expected: float | None = None
    got: float | None = None
    explanation: str | None = None  # which flag / aggregation reproduces a failure exactly
    case_line: str = field(default="", repr=False)  # the inputs as one pasteable Python line

    @property
    def ok(self) -> bool:
        return self.value_ok and self.grad_ok is not False and self.error is None

    def to_dict(self) -> dict:
        """JSON-ready fields (non-finite numbers as strings)."""
        return {
            "case_id": self.case_id,
            "case_class": self.case_class,
            "ok": self.ok,
            "value_ok": self.value_ok,
            "grad_ok": self.grad_ok,
            "value_error": _json_number(self.value_error),
            "grad_error": _json_number(self.grad_error),
            "dtype": self.dtype,
            "expected": _json_number(self.expected),
            "got": _json_number(self.got),
            "error": self.error,
            "departure": self.departure,
            "explanation": self.explanation,
            "case": self.case_line,
        }


def _json_number(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return repr(x)


@dataclass(frozen=True)
class ClassResult:
    case_class: str
    cases: int
    value_ok: bool
    grad_ok: bool | None
    max_value_error: float
    max_grad_error: float | None
    departures: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.value_ok and self.grad_ok is not False


def _fmt_err(x: float | None) -> str:
    if x is None:
        return "n/a"
    return "inf" if math.isinf(x) else ("nan" if math.isnan(x) else f"{x:.2e}")


def _fmt_ok(x: bool | None) -> str:
    return "n/a" if x is None else ("ok" if x else "FAIL")


@dataclass(frozen=True)
class CheckReport:
    """All case results of one check, with a table and the smallest failing case."""

    title: str
    results: tuple[CaseResult, ...]
    notes: tuple[str, ...] = ()
    header: tuple[str, ...] = ()  # e.g. the framework, its version and source hash
    list_departures: bool = False  # render every failing class's smallest case with its explanation

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def by_class(self) -> list[ClassResult]:
        order: list[str] = []
        for r in self.results:
            if r.case_class not in order:
                order.append(r.case_class)
        rows = []
        for name in order:
            rs = [r for r in self.results if r.case_class == name]
            grads = [r.grad_error for r in rs if r.grad_error is not None]
            grad_oks = [r.grad_ok for r in rs if r.grad_ok is not None]
            rows.append(
                ClassResult(
                    name,
                    len(rs),
                    all(r.value_ok and r.error is None for r in rs),
                    (all(grad_oks) and all(r.error is None for r in rs)) if grad_oks else None,
                    max(r.value_error for r in rs),
                    max(grads) if grads else None,
                    tuple(sorted({r.departure for r in rs if r.departure})),
                )
            )
        return rows

    def classes(self) -> list[str]:
        """The case classes of this report, in report order."""
        return [c.case_class for c in self.by_class()]

    def failing_classes(self) -> list[str]:
        return [c.case_class for c in self.by_class() if not c.ok]

    def case_class(self, name: str) -> ClassResult:
        """The row of case class ``name``; KeyError naming the classes of the report when it has no
        case of that class (e.g. ``kl_penalty`` without a KL term)."""
        for row in self.by_class():
            if row.case_class == name:
                return row
        present = ", ".join(c.case_class for c in self.by_class()) or "none"
        raise KeyError(f"no case of class {name!r} in this report (classes: {present})")

    def failure_message(self, case_class: str | None = None, *, max_line: int = 4000) -> str:
        """Why ``case_class`` (default: the whole report) failed, as the message of a test failure:
        a first line naming the smallest failing case with its expected and obtained loss (or the
        exception the function raised), the header and title, the class's row, the case in full
        (inputs to 17 digits, expected and obtained values and gradients) and as one line of
        Python for a regression test; a line longer than ``max_line`` characters (a large
        vocabulary's logits) is cut, saying so (``to_dict()`` has it in full). An empty string
        when it passed."""
        failing = [r for r in self.results if not r.ok and case_class in (None, r.case_class)]
        if not failing:
            return ""
        worst = min(failing, key=_diagnostic_order)
        first = f"{worst.case_class} failed: smallest failing case {worst.case_id}: {what_failed(worst)}"
        if not worst.error and worst.expected is not None and worst.got is not None:
            first += f"; loss expected {worst.expected!r}, got {worst.got!r}"
        row = self.case_class(worst.case_class)
        lines = [first, *self.header, self.title]
        lines.append(
            f"case class {row.case_class}: {row.cases} cases, value {_fmt_ok(row.value_ok)}, gradient "
            f"{_fmt_ok(row.grad_ok)}, max value err {_fmt_err(row.max_value_error)}, max grad err "
            f"{_fmt_err(row.max_grad_error)} (errors relative to max|expected| + s)"
        )
        lines.append(f"smallest failing case: {worst.case_id}")
        if worst.explanation:
            lines.append(f"  diagnosis: {worst.explanation}")
        lines.append(worst.detail)
        if worst.case_line:
            lines += ["the case as one line of Python:", f"  {worst.case_line}"]
        return "\n".join(_cut(line, max_line) for line in "\n".join(lines).splitlines())

    def smallest_failure(self) -> CaseResult | None:
        """The most diagnostic failing case: generated float64 cases with finite inputs before those
        with NaN / inf padding, half-precision ones and the golden vectors (whose magnitudes reach
        1e12), then the fewest elements."""
        failures = [r for r in self.results if not r.ok]
        return min(failures, key=_diagnostic_order) if failures else None

    def departures(self) -> list[CaseResult]:
        """Cases that passed only through a named departure from the spec (e.g. masked_nonfinite)."""
        return [r for r in self.results if r.ok and r.departure]

    def to_dict(self) -> dict:
        """The machine-readable report (``refimpl check --json``)."""
        worst = self.smallest_failure()
        return {
            "title": self.title,
            "ok": self.ok,
            "header": list(self.header),
            "notes": list(self.notes),
            "classes": [
                {
                    "case_class": c.case_class,
                    "cases": c.cases,
                    "ok": c.ok,
                    "value_ok": c.value_ok,
                    "grad_ok": c.grad_ok,
                    "max_value_error": _json_number(c.max_value_error),
                    "max_grad_error": _json_number(c.max_grad_error),
                    "departures": list(c.departures),
                }
                for c in self.by_class()
            ],
            "smallest_failure": None if worst is None else worst.case_id,
            "cases": [r.to_dict() for r in self.results],
        }

    def table(self) -> str:
        header = (
            "case class",
            "cases",
            "value ok",
            "gradient ok",
            "max value err",
            "max grad err",
            "departure",
        )
        rows = [
            (
                c.case_class,
                str(c.cases),
                _fmt_ok(c.value_ok),
                _fmt_ok(c.grad_ok),
                _fmt_err(c.max_value_error),
                _fmt_err(c.max_grad_error),
                ", ".join(c.departures),
            )
            for c in self.by_class()
        ]
        widths = [max(len(h), *(len(r[k]) for r in rows)) if rows else len(h) for k, h in enumerate(header)]

        def line(cells):
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

        out = [line(header), line(["-" * w for w in widths])]
        out.extend(line(r) for r in rows)
        return "\n".join(out)

    def render(self) -> str:
        parts = [*self.header, self.title, "", self.table(), ""]
        parts.extend(f"note: {n}" for n in self.notes)
        for departure in sorted({r.departure for r in self.departures()}):
            cases = [r.case_id for r in self.departures() if r.departure == departure]
            parts.append(f"departure from the spec, allowed by {departure}: {', '.join(cases)}")
        worst = self.smallest_failure()
        if worst is not None and self.list_departures:
            parts.append(f"FAIL: case classes {', '.join(self.failing_classes())}")
            for name in self.failing_classes():
                failing = [r for r in self.results if r.case_class == name and not r.ok]
                case = min(failing, key=_diagnostic_order)
                why = case.explanation or "unexplained"
                parts.append(f"departure {name} ({case.case_id}): {why.removeprefix('matches ')}")
                if case.error:
                    parts.append(f"  the function raised: {case.error}")
                parts.append(case.detail)
            return "\n".join(parts)
        if worst is None:
            parts.append(f"PASS: {len(self.results)} cases in {len(self.by_class())} case classes")
        else:
            parts.append(f"FAIL: case classes {', '.join(self.failing_classes())}")
            what = "" if worst.error else f": {what_failed(worst)}"  # an exception has its own line
            parts.append(f"smallest failing case: {worst.case_id}{what}")
            if worst.error:
                parts.append(f"  the function raised: {worst.error}")
            if worst.explanation:
                parts.append(f"  diagnosis: {worst.explanation}")
            parts.append(worst.detail)
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.render()


def what_failed(r: CaseResult) -> str:
    """What failed in one case and by how much, for a headline: the value, the gradient or both, with
    their errors (relative to max|expected| + s, ``tolerance.relative_error``)."""
    if r.error:
        return f"the function raised {r.error}"
    value = f"value off by {_fmt_err(r.value_error)}"
    grad = f"gradient off by {_fmt_err(r.grad_error)}"
    if not r.value_ok and r.grad_ok is False:
        return f"{value} and {grad} (relative)"
    if not r.value_ok:
        return f"{value} (relative)" + ("" if r.grad_ok is None else "; the gradient is right")
    return f"{grad} (relative to its largest entry); the value is right ({_fmt_err(r.value_error)})"


def _cut(line: str, limit: int) -> str:
    if len(line) <= limit:
        return line
    return f"{line[:limit]} ... ({len(line) - limit} more characters: CheckReport.to_dict() has them)"


def _diagnostic_order(r: CaseResult) -> tuple:
    """Plain generated float64 cases first; then NaN / inf inputs, half precision, golden vectors."""
    return (
        r.case_class == "golden_vectors",
        r.dtype != "float64",
        r.case_class == "masked_nonfinite",
        r.size,
        r.case_id,
    )


def tensor_text(name: str, x: torch.Tensor | None) -> str:
    """A tensor printed in full at 17 significant digits (round-trips float64)."""
    if x is None:
        return f"{name} = None"
    with torch.no_grad():
        values = x.detach().double().tolist() if x.is_floating_point() else x.tolist()
    return f"{name} ({str(x.dtype).replace('torch.', '')}, shape {tuple(x.shape)}) = {nested_text(values)}"


def nested_text(v, number=repr) -> str:
    """Nested lists of numbers as text, each float written by ``number``."""
    if isinstance(v, list):
        return "[" + ", ".join(nested_text(x, number) for x in v) + "]"
    if isinstance(v, float):
        return number(v)
    return str(v)

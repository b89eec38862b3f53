"""What a kind of the registry is (``Kind``), its cases (``KindCase``) and the one check of every
registry kind (``run_kind_check``: the engine's loop with the kind's expected values, call and
judgement), with the minimal attribution of a departure to a mode's flags (``attribute``).

A kind is data: its case classes (``cases(seed)``), its flags (a frozen dataclass whose defaults
are the spec: ``flags()`` is the reference), its expected values (``expected(case, flags)``: named
float64 outputs, each with the positions the spec defines) and how the checked function is called
(``call(fn, adapter, case)``: the same names). Adding a kind is one module defining these and one
line in ``kinds/__init__.py`` (docs/conformance.md, "Adding a kind").
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..engine import run_cases
from ..report import CaseResult, CheckReport, tensor_text

__all__ = ["Kind", "KindCase", "Expected", "run_kind_check", "attribute", "check_choices", "flag_text",
           "FLOAT32_RTOL"]

#: the tolerance of an output computed in float32 (a framework that upcasts to float32, not float64):
#: the kinds' cases have at most 16 steps or 40 entries of magnitude <= 10 and inputs exact in float32,
#: so 1e-5 (~170 float32 unit roundoffs relative to the largest expected entry) bounds a sum or a
#: recursion of that length; a one-pass variance on a large offset misses it by orders of magnitude
FLOAT32_RTOL = 1e-5


@dataclass(frozen=True)
class KindCase:
    """One case of a registry kind: named input tensors (float64 unless the class is about a dtype)
    and named scalar parameters (gamma, lam, clip...)."""

    case_class: str
    index: int
    inputs: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    note: str = ""

    @property
    def case_id(self) -> str:
        return f"{self.case_class}/{self.index}"

    @property
    def size(self) -> int:
        return sum(x.numel() for x in self.inputs.values())

    def to(self, device) -> KindCase:
        return dataclasses.replace(self, inputs={k: v.to(device) for k, v in self.inputs.items()})

    def text(self) -> str:
        lines = [f"  ({self.note})"] if self.note else []
        lines += [f"  {tensor_text(k, v)}" for k, v in self.inputs.items()]
        lines += [f"  {k} = {v!r}" for k, v in self.params.items()]
        return "\n".join(lines)

    def line(self) -> str:
        """The inputs as one line of Python."""
        parts = [f"{k} = torch.tensor({v.double().tolist() if v.is_floating_point() else v.tolist()}, "
                 f"dtype={v.dtype})" for k, v in self.inputs.items()]
        return "; ".join(parts + [f"{k} = {v!r}" for k, v in self.params.items()])


@dataclass(frozen=True)
class Expected:
    """An expected output: the float64 values and the positions where the spec defines them (None:
    everywhere); a gradient output is judged as a gradient. ``some_nan``: the convention gives NaN at
    entries no flag pins down (a NaN gradient through 0 / 0): the output must hold a NaN, nothing more."""

    values: torch.Tensor
    where: torch.Tensor | None = None
    gradient: bool = False
    some_nan: bool = False

    def cpu(self) -> Expected:
        where = None if self.where is None else self.where.cpu()
        return Expected(self.values.cpu(), where, self.gradient, self.some_nan)


@dataclass(frozen=True)
class Kind:
    """A kind of the registry (see the module docstring).

    Fields:
        name: the kind's name (``--kind``, ``Mode.kind``).
        title: one line for reports.
        signature: how the kit calls a function of this kind without an adapter.
        flags: the frozen dataclass of the kind's convention flags (defaults: the spec).
        cases: ``cases(seed) -> list[KindCase]``, every case class in report order.
        expected: ``expected(case, flags) -> {output: Expected}`` from the verified reference.
        call: ``call(fn, adapter, case) -> {output: tensor}`` (the same names; gradients by autograd).
        float32_rtol: ``float32_rtol(case) -> float``, the tolerance of a float32 result on an
            ill-conditioned case (derived from its condition number), at least ``FLOAT32_RTOL``.
    """

    name: str
    title: str
    signature: str
    flags: type
    cases: Callable
    expected: Callable
    call: Callable
    float32_rtol: Callable = lambda case: FLOAT32_RTOL

    def case_classes(self, seed: int = 0) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.case_class for c in self.cases(seed)))

    def make_flags(self, values: dict | None = None):
        """The kind's flags with ``values`` set; ValueError naming an unknown flag."""
        names = {f.name for f in dataclasses.fields(self.flags)}
        unknown = sorted(set(values or {}) - names)
        if unknown:
            raise ValueError(f"unknown {self.name} flags {unknown}; valid: {sorted(names)}")
        return self.flags(**(values or {}))


def check_choices(flags, choices: dict[str, tuple]) -> None:
    """A one-line ValueError when a flag of ``flags`` is not among its ``choices`` (a kind's flags
    dataclass calls it in ``__post_init__``); numbers must be >= 0."""
    for name, allowed in choices.items():
        if getattr(flags, name) not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {getattr(flags, name)!r}")
    for f in dataclasses.fields(flags):
        value = getattr(flags, f.name)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if f.name not in choices and (not number or value < 0):
            raise ValueError(f"{f.name} must be a number >= 0, got {value!r}")


def flag_text(flags: dict) -> str:
    """``flag a='x'`` / ``flags a=1, b=2``: the explanation text the matrix reads."""
    return ("flag " if len(flags) == 1 else "flags ") + ", ".join(f"{k}={v!r}" for k, v in flags.items())


def _output_error(got, expected: Expected) -> float:
    """max |got - expected| / (max |expected| + 1e-3) over the defined positions; inf for a wrong
    shape or a non-finite value where a finite one is expected."""
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.values.shape):
        return math.inf
    if expected.some_nan:
        return 0.0 if bool(torch.isnan(got).any()) else math.inf
    g, e = got.detach().cpu().double(), expected.values.double()
    where = torch.ones_like(e, dtype=torch.bool) if expected.where is None else expected.where.bool()
    g, e = g[where], e[where]
    if e.numel() == 0:
        return 0.0
    same_nonfinite = (torch.isnan(e) & torch.isnan(g)) | (torch.isinf(e) & (g == e))
    unmatched = (~torch.isfinite(g) | ~torch.isfinite(e)) & ~same_nonfinite
    if bool(unmatched.any()):
        return math.inf
    diff = torch.where(same_nonfinite, torch.zeros_like(e), g - e).abs()
    scale = torch.where(torch.isfinite(e), e, torch.zeros_like(e)).abs().max()
    return float(diff.max() / (scale + 1e-3))


def _tolerance(got: dict, rtol: float, float32_rtol: float) -> float:
    """``rtol`` when every output is float64; ``FLOAT32_RTOL`` when one is not (a function that computes
    in float32 returns a float32 value, and its gradient w.r.t. a float64 input is float32 arithmetic)."""
    dtypes = {x.dtype for x in got.values() if isinstance(x, torch.Tensor) and x.is_floating_point()}
    return rtol if dtypes <= {torch.float64} else max(rtol, FLOAT32_RTOL, float32_rtol)


def _expect(kind: Kind, case: KindCase, flags) -> dict | str:
    """The kind's expected outputs on the CPU, or the one-line ValueError of a case the convention
    refuses (e.g. a sample variance of one entry): then the checked function must raise too."""
    try:
        return {k: v.cpu() for k, v in kind.expected(case, flags).items()}
    except ValueError as exc:
        return str(exc)


def _judge(kind: Kind, case: KindCase, expected: dict | str, got: dict | None, error: str | None,
           rtol: float) -> CaseResult:
    if isinstance(expected, str):  # the convention refuses the case: the function must raise
        ok = got is None
        detail = case.text() + f"\n  expected: an error ({expected})"
        return CaseResult(case.case_id, case.case_class, case.size, 0.0 if ok else math.inf, None, ok, None,
                          detail, case_line=case.line())
    if got is None:
        return CaseResult(case.case_id, case.case_class, case.size, math.inf, None, False, None,
                          case.text(), error, case_line=case.line())
    value_errors, grad_errors, oks, lines = [], [], [], []
    tolerance = _tolerance(got, rtol, kind.float32_rtol(case)) if isinstance(got, dict) else rtol
    for name, exp in expected.items():
        out = got.get(name) if isinstance(got, dict) else None
        err = _output_error(out, exp)
        (grad_errors if exp.gradient else value_errors).append(err)
        oks.append((exp.gradient, err <= tolerance))
        shown = exp.values if exp.where is None else torch.where(exp.where.bool(), exp.values, float("nan"))
        lines += [tensor_text(f"expected {name}", shown),
                  tensor_text(f"got {name}", out) if isinstance(out, torch.Tensor)
                  else f"got {name} = {out!r}"]
    value_ok = all(ok for is_grad, ok in oks if not is_grad)
    grad_ok = all(ok for is_grad, ok in oks if is_grad) if grad_errors else None
    first = next(iter(expected.values())).values
    got_first = next(iter(got.values()), None) if isinstance(got, dict) else None
    scalar = first.numel() == 1 and isinstance(got_first, torch.Tensor) and got_first.numel() == 1
    return CaseResult(
        case.case_id, case.case_class, case.size, max(value_errors, default=0.0),
        max(grad_errors) if grad_errors else None, value_ok, grad_ok,
        case.text() + "\n" + "\n".join(f"  {x}" for x in lines), None,
        expected=float(first) if scalar else None, got=float(got_first) if scalar else None,
        case_line=case.line(),
    )


def run_kind_check(kind: Kind, fn, flags=None, *, adapter=None, rtol: float = 1e-8, seed: int = 0,
                   classes: tuple[str, ...] | None = None, header: tuple[str, ...] = (),
                   device: torch.device | str = "cpu", title: str | None = None) -> CheckReport:
    """``fn`` (through ``adapter``) on every case of ``kind`` (or of ``classes``) against the kind's
    expected values under ``flags`` (the kind's flags dataclass, a dict of flags, or None: the
    spec). Values and, where the kind has them, gradients; float64 outputs to ``rtol``, float32
    outputs to ``FLOAT32_RTOL``."""
    flags = kind.make_flags(flags) if flags is None or isinstance(flags, dict) else flags
    cases = kind.cases(seed)
    if classes is not None:
        known = kind.case_classes(seed)
        unknown = sorted(set(classes) - set(known))
        if unknown:
            raise ValueError(f"unknown {kind.name} case classes {unknown}; valid: {list(known)}")
        cases = [c for c in cases if c.case_class in classes]
    what = getattr(fn, "__qualname__", type(fn).__name__)
    outcomes = run_cases(
        cases,
        expect=lambda case: _expect(kind, case, flags),
        call=lambda case: kind.call(fn, adapter, case),
        judge=lambda case, expected, got, error: _judge(kind, case, expected, got, error, rtol),
        device=device,
        what=what,
    )
    reference = kind.flags()
    notes = tuple(f"{f.name}: reference {getattr(reference, f.name)!r} -> {getattr(flags, f.name)!r}"
                  for f in dataclasses.fields(flags) if getattr(flags, f.name) != getattr(reference, f.name))
    return CheckReport(title or f"{kind.title}", tuple(o.result for o in outcomes), notes, tuple(header))


def attribute(report: CheckReport, flags: dict, run: Callable[[dict], CheckReport]) -> CheckReport:
    """Name, for each failing class of ``report`` (a check under the spec), the smallest subset of
    ``flags`` (a mode's profile) under which ``run(subset)`` passes that class: single flags first,
    then pairs, ..., never more flags than needed; ``unexplained`` when no subset does. The report
    then lists every departure."""
    failing = set(report.failing_classes())
    why: dict[str, str] = {}
    names = list(flags)
    for size in range(1, len(names) + 1):
        if not failing - set(why):
            break
        for subset in itertools.combinations(names, size):
            trial = {k: flags[k] for k in subset}
            passed = {c.case_class for c in run(trial).by_class() if c.ok}
            for name in sorted((failing - set(why)) & passed):
                why[name] = flag_text(trial)
    results = tuple(
        dataclasses.replace(r, explanation=why.get(r.case_class, "unexplained")) if not r.ok else r
        for r in report.results
    )
    return dataclasses.replace(report, results=results, list_departures=True)

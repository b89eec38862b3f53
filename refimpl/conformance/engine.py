"""The one check loop of the kit: cases x expected values x the call of the function x the judgement.

Every checker (``policy_check``, ``simple_checks``) is this loop with four functions of its own:
``expect(item)`` the expected value (from ``expected``), ``call(item)`` the function's result (any
exception is caught and reported on that case), ``judge(item, expected, got, error)`` the
``CaseResult``; ``run_cases`` returns one ``Outcome`` per item, in order. The helpers below turn a
case into text (``case_text``: the report's detail; ``case_line``: one pasteable line of Python).

The device: a check runs on one ``device``. ``run_cases`` gives ``expect`` and ``call`` the item
with its case on that device (``to_device``) and brings what they return back to the CPU
(``on_cpu``), where ``judge`` sees the item as made. So the expected values are computed in float64
on the same device as the checked function, with its ``exp`` and ``log``: a ratio the device rounds
a unit in the last place off a clip bound is off it in the reference too (``expected_on``; the
diagnosis uses it as well). On the CPU nothing moves.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from . import user_code
from .contract import SIGNATURES, SignatureError
from .report import CaseResult, nested_text, tensor_text

__all__ = ["Outcome", "run_cases", "run_user", "to_device", "on_cpu", "expected_on", "case_text", "case_line",
           "preflight", "raised", "judged", "value_only"]

_INPUTS = ("logp", "old_logp", "ref_logp", "advantages", "mask", "rewards", "group_ids", "logits", "tokens")


@dataclass(frozen=True)
class Outcome:
    """One item through the loop: the expected value, what the function gave (None when it
    raised, with ``error``) and the judgement."""

    item: object
    expected: object
    got: object
    error: str | None
    result: CaseResult


def run_cases(
    items: Iterable,
    *,
    expect: Callable,
    call: Callable,
    judge: Callable,
    device: object = "cpu",
    what: str = "the function",
) -> list[Outcome]:
    """The loop (see the module docstring): ``expect`` and ``call`` on ``device``, ``judge`` on the
    CPU. ``call`` runs as user code (``user_code.guarded``: whatever it raises, a time limit, torch's
    state restored; ``what`` names it in a failure); a line per case class goes to the progress
    writer when one is configured."""
    items = list(items)
    done = user_code.progress(items, _case_class)
    outcomes = []
    for i, item in enumerate(items):
        there = to_device(item, device)
        expected = on_cpu(expect(there))
        got, error = run_user(lambda there=there: on_cpu(user_code.guarded(lambda: call(there), what)))
        outcomes.append(Outcome(item, expected, got, error, judge(item, expected, got, error)))
        done(i)
    return outcomes


def _case_class(item) -> str:
    """The case class of a loop item: a case, or a tuple whose first element is one."""
    case = item[0] if isinstance(item, tuple) else item
    return getattr(case, "case_class", "cases")


def to_device(item, device):
    """``item`` on ``device``: a case (``case_types``: its ``to``) or a tensor moved, a tuple item
    by item, anything else (a number, None, a golden vector's stored values) as it is."""
    if isinstance(item, tuple):
        return tuple(to_device(x, device) for x in item)
    to = getattr(item, "to", None)
    return to(device) if callable(to) else item


def on_cpu(value):
    """``value`` with every tensor (also inside tuples and lists) on the CPU; the same tensors where
    they are there already."""
    if type(value) in (tuple, list):
        return type(value)(on_cpu(x) for x in value)
    to = getattr(value, "cpu", None)
    return to() if callable(to) else value


def expected_on(device, expect: Callable, case, *args):
    """``expect(case, *args)`` computed on ``device`` (the case moved there), returned on the CPU: the
    expected values of a check on a device (see the module docstring)."""
    return on_cpu(expect(to_device(case, device), *args))


def run_user(compute: Callable) -> tuple[object, str | None]:
    """``(compute(), None)``, or ``(None, one line)`` when the function raised or ended otherwise
    (``user_code.UserCodeFailure``: its message); a SignatureError stops the whole check."""
    try:
        return compute(), None
    except SignatureError:
        raise
    except user_code.UserCodeFailure as exc:
        return None, str(exc)
    except Exception as exc:  # the user's function may fail on an edge case: report it
        return None, f"{type(exc).__name__}: {exc} ({traceback.extract_tb(exc.__traceback__)[-1].name})"


def preflight(kind: str, fn, compute: Callable, shape: tuple[int, ...]) -> None:
    """Run ``compute()`` on the first case of a checker: an exception or an output that is not a
    tensor of ``shape`` stops the check with the expected signature (SignatureError)."""
    import torch

    name = getattr(fn, "__qualname__", type(fn).__name__)
    try:
        out = user_code.guarded(compute, name)
    except SignatureError:
        raise
    except user_code.UserCodeFailure as exc:
        raise SignatureError(f"{exc} on the plainest case") from None
    except Exception as exc:
        raise SignatureError(
            f"{name} fails on the plainest case with {type(exc).__name__}: {exc}; expected {SIGNATURES[kind]}"
        ) from exc
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape:
        got = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise SignatureError(f"{name} returned {got}, expected a tensor of shape {shape}: {SIGNATURES[kind]}")


def preflight_first(
    kind: str, fn, adapter, case, inputs: tuple[str, ...], shape_of: str, device: object = "cpu"
) -> None:
    """``preflight`` of ``fn`` (through ``adapter``) on the case's ``inputs`` (cloned, on ``device``),
    whose output must have the shape of its ``shape_of`` field."""
    from .contract import call

    case = to_device(case, device)
    preflight(
        kind,
        fn,
        lambda: call(fn, adapter, *(getattr(case, name).clone() for name in inputs)),
        tuple(getattr(case, shape_of).shape),
    )


def case_text(case, extra: list[str]) -> str:
    """The case's inputs in full (17 significant digits) and the ``extra`` lines, indented."""
    lines = [
        f"  {tensor_text(f, getattr(case, f))}"
        for f in _INPUTS
        if hasattr(case, f) and getattr(case, f) is not None
    ]
    if getattr(case, "note", ""):
        lines.insert(0, f"  ({case.note})")
    if getattr(case, "micro_batches", None):
        lines.append(f"  micro_batches = {case.micro_batches}")
    return "\n".join(lines + [f"  {x}" for x in extra])


def _number_text(x: float) -> str:
    return repr(x) if math.isfinite(x) else f'float("{x}")'


def case_line(case, extra: dict[str, object] | None = None) -> str:
    """The case's inputs as one line of Python (``torch.tensor(...)`` with the dtype), e.g. for a
    regression test: ``logp = torch.tensor([[...]], dtype=torch.float64); ...``."""
    parts = []
    for name in _INPUTS:
        x = getattr(case, name, None)
        if x is None:
            continue
        values = x.detach().double().tolist() if x.is_floating_point() else x.tolist()
        parts.append(f"{name} = torch.tensor({nested_text(values, _number_text)}, dtype={x.dtype})")
    if getattr(case, "micro_batches", None):
        parts.append(f"micro_batches = {case.micro_batches}")
    for key, value in (extra or {}).items():
        parts.append(f"{key} = {(_number_text(value) if isinstance(value, float) else repr(value))}")
    return "; ".join(parts)


def value_only(case, value_error: float, ok: bool, detail: str, error: str | None = None) -> CaseResult:
    return CaseResult(case.case_id, case.case_class, case.size, value_error, None, ok, None, detail, error)


def raised(case, detail: str, error: str | None) -> CaseResult:
    return CaseResult(
        case.case_id, case.case_class, case.size, math.inf, math.inf, False, False, detail, error
    )


def judged(
    case, value_error: float, grad_error: float, value_rtol: float, grad_rtol: float, detail: str
) -> CaseResult:
    return CaseResult(
        case.case_id,
        case.case_class,
        case.size,
        value_error,
        grad_error,
        value_error <= value_rtol,
        grad_error <= grad_rtol,
        detail,
    )


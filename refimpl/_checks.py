"""Input checks shared by the ``refimpl`` modules (docs/architecture.md: bad input gets a clear
``ValueError`` / ``TypeError`` naming the argument). One definition per check, so every module
words the same mistake the same way.

Scalar arguments accept what a user passes: Python numbers, numpy scalars (``np.float32(0.9)``,
``np.int64(3)``) and 0-d tensors of a real dtype, never a bool (``as_real``, ``as_int``)."""

from __future__ import annotations

import numbers
import operator

import torch


def _is_bool(x) -> bool:
    return isinstance(x, bool) or type(x).__name__ in ("bool_", "bool") or (
        isinstance(x, torch.Tensor) and x.dtype == torch.bool
    )


def as_real(x) -> float | None:
    """``x`` as a float when it is a real number (``numbers.Real``: int, float, numpy's real scalars,
    Fraction; or a 0-d tensor of a floating or integer dtype), else None (a bool, a complex, a
    string, an array, a tensor with elements). Callers raise their own one-line error on None."""
    if _is_bool(x):
        return None
    if isinstance(x, torch.Tensor):
        if x.ndim != 0 or x.is_complex():
            return None
        return float(x.item())
    if isinstance(x, numbers.Real):
        return float(x)
    return None


def as_int(x) -> int | None:
    """``x`` as an int when it is an integer (anything ``operator.index`` takes: int, numpy's
    integer scalars, a 0-d integer tensor), else None (a bool, a float, even a whole one)."""
    if _is_bool(x) or (isinstance(x, torch.Tensor) and (x.ndim != 0 or x.is_floating_point())):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def check_real(x, name: str) -> float:
    """``x`` as a float (``as_real``), or a TypeError naming ``name``."""
    value = as_real(x)
    if value is None:
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    return value


def check_float_tensor(x, name: str, *, ndim: int | None = None, finite: bool = True) -> None:
    """``x`` is a floating-point ``torch.Tensor`` (with ``ndim`` dimensions when given) and, when
    ``finite``, holds no NaN / inf (a host sync on accelerators: callers on hot paths pass
    ``finite=False`` and check elsewhere)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if finite and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf")


def check_rows_stochastic(x: torch.Tensor, name: str, atol: float) -> None:
    """Every row (last dim) of ``x`` is a distribution: non-negative, summing to 1 within ``atol``
    (the sum taken in float64)."""
    if bool((x < 0).any()):
        raise ValueError(f"{name} has negative probabilities")
    worst = float((x.double().sum(dim=-1) - 1.0).abs().max()) if x.numel() else 0.0
    if worst > atol:
        raise ValueError(f"{name} rows must sum to 1 (max deviation {worst:.3g})")


def check_discount(gamma, name: str = "gamma", *, allow_one: bool = True, why: str = "") -> float:
    """``gamma`` is a real number in [0, 1] (or [0, 1) when ``allow_one`` is False; ``why`` says
    which formula needs it); returns it as a float."""
    value = check_real(gamma, name)
    if not (0.0 <= value <= 1.0) or (value == 1.0 and not allow_one):
        interval = "[0, 1]" if allow_one else "[0, 1)"
        raise ValueError(f"{name} must lie in {interval}{f' ({why})' if why else ''}, got {gamma!r}")
    return value

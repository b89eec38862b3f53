"""Input checks shared by the ``refimpl`` modules (docs/architecture.md: bad input gets a clear
``ValueError`` / ``TypeError`` naming the argument). One definition per check, so every module
words the same mistake the same way."""

from __future__ import annotations

import torch


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
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(gamma).__name__}")
    value = float(gamma)
    if not (0.0 <= value <= 1.0) or (value == 1.0 and not allow_one):
        interval = "[0, 1]" if allow_one else "[0, 1)"
        raise ValueError(f"{name} must lie in {interval}{f' ({why})' if why else ''}, got {gamma!r}")
    return value

"""Masked batch whitening of per-token advantages (spec: specs/advantages.md section 4).

``masked_whiten_reference`` is the two-pass form (the mean first, then the mean of squared
deviations from it): on a batch with a large common offset it keeps the digits that the one-pass
``E[x^2] - E[x]^2`` cancels away. Every convention frameworks use is an argument: which entries
make the mean (the masked ones, or every entry of the padded batch), the population or the sample
variance, token or sequence weights, and where an epsilon goes.
"""

from __future__ import annotations

import torch

__all__ = ["masked_whiten_reference"]

_MEANS = ("masked", "unmasked")
_STDS = ("population", "sample")
_WEIGHTINGS = ("token", "sequence")
_EPS_PLACEMENTS = ("variance", "std", "floor")


def _check(x, mask, mean: str, std: str, weighting: str, eps: float, eps_placement: str) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim != 2:
        raise TypeError("x must be a floating tensor [N, T]")
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(x.shape):
        raise ValueError(f"mask: expected a tensor of shape {tuple(x.shape)} like x")
    for value, name, choices in ((mean, "mean", _MEANS), (std, "std", _STDS),
                                 (weighting, "weighting", _WEIGHTINGS),
                                 (eps_placement, "eps_placement", _EPS_PLACEMENTS)):
        if value not in choices:
            raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")


def masked_whiten_reference(x: torch.Tensor, mask: torch.Tensor, *, mean: str = "masked",
                            std: str = "population", weighting: str = "token", eps: float = 0.0,
                            eps_placement: str = "variance", count_eps: float = 0.0) -> torch.Tensor:
    """``(x - mu) / s`` on the counted entries, 0 elsewhere.

    spec: advantages.md eq. (20)-(22). With weights ``w`` (token: 1 per counted entry; sequence:
    ``1 / L_i`` per counted entry of row i, so that every non-empty row weighs 1), ``W = sum w``:
    ``mu = sum w x / W`` (``mean="unmasked"``: the plain mean of every entry of the padded batch,
    padding included), ``var = sum w (x - mu)^2 / W`` (``std="sample"``: times ``n / (n - 1)``, n the
    number of counted entries), ``s = sqrt(var + eps)`` (``eps_placement="variance"``),
    ``sqrt(var) + eps`` ("std") or ``sqrt(max(var, eps))`` ("floor"). A batch whose counted entries
    ``count_eps`` is added to ``W`` in both means (a convention: verl's ``masked_mean``; 0 in the spec).
    A batch whose counted entries
    are all equal (``var = 0``) with ``eps = 0`` gives 0 (the centred values are 0); no counted entry:
    all 0; ``std="sample"`` with one counted entry: ValueError. Computed in at least float32, two-pass.
    Shapes: ``x``, ``mask`` ``[N, T]``; returns ``[N, T]``.
    """
    _check(x, mask, mean, std, weighting, eps, eps_placement)
    if not isinstance(count_eps, (int, float)) or isinstance(count_eps, bool) or not count_eps >= 0:
        raise ValueError(f"count_eps must be a number >= 0, got {count_eps!r}")
    dtype = torch.promote_types(x.dtype, torch.float32)
    counted = mask.bool()
    zero = torch.zeros((), dtype=dtype, device=x.device)
    v = torch.where(counted, x.to(dtype), zero)
    n = counted.sum()
    if int(n) == 0:
        return torch.zeros_like(v)
    if std == "sample" and int(n) == 1:
        raise ValueError("std='sample' needs at least two counted entries")
    if weighting == "token":
        w = counted.to(dtype)
    else:
        lengths = counted.sum(dim=-1, keepdim=True).to(dtype)
        w = torch.where(counted, 1.0 / lengths.clamp(min=1.0), zero)
    total = w.sum() + count_eps
    mu = x.to(dtype).mean() if mean == "unmasked" else (w * v).sum() / total
    centred = torch.where(counted, v - mu, zero)
    var = (w * centred.square()).sum() / total
    if std == "sample":
        var = var * n.to(dtype) / (n.to(dtype) - 1)
    if eps_placement == "variance":
        s = torch.sqrt(var + eps)
    elif eps_placement == "std":
        s = torch.sqrt(var) + eps
    else:
        s = torch.sqrt(torch.clamp(var, min=eps))
    if float(s) == 0.0:  # every counted entry equal and no epsilon: the centred values are 0
        return torch.zeros_like(v)
    if not bool(torch.isfinite(s)):
        return centred / s
    return centred / s

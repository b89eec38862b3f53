"""Kind ``value_loss``: the clipped value (critic) loss and its aggregation.

The function is called as ``fn(values [N, T], old_values [N, T], returns [N, T], mask [N, T], *,
clip) -> scalar loss`` and judged by its value and its gradient in ``values`` (autograd through the
function) against ``refimpl.losses.value_loss`` (policy_losses.md eq. (23); Schulman et al. 2017,
eq. (9)): ``max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)`` averaged over the counted tokens
(no factor 1/2); no counted token: 0 with gradient 0; what padding holds must not matter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from refimpl.losses import value_loss

from .base import Expected, Kind, KindCase, check_choices

__all__ = ["ValueLossFlags", "VALUE_LOSS", "value_loss_cases", "expected_value_loss"]


@dataclass(frozen=True)
class ValueLossFlags:
    """How a framework computes the clipped value loss (defaults: the spec).

    value_scale: 1.0 | 0.5 (0.5 (V - R)^2: the factor 1/2 of a squared error; the value coefficient
        absorbs it, a convention, but the value loss reported is halved).
    value_aggregation: "token_mean" | "seq_mean_token_mean" (the mean of each row's token mean).
    value_empty_rows: "skip" | "keep" (with seq_mean_token_mean: a row without a token counts as 0 in "
    "the mean).
    value_empty_step: "zero" | "nan" (no counted token: 0 / 0, a NaN value whose gradient is 0: a logged
        value) | "nan_gradient" (a NaN value and a NaN gradient: the step's update is NaN).
    value_masked_nonfinite: "ignored" | "propagate" (NaN / inf at padding multiplied by the mask: a NaN loss)
        | "nan_gradient" (selected away with torch.where: the loss is right, the gradient at those
        padding positions is NaN).
    """

    value_scale: float = 1.0
    value_aggregation: str = "token_mean"
    value_empty_rows: str = "skip"
    value_empty_step: str = "zero"
    value_masked_nonfinite: str = "ignored"

    def __post_init__(self) -> None:
        check_choices(self, {"value_aggregation": ("token_mean", "seq_mean_token_mean"),
                             "value_empty_rows": ("skip", "keep"),
                             "value_empty_step": ("zero", "nan", "nan_gradient"),
                             "value_masked_nonfinite": ("ignored", "propagate", "nan_gradient")})


def _exact32(x: torch.Tensor) -> torch.Tensor:
    return x.float().double()


def value_loss_cases(seed: int = 0) -> list[KindCase]:
    """Values, old values and returns ``[4, 5]`` by where the clip and the aggregation act."""
    g = torch.Generator().manual_seed(seed + 307)
    n, width = 4, 5

    def case(name, lengths, spread, *, clip=0.2, note="", pad=None):
        mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
        old = _exact32(torch.rand((n, width), generator=g, dtype=torch.float64) * 2 - 1)
        values = _exact32(old + (torch.rand((n, width), generator=g, dtype=torch.float64) * 2 - 1) * spread)
        returns = _exact32(old + (torch.rand((n, width), generator=g, dtype=torch.float64) * 2 - 1))
        if pad is not None:
            values, old, returns = (torch.where(mask, x, torch.full_like(x, p))
                                    for x, p in zip((values, old, returns), pad, strict=True))
        return KindCase(name, 0, {"values": values, "old_values": old, "returns": returns, "mask": mask},
                        {"clip": clip}, note)

    return [
        case("inside_clip", [5, 5, 5, 5], 0.15, note="|V - V_old| < 0.2 everywhere"),
        case("outside_clip", [5, 5, 5, 5], 1.0, note="|V - V_old| up to 1: both branches of the max act"),
        case("ragged", [5, 1, 3, 2], 1.0, note="rows of 5, 1, 3 and 2 tokens"),
        case("empty_rows", [5, 0, 3, 0], 1.0, note="rows 1 and 3 have no token"),
        case("empty_step", [0, 0, 0, 0], 1.0, note="no counted token"),
        case("masked_nonfinite", [4, 2, 5, 3], 1.0, pad=(math.nan, math.inf, -math.inf),
             note="NaN values, +inf old values and -inf returns at padding"),
    ]


def _reference(values, old, returns, mask, clip, flags: ValueLossFlags) -> torch.Tensor:
    if flags.value_aggregation == "token_mean":
        loss = value_loss(values, returns, mask, old_values=old, clip_eps=clip)[0]
    else:
        rows = [value_loss(values[i], returns[i], mask[i], old_values=old[i], clip_eps=clip)[0]
                for i in range(mask.shape[0]) if flags.value_empty_rows == "keep" or bool(mask[i].any())]
        loss = torch.stack(rows).mean() if rows else values.sum() * 0.0
    if not bool(mask.any()) and flags.value_empty_step != "zero":
        loss = loss + math.nan
    return flags.value_scale * loss


def expected_value_loss(case: KindCase, flags: ValueLossFlags) -> dict[str, Expected]:
    x = case.inputs
    mask = x["mask"]
    finite = torch.isfinite(x["values"]) & torch.isfinite(x["old_values"]) & torch.isfinite(x["returns"])
    v = torch.where(mask, x["values"], 0.0).requires_grad_(True)
    old, ret = torch.where(mask, x["old_values"], 0.0), torch.where(mask, x["returns"], 0.0)
    loss = _reference(v, old, ret, mask, case.params["clip"], flags)
    (grad,) = torch.autograd.grad(loss, v, allow_unused=True)
    grad = torch.zeros_like(v) if grad is None else grad
    some_nan = not bool(mask.any()) and flags.value_empty_step == "nan_gradient"
    if some_nan:  # 0 / 0 times each token's derivative: NaN wherever that derivative is used
        grad = torch.full_like(grad, math.nan)
    bad = ~finite & ~mask
    if flags.value_masked_nonfinite in ("propagate", "nan_gradient") and bool(bad.any()):
        grad = torch.where(bad, math.nan, grad)
        if flags.value_masked_nonfinite == "propagate":
            loss = loss.detach() + math.nan
    return {"loss": Expected(loss.detach()),
            "grad_values": Expected(grad.detach(), gradient=True, some_nan=some_nan)}


def _call(fn, adapter, case: KindCase) -> dict:
    x = {k: v.clone() for k, v in case.inputs.items()}
    values = x["values"].requires_grad_(True)
    args = (values, x["old_values"], x["returns"], x["mask"])
    clip = case.params["clip"]
    out = adapter(fn, *args, clip=clip) if adapter is not None else fn(*args, clip=clip)
    loss = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(f"returned {type(loss).__name__}, expected a scalar loss tensor")
    if loss.requires_grad:
        (grad,) = torch.autograd.grad(loss.sum(), values, allow_unused=True)
    else:
        grad = None
    return {"loss": loss.detach().reshape(()),
            "grad_values": torch.zeros_like(values) if grad is None else grad}


VALUE_LOSS = Kind(
    name="value_loss",
    title="clipped value loss",
    signature="fn(values [N, T], old_values [N, T], returns [N, T], mask [N, T] bool, *, clip) "
    "-> scalar loss",
    flags=ValueLossFlags,
    cases=lambda seed=0: value_loss_cases(seed),
    expected=expected_value_loss,
    call=_call,
)

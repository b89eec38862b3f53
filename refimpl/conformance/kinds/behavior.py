"""Kind ``behavior_correction``: the decoupled PPO loss, whose samples come from a behaviour policy
pi_behave older than the proximal policy pi_prox the ratio is taken against (Hilton et al. 2022,
decoupled PPO; the asynchronous RL of AReaL).

The function is called as ``fn(logp, prox_logp, behave_logp, advantages [N], mask, *, eps) -> scalar
loss`` and judged by its value and its gradient in ``logp`` against ``refimpl.losses.policy_loss``
with the "ppo" preset (``eps_low = eps_high = eps``, token mean), ``old_logp = prox_logp`` and the
detached behaviour weight ``w = pi_prox / pi_behave`` on every token (policy_losses.md eq. (13)),
uncapped (a cap is a setting: the flags name it).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from refimpl.losses import policy_loss
from refimpl.losses.policy import PPO

from .base import Expected, Kind, KindCase, check_choices

__all__ = ["BehaviorFlags", "BEHAVIOR", "behavior_cases", "expected_behavior"]

#: the spec's weight is uncapped; policy_loss takes a cap, so the spec uses one no weight reaches
_UNCAPPED = 1e300


@dataclass(frozen=True)
class BehaviorFlags:
    """How a framework weighs by pi_prox / pi_behave (defaults: the spec).

    behavior_weight: "applied" | "dropped" (no weight at all: the loss is plain PPO against pi_prox
        although the samples came from pi_behave).
    behavior_cap: "none" | "truncate" (min(w, cap)) | "mask" (tokens with w > cap contribute 0 and
        still count in the token mean).
    behavior_cap_value: the cap (with "truncate" / "mask").
    behavior_cap_low: a lower bound too (0: none): "truncate" raises a weight below it to it, "mask"
        drops its token (a two-sided band, e.g. [0.5, 5]).
    behavior_weight_float32: True: w = exp(float32(log pi_prox) - float32(log pi_behave)) in float32
        (a float32 weight on float64 inputs: 2^-24 relative).
    """

    behavior_weight: str = "applied"
    behavior_cap: str = "none"
    behavior_cap_value: float = 5.0
    behavior_cap_low: float = 0.0
    behavior_weight_float32: bool = False

    def __post_init__(self) -> None:
        check_choices(self, {"behavior_weight": ("applied", "dropped"),
                             "behavior_cap": ("none", "truncate", "mask"),
                             "behavior_weight_float32": (False, True)})


def _exact32(x: torch.Tensor) -> torch.Tensor:
    return x.float().double()


def behavior_cases(seed: int = 0) -> list[KindCase]:
    """Behaviour policies from on-policy to far stale, ragged rows and non-finite padding."""
    g = torch.Generator().manual_seed(seed + 503)
    n, width = 4, 5

    def case(name, lengths, staleness, note="", pad=None):
        mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
        prox = _exact32(-0.1 - 2.9 * torch.rand((n, width), generator=g, dtype=torch.float64))
        logp = _exact32(prox + 0.15 * (2 * torch.rand((n, width), generator=g, dtype=torch.float64) - 1))
        shift = staleness * (2 * torch.rand((n, width), generator=g, dtype=torch.float64) - 1)
        behave = _exact32(prox - shift)
        if pad is not None:
            behave = torch.where(mask, behave, torch.full_like(behave, pad))
        advantages = _exact32(2 * torch.rand((n,), generator=g, dtype=torch.float64) - 1)
        inputs = {"logp": logp, "prox_logp": prox, "behave_logp": behave, "advantages": advantages,
                  "mask": mask}
        return KindCase(name, 0, inputs, {"eps": 0.2}, note)

    return [
        case("on_policy", [5, 5, 5, 5], 0.0, "pi_behave = pi_prox: w = 1, plain PPO"),
        case("stale", [5, 3, 4, 2], 0.5, "|log w| <= 0.5: w in [0.61, 1.65]"),
        case("far_stale", [5, 3, 4, 2], 3.0, "|log w| <= 3: w up to 20, beyond a cap of 5"),
        case("empty_rows", [5, 0, 4, 0], 0.5, "rows 1 and 3 have no token"),
        case("masked_nonfinite", [4, 2, 5, 3], 0.5, "behave_logp = -inf at padding positions", pad=-math.inf),
    ]


def _variant(flags: BehaviorFlags, eps: float):
    if flags.behavior_weight == "dropped":
        return dataclasses.replace(PPO, eps_low=eps, eps_high=eps)
    correction, cap = ("truncate", _UNCAPPED) if flags.behavior_cap == "none" else (
        flags.behavior_cap, flags.behavior_cap_value)
    return dataclasses.replace(PPO, eps_low=eps, eps_high=eps, behavior_correction=correction,
                               behavior_cap=cap)


def expected_behavior(case: KindCase, flags: BehaviorFlags) -> dict[str, Expected]:
    x = case.inputs
    mask = x["mask"]
    logp = torch.where(mask, x["logp"], 0.0).requires_grad_(True)
    prox, behave = torch.where(mask, x["prox_logp"], 0.0), torch.where(mask, x["behave_logp"], 0.0)
    if flags.behavior_weight_float32:  # the behaviour log-prob whose float64 weight is the float32 one
        w32 = torch.exp(prox.float() - behave.float()).double()
        behave = torch.where(mask, prox - torch.log(w32), 0.0)
    if flags.behavior_cap_low > 0 and flags.behavior_weight == "applied" and flags.behavior_cap != "none":
        # a weight below the band: raised to its bottom ("truncate") or dropped ("mask": a weight beyond
        # the cap, which the mask drops), as the behaviour log-prob that gives that weight
        low = torch.tensor(flags.behavior_cap_low, dtype=prox.dtype, device=prox.device)
        below = (prox - behave) < torch.log(low)
        dropped = torch.tensor(2 * flags.behavior_cap_value, dtype=prox.dtype, device=prox.device)
        target = torch.log(low) if flags.behavior_cap == "truncate" else torch.log(dropped)
        behave = torch.where(mask & below, prox - target, behave)
    variant = _variant(flags, case.params["eps"])
    extra = {"behavior_logp": behave} if variant.behavior_correction != "none" else {}
    loss = policy_loss(logp, prox, x["advantages"], mask, variant, **extra)[0]
    (grad,) = torch.autograd.grad(loss, logp)
    return {"loss": Expected(loss.detach()), "grad_logp": Expected(grad, gradient=True)}


def _call(fn, adapter, case: KindCase) -> dict:
    x = {k: v.clone() for k, v in case.inputs.items()}
    logp = x["logp"].requires_grad_(True)
    args = (logp, x["prox_logp"], x["behave_logp"], x["advantages"], x["mask"])
    eps = case.params["eps"]
    out = adapter(fn, *args, eps=eps) if adapter is not None else fn(*args, eps=eps)
    loss = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(f"returned {type(loss).__name__}, expected a scalar loss tensor")
    grad = torch.autograd.grad(loss.sum(), logp, allow_unused=True)[0] if loss.requires_grad else None
    return {"loss": loss.detach().reshape(()), "grad_logp": torch.zeros_like(logp) if grad is None else grad}


BEHAVIOR = Kind(
    name="behavior_correction",
    title="behaviour-policy correction (decoupled PPO)",
    signature="fn(logp [N, T], prox_logp [N, T], behave_logp [N, T], advantages [N], mask [N, T] bool, "
    "*, eps) -> scalar loss",
    flags=BehaviorFlags,
    cases=lambda seed=0: behavior_cases(seed),
    expected=expected_behavior,
    call=_call,
)

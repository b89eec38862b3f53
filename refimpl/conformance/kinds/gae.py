"""Kind ``gae``: generalised advantage estimates and returns over response tokens.

The function is called as ``fn(rewards [N, T], values [N, T], mask [N, T], gamma=, lam=,
truncated=[N] bool, final_values=[N]) -> (advantages [N, T], returns [N, T])`` (a tuple, or a dict
with those keys) and judged on the counted tokens against ``refimpl.estimators.gae_advantages``
(estimators.md eq. (5); Schulman et al. 2016, eq. (16)). Row i is one episode of ``L_i`` tokens (a
prefix mask): ``values[i, t]`` is V(s_t), the state before token t; after the last token the episode
is *terminated* (an EOS: nothing is bootstrapped) unless ``truncated[i]`` (the length budget cut it:
``final_values[i]``, V of the state after the last token, is bootstrapped). What the padding holds
must not matter. The spec does not whiten: ``returns = advantages + values``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from refimpl.estimators import gae_advantages
from refimpl.whitening import masked_whiten_reference

from .base import Expected, Kind, KindCase, check_choices

__all__ = ["GAEFlags", "GAE", "gae_cases", "expected_gae"]


@dataclass(frozen=True)
class GAEFlags:
    """How a framework computes GAE over a padded batch (defaults: the spec).

    gae_truncation: "bootstrap" | "terminate" (a truncated response is treated as ended by an EOS: the
        value of the state after its last token is dropped).
    gae_padding: "ignored" | "used" (the recursion runs over the whole padded row: the value at the first
        padding position is bootstrapped and padding rewards are summed in).
    gae_padding_nonfinite: "ignored" | "propagate" (a NaN / inf at a padding position of values or rewards
        is multiplied by the mask, 0 * inf = NaN, and reaches every token of its row).
    gae_whiten: "none" | "masked_sample" (the advantages, not the returns, are whitened over the counted
        tokens: masked mean over mask.sum() + 1e-8, sample variance,
        rsqrt(var + 1e-8): verl's and SkyRL's masked_whiten).
    """

    gae_truncation: str = "bootstrap"
    gae_padding: str = "ignored"
    gae_padding_nonfinite: str = "ignored"
    gae_whiten: str = "none"

    def __post_init__(self) -> None:
        check_choices(self, {"gae_truncation": ("bootstrap", "terminate"), "gae_padding": ("ignored", "used"),
                             "gae_padding_nonfinite": ("ignored", "propagate"),
                             "gae_whiten": ("none", "masked_sample")})


def _exact32(x: torch.Tensor) -> torch.Tensor:
    return x.float().double()


def gae_cases(seed: int = 0) -> list[KindCase]:
    """Rows of 1..6 tokens, by what the estimator must get right."""
    g = torch.Generator().manual_seed(seed + 211)
    n, width = 4, 6

    def case(name, lengths, *, gamma=0.99, lam=0.95, truncated=(False,) * 4, pad=None, note=""):
        mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
        rewards = _exact32(torch.rand((n, width), generator=g, dtype=torch.float64) - 0.5)
        values = _exact32(torch.rand((n, width), generator=g, dtype=torch.float64) * 2.0 - 1.0)
        if pad is None:  # the padding a framework produces: zero rewards, finite values of the critic
            rewards = torch.where(mask, rewards, 0.0)
        else:
            rewards = torch.where(mask, rewards, torch.full_like(rewards, pad[0]))
            values = torch.where(mask, values, torch.full_like(values, pad[1]))
        final = _exact32(torch.rand((n,), generator=g, dtype=torch.float64) * 2.0 - 1.0)
        inputs = {"rewards": rewards, "values": values, "mask": mask,
                  "truncated": torch.tensor(truncated), "final_values": final}
        return KindCase(name, 0, inputs, {"gamma": gamma, "lam": lam}, note)

    return [
        case("full_length", [6, 6, 6, 6], note="every row fills the batch, ended by an EOS at its end"),
        case("ragged", [6, 3, 1, 4], note="rows of 6, 3, 1 and 4 tokens ended by an EOS"),
        case("truncated", [6, 4, 6, 2], truncated=(True, True, False, False),
             note="rows 0 and 1 cut by the length budget: V(s_L) = final_values is bootstrapped"),
        case("padding_values", [5, 2, 6, 3], pad=(0.0, 3.5),
             note="the critic's values at padding positions are 3.5 (zero rewards there)"),
        case("padding_rewards", [5, 2, 6, 3], pad=(2.0, 0.0), note="rewards of 2 at padding positions"),
        case("padding_nonfinite", [5, 2, 6, 3], pad=(math.nan, math.inf),
             note="NaN rewards, inf values at padding"),
        case("empty_row", [4, 0, 6, 2], note="row 1 has no token"),
        case("monte_carlo", [6, 3, 5, 2], gamma=1.0, lam=1.0,
             note="gamma = lam = 1: returns are reward sums"),
        case("one_step_td", [6, 3, 5, 2], gamma=0.9, lam=0.0, note="lam = 0: the TD error"),
        case("no_discount_future", [6, 3, 5, 2], gamma=0.0, lam=0.95, note="gamma = 0: r_t - V_t"),
    ]


def _row_gae(case: KindCase, flags: GAEFlags) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns ``[N, T]`` (0 at padding) of every row as its own episode."""
    x = case.inputs
    mask, gamma, lam = x["mask"], case.params["gamma"], case.params["lam"]
    adv, ret = torch.zeros_like(x["rewards"]), torch.zeros_like(x["rewards"])
    for i in range(mask.shape[0]):
        length = mask.shape[1] if flags.gae_padding == "used" else int(mask[i].sum())
        if length == 0:
            continue
        r, v = x["rewards"][i, :length], x["values"][i, :length]
        bootstrap = (bool(x["truncated"][i]) and flags.gae_truncation == "bootstrap"
                     and flags.gae_padding != "used")
        last = x["final_values"][i] if bootstrap else v.new_zeros(())
        next_values = torch.cat([v[1:], last.reshape(1)])
        end = torch.zeros(length, dtype=torch.bool, device=v.device)
        end[-1] = True
        out = gae_advantages(r[None], v[None], next_values[None], (end & (not bootstrap))[None],
                             (end & bootstrap)[None], gamma, lam)
        adv[i, :length], ret[i, :length] = out.advantages[0], out.returns[0]
    return adv, ret


def expected_gae(case: KindCase, flags: GAEFlags) -> dict[str, Expected]:
    x = case.inputs
    mask = x["mask"]
    keep = mask if flags.gae_padding != "used" else torch.isfinite(x["rewards"]) & torch.isfinite(x["values"])
    clean = {k: (torch.where(keep, v, 0.0) if k in ("rewards", "values") else v) for k, v in x.items()}
    adv, ret = _row_gae(KindCase(case.case_class, case.index, clean, case.params), flags)
    if flags.gae_padding_nonfinite == "propagate" or flags.gae_padding == "used":
        bad = (~torch.isfinite(x["rewards"]) | ~torch.isfinite(x["values"])) & ~mask
        rows = bad.any(dim=-1, keepdim=True).expand_as(mask)
        adv, ret = torch.where(rows, math.nan, adv), torch.where(rows, math.nan, ret)
    if flags.gae_whiten == "masked_sample":
        adv = masked_whiten_reference(adv, mask, std="sample", eps=1e-8, eps_placement="variance",
                                      count_eps=1e-8)
    return {"advantages": Expected(adv, mask), "returns": Expected(ret, mask)}


def _call(fn, adapter, case: KindCase) -> dict:
    x = {k: v.clone() for k, v in case.inputs.items()}
    args = (x["rewards"], x["values"], x["mask"])
    kwargs = {"gamma": case.params["gamma"], "lam": case.params["lam"], "truncated": x["truncated"],
              "final_values": x["final_values"]}
    out = adapter(fn, *args, **kwargs) if adapter is not None else fn(*args, **kwargs)
    if isinstance(out, dict):
        return {"advantages": out.get("advantages"), "returns": out.get("returns")}
    if not isinstance(out, (tuple, list)) or len(out) < 2:
        raise TypeError(f"returned {type(out).__name__}, expected (advantages [N, T], returns [N, T])")
    return {"advantages": out[0], "returns": out[1]}


GAE = Kind(
    name="gae",
    title="GAE advantages and returns",
    signature="fn(rewards [N, T], values [N, T], mask [N, T] bool, *, gamma, lam, truncated [N] bool, "
    "final_values [N]) -> (advantages [N, T], returns [N, T])",
    flags=GAEFlags,
    cases=lambda seed=0: gae_cases(seed),
    expected=expected_gae,
    call=_call,
)

"""Kind ``kl_reward``: the KL penalty folded into the per-token reward (PPO-RLHF), as opposed to a KL
term of the loss (the policy-loss kind's ``kl_penalty`` class).

The function is called as ``fn(scores [N], logp [N, T], ref_logp [N, T], mask [N, T], *, kl_coef)
-> token rewards [N, T]`` (``logp``: the rollout policy's log-probs of the sampled tokens) and judged
on the counted tokens against ``refimpl.lm.rlhf.kl_shaped_token_rewards`` (Ouyang et al. 2022,
eq. (2); Shao et al. 2024, eq. (2)): ``r_t = -beta (logp_t - ref_logp_t)`` on every counted token plus
the sequence score on the row's last counted token. Values only (a reward carries no gradient).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from refimpl.kl import kl_k2, kl_k3
from refimpl.lm.rlhf import kl_shaped_token_rewards

from .base import Expected, Kind, KindCase, check_choices

__all__ = ["KLRewardFlags", "KL_REWARD", "kl_reward_cases", "expected_kl_reward"]


@dataclass(frozen=True)
class KLRewardFlags:
    """How a framework shapes the reward (defaults: the spec).

    kl_reward_estimator: "k1" (log pi - log pi_ref: the KL of Ouyang et al. 2022) | "k2" | "k3"
        (kl.md: an estimator of the KL *value* chosen for the reward).
    kl_reward_value_clamp: 0 (none) | c > 0 (the per-token estimate clamped to [-c, c] before it is
        weighted: |log r| beyond c is cut).
    """

    kl_reward_estimator: str = "k1"
    kl_reward_value_clamp: float = 0.0

    def __post_init__(self) -> None:
        check_choices(self, {"kl_reward_estimator": ("k1", "k2", "k3")})


def _exact32(x: torch.Tensor) -> torch.Tensor:
    return x.float().double()


def kl_reward_cases(seed: int = 0) -> list[KindCase]:
    """Log-ratios by size, ragged rows, an empty row and non-finite padding."""
    g = torch.Generator().manual_seed(seed + 401)
    n, width = 4, 6

    def case(name, lengths, span, note="", pad=None):
        mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
        logp = _exact32(-0.05 - 3.95 * torch.rand((n, width), generator=g, dtype=torch.float64))
        ref = _exact32(logp + span * (2 * torch.rand((n, width), generator=g, dtype=torch.float64) - 1))
        ref[0, 0] = logp[0, 0] + span  # the largest log-ratios of the class, both signs
        ref[0, 1] = logp[0, 1] - span
        if pad is not None:
            logp = torch.where(mask, logp, torch.full_like(logp, pad))
        scores = _exact32(torch.rand((n,), generator=g, dtype=torch.float64) * 2 - 1)
        inputs = {"scores": scores, "logp": logp, "ref_logp": ref, "mask": mask}
        return KindCase(name, 0, inputs, {"kl_coef": 0.1}, note)

    return [
        case("small_log_ratio", [6, 3, 5, 2], 0.5, "|log r| <= 0.5"),
        case("large_log_ratio", [6, 4, 5, 3], 15.0, "|log r| up to 15"),
        case("extreme_log_ratio", [6, 4, 5, 3], 40.0, "|log r| up to 40: exp(40) is 2.4e17"),
        case("empty_row", [6, 0, 5, 3], 1.0, "row 1 has no token: its score goes nowhere"),
        case("masked_nonfinite", [6, 2, 5, 3], 1.0, "logp = -inf at padding positions", pad=-math.inf),
    ]


def expected_kl_reward(case: KindCase, flags: KLRewardFlags) -> dict[str, Expected]:
    x = case.inputs
    mask, beta = x["mask"], case.params["kl_coef"]
    logp, ref = torch.where(mask, x["logp"], 0.0), torch.where(mask, x["ref_logp"], 0.0)
    lengths = mask.sum(dim=-1)
    if flags.kl_reward_estimator == "k1" and not flags.kl_reward_value_clamp:
        rewards, _last = kl_shaped_token_rewards(x["scores"], lengths, logp, ref, mask.to(logp.dtype), beta)
    else:  # the same shaping with another per-token estimate (kl.md eq. (2)-(4)), clamped if asked
        estimate = {"k1": lambda: logp - ref, "k2": lambda: kl_k2(logp, ref), "k3": lambda: kl_k3(logp, ref)}
        kl = estimate[flags.kl_reward_estimator]()
        if flags.kl_reward_value_clamp:
            kl = kl.clamp(-flags.kl_reward_value_clamp, flags.kl_reward_value_clamp)
        last = torch.arange(mask.shape[1], device=mask.device)[None, :] == (lengths[:, None] - 1)
        rewards = -beta * kl * mask + x["scores"][:, None] * last
    return {"rewards": Expected(rewards, mask)}


def _call(fn, adapter, case: KindCase) -> dict:
    x = {k: v.clone() for k, v in case.inputs.items()}
    args = (x["scores"], x["logp"], x["ref_logp"], x["mask"])
    beta = case.params["kl_coef"]
    out = adapter(fn, *args, kl_coef=beta) if adapter is not None else fn(*args, kl_coef=beta)
    return {"rewards": out}


KL_REWARD = Kind(
    name="kl_reward",
    title="KL penalty in the per-token reward",
    signature="fn(scores [N], logp [N, T], ref_logp [N, T], mask [N, T] bool, *, kl_coef) -> rewards [N, T]",
    flags=KLRewardFlags,
    cases=lambda seed=0: kl_reward_cases(seed),
    expected=expected_kl_reward,
    call=_call,
)

"""PPO-RLHF's pieces around the verified losses: the KL-shaped per-token reward and the masked
whitening of advantages (all ranks' tokens together). The clipped policy loss is
``refimpl.losses.policy_loss`` with the "ppo" preset, the advantages ``gae_advantages`` and the
value loss ``refimpl.losses.value_loss``."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["kl_shaped_token_rewards", "masked_whiten"]


def kl_shaped_token_rewards(
    rewards: torch.Tensor,
    lengths: torch.Tensor,
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """r_t = -beta (log pi_old(a_t | s_t) - log pi_ref(a_t | s_t)) on counted tokens, plus the
    sequence reward at the last sampled token t = L - 1.

    spec: Ouyang et al. 2022, eq. (2); Shao et al. 2024, eq. (2) (the KL folded into the per-token reward of
    PPO-RLHF).
    Shapes: ``rewards [N]``, ``lengths [N]`` (sampled tokens, >= 1), ``logp`` / ``ref_logp`` /
    ``mask [N, L]``. Returns ``(token_rewards [N, L], last [N, L] bool: the last sampled token)``.
    """
    n, width = logp.shape
    if rewards.shape != (n,) or lengths.shape != (n,):
        got = f"{tuple(rewards.shape)}, {tuple(lengths.shape)}"
        raise ValueError(f"rewards, lengths: expected shape ({n},), got {got}")
    if ref_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(f"ref_logp, mask: expected shape {tuple(logp.shape)} like logp")
    positions = torch.arange(width, device=logp.device)[None, :]
    last = positions == (lengths[:, None] - 1)
    return -kl_coef * (logp - ref_logp) * mask + rewards[:, None] * last, last


def masked_whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
    eps: float = 1e-8,
) -> torch.Tensor:
    """``(x - mean) / (std + eps) * mask``, with the mean and the population std over the counted
    entries of every rank (``all_reduce_sum`` sums the three moments across ranks: count, sum,
    sum of squares). Uncounted entries become 0. Shapes: ``x``, ``mask`` the same."""
    if mask.shape != x.shape:
        raise ValueError(f"mask: expected shape {tuple(x.shape)} like x, got {tuple(mask.shape)}")
    stats = all_reduce_sum(torch.stack([mask.sum(), (x * mask).sum(), (x.square() * mask).sum()]))
    mean = stats[1] / stats[0].clamp_min(1.0)
    var = (stats[2] / stats[0].clamp_min(1.0) - mean.square()).clamp_min(0.0)
    return (x - mean) / (var.sqrt() + eps) * mask

"""The data of one RL step and the arithmetic on it that needs no model: ``RolloutBatch``, the
trainer's group-advantage convention, Magistral's minibatch normalisation, and the reduction of
summed micro-batch metrics."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from refimpl import advantages as adv_lib
from refimpl.lm.rollout import Rollout

__all__ = ["RolloutBatch", "group_advantages_for", "minibatch_std_normalise"]


@dataclass
class RolloutBatch:
    """One RL step's data on this rank. Per-token tensors are ``[N, L]``; ``mask`` is the float
    mask of tokens that count (sampled lengths, minus DAPO's overlong filter). ``advantages`` is
    ``[N]`` for group presets and ``[N, L]`` for PPO-RLHF (then ``returns`` is set)."""

    prompts: torch.Tensor
    responses: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    truncated: torch.Tensor
    rewards: torch.Tensor
    correct: torch.Tensor
    group_ids: torch.Tensor
    advantages: torch.Tensor
    old_logp: torch.Tensor
    sampler_logp: torch.Tensor
    ref_logp: torch.Tensor | None = None
    topk_indices: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    kept_fraction: float = 1.0
    drawn_reward: float = float("nan")  # mean reward / accuracy over every sample drawn,
    drawn_accuracy: float = float("nan")  # before dynamic sampling drops groups

    def __len__(self) -> int:
        return self.prompts.shape[0]

    def select(self, idx: torch.Tensor) -> RolloutBatch:
        """The sequences ``idx`` (e.g. one rank's share of a batch)."""
        fields = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            fields[f.name] = value[idx] if isinstance(value, torch.Tensor) else value
        return RolloutBatch(**fields)


def _cat_rollouts(parts: list[Rollout]) -> Rollout:
    topk = None if parts[0].topk_indices is None else torch.cat([p.topk_indices for p in parts])
    return Rollout(
        *(
            torch.cat([getattr(p, f) for p in parts])
            for f in ("prompts", "responses", "lengths", "truncated")
        ),
        torch.cat([p.mask for p in parts]),
        torch.cat([p.logprobs for p in parts]),
        topk,
    )


def group_advantages_for(rewards: torch.Tensor, group_ids: torch.Tensor, scale: str) -> torch.Tensor:
    """The trainer's advantage convention: group-centred rewards (seed 001 (90)-(91)), divided by
    the population std with eps inside the square root (``scale="group"``, GRPO), by the batch std
    (``"batch"``, Magistral) or not at all (``"none"``, Dr. GRPO (98)). Zero-variance groups get
    advantage 0 (they carry no signal); groups of one sample (never formed here) too."""
    if scale == "none":
        return adv_lib.group_advantages(rewards, group_ids, scale="none", singleton="zero")
    return adv_lib.group_advantages(
        rewards,
        group_ids,
        scale=scale,
        singleton="zero",
        std="population",
        eps=1e-6,
        eps_inside_sqrt=True,
        zero_variance="zero",
    )


def minibatch_std_normalise(
    centred: torch.Tensor,
    all_reduce_sum=lambda t: t,
    all_reduce_max=lambda t: t,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Magistral's advantage normalisation (seed 002): ``A_i / sqrt(var_B + eps)`` with var_B the
    population variance of the centred advantages of the minibatch B, whose sequences may lie
    on several ranks (the sums are all-reduced, so every rank divides by the same number). All
    values of B equal: advantage 0 (the trainer's zero-variance rule). On one rank with B the
    whole batch this is ``group_advantages(scale="batch")`` with the trainer's conventions.
    Shapes: ``centred [n]`` (n may be 0 on a rank); returns ``[n]``."""
    dtype, device = centred.dtype, centred.device
    n = torch.tensor(float(centred.numel()), dtype=dtype, device=device)
    count, total = all_reduce_sum(torch.stack([n, centred.sum()]))
    mean = total / count.clamp_min(1.0)
    var = all_reduce_sum((centred - mean).square().sum()) / count.clamp_min(1.0)  # two passes
    low = torch.tensor(float("-inf"), dtype=dtype, device=device)
    top, neg_bottom = all_reduce_max(
        torch.stack([centred.max(), -centred.min()]) if centred.numel() else torch.stack([low, low])
    )
    if bool(top == -neg_bottom):  # max == min exactly: no spread in B
        return torch.zeros_like(centred)
    return centred / torch.sqrt(var + eps)


def _index_rollout(ro: Rollout, idx: torch.Tensor) -> Rollout:
    return Rollout(
        ro.prompts[idx],
        ro.responses[idx],
        ro.lengths[idx],
        ro.truncated[idx],
        ro.mask[idx],
        ro.logprobs[idx],
        None if ro.topk_indices is None else ro.topk_indices[idx],
    )


def _finalise_metrics(totals: dict[str, float]) -> dict:
    """Per-update averages from summed micro-batch metrics: ``*_sum`` divided by the token count,
    other diagnostics weighted by sequences."""
    if not totals:
        return {"optimizer_steps_skipped": True}
    tokens = max(totals.pop("token_count", 0.0), 1.0)
    sequences = max(totals.pop("_sequences", 0.0), 1.0)
    optimizer_steps = max(totals.pop("_optimizer_steps", 0.0), 1.0)
    out = {}
    for key, value in totals.items():
        if key.endswith("_sum"):
            out[key[: -len("_sum")]] = value / tokens
        elif key == "loss":  # each optimizer step's loss is the sum of its micro-batch losses
            out[key] = value / optimizer_steps
        else:
            out[key] = value / sequences
    return {k: (v if math.isfinite(v) else float("nan")) for k, v in out.items()}

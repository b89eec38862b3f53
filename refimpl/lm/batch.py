"""The data of one RL step and the arithmetic on it that needs no model: ``RolloutBatch``, the
trainer's group-advantage convention and Magistral's minibatch normalisation."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from refimpl import advantages as adv_lib

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
    drawn_truncation: float = float("nan")  # fraction drawn with no EOS within max_new_tokens
    # zero_signal="upweight": the rows that count ([N] bool, False in zero-signal groups) and, over
    # the step's non-empty rows of all ranks, how many are kept and how many there are (1 - f)
    keep: torch.Tensor | None = None
    kept_rows: int = 0
    rows: int = 0

    def __len__(self) -> int:
        return self.prompts.shape[0]

    def select(self, idx: torch.Tensor) -> RolloutBatch:
        """The sequences ``idx`` (e.g. one rank's share of a batch)."""
        fields = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            fields[f.name] = value[idx] if isinstance(value, torch.Tensor) else value
        return RolloutBatch(**fields)


def group_advantages_for(rewards: torch.Tensor, group_ids: torch.Tensor, scale: str) -> torch.Tensor:
    """The trainer's advantage convention: group-centred rewards (Shao et al. 2024, section 4.1.2), divided by
    the population std with eps inside the square root (``scale="group"``, GRPO), by the batch std
    (``"batch"``, Magistral) or not at all (``"none"``, Dr. GRPO, Liu et al. 2025 (Dr. GRPO), section 3.2).
    Zero-variance groups get
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
    """Magistral's advantage normalisation (Mistral AI 2025): ``A_i / sqrt(var_B + eps)`` with var_B the
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

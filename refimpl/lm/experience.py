"""An RL step's experience, before any gradient: groups of sampled responses and their rewards
(``sample_groups``), DAPO's dynamic sampling over rounds of prompts (``draw_groups``), the old-policy
and reference log-probs recomputed by the trainer's forward pass (``score``), and PPO-RLHF's
token-level advantages (``rlhf_advantages``). ``Trainer.collect`` puts them together."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import torch

from refimpl import advantages as adv_lib
from refimpl.estimators import gae_advantages
from refimpl.lm import distributed as dist_lib
from refimpl.lm.model import GPT
from refimpl.lm.recipes import Recipe
from refimpl.lm.rlhf import kl_shaped_token_rewards, masked_whiten
from refimpl.lm.rollout import Rollout, generate, policy_logprobs, response_logits
from refimpl.lm.tasks import EOS, PAD, Problems, Task

__all__ = ["Groups", "Scores", "autocast", "sample_groups", "draw_groups", "score", "rlhf_advantages"]


class Groups(NamedTuple):
    """Sampled responses with their rewards (``rewards [N]``, shaped: partial credit, overlong
    penalty), exact correctness (``correct [N]``) and group ids (``group_ids [N]``)."""

    rollout: Rollout
    rewards: torch.Tensor
    correct: torch.Tensor
    group_ids: torch.Tensor


class Drawn(NamedTuple):
    """The groups kept by ``draw_groups`` and what was drawn to get them."""

    groups: Groups
    kept_fraction: float  # kept groups / drawn groups
    reward: float  # mean reward over every sample drawn (before dynamic sampling drops groups)
    accuracy: float  # mean exact correctness over every sample drawn
    truncation: float = float("nan")  # fraction of every sample drawn with no EOS by max_new_tokens


class Scores(NamedTuple):
    """Per-token log-probs ``[N, L]`` of the sampled tokens under the policy that sampled them
    (recomputed) and the reference (None without one); PPO-RLHF's values ``[N, L + 1]``
    (V(s_0) .. V(s_L)), else None."""

    old_logp: torch.Tensor
    ref_logp: torch.Tensor | None
    values: torch.Tensor | None


def autocast(device: torch.device, amp: bool):
    """bfloat16 autocast on CUDA when ``amp``; nothing on the CPU."""
    if device.type == "cuda" and amp:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def sample_groups(model: GPT, task: Task, problems: Problems, config, recipe: Recipe, generator) -> Groups:
    """``group_size`` responses per problem at the training temperature / top-k, scored by the
    task's reward (``config.reward``) plus DAPO's soft overlong penalty (Yu et al. 2025, section 3.4)."""
    c = config
    device = problems.prompts.device
    prompts = problems.prompts.repeat_interleave(c.group_size, dim=0)
    model.eval()
    with autocast(device, c.amp):
        ro = generate(
            model,
            prompts,
            max_new_tokens=c.max_new_tokens,
            eos=EOS,
            pad=PAD,
            temperature=c.temperature,
            top_k=c.top_k,
            generator=generator,
        )
    model.train()
    group_ids = torch.arange(len(problems), device=device).repeat_interleave(c.group_size)
    group_problems = problems.index(group_ids)
    correct = task.rewards(ro.responses, ro.lengths, group_problems, kind="exact")
    rewards = correct
    if c.reward != "exact":
        rewards = task.rewards(ro.responses, ro.lengths, group_problems, kind=c.reward)
    if recipe.overlong_cache_len > 0:
        penalty = adv_lib.overlong_penalty(ro.lengths, c.max_new_tokens, recipe.overlong_cache_len)
        rewards = rewards + penalty.to(rewards.dtype)
    return Groups(ro, rewards, correct, group_ids)


def draw_groups(draw: Callable[[], Groups], config, recipe: Recipe) -> Drawn:
    """``draw()`` once; with dynamic sampling (DAPO, Yu et al. 2025, section 3.2), rounds of ``draw()`` until
    ``prompts_per_step`` groups with non-zero reward variance are kept (at most
    ``max_sampling_rounds``; the groups of later rounds get new ids)."""
    c = config
    rounds = c.max_sampling_rounds if recipe.dynamic_sampling else 1
    parts, kept_groups, drawn_groups, drawn_reward, drawn_correct, drawn_truncated = [], 0, 0, 0.0, 0.0, 0.0
    for _ in range(rounds):
        ro, rewards, correct, group_ids = draw()
        drawn_groups += c.prompts_per_step
        drawn_reward += float(rewards.sum())
        drawn_correct += float(correct.sum())
        drawn_truncated += float(ro.truncated.sum())
        if recipe.dynamic_sampling:
            keep = adv_lib.dynamic_sampling_mask(rewards, group_ids)
            idx = keep.nonzero().squeeze(1)[: (c.prompts_per_step - kept_groups) * c.group_size]
            ro = _index_rollout(ro, idx)
            rewards, correct, group_ids = rewards[idx], correct[idx], group_ids[idx] + drawn_groups
        parts.append((ro, rewards, correct, group_ids))
        kept_groups += rewards.shape[0] // c.group_size
        if kept_groups >= c.prompts_per_step:
            break
    ro = _cat_rollouts([p[0] for p in parts])
    rewards, correct, group_ids = (torch.cat([p[i] for p in parts]) for i in (1, 2, 3))
    samples = drawn_groups * c.group_size
    return Drawn(
        Groups(ro, rewards, correct, group_ids),
        kept_fraction=kept_groups / max(drawn_groups, 1),
        reward=drawn_reward / samples,
        accuracy=drawn_correct / samples,
        truncation=drawn_truncated / samples,
    )


@torch.no_grad()
def score(model: GPT, ref_model: GPT | None, ro: Rollout, config, rlhf: bool) -> Scores:
    """Old-policy (and reference) log-probs recomputed by the trainer's forward pass, in the
    micro-batch size the update uses, so on-policy ratios are 1 (Shao et al. 2024, eq. (3)); with ``rlhf``
    the value head's values too."""
    c = config
    device = ro.prompts.device
    old, ref, val = [], [], []
    rows = torch.arange(ro.prompts.shape[0], device=device)
    for idx in rows.split(c.micro_batch_size) if len(rows) else ():  # no forward pass of an empty batch
        prompts, responses = ro.prompts[idx], ro.responses[idx]
        topk = None if ro.topk_indices is None else ro.topk_indices[idx]
        with autocast(device, c.amp):
            if rlhf:
                full = torch.cat([prompts, responses], dim=1)
                logits, values = model(full, return_values=True)
                logits = logits[:, prompts.shape[1] - 1 : -1]
                val.append(values[:, prompts.shape[1] - 1 :].float())  # V(s_0) .. V(s_L)
            else:
                logits = response_logits(model, prompts, responses)
            old.append(policy_logprobs(logits, responses, c.temperature, topk)[0])
            if ref_model is not None:
                ref_logits = response_logits(ref_model, prompts, responses)
                ref.append(policy_logprobs(ref_logits, responses, c.temperature, topk)[0])
    empty = torch.zeros(0, c.max_new_tokens, device=device)
    old_logp = torch.cat(old) if old else empty
    ref_logp = (torch.cat(ref) if ref else empty) if ref_model is not None else None
    values = None
    if rlhf:
        values = torch.cat(val) if val else torch.zeros(0, c.max_new_tokens + 1, device=device)
    return Scores(old_logp, ref_logp, values)


def rlhf_advantages(
    ro: Rollout, rewards: torch.Tensor, scores: Scores, mask: torch.Tensor, config
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-RLHF: per-token reward ``-beta (log pi_old - log pi_ref)`` plus the sequence reward at
    the last sampled token (Ouyang et al. 2022, eq. (2)), then token-level GAE (Schulman et al. 2016,
    eq. (16)); advantages are
    whitened over the tokens of all ranks. Returns ``(advantages [N, L], returns [N, L])``."""
    c = config
    token_rewards, last = kl_shaped_token_rewards(
        rewards, ro.lengths, scores.old_logp, scores.ref_logp, mask, c.rlhf_kl_coef
    )
    terminated = last & ~ro.truncated[:, None]
    truncated = last & ro.truncated[:, None]
    values = scores.values
    out = gae_advantages(
        token_rewards, values[:, :-1], values[:, 1:], terminated, truncated, c.gamma, c.gae_lambda
    )
    return masked_whiten(out.advantages, mask, dist_lib.all_reduce_sum), out.returns


def _cat_rollouts(parts: list[Rollout]) -> Rollout:
    """The rollouts one after another, field by field (``topk_indices`` None stays None)."""
    return Rollout(**{
        f.name: None if getattr(parts[0], f.name) is None else torch.cat([getattr(p, f.name) for p in parts])
        for f in dataclasses.fields(Rollout)
    })


def _index_rollout(ro: Rollout, idx: torch.Tensor) -> Rollout:
    """The responses ``idx`` of every field (``topk_indices`` None stays None)."""
    return Rollout(**{
        f.name: None if getattr(ro, f.name) is None else getattr(ro, f.name)[idx]
        for f in dataclasses.fields(Rollout)
    })

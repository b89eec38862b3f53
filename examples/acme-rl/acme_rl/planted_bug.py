"""acme_rl.losses and acme_rl.advantages with one plausible bug planted in each, to see what a
failure looks like (planted/test_planted_bug.py; CI requires it to fail):

- ``dapo_loss`` masks by multiplication: padding that holds NaN or inf (NaN * 0 = NaN) reaches the
  loss; only the case class ``masked_nonfinite`` fails.
- ``grpo_advantages`` takes the batch to be contiguous groups of equal size (``rewards.view(-1,
  G)``, as a trainer that always samples G completions per prompt may): groups of unequal sizes
  or in another order (``unequal_groups``, ``singleton_group``) fail.
"""

import torch


def dapo_loss(logp, old_logp, advantages, mask, *, normalizer=None):
    m = mask.to(torch.promote_types(logp.dtype, torch.float32))
    log_ratio = (logp.to(m.dtype) - old_logp.to(m.dtype)) * m  # the bug: NaN * 0 = NaN
    ratio = torch.exp(torch.where(log_ratio > 80.0, 80.0, log_ratio))  # bounded, NaN kept
    a = advantages.to(m.dtype).unsqueeze(-1)
    per_token = -torch.min(ratio * a, torch.clamp(ratio, 0.8, 1.28) * a)
    return (per_token * m).sum() / (normalizer or m.sum().clamp(min=1))


def grpo_advantages(rewards, group_ids, eps=1e-6):
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    # the bug: the batch taken to be contiguous groups, each as large as the first
    r = rewards.view(-1, int((group_ids == group_ids[0]).sum()))
    centred = r - r.mean(dim=-1, keepdim=True)
    variance = centred.pow(2).mean(dim=-1, keepdim=True)
    constant = r.amax(dim=-1, keepdim=True) == r.amin(dim=-1, keepdim=True)
    return torch.where(constant, 0.0, centred / torch.sqrt(variance + eps)).reshape(-1)

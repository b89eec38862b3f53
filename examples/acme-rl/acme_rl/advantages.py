"""Group-relative advantages of acme-rl."""

import torch


def grpo_advantages(rewards, group_ids, eps=1e-6):
    """GRPO's advantages (Shao et al. 2024): (R_i - mean_g R) / sqrt(var_g R + eps) over the group
    g of sample i, with the population variance; a group of one sample, or whose rewards are all
    equal, gets 0. rewards, group_ids: [N]."""
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    _, group = torch.unique(group_ids, return_inverse=True)
    n_groups = int(group.max()) + 1

    def per_group(values, reduce="sum"):
        out = torch.zeros(n_groups, dtype=rewards.dtype)
        return out.scatter_reduce(0, group, values, reduce, include_self=False)

    count = per_group(torch.ones_like(rewards))
    centred = rewards - (per_group(rewards) / count)[group]
    variance = (per_group(centred**2) / count)[group]
    constant = per_group(rewards, "amax")[group] == per_group(rewards, "amin")[group]
    return torch.where(constant, 0.0, centred / torch.sqrt(variance + eps))

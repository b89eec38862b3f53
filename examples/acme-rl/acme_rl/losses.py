"""Policy loss and KL estimator of acme-rl, written as a framework would write them."""

import torch


def dapo_loss(logp, old_logp, advantages, mask, *, normalizer=None):
    """DAPO's clipped surrogate (Yu et al. 2025): decoupled clip bounds [1 - 0.2, 1 + 0.28] and the
    token mean over the batch (or over ``normalizer`` tokens, a global count under gradient
    accumulation). logp, old_logp, mask: [N, T]; advantages: [N]. Padding is selected away with
    ``torch.where`` before any arithmetic (it may hold NaN or inf)."""
    dtype = torch.promote_types(logp.dtype, torch.float32)
    mask = mask.bool()
    ratio = torch.exp(torch.where(mask, logp.to(dtype) - old_logp.to(dtype), 0.0).clamp(max=80.0))
    a = advantages.to(dtype).unsqueeze(-1)
    per_token = torch.where(mask, -torch.min(ratio * a, torch.clamp(ratio, 0.8, 1.28) * a), 0.0)
    return per_token.sum() / (normalizer or mask.sum().clamp(min=1))


def kl_k3(logp, ref_logp):
    """The k3 estimator of KL(pi || pi_ref) per token (Schulman 2020): r - 1 - log r with
    log r = x = ref_logp - logp, written as expm1(x) - x (no cancellation for small x). A token the
    policy gives probability 0 (x = +inf) has k3 = +inf, where expm1(x) - x would be inf - inf."""
    x = ref_logp - logp
    plus_inf = torch.isposinf(x)
    safe = torch.where(plus_inf, 0.0, x)  # the finite branch's gradient stays free of inf * 0
    return torch.where(plus_inf, torch.exp(x), torch.expm1(safe) - safe)

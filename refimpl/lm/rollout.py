"""Group sampling with a KV cache, and the trainer's log-probs under the *same* sampling policy.

The sampling policy is the model's softmax after two transforms: logits divided by the
temperature, then (optionally) restricted to the top-k tokens. The trainer must score sampled
tokens under exactly this policy, otherwise on-policy ratios differ from 1 (a trap of minimal
trainers). With top-k, the support is the set of the sampler's top-k tokens at each position,
recorded as ``topk_indices``; the trainer renormalises the current logits over that recorded set,
so a sampled token always has a finite log-prob, and on-policy the two agree exactly.

Masks come from the sampled lengths, never from token ids: a response runs through its first EOS
(EOS included, so EOS is a trained action) or is truncated at ``max_new_tokens``. Tokens after EOS
are filled with ``pad`` (which may equal EOS) and are masked out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from refimpl.lm.model import GPT, KVCache
from refimpl.losses.logprobs import token_entropy, token_logprobs

__all__ = ["Rollout", "generate", "policy_logprobs", "response_logits", "lengths_to_mask"]


@dataclass
class Rollout:
    """Sampled responses. ``prompts [N, P]``; ``responses [N, L]`` (after EOS: ``pad``);
    ``lengths [N]`` tokens sampled per response (through EOS, or ``L`` when truncated);
    ``truncated [N]`` bool (no EOS within ``L``); ``mask [N, L]`` bool from ``lengths``;
    ``logprobs [N, L]`` the sampler's log-probs of the sampled tokens under the sampling policy
    (0 where masked); ``topk_indices [N, L, k]`` the sampler's top-k sets (None without top-k)."""

    prompts: torch.Tensor
    responses: torch.Tensor
    lengths: torch.Tensor
    truncated: torch.Tensor
    mask: torch.Tensor
    logprobs: torch.Tensor
    topk_indices: torch.Tensor | None


def lengths_to_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """``mask[i, t] = t < lengths[i]``: bool ``[N, width]``."""
    return torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if not temperature > 0:
        raise ValueError(f"temperature: expected > 0, got {temperature}")
    return logits.float() / temperature


def policy_logprobs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    topk_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``tokens [N, T]`` and entropies, both ``[N, T]`` float32, under the sampling
    policy of ``logits [N, T, V]``: ``softmax(logits / temperature)`` restricted to and
    renormalised over ``topk_indices [N, T, k]`` when given (see the module docstring).
    spec: kl.md section 1 (Ouyang et al. 2022), the per-token factors of pi_theta(y | x)."""
    if logits.shape[:2] != tokens.shape:
        raise ValueError(f"tokens: expected shape {tuple(logits.shape[:2])}, got {tuple(tokens.shape)}")
    z = _scaled(logits, temperature)
    if topk_indices is not None:
        z = z.gather(-1, topk_indices)
        # Position of each token inside its recorded top-k set (the sampler guarantees membership).
        member = topk_indices == tokens[..., None]
        tokens = member.to(torch.long).argmax(-1)
    return token_logprobs(z, tokens, check_finite=False), token_entropy(z, check_finite=False)


def response_logits(model: GPT, prompts: torch.Tensor, responses: torch.Tensor, **kwargs):
    """Logits ``[N, L, V]`` (and values ``[N, L]`` with ``return_values=True``) predicting each
    response token, from one uncached forward pass over prompt + response."""
    p = prompts.shape[1]
    seq = torch.cat([prompts, responses[:, :-1]], dim=1)
    out = model(seq, **kwargs)
    if isinstance(out, tuple):
        return out[0][:, p - 1 :], out[1][:, p - 1 :]
    return out[:, p - 1 :]


@torch.no_grad()
def generate(
    model: GPT,
    prompts: torch.Tensor,
    *,
    max_new_tokens: int,
    eos: int,
    pad: int,
    temperature: float = 1.0,
    top_k: int = 0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> Rollout:
    """Sample one response per row of ``prompts [N, P]`` (repeat prompts for groups).

    ``greedy`` takes the arg-max of the logits (temperature and top-k do not change it; the
    recorded log-probs are still those of the sampling policy). ``top_k = 0`` means no top-k.
    With ``use_cache`` the prompt is encoded once and each new token costs one position; without,
    every step re-encodes the whole prefix (kept for tests and benchmarks).
    """
    if prompts.dim() != 2 or prompts.shape[1] < 1:
        raise ValueError(f"prompts: expected [N, P] with P >= 1, got shape {tuple(prompts.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
    if top_k < 0:
        raise ValueError(f"top_k: expected >= 0 (0 = off), got {top_k}")
    n, p = prompts.shape
    device = prompts.device
    cache = None
    if use_cache:
        cache = KVCache(model.config, n, p + max_new_tokens - 1, device, next(model.parameters()).dtype)
    tokens = prompts
    step_input = prompts
    sampled, logps, topks = [], [], []
    for _ in range(max_new_tokens):
        logits = model(step_input, cache=cache)[:, -1] if use_cache else model(tokens)[:, -1]
        z = _scaled(logits, temperature)
        topk_idx = None
        if top_k:
            topk_idx = z.topk(min(top_k, z.shape[-1]), dim=-1).indices
            z = torch.full_like(z, float("-inf")).scatter(-1, topk_idx, z.gather(-1, topk_idx))
        logp_all = F.log_softmax(z, dim=-1)
        if greedy:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
        sampled.append(nxt)
        logps.append(logp_all.gather(-1, nxt[:, None]).squeeze(-1))
        if topk_idx is not None:
            topks.append(topk_idx)
        step_input = nxt[:, None]
        tokens = torch.cat([tokens, step_input], dim=1)
    responses = torch.stack(sampled, dim=1)
    is_eos = responses == eos
    truncated = ~is_eos.any(1)
    lengths = torch.where(truncated, max_new_tokens, is_eos.to(torch.long).argmax(1) + 1)
    mask = lengths_to_mask(lengths, max_new_tokens)
    responses = responses.masked_fill(~mask, pad)
    logprobs = torch.stack(logps, dim=1).masked_fill(~mask, 0.0)
    topk_indices = torch.stack(topks, dim=1) if topks else None
    return Rollout(prompts, responses, lengths, truncated, mask, logprobs, topk_indices)

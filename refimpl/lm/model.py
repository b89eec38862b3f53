"""A small decoder-only transformer in the style of nanoGPT, with a KV cache for sampling.

Pre-norm blocks (LayerNorm -> causal self-attention -> residual, LayerNorm -> MLP -> residual),
learned or rotary positions, the output projection tied to the token embedding, and an optional
scalar value head (PPO-RLHF's critic shares the trunk). No dropout: the trainer's log-probs must
equal the sampler's.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPTConfig", "GPT", "KVCache", "frozen_copy"]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model. ``positions``: "learned" (absolute embeddings) or "rope" (rotary)."""

    vocab_size: int = 14
    block_size: int = 16
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    positions: str = "learned"
    value_head: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive integer, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd: expected a multiple of n_head={self.n_head}, got {self.n_embd}")
        if self.positions not in ("learned", "rope"):
            raise ValueError(f"positions: expected 'learned' or 'rope', got {self.positions!r}")
        if self.positions == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError("positions: rope needs an even head dimension n_embd // n_head")

    def to_dict(self) -> dict:
        return asdict(self)


class KVCache:
    """Keys and values of every layer for ``batch`` sequences of up to ``max_len`` tokens, and
    ``pos``, the number of positions already written (the next token's position)."""

    def __init__(self, config: GPTConfig, batch: int, max_len: int, device, dtype):
        if max_len > config.block_size:
            raise ValueError(f"max_len: {max_len} exceeds the model's block_size {config.block_size}")
        head_dim = config.n_embd // config.n_head
        shape = (config.n_layer, batch, config.n_head, max_len, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.pos = 0


def _rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x [N, H, T, D]`` at integer ``positions [T]``."""
    half = x.shape[-1] // 2
    freqs = 10000.0 ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[:, None] * freqs[None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.n_head, self.layer, self.rope = config.n_head, layer, config.positions == "rope"
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(n, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        if self.rope:
            q, k = _rotate(q, positions), _rotate(k, positions)
        if cache is None:
            y = _attention(q, k, v, is_causal=True)
        else:
            start = cache.pos
            cache.keys[self.layer, :, :, start : start + t] = k
            cache.values[self.layer, :, :, start : start + t] = v
            k = cache.keys[self.layer, :, :, : start + t]
            v = cache.values[self.layer, :, :, : start + t]
            # Query i (absolute position start + i) sees keys 0 .. start + i.
            allowed = torch.arange(start + t, device=x.device)[None, :] <= positions[:, None]
            y = _attention(q, k, v, attn_mask=allowed)
        return self.proj(y.transpose(1, 2).reshape(n, t, c))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` of ``q, k, v [N, H, T, D]``; for an empty batch (N = 0)
    the empty result itself: on CUDA (torch 2.11) the fused kernel returns None there, where the
    CPU returns an empty tensor."""
    if q.shape[0] == 0:
        return q.new_zeros(q.shape[:-1] + v.shape[-1:])
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd),
            nn.GELU(),
            nn.Linear(4 * config.n_embd, config.n_embd),
        )

    def forward(self, x, positions, cache):
        x = x + self.attn(self.ln_1(x), positions, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """``forward(idx [N, T]) -> logits [N, T, V]`` (and values ``[N, T]`` with
    ``return_values=True``; the value head must exist). With ``cache``, ``idx`` holds the tokens
    at positions ``cache.pos ..`` and the cache advances by ``T``."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.positions == "learned" else None
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.value = nn.Linear(config.n_embd, 1) if config.value_head else None
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None, return_values: bool = False):
        if idx.dim() != 2:
            raise ValueError(f"idx: expected [N, T] token ids, got shape {tuple(idx.shape)}")
        start = 0 if cache is None else cache.pos
        t = idx.shape[1]
        if start + t > self.config.block_size:
            raise ValueError(f"idx: {start + t} positions exceed block_size {self.config.block_size}")
        positions = torch.arange(start, start + t, device=idx.device)
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(positions)[None]
        for block in self.blocks:
            x = block(x, positions, cache)
        if cache is not None:
            cache.pos += t
        h = self.ln_f(x)
        logits = self.lm_head(h)
        if not return_values:
            return logits
        if self.value is None:
            raise ValueError("return_values: this model was built without a value head (value_head=False)")
        return logits, self.value(h).squeeze(-1)


def frozen_copy(model: GPT) -> GPT:
    """A copy of ``model`` in eval mode with no gradients (a reference policy)."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref

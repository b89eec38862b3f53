"""Per-token log-probabilities from hidden states through the output layer (the "lm head"), with
the ``[N, V]`` logits never all in memory at once.

``log_softmax(hidden @ weight.T).gather(tokens)`` materialises the ``[N, V]`` logits, keeps their
``[N, V]`` log-softmax for backward and builds two more ``[N, V]`` tensors in backward (the
gradient of the gather and that of the logits): at N = 4096 tokens and V = 128k, 2 GiB each in
float32. Here the tokens are taken ``rows`` at a time (``lm_head_chunk_rows``): the forward forms a
chunk's logits, reduces each row to the three numbers of kl.md eq. (14') (``logprob_stats``, the
Triton kernel on CUDA) and frees the chunk; autograd saves the inputs, the tokens and two numbers
per token. The backward forms each chunk's logits again, overwrites them with their gradient
(eq. (15'), ``logprob_grad``) and accumulates ``grad_hidden = dlogits @ weight`` and
``grad_weight += dlogits.T @ hidden``. The cost is one more ``[N, d] x [d, V]`` product than the
plain formula (the logits are formed twice), as in Liger-Kernel's fused linear losses, which
compute the gradients in the forward instead (possible there because their loss is a scalar; a
per-token log-probability's gradient depends on the loss that follows)."""

from __future__ import annotations

import torch

from refimpl.losses.logprobs import (
    _compute_dtype,
    _logprob_parts,
    check_distributions,
    check_tokens,
    logprob_grad,
    logprob_stats,
    logprobs_chunk_elements,
    memory_budget,
    use_triton,
)

__all__ = ["lm_head_logprobs"]

#: ``[rows, V]`` compute-dtype tensors of one chunk at the path's peak: its logits (their gradient
#: is written over them) and the eager statistics' temporaries, bounded by the same size
#: (``_stats_rows``; none with the Triton kernels).
LM_HEAD_TEMPORARIES = 2


#: Tokens per chunk each device type aims at, where the memory bound allows (``lm_head_chunk_rows``).
#: Each chunk's three products read the whole ``[V, d]`` weight (and ``grad_weight``) once, for
#: ``2 rows V d`` multiply-adds each: ``rows / s`` flops per byte of weight traffic, whatever V and
#: d, so a CPU needs a few hundred rows before the products stop waiting on memory, and more only
#: makes the ``[rows, V]`` chunk leave the caches between its passes (benchmarks/logprobs.py
#: ``--lm-head ... --chunk-rows``; docs/results.md). Device types without an entry take the memory
#: bound alone.
DEVICE_LM_HEAD_ROWS = {"cpu": 256}


def lm_head_chunk_rows(rows: int, vocab: int, dtype: torch.dtype, *, device: torch.device | str | None = None,
                       budget_bytes: int | None = None) -> int:
    """Tokens per chunk of ``lm_head_logprobs`` for ``rows`` tokens, ``vocab`` outputs and inputs of
    ``dtype`` on ``device``: ``DEVICE_LM_HEAD_ROWS[device type]`` (no target when ``device`` is None
    or has no entry), and at most the most whose ``LM_HEAD_TEMPORARIES`` ``[rows', V]`` compute-dtype
    tensors fit in ``budget_bytes`` (default ``MEMORY_FRACTION`` of one ``[rows, V]`` compute-dtype
    tensor, the logits ``log_softmax(hidden @ weight.T).gather()`` materialises; its peak holds at
    least three such tensors, so the fused path's is at most a twelfth of it plus O(rows + V),
    unless one row alone exceeds the bound); at least one and at most ``rows``."""
    budget, size = memory_budget(rows, vocab, dtype, budget_bytes)
    bound = int(budget // (LM_HEAD_TEMPORARIES * max(vocab, 1) * size))
    target = DEVICE_LM_HEAD_ROWS.get(torch.device(device).type) if device is not None else None
    return max(1, min(rows, bound, target or bound))


def _stats_rows(chunk: torch.Tensor) -> int:
    """Rows of the eager statistics' sub-chunks of a ``[rows, V]`` chunk: ``logprobs_chunk_elements``
    with the chunk's own compute-dtype size as the memory bound (so their temporaries take at most
    as much as the chunk: ``LM_HEAD_TEMPORARIES``)."""
    rows, vocab = chunk.shape
    size = _compute_dtype(chunk.dtype).itemsize
    elements = logprobs_chunk_elements(chunk.device, rows, vocab, chunk.dtype,
                                       budget_bytes=rows * vocab * size)
    return max(1, elements // vocab)


class _LMHeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, tokens, rows_per_chunk: int, check_finite: bool, kernel: bool):
        n = hidden.shape[0]
        dtype = _compute_dtype(hidden.dtype)
        top, rest, picked = (torch.empty(n, dtype=dtype, device=hidden.device) for _ in range(3))
        for start in range(0, n, rows_per_chunk):
            rows = slice(start, start + rows_per_chunk)
            chunk = hidden[rows] @ weight.T
            top[rows], rest[rows], picked[rows] = logprob_stats(
                chunk, tokens[rows], rows_per_chunk=_stats_rows(chunk), kernel=kernel)
            del chunk
        logp, others = _logprob_parts(top, rest, picked)
        check_distributions(top, check_finite)
        ctx.save_for_backward(hidden, weight, tokens, top, others)
        ctx.rows_per_chunk = rows_per_chunk
        ctx.kernel = kernel
        return logp

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        hidden, weight, tokens, top, others = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[:2]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(weight) if want_weight else None
        step = ctx.rows_per_chunk
        for start in range(0, hidden.shape[0], step):
            rows = slice(start, start + step)
            chunk = hidden[rows] @ weight.T
            dlogits = logprob_grad(chunk, tokens[rows], top[rows], others[rows], grad_out[rows],
                                   rows_per_chunk=_stats_rows(chunk), kernel=ctx.kernel, out=chunk)
            if want_hidden:
                torch.mm(dlogits, weight, out=grad_hidden[rows])
            if want_weight:
                grad_weight.addmm_(dlogits.T, hidden[rows])
            del chunk, dlogits
        return grad_hidden, grad_weight, None, None, None, None


def lm_head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor, *,
                     chunk_rows: int | None = None, check_finite: bool = True,
                     backend: str = "auto") -> torch.Tensor:
    """``log softmax(hidden @ weight.T)[..., tokens]`` per token, without the ``[N, V]`` logits.

    spec: kl.md eq. (14')-(15') (section 6) on the logits ``z = hidden @ weight.T``; the values and
    gradients of ``token_logprobs(hidden @ weight.T, tokens)`` (cancellation-free, relative-accurate
    on confident rows), with gradients w.r.t. ``hidden`` and ``weight`` (``dlogits @ weight`` and
    ``dlogits.T @ hidden``). The logits are formed ``chunk_rows`` tokens at a time, twice (forward
    and backward); autograd saves ``hidden``, ``weight``, the tokens and two numbers per token.
    Half-precision inputs: logits in their dtype (as ``hidden @ weight.T``), statistics in float32,
    ``grad_weight`` accumulated in the weight's dtype (one rounding per chunk, as Liger-Kernel's).

    Args:
        hidden: ``[..., d]`` final hidden states, a float dtype.
        weight: ``[V, d]`` output-layer weight, the dtype and device of ``hidden``.
        tokens: ``[...]`` integer token ids in ``[0, V)``, the shape of ``hidden`` without d.
        chunk_rows: tokens per chunk (default ``lm_head_chunk_rows``'s rule: the device's target
            within a memory bound). The result does not depend on it beyond roundoff.
        check_finite: raise ValueError if a row of logits has a NaN or ``+inf`` (a host
            synchronisation).
        backend: as ``token_logprobs``'s: ``"auto"`` (the Triton kernels on CUDA when installed),
            ``"eager"`` or ``"triton"``.
    Returns:
        ``[...]`` log-probabilities in ``promote_types(hidden.dtype, float32)``.
    """
    if not isinstance(hidden, torch.Tensor) or not hidden.is_floating_point() or hidden.ndim < 1:
        raise TypeError("hidden must be a floating-point torch.Tensor [..., d]")
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or weight.shape[1] != hidden.shape[-1]:
        got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be [V, d={hidden.shape[-1]}], got {got}")
    if weight.dtype != hidden.dtype or weight.device != hidden.device:
        raise ValueError(f"weight must have the dtype and device of hidden ({hidden.dtype}, "
                         f"{hidden.device}), got {weight.dtype}, {weight.device}")
    if weight.shape[0] == 0:
        raise ValueError("weight must have V >= 1 rows")
    vocab = weight.shape[0]
    check_tokens(tokens, hidden, "hidden", "d", vocab)
    flat = hidden.reshape(-1, hidden.shape[-1])
    if chunk_rows is None:
        chunk_rows = lm_head_chunk_rows(flat.shape[0], vocab, hidden.dtype, device=hidden.device)
    elif isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ValueError(f"chunk_rows must be a positive int, got {chunk_rows!r}")
    kernel = use_triton(hidden.device, hidden.dtype, backend)
    logp = _LMHeadLogprobs.apply(flat, weight, tokens.reshape(-1).long(), chunk_rows, check_finite, kernel)
    return logp.reshape(tokens.shape)

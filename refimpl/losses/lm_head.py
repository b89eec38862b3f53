"""Per-token log-probabilities from hidden states through the output layer (the "lm head"), with
the ``[N, V]`` logits never all in memory at once.

``log_softmax(hidden @ weight.T).gather(tokens)`` materialises the ``[N, V]`` logits, keeps their
``[N, V]`` log-softmax for backward and builds two more ``[N, V]`` tensors in backward (the
gradient of the gather and that of the logits): at N = 4096 tokens and V = 128k, 2 GiB each in
float32. Here the tokens are taken ``rows`` at a time (``lm_head_chunk_rows``): the forward forms a
chunk's logits, reduces each row to the three numbers of kl.md eq. (14') (``chunk_logits_stats``:
in place on float32 / float64 logits, the Triton kernel on CUDA) and frees the chunk; autograd saves
the inputs, the tokens and two numbers per token. The backward forms each chunk's logits again,
overwrites them with their gradient (eq. (15'), ``chunk_gradient``) and accumulates ``grad_hidden =
dlogits @ weight`` and ``grad_weight += dlogits.T @ hidden`` (``chunk_products``). The cost is one
more ``[N, d] x [d, V]`` product than the plain formula (the logits are formed twice): a per-token
log-probability's gradient depends on the loss that follows. Where that loss is known, as in
Liger-Kernel's fused linear losses, the gradients can be formed in the forward from one formation
of the logits: ``refimpl.losses.lm_head_loss.lm_head_policy_loss`` does so with these chunk steps.
"""

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
#: is written over them) and the eager statistics' temporaries of half-precision logits, bounded by
#: the same size (``_stats_rows``; none in place on float32 / float64 logits or with the Triton
#: kernels).
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


def _exponentiates(chunk: torch.Tensor, kernel: bool) -> bool:
    """Whether a chunk's eager arithmetic runs in place: logits already in the compute dtype
    (float32, float64) and no Triton kernel (which reads the logits without temporaries anyway)."""
    return not kernel and chunk.dtype == _compute_dtype(chunk.dtype)


def _exp_stats_(chunk: torch.Tensor, tokens_rows: torch.Tensor):
    """``(m, rest, x_y)`` of every row of a compute-dtype chunk ``[rows, V]`` of logits, the numbers of
    ``logprobs._row_stats`` (the same ``exp(x - m) = exp(-(m - x))`` and sum, one maximal entry's 1
    left out; kl.md eq. (14')), overwriting the chunk with ``exp(x - m)``: no ``[rows, V]``
    temporary, sub-chunks of ``_stats_rows`` rows so that each stays in a core's cache between its
    passes."""
    n = chunk.shape[0]
    picked = chunk.gather(1, tokens_rows.unsqueeze(1)).squeeze(1)
    top, rest = chunk.new_empty(n), chunk.new_empty(n)
    step = _stats_rows(chunk)
    for start in range(0, n, step):
        rows = slice(start, start + step)
        part = chunk[rows]
        maximum, where = part.max(dim=1, keepdim=True)
        part.sub_(maximum).exp_()
        part.scatter_(1, where, 0.0)
        torch.sum(part, dim=1, out=rest[rows])
        part.scatter_(1, where, 1.0)  # exp(0): the maximal entry back
        top[rows] = maximum.squeeze(1)
    return top, rest, picked


def chunk_logits_stats(hidden_rows: torch.Tensor, weight: torch.Tensor, tokens_rows: torch.Tensor, *,
                       kernel: bool):
    """One chunk's logits ``z = hidden_rows @ weight.T`` (``[rows, V]``) and their row statistics
    ``(chunk, m, rest, z_y, exponentiated)`` (kl.md eq. (14'); ``logprob_stats``'s numbers): the forward
    step of every chunked lm-head path (``lm_head_logprobs``, ``refimpl.losses.lm_head_loss``).
    ``chunk`` holds ``exp(z - m)`` afterwards where ``exponentiated`` (eager, float32 / float64
    logits: the statistics computed in place, ``_exp_stats_``), else the logits."""
    chunk = hidden_rows @ weight.T
    if _exponentiates(chunk, kernel):
        return chunk, *_exp_stats_(chunk, tokens_rows), True
    top, rest, picked = logprob_stats(chunk, tokens_rows, rows_per_chunk=_stats_rows(chunk), kernel=kernel)
    return chunk, top, rest, picked, False


def chunk_gradient(chunk: torch.Tensor, tokens_rows: torch.Tensor, top: torch.Tensor, others: torch.Tensor,
                   grad: torch.Tensor, *, kernel: bool, picked: torch.Tensor | None = None) -> torch.Tensor:
    """``dlogits = grad (onehot - p)`` (kl.md eq. (15'); ``logprob_grad``'s formulas) written over
    ``chunk``, which holds the logits ``z`` (``picked`` None) or ``exp(z - m)`` (``picked`` the
    tokens' logits ``z_y``: ``chunk_logits_stats``'s in-place path): ``-p_v g = -exp(z_v - m) g / total``
    off the token and ``(1 - p_y) g = others g / total`` on it, ``total = others + exp(z_y - m)``;
    in place, sub-chunk by sub-chunk, for compute-dtype logits without the kernel, else
    ``logprob_grad``."""
    if picked is None and not _exponentiates(chunk, kernel):
        return logprob_grad(chunk, tokens_rows, top, others, grad, rows_per_chunk=_stats_rows(chunk),
                            kernel=kernel, out=chunk)
    exponentiate = picked is None
    if exponentiate:
        picked = chunk.gather(1, tokens_rows.unsqueeze(1)).squeeze(1)
    grad = grad.to(top.dtype)
    total = others + torch.exp(picked - top)
    off_token = (-grad / total).unsqueeze(1)
    step = _stats_rows(chunk)
    for start in range(0, chunk.shape[0], step):
        rows = slice(start, start + step)
        part = chunk[rows]
        if exponentiate:
            part.sub_(top[rows].unsqueeze(1)).exp_()
        part.mul_(off_token[rows])
    return chunk.scatter_(1, tokens_rows.unsqueeze(1), (others / total * grad).unsqueeze(1))


def chunk_products(dlogits: torch.Tensor, hidden_rows: torch.Tensor, weight: torch.Tensor, *,
                   grad_hidden_rows: torch.Tensor | None, grad_weight: torch.Tensor | None) -> None:
    """A chunk's share of the gradients w.r.t. hidden and weight: ``grad_hidden_rows = dlogits @ weight``
    and ``grad_weight += dlogits.T @ hidden_rows`` (each where not None)."""
    if grad_hidden_rows is not None:
        torch.mm(dlogits, weight, out=grad_hidden_rows)
    if grad_weight is not None:
        grad_weight.addmm_(dlogits.T, hidden_rows)


class _LMHeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, tokens, rows_per_chunk: int, check_finite: bool, kernel: bool):
        n = hidden.shape[0]
        dtype = _compute_dtype(hidden.dtype)
        top, rest, picked = (torch.empty(n, dtype=dtype, device=hidden.device) for _ in range(3))
        for start in range(0, n, rows_per_chunk):
            rows = slice(start, start + rows_per_chunk)
            chunk, top[rows], rest[rows], picked[rows], _ = chunk_logits_stats(hidden[rows], weight,
                                                                               tokens[rows], kernel=kernel)
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
            dlogits = chunk_gradient(hidden[rows] @ weight.T, tokens[rows], top[rows], others[rows],
                                     grad_out[rows], kernel=ctx.kernel)
            chunk_products(dlogits, hidden[rows], weight, grad_weight=grad_weight,
                           grad_hidden_rows=None if grad_hidden is None else grad_hidden[rows])
            del dlogits
        return grad_hidden, grad_weight, None, None, None, None


def check_lm_head_inputs(hidden, weight, tokens, chunk_rows, backend: str) -> tuple[torch.Tensor, int, bool]:
    """``lm_head_logprobs``'s checks of its arguments (one-line errors naming them; a host
    synchronisation for the token range): returns hidden as ``[N, d]``, the tokens per chunk
    (``lm_head_chunk_rows``'s rule where ``chunk_rows`` is None) and whether the Triton kernels run."""
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
    return flat, chunk_rows, use_triton(hidden.device, hidden.dtype, backend)


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
    flat, chunk_rows, kernel = check_lm_head_inputs(hidden, weight, tokens, chunk_rows, backend)
    logp = _LMHeadLogprobs.apply(flat, weight, tokens.reshape(-1).long(), chunk_rows, check_finite, kernel)
    return logp.reshape(tokens.shape)

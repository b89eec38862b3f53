"""Per-token log-probabilities and entropies from logits without a second ``[N, T, V]`` tensor.

``log_softmax(logits).gather(tokens)`` keeps the full ``[N, T, V]`` log-softmax alive for backward
(and a float32 copy of half-precision logits). Here the forward reduces each row to three numbers
(its maximum, the sum of ``exp(x - max)`` leaving one maximal entry out, and the token's logit) and
saves only the logits (the caller's tensor, not a copy), the tokens and two numbers per token; the
backward rebuilds ``softmax`` from them. On CUDA (with triton installed) Triton kernels do both in
one pass over the logits each (``refimpl.losses.logprobs_triton``); elsewhere the same quantities
are computed eagerly, chunk by chunk over the flattened tokens, the chunk chosen from the device
and a memory bound (``logprobs_chunk_elements``). Autograd therefore stores O(N T) bytes beyond
the logits: 16 bytes per token for ``token_logprobs`` (int64 token, float32 row maximum and
float32 ``sum_{v != y} exp(x_v - max)``; 24 with float64 logits) and 4 for ``token_entropy`` (its
float32 value; the backward recomputes the surprisal). Both keep their relative accuracy on
confident rows: no ``x_y - logsumexp(x)`` cancellation (see ``_surprisal``).
(spec: policy_losses.md, "log-probabilities"; kl.md section 6; the usual ``log_softmax`` + ``gather``.)"""

from __future__ import annotations

import functools

import torch

__all__ = ["token_logprobs", "token_entropy"]

#: Elements of a ``[rows, V]`` working chunk of the eager path that each device type aims at: on a
#: CPU few enough that the chunk's temporaries stay in a core's caches between the ~10 elementwise
#: passes (benchmarks/logprobs.py --sweep), on an accelerator enough to amortise the fixed cost of
#: each pass's kernel launch (H100, 4096 x 32k float32: 2**24 elements within 15 % of unchunked).
DEVICE_CHUNK_ELEMENTS = {"cpu": 1 << 16, "cuda": 1 << 24}
#: The same for device types without an entry (other accelerators).
ACCELERATOR_CHUNK_ELEMENTS = 1 << 24
#: ``[rows, V]`` compute-dtype tensors the eager chunk holds at once at its peak (the gaps, their
#: exponentials, the scatter's copy and the chunk's upcast or the backward's part; measured in
#: tests/test_logprobs_chunks.py).
EAGER_TEMPORARIES = 4
#: The default memory bound of the chunk's temporaries: this fraction of one ``[rows, V]``
#: compute-dtype tensor, the log-softmax that ``log_softmax().gather()`` keeps for backward (its
#: peak beyond the logits and their gradient holds at least two such tensors).
MEMORY_FRACTION = 0.25


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def memory_budget(rows: int, vocab: int, dtype: torch.dtype, budget_bytes: int | None) -> tuple[int, int]:
    """``(budget_bytes, s)``: the bytes a chunk's temporaries may take (default ``MEMORY_FRACTION``
    of one ``[rows, vocab]`` tensor of the compute dtype) and that dtype's size ``s``; checked."""
    for name, value in (("rows", rows), ("vocab", vocab)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    size = _compute_dtype(dtype).itemsize
    if budget_bytes is None:
        return int(MEMORY_FRACTION * rows * vocab * size), size
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise ValueError(f"budget_bytes must be a non-negative int, got {budget_bytes!r}")
    return budget_bytes, size


def logprobs_chunk_elements(device: torch.device | str, rows: int, vocab: int, dtype: torch.dtype, *,
                            budget_bytes: int | None = None) -> int:
    """Elements of the eager path's ``[rows', V]`` working chunks for ``rows`` rows of ``vocab``
    logits of ``dtype`` on ``device``: the rule ``token_logprobs`` and ``token_entropy`` follow when
    ``chunk_elements`` is None.

    ``min(DEVICE_CHUNK_ELEMENTS[device type], budget_bytes / (EAGER_TEMPORARIES * s))``, and at
    least ``vocab`` (one row), where ``s`` is the compute dtype's size (float32, or float64 for
    float64 logits) and ``budget_bytes`` defaults to ``MEMORY_FRACTION * rows * vocab * s``: the
    chunk is as large as the device needs for speed and no larger than the memory bound allows, so
    the eager path's peak beyond the logits and their gradient is at most ``budget_bytes`` plus
    O(rows) (at most a quarter of what ``log_softmax().gather()`` keeps, by default), unless one
    row alone exceeds it."""
    budget_bytes, size = memory_budget(rows, vocab, dtype, budget_bytes)
    target = DEVICE_CHUNK_ELEMENTS.get(torch.device(device).type, ACCELERATOR_CHUNK_ELEMENTS)
    return max(vocab, 1, min(target, budget_bytes // (EAGER_TEMPORARIES * size)))


def _rows_per_chunk(vocab: int, chunk_elements: int) -> int:
    """Rows of a ``[rows, vocab]`` working chunk: the most rows whose chunk holds at most
    ``chunk_elements`` elements, and at least one row."""
    if isinstance(chunk_elements, bool) or not isinstance(chunk_elements, int) or chunk_elements < 1:
        raise ValueError(f"chunk_elements must be a positive int, got {chunk_elements!r}")
    return max(1, chunk_elements // max(vocab, 1))


def _chunk_rows(logits: torch.Tensor, chunk_elements: int | None) -> int:
    """``_rows_per_chunk`` of ``chunk_elements``, or of ``logprobs_chunk_elements``'s rule when None."""
    vocab = logits.shape[-1]
    if chunk_elements is None:
        chunk_elements = logprobs_chunk_elements(logits.device, logits.numel() // max(vocab, 1), vocab,
                                                 logits.dtype)
    return _rows_per_chunk(vocab, chunk_elements)


@functools.cache
def _triton_kernels():
    """``refimpl.losses.logprobs_triton``, or None where triton is not installed."""
    try:
        from refimpl.losses import logprobs_triton
    except ImportError:
        return None
    return logprobs_triton


BACKENDS = ("auto", "eager", "triton")


def use_triton(device: torch.device, dtype: torch.dtype, backend: str) -> bool:
    """Whether ``token_logprobs`` runs the Triton kernels on logits of ``dtype`` on ``device``:
    ``"triton"`` always (compiled on CUDA, in Triton's interpreter on CPU tensors: slow, for tests),
    ``"auto"`` on CUDA for float16 / bfloat16 / float32 logits when triton is installed (and not in
    interpreter mode), ``"eager"`` never."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "eager":
        return False
    kernels = _triton_kernels()
    if backend == "triton":
        if kernels is None:
            raise ValueError("backend='triton' needs the triton package")
        if dtype not in kernels.DTYPES:
            raise ValueError(f"backend='triton' reads {kernels.DTYPES} logits, got {dtype}")
        if device.type != "cuda" and not kernels.INTERPRETED:
            raise ValueError(f"backend='triton' runs on CUDA tensors, or on {device.type} tensors "
                             "in Triton's interpreter (TRITON_INTERPRET=1 before triton is imported)")
        return True
    return (kernels is not None and not kernels.INTERPRETED and device.type == "cuda"
            and dtype in kernels.DTYPES)


def check_tokens(tokens, reference: torch.Tensor, name: str, last: str, vocab: int) -> None:
    """``tokens`` must be integer ids in ``[0, vocab)`` of the shape of ``reference`` (called ``name``)
    without its last dimension (called ``last``), on its device; a host synchronisation."""
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise TypeError("tokens must be an integer torch.Tensor")
    if tokens.shape != reference.shape[:-1]:
        raise ValueError(f"tokens must have shape {tuple(reference.shape[:-1])} ({name} without {last}), "
                         f"got {tuple(tokens.shape)}")
    if tokens.device != reference.device:
        raise ValueError(f"tokens must be on the device of {name} ({reference.device}), got {tokens.device}")
    if tokens.numel() and bool(((tokens < 0) | (tokens >= vocab)).any()):
        raise ValueError(f"tokens must lie in [0, V={vocab})")


def _check_logits(logits) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError("logits must be a floating-point torch.Tensor")
    if logits.ndim < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be [..., V] with V >= 1, got shape {tuple(logits.shape)}")


def _shifted_sums(chunk: torch.Tensor):
    """Per row of ``chunk [rows, V]``: the maximum ``m`` and its index, ``gap = m - x >= 0`` (+inf at
    -inf logits), ``scaled = exp(-gap)`` and ``rest``, the sum of ``scaled`` leaving one maximal entry's
    1 out (so ``sum_v exp(x_v - m) = 1 + rest``); the shared core of ``_row_stats`` and
    ``_surprisal``."""
    top, where = chunk.max(dim=-1, keepdim=True)
    gap = top - chunk
    scaled = torch.exp(-gap)
    rest = scaled.scatter(-1, where, 0.0).sum(dim=-1, keepdim=True)
    return top, where, gap, scaled, rest


def _row_stats(chunk: torch.Tensor, tokens: torch.Tensor):
    """``(m, rest, x_y)`` of each row of ``chunk [rows, V]`` with chosen ``tokens [rows, 1]``, each
    ``[rows]``: the maximum, ``rest = sum_v exp(x_v - m) - 1`` summed without the 1
    (``_shifted_sums``) and the token's logit; what ``logprobs_triton.row_stats`` computes too."""
    top, _, _, _, rest = _shifted_sums(chunk)
    return top.squeeze(1), rest.squeeze(1), chunk.gather(1, tokens).squeeze(1)


def _logprob_parts(top: torch.Tensor, rest: torch.Tensor, picked: torch.Tensor):
    """``log p_y`` and ``others = sum_{v != y} exp(x_v - m)`` from a row's maximum ``m``, ``rest``
    and ``picked = x_y`` (``_row_stats``), all without cancellation (spec: kl.md eq. (14'), (15')).

    ``-log p_y = log1p(rest) + (m - x_y)``, two non-negative terms; ``others`` is ``rest`` when y is
    a maximal entry (``x_y = m``: its 1 is the one left out), else ``1 + (rest - exp(x_y - m))``
    (at least ``max(1, rest)``: no digit lost), so ``1 - p_y = others / (others + exp(x_y - m))``
    keeps its relative accuracy however close p_y is to 1. Rows with no distribution (``m`` NaN,
    +inf or -inf) get ``x_y - m``: NaN, or -inf for a finite or -inf token beside a +inf logit, as
    ``x_y - logsumexp``."""
    gap = top - picked
    logp = -(torch.log1p(rest) + gap)
    logp = torch.where(torch.isfinite(top), logp, picked - top)
    # y not maximal: rest holds y's term and others = 1 + (rest - exp(-gap)) >= max(1, rest)
    # (exp(-gap) <= 1), so the subtraction's error, a few u rest, stays relative
    others = torch.where(picked == top, rest, 1.0 + (rest - torch.exp(-gap)))
    return logp, others


def logprob_stats(flat: torch.Tensor, tokens: torch.Tensor, *, rows_per_chunk: int, kernel: bool):
    """``(m, rest, x_y)`` (``_row_stats``) of every row of ``flat [rows, V]`` with ``tokens [rows]``
    (int64), ``[rows]`` each in the compute dtype: by the Triton kernel (one read of the logits) or
    eagerly ``rows_per_chunk`` rows at a time. Shared by ``token_logprobs`` and
    ``refimpl.losses.lm_head``."""
    if kernel:
        return _triton_kernels().row_stats(_unit_stride(flat), tokens.contiguous())
    dtype = _compute_dtype(flat.dtype)
    top, rest, picked = (torch.empty(flat.shape[0], dtype=dtype, device=flat.device) for _ in range(3))
    for start in range(0, flat.shape[0], rows_per_chunk):
        rows = slice(start, start + rows_per_chunk)
        top[rows], rest[rows], picked[rows] = _row_stats(flat[rows].to(dtype), tokens[rows].unsqueeze(1))
    return top, rest, picked


def logprob_grad(flat: torch.Tensor, tokens: torch.Tensor, top: torch.Tensor, others: torch.Tensor,
                 grad: torch.Tensor, *, rows_per_chunk: int, kernel: bool,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """``grad * d log p_y / d flat = grad * ([v = y] - p_v)`` in ``flat``'s dtype (kl.md eq. (15')),
    from the row maxima ``top`` and ``others = sum_{v != y} exp(x_v - m)`` (``_logprob_parts``):
    ``-p_v = -exp(x_v - m) / total`` off the token and ``1 - p_y = others / total`` on it, with
    ``total = others + exp(x_y - m) >= 1``. By the Triton kernel (one read, one write) or eagerly
    ``rows_per_chunk`` rows at a time; written into ``out`` (default a new tensor), which may be
    ``flat`` itself (each chunk is read before it is written)."""
    grad = grad.to(top.dtype)
    if kernel:
        flat = _unit_stride(flat)
        picked = flat.gather(1, tokens.unsqueeze(1)).squeeze(1).to(top.dtype)
        total = others + torch.exp(picked - top)
        return _triton_kernels().logprob_grad(flat, tokens.contiguous(), top, grad / total,
                                              others / total * grad, out=out)
    out = torch.empty_like(flat) if out is None else out
    for start in range(0, flat.shape[0], rows_per_chunk):
        rows = slice(start, start + rows_per_chunk)
        y = tokens[rows].unsqueeze(1)
        g = grad[rows].unsqueeze(1)
        rest_y = others[rows].unsqueeze(1)
        scaled = torch.exp(flat[rows].to(top.dtype) - top[rows].unsqueeze(1))
        total = rest_y + scaled.gather(1, y)  # sum_v exp(x_v - m) >= 1
        # d/dx_v log p_y = [v = y] - p_v: -p_v off the token, 1 - p_y = others / total on it
        part = -(scaled / total) * g
        part.scatter_(1, y, rest_y / total * g)
        out[rows] = part.to(flat.dtype)
    return out


def check_distributions(top: torch.Tensor, check_finite: bool) -> None:
    """The maximum of a row is NaN (a NaN logit), +inf (a +inf logit, on any token) or -inf (every
    logit -inf) exactly when the row has no probability distribution: raise then (a host
    synchronisation), when ``check_finite``."""
    if check_finite and top.numel() and not bool(torch.isfinite(top).all()):
        raise ValueError("logits contains NaN or +inf (or a row that is all -inf)")


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, tokens: torch.Tensor, rows_per_chunk: int, check_finite: bool,
                kernel: bool):
        flat = logits.reshape(-1, logits.shape[-1])
        top, rest, picked = logprob_stats(flat, tokens.reshape(-1), rows_per_chunk=rows_per_chunk,
                                          kernel=kernel)
        logp, others = _logprob_parts(top, rest, picked)
        check_distributions(top, check_finite)
        ctx.save_for_backward(logits, tokens, top, others)
        ctx.rows_per_chunk = rows_per_chunk
        ctx.kernel = kernel
        return logp.reshape(tokens.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, tokens, top, others = ctx.saved_tensors
        grad_logits = logprob_grad(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1), top, others,
                                   grad_out.reshape(-1), rows_per_chunk=ctx.rows_per_chunk,
                                   kernel=ctx.kernel)
        return grad_logits.reshape(logits.shape), None, None, None, None


def _unit_stride(flat: torch.Tensor) -> torch.Tensor:
    """``flat`` itself when its columns are adjacent (what the kernels read), else a copy."""
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, *, chunk_elements: int | None = None,
                   check_finite: bool = True, backend: str = "auto") -> torch.Tensor:
    """``log softmax(logits)[..., tokens]`` per token, memory-lean for backward.

    spec: kl.md eq. (14)-(15); policy_losses.md "log-probabilities"; the usual ``log_softmax`` + ``gather``
    (before its masking and summation). Equals ``torch.log_softmax(logits, -1).gather(-1,
    tokens[..., None])[..., 0]`` computed in ``promote_types(logits.dtype, float32)``, but to a few
    units of relative rounding where that formula keeps only ``u max|x|`` absolute accuracy:
    ``-log p_y = log1p(rest) + (max x - x_y)`` (at logits (40, 0) it gives -4.25e-18, not 0). The
    gradient w.r.t. logits, ``(onehot(token) - softmax(logits)) * grad`` in the dtype of logits, is
    relative-accurate too: the token's ``1 - p_y`` is formed as ``sum_{v != y} exp(x_v - m) / sum_v
    exp(x_v - m)``, never as ``1 - p_y``. Autograd saves the logits, the tokens and two
    compute-dtype numbers per token (the row maximum ``m`` and that sum over ``v != y``).

    On CUDA with triton installed (``backend="auto"``), float16 / bfloat16 / float32 logits go
    through Triton kernels (``refimpl.losses.logprobs_triton``) that read the logits once forward
    and once backward (writing the gradient once) and hold no ``[rows, V]`` temporaries; elsewhere
    the same quantities are computed eagerly, ``chunk_elements`` entries at a time.

    Args:
        logits: ``[..., V]`` (typically ``[N, T, V]``), any float dtype; ``-inf`` entries allowed
            (zero-probability tokens).
        tokens: ``[...]`` integer token ids in ``[0, V)``, the shape of ``logits`` without V.
        chunk_elements: elements of the eager path's ``[rows, V]`` working chunks (default
            ``logprobs_chunk_elements``'s rule, from the device and a memory bound).
        check_finite: raise ValueError if a row of logits has a NaN or ``+inf`` (detected on the
            per-token logsumexp, so it costs O(N T)); a host synchronisation.
        backend: ``"auto"``, ``"eager"`` or ``"triton"`` (the kernels on any device: compiled on
            CUDA, in Triton's interpreter on CPU tensors, slow, for tests).
    Returns:
        ``[...]`` log-probabilities (``-inf`` where the token's logit is ``-inf``).
    """
    _check_logits(logits)
    check_tokens(tokens, logits, "logits", "V", logits.shape[-1])
    rows_per_chunk = _chunk_rows(logits, chunk_elements)
    return _TokenLogprobs.apply(logits, tokens.long(), rows_per_chunk, check_finite,
                                use_triton(logits.device, logits.dtype, backend))


def _surprisal(chunk: torch.Tensor) -> torch.Tensor:
    """``-log softmax(x)`` of each row of ``chunk [rows, V]`` without cancellation: with ``m = max x``,
    ``S = sum_v exp(x_v - m) = 1 + rest`` (one maximal entry's 1 left out of ``rest``),
    ``-log p_v = log1p(rest) + (m - x_v)``, a sum of two non-negative terms.
    ``x_v - logsumexp(x)`` instead loses every digit of ``log p`` of a confident token below
    ``u |m|`` (at ``x = (40, 0)`` it returns 0 for -4e-18), and with it the entropy of a confident
    row (2 % wrong at (40, 0)). Rows with a NaN, a +inf or only -inf give NaN, as logsumexp did."""
    _, _, gap, _, rest = _shifted_sums(chunk)
    return torch.log1p(rest) + gap


class _TokenEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, rows_per_chunk: int):
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)
        dtype = _compute_dtype(logits.dtype)
        entropy = torch.empty(flat.shape[0], dtype=dtype, device=logits.device)
        for start in range(0, flat.shape[0], rows_per_chunk):
            surprisal = _surprisal(flat[start:start + rows_per_chunk].to(dtype))
            p = torch.exp(-surprisal)
            # 0 log 0 = 0 for -inf logits (tested as p == 0 so that a NaN row stays NaN)
            terms = torch.where(p == 0, torch.zeros_like(p), p * surprisal)
            entropy[start:start + rows_per_chunk] = terms.sum(dim=-1)
        ctx.save_for_backward(logits, entropy)
        ctx.rows_per_chunk = rows_per_chunk
        return entropy.reshape(logits.shape[:-1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, entropy = ctx.saved_tensors
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)
        grad = grad_out.reshape(-1).to(entropy.dtype)
        grad_logits = torch.empty_like(flat)
        step = ctx.rows_per_chunk
        for start in range(0, flat.shape[0], step):
            surprisal = _surprisal(flat[start:start + step].to(entropy.dtype))
            p = torch.exp(-surprisal)
            # dH/dx_v = -p_v (log p_v + H) = p_v (s_v - H): H and s_v both keep their relative accuracy
            inner = entropy[start:start + step].unsqueeze(1) - surprisal
            inner = torch.where(p == 0, torch.zeros_like(p), inner)
            part = -p * inner * grad[start:start + step].unsqueeze(1)
            grad_logits[start:start + step] = part.to(logits.dtype)
        return grad_logits.reshape(logits.shape), None


def token_entropy(logits: torch.Tensor, *, chunk_elements: int | None = None,
                  check_finite: bool = True) -> torch.Tensor:
    """Entropy ``H = -sum_v p_v log p_v`` of ``softmax(logits)`` over the last dim, memory-lean.

    spec: policy_losses.md "entropy bonus"; Schulman et al. 2017, eq. (9). ``-inf`` logits are
    zero-probability entries (``0 log 0 = 0``). Gradient ``dH/dx_v = -p_v (log p_v + H)``.
    Shapes: logits ``[..., V]``; returns ``[...]`` in ``promote_types(logits.dtype, float32)``.
    Autograd saves the logits plus 4 bytes per row (the float32 entropy). The surprisal
    ``-log p_v`` is computed without cancellation (``_surprisal``): H and its gradient keep
    their relative accuracy on confident rows.
    """
    _check_logits(logits)
    out = _TokenEntropy.apply(logits, _chunk_rows(logits, chunk_elements))
    if check_finite and out.numel() and not bool(torch.isfinite(out).all()):
        raise ValueError("logits contains NaN or +inf (or a row that is all -inf)")
    return out

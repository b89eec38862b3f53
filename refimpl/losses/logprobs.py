"""Per-token log-probabilities and entropies from logits without a second ``[N, T, V]`` tensor.

``log_softmax(logits).gather(tokens)`` keeps the full ``[N, T, V]`` log-softmax alive for backward
(and a float32 copy of half-precision logits). Here the forward works chunk by chunk over the
flattened tokens and saves only the logits (the caller's tensor, not a copy), the tokens and a
few numbers per token; the backward rebuilds ``softmax`` chunk by chunk. Autograd therefore stores
O(N T) bytes beyond the logits: 16 bytes per token for ``token_logprobs`` (int64 token, float32 row
maximum and float32 ``sum_{v != y} exp(x_v - max)``; 24 with float64 logits) and 4 for
``token_entropy`` (its float32 value; the backward recomputes the surprisal). Both keep their
relative accuracy on confident rows: no ``x_y - logsumexp(x)`` cancellation (see ``_surprisal``).
(spec: policy_losses.md, "log-probabilities"; kl.md section 6; the usual ``log_softmax`` + ``gather``.)"""

from __future__ import annotations

import torch

__all__ = ["token_logprobs", "token_entropy"]

#: Elements of [rows, V] processed per chunk (bounds the float32 temporaries to ~16 MiB each).
DEFAULT_CHUNK_ELEMENTS = 1 << 22


def _rows_per_chunk(vocab: int, chunk_elements: int | None) -> int:
    """Rows of a ``[rows, vocab]`` working chunk: the most rows whose chunk holds at most
    ``chunk_elements`` elements (default DEFAULT_CHUNK_ELEMENTS), and at least one row."""
    elements = DEFAULT_CHUNK_ELEMENTS if chunk_elements is None else chunk_elements
    if isinstance(elements, bool) or not isinstance(elements, int) or elements < 1:
        raise ValueError(f"chunk_elements must be a positive int, got {chunk_elements!r}")
    return max(1, elements // max(vocab, 1))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _check_logits(logits) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError("logits must be a floating-point torch.Tensor")
    if logits.ndim < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be [..., V] with V >= 1, got shape {tuple(logits.shape)}")


def _shifted_sums(chunk: torch.Tensor):
    """Per row of ``chunk [rows, V]``: the maximum ``m`` and its index, ``gap = m - x >= 0`` (+inf at
    -inf logits), ``scaled = exp(-gap)`` and ``rest``, the sum of ``scaled`` leaving one maximal entry's
    1 out (so ``sum_v exp(x_v - m) = 1 + rest``); the shared core of ``_logprob_parts`` and
    ``_surprisal``."""
    top, where = chunk.max(dim=-1, keepdim=True)
    gap = top - chunk
    scaled = torch.exp(-gap)
    rest = scaled.scatter(-1, where, 0.0).sum(dim=-1, keepdim=True)
    return top, where, gap, scaled, rest


def _logprob_parts(chunk: torch.Tensor, tokens: torch.Tensor):
    """Per row of ``chunk [rows, V]`` with chosen ``tokens [rows, 1]``: ``log p_y``, the maximum ``m``
    and ``others = sum_{v != y} exp(x_v - m)``, all without cancellation (spec: kl.md eq. (14)).

    ``-log p_y = log1p(rest) + (m - x_y)`` as in ``_surprisal`` (``rest`` leaves one maximal entry's 1
    out), two non-negative terms; ``others`` is ``rest`` when y is that maximal entry, else
    ``1 + (rest - exp(x_y - m))`` (at least ``max(1, rest)``: no digit lost), so
    ``1 - p_y = others / (others + exp(x_y - m))`` keeps its relative accuracy however close p_y is
    to 1. Rows with no distribution (``m`` NaN, +inf or -inf) get
    ``x_y - m``: NaN, or -inf for a finite or -inf token beside a +inf logit, as ``x_y - logsumexp``."""
    top, where, gap, scaled, rest = _shifted_sums(chunk)
    scaled_y = scaled.gather(1, tokens)  # <= 1
    logp = -(torch.log1p(rest) + gap.gather(1, tokens))
    logp = torch.where(torch.isfinite(top), logp, chunk.gather(1, tokens) - top)
    # y maximal: others = rest. Otherwise rest holds y's term and others = 1 + (rest - scaled_y):
    # that is >= max(1, rest) (scaled_y <= 1), so the subtraction's error, a few u rest, stays relative
    others = torch.where(where == tokens, rest, 1.0 + (rest - scaled_y))
    return logp.squeeze(1), top.squeeze(1), others.squeeze(1)


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, tokens: torch.Tensor, rows_per_chunk: int, check_finite: bool):
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)
        flat_tokens = tokens.reshape(-1)
        dtype = _compute_dtype(logits.dtype)
        logp = torch.empty(flat.shape[0], dtype=dtype, device=logits.device)
        top = torch.empty(flat.shape[0], dtype=dtype, device=logits.device)
        others = torch.empty(flat.shape[0], dtype=dtype, device=logits.device)
        for start in range(0, flat.shape[0], rows_per_chunk):
            rows = slice(start, start + rows_per_chunk)
            logp[rows], top[rows], others[rows] = _logprob_parts(
                flat[rows].to(dtype), flat_tokens[rows].unsqueeze(1))
        # the maximum of a row is NaN (a NaN logit), +inf (a +inf logit, on any token) or -inf
        # (every logit -inf) exactly when the row has no probability distribution
        if check_finite and top.numel() and not bool(torch.isfinite(top).all()):
            raise ValueError("logits contains NaN or +inf (or a row that is all -inf)")
        ctx.save_for_backward(logits, tokens, top, others)
        ctx.rows_per_chunk = rows_per_chunk
        return logp.reshape(tokens.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, tokens, top, others = ctx.saved_tensors
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)
        flat_tokens = tokens.reshape(-1)
        grad = grad_out.reshape(-1).to(top.dtype)
        grad_logits = torch.empty_like(flat)
        step = ctx.rows_per_chunk
        for start in range(0, flat.shape[0], step):
            rows = slice(start, start + step)
            y = flat_tokens[rows].unsqueeze(1)
            g = grad[rows].unsqueeze(1)
            rest_y = others[rows].unsqueeze(1)
            scaled = torch.exp(flat[rows].to(top.dtype) - top[rows].unsqueeze(1))
            total = rest_y + scaled.gather(1, y)  # sum_v exp(x_v - m) >= 1
            # d/dx_v log p_y = [v = y] - p_v: -p_v off the token, 1 - p_y = others / total on it
            part = -(scaled / total) * g
            part.scatter_(1, y, rest_y / total * g)
            grad_logits[rows] = part.to(logits.dtype)
        return grad_logits.reshape(logits.shape), None, None, None


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, *, chunk_elements: int | None = None,
                   check_finite: bool = True) -> torch.Tensor:
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

    Args:
        logits: ``[..., V]`` (typically ``[N, T, V]``), any float dtype; ``-inf`` entries allowed
            (zero-probability tokens).
        tokens: ``[...]`` integer token ids in ``[0, V)``, the shape of ``logits`` without V.
        chunk_elements: elements of the ``[rows, V]`` working chunks (default 2**22).
        check_finite: raise ValueError if a row of logits has a NaN or ``+inf`` (detected on the
            per-token logsumexp, so it costs O(N T)); a host synchronisation.
    Returns:
        ``[...]`` log-probabilities (``-inf`` where the token's logit is ``-inf``).
    """
    _check_logits(logits)
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise TypeError("tokens must be an integer torch.Tensor")
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(f"tokens must have shape {tuple(logits.shape[:-1])} (logits without V), "
                         f"got {tuple(tokens.shape)}")
    if tokens.device != logits.device:
        raise ValueError(f"tokens must be on the device of logits ({logits.device}), got {tokens.device}")
    vocab = logits.shape[-1]
    if tokens.numel() and bool(((tokens < 0) | (tokens >= vocab)).any()):
        raise ValueError(f"tokens must lie in [0, V={vocab})")
    return _TokenLogprobs.apply(logits, tokens.long(), _rows_per_chunk(vocab, chunk_elements), check_finite)


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
    out = _TokenEntropy.apply(logits, _rows_per_chunk(logits.shape[-1], chunk_elements))
    if check_finite and out.numel() and not bool(torch.isfinite(out).all()):
        raise ValueError("logits contains NaN or +inf (or a row that is all -inf)")
    return out

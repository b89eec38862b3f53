"""Triton kernels of ``token_logprobs``: the row statistics of kl.md eq. (14') in one read of the
logits, and eq. (15') written in one read and one write.

One program per row of ``logits [rows, V]``. The forward streams the row in blocks and keeps, per
lane of the block, a running maximum ``m_l`` and ``rest_l``, the sum of ``exp(x - m_l)`` over the
lane's entries leaving one maximal entry out (when an entry ``x > m_l`` arrives:
``rest_l <- (rest_l + 1) exp(m_l - x)``, the old maximum's 1 joining the sum; otherwise
``rest_l <- rest_l + exp(x - m_l)``): every update adds non-negative terms, so no digit cancels, and
the loop needs no reduction. At the end the lanes merge the same way (one maximal lane's 1 left
out), giving the row's ``m``, ``rest`` (``sum_v exp(x_v - m) = 1 + rest``) and ``x_y``: the
quantities ``refimpl.losses.logprobs`` computes eagerly, from which it finishes (14') and (15') on
``[rows]`` vectors. NaN logits are set aside (a NaN row reports a NaN maximum, as ``torch.max``),
so the compiled kernel (whose ``max`` ignores NaN) and the interpreter (whose ``max`` propagates
it) agree. The backward writes ``-exp(x_v - m) * coef`` off the token and ``on_token`` on it.

Compiled for CUDA tensors; with ``TRITON_INTERPRET=1`` set before triton is imported, the same
kernels run on CPU tensors in Triton's interpreter (numpy, one program at a time: slow, for
tests). The row length ``V`` is a compile-time constant (one compilation per vocabulary size; the
interpreter of triton 3.6 with numpy >= 2.4 also cannot loop to a run-time bound, triton issue
9171). Importing this module needs ``triton``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["row_stats", "logprob_grad", "launch_config", "INTERPRETED", "DTYPES"]

#: logits dtypes the kernels read (their arithmetic is float32); float64 stays on the eager path
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _row_stats_kernel(logits_ptr, stride, tokens_ptr, top_ptr, rest_ptr, picked_ptr,
                      n_cols: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    rest = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + lanes
        x = tl.load(base + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        is_nan = x != x
        x = tl.where(is_nan, float("-inf"), x)  # out of the maxima; the lane's sum turns NaN instead
        grows = x > m
        d = tl.where(grows, m - x, x - m)  # <= 0; NaN where x and m are the same infinity
        e = tl.where(d == d, tl.exp(d), 0.0)
        e = tl.where(is_nan, float("nan"), e)
        rest = tl.where(grows, (rest + 1.0) * e, rest + e)
        m = tl.maximum(m, x)
    # a lane's sum is NaN exactly when it met a NaN logit (every other case adds finite terms)
    has_nan = tl.max((rest != rest).to(tl.int32), 0)
    top = tl.max(m, 0)
    top_lane = m == top
    scale = tl.exp(m - top)  # 1 on the top lanes; NaN there only in rows with no distribution
    below = tl.where(top_lane, 0.0, scale)  # the maxima of the other lanes join the sum
    count = tl.sum(top_lane.to(tl.float32), 0)
    row_rest = tl.sum(rest * scale, 0) + tl.sum(below, 0) + (count - 1.0)
    top = tl.where(has_nan > 0, float("nan"), top)
    y = tl.load(tokens_ptr + row)
    tl.store(top_ptr + row, top)
    tl.store(rest_ptr + row, row_rest)
    tl.store(picked_ptr + row, tl.load(base + y).to(tl.float32))


@triton.jit
def _grad_kernel(logits_ptr, stride, tokens_ptr, top_ptr, coef_ptr, on_token_ptr, grad_ptr, grad_stride,
                 n_cols: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    out = grad_ptr + row * grad_stride
    lanes = tl.arange(0, BLOCK)
    y = tl.load(tokens_ptr + row)
    top = tl.load(top_ptr + row)
    coef = tl.load(coef_ptr + row)
    on_token = tl.load(on_token_ptr + row)
    for start in range(0, n_cols, BLOCK):
        cols = start + lanes
        inside = cols < n_cols
        x = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32)
        part = tl.where(cols == y, on_token, -(tl.exp(x - top) * coef))
        tl.store(out + cols, part.to(grad_ptr.dtype.element_ty), mask=inside)


#: Whether triton was imported in interpreter mode (``TRITON_INTERPRET=1``): the kernels then run
#: on CPU tensors (numpy, one program at a time), and only then.
INTERPRETED = not isinstance(_row_stats_kernel, triton.JITFunction)


def launch_config(n_cols: int, element_size: int) -> tuple[int, int]:
    """``(BLOCK, num_warps)``: blocks of 4096 entries (the next power of two of V when smaller) and 8
    warps, 16 entries a thread: the forward keeps two float32 numbers per entry of the block (the
    lanes' maxima and sums; 59 registers a thread in float32, 64 in bfloat16 for sm_90 with
    triton 3.6: four programs of 256 threads an SM) and loads 16 (float32) or 32 bytes a thread per block in
    16-byte vectors when the row stride is a multiple of 16 elements. ``element_size`` is kept
    for a dtype-dependent choice; it does not change the block today."""
    del element_size
    block = min(triton.next_power_of_2(max(n_cols, 1)), 4096)
    return block, 8 if block >= 2048 else 4


def _check(flat: torch.Tensor, tokens: torch.Tensor) -> None:
    if flat.dtype not in DTYPES or flat.ndim != 2 or flat.stride(1) != 1:
        raise ValueError(f"logits must be a [rows, V] {DTYPES} tensor with unit column stride")
    if tokens.dtype != torch.int64 or tokens.shape != flat.shape[:1] or not tokens.is_contiguous():
        raise ValueError("tokens must be a contiguous int64 [rows] tensor")


def row_stats(flat: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(top, rest, picked)`` per row of ``flat [rows, V]`` (float32): the row maximum (NaN if the
    row has a NaN), ``rest = sum_v exp(x_v - top) - 1`` summed without the 1 (one maximal entry
    left out) and ``picked = x_y`` (the token's logit), as ``logprobs._row_stats`` computes them."""
    _check(flat, tokens)
    rows, n_cols = flat.shape
    top, rest, picked = (torch.empty(rows, dtype=torch.float32, device=flat.device) for _ in range(3))
    if rows:
        block, warps = launch_config(n_cols, flat.element_size())
        _row_stats_kernel[(rows,)](flat, flat.stride(0), tokens, top, rest, picked, n_cols, BLOCK=block,
                                   num_warps=warps)
    return top, rest, picked


def logprob_grad(flat: torch.Tensor, tokens: torch.Tensor, top: torch.Tensor, coef: torch.Tensor,
                 on_token: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``out[r, v] = on_token[r]`` at ``v = tokens[r]``, ``-exp(flat[r, v] - top[r]) * coef[r]``
    elsewhere, in ``flat``'s dtype (``coef``, ``on_token``, ``top``: float32 ``[rows]``). ``out``
    may be ``flat`` itself (each entry is read before it is written, by the same program)."""
    _check(flat, tokens)
    out = torch.empty_like(flat) if out is None else out
    if out.shape != flat.shape or out.dtype != flat.dtype or out.stride(1) != 1:
        raise ValueError("out must be a [rows, V] tensor of flat's dtype with unit column stride")
    rows, n_cols = flat.shape
    if rows:
        block, warps = launch_config(n_cols, flat.element_size())
        _grad_kernel[(rows,)](flat, flat.stride(0), tokens, top, coef, on_token, out, out.stride(0), n_cols,
                      BLOCK=block, num_warps=warps)
    return out

"""The eager fast path of ``policy_loss``: value, closed-form gradient and metrics in a few passes per block.

spec: specs/policy_losses.md eqs. (2)-(12), (15), (19) (the loss that ``refimpl.losses.policy`` states
readably; ``policy_loss`` calls ``closed_form_policy_loss`` first and runs its reference body only where
this returns None). No compiler: plain ATen ops chosen for a CPU, where an elementwise op costs about as
much as moving its operands, so the design counts passes over ``[N, T]`` and keeps them in cache:

- blocks of rows (``_BLOCK_ELEMENTS`` elements, a few hundred kB per temporary: a core's L2 cache) run
  every per-token pass in turn, so each pass after the first reads cached data; what leaves a block
  is per-row sums (``[N]``), a few scalars and the gradient's per-token factor. The blocks' temporaries
  (log-ratio, ratio, gate term, series, the mask's float copy) are written into scratch buffers, one
  allocation per call reused from block to block (``_scratch``; fresh tensors per block and temporary
  took 1.05-1.4x the time of GSPO, CISPO and SAPO at 256 x 2048 and 1024 x 4096 with calls back to
  back, ``benchmarks/closed_form_ab.py --alone``).
  Nothing returned or saved for backward is a view of them (tests/test_policy_loss_closed_form.py
  runs two calls in flight and two threads);
- a bool mask is converted block by block (into scratch): no ``[N, T]`` float mask is formed unless a
  KL or entropy term needs one, and a sequence-level ratio's gradient (the mask times a per-row
  factor) is formed in backward from the bool mask, block by block;
- the mask is a 0/1 float tensor that multiplies (``where`` / comparisons into bool tensors cost five
  to twenty times a multiplication on a CPU); padding must then be finite, so any NaN / inf anywhere
  (padding included) hands the batch to the reference, which ignores padding exactly. Masked tokens
  get log-ratio 0 and ratio 1, so a row's sum over all tokens, less one per masked token, is its sum
  over the unmasked ones;
- one ``exp`` gives every ratio; the inclusive hard gate of md eqs. (6)-(7) is a clamp of the ratio
  between per-row (or per-token) bounds, and a token's gate is open exactly where the clamp leaves the
  ratio unchanged (``clamp(r) == r``: a ratio on a bound counts as inside);
- the gradient of md eq. (12) with respect to ``logp`` is written out (each unit's derivative, md eqs.
  (6)-(9), (15), times its aggregation weight, md eqs. (10)-(11), (19), over the denominator) as a
  per-token factor times a per-row factor; ``_ClosedFormLoss.backward`` forms their product with the
  incoming gradient in one pass (first derivatives only, as ``fused_policy_loss``);
- the metric ``approx_kl`` (the mean of k3 = expm1(l) - l, specs/kl.md eq. (4)) without ``expm1``
  (ten times ``exp``'s cost on a CPU) and without cancellation: l^2 times a polynomial in Horner
  form on ``clamp(l, -1/2, 1/2)``, the Taylor series of k3(l) / l^2 with as few terms as the block's
  largest |l| needs (truncation below 3e-9 relative) or, beyond |l| ~ 0.23, the degree-5 polynomial
  of least relative error on [-1/2, 1/2] (2.4e-8 relative: two terms fewer than Taylor's for the
  same bound), plus, in a block with some |l| > 1/2, ``(exp(l) - l) - (exp(c) - c)`` with c the
  clamped value (exactly 0 where |l| <= 1/2; elsewhere a difference of terms within a factor of ~10
  of k3, so within ~10 roundoffs of it);
- per call (what a small batch, e.g. 64 x 512, costs: tens of ATen calls at a few microseconds each,
  and the Python between them), few small ops: the per-row values that the loss and the metrics sum
  (the rows' terms, ratios and gates, the advantages) are read with ``tolist`` and summed in double
  precision; the per-row gradient factor takes A, its aggregation weight and 1 / D in one op; the
  blocks' scalars are read together; the loss stays a float until ``_ClosedFormLoss.forward`` makes
  it a tensor;
- the guards: any non-finite input sum, ratio sum or loss, a mask that is not 0/1, a normaliser or
  L_max that the reference refuses, or a part this path does not implement (GMPO's log-clip, the
  behaviour correction, GSPO-token with per-token advantages, an accelerator, where the reference
  never synchronises) returns None, and the reference then gives its exact value or its error.

Rounding: the same formulas in another order, within a few units of the compute dtype's roundoff u of
the reference on the scale of each result (tests/test_policy_loss_closed_form.py). SAPO's token-level
gate argument ``tau (r - 1)`` is ``tau r - tau`` from the rounded ratio in one ``addcmul`` (the
reference's ``tau expm1(l)``: an absolute error of about 2 u tau in the argument, a quarter of that in
the sigmoid). float64 runs the reference's own k3 for ``approx_kl``.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import NamedTuple

import torch

from refimpl.kl import _exp_minus_one_minus_identity, kl_k1, kl_k2, kl_k3

__all__ = ["closed_form_policy_loss"]

_KL_FUNCTIONS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
_PER_SEQUENCE_MEAN = ("seq_mean_token_mean", "seq_sqrt_token_mean")
_PER_TOKEN_COPIES = ("token_mean", "seq_sum", "seq_mean_token_sum")
# elements per block of rows: a float32 temporary of 256 kB; measured on the development machine's
# 2 MB L2 (2**15 to 2**17 within the noise, 2**19 and the whole batch 1.5-2x slower at 2**22)
_BLOCK_ELEMENTS = 1 << 16
_SERIES_BOUND = 0.5  # |l| up to which approx_kl's k3 is its Taylor series (module docstring)
_ZERO = {dtype: torch.zeros((), dtype=dtype, device="cpu")  # (never written)
         for dtype in (torch.float32, torch.float64)}
_COMPUTE_DTYPES = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float32,
                   torch.float64: torch.float64}  # promote_types(dtype, float32), looked up
_LOG_MAX = {dtype: math.log(torch.finfo(dtype).max) for dtype in (torch.float32, torch.float64)}


# a block's temporaries: log-ratio, ratio, gate term (then the series), mask, SAPO's sigmoid
_SCRATCH_SLOTS = 5


def _scratch(elements: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """``_SCRATCH_SLOTS`` flat CPU buffers of ``elements`` each, one allocation for a call's blocks
    (fresh memory per block and temporary can fault its pages block after block; buffers kept from
    call to call per thread measured slower, 4.22 against 3.85 ms for GSPO at 256 x 2048 with the
    frameworks' steps between the calls). Nothing in them outlives the call: no result, saved tensor
    or metric is a view of them."""
    flat = torch.empty(_SCRATCH_SLOTS * elements, dtype=dtype, device="cpu")
    return [flat[i * elements:(i + 1) * elements] for i in range(_SCRATCH_SLOTS)]


def _rows_per_block(t: int) -> int:
    """Rows of ``t`` tokens in a block of ``_BLOCK_ELEMENTS`` (at least one)."""
    return max(1, _BLOCK_ELEMENTS // max(t, 1))


def _block_views(buffers: list[torch.Tensor], rows: int, t: int) -> list[torch.Tensor]:
    """The first ``rows * t`` elements of each buffer as a ``[rows, t]`` tensor."""
    return [b[:rows * t].view(rows, t) for b in buffers]


class _Factor(NamedTuple):
    """A gradient ``per_token * per_row[:, None]`` (``per_row`` a float: times it; None: ``per_token``
    alone; ``per_token`` a bool mask: its 0 / 1), formed in the backward pass together with the incoming
    gradient."""

    per_token: torch.Tensor
    per_row: torch.Tensor | float | None


def _float_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """A non-bool mask as 0.0 / 1.0 in ``dtype``, or None when it holds another value (the reference
    raises)."""
    if not bool(((mask == 0) | (mask == 1)).all()):
        return None
    return mask.to(dtype)


def _denominator(normalizer: object, local: float, dtype: torch.dtype) -> float | None:
    """``policy._resolve_normalizer`` as a float, the given normaliser rounded to ``dtype`` as the
    reference rounds it; None where the reference raises."""
    if normalizer is None:
        return max(local, 1.0)
    if isinstance(normalizer, torch.Tensor):
        if normalizer.numel() != 1:
            return None
        value = float(normalizer.detach().reshape(()).to(dtype))
    elif isinstance(normalizer, (int, float)) and not isinstance(normalizer, bool):
        value = float(torch.tensor(float(normalizer), dtype=dtype, device="cpu"))
    else:
        return None
    return value if math.isfinite(value) and value > 0 else None


def _local_normalizer(tokens: float, sequences: float, longest: float, variant) -> float | None:
    """The local denominator of md eq. (11) (``policy._normalizer_from_lengths``); None where the
    reference raises (no L_max or G, a sequence longer than L_max)."""
    if variant.aggregation == "token_mean":
        return tokens
    if variant.aggregation == "seq_sum" and (variant.max_length is None or longest > variant.max_length):
        return None
    if variant.aggregation == "seq_sqrt_token_mean" and variant.group_size is None:
        return None
    return sequences * variant.max_length if variant.aggregation == "seq_sum" else sequences


def _supported(variant, advantages: torch.Tensor, optional: dict, normalizer: object) -> bool:
    if variant.gate == "log_clip" or variant.behavior_correction != "none":
        return False
    if variant.ratio == "gspo_token" and advantages.ndim == 2:
        return False
    # md eq. (19) under token_mean needs the local denominator: the reference raises
    kl_given = optional["ref_logp"] is not None or optional["kl"] is not None
    return not (variant.kl_scale == "sequence" and kl_given and variant.kl_coef > 0
                and variant.aggregation == "token_mean" and normalizer is not None)


# k3(l) / l^2 on [-1/2, 1/2] as a degree-5 polynomial (coefficients of l^0 ... l^5) of least maximal
# relative error (Lawson's iteration on 400 Chebyshev nodes against mpmath): 2.4e-8 relative, a fifth
# of float32's roundoff, where the Taylor series needs 8 terms for 3e-9 (7 for 5e-8)
_MINIMAX = (0.500000012013975, 0.16666665455835278, 0.04166579594170558, 0.008333452172743349,
            0.001398199736462015, 0.00019875629149246135)
_TERMS = len(_MINIMAX)
_FACTORIALS = tuple(math.factorial(k) for k in range(_TERMS + 3))


@functools.cache
def _series_coefficients(dtype: torch.dtype, minimax: bool) -> tuple[torch.Tensor, ...]:
    """The coefficients of k3(l) / l^2 as 0-d tensors, lowest power first: its Taylor series
    1/2!, 1/3!, ..., 1/7! (k3(l) = l^2 sum_k l^k / (k + 2)!, kl.md eq. (4)), or ``_MINIMAX``."""
    values = _MINIMAX if minimax else tuple(1.0 / math.factorial(k) for k in range(2, 2 + _TERMS))
    return tuple(torch.tensor(value, dtype=dtype, device="cpu") for value in values)


def _series_terms(bound: float) -> int:
    """Taylor terms of k3(l) / l^2 needed for |l| <= bound: the first omitted term relative to the
    first, 2 bound^K / (K + 2)!, below 2**-27 (a sixteenth of float32's roundoff); more than
    ``_TERMS`` (|l| above about 0.23): the minimax polynomial instead."""
    terms = 2
    while terms <= _TERMS and 2.0 * bound**terms / _FACTORIALS[terms + 2] > 2.0**-27:
        terms += 1
    return terms


def _k3_sum(x: torch.Tensor, low: float, high: float, ratio: torch.Tensor | None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """``sum(expm1(x) - x)`` over a block of log-ratios (``low``, ``high`` its extremes; ``ratio``
    ``exp(x)`` where already formed; ``out`` a buffer of x's shape for the polynomial): the series
    (Taylor with as few terms as the block's largest |x| needs, none where every x is 0, as on the
    first update after sampling; else the minimax polynomial) and correction of the module docstring
    in float32; float64 inputs: the reference's k3. (A float64 sum of exp(x) measured slower than the
    series on the development machine.)"""
    if x.dtype == torch.float64:
        return _exp_minus_one_minus_identity(x).sum()
    largest = max(-low, high)
    if largest == 0.0:
        return x.new_zeros(())
    large = largest > _SERIES_BOUND
    clamped = x.clamp(-_SERIES_BOUND, _SERIES_BOUND) if large else x
    terms = _series_terms(min(largest, _SERIES_BOUND))
    minimax = terms > _TERMS
    terms = min(terms, _TERMS)
    c = _series_coefficients(x.dtype, minimax)
    top = _MINIMAX[terms - 1] if minimax else 1.0 / _FACTORIALS[terms + 1]
    poly = torch.add(c[terms - 2], clamped, alpha=top, out=out)
    for coefficient in c[terms - 3::-1] if terms > 2 else ():  # (Horner in place: one temporary)
        torch.addcmul(coefficient, poly, clamped, out=poly)
    total = poly.mul_(clamped).mul_(clamped).sum()
    if large:  # (exp(l) - l) - (exp(c) - c): exactly 0 wherever c = l
        excess = torch.sub(torch.exp(x) if ratio is None else ratio, x)
        total = total + excess.sub_(torch.exp(clamped).sub_(clamped)).sum()
    return total


def _clip_bounds(variant) -> tuple[float, float, float]:
    """(lower bound for A <= 0, upper bound for A > 0, upper bound for A <= 0) of md eqs. (6)-(7)."""
    lower = 0.0 if variant.eps_low is None else 1.0 - variant.eps_low
    upper = math.inf if variant.eps_high is None else 1.0 + variant.eps_high
    return lower, upper, math.inf if variant.dual_clip is None else variant.dual_clip


def _cispo_bounds(variant) -> tuple[float | None, float | None]:
    """CISPO's clip sides (md eq. (9)): ``1 - eps_low`` and ``1 + eps_high``, None where not given."""
    return (None if variant.eps_low is None else 1.0 - variant.eps_low,
            None if variant.eps_high is None else 1.0 + variant.eps_high)


def _cispo_weight(r: torch.Tensor, variant, out: torch.Tensor | None = None) -> torch.Tensor:
    """CISPO's ``clip(r, 1 - eps_low, 1 + eps_high)`` on the sides given (md eq. (9)), a new tensor
    (or ``out``)."""
    low, high = _cispo_bounds(variant)
    if low is None and high is None:
        return r.clone() if out is None else out.copy_(r)
    return torch.clamp(r, min=low, max=high, out=out)


class _TokenGate(NamedTuple):
    """Per-row (``[N, 1]``) or per-token parameters of a token-level gate, by the sign of A."""

    low: torch.Tensor | None  # clip: the clamp's bounds
    high: torch.Tensor | None
    neg_tau: torch.Tensor | None  # SAPO: minus the temperature, and the term's factor 4 / tau
    scale: torch.Tensor | None


_NO_GATE = _TokenGate(None, None, None, None)


@functools.lru_cache(maxsize=256)
def _scalar(value: float, dtype: torch.dtype) -> torch.Tensor:
    """``value`` rounded once to ``dtype``: a 0-d CPU tensor, shared (never written; on the CPU whatever
    the default device, which must not reach the cache)."""
    return torch.tensor(value, dtype=dtype, device="cpu")


def _by_sign(positive: torch.Tensor, if_positive: float, otherwise: float,
             dtype: torch.dtype) -> torch.Tensor:
    """``if_positive`` where ``positive`` (bool), else ``otherwise``, each rounded once to ``dtype``."""
    return torch.where(positive, _scalar(if_positive, dtype), _scalar(otherwise, dtype))


def _token_gate(variant, positive: torch.Tensor, dtype: torch.dtype) -> _TokenGate:
    """The clip bounds of md eqs. (6)-(7) (A > 0: ``(-inf, upper]``; A <= 0: ``[lower, dual]``) or
    SAPO's temperature (negated) and factor (md eq. (8)) by the sign of A (``positive``, ``[N, 1]`` or
    ``[N, T]``)."""
    v = variant
    if v.gate == "clip":
        lower, upper, dual = _clip_bounds(v)
        return _TokenGate(_by_sign(positive, -math.inf, lower, dtype), _by_sign(positive, upper, dual, dtype),
                          None, None)
    if v.gate == "sapo":
        return _TokenGate(None, None, _by_sign(positive, -v.tau_pos, -v.tau_neg, dtype),
                          _by_sign(positive, 4.0 / v.tau_pos, 4.0 / v.tau_neg, dtype))
    return _NO_GATE


def _token_block(v, x, mf, adv, gate: _TokenGate, logp, slope_out, rows_out, buffers):
    """One block of a token-level ratio (md eqs. (2), (6)-(9), (15)): writes the gradient's per-token
    factor into ``slope_out`` and the per-row sums of the unit terms into ``rows_out`` (None: a new
    tensor; both zero at masked tokens; times A where A is per token, ``adv``, else divided by A and, for
    SAPO, by 4 / tau); ``buffers``: three scratch tensors of the block's shape (ratio, term, SAPO's
    sigmoid). Returns (ratio, or None where its memory was reused (CISPO), sum of open gates over all
    tokens (masked: open) or None, the row sums)."""
    r_out, term_out, sigma_out = buffers
    r = torch.exp(x, out=r_out)
    weight = mf if adv is None else adv  # zero at masked tokens
    opened = None
    if v.gate == "clip":
        # maximum, then minimum: a third of clamp's time with [N, 1] bounds on the development machine
        term = torch.maximum(r, gate.low, out=term_out)
        torch.minimum(term, gate.high, out=term)
        torch.eq(term, r, out=slope_out)  # the inclusive gate: open = 1
        opened = slope_out.sum()
        slope_out.mul_(r).mul_(weight)
        term.mul_(weight)
    elif v.gate == "sapo":  # md eq. (8): 4 / tau sigmoid(tau (r - 1)) A; slope (15): 4 A sigma (1 - sigma) r
        # tau r - tau
        sigma = torch.addcmul(gate.neg_tau, r, gate.neg_tau, value=-1.0, out=sigma_out).sigmoid_()
        if adv is None:  # per-row A: the caller multiplies the row sums by (4 / tau) A
            term = torch.mul(sigma, mf, out=term_out)
            torch.addcmul(term, term, sigma, value=-1.0, out=slope_out).mul_(r)
        else:  # per-token A: times (4 / tau) A per token, 4 / tau rounded once from the variant's floats,
            # as the reference forms it
            torch.addcmul(sigma, sigma, sigma, value=-1.0, out=slope_out).mul_(r).mul_(weight)
            term = sigma.mul_(weight * gate.scale)
    elif v.gate == "cispo":  # md eq. (9): sg(clip(r)) A logp, slope clip(r) A
        _cispo_weight(r, v, out=slope_out).mul_(weight)
        term = torch.mul(slope_out, logp, out=r)  # (the ratio's memory: approx_kl forms exp again if needed)
        r = None
    else:  # "none": r A, its own slope
        term = torch.mul(r, weight, out=slope_out)
    return r, opened, torch.sum(term, dim=-1, out=rows_out)


def closed_form_policy_loss(logp, old_logp, advantages, mask, variant, optional: dict, normalizer):
    """``policy_loss``'s ``(loss, metrics)`` (md eq. (12)) from inputs that ``check_policy_inputs`` has
    accepted, or None where the reference must decide (see the module docstring)."""
    if not logp.is_cpu or logp.numel() == 0 or not _supported(variant, advantages, optional, normalizer):
        return None
    dtype = _COMPUTE_DTYPES.get(logp.dtype) or torch.promote_types(logp.dtype, torch.float32)
    # detached inputs (``optional`` is detached where it is read): nothing is recorded
    old, adv = old_logp.detach() if old_logp.requires_grad else old_logp, advantages
    if adv.requires_grad or mask.requires_grad:
        adv, mask = adv.detach(), mask.detach()
    mf = None
    if mask.dtype != torch.bool:
        mf = _float_mask(mask, dtype)
        if mf is None:
            return None
    adv = adv if adv.dtype == dtype else adv.to(dtype)
    result = _compute(logp.detach(), old, adv, mask, mf, variant, optional, normalizer, dtype)
    if result is None:
        return None
    loss, metrics, grads = result  # (the loss a float: a tensor of the compute dtype in forward)
    # the inputs whose gradient the loss carries: logp, and entropy and kl where they enter it
    entropy = optional["entropy"] if variant.entropy_coef > 0 else None
    kl = optional["kl"] if variant.kl_coef > 0 else None
    if entropy is None and kl is None:
        return _ClosedFormLoss.apply(loss, dtype, grads[:1], logp), metrics
    return _ClosedFormLoss.apply(loss, dtype, grads, logp, entropy, kl), metrics


class _Blocks(NamedTuple):
    """What the blocks leave: per-row sums, the gradient's per-token factor, per-block scalars."""

    lengths: torch.Tensor  # [N] unmasked tokens per row
    rows: torch.Tensor  # [N] the unit terms' row sums (token levels) or the log-ratio's (sequence levels)
    slope: torch.Tensor | None  # [N, T] the gradient's per-token factor (token level; else None)
    unit_logp: torch.Tensor | None  # [N] sum of mask * logp (CISPO at sequence level)
    mask: torch.Tensor | None  # [N, T] the float mask where one was formed whole (else None: blocks only)
    k3: torch.Tensor  # sum of k3 over the tokens
    log_ratio_sum: torch.Tensor | None  # sum of the log-ratio over the tokens (token level)
    opened: torch.Tensor | None  # clip at token level: open gates over all tokens (masked: open)
    low: float  # extremes of the log-ratio over all tokens (masked: 0)
    high: float


def _run_blocks(v, logp, old, adv, mask, mf, dtype, gate: _TokenGate | None) -> _Blocks | None:
    """Every per-token pass, block by block of rows; None on a non-finite log-ratio. The temporaries
    live in one scratch allocation (``_scratch``), a bool mask's float copy too (one block: the whole
    mask converted and kept, the temporaries fresh)."""
    n, t = logp.shape
    token_level = v.ratio == "token"
    per_token_adv = adv.ndim == 2
    step = _rows_per_block(t)
    whole = step >= n  # one block: no views of the inputs (each a few microseconds)
    bool_mask = mask.view(torch.uint8) if mf is None else None
    full_mask = mf
    if full_mask is None and whole:
        full_mask, bool_mask = bool_mask.to(dtype), None
    # (one block: fresh temporaries, a small batch's come from the allocator's free lists)
    scratch = None if whole else _scratch(step * t, dtype)
    # the outputs of the row sums: buffers the blocks write into, or (one block) None: new tensors
    lengths = None if whole else logp.new_empty(n, dtype=dtype)
    rows = None if whole else logp.new_empty(n, dtype=dtype)
    slope = logp.new_empty((n, t), dtype=dtype) if token_level else None
    unit_logp = logp.new_empty(n, dtype=dtype) if v.gate == "cispo" and not (token_level or whole) else None
    k3, log_ratio_sums, opens = [], [], []
    low, high = math.inf, -math.inf
    m, lp, before, a, g, lengths_out, rows_out, slope_out, unit_out = (
        full_mask, logp, old, adv if per_token_adv else None, gate, lengths, rows, slope, unit_logp)
    views = None
    for i in range(0, n, step):
        rows_here = min(step, n - i)
        if scratch is None:
            views = (None,) * _SCRATCH_SLOTS
        elif views is None or rows_here != views[0].shape[0]:  # (the last block may be shorter)
            views = _block_views(scratch, rows_here, t)
        x_out, r_out, term_out, mask_out, sigma_out = views
        if not whole:  # views of the block's rows
            block = slice(i, i + step)
            lp, before = logp[block], old[block]
            m = full_mask[block] if bool_mask is None else mask_out.copy_(bool_mask[block])
            a = adv[block] if per_token_adv else None
            g = _TokenGate(*(None if p is None else p[block] for p in gate))
            lengths_out, rows_out = lengths[block], rows[block]
            slope_out = None if slope is None else slope[block]
            unit_out = None if unit_logp is None else unit_logp[block]
        lengths_out = torch.sum(m, dim=-1, out=lengths_out)
        if lp.dtype != dtype or before.dtype != dtype:  # half-precision inputs: the compute dtype first
            lp, before = lp.to(dtype), before.to(dtype)
        x = torch.sub(lp, before, out=x_out).mul_(m)
        lo, hi = float(x.amin()), float(x.amax())  # (aminmax: 1.3-2x their time here)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        low, high = min(low, lo), max(high, hi)
        ratio = None
        if token_level:
            ratio, opened, rows_out = _token_block(v, x, m, None if a is None else a * m, g, lp, slope_out,
                                                   rows_out, (r_out, term_out, sigma_out))
            log_ratio_sums.append(x.sum())
            if opened is not None:
                opens.append(opened)
        else:
            rows_out = torch.sum(x, dim=-1, out=rows_out)
            if v.gate == "cispo":
                unit_out = torch.sum(lp * m, dim=-1, out=unit_out)
        k3.append(_k3_sum(x, lo, hi, ratio, term_out))
    # (sequence levels: the log-ratio's sum is not needed, their ratio metrics come from the units)
    log_ratio_sum = _total(log_ratio_sums) if token_level else None
    if whole:
        lengths, rows, unit_logp = lengths_out, rows_out, unit_out
    return _Blocks(lengths, rows, slope, unit_logp, full_mask, _total(k3), log_ratio_sum,
                   _total(opens) if opens else None, low, high)


def _read(scalars: list[torch.Tensor]) -> list[float]:
    """0-d tensors as floats (one or two: each read alone; more: one stack)."""
    return [float(x) for x in scalars] if len(scalars) <= 2 else torch.stack(scalars).tolist()


def _total(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.stack(parts).sum()


def _unit_gate(variant, u: torch.Tensor, adv: torch.Tensor, weight: torch.Tensor):
    """(term over A, d term / d (A u) times ``weight``, gate open (bool) or None, ratio) per sequence unit
    ``[N]`` (md eqs. (3)-(9)), each a new tensor; CISPO: the term over A and the unit's log-prob, its
    slope with respect to that log-prob (``adv`` gives the sign of A)."""
    v = variant
    ratio = torch.exp(u)
    if v.gate == "clip":  # min(r, upper) where A > 0, clamp(r, lower, dual) elsewhere (md eqs. (6)-(7))
        lower, upper, dual = _clip_bounds(v)
        clipped = torch.where(adv > 0, ratio.clamp(max=upper), ratio.clamp(min=lower, max=dual))
        opened = clipped == ratio  # the inclusive gate: a ratio on a bound is inside
        return clipped, torch.mul(ratio, weight).mul_(opened), opened, ratio
    if v.gate == "sapo":
        positive = adv > 0
        tau = _by_sign(positive, v.tau_pos, v.tau_neg, u.dtype)
        scale = _by_sign(positive, 4.0 / v.tau_pos, 4.0 / v.tau_neg, u.dtype)
        sigma = torch.sigmoid(tau * (ratio - 1.0))
        return sigma * scale, 4.0 * weight * sigma * (1.0 - sigma) * ratio, None, ratio
    if v.gate == "cispo":
        clipped = _cispo_weight(ratio, v)
        return clipped, clipped * weight, None, ratio
    return ratio, ratio * weight, None, ratio


def _masked_token_extremes(logp, old, mf, dtype) -> tuple[float, float]:
    """(min, max) of the ratio over the unmasked tokens (+-inf where there is none)."""
    r = torch.exp(torch.sub(logp.to(dtype), old.to(dtype)).mul_(mf))
    unmasked = mf != 0
    return float(torch.where(unmasked, r, math.inf).min()), float(torch.where(unmasked, r, -math.inf).max())


def _compute(logp, old, advantages, mask, mf, variant, optional, normalizer, dtype):
    """(loss as a float, metrics, (d/d logp, d/d entropy, d/d kl)) or None (a non-finite input, ratio or
    loss). The per-row quantities that are summed are read as Python floats (``tolist``), the scalars
    of the blocks once, and combined in double precision, each metric rounded once to ``dtype``; the
    per-row gradient factors stay tensors."""
    v = variant
    n, t = logp.shape
    per_token_adv = advantages.ndim == 2
    token_level = v.ratio == "token"
    gate = _NO_GATE
    if token_level and v.gate in ("clip", "sapo"):
        positive = advantages > 0
        gate = _token_gate(v, positive if per_token_adv else positive.unsqueeze(-1), dtype)
    blocks = _run_blocks(v, logp, old, advantages, mask, mf, dtype, gate)
    # a ratio beyond the dtype's range (its gradient factor would be 0 * inf): the reference decides
    if blocks is None or blocks.high >= _LOG_MAX[dtype]:
        return None
    lengths = blocks.lengths
    counts = lengths.tolist()  # whole numbers: their sum in double precision is exact
    tokens, shortest, longest = sum(counts), min(counts), max(counts)
    all_nonempty = shortest > 0
    nonempty = None if all_nonempty else lengths > 0
    sequences = float(n) if all_nonempty else float(sum(length > 0 for length in counts))
    local = _local_normalizer(tokens, sequences, longest, v)
    denominator = None if local is None else _denominator(normalizer, local, dtype)
    if denominator is None:
        return None
    names = [name for name in ("ref_logp", "entropy", "kl") if optional[name] is not None]
    # the float mask [N, T] where the regularisers need it (the blocks formed it from a bool mask
    # block by block, in scratch memory, unless in one block)
    mf = blocks.mask if blocks.mask is not None or not names else mask.to(dtype)
    given = {name: optional[name].detach().to(dtype) * mf for name in names}
    if given and not bool(torch.isfinite(torch.stack([x.sum() for x in given.values()])).all()):
        return None
    row_scale = math.sqrt(v.group_size) if v.aggregation == "seq_sqrt_token_mean" else 1.0
    length1 = lengths if all_nonempty else lengths.clamp(min=1.0)  # (every length >= 1: the same values)
    # the weight of a token's term in its row's contribution (md eq. (10)), times sqrt(G): per row
    # (a tensor, and as Python floats for the sums) under the per-sequence means, else a float
    per_sequence_mean = v.aggregation in _PER_SEQUENCE_MEAN
    token_row = None  # (formed below only where a regulariser needs it)
    if given:
        token_row = (row_scale / length1) if per_sequence_mean else row_scale
    row_weights = [row_scale / max(count, 1.0) for count in counts] if per_sequence_mean else None
    scale = -1.0 / denominator
    masked_tokens = tokens < n * t
    token_units = max(tokens, 1.0)
    # the per-row values are read (``tolist``) and summed in double precision; where A is per row, the
    # advantages (or (4 / tau) A) are among them, ``checked``: their sum must be finite
    if token_level:
        weights = None
        if not per_token_adv:  # the rows carry the term over A (SAPO: over (4 / tau) A)
            weights = advantages if v.gate != "sapo" else gate.scale.view(-1) * advantages
        # A (per row) times the row weight of md eq. (10) (times sqrt(G)) over -D (SAPO: times 4)
        factor = (4.0 * scale if v.gate == "sapo" else scale) * row_scale
        if per_token_adv:
            row_factor = length1.reciprocal().mul_(factor) if per_sequence_mean else factor
        elif per_sequence_mean:
            row_factor = torch.addcdiv(_ZERO[dtype], advantages, length1, value=factor)
        else:
            row_factor = advantages * factor
        grad = _Factor(blocks.slope, row_factor)
        checked = None if weights is None else weights.tolist()
        terms = blocks.rows.tolist()
        if weights is not None:
            terms = list(map(operator.mul, terms, checked))
        objective = sum(terms)
        # (a multiplication by 1 is exact: skipped)
        policy = objective if row_weights is None else sum(map(operator.mul, terms, row_weights))
        scalars = [blocks.k3, blocks.log_ratio_sum] + ([] if blocks.opened is None else [blocks.opened])
    else:  # one unit per sequence (md eqs. (3)-(5)): everything per row, then broadcast
        total = blocks.rows  # (a buffer of the blocks: divided in place)
        if v.ratio in ("sequence_mean", "gspo_token"):
            total = total.div_(length1)
        adv = advantages if all_nonempty else torch.where(nonempty, advantages, 0.0)
        gspo_token = v.ratio == "gspo_token"
        # the gradient's per-row factor times the unit's d term / d (A u): A times the row's weight in
        # the loss, md eqs. (10)-(11) (len_i where a unit counts once per token, over len_i for the
        # mean log-ratio, or GSPO-token's per-sequence mean of its copies; sqrt(G)), over -D; for an
        # empty row A = 0 (len_i / max(len_i, 1) is 1 elsewhere)
        factor = scale * row_scale
        if gspo_token:
            over_length, times_length = per_sequence_mean, False
        else:
            copies = v.aggregation in _PER_TOKEN_COPIES
            mean = v.ratio == "sequence_mean"
            over_length, times_length = mean and not copies, copies and not mean
        if over_length:
            weight = torch.addcdiv(_ZERO[dtype], adv, length1, value=factor)
        elif times_length:
            weight = torch.addcmul(_ZERO[dtype], adv, lengths, value=factor)
        else:
            weight = adv * factor
        unit, slope, opened, ratio = _unit_gate(v, total, adv, weight)
        ratios, advs = ratio.tolist(), adv.tolist()
        checked = advs if all_nonempty else advantages.tolist()
        terms = list(map(operator.mul, unit.tolist(), advs))
        if v.gate == "cispo":  # sg(clip(r)) A times the unit's log-prob (md eq. (9))
            unit_logp = blocks.unit_logp.div_(length1) if v.ratio == "sequence_mean" else blocks.unit_logp
            terms = list(map(operator.mul, terms, unit_logp.tolist()))
        objective = sum(map(operator.mul, terms, counts)) if gspo_token else sum(terms)
        if gspo_token:  # a row's token mean of len_i copies of its term is the term itself
            policy = sum(terms) if per_sequence_mean else objective
        else:
            policy = sum(map(operator.mul, terms, counts)) if copies else objective
        policy *= row_scale
        grad = _Factor(mask if blocks.mask is None else blocks.mask, slope)  # (a bool mask: its 0 / 1)
        # the units: a row's tokens (GSPO-token: the sequence ratio's value on each, md eq. (5)) or the
        # row (an empty row's ratio is 1: r - 1 = 0)
        opened_units = None if opened is None else (
            sum(map(operator.mul, opened.tolist(), counts)) if gspo_token else sum(opened.tolist()))
        ratio_sum = sum((r - 1.0) * c for r, c in zip(ratios, counts, strict=True)) if gspo_token else (
            sum(ratios) - n if all_nonempty else sum(r - 1.0 for r in ratios))
        unit_ratios = ratios if all_nonempty else [r for r, c in zip(ratios, counts, strict=True) if c]
        scalars = [blocks.k3]
    regularised = _regularisers(v, logp, mf, given, lengths, local, sequences, token_row, scale, grad, dtype)
    grad, grad_entropy, grad_kl, contributions, extra = regularised
    if checked is not None and not math.isfinite(sum(checked)):  # a non-finite A: the reference decides
        return None
    values = _read(scalars + contributions + list(extra.values()))
    k3 = values[0]
    if token_level:
        units = token_units
        ratio_mean = 1.0 + (k3 + values[1]) / units  # sum of r - 1 = sum of k3 + sum of l (no cancellation)
        closed = 0.0 if blocks.opened is None else tokens - (values[2] - (n * t - tokens))
        if masked_tokens and (blocks.low >= 0.0 or blocks.high <= 0.0):  # not both sides of 1
            low, high = _masked_token_extremes(logp, old, mask.to(dtype) if mf is None else mf, dtype)
        else:  # masked tokens hold log-ratio 0, and exp is monotonic
            low, high = math.exp(blocks.low), math.exp(blocks.high)
        masked_units = masked_tokens
    else:
        units = token_units if gspo_token else max(sequences, 1.0)
        ratio_mean = 1.0 + ratio_sum / units
        low, high = min(unit_ratios, default=math.inf), max(unit_ratios, default=-math.inf)
        closed = 0.0 if opened is None else (tokens if gspo_token else float(n)) - opened_units
        masked_units = masked_tokens if gspo_token else not all_nonempty
    if masked_units:  # the reference fills the masked units with the mean
        low, high = min(low, ratio_mean), max(high, ratio_mean)
    extra_values = values[len(scalars) + len(contributions):]
    loss = (-policy + sum(values[len(scalars):len(scalars) + len(contributions)])) / denominator
    if not math.isfinite(loss):
        return None
    metrics = [objective / units, closed / units, ratio_mean, low, high, k3 / token_units, denominator]
    metrics += [value / token_units for value in extra_values]
    names = ("policy_objective", "clip_fraction", "ratio_mean", "ratio_min", "ratio_max", "approx_kl",
             "normalizer", *extra)
    metrics = lengths.new_tensor(metrics).unbind()  # one tensor, each rounded once (the loss: by the caller)
    return loss, dict(zip(names, metrics, strict=True)), (grad, grad_entropy, grad_kl)


def _regularisers(v, logp, mf, given, lengths, local, sequences, token_row, scale, grad: _Factor, dtype):
    """The KL and entropy terms (md eqs. (12), (19)): (d/d logp, d/d entropy, d/d kl, [their
    contributions' sums], {metric: sum of its per-token values})."""
    grad_entropy = grad_kl = None
    contributions, extra = [], {}
    kl_tokens = given.get("kl")
    kl_slope = None
    if "ref_logp" in given:
        lp = logp.to(dtype) * mf
        kl_tokens = _KL_FUNCTIONS[v.kl_estimator](lp, given["ref_logp"], check_finite=False)
        if v.kl_estimator == "k1":
            kl_slope = mf
        elif v.kl_estimator == "k2":
            kl_slope = lp - given["ref_logp"]
        else:
            kl_slope = -torch.expm1(given["ref_logp"] - lp)
    if kl_tokens is not None:
        extra["kl"] = kl_tokens.sum()
    if kl_tokens is not None and v.kl_coef > 0:
        if v.kl_scale == "sequence":  # md eq. (19): u with (1/D) sum_i u KL_i = (1/S) sum_i KL_i
            if v.aggregation == "seq_sum":
                weight = float(v.max_length)
            elif v.aggregation == "token_mean":
                weight = max(local, 1.0) / max(sequences, 1.0)
            else:
                weight = 1.0
        else:
            weight = token_row
        kl_row = v.kl_coef * weight
        if not isinstance(kl_row, torch.Tensor):
            kl_row = torch.full_like(lengths, kl_row)
        contributions.append((kl_tokens.sum(dim=-1) * kl_row).sum())
        if kl_slope is not None:
            policy_grad = grad.per_token * _row_column(grad.per_row)
            grad = _Factor(policy_grad - kl_slope * (kl_row * scale).unsqueeze(-1), None)
        else:
            grad_kl = _Factor(mf, kl_row * -scale)
    entropy_tokens = given.get("entropy")
    if entropy_tokens is not None:
        extra["entropy"] = entropy_tokens.sum()
    if entropy_tokens is not None and v.entropy_coef > 0:
        bonus_row = v.entropy_coef * token_row
        if not isinstance(bonus_row, torch.Tensor):
            bonus_row = torch.full_like(lengths, bonus_row)
        contributions.append(-(entropy_tokens.sum(dim=-1) * bonus_row).sum())
        grad_entropy = _Factor(mf, bonus_row * scale)
    return grad, grad_entropy, grad_kl, contributions, extra


def _mask_times(mask: torch.Tensor, factor: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    """``mask * factor`` for a bool mask (as 0 / 1; ``factor`` ``[N, 1]`` or a float) as a new ``[N, T]``
    tensor of ``dtype``, block by block of rows: each block's 0 / 1 copied into the result and multiplied
    in place while it is cached (the same values as the product with a float mask)."""
    n, t = mask.shape
    out = torch.empty((n, t), dtype=dtype, device=mask.device)
    bits = mask.view(torch.uint8)
    step = _rows_per_block(t)
    per_row = isinstance(factor, torch.Tensor)
    for i in range(0, n, step):
        block = slice(i, i + step)
        out[block].copy_(bits[block]).mul_(factor[block] if per_row else factor)
    return out


def _row_column(per_row: torch.Tensor | float | None) -> torch.Tensor | float:
    """A per-row factor as a column ``[N, 1]`` (a float or None, 1.0: as it is)."""
    if per_row is None:
        return 1.0
    return per_row.unsqueeze(-1) if isinstance(per_row, torch.Tensor) else per_row


class _ClosedFormLoss(torch.autograd.Function):
    """The loss whose gradient was computed with it: forward returns the value, backward each saved
    gradient factor (of ``logp``, and of ``entropy`` / ``kl`` where they enter the loss) times the
    incoming one, in one pass per input and in its dtype."""

    @staticmethod
    def forward(ctx, loss: float, dtype, grads, *inputs):  # inputs: logp, or logp, entropy, kl (or None)
        ctx.grads = grads
        ctx.dtype = dtype
        ctx.dtypes = tuple(None if x is None else x.dtype for x in inputs)
        return torch.scalar_tensor(loss, dtype=dtype, device="cpu")  # (the closed form runs on the CPU)

    @staticmethod
    def backward(ctx, grad_loss):
        out = [None, None, None]
        # (a CPU scalar; the incoming gradient of a plain ``loss.backward()`` is 1: no multiplication)
        scaled = grad_loss.requires_grad or float(grad_loss) != 1.0
        for saved, dtype, needed in zip(ctx.grads, ctx.dtypes, ctx.needs_input_grad[3:], strict=True):
            if not needed or saved is None:
                out.append(None)
                continue
            factor = _row_column(saved.per_row)
            if scaled:
                factor = factor * grad_loss.to(ctx.dtype)
            if saved.per_token.dtype == torch.bool:
                grad = _mask_times(saved.per_token, factor, ctx.dtype)
            else:
                grad = torch.mul(saved.per_token, factor)
            out.append(grad if grad.dtype == dtype else grad.to(dtype))
        return tuple(out)

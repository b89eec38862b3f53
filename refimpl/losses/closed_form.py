"""The eager fast path of ``policy_loss``: value, closed-form gradient and metrics in a few dense passes.

spec: specs/policy_losses.md eqs. (2)-(12), (15), (19) (the loss that ``refimpl.losses.policy`` states
readably; ``policy_loss`` calls ``closed_form_policy_loss`` first and runs its reference body only where
this returns None). No compiler: plain ATen ops, each a pass over ``[N, T]``, chosen for a CPU:

- the mask is a 0/1 float tensor that multiplies (``where`` / ``masked_fill`` with a bool ``[N, T]``
  mask cost ten times a multiplication on a CPU); padding must then be finite, so any NaN / inf
  anywhere (padding included) hands the batch to the reference, which ignores padding exactly;
- one ``exp`` gives every ratio; the inclusive hard gate of md eq. (6)-(7) is a clamp of the ratio
  between per-row (or per-token) bounds, and a token's gate is open exactly where the clamp leaves the
  ratio unchanged (``clamp(r) == r``: a ratio on a bound counts as inside);
- the gradient of md eq. (12) with respect to ``logp`` is written out (each unit's derivative, md eqs.
  (6)-(9), (15), times its aggregation weight, md eqs. (10)-(11), (19), over the denominator), computed
  in the same pass as the value and saved; ``_ClosedFormLoss.backward`` multiplies it by the incoming
  gradient (first derivatives only, as ``fused_policy_loss``);
- the guards: any non-finite input sum, ratio sum or loss, a mask that is not 0/1, a normaliser or
  L_max that the reference refuses, or a part this path does not implement (GMPO's log-clip, the
  behaviour correction, GSPO-token with per-token advantages, an accelerator, where the reference
  never synchronises) returns None, and the reference then gives its exact value or its error.

Rounding: the same formulas in another order, within a few units of the compute dtype's roundoff u of
the reference on the scale of each result (tests/test_policy_loss_closed_form.py). SAPO's ``r - 1``
is the rounded ratio minus one (the reference's ``expm1``: an absolute error of u in the gate's
argument, below u in the sigmoid); float32's ``approx_kl`` is ``expm1(l) - l`` summed in float64,
free of cancellation for every float32 log-ratio (float64 keeps the reference's series).
"""

from __future__ import annotations

import math

import torch

from refimpl.kl import _exp_minus_one_minus_identity, kl_k1, kl_k2, kl_k3

__all__ = ["closed_form_policy_loss"]

_KL_FUNCTIONS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
_PER_SEQUENCE_MEAN = ("seq_mean_token_mean", "seq_sqrt_token_mean")
_PER_TOKEN_COPIES = ("token_mean", "seq_sum", "seq_mean_token_sum")


def _float_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """The mask as 0.0 / 1.0 in ``dtype``, or None when it holds another value (the reference raises)."""
    if mask.dtype == torch.bool:
        return mask.view(torch.uint8).to(dtype)
    if not bool(((mask == 0) | (mask == 1)).all()):
        return None
    return mask.to(dtype)


def _denominator(normalizer: object, local: torch.Tensor) -> torch.Tensor | None:
    """``policy._resolve_normalizer`` without its errors: None where the reference raises."""
    if normalizer is None:
        return local.clamp(min=1.0)
    if isinstance(normalizer, torch.Tensor):
        if normalizer.numel() != 1:
            return None
        value = normalizer.detach().reshape(()).to(local)
    elif isinstance(normalizer, (int, float)) and not isinstance(normalizer, bool):
        value = local.new_tensor(float(normalizer))
    else:
        return None
    return value if bool(torch.isfinite(value) & (value > 0)) else None


def _local_normalizer(lengths: torch.Tensor, variant) -> torch.Tensor | None:
    """The local denominator of md eq. (11) (``policy._normalizer_from_lengths``); None where the
    reference raises (no L_max or G, a sequence longer than L_max)."""
    if variant.aggregation == "token_mean":
        return lengths.sum()
    if variant.aggregation == "seq_sum" and (variant.max_length is None or
                                             float(lengths.max()) > variant.max_length):
        return None
    if variant.aggregation == "seq_sqrt_token_mean" and variant.group_size is None:
        return None
    sequences = (lengths > 0).sum(dtype=lengths.dtype)
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


def _clip_bounds(variant) -> tuple[float, float, float]:
    """(lower bound for A <= 0, upper bound for A > 0, upper bound for A <= 0) of md eqs. (6)-(7)."""
    lower = 0.0 if variant.eps_low is None else 1.0 - variant.eps_low
    upper = math.inf if variant.eps_high is None else 1.0 + variant.eps_high
    return lower, upper, math.inf if variant.dual_clip is None else variant.dual_clip


def _clip(r: torch.Tensor, positive: torch.Tensor, variant) -> torch.Tensor:
    """``min(r, upper)`` where A > 0, ``clamp(r, lower, dual)`` elsewhere: the unit's term divided by A
    (md eqs. (6)-(7); ``positive`` a 0/1 float tensor broadcastable to ``r``). ``lerp`` with weight 0
    or 1 returns one of its ends exactly."""
    lower, upper, dual = _clip_bounds(variant)
    if bool((positive == 1).all()):
        return r.clamp(max=upper)
    negative = r.clamp(min=lower, max=dual)
    if not bool(positive.any()):
        return negative
    return torch.lerp(negative, r.clamp(max=upper), positive)


def _cispo_weight(r: torch.Tensor, variant) -> torch.Tensor:
    """CISPO's ``clip(r, 1 - eps_low, 1 + eps_high)`` on the sides given (md eq. (9)), a new tensor."""
    if variant.eps_low is None and variant.eps_high is None:
        return r.clone()
    return r.clamp(min=None if variant.eps_low is None else 1.0 - variant.eps_low,
                   max=None if variant.eps_high is None else 1.0 + variant.eps_high)


def _token_units(variant, r, mf, adv, positive, grad_row, logp):
    """(rows, d loss / d logp, open count or None) for token-level ratios (md eqs. (2), (6)-(9), (15)):
    ``rows`` the per-row sums of the unit terms, the gradient already times ``grad_row`` (each row's
    aggregation weight over the denominator, ``[N, 1]``) and zero at masked positions. ``adv`` is A per
    token (zero at masked positions) or per row ``[N, 1]``, ``positive`` A > 0 as 0/1 of its shape.
    Per-row A multiplies the rows and the gradient's row factor, never an ``[N, T]`` pass."""
    v = variant
    per_token = adv.shape == r.shape
    weight = adv if per_token else mf  # zero at masked positions, times A where A is per token
    row_adv = None if per_token else adv.squeeze(-1)
    grad_factor = grad_row if per_token else adv * grad_row
    opened = None
    if v.gate == "clip":
        clipped = _clip(r, positive, v)
        slope = torch.eq(clipped, r, out=torch.empty_like(r)).mul_(mf)  # the inclusive gate, open = 1
        opened = slope.sum()
        slope.mul_(r)
        term = clipped
    elif v.gate == "sapo":  # md eq. (8): 4 / tau sigmoid(tau (r - 1)) A; slope (15): 4 A sigma (1 - sigma) r
        full = adv.new_full
        tau = torch.lerp(full((), v.tau_neg), full((), v.tau_pos), positive)
        sigma = (r - 1.0).mul_(tau).sigmoid_()
        slope = torch.addcmul(sigma, sigma, sigma, value=-1.0).mul_(r)
        grad_factor = grad_factor * 4.0
        # (4 / tau) A per unit, 4 / tau rounded once from the variant's floats, as the reference forms it
        scaled_adv = torch.lerp(full((), 4.0 / v.tau_neg), full((), 4.0 / v.tau_pos), positive) * adv
        term = sigma.mul_(scaled_adv)
        rows = (term if per_token else term.mul_(mf)).sum(dim=-1)
        slope.mul_(adv if per_token else mf)
        return rows, slope.mul_(grad_factor), None
    elif v.gate == "cispo":  # md eq. (9): sg(clip(r)) A logp, slope clip(r) A
        slope = _cispo_weight(r, v).mul_(weight)
        rows = torch.linalg.vecdot(slope, logp)  # sum_t clip(r) A logp (slope zero at masked tokens)
        slope.mul_(grad_factor)
        return (rows if per_token else rows * row_adv), slope, None
    else:  # "none": r A, its own slope
        term = slope = r * weight
        rows = term.sum(dim=-1)
        return (rows if per_token else rows * row_adv), slope.mul_(grad_factor), None
    rows = term.mul_(weight).sum(dim=-1)  # the hard clip
    if not per_token:
        rows = rows * row_adv
    else:
        slope.mul_(adv)  # zero at masked positions
    return rows, slope.mul_(grad_factor), opened


def _unit_gate(variant, u: torch.Tensor, adv: torch.Tensor):
    """(term, d term / d u, gate open (0/1) or None, ratio) per sequence unit ``[N]`` (md eqs. (3)-(9));
    for CISPO the slope is d term / d unit log-prob and the term is formed by the caller."""
    v = variant
    ratio = torch.exp(u)
    positive = (adv > 0).to(u.dtype)
    if v.gate == "clip":
        clipped = _clip(ratio, positive, v)
        opened = (clipped == ratio).to(u.dtype)
        return clipped * adv, opened * ratio * adv, opened, ratio
    if v.gate == "sapo":
        full = adv.new_full
        tau = torch.where(adv > 0, full((), v.tau_pos), full((), v.tau_neg))
        scale = torch.where(adv > 0, full((), 4.0 / v.tau_pos), full((), 4.0 / v.tau_neg))
        sigma = torch.sigmoid(tau * (ratio - 1.0))
        return sigma * scale * adv, 4.0 * adv * sigma * (1.0 - sigma) * ratio, None, ratio
    if v.gate == "cispo":
        return None, _cispo_weight(ratio, v) * adv, None, ratio
    return ratio * adv, ratio * adv, None, ratio


def _ratio_extremes(r: torch.Tensor, unit_mask: torch.Tensor, mean: torch.Tensor, masked: bool):
    """The reference's ``aminmax(where(unit_mask, r, mean))`` (md section 5; ``unit_mask`` 0/1 or
    bool): masked units hold r = 1, so one ``aminmax`` of r gives the unmasked extremes wherever they
    are not 1 (the mean then lies between them); only otherwise are the masked units filled with the
    mean."""
    low, high = torch.aminmax(r)
    if not masked:
        return low, high
    if float(low) >= 1.0 or float(high) <= 1.0:
        low, high = torch.aminmax(torch.where(unit_mask != 0, r, mean))
    return torch.minimum(low, mean), torch.maximum(high, mean)


def closed_form_policy_loss(logp, old_logp, advantages, mask, variant, optional: dict, normalizer):
    """``policy_loss``'s ``(loss, metrics)`` (md eq. (12)) from inputs that ``check_policy_inputs`` has
    accepted, or None where the reference must decide (see the module docstring)."""
    if logp.device.type != "cpu" or logp.numel() == 0 or not _supported(variant, advantages, optional,
                                                                           normalizer):
        return None
    dtype = torch.promote_types(logp.dtype, torch.float32)
    mf = _float_mask(mask, dtype)
    if mf is None:
        return None
    lengths = mf.sum(dim=-1)
    local = _local_normalizer(lengths, variant)
    denominator = None if local is None else _denominator(normalizer, local)
    if denominator is None:
        return None
    with torch.no_grad():
        result = _compute(logp.detach().to(dtype), old_logp.detach().to(dtype), advantages.detach().to(dtype),
                          mf, lengths, local, denominator, variant, optional, dtype)
    if result is None:
        return None
    loss, metrics, grads = result
    entropy = optional["entropy"] if variant.entropy_coef > 0 else None
    kl = optional["kl"] if variant.kl_coef > 0 else None
    loss = _ClosedFormLoss.apply(loss, grads, logp, entropy, kl)
    return loss, metrics


def _compute(logp, old, advantages, mf, lengths, local, denominator, variant, optional, dtype):
    """(loss, metrics, (d/d logp, d/d entropy, d/d kl)) or None (a non-finite input, ratio or loss)."""
    v = variant
    n, t = logp.shape
    nonempty = lengths > 0
    lr = torch.sub(logp, old).mul_(mf)
    per_token_adv = advantages.ndim == 2
    adv = advantages * mf if per_token_adv else torch.where(nonempty, advantages, 0.0)
    given = {name: optional[name].detach().to(dtype) * mf for name in ("ref_logp", "entropy", "kl")
             if optional[name] is not None}
    sum_lr = lr.sum()
    checks = [sum_lr, adv.sum(), *(x.sum() for x in given.values())]
    if not bool(torch.isfinite(torch.stack(checks)).all()):
        return None
    tokens = lengths.sum().clamp(min=1.0)
    row_scale = math.sqrt(v.group_size) if v.aggregation == "seq_sqrt_token_mean" else 1.0
    length1 = lengths.clamp(min=1.0)
    # the weight of a token's term in its row's contribution (md eq. (10)), times sqrt(G)
    token_row = (row_scale / length1) if v.aggregation in _PER_SEQUENCE_MEAN else torch.full_like(
        lengths, row_scale)
    scale = -1.0 / denominator
    token_ratio = torch.exp(lr)  # every token's ratio: the metrics of token levels, approx_kl always
    sum_r = token_ratio.sum()
    if not bool(torch.isfinite(sum_r)):
        return None
    closed = lengths.new_zeros(())
    if v.ratio == "token":
        positive = (adv > 0).to(dtype)
        unit_adv = adv if per_token_adv else adv.unsqueeze(-1)
        positive = positive if per_token_adv else positive.unsqueeze(-1)
        rows, grad, opened = _token_units(v, token_ratio, mf, unit_adv, positive,
                                          (token_row * scale).unsqueeze(-1), logp)
        if opened is not None:
            closed = lengths.sum() - opened
        objective = rows.sum()
        policy = (rows * token_row).sum()
        units = tokens
        ratio_sum, unit_mask = sum_r - token_ratio.numel(), None
        ratio_max = token_ratio  # the units whose extremes are taken
    else:  # one unit per sequence (md eqs. (3)-(5)): everything per row, then broadcast
        total = lr.sum(dim=-1)
        if v.ratio in ("sequence_mean", "gspo_token"):
            total = total / length1
        row_adv = adv
        term, slope, opened, ratio = _unit_gate(v, total, row_adv)
        token_slope = 1.0 / length1 if v.ratio == "sequence_mean" else torch.ones_like(lengths)
        if v.gate == "cispo":
            unit_logp = torch.linalg.vecdot(mf, logp) * token_slope
            term = slope * unit_logp
        if v.ratio == "gspo_token":  # md eq. (5): the sequence ratio's value on every token, slope 1
            rows = term * lengths
            # a row's token mean of len_i copies of its term is the term itself
            copies = nonempty.to(dtype) if v.aggregation in _PER_SEQUENCE_MEAN else lengths
            policy = (term * copies).sum() * row_scale
            grad_rows = slope * token_row
            if opened is not None:
                closed = ((1.0 - opened) * lengths).sum()
            units = tokens
            ratio_sum = ((ratio - 1.0) * lengths).sum()
        else:
            copies = lengths if v.aggregation in _PER_TOKEN_COPIES else torch.ones_like(lengths)
            rows = term
            policy = (term * copies).sum() * row_scale
            grad_rows = slope * copies * token_slope * row_scale
            if opened is not None:
                closed = (1.0 - opened).sum()
            units = nonempty.sum(dtype=dtype).clamp(min=1.0)
            ratio_sum = (ratio - 1.0).sum()
        objective = rows.sum()
        grad = mf * (grad_rows * scale).unsqueeze(-1)
        unit_mask = nonempty
        ratio_max = ratio
    ratio_mean = 1.0 + ratio_sum / units
    # a masked unit: a masked token (token levels, GSPO-token) or an empty row (sequence levels)
    masked = bool((lengths < t).any()) if unit_mask is None or v.ratio == "gspo_token" else not bool(
        nonempty.all())
    ratio_min, ratio_max = _ratio_extremes(ratio_max, mf if unit_mask is None else unit_mask, ratio_mean,
                                           masked)
    if dtype == torch.float64:
        approx_kl = _exp_minus_one_minus_identity(lr).sum() / tokens
    else:  # k3 = expm1(l) - l in float64: exact to float32's roundoff however small l (no series)
        wide = lr.to(torch.float64)
        minus = wide.sum()
        approx_kl = ((wide.expm1_().sum() - minus) / tokens).to(dtype)

    contributions = -policy
    grad_entropy = grad_kl = None
    kl_tokens = given.get("kl")
    kl_slope = None
    if "ref_logp" in given:
        lp = logp * mf
        kl_tokens = _KL_FUNCTIONS[v.kl_estimator](lp, given["ref_logp"], check_finite=False)
        if v.kl_estimator == "k1":
            kl_slope = mf
        elif v.kl_estimator == "k2":
            kl_slope = lp - given["ref_logp"]
        else:
            kl_slope = -torch.expm1(given["ref_logp"] - lp)
    if kl_tokens is not None and v.kl_coef > 0:
        if v.kl_scale == "sequence":  # md eq. (19): u with (1/D) sum_i u KL_i = (1/S) sum_i KL_i
            if v.aggregation == "seq_sum":
                weight = torch.full_like(lengths, float(v.max_length))
            elif v.aggregation == "token_mean":
                weight = (local.clamp(min=1.0) / nonempty.sum(dtype=dtype).clamp(min=1.0)).expand_as(lengths)
            else:
                weight = torch.ones_like(lengths)
        else:
            weight = token_row
        kl_row = v.kl_coef * weight
        contributions = contributions + (kl_tokens.sum(dim=-1) * kl_row).sum()
        if kl_slope is not None:
            grad = grad - kl_slope * (kl_row * scale).unsqueeze(-1)
        else:
            grad_kl = mf * (kl_row * -scale).unsqueeze(-1)
    entropy_tokens = given.get("entropy")
    if entropy_tokens is not None and v.entropy_coef > 0:
        bonus_row = v.entropy_coef * token_row
        contributions = contributions - (entropy_tokens.sum(dim=-1) * bonus_row).sum()
        grad_entropy = mf * (bonus_row * scale).unsqueeze(-1)
    loss = contributions / denominator
    if not bool(torch.isfinite(loss)):
        return None
    metrics = {
        "policy_objective": objective / units,
        "clip_fraction": closed / units,
        "ratio_mean": ratio_mean,
        "ratio_min": ratio_min,
        "ratio_max": ratio_max,
        "approx_kl": approx_kl,
        "normalizer": denominator,
    }
    if kl_tokens is not None:
        metrics["kl"] = kl_tokens.sum() / tokens
    if entropy_tokens is not None:
        metrics["entropy"] = entropy_tokens.sum() / tokens
    return loss, metrics, (grad, grad_entropy, grad_kl)


class _ClosedFormLoss(torch.autograd.Function):
    """The loss whose gradient was computed with it: forward returns the value, backward the saved
    gradients (of ``logp``, and of ``entropy`` / ``kl`` where they enter the loss) times the incoming
    one, in each input's dtype."""

    @staticmethod
    def forward(ctx, loss, grads, logp, entropy, kl):
        ctx.grads = grads
        ctx.dtypes = tuple(None if x is None else x.dtype for x in (logp, entropy, kl))
        return loss.clone()

    @staticmethod
    def backward(ctx, grad_loss):
        out = [None, None]
        for saved, dtype, needed in zip(ctx.grads, ctx.dtypes, ctx.needs_input_grad[2:], strict=True):
            out.append((saved * grad_loss).to(dtype) if needed and saved is not None else None)
        return tuple(out)

"""The fused function of ``fused_policy_loss``: loss, metrics, guard flags and gradient in one function.

spec: specs/policy_losses.md eqs. (1)-(13), (15)-(19) (the loss of ``refimpl.losses.policy``, which
stays the readable reference). ``_fused(..., plan=...)`` is what ``refimpl.losses.fused_policy``
compiles (inductor fuses its elementwise work and row reductions into a few loops) or runs op by op:
each unit's derivative (md eqs. (6)-(9), (15), (16), (18)) times its aggregation weight ((10)-(11),
(19)) over the denominator, computed with the value, the metrics and the guard flags, which the
caller reads once. ``_Plan`` says what it computes (the variant and which optional inputs are
given): one compiled function per plan.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from refimpl.kl import _exp_minus_one_minus_identity, kl_k1, kl_k2, kl_k3
from refimpl.losses.policy import PolicyLossVariant, _sequence_kl_weight

_KL_FUNCTIONS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


class _Plan(NamedTuple):
    """What the fused function computes (a hashable key: one compiled function per plan)."""

    variant: PolicyLossVariant
    per_token_advantages: bool
    ref: bool  # ref_logp given
    behavior: bool  # behavior_logp given
    entropy: bool  # entropy given
    kl: bool  # exact kl given
    bool_mask: bool


def _kl_and_slope(lp: torch.Tensor, ref: torch.Tensor, estimator: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, dk / dlogp) per token for log r = ref - logp (specs/kl.md eqs. (2)-(4)): k1 has slope 1,
    k2 ``-log r``, k3 ``1 - r = -expm1(log r)``."""
    k = _KL_FUNCTIONS[estimator](lp, ref, check_finite=False)
    if estimator == "k1":
        return k, torch.ones_like(k)
    log_r = ref - lp
    return k, (-log_r if estimator == "k2" else -torch.expm1(log_r))


def _gate(plan: _Plan, u: torch.Tensor, ratio: torch.Tensor, adv: torch.Tensor, positive: torch.Tensor,
          unit_logp: torch.Tensor):
    """(term, d term / d u, gate open or None) per unit for the variant's gate (md eqs. (6)-(9)); for
    CISPO the slope is d term / d unit_logp. ``ratio`` is exp(u) (detached); ``positive`` is A > 0
    of the unweighted advantage. The same branch structure as the reference: exp only where the gate
    is open and A != 0, so a closed gate or a zero advantage never meets an overflowing ratio."""
    v = plan.variant
    full = functools.partial(adv.new_full, ())
    if v.gate == "clip":
        upper = math.inf if v.eps_high is None else 1.0 + v.eps_high
        lower = 0.0 if v.eps_low is None else 1.0 - v.eps_low
        negative_open = ratio >= lower
        negative_bound = full(lower)
        if v.dual_clip is not None:
            above = ratio > v.dual_clip
            negative_open = negative_open & ~above
            negative_bound = torch.where(above, v.dual_clip, negative_bound)
        gate = torch.where(positive, ratio <= upper, negative_open)
        bound = torch.where(positive, full(1.0 if v.eps_high is None else upper), negative_bound)
        live = gate & (adv != 0)
        r_open = torch.exp(torch.where(live, u, 0.0))
        return torch.where(gate, r_open, bound) * adv, torch.where(live, r_open * adv, 0.0), gate
    if v.gate == "sapo":  # md eq. (8); the slope (15) is 4 sigma (1 - sigma) r / tau * tau, 0 past the cap
        tau = torch.where(positive, full(v.tau_pos), v.tau_neg)
        scaled_adv = torch.where(positive, full(4.0 / v.tau_pos), 4.0 / v.tau_neg) * adv
        cap = math.log(torch.finfo(adv.dtype).max) - 1.0
        capped = u.clamp(max=cap)
        sigma = torch.sigmoid(tau * torch.expm1(capped))
        slope = torch.where(u <= cap, scaled_adv * (sigma * (1.0 - sigma)) * tau * torch.exp(capped), 0.0)
        return sigma * scaled_adv, slope, None
    if v.gate == "cispo":  # md eq. (9): sg(clip(r)) A logp_unit, slope clip(r) A in logp_unit
        weight = ratio
        if v.eps_low is not None or v.eps_high is not None:
            weight = weight.clamp(min=None if v.eps_low is None else 1.0 - v.eps_low,
                                  max=None if v.eps_high is None else 1.0 + v.eps_high)
        if v.eps_high is None:
            weight = torch.where(adv != 0, weight, 0.0)
        slope = weight * adv
        return slope * unit_logp, slope, None
    term = torch.exp(torch.where(adv != 0, u, 0.0)) * adv  # "none" / "log_clip": r A, its own slope
    return term, term, None


def _local_normalizer(lengths: torch.Tensor, v: PolicyLossVariant, max_length: torch.Tensor) -> torch.Tensor:
    """The local denominator (md eq. (11)) as ``policy._normalizer_from_lengths`` computes it, without
    its checks (they run once per plan, and the bound on the lengths is a flag of ``_fused``);
    ``max_length`` is L_max (a 0-d tensor: a runtime input, so a new L_max compiles nothing)."""
    if v.aggregation == "token_mean":
        return lengths.sum()
    sequences = (lengths > 0).sum(dtype=lengths.dtype)
    return sequences * max_length if v.aggregation == "seq_sum" else sequences


def _reduce(x: torch.Tensor, op) -> torch.Tensor:
    """``op`` over all of ``x``, rows first: every reduction over [N, T] is then a row reduction of
    the same loops, which inductor fuses into one pass also with dynamic shapes (a reduction over
    all N T elements gets a loop of its own there)."""
    return op(op(x, dim=-1)) if x.ndim == 2 else op(x)


def _fused(logp, old_logp, advantages, mask, ref_logp, behavior_logp, entropy, kl, normalizer, use_normalizer,
           max_length, plan: _Plan):
    """(loss, metrics vector, flags, d loss / d logp, d loss / d entropy, d loss / d kl) of
    ``policy_loss`` (the md equations cited in ``refimpl.losses.policy``; gradients None where the
    term is absent). ``normalizer`` is the denominator where the bool tensor ``use_normalizer`` is
    true, else the local one is used (one graph for both). ``flags`` are the guards, True when
    passed: the mask is 0/1, seq_sum's L_max bounds the lengths, each named input is finite at
    unmasked positions, the normaliser is finite and > 0, the loss is finite. (``normalizer`` and
    ``use_normalizer`` have shape [1]: a 0-d tensor input becomes a symbolic float for dynamo, and
    a restart of its analysis.)"""
    v = plan.variant
    normalizer, use_normalizer = normalizer.reshape(()), use_normalizer.reshape(())
    max_length = max_length.reshape(())
    dtype = torch.promote_types(logp.dtype, torch.float32)
    m = mask if mask.dtype == torch.bool else mask != 0  # a bool mask may come as 0.0 / 1.0: _as_input_mask
    mask_ok = m.new_ones(()) if plan.bool_mask else _reduce((mask == 0) | (mask == 1), torch.all)
    lengths = m.sum(dim=-1, dtype=dtype) if mask.dtype == torch.bool else mask.sum(dim=-1, dtype=dtype)
    nonempty = lengths > 0
    length1 = lengths.clamp(min=1.0)
    lp = torch.where(m, logp.to(dtype), 0.0)
    old = torch.where(m, old_logp.to(dtype), 0.0)
    adv = torch.where(m if plan.per_token_advantages else nonempty, advantages.to(dtype), 0.0)
    given = [torch.where(m, x.to(dtype), 0.0) if x is not None else None
             for x in (ref_logp, behavior_logp, entropy, kl)]
    ref, behavior, ent, exact_kl = given
    finite = [_reduce(torch.isfinite(x), torch.all) for x in (lp, old, adv, *given) if x is not None]

    log_ratio = lp - old
    token_level = not v.sequence_level
    positive_row = adv > 0
    positive = positive_row.unsqueeze(-1) if token_level and not plan.per_token_advantages else positive_row
    gated, log_slope = log_ratio, None
    if v.gate == "log_clip":  # md eq. (18): d l' / d l is the inclusive gate g'
        upper = math.inf if v.eps_high is None else v.eps_high
        lower = -math.inf if v.eps_low is None else -v.eps_low
        log_positive = positive_row.unsqueeze(-1) if not plan.per_token_advantages else positive_row
        log_slope = torch.where(log_positive, log_ratio <= upper, log_ratio >= lower)
        bound = torch.where(log_positive, log_ratio.new_full((), upper), lower)
        gated = torch.where(log_slope, log_ratio, bound)
    # units (md eqs. (2)-(5)): u, the detached ratio, the unit log-prob
    if v.ratio == "token":
        u, unit_logp = gated, lp
        ratio = torch.exp(u)
    elif v.ratio == "gspo_token":  # value log s_i on every token, d u_t / d logp_t = 1
        log_s = log_ratio.sum(dim=-1) / length1
        u, unit_logp = log_s.unsqueeze(-1).expand_as(lp), lp
        ratio = torch.where(m, torch.exp(log_s).unsqueeze(-1), 1.0)
    else:
        u, unit_logp = gated.sum(dim=-1), lp.sum(dim=-1)
        if v.ratio == "sequence_mean":
            u, unit_logp = u / length1, unit_logp / length1
        ratio = torch.exp(u)
    row_advantages = token_level and not plan.per_token_advantages
    unit_adv = torch.where(m, adv.unsqueeze(-1), 0.0) if row_advantages else adv
    if plan.behavior:  # md eq. (13): a detached weight on A, at the ratio's level
        log_w = old - behavior
        if v.sequence_level:
            log_w = log_w.sum(dim=-1)
            if v.ratio == "sequence_mean":
                log_w = log_w / length1
        log_cap = math.log(v.behavior_cap)
        weight = torch.exp(log_w.clamp(max=log_cap))
        if v.behavior_correction == "mask":
            weight = torch.where(log_w <= log_cap, weight, 0.0)
        unit_adv = unit_adv * weight
    term, slope, gate = _gate(plan, u, ratio, unit_adv, positive, unit_logp)

    # aggregation (md eq. (10)): contributions c_i as the reference forms them, and the factor
    # d c_i / d term that takes a unit's slope to c_i
    per_sequence_mean = v.aggregation in ("seq_mean_token_mean", "seq_sqrt_token_mean")
    row_scale = math.sqrt(v.group_size) if v.aggregation == "seq_sqrt_token_mean" else None
    ones = torch.ones_like(lengths)
    if v.sequence_level:
        units_sum = term
        policy_rows = term * lengths if v.per_token_copies else term
        row_factor = lengths if v.per_token_copies else ones
    else:
        units_sum = term.sum(dim=-1)
        policy_rows = units_sum / length1 if per_sequence_mean else units_sum
        row_factor = 1.0 / length1 if per_sequence_mean else ones
    if row_scale is not None:
        policy_rows, row_factor = policy_rows * row_scale, row_factor * row_scale
    contributions = -policy_rows
    # d u / d logp per token: the log-clip gate, and 1 / T_i for the sequence mean (md eqs. (3), (18))
    token_slope = slope
    if v.sequence_level:
        token_slope = (slope / length1 if v.ratio == "sequence_mean" else slope).unsqueeze(-1)
        token_slope = token_slope.expand_as(lp) if log_slope is None else token_slope * log_slope
    elif log_slope is not None:
        token_slope = torch.where(log_slope, slope, 0.0)
    grad_rows = -row_factor  # d c_i / d term (per row), times token_slope

    # regularisers (md eqs. (12), (19)); their slopes per token are added to the policy's
    kl_tokens, kl_slope = (exact_kl, None) if plan.kl else (None, None)
    if plan.ref:
        kl_tokens, kl_slope = _kl_and_slope(lp, ref, v.kl_estimator)
    local = _local_normalizer(lengths, v, max_length)
    extra_slope = None  # d c_i / d logp_t of the KL, per token
    kl_row = ent_row = None  # d c_i / d kl_t, d c_i / d entropy_t per row
    regularised = kl_tokens is not None and v.kl_coef > 0
    token_row = 1.0 / length1 if per_sequence_mean else ones  # md eq. (12): aggregated like the policy term
    if row_scale is not None:
        token_row = token_row * row_scale
    regulariser = None
    if regularised and v.kl_scale == "sequence":  # md eq. (19)
        # token_mean with normalizer= raised before; seq_sum's u = L_max, the runtime input
        weight = max_length if v.aggregation == "seq_sum" else _sequence_kl_weight(v, local, lengths, False)
        contributions = contributions + v.kl_coef * kl_tokens.sum(dim=-1) * weight
        kl_row = v.kl_coef * weight * ones
    elif regularised:
        kl_row, regulariser = v.kl_coef * token_row, v.kl_coef * kl_tokens
    if plan.entropy and v.entropy_coef > 0:
        ent_row = -v.entropy_coef * token_row
        bonus = v.entropy_coef * ent
        regulariser = -bonus if regulariser is None else regulariser - bonus
    if regulariser is not None:
        regulariser_rows = regulariser.sum(dim=-1)
        if per_sequence_mean:
            regulariser_rows = regulariser_rows / length1
        if row_scale is not None:
            regulariser_rows = regulariser_rows * row_scale
        contributions = contributions + regulariser_rows
    if kl_row is not None and kl_slope is not None:
        extra_slope = kl_row.unsqueeze(-1) * kl_slope
    denominator = torch.where(use_normalizer, normalizer, local.clamp(min=1.0))
    loss = contributions.sum() / denominator

    grad = grad_rows.unsqueeze(-1) * token_slope
    if extra_slope is not None:
        grad = grad + extra_slope
    grad_logp = torch.where(m, grad / denominator, 0.0)
    grad_entropy = None if ent_row is None else torch.where(m, (ent_row / denominator).unsqueeze(-1), 0.0)
    grad_kl = None
    if kl_row is not None and plan.kl:
        grad_kl = torch.where(m, (kl_row / denominator).unsqueeze(-1), 0.0)

    # metrics (as refimpl.losses.policy._metrics): units are tokens or non-empty sequences
    tokens = lengths.sum().clamp(min=1.0)
    unit_mask = nonempty if v.sequence_level else m
    units = nonempty.sum(dtype=dtype).clamp(min=1.0) if v.sequence_level else tokens
    ratio_mean = 1.0 + _reduce(ratio - 1.0, torch.sum) / units
    # the reference fills masked units with the mean before aminmax: the same min / max
    has_masked = _reduce(~unit_mask, torch.any)
    low = _reduce(torch.where(unit_mask, ratio, math.inf), torch.amin)
    high = _reduce(torch.where(unit_mask, ratio, -math.inf), torch.amax)
    ratio_min = torch.where(has_masked, torch.minimum(low, ratio_mean), low)
    ratio_max = torch.where(has_masked, torch.maximum(high, ratio_mean), high)
    closed = lengths.new_zeros(()) if gate is None else _reduce((~gate).to(dtype), torch.sum)
    metrics = [units_sum.sum() / units, closed / units, ratio_mean, ratio_min, ratio_max,
               _reduce(_exp_minus_one_minus_identity(log_ratio), torch.sum) / tokens, denominator]
    if kl_tokens is not None:
        metrics.append(_reduce(kl_tokens, torch.sum) / tokens)
    if ent is not None:
        metrics.append(_reduce(ent, torch.sum) / tokens)
    normalizer_ok = ~use_normalizer | (torch.isfinite(normalizer) & (normalizer > 0))
    max_length_ok = (lengths.max() <= max_length) if v.aggregation == "seq_sum" else m.new_ones(())
    flags = torch.stack([mask_ok, max_length_ok, *finite, normalizer_ok, torch.isfinite(loss)])
    return loss, torch.stack(metrics), flags, grad_logp, grad_entropy, grad_kl

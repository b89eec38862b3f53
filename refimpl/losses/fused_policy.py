"""The fast path of ``policy_loss``: the same loss, gradient, metrics and guards in a few fused passes.

spec: specs/policy_losses.md eqs. (1)-(13), (19) (the loss of ``refimpl.losses.policy``, which stays
the readable reference; tests/test_policy_loss_fast.py holds this module to it on every case class
of the conformance kit).

``fused_policy_loss(logp, old_logp, advantages, mask, variant, *, ref_logp=None, behavior_logp=None,
entropy=None, kl=None, normalizer=None, compile=True) -> (loss, metrics)`` takes ``policy_loss``'s
arguments and returns what it returns; ``compile`` picks ``torch.compile`` (C++ loops on a CPU,
Triton kernels on CUDA) or the same formulas run op by op.

Why it is faster: the reference lets autograd differentiate some twenty elementwise operations (with
their ``torch.where`` guards) forward and backward, about 80 passes over ``[N, T]``, and checks its
guards in separate reductions. Here the gradient is written out in closed form, each unit's
derivative (md eqs. (6)-(9), (15), (16), (18)) times its aggregation weight ((10)-(11), (19)) divided by
the denominator, and computed in the same function as the loss, the metrics and the guard flags,
which ``torch.compile`` fuses into a few loops; the backward pass multiplies the saved gradient by
the incoming one. The guards (a 0/1 mask, NaN / inf at unmasked positions, a positive normaliser,
an overflowing loss) are flags of that function, read once (one host synchronisation): a ValueError
naming the culprit, on every device.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from typing import NamedTuple

import torch

from refimpl.kl import _exp_minus_one_minus_identity, kl_k1, kl_k2, kl_k3
from refimpl.losses.policy import (
    PolicyLossVariant,
    _max_length_message,
    _normalizer_from_lengths,
    _sequence_kl_weight,
    check_policy_inputs,
    policy_loss,
)

__all__ = ["fused_policy_loss", "METRIC_NAMES"]

METRIC_NAMES = ("policy_objective", "clip_fraction", "ratio_mean", "ratio_min", "ratio_max",
                "approx_kl", "normalizer")
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


# ----------------------------------------------------------------------------------------------
# the fused computation: loss, metrics, guard flags and the gradient, from the inputs in one function


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
    flags = torch.cat([flags, flags.all().unsqueeze(0)])  # the last: all passed (one assertion on CUDA)
    return loss, torch.stack(metrics), flags, grad_logp, grad_entropy, grad_kl


# ----------------------------------------------------------------------------------------------
# compiled functions, the guard check, autograd


class _Compiled:
    """``torch.compile`` of ``_fused`` for one plan and dtypes: on its first call the sizes are
    marked dynamic (on aliases, not the caller's tensors), so that one graph serves every N, T >= 2
    (``fused_policy_loss`` runs smaller batches uncompiled instead of compiling sizes 1 apart).
    Unbacked sizes, which would cover sizes 1 too, give inductor's C++ loops that do not fuse (1.7x
    slower on the development machine). Each instance compiles its own copy of the function's code
    object: dynamo keeps graphs, and its limit on recompilations, per code object, so plans do not
    evict each other's graphs."""

    def __init__(self, plan: _Plan, device_type: str):
        def fused(*inputs):  # the plan a closure variable: its floats are constants to dynamo
            return _fused(*inputs, plan=plan)

        code = fused.__code__.replace()
        copy = types.FunctionType(code, fused.__globals__, "fused", None, fused.__closure__)
        self.fn = torch.compile(copy, fullgraph=True, options=_inductor_options(device_type))
        self.traced = False

    def __call__(self, *inputs):  # the [N, T] / [N] tensors, then the normaliser and its flag ([1])
        if not self.traced:
            inputs = tuple(None if x is None else _dynamic(x.detach()) for x in inputs[:8]) + inputs[8:]
            self.traced = True
        return self.fn(*inputs)


def _inductor_options(device_type: str) -> dict | None:
    """Inductor settings: scalar C++ loops (``cpp.simdlen`` 1) on a CPU where inductor finds no vector
    instruction set (e.g. ``ATEN_CPU_CAPABILITY=default``): there torch 2.13's C++ backend still emits
    16-lane ``at::vec`` reductions for dynamic shapes, without their header, and the compilation
    fails. None (the defaults) elsewhere."""
    if device_type != "cpu":
        return None
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa
    except ImportError:  # another torch: its defaults
        return None
    return None if pick_vec_isa() else {"cpp.simdlen": 1}


def _dynamic(x: torch.Tensor) -> torch.Tensor:
    torch._dynamo.mark_dynamic(x, list(range(x.ndim)))
    return x


@functools.cache
def _kernel(plan: _Plan, dtype: torch.dtype, mask_dtype: torch.dtype, device_type: str, compiled: bool):
    """The fused function for one plan, compiled or not."""
    return _Compiled(plan, device_type) if compiled else functools.partial(_fused, plan=plan)


@functools.cache
def _constant(value: float | bool, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A cached 0-d tensor: the placeholder normaliser and the flag that selects it, made once."""
    return torch.full((1,), value, dtype=dtype, device=device)


def _flag_messages(plan: _Plan, dtype: torch.dtype, max_length: int | None) -> list[str]:
    """The ValueError of each flag of ``_fused`` (the reference's wording)."""
    names = ["logp", "old_logp", "advantages"] + [
        name for name, present in (("ref_logp", plan.ref), ("behavior_logp", plan.behavior),
                                   ("entropy", plan.entropy), ("kl", plan.kl)) if present]
    hint = "" if dtype == torch.float64 else "; pass float64 logp"
    return ["mask must contain only 0 and 1",
            _max_length_message(max_length),
            *(f"{name} contains NaN or inf at unmasked positions" for name in names),
            "normalizer must be finite and > 0",
            f"the loss overflows {dtype} (a ratio exp(logp - old_logp), a KL term from ref_logp / kl, or "
            f"their sum exceeds its range at unmasked positions){hint}"]


def _check_flags(flags: torch.Tensor, plan: _Plan, dtype: torch.dtype, max_length: int | None) -> None:
    """One read of the guard flags (one host synchronisation on an accelerator): ValueError naming
    the first failed guard, in the reference's order, on every device. A device-side assertion
    (``torch._assert_async``) would save the synchronisation but leaves a CUDA context unusable after
    a failure and takes no message over 255 characters (seen on an H100), so it is not used."""
    passed = flags.tolist()
    if not all(passed):
        raise ValueError(_flag_messages(plan, dtype, max_length)[passed.index(False)])


class _FusedPolicyLoss(torch.autograd.Function):
    """Forward: the fused function (loss, metrics, the gradient saved); backward: the saved
    gradient times the incoming one. Differentiable inputs: logp, and entropy / kl when their
    coefficient is non-zero (as in the reference)."""

    @staticmethod
    def forward(ctx, kernel, plan, dtype, limit, mask, old_logp, advantages, ref_logp, behavior_logp,
                normalizer, use_normalizer, max_length, logp, entropy, kl):
        # every input in the compute dtype first (as the reference's first step): bf16 / fp16 / float32
        # inputs share one compiled graph
        inputs = (None if x is None else x.detach().to(dtype)
                  for x in (logp, old_logp, advantages, ref_logp, behavior_logp, entropy, kl))
        logp_, old_, advantages_, ref_, behavior_, entropy_, kl_ = inputs
        loss, metrics, flags, grad_logp, grad_entropy, grad_kl = kernel(
            logp_, old_, advantages_, mask, ref_, behavior_, entropy_, kl_, normalizer, use_normalizer,
            max_length)
        _check_flags(flags, plan, loss.dtype, limit)
        ctx.save_for_backward(grad_logp, grad_entropy, grad_kl)
        ctx.dtypes = tuple(None if x is None else x.dtype for x in (logp, entropy, kl))
        ctx.mark_non_differentiable(metrics)
        return loss, metrics

    @staticmethod
    def backward(ctx, grad_loss, _grad_metrics):
        grads = []
        needs = ctx.needs_input_grad[12:]  # logp, entropy, kl
        for saved, dtype, needed in zip(ctx.saved_tensors, ctx.dtypes, needs, strict=True):
            grads.append((grad_loss * saved).to(dtype) if needed and saved is not None else None)
        return (None,) * 12 + tuple(grads)


# ----------------------------------------------------------------------------------------------
# the entry point


def _normalizer_tensor(normalizer: object, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    if normalizer is None:
        return None
    if isinstance(normalizer, torch.Tensor):
        if normalizer.numel() != 1:
            raise ValueError(f"normalizer must be a scalar, got shape {tuple(normalizer.shape)}")
        return normalizer.detach().reshape(1).to(device=device, dtype=dtype)
    if isinstance(normalizer, (int, float)) and not isinstance(normalizer, bool):
        return torch.tensor([float(normalizer)], dtype=dtype, device=device)
    raise TypeError(f"normalizer must be None, a positive number or a scalar tensor, "
                    f"got {type(normalizer).__name__}")


def _as_input_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask on a CPU as 0.0 / 1.0 in ``dtype``: inductor's C++ loops load bool vectors an order
    of magnitude slower than floats (1.7 ms against 0.2 ms for a masked sum of 2**19 float32 on the
    development machine), and the conversion takes 0.1 ms. Other masks are passed as they are (their
    0 / 1 check needs the values)."""
    if mask.dtype != torch.bool or mask.device.type != "cpu":
        return mask
    return mask.view(torch.uint8).to(dtype)


def _detached(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x.detach()


@functools.cache
def _plan(variant: PolicyLossVariant, per_token_advantages: bool, ref: bool, behavior: bool, entropy: bool,
          kl: bool, bool_mask: bool, global_normalizer: bool) -> _Plan:
    """The plan, after the aggregation's checks of the variant (the reference's messages; cached, so
    they run once per plan)."""
    # the aggregation's own checks (max_length, group_size, the sequence KL)
    empty = torch.zeros(0, device="cpu")
    local = _normalizer_from_lengths(empty, variant)
    if variant.kl_scale == "sequence" and (ref or kl) and variant.kl_coef > 0:
        _sequence_kl_weight(variant, local, empty, global_normalizer)
    if variant.aggregation == "seq_sum":  # L_max is a runtime input of the kernel: one graph for every L_max
        variant = dataclasses.replace(variant, max_length=1)
    return _Plan(variant, per_token_advantages, ref, behavior, entropy, kl, bool_mask)


def fused_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    variant: PolicyLossVariant,
    *,
    ref_logp: torch.Tensor | None = None,
    behavior_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    normalizer: float | torch.Tensor | None = None,
    compile: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``policy_loss`` (spec: policy_losses.md eq. (12); the arguments, results, errors and edge
    cases of ``refimpl.losses.policy.policy_loss``), fused.

    ``compile=True`` runs the fused function through ``torch.compile`` (dynamic shapes; one graph
    per variant, set of optional inputs, compute dtype and device; on a CPU inductor needs a C++
    compiler); ``False``, and batches with N or T below 2, run the same formulas op by op. The loss
    is a scalar whose backward pass multiplies the closed-form gradient (computed with the loss) by
    the incoming gradient (first derivatives only); metrics are detached scalars. A batch with no
    elements is passed to the reference. Where several inputs are wrong at once, the error named
    first may differ from the reference's (the value checks are read together, after the others).
    """
    optional = {"ref_logp": ref_logp, "behavior_logp": behavior_logp, "entropy": entropy, "kl": kl}
    shape, device = check_policy_inputs(logp, old_logp, advantages, mask, variant, optional)
    if logp.numel() == 0:  # nothing to fuse (a shape fact, no host sync)
        return policy_loss(logp, old_logp, advantages, mask, variant, normalizer=normalizer, **optional)
    plan = _plan(variant, advantages.ndim == 2, ref_logp is not None, behavior_logp is not None,
                 entropy is not None, kl is not None, mask.dtype == torch.bool, normalizer is not None)
    dtype = torch.promote_types(logp.dtype, torch.float32)
    use_norm = _constant(normalizer is not None, torch.bool, device)
    if normalizer is None:
        norm = _constant(1.0, dtype, device)
    else:
        norm = _normalizer_tensor(normalizer, dtype, device)
    mask = _as_input_mask(mask, dtype)
    max_length = _constant(float(variant.max_length or 1), dtype, device)
    kernel = _kernel(plan, dtype, mask.dtype, device.type, compile and min(shape) >= 2)
    # entropy and kl are differentiable inputs only where they enter the loss (as in the reference)
    differentiable_entropy = entropy if variant.entropy_coef > 0 else _detached(entropy)
    differentiable_kl = kl if variant.kl_coef > 0 else _detached(kl)
    loss, metrics = _FusedPolicyLoss.apply(
        kernel, plan, dtype, variant.max_length, mask, old_logp.detach(), advantages.detach(),
        _detached(ref_logp), _detached(behavior_logp), norm, use_norm, max_length, logp,
        differentiable_entropy, differentiable_kl)
    names = METRIC_NAMES + (("kl",) if ref_logp is not None or kl is not None else ()) + (
        ("entropy",) if entropy is not None else ())
    return loss, dict(zip(names, metrics.unbind(), strict=True))

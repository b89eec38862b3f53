"""Expected values of the kit: the spec's implementation with a convention's flags applied.

One interpreter turns a ``Convention`` (data) into calls of the verified building blocks:
``reference_policy_loss`` (the spec op by op, with ``normalizer=`` and ``kl=``: the kit's expected
values do not go through ``policy_loss``'s closed form, which is proven equal to it),
``group_advantages``, ``kl_k1/k2/k3`` and a
float64 ``log_softmax``. Every expected value is computed in float64 from the case's inputs
(half-precision inputs are first rounded, then upcast), with the gradient by autograd, on the
device the case's tensors are on: a check on a device computes its expected values in float64 on
the same device (``engine.run_cases`` moves the case there and the values back to the CPU), so the
reference evaluates ``exp`` where the checked function does, e.g. a ratio that the device's ``exp``
rounds a unit in the last place past a clip bound is past it in both. Every tensor made here
follows its inputs' device; the normalisers and float32-rounded constants are host numbers, which
every device rounds alike (IEEE division and rounding to nearest).

How each flag is realised (spec: policy_losses.md eqs. (2)-(12)):

* ``log_ratio_clamp c``: ``logp`` is replaced by ``old + clamp(logp - old, -c, c)`` where the clamp
  is active (zero gradient there, as in ``torch.clamp``) and left bit-identical elsewhere. CISPO
  (gate "cispo") has its ratio only inside the detached weight ``sg(clip(exp(logp - old)))`` and
  ``logp`` raw in ``A * logp`` (verl's ``compute_policy_loss_cispo``): there ``old_logp`` is
  replaced instead, by the detached ``logp - clamp(logp - old, -c, c)`` where the clamp is active
  (the weight then sees the clamped log-ratio, to one rounding of ``logp - c``), and ``logp`` with
  its gradient stays raw; GSPO-token (eq. (5)) has its log-ratios only inside the detached ``log s``:
  the clamped ``logp`` keeps its value there and the raw ``logp``'s gradient (Tunix, algo_core.py:414-425);
* ``sequence_log_ratio_cap c`` (GSPO-token): rows whose ``log s_i`` exceeds c get a detached
  ``logp`` shifted so that ``log s_i = c``;
* ``dual_clip``: ``variant.dual_clip`` for token-level hard clips;
* ``kl_log_ratio_clamp`` / ``kl_value_clamp`` / ``kl_log_ratio_max`` / ``kl_k3_form`` /
  ``kl_value_clamp_scope`` / ``kl_compute_dtype``: the KL term is built here and passed as ``kl=``;
* ``normalizer_rounding``: the denominator rounded as ``rounded_normalizer`` says;
* ``kl_aggregation="token_mean"``: the KL term is ``_token_mean_kl_term`` (a global token mean in
  the KL's compute dtype, also under ``micro_batch="local_sum"``; a local one under "local_mean",
  whose micro-batch losses are averaged) added to the policy term of the variant's own aggregation;
* ``kl_aggregation="row_mean_all_rows"``: the KL term is ``_row_mean_kl_term`` (each row's token mean,
  averaged over every row of the step, or of the micro-batch under "local_mean"), likewise added;
* ``empty_rows`` / ``seq_sum_width`` / ``seq_sum_extra`` / ``token_sum_rows`` / ``micro_batch``: the
  denominator
  passed as ``normalizer=`` (``token_sum_rows`` for seq_sum and seq_mean_token_sum, ``empty_rows``
  for the other sequence means);
* ``sequence_ratio_gradient="token"``: ``ratio="gspo_token"`` with the seq-mean-token-mean
  aggregation (the GSPO-token form of the same value);
* ``sapo_tau_float32``: the variant's SAPO temperatures rounded to float32 (``effective_variant``);
* ``kl_importance_weight``: the per-token KL is multiplied by the differentiated unit ratio and
  passed as ``kl=``.
* ``compute_dtype``: never changes the expected value (always the exact float64 value on the
  rounded inputs); it selects the unit roundoff of the half-precision tolerance
  (``tolerance.half_tolerance``) and, under "input", allows a non-finite loss where the computation
  in the input dtype may overflow;
* ``masked_nonfinite="propagate"``: where ``masked_nonfinite_reaches_loss`` holds, a non-finite
  loss is the framework's expected (named) behaviour;
* ``adv_leave_one_out``: ``group_advantages(leave_one_out=True)`` (RLOO).
* ``micro_batch="local_sum"``: each micro-batch divided by its own normaliser, losses summed;
* ``kl_gradient="k2"``: the KL term's value, with the k2 gradient (straight-through);
* ``adv_leave_one_out`` / ``adv_singleton_float32``: ``group_advantages(leave_one_out=...)``, and
  singletons re-divided by ``float32(1 + eps)``.
"""

from __future__ import annotations

import dataclasses

import torch

from refimpl.advantages import _group_is_constant, group_advantages
from refimpl.kl import kl_k1, kl_k2, kl_k3
from refimpl.losses import PolicyLossVariant
from refimpl.losses.policy import reference_policy_loss

from .case_types import AdvantageCase, KLCase, LogprobCase, PolicyLossCase
from .conventions import Convention
from .evaluated_ratio import evaluated_ratio_logp, evaluated_weight_old

__all__ = [
    "effective_variant",
    "convention_normalizer",
    "convention_loss",
    "expected_policy_loss",
    "expected_group_advantages",
    "expected_kl",
    "masked_nonfinite_reaches_loss",
    "expected_token_logprobs",
]

_KL = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def effective_variant(variant: PolicyLossVariant, convention: Convention) -> PolicyLossVariant:
    """The variant a framework with ``convention`` actually runs for ``variant``."""
    v = variant
    if convention.fixed_aggregation is not None and v.aggregation != convention.fixed_aggregation:
        v = dataclasses.replace(v, aggregation=convention.fixed_aggregation)
    if convention.cispo_clip_low is not None and v.gate == "cispo" and v.eps_low is None:
        v = dataclasses.replace(v, eps_low=float(convention.cispo_clip_low))
    if convention.dual_clip is not None and v.gate == "clip" and v.ratio == "token" and v.dual_clip is None:
        v = dataclasses.replace(v, dual_clip=max(convention.dual_clip, 1.0 + (v.eps_high or 0.0)))
    if convention.sapo_tau_float32 and v.gate == "sapo":
        v = dataclasses.replace(v, tau_pos=_float32(v.tau_pos), tau_neg=_float32(v.tau_neg))
    if v.ratio == "sequence_mean" and convention.sequence_ratio_gradient == "token":
        aggregation = "seq_mean_token_mean" if v.aggregation == "seq_mean" else v.aggregation
        v = dataclasses.replace(v, ratio="gspo_token", aggregation=aggregation)
    return v


def _host32(x: float) -> torch.Tensor:
    """``x`` as a float32 host number (a CPU tensor, whatever torch's default device)."""
    return torch.tensor(x, dtype=torch.float32, device="cpu")


def _float32(x: float) -> float:
    """``x`` rounded to the nearest float32 (TRL's temperatures, ``sapo_tau_float32``)."""
    return float(_host32(x))


def _importance_weighted_kl(kl_tokens, logp, old, mask, variant: PolicyLossVariant) -> torch.Tensor:
    """``kl_tokens * r`` with the unit's differentiated importance ratio ``r`` (``kl_importance_weight``):
    ``exp(logp - old)`` per token, or GSPO's ``exp(mean_t (logp - old))`` on every token of the row."""
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    log_ratio = torch.where(mask, logp - old, zero)
    if variant.ratio == "sequence_mean":
        lengths = mask.sum(-1, dtype=logp.dtype).clamp(min=1.0)
        log_ratio = (log_ratio.sum(-1) / lengths).unsqueeze(-1).expand_as(logp)
    elif variant.ratio != "token":
        raise ValueError(f"kl_importance_weight supports ratio 'token' or 'sequence_mean', "
                         f"got {variant.ratio!r}")
    return torch.where(mask, kl_tokens * torch.exp(log_ratio), zero)


def convention_normalizer(mask: torch.Tensor, variant: PolicyLossVariant, convention: Convention) -> float:
    """The local denominator of ``variant.aggregation`` under ``convention`` (md eq. (11) with the
    ``empty_rows``, ``token_sum_rows`` and ``seq_sum_width`` flags). ``mask`` is ``[n, T]`` bool."""
    if variant.aggregation == "token_mean":
        return float(mask.sum())
    nonempty, every = float(mask.any(dim=-1).sum()), float(mask.shape[0])
    if variant.aggregation not in ("seq_sum", "seq_mean_token_sum"):
        return nonempty if convention.empty_rows == "drop" else every
    # the rows the token sums count ("none": verl's token-sum, no denominator)
    rows = {"nonempty": nonempty, "all": every, "none": 1.0}[convention.token_sum_rows]
    if variant.aggregation == "seq_mean_token_sum":
        return rows
    width = variant.max_length if convention.seq_sum_width == "max_length" else mask.shape[-1]
    if width is None:
        raise ValueError("variant.max_length (L_max) is required by aggregation 'seq_sum'")
    return rows * (width + convention.seq_sum_extra)


def _kl_denominator(count: float, micro_batches: int, convention: Convention) -> tuple[float, int]:
    """(per-step count, micro-batches) of a KL term aggregated apart (its tokens or rows, ``_kl_count``):
    exact ``(count, 1)`` or, under ``normalizer_rounding="float32_per_micro_batch"``,
    ``(float32(count) / mb, mb)``."""
    if convention.normalizer_rounding != "float32_per_micro_batch":
        return count, 1
    return float(_host32(count) / micro_batches), micro_batches


def rounded_normalizer(
    denominator: float, micro_batches: int, convention: Convention, own: float | None = None
) -> float:
    """The denominator a framework effectively divides by (flag ``normalizer_rounding``): exact;
    ``micro_batches * float32(float32(denominator) / micro_batches)`` (OpenRLHF's
    ``_optimizer_step_loss_norm`` divides the float32 count by the accumulation steps, DeepSpeed
    divides each micro-batch loss by them again); or, for a micro-batch whose own normaliser is
    ``own``, ``own / float32(own / denominator)`` (AReaL: its local mean times the float32 weight
    ``own / total``)."""
    if convention.normalizer_rounding == "exact":
        return denominator
    if convention.normalizer_rounding == "float32_weight":
        if not own or not denominator:
            return denominator
        weight = _host32(own) / _host32(denominator)
        return own / float(weight)
    per_step = _host32(denominator) / micro_batches
    return micro_batches * float(per_step)


def _clamped_logp(logp: torch.Tensor, old: torch.Tensor, clamp: float | None) -> torch.Tensor:
    if clamp is None:
        return logp
    diff = logp - old
    clamped = old + diff.clamp(-clamp, clamp)
    return torch.where(diff.abs() > clamp, clamped, logp)


def _clamped_weight_old(logp: torch.Tensor, old: torch.Tensor, clamp: float | None) -> torch.Tensor:
    """CISPO's ``log_ratio_clamp``: ``old`` replaced by the detached ``logp - clamp(logp - old, -c, c)``
    where the clamp is active (bit-identical elsewhere), so that the detached weight
    ``exp(logp - old)`` sees the clamped log-ratio while ``A * logp`` keeps the raw ``logp``."""
    if clamp is None:
        return old
    diff = logp - old
    shifted = (logp - diff.clamp(-clamp, clamp)).detach()
    return torch.where(diff.abs() > clamp, shifted, old)


def _capped_sequence_logp(logp, old, mask, cap: float | None):
    if cap is None:
        return logp
    m = mask.to(logp.dtype)
    log_s = ((logp - old) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    over = (log_s > cap).unsqueeze(-1)
    shifted = (logp - (log_s - cap).unsqueeze(-1)).detach()
    return torch.where(over, shifted, logp)


def _k3_of_log_ratio(log_r: torch.Tensor, form: str) -> torch.Tensor:
    """k3 = r - 1 - log r from ``log r`` (kl.md eq. (4)): "accurate" (refimpl.kl) or "naive"
    ``exp(log r) - 1 - log r`` evaluated directly (flag ``kl_k3_form``), both in at least float32
    (as refimpl.kl computes; the expected values are float64 anyway)."""
    if form == "naive":
        log_r = log_r.to(torch.promote_types(log_r.dtype, torch.float32))
        return torch.exp(log_r) - 1 - log_r
    return kl_k3(torch.zeros_like(log_r), log_r, check_finite=False)


def _kl_tokens(logp, ref, variant: PolicyLossVariant, convention: Convention, mask) -> torch.Tensor:
    """Per-token KL estimate with the KL flags: ``kl_compute_dtype`` (float32 inputs),
    ``kl_log_ratio_clamp`` / ``kl_log_ratio_max`` / ``kl_k3_form`` (k3 only) and
    ``kl_value_clamp`` (k3 only or every estimator, ``kl_value_clamp_scope``)."""
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    logp_m = torch.where(mask, logp, zero)
    ref_m = torch.where(mask, ref, zero)
    if convention.kl_compute_dtype == "float32":
        logp_m, ref_m = logp_m.float(), ref_m.float()
    k3 = variant.kl_estimator == "k3"
    if k3 and (
        convention.kl_log_ratio_clamp is not None
        or convention.kl_log_ratio_max is not None
        or convention.kl_k3_form != "accurate"
    ):
        log_r = ref_m - logp_m
        if convention.kl_log_ratio_clamp is not None:
            log_r = log_r.clamp(-convention.kl_log_ratio_clamp, convention.kl_log_ratio_clamp)
        if convention.kl_log_ratio_max is not None:
            log_r = log_r.clamp(max=convention.kl_log_ratio_max)
        value = _k3_of_log_ratio(log_r, convention.kl_k3_form)
    else:  # k3 at log r = +inf (a token the policy gives probability 0): its limits, value inf, slope -inf
        value = _KL[variant.kl_estimator](logp_m, ref_m, check_finite=False)
    if convention.kl_value_clamp is not None and (
        (k3 and convention.kl_value_clamp_scope != "weighted") or convention.kl_value_clamp_scope == "all"
    ):
        value = value.clamp(-convention.kl_value_clamp, convention.kl_value_clamp)
    if convention.kl_gradient == "k2":
        value = _k2_straight_through(value, logp_m, ref_m)
    elif convention.kl_gradient == "none":
        value = value.detach()
    return value


def _k2_straight_through(value: torch.Tensor, logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``value`` forward, the k2 gradient ``logp - ref`` backward (flag ``kl_gradient="k2"``)."""
    k2 = kl_k2(logp, ref, check_finite=False)
    return value.detach() + (k2 - k2.detach())


def _kl_count(mask: torch.Tensor, convention: Convention) -> float:
    """What a KL term aggregated apart from the policy term divides by: every row of ``mask``
    (``kl_aggregation="row_mean_all_rows"``) or its tokens ("token_mean")."""
    return float(mask.shape[0]) if convention.kl_aggregation == "row_mean_all_rows" else float(mask.sum())


def _row_mean_kl_term(logp, ref, mask, variant, convention, kl_denominator) -> torch.Tensor:
    """``kl_coef * sum_i [sum_t mask KL_{i,t} / max(T_i, 1)] / rows / micro_batches`` with
    ``kl_denominator = (rows, micro_batches)`` (default: this batch's rows, 1), reduced in the KL's
    compute dtype (flag ``kl_aggregation="row_mean_all_rows"``): policy_losses.md eq. (12)'s KL under
    the seq_mean_token_mean aggregation with D the number of rows, an empty row counting 0 (the spec's
    D, eq. (11), and S of eq. (19) count the non-empty rows only)."""
    kl = _kl_tokens(logp, ref, variant, convention, mask)
    row_means = (kl * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    rows, micro_batches = kl_denominator if kl_denominator is not None else (float(mask.shape[0]), 1)
    denominator = torch.tensor(rows if rows > 0 else 1.0, dtype=kl.dtype, device=kl.device)
    return (row_means.sum() / denominator * variant.kl_coef).to(torch.float64) / micro_batches


def _token_mean_kl_term(logp, ref, mask, variant, convention, kl_denominator) -> torch.Tensor:
    """``kl_coef * sum(kl) / per_step / micro_batches`` with ``kl_denominator = (per_step,
    micro_batches)`` (default: this batch's token count, 1), reduced in the KL's compute dtype
    (flag ``kl_aggregation="token_mean"``)."""
    kl = _kl_tokens(logp, ref, variant, convention, mask)
    per_step, micro_batches = kl_denominator if kl_denominator is not None else (float(mask.sum()), 1)
    denominator = torch.tensor(per_step if per_step > 0 else 1.0, dtype=kl.dtype, device=kl.device)
    term = (kl * mask).sum() / denominator
    return (term * variant.kl_coef).to(torch.float64) / micro_batches


def convention_loss(
    logp, old, adv, mask, ref, variant, convention, normalizer, kl_denominator=None,
    input_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """The loss of one (micro-)batch under ``convention`` with denominator ``normalizer`` (md eq. (12)
    with the flags of the module docstring); ``variant`` is already effective. ``kl_denominator``
    (per-step count, micro-batches) is the KL term's under a ``kl_aggregation`` other than "policy"
    (tokens for "token_mean", rows for "row_mean_all_rows"); ``input_dtype`` the case's (float32
    inputs have their ratio evaluated in float32)."""
    if ref is not None and variant.kl_coef > 0 and convention.kl_aggregation != "policy":
        policy = convention_loss(
            logp, old, adv, mask, None, dataclasses.replace(variant, kl_coef=0.0), convention, normalizer,
            input_dtype=input_dtype,
        )
        term = _token_mean_kl_term if convention.kl_aggregation == "token_mean" else _row_mean_kl_term
        return policy + term(logp, ref, mask, variant, convention, kl_denominator)
    clamped_logp = _clamped_logp(logp, old, convention.log_ratio_clamp)
    # CISPO: the clamp acts inside the detached weight only; A * logp keeps logp and its gradient
    cispo = variant.gate == "cispo"
    if variant.ratio == "gspo_token" and convention.log_ratio_clamp is not None:
        clamped_logp = clamped_logp.detach() + (logp - logp.detach())  # the clamp inside sg(log s) only
    if not cispo:
        clamped_logp = evaluated_ratio_logp(clamped_logp, old, adv, mask, variant, convention, input_dtype)
    ratio_logp = logp if cispo else clamped_logp
    ratio_old = _clamped_weight_old(logp, old, convention.log_ratio_clamp) if cispo else old
    if cispo:
        ratio_old = evaluated_weight_old(logp, ratio_old, mask, convention, input_dtype)
    if variant.ratio == "gspo_token":
        ratio_logp = _capped_sequence_logp(ratio_logp, old, mask, convention.sequence_log_ratio_cap)
    clamps_kl = (
        convention.kl_log_ratio_clamp is not None
        or convention.kl_value_clamp is not None
        or convention.kl_log_ratio_max is not None
        or convention.kl_k3_form != "accurate"
        or convention.kl_compute_dtype != "input"
    )
    kwargs = {}
    if ref is not None and variant.kl_coef > 0:
        if convention.kl_importance_weight:
            kl = _kl_tokens(logp, ref, variant, convention, mask)
            weight_logp = clamped_logp if cispo else ratio_logp
            kwargs["kl"] = _importance_weighted_kl(kl, weight_logp, old, mask, variant)
            if convention.kl_value_clamp is not None and convention.kl_value_clamp_scope == "weighted":
                kwargs["kl"] = kwargs["kl"].clamp(-convention.kl_value_clamp, convention.kl_value_clamp)
        elif clamps_kl or ratio_logp is not logp:
            kwargs["kl"] = _kl_tokens(logp, ref, variant, convention, mask)
        else:
            kwargs["ref_logp"] = ref
    # the spec's D >= 1 (an empty batch has loss 0) is the count's: a framework's rounded count is divided
    # by as it is (OpenRLHF: one token over 25 micro-batches, 25 float32(1 / 25) = 1 - 2.2e-8)
    denominator = normalizer if normalizer > 0 else 1.0
    loss, _ = reference_policy_loss(ratio_logp, ratio_old, adv, mask, variant, normalizer=denominator,
                                    **kwargs)
    return loss


def expected_policy_loss(
    case: PolicyLossCase, variant: PolicyLossVariant, convention: Convention
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, d loss / d logp) in float64 for ``case`` under ``convention``.

    ``variant`` must already be ``effective_variant(preset, convention)``. Micro-batches: with
    ``micro_batch="global"`` each part is divided by the summed local normalisers and the losses are
    summed; with ``"local_mean"`` each part is a local mean and the losses are averaged.
    """
    logp = case.logp.detach().to(torch.float64).requires_grad_(True)
    old = case.old_logp.to(torch.float64)
    adv = case.advantages.to(torch.float64)
    ref = None if case.ref_logp is None else case.ref_logp.to(torch.float64)
    parts = case.micro_batches or (tuple(range(case.logp.shape[0])),)
    index = [torch.tensor(p, dtype=torch.long, device=logp.device) for p in parts]
    local = [convention_normalizer(case.mask[i], variant, convention) for i in index]
    kl_counts = [_kl_count(case.mask[i], convention) for i in index]
    total = torch.zeros((), dtype=torch.float64, device=logp.device)
    for i, own, own_kl in zip(index, local, kl_counts, strict=True):
        denominator = sum(local) if convention.micro_batch == "global" else own
        denominator = rounded_normalizer(denominator, len(parts), convention, own)
        total = total + convention_loss(
            logp[i],
            old[i],
            adv[i],
            case.mask[i],
            None if ref is None else ref[i],
            variant,
            convention,
            denominator,
            _kl_denominator(own_kl if convention.micro_batch == "local_mean" else sum(kl_counts),
                            len(parts), convention),
            input_dtype=case.logp.dtype,
        )
    if convention.micro_batch == "local_mean":
        total = total / len(parts)
    (grad,) = torch.autograd.grad(total, logp)
    return total.detach(), grad


def expected_group_advantages(case: AdvantageCase, convention: Convention) -> torch.Tensor:
    """``group_advantages`` with the convention's flags, float64 (raises where the convention does):
    ``adv_scale`` "group" or "batch_rewards" (advantages.md eq. (5), (14)), ``adv_singleton`` incl.
    verl's "raw" (eq. (15))."""
    if convention.adv_compute_dtype == "float32":
        return _float32_group_advantages(case, convention)
    loo = {"leave_one_out": True} if convention.adv_leave_one_out else {}
    if convention.adv_scale == "none":
        return group_advantages(
            case.rewards.double(), case.group_ids, scale="none", singleton=convention.adv_singleton, **loo
        )
    advantages = group_advantages(
        case.rewards.double(),
        case.group_ids,
        scale=convention.adv_scale,
        std=convention.adv_std,
        eps=convention.adv_eps,
        eps_inside_sqrt=convention.adv_eps_inside_sqrt,
        zero_variance=convention.adv_zero_variance,
        singleton=convention.adv_singleton,
        **loo,
    )
    if convention.adv_singleton_float32 and convention.adv_singleton == "raw":
        advantages = _float32_singleton_divisor(case, advantages, convention)
    return advantages


def _float32_group_advantages(case: AdvantageCase, convention: Convention) -> torch.Tensor:
    """Group advantages (advantages.md eq. (5) with the convention's sample / population std and
    ``std + eps``) whose group statistics are float32 (flag ``adv_compute_dtype``): rewards rounded
    to float32, per-group sums accumulated in index order, ``mean = sum / n``, the variance from the
    centred rewards, a singleton's mean 0 and std 1 (``adv_singleton="raw"``); then
    ``(R - mean) / float32(std + eps)`` on the unrounded rewards. ``adv_singleton="error"`` raises
    and ``adv_zero_variance="zero"`` gives a constant group 0 (its rewards compared exactly), as in
    float64."""
    if convention.adv_leave_one_out or convention.adv_scale != "group" or convention.adv_eps_inside_sqrt:
        raise ValueError("adv_compute_dtype='float32' is defined for adv_scale 'group' with std + eps")
    scores = case.rewards.to(torch.float32)
    _, index = torch.unique(case.group_ids, return_inverse=True)
    groups = int(index.max()) + 1 if index.numel() else 0
    zeros = torch.zeros(groups, dtype=torch.float32, device=scores.device)
    count = zeros.clone().index_add_(0, index, torch.ones_like(scores))
    mean = zeros.clone().index_add_(0, index, scores) / count  # every group has a reward: count >= 1
    centred = scores - mean[index]
    squares = zeros.clone().index_add_(0, index, centred * centred)
    divisor = (count - 1.0).clamp_min(1.0) if convention.adv_std == "sample" else count
    std = torch.sqrt(squares / divisor)
    single = count <= 1.0
    if convention.adv_singleton == "error" and bool(single[index].any()):
        raise ValueError("a group has a single sample (singleton='error'); pass singleton='zero' "
                         "to give such samples advantage 0")
    if convention.adv_singleton == "raw":
        mean, std = torch.where(single, 0.0, mean), torch.where(single, 1.0, std)
    rewards = case.rewards.double()  # the advantage itself is formed in the rewards' dtype
    advantages = (rewards - mean[index].double()) / (std[index] + convention.adv_eps).double()
    if convention.adv_singleton == "zero":
        advantages = torch.where(single[index], 0.0, advantages)
    if convention.adv_zero_variance == "zero":  # eq. (5)'s constant group: its rewards equal exactly
        constant = _group_is_constant(rewards, index, groups)
        advantages = torch.where(constant[index] & ~single[index], 0.0, advantages)
    return advantages


def _float32_singleton_divisor(case: AdvantageCase, advantages: torch.Tensor, convention: Convention):
    """Singletons as ``R / float32(1 + eps)`` (flag ``adv_singleton_float32``; eq. (15) with the
    divisor rounded to float32, as verl's float32 std tensor makes it)."""
    _, inverse, counts = torch.unique(case.group_ids, return_inverse=True, return_counts=True)
    singleton = counts[inverse] == 1
    one = torch.ones((), dtype=torch.float32, device=case.rewards.device)
    divisor = (torch.sqrt(one + convention.adv_eps) if convention.adv_eps_inside_sqrt
               else one + convention.adv_eps).double()
    return torch.where(singleton, case.rewards.double() / divisor, advantages)


def masked_nonfinite_reaches_loss(case: PolicyLossCase, variant: PolicyLossVariant) -> bool:
    """True when a masked position of an input the loss reads (logp, old_logp; ref_logp when the
    variant has a KL term) holds NaN or inf: under ``masked_nonfinite="propagate"`` the loss may
    then be non-finite (``0 * nan``); under "ignore" (the spec) it never is."""
    tensors = [case.logp, case.old_logp]
    if case.ref_logp is not None and variant.kl_coef > 0:
        tensors.append(case.ref_logp)
    return any(bool((~torch.isfinite(x.double()) & ~case.mask).any()) for x in tensors)


def expected_kl(case: KLCase, estimator: str, convention: Convention) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token KL estimate, its derivative in logp) in float64 (spec: kl.md eqs. (1)-(4))."""
    logp = case.logp.double().requires_grad_(True)
    ref = case.ref_logp.double()
    mask = torch.ones_like(logp, dtype=torch.bool)
    variant = PolicyLossVariant(kl_estimator=estimator)
    value = _kl_tokens(logp, ref, variant, convention, mask)
    if not value.requires_grad:  # kl_gradient="none"
        return value.detach(), torch.zeros_like(logp)
    (grad,) = torch.autograd.grad(value.sum(), logp)
    return value.detach(), grad


def expected_token_logprobs(case: LogprobCase) -> tuple[torch.Tensor, torch.Tensor]:
    """(``log_softmax(logits).gather(tokens)``, gradient of ``sum(weights * out)`` in the logits),
    float64."""
    logits = case.logits.double().requires_grad_(True)
    out = torch.log_softmax(logits, dim=-1).gather(-1, case.tokens.unsqueeze(-1)).squeeze(-1)
    (grad,) = torch.autograd.grad((out * case.weights).sum(), logits)
    return out.detach(), grad

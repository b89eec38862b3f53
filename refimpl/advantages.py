"""Group-relative (critic-free) advantages and DAPO's sample filters (spec: specs/advantages.md).

``group_advantages`` covers every group convention in use, each chosen explicitly:

============================  =====================================================================
convention                    arguments
============================  =====================================================================
GRPO (Shao et al. 2024)       scale="group", std="population", eps=e, eps_inside_sqrt=True
TRL GRPOTrainer               scale="group", std="sample", eps=1e-4, eps_inside_sqrt=False
TRL scale_rewards="batch"     scale="batch_rewards", std="sample", eps=1e-4, eps_inside_sqrt=False
verl GRPO                     scale="group", std="sample", eps=1e-6, eps_inside_sqrt=False,
                              singleton="raw"
Dr. GRPO                      scale="none"
RLOO                          scale="none", leave_one_out=True
Magistral                     scale="batch", std=..., eps=..., eps_inside_sqrt=...
============================  =====================================================================

Groups are given by ``group_ids [N]`` (any integers; groups may differ in size and need not be
contiguous). Everything is vectorised with ``index_add``/``scatter_reduce``: no loop over groups.
"""

from __future__ import annotations

import math

import torch

from refimpl._checks import as_int, as_real

__all__ = [
    "group_advantages",
    "oversampled_advantages",
    "dynamic_sampling_mask",
    "dynamic_sampling_weights",
    "overlong_penalty",
    "overlong_filter_mask",
]

_SCALES = ("group", "batch", "batch_rewards", "none")
_STDS = ("population", "sample")
_SINGLETON = ("error", "zero", "raw")
_RAW_SINGLETON_SCALES = ("group", "none")
_ZERO_VARIANCE = ("zero", "formula", "error")


def _check_rewards_and_groups(rewards, group_ids) -> None:
    if not isinstance(rewards, torch.Tensor) or not rewards.is_floating_point():
        raise TypeError(f"rewards must be a floating-point torch.Tensor, got {type(rewards).__name__}"
                        + (f" of dtype {rewards.dtype}" if isinstance(rewards, torch.Tensor) else ""))
    if not isinstance(group_ids, torch.Tensor) or group_ids.is_floating_point() or group_ids.is_complex() \
            or group_ids.dtype == torch.bool:
        raise TypeError("group_ids must be an integer torch.Tensor"
                        + (f", got dtype {group_ids.dtype}" if isinstance(group_ids, torch.Tensor) else
                           f", got {type(group_ids).__name__}"))
    if rewards.ndim != 1:
        raise ValueError(f"rewards must have shape [N], got {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids must have the shape of rewards {tuple(rewards.shape)}, "
                         f"got {tuple(group_ids.shape)}")
    if group_ids.device != rewards.device:
        raise ValueError(f"group_ids must be on the device of rewards ({rewards.device}), "
                         f"got {group_ids.device}")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards contains NaN or inf")


def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense group index in [0, K) for each sample, and K (group_ids non-empty: callers return
    early on an empty batch)."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max()) + 1


def _group_sum(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    return values.new_zeros(num_groups).index_add_(0, index, values)


def _group_extremes(values: torch.Tensor, index: torch.Tensor, num_groups: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """[K] max and [K] min of each group's values."""
    big = values.new_full((num_groups,), -math.inf).scatter_reduce(0, index, values, reduce="amax")
    small = values.new_full((num_groups,), math.inf).scatter_reduce(0, index, values, reduce="amin")
    return big, small


def _group_is_constant(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """[K] bool: all values of the group are equal (exactly; no floating-point variance test)."""
    big, small = _group_extremes(values, index, num_groups)
    return big == small


def _power_of_two_unit(magnitude: torch.Tensor) -> torch.Tensor:
    """``2^(e - 1)`` with ``magnitude = m 2^e``, m in [0.5, 1): the power of two u with
    ``magnitude / u`` in [1, 2) (1 where magnitude is 0). Dividing by u is exact (no rounding, no
    overflow: 2^(e - 1) <= finfo.max), so sums and squares of values scaled by it neither
    overflow (float32 rewards of 1e20 square to inf) nor underflow (1e-25 squares to 0)."""
    mantissa, _ = torch.frexp(magnitude)
    return torch.where(magnitude > 0, magnitude / (2 * mantissa), torch.ones_like(magnitude))


def _scale_denominator(sum_sq: torch.Tensor, count: torch.Tensor, std: str, eps: float,
                       eps_inside_sqrt: bool, unit: torch.Tensor) -> torch.Tensor:
    """s / unit for deviations given in units of ``unit`` (spec: advantages.md eq. (3)-(4)):
    sqrt(var + eps) / u = sqrt(var_u + eps / u^2) or (sqrt(var) + eps) / u = sqrt(var_u) + eps / u,
    var = sum_sq / count (population) or / (count - 1). +inf where eps / u^2 (eps / u) overflows:
    then var is negligible beside eps and the caller uses c u / sqrt(eps) (c u / eps) instead."""
    dof = count if std == "population" else count - 1
    var = sum_sq / dof.clamp(min=1).to(sum_sq.dtype)
    # a true tensor division: ``eps / unit`` with a Python eps multiplies by 1 / unit, which
    # overflows for a subnormal unit (and 0 * inf is NaN)
    eps_per_unit = torch.full_like(unit, eps) / unit
    return torch.sqrt(var + eps_per_unit / unit) if eps_inside_sqrt else torch.sqrt(var) + eps_per_unit


def _scaled_quotient(numerator: torch.Tensor, denominator: torch.Tensor, unit: torch.Tensor, eps: float,
                     eps_inside_sqrt: bool) -> torch.Tensor:
    """numerator / denominator, both in units of ``unit`` (see _scale_denominator), with the
    eps-dominated limit c u / sqrt(eps) (c u / eps) where the denominator overflowed. A zero
    denominator (a zero-variance group with eps = 0) gives the numerator (it is replaced by 0 or
    rejected by the caller)."""
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    eps_root = math.sqrt(eps) if eps_inside_sqrt else eps  # (with eps = 0 no denominator overflows)
    limit = numerator * (unit / torch.full_like(unit, eps_root))
    return torch.where(torch.isinf(denominator), limit, numerator / safe)


def _check_no_overflow(advantages: torch.Tensor) -> torch.Tensor:
    if not bool(torch.isfinite(advantages).all()):
        raise ValueError(f"rewards: the centred advantages overflow {advantages.dtype}; pass float64 rewards")
    return advantages


def _validate_scale_arguments(scale, std, eps, eps_inside_sqrt, zero_variance) -> None:
    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {_SCALES}, got {scale!r}")
    given = {"std": std, "eps": eps, "eps_inside_sqrt": eps_inside_sqrt, "zero_variance": zero_variance}
    if scale == "none":
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            raise ValueError(f"scale='none' divides by nothing; do not pass {', '.join(extra)}")
        return
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise TypeError(f"scale={scale!r} needs the explicit keyword argument(s) {', '.join(missing)} "
                        "(frameworks differ on each; none is chosen silently)")
    if std not in _STDS:
        raise ValueError(f"std must be one of {_STDS}, got {std!r}")
    if as_real(eps) is None or not math.isfinite(as_real(eps)) or as_real(eps) < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    eps = as_real(eps)
    if not isinstance(eps_inside_sqrt, bool):
        raise TypeError(f"eps_inside_sqrt must be a bool, got {eps_inside_sqrt!r}")
    if zero_variance not in _ZERO_VARIANCE:
        raise ValueError(f"zero_variance must be one of {_ZERO_VARIANCE}, got {zero_variance!r}")


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    scale: str,
    singleton: str,
    std: str | None = None,
    eps: float | None = None,
    eps_inside_sqrt: bool | None = None,
    zero_variance: str | None = None,
    leave_one_out: bool = False,
) -> torch.Tensor:
    """Group-relative advantages (spec: advantages.md eq. (1)-(6), (14)-(15); Shao et al. 2024, section 4.1.2;
    Liu et al. 2025 (Dr. GRPO), section 3.2).

    Centring (advantages.md eq. (1)-(2)), for sample i of group g with n_g samples:
    ``c_i = R_i - mean_g R`` or, with ``leave_one_out=True`` (RLOO),
    ``c_i = R_i - mean_{j in g, j != i} R_j = n_g / (n_g - 1) (R_i - mean_g R)``.

    Scaling (eq. (3)-(5)): ``scale="none"`` returns ``c`` (Dr. GRPO, RLOO);
    ``scale="group"`` returns ``c_i / s_g`` with s_g the std of the group's *rewards*;
    ``scale="batch"`` (Magistral) returns ``c_i / s_B`` with s_B the std of all N centred values;
    ``scale="batch_rewards"`` (TRL ``scale_rewards="batch"``, eq. (14)) returns ``c_i / s_R`` with
    s_R the std of all N *raw rewards* (about the batch mean, not the group means).
    ``s = sqrt(var + eps)`` if ``eps_inside_sqrt`` (advantages.md eq. (4)) else ``sqrt(var) + eps``
    (TRL, verl); ``var`` divides the sum of squared deviations by n (``std="population"``) or
    n - 1 (``std="sample"``, torch.std's default, used by TRL and verl).

    Degenerate groups (each behaviour chosen by an argument, eq. (6)):
      * ``singleton`` -- a group of one sample: ``"error"`` raises ValueError; ``"zero"`` gives it
        advantage 0 (it has no baseline). The rule applies to every scale (with ``scale="batch"``
        the zero enters the batch std as a sample; with ``scale="batch_rewards"`` its reward is
        still one of the N rewards of the batch std). ``"raw"`` (verl, eq. (15)) gives the group
        mean 0 and std 1: ``c_i = R_i`` and ``A_i = R_i / s`` with ``s`` eq. (4) at ``var = 1``
        (``1 + eps``, or ``sqrt(1 + eps)``); only with ``scale="group"`` or ``"none"`` (where it
        is ``R_i``), else ValueError.
      * ``zero_variance`` (required when scaling) -- a group of >= 2 samples with all rewards equal
        (for ``scale="batch"``: all N centred values equal; for ``scale="batch_rewards"``: all N
        rewards of the batch equal, so s_R = 0): ``"zero"`` gives advantage exactly 0;
        ``"formula"`` applies the formula (numerator / (sqrt(eps) or eps); the numerator is 0 up
        to rounding of the mean), which needs eps > 0; ``"error"`` raises ValueError.

    Args:
        rewards: ``[N]`` float sequence rewards; finite.
        group_ids: ``[N]`` integer group labels (any values, any order).
        scale, std, eps, eps_inside_sqrt, zero_variance, singleton, leave_one_out: see above.
            ``std``, ``eps``, ``eps_inside_sqrt``, ``zero_variance`` are required when
            ``scale != "none"`` and must be omitted when ``scale == "none"``.
    Returns:
        ``[N]`` advantages in ``promote_types(rewards.dtype, float32)``. Any finite rewards work:
        each group is computed in units of a power of two near its largest |R| (exact scaling),
        so no sum or square overflows or underflows (float32 rewards of +-1e20 give +-1). Where
        the result itself exceeds the dtype's range (``scale="none"``: R - mean), ValueError.
    """
    _check_rewards_and_groups(rewards, group_ids)
    _validate_scale_arguments(scale, std, eps, eps_inside_sqrt, zero_variance)
    if singleton not in _SINGLETON:
        raise ValueError(f"singleton must be one of {_SINGLETON}, got {singleton!r}")
    if singleton == "raw" and scale not in _RAW_SINGLETON_SCALES:
        raise ValueError(f"singleton='raw' (verl: mean 0, std 1) is defined for scale in "
                         f"{_RAW_SINGLETON_SCALES}, got scale={scale!r}")
    if not isinstance(leave_one_out, bool):
        raise TypeError(f"leave_one_out must be a bool, got {leave_one_out!r}")

    dtype = torch.promote_types(rewards.dtype, torch.float32)
    r = rewards.to(dtype)
    if r.numel() == 0:
        return r.clone()
    index, num_groups = _group_index(group_ids)
    count = torch.bincount(index, minlength=num_groups)
    is_singleton = (count == 1)[index]
    if singleton == "error" and bool(is_singleton.any()):
        raise ValueError("a group has a single sample (singleton='error'); pass singleton='zero' "
                         "to give such samples advantage 0")
    # Work in units of a power of two per group (u_g ~ max |R| of the group; exact scaling): no
    # sum, mean or square overflows or underflows, and ordinary rewards give the same bits as
    # unscaled arithmetic (scaling by 2^k commutes with rounding).
    big, small = _group_extremes(r, index, num_groups)
    constant_groups = big == small
    group_unit = _power_of_two_unit(torch.maximum(big.abs(), small.abs()))
    unit = group_unit[index]
    scaled = r / unit
    mean = _group_sum(scaled, index, num_groups) / count.to(dtype)
    deviation = scaled - mean[index]
    if leave_one_out:
        # R_i - (n mean - R_i) / (n - 1) = n / (n - 1) (R_i - mean); singletons are zeroed below.
        factor = count.to(dtype) / (count - 1).clamp(min=1).to(dtype)
        centred = deviation * factor[index]
    else:
        centred = deviation
    # eq. (6): a singleton has no baseline: advantage 0 ("raw", eq. (15), is handled below).
    centred = torch.where(is_singleton, torch.zeros_like(centred), centred)
    if scale == "none":
        out = centred * unit
        if singleton == "raw":  # eq. (15): mean 0, so c_i = R_i
            out = torch.where(is_singleton, r, out)
        return _check_no_overflow(out)

    if scale == "group":
        sum_sq = _group_sum(deviation * deviation, index, num_groups)
        denominator = _scale_denominator(sum_sq, count, std, eps, eps_inside_sqrt, group_unit)[index]
        advantages = _scaled_quotient(centred, denominator, unit, eps, eps_inside_sqrt)
        constant = constant_groups[index] & ~is_singleton
    else:
        # one unit for the batch, the largest group unit: the values of other groups scale by exact
        # powers of two <= 1 (whatever underflows is below the batch std's rounding)
        batch_unit = group_unit.max().reshape(1)
        n = count.new_full((1,), r.numel())
        numerator = centred * (unit / batch_unit)
        if scale == "batch_rewards":  # eq. (14): std of all N raw rewards (TRL scale_rewards="batch")
            values = r / batch_unit
            # s_R = 0 (before eps) iff every reward of the batch is equal, tested exactly (max == min).
            all_equal = bool(big.max() == small.min())
        else:  # "batch": std of all N centred values (Magistral)
            # (N = 1 is a single singleton group: its advantage is 0 by the singleton rule below.)
            values = numerator
            # The centred values are all equal iff each group is constant (their group sums are 0),
            # tested exactly on the rewards rather than on rounded differences.
            all_equal = bool(constant_groups.all())
        batch_dev = values - values.mean()
        denominator = _scale_denominator((batch_dev * batch_dev).sum().reshape(1), n, std, eps,
                                         eps_inside_sqrt, batch_unit)
        advantages = _scaled_quotient(numerator, denominator.expand_as(r), batch_unit.expand_as(r), eps,
                                      eps_inside_sqrt)
        constant = torch.full_like(is_singleton, all_equal) & ~is_singleton

    if zero_variance == "error" and bool(constant.any()):
        raise ValueError("zero-variance rewards (zero_variance='error'); pass 'zero' or 'formula'")
    if zero_variance == "formula" and eps == 0 and bool(constant.any()):
        raise ValueError("zero_variance='formula' with eps=0 divides by zero on a zero-variance group")
    if zero_variance == "zero":
        advantages = torch.where(constant, torch.zeros_like(advantages), advantages)
    if singleton == "raw":  # eq. (15): mean 0 and std 1, i.e. var = 1 in eq. (4)
        raw_denominator = math.sqrt(1.0 + eps) if eps_inside_sqrt else 1.0 + eps
        return torch.where(is_singleton, r / raw_denominator, advantages)
    return torch.where(is_singleton, torch.zeros_like(advantages), advantages)


def dynamic_sampling_mask(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """DAPO dynamic sampling: keep samples whose group's rewards are not all equal.

    spec: advantages.md eq. (7); Yu et al. 2025, section 3.2. A group whose rewards are all equal (all correct
    or all wrong, or a single sample) has zero group-centred advantage and is dropped.
    Shapes: rewards ``[N]`` float, group_ids ``[N]`` int. Returns ``[N]`` bool (True = keep).
    """
    _check_rewards_and_groups(rewards, group_ids)
    if rewards.numel() == 0:
        return rewards.new_zeros(0, dtype=torch.bool)
    index, num_groups = _group_index(group_ids)
    return ~_group_is_constant(rewards, index, num_groups)[index]


def dynamic_sampling_weights(rewards: torch.Tensor, group_ids: torch.Tensor, *,
                             mask: torch.Tensor | None = None) -> torch.Tensor:
    """Dynamic sampling without oversampling: filter zero-signal groups, upweight the rest by 1/(1 - f).

    spec: advantages.md eq. (16)-(17); Yu et al. 2025, section 3.2 ("if a proportion 1/4 are filtered out,
    the remainder are upweighted by 4/3"). ``f`` is the fraction of the samples whose
    group's rewards are all equal (``dynamic_sampling_mask``; the fraction of prompts when groups
    have equal sizes), counted over the non-empty rows of the loss ``mask`` when it is given (an
    empty row is no sample: it neither dilutes nor is upweighted) and over all N otherwise. Weight
    ``keep_i / (1 - f)`` on kept non-empty rows, 0 elsewhere; every sample 0 when all are filtered
    (f = 1). Multiplying each sequence's loss contribution by it equals filtering the rows and
    dividing the loss by ``(1 - f) D`` (``refimpl.losses.upweighted_normalizer``, same f) on every
    mask. With a random f it is a ratio estimator: its expected gradient is not the unfiltered one
    divided by E[1 - f] (advantages.md eq. (17)).
    Shapes: rewards ``[N]`` float, group_ids ``[N]`` int, mask ``[N, T]`` bool or 0/1 (optional).
    Returns ``[N]`` weights in ``promote_types(rewards.dtype, float32)``.
    """
    keep = dynamic_sampling_mask(rewards, group_ids)
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    rows = keep.new_ones(keep.shape) if mask is None else _nonempty_rows(mask, rewards)
    counted = keep & rows
    kept = counted.sum(dtype=dtype)
    # keep_i / (1 - f) = keep_i rows / (rows kept); 0 / max(kept, 1) = 0 when nothing is kept
    return counted.to(dtype) * (rows.sum(dtype=dtype) / kept.clamp(min=1.0))


def _nonempty_rows(mask, rewards: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: the rows of the loss mask ``[N, T]`` with at least one token."""
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2 or mask.shape[0] != rewards.shape[0]:
        got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a [N, T] tensor with N = {rewards.shape[0]} rows, got {got}")
    if mask.device != rewards.device:
        raise ValueError(f"mask must be on the device of rewards ({rewards.device}), got {mask.device}")
    if mask.dtype != torch.bool and (mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all())):
        raise ValueError("mask must be bool or contain only 0 and 1")
    return mask.bool().any(dim=-1)


def oversampled_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, selected: torch.Tensor,
                           **convention) -> torch.Tensor:
    """"Sample more to estimate the baseline, update on a subset" (advantages.md section 4): advantages of the
    ``selected`` samples, with the baseline (mean, std, leave-one-out mean) of each group taken from
    all its G' samples (spec: advantages.md eq. (18)).

    ``convention`` is passed to ``group_advantages`` unchanged (``scale``, ``singleton``, ...).
    With a selection that does not depend on the rewards (e.g. the first G of G' i.i.d. samples),
    the expected gradient is that of G' samples: mean-centred ``(1 - 1/G') grad J``, leave-one-out
    ``grad J`` (unbiased), std-scaled ``c_{G'}(p) grad J`` (eq. (13) with G'), whatever G. A
    selection by the rewards (the G largest ``|R_i - mean|``) keeps the direction ``grad J`` only
    for 0/1 rewards, with a difficulty-dependent factor (eq. (19)).
    Shapes: rewards, group_ids ``[N]``; selected ``[N]`` bool. Returns ``[number selected]``
    advantages in the order of the selected samples.
    """
    if not isinstance(selected, torch.Tensor) or selected.dtype != torch.bool:
        raise TypeError("selected must be a bool torch.Tensor"
                        + (f", got dtype {selected.dtype}" if isinstance(selected, torch.Tensor) else
                           f", got {type(selected).__name__}"))
    if not isinstance(rewards, torch.Tensor) or selected.shape != rewards.shape:
        shape = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else "?"
        raise ValueError(f"selected must have the shape of rewards {shape}, got {tuple(selected.shape)}")
    if selected.device != rewards.device:
        raise ValueError(f"selected must be on the device of rewards ({rewards.device}), "
                         f"got {selected.device}")
    return group_advantages(rewards, group_ids, **convention)[selected]


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO soft overlong punishment added to the reward (spec: advantages.md eq. (8); Yu et al. 2025,
    section 3.4).

    ``0`` if ``L <= max_len - cache_len``; ``((max_len - cache_len) - L) / cache_len`` if
    ``max_len - cache_len < L <= max_len`` (linear, reaching -1 at ``L = max_len``); ``-1`` if
    ``L > max_len``.

    Args:
        lengths: ``[N]`` integer response lengths (>= 0).
        max_len: ``L_max`` >= 1.
        cache_len: ``L_cache`` with 1 <= cache_len <= max_len.
    Returns:
        ``[N]`` float32 penalties in [-1, 0].
    """
    if not isinstance(lengths, torch.Tensor) or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise TypeError("lengths must be an integer torch.Tensor")
    if lengths.ndim != 1:
        raise ValueError(f"lengths must have shape [N], got {tuple(lengths.shape)}")
    for value, name in ((max_len, "max_len"), (cache_len, "cache_len")):
        if as_int(value) is None:
            raise TypeError(f"{name} must be an int, got {value!r}")
    max_len, cache_len = as_int(max_len), as_int(cache_len)
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if not 1 <= cache_len <= max_len:
        raise ValueError(f"cache_len must be in [1, max_len={max_len}], got {cache_len}")
    if lengths.numel() and bool((lengths < 0).any()):
        raise ValueError("lengths must be >= 0")
    slack = ((max_len - cache_len) - lengths).to(torch.float32)
    return (slack / cache_len).clamp(min=-1.0, max=0.0)


def overlong_filter_mask(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """DAPO overlong filtering: mask out every token of truncated samples (spec: advantages.md eq. (9)).

    Yu et al. 2025, section 3.4. A sample is truncated when generation hit the
    length limit without EOS; the caller says which (a length equal to the limit is not enough).
    Shapes: mask ``[N, T]`` (bool or 0/1 float), truncated ``[N]`` bool. Returns a mask of the
    dtype of ``mask`` with rows of truncated samples zeroed.
    """
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2:
        raise ValueError("mask must be a [N, T] torch.Tensor")
    if not isinstance(truncated, torch.Tensor) or truncated.dtype != torch.bool:
        raise TypeError("truncated must be a bool torch.Tensor")
    if truncated.shape != mask.shape[:1]:
        raise ValueError(f"truncated must have shape [N] = [{mask.shape[0]}], got {tuple(truncated.shape)}")
    keep = ~truncated.to(mask.device)
    return mask * keep.unsqueeze(1)  # keeps mask's dtype (bool * bool is logical and)

"""The composable policy-loss family: one loss, orthogonal parts, named presets as values.

spec: specs/policy_losses.md (equation numbers below refer to it); Schulman et al. 2017; Shao et al. 2024;
Liu et al. 2025 (Dr. GRPO); Yu et al. 2025;
Zheng et al. 2025; Gao et al. 2025; MiniMax 2025.

``policy_loss(logp, old_logp, advantages, mask, variant, *, ref_logp=None, behavior_logp=None,
entropy=None, kl=None, normalizer=None) -> (loss, metrics)`` (docs/architecture.md, contract). A
``PolicyLossVariant`` is a frozen dataclass with orthogonal parts:

- ratio level: ``"token"`` (PPO/GRPO/DAPO, Shao et al. 2024, eq. (3)), ``"sequence_mean"`` (GSPO's
  geometric-mean sequence ratio, md eq. (3)), ``"gspo_token"`` (per-token ratio
  ``exp(logp - sg(logp) + sg(log s))``: GSPO's value with per-token gradients) and
  ``"sequence_product"`` (the exact sequence IS weight, md eq. (4));
- gate: ``"clip"`` (hard clip with eps_low / eps_high, optional dual-clip constant, inclusive
  gates of md eq. (6)), ``"sapo"`` (soft sigmoid gate, md eq. (8), Gao et al. 2025), ``"cispo"``
  (``sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * logp``), ``"none"`` (``r * A``) or ``"log_clip"``
  (GMPO: each token's log-ratio clipped to ``[-eps_low, eps_high]`` on the pessimistic side before
  the ratio level forms the unit ratio, then ``r' * A``);
- aggregation: ``"seq_mean_token_mean"`` (GRPO), ``"token_mean"`` (DAPO, BNPO, PPO),
  ``"seq_sum"`` (Dr. GRPO: sum over tokens / (sequences x ``max_length``)),
  ``"seq_mean_token_sum"`` (each sequence's token sum, mean over sequences: Dr. GRPO without L_max,
  verl's ``seq-mean-token-sum``; a sequence-level term counts once per token),
  ``"seq_mean"`` (sum over each sequence's units, mean over sequences; GSPO) and
  ``"seq_sqrt_token_mean"`` (GRPO's per-sequence token means summed over each group of
  ``group_size`` G and divided by sqrt(G) instead of G; policy_losses.md eq. (10), (27));
- regularisers: KL to a reference (``kl_estimator`` k1/k2/k3 of ``refimpl.kl`` from ``ref_logp``,
  or the exact per-token ``kl``), scaled per token like the policy term (``kl_scale="token"``) or
  as the sequence KL, a sum over tokens averaged over sequences (``"sequence"``, Shao et al. 2024,
  eq. (3)); entropy bonus from ``entropy``;
- behaviour correction: a detached truncated (``"truncate"``) or masked (``"mask"``) importance
  weight ``exp(old_logp - behavior_logp)`` capped at ``behavior_cap``;
- normaliser: the aggregation's denominator, local by default, or ``normalizer=`` given globally
  (``loss_normalizer`` computes it; sum it over micro-batches / ranks), so that losses of parts
  sum to the full-batch loss and gradient.

Losses are minimised: ``loss = -(surrogate) + kl_coef * KL - entropy_coef * H`` (md eq. (12)).
No host synchronisation happens inside the loss on accelerators: value checks run as ValueErrors
on CPU tensors and as ``torch._assert_async`` on other devices; metrics stay tensors.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from refimpl.kl import _exp_minus_one_minus_identity, kl_k1, kl_k2, kl_k3
from refimpl.losses.closed_form import closed_form_policy_loss

__all__ = [
    "PolicyLossVariant",
    "policy_loss",
    "reference_policy_loss",
    "loss_normalizer",
    "upweighted_normalizer",
    "get_preset",
    "PRESETS",
    "PPO",
    "GRPO",
    "DR_GRPO",
    "DAPO",
    "BNPO",
    "GSPO",
    "GSPO_TOKEN",
    "SAPO",
    "CISPO",
    "RATIO_LEVELS",
    "GATES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "KL_SCALES",
    "BEHAVIOR_CORRECTIONS",
]

RATIO_LEVELS = ("token", "sequence_mean", "gspo_token", "sequence_product")
GATES = ("clip", "sapo", "cispo", "none", "log_clip")
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_sum", "seq_mean_token_sum", "seq_mean",
                "seq_sqrt_token_mean")
KL_ESTIMATORS = ("k1", "k2", "k3")
KL_SCALES = ("token", "sequence")
BEHAVIOR_CORRECTIONS = ("none", "truncate", "mask")
_SEQUENCE_LEVELS = ("sequence_mean", "sequence_product")
# the aggregations whose contribution sums a sequence's tokens, a sequence-level term once per token
# (md eq. (10)), and those whose denominator is the number of non-empty sequences (md eq. (11))
_PER_TOKEN_COPIES = ("token_mean", "seq_sum", "seq_mean_token_sum")
_SEQUENCE_COUNTS = ("seq_mean_token_mean", "seq_mean_token_sum", "seq_mean", "seq_sqrt_token_mean")
_KL_FUNCTIONS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
_MIN_TAU = 1e-30  # smallest SAPO temperature (see _sapo_surrogate)


def _check_choice(value: object, name: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"variant.{name} must be one of {choices}, got {value!r}")


def _check_real(value: object, name: str, *, low: float, low_inclusive: bool, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"variant.{name} must be a finite real number, got {value!r}")
    if value < low or (value == low and not low_inclusive):
        relation = ">=" if low_inclusive else ">"
        raise ValueError(f"variant.{name} must be {relation} {low}, got {value!r}")


@dataclass(frozen=True)
class PolicyLossVariant:
    """One point of the policy-loss family (spec: policy_losses.md section 1, table 1).

    Fields (all orthogonal; use ``dataclasses.replace(PRESET, field=...)`` to vary one):
        ratio: ratio level, one of RATIO_LEVELS (md eqs. (2)-(5)).
        gate: one of GATES (md eqs. (6)-(9), (18)).
        eps_low, eps_high: clip bounds ``[1 - eps_low, 1 + eps_high]`` for the "clip" and "cispo"
            gates; ``None`` removes that side (md eq. (6)). eps_low must be in [0, 1).
        dual_clip: dual-clip constant c > 1 for negative advantages ("clip" gate only; md eq. (7)).
        tau_pos, tau_neg: SAPO temperatures for A > 0 and A <= 0 (Gao et al. 2025); >= 1e-30.
        aggregation: one of AGGREGATIONS (md eqs. (10)-(11)).
        max_length: L_max of the "seq_sum" aggregation (a config constant, never the padded width;
            it must bound every sequence's length: for no length normalisation use
            "seq_mean_token_sum").
        group_size: G of the "seq_sqrt_token_mean" aggregation (a config constant: the number of
            responses per prompt; each contribution is multiplied by sqrt(G) over the sequence
            count, so each group's sum is divided by sqrt(G) instead of G, md eqs. (10)-(11)).
        kl_coef: weight beta >= 0 of the KL regulariser (needs ``ref_logp`` or ``kl`` when > 0).
        kl_estimator: "k1", "k2" or "k3" (refimpl.kl) used on ``ref_logp``; ignored when ``kl``
            (an exact per-token KL) is given.
        kl_scale: "token" (the per-token KL aggregated like the policy term, md eq. (12); Shao et al. 2024,
            TRL, verl) or "sequence" (beta times the sequence KL, the sum of the per-token KL
            over each response, averaged over the non-empty sequences whatever the aggregation:
            Shao et al. 2024, eq. (3); Liu et al. 2025 (Dr. GRPO), section 3.2; Yu et al. 2025, section 3; md
            eq. (19)). Not to be confused with the conformance
            kit's ``Convention.kl_aggregation``, a framework's deviation from the variant.
        entropy_coef: weight >= 0 of the entropy bonus (needs ``entropy`` when > 0).
        behavior_correction: "none", "truncate" (``min(w, cap)``) or "mask" (``w`` if ``w <= cap``
            else 0) for ``w = exp(old_logp - behavior_logp)``, detached (md eq. (13)).
        behavior_cap: the cap (> 0) of the behaviour importance weight.
    """

    ratio: str = "token"
    gate: str = "clip"
    eps_low: float | None = 0.2
    eps_high: float | None = 0.2
    dual_clip: float | None = None
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    aggregation: str = "token_mean"
    max_length: int | None = None
    group_size: int | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_scale: str = "token"
    entropy_coef: float = 0.0
    behavior_correction: str = "none"
    behavior_cap: float = 2.0

    def __post_init__(self) -> None:
        _check_choice(self.ratio, "ratio", RATIO_LEVELS)
        _check_choice(self.gate, "gate", GATES)
        _check_choice(self.aggregation, "aggregation", AGGREGATIONS)
        _check_choice(self.kl_estimator, "kl_estimator", KL_ESTIMATORS)
        _check_choice(self.kl_scale, "kl_scale", KL_SCALES)
        _check_choice(self.behavior_correction, "behavior_correction", BEHAVIOR_CORRECTIONS)
        _check_real(self.eps_low, "eps_low", low=0.0, low_inclusive=True, optional=True)
        if self.eps_low is not None and self.eps_low >= 1:
            raise ValueError(f"variant.eps_low must be < 1 (so 1 - eps_low > 0), got {self.eps_low}")
        _check_real(self.eps_high, "eps_high", low=0.0, low_inclusive=True, optional=True)
        _check_real(self.dual_clip, "dual_clip", low=1.0, low_inclusive=False, optional=True)
        if self.gate == "log_clip" and self.ratio == "gspo_token":
            raise ValueError("variant.gate='log_clip' clips token log-ratios before the ratio level; it "
                             "needs ratio 'token', 'sequence_mean' or 'sequence_product', got 'gspo_token'")
        if self.dual_clip is not None and self.gate != "clip":
            raise ValueError(f"variant.dual_clip needs gate='clip', got gate={self.gate!r}")
        if self.dual_clip is not None and self.eps_high is not None and self.dual_clip < 1 + self.eps_high:
            raise ValueError(f"variant.dual_clip must be >= 1 + eps_high = {1 + self.eps_high}, "
                             f"got {self.dual_clip}")
        # tau >= 1e-30 (not just > 0): SAPO's gate then saturates before exp(log r) leaves float32's range
        _check_real(self.tau_pos, "tau_pos", low=_MIN_TAU, low_inclusive=True, optional=False)
        _check_real(self.tau_neg, "tau_neg", low=_MIN_TAU, low_inclusive=True, optional=False)
        if self.max_length is not None and (
            isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 1
        ):
            raise ValueError(f"variant.max_length must be a positive int or None, got {self.max_length!r}")
        if self.group_size is not None and (
            isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 1
        ):
            raise ValueError(f"variant.group_size must be a positive int or None, got {self.group_size!r}")
        _check_real(self.kl_coef, "kl_coef", low=0.0, low_inclusive=True, optional=False)
        _check_real(self.entropy_coef, "entropy_coef", low=0.0, low_inclusive=True, optional=False)
        _check_real(self.behavior_cap, "behavior_cap", low=0.0, low_inclusive=False, optional=False)

    @property
    def sequence_level(self) -> bool:
        """True when the surrogate has one unit per sequence (GSPO, sequence product)."""
        return self.ratio in _SEQUENCE_LEVELS

    @property
    def per_token_copies(self) -> bool:
        """True when the aggregation sums over a sequence's tokens, so that a sequence-level term
        counts once per token (token_mean, seq_sum, seq_mean_token_sum; md eq. (10))."""
        return self.aggregation in _PER_TOKEN_COPIES


# Presets (spec: policy_losses.md table 2). Each is a plain value; vary with dataclasses.replace.
PPO = PolicyLossVariant(ratio="token", gate="clip", eps_low=0.2, eps_high=0.2, aggregation="token_mean")
GRPO = PolicyLossVariant(ratio="token", gate="clip", eps_low=0.2, eps_high=0.2,
                         aggregation="seq_mean_token_mean", kl_estimator="k3")
DR_GRPO = PolicyLossVariant(ratio="token", gate="clip", eps_low=0.2, eps_high=0.2, aggregation="seq_sum")
DAPO = PolicyLossVariant(ratio="token", gate="clip", eps_low=0.2, eps_high=0.28, aggregation="token_mean")
BNPO = PolicyLossVariant(ratio="token", gate="clip", eps_low=0.2, eps_high=0.2, aggregation="token_mean",
                         kl_estimator="k3")
GSPO = PolicyLossVariant(ratio="sequence_mean", gate="clip", eps_low=3e-4, eps_high=4e-4,
                         aggregation="seq_mean")
GSPO_TOKEN = PolicyLossVariant(ratio="gspo_token", gate="clip", eps_low=3e-4, eps_high=4e-4,
                               aggregation="seq_mean_token_mean")
SAPO = PolicyLossVariant(ratio="token", gate="sapo", eps_low=None, eps_high=None, tau_pos=1.0, tau_neg=1.05,
                         aggregation="seq_mean_token_mean")
CISPO = PolicyLossVariant(ratio="token", gate="cispo", eps_low=None, eps_high=0.28, aggregation="token_mean")

PRESETS: dict[str, PolicyLossVariant] = {
    "ppo": PPO,
    "grpo": GRPO,
    "dr_grpo": DR_GRPO,
    "dapo": DAPO,
    "bnpo": BNPO,
    "gspo": GSPO,
    "gspo_token": GSPO_TOKEN,
    "sapo": SAPO,
    "cispo": CISPO,
}


def get_preset(name: str) -> PolicyLossVariant:
    """The preset called ``name`` (case-insensitive; '-' and '_' are interchangeable)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    key = name.strip().lower().replace("-", "_")
    if key not in PRESETS:
        raise ValueError(f"unknown policy-loss preset {name!r}; valid names: {', '.join(PRESETS)}")
    return PRESETS[key]


# ----------------------------------------------------------------------------------------------
# input checks


def _check_value(condition: torch.Tensor, message: str) -> None:
    """Raise ValueError(message) unless ``condition`` (a bool tensor) is true; on accelerators an
    asynchronous device assertion instead, so the loss never synchronises with the host."""
    if condition.device.type == "cpu":
        if not bool(condition):
            raise ValueError(message)
    else:  # pragma: no cover - exercised on CUDA only
        torch._assert_async(condition, message)


def _check_tensor(x: object, name: str, shape: tuple[int, ...] | None, device: torch.device | None) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if shape is not None and tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} (no broadcasting), got {tuple(x.shape)}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on device {device}, got {x.device}")


def _check_mask(mask: object, shape: tuple[int, ...], device: torch.device) -> None:
    """The mask's type, shape and device (its 0/1 values are checked where they are read)."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != shape:
        raise ValueError(f"mask must have shape {shape} like logp, got {tuple(mask.shape)}")
    if mask.device != device:
        raise ValueError(f"mask must be on device {device}, got {mask.device}")
    if mask.is_complex():
        raise TypeError(f"mask must be bool or real 0/1, got dtype {mask.dtype}")


def _as_bool_mask(mask: object, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    _check_mask(mask, shape, device)
    if mask.dtype == torch.bool:
        return mask
    _check_value(((mask == 0) | (mask == 1)).all(), "mask must contain only 0 and 1")
    return mask != 0


def check_policy_inputs(logp: object, old_logp: object, advantages: object, mask: object, variant: object,
                        optional: dict[str, object]) -> tuple[tuple[int, ...], torch.device]:
    """The checks of ``policy_loss``'s arguments that read no values: types, shapes and devices of the
    tensors (``optional``: ``ref_logp``, ``behavior_logp``, ``entropy``, ``kl``, each None or a tensor)
    and which of them the variant needs (``check_optional_inputs``). Returns ``(shape, device)`` of
    ``logp``. Shared by ``policy_loss`` and ``refimpl.losses.fused_policy.fused_policy_loss`` (the same
    errors, in the same order)."""
    if not isinstance(variant, PolicyLossVariant):
        raise TypeError(f"variant must be a PolicyLossVariant (e.g. get_preset('grpo')), got "
                        f"{type(variant).__name__}")
    _check_tensor(logp, "logp", None, None)
    if logp.ndim != 2:
        raise ValueError(f"logp must be 2-D [N, T], got shape {tuple(logp.shape)}")
    shape, device = tuple(logp.shape), logp.device
    _check_tensor(old_logp, "old_logp", shape, device)
    _check_tensor(advantages, "advantages", None, device)
    if tuple(advantages.shape) not in (shape[:1], shape):
        raise ValueError(f"advantages must have shape {shape[:1]} or {shape}, got {tuple(advantages.shape)}")
    if advantages.ndim == 2 and variant.sequence_level:
        raise ValueError(f"variant.ratio={variant.ratio!r} is sequence-level and needs advantages of "
                         f"shape {shape[:1]}, got {tuple(advantages.shape)}")
    _check_mask(mask, shape, device)
    for name, value in optional.items():
        if value is not None:
            _check_tensor(value, name, shape, device)
    check_optional_inputs(variant, *(optional[k] is not None for k in ("ref_logp", "behavior_logp",
                                                                       "entropy", "kl")))
    return shape, device


def check_optional_inputs(variant: PolicyLossVariant, ref: bool, behavior: bool, entropy: bool,
                          kl: bool) -> None:
    """The optional inputs given (``ref_logp``, ``behavior_logp``, ``entropy``, ``kl``) against the
    variant's needs: not both KL sources, a KL source when kl_coef > 0, entropy when entropy_coef > 0,
    behaviour log-probs exactly with a behaviour correction (md eqs. (12)-(13))."""
    if ref and kl:
        raise ValueError("give either ref_logp (KL via variant.kl_estimator) or kl (exact), not both")
    if variant.kl_coef > 0 and not (ref or kl):
        raise ValueError(f"variant.kl_coef={variant.kl_coef} > 0 needs ref_logp or kl")
    if variant.entropy_coef > 0 and not entropy:
        raise ValueError(f"variant.entropy_coef={variant.entropy_coef} > 0 needs entropy")
    if behavior != (variant.behavior_correction != "none"):
        raise ValueError(f"behavior_logp must be given exactly when variant.behavior_correction != 'none' "
                         f"(got behavior_correction={variant.behavior_correction!r}, behavior_logp "
                         f"{'given' if behavior else 'missing'})")


def _check_finite(summed: list[torch.Tensor], named: dict[str, torch.Tensor]) -> None:
    """NaN / inf in the ``named`` tensors (zeroed at masked positions) -> ValueError naming the
    argument. Fast path: one scalar sum of ``summed`` (tensors that are non-finite wherever a named
    tensor is, e.g. logp - old_logp for both); only if it is non-finite are the named tensors
    checked one by one, so the error names the culprit (and a sum that merely overflowed raises
    nothing). On accelerators an asynchronous assertion on the sum instead (no host sync)."""
    total = sum(x.detach().sum() for x in summed)
    if total.device.type != "cpu":  # pragma: no cover - exercised on CUDA only
        torch._assert_async(torch.isfinite(total), f"NaN or inf at unmasked positions of {', '.join(named)}")
        return
    if bool(torch.isfinite(total)):
        return
    for name, x in named.items():
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or inf at unmasked positions")


def _resolve_normalizer(normalizer: object, local: torch.Tensor) -> torch.Tensor:
    if normalizer is None:
        return local.clamp(min=1.0)  # an empty batch (local == 0) gives loss 0 (md section 5)
    if isinstance(normalizer, torch.Tensor):
        if normalizer.numel() != 1:
            raise ValueError(f"normalizer must be a scalar, got shape {tuple(normalizer.shape)}")
        value = normalizer.detach().reshape(()).to(local)  # local's dtype and device
    elif isinstance(normalizer, (int, float)) and not isinstance(normalizer, bool):
        value = local.new_tensor(float(normalizer))
    else:
        raise TypeError(f"normalizer must be None, a positive number or a scalar tensor, "
                        f"got {type(normalizer).__name__}")
    _check_value(torch.isfinite(value) & (value > 0), "normalizer must be finite and > 0")
    return value


# ----------------------------------------------------------------------------------------------
# the parts


def loss_normalizer(mask: torch.Tensor, variant: PolicyLossVariant) -> torch.Tensor:
    """The local denominator of ``variant.aggregation`` (spec: policy_losses.md eq. (11)).

    tokens (``token_mean``), non-empty sequences (``seq_mean_token_mean``, ``seq_mean_token_sum``,
    ``seq_mean``, ``seq_sqrt_token_mean``: its sqrt(G) is a factor of each contribution), or non-empty
    sequences x ``max_length`` (``seq_sum``; ValueError when a sequence is longer than L_max).
    Summed over micro-batches / ranks (e.g. ``all_reduce``) and passed as ``normalizer=``, the
    parts' losses sum to the full-batch loss.
    Returns a float32 scalar tensor on mask's device (0 for an empty mask).
    """
    if not isinstance(variant, PolicyLossVariant):
        raise TypeError(f"variant must be a PolicyLossVariant, got {type(variant).__name__}")
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2:
        raise ValueError("mask must be a 2-D [N, T] tensor")
    mask = _as_bool_mask(mask, tuple(mask.shape), mask.device)
    return _normalizer_from_lengths(mask.sum(dim=-1, dtype=torch.float32), variant)


def upweighted_normalizer(mask: torch.Tensor, variant: PolicyLossVariant, keep: torch.Tensor) -> torch.Tensor:
    """Dynamic sampling without oversampling (an alternative to DAPO's oversampling; advantages.md eq. (16)):
    the
    denominator ``(1 - f) * loss_normalizer(mask, variant)`` with f the fraction of the non-empty
    rows of ``mask`` that ``keep`` drops. ``policy_loss(..., mask & keep[:, None],
    normalizer=upweighted_normalizer(mask, variant, keep))`` filters the rows ``~keep`` and
    upweights every kept sequence's contribution by ``1 / (1 - f)``. Under the sequence-counting
    aggregations it is the kept rows' own denominator (filtering with a local mean already
    upweights); under token_mean it is ``(1 - f)`` times *all* tokens, not the kept tokens.
    When every row is dropped (f = 1) it is ``loss_normalizer(mask, variant)`` (the loss is 0), and
    1 when the mask is empty (no row counts: the loss is 0 with zero gradient, as with
    ``normalizer=None``). Equal to weighting the advantages by
    ``refimpl.advantages.dynamic_sampling_weights(rewards, group_ids, mask=mask)`` (same f) on every
    mask. Shapes: mask ``[N, T]``, keep ``[N]`` bool (``dynamic_sampling_mask``). Returns a float64
    scalar tensor (the quotient is not an integer under token_mean); compute it on the full batch
    and pass it to every micro-batch.
    """
    total = loss_normalizer(mask, variant)
    if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool:
        raise TypeError("keep must be a bool torch.Tensor"
                        + (f", got dtype {keep.dtype}" if isinstance(keep, torch.Tensor) else
                           f", got {type(keep).__name__}"))
    if tuple(keep.shape) != tuple(mask.shape[:1]) or keep.device != mask.device:
        raise ValueError(f"keep must have shape {tuple(mask.shape[:1])} on {mask.device}, got "
                         f"{tuple(keep.shape)} on {keep.device}")
    rows = mask.bool().any(dim=-1)
    sequences = rows.sum(dtype=torch.float64)
    kept = (rows & keep).sum(dtype=torch.float64)
    total = total.to(torch.float64)
    total = torch.where(sequences > 0, total, torch.ones_like(total))  # an empty mask: loss 0, not 0 / 0
    return torch.where(kept > 0, total * kept / sequences.clamp(min=1.0), total)


def _normalizer_from_lengths(lengths: torch.Tensor, variant: PolicyLossVariant) -> torch.Tensor:
    if variant.aggregation == "token_mean":
        return lengths.sum()
    if variant.aggregation == "seq_sum" and variant.max_length is None:
        raise ValueError("variant.max_length (L_max) is required by aggregation 'seq_sum' (Dr. GRPO); "
                         "use dataclasses.replace(variant, max_length=...)")
    if variant.aggregation == "seq_sqrt_token_mean" and variant.group_size is None:
        raise ValueError("variant.group_size (G) is required by aggregation 'seq_sqrt_token_mean'; "
                         "use dataclasses.replace(variant, group_size=...)")
    sequences = (lengths > 0).sum(dtype=lengths.dtype)
    if variant.aggregation != "seq_sum":
        return sequences
    # L_max is Dr. GRPO's bound on every length (md eq. (11)); the token sum without it is
    # seq_mean_token_sum
    if lengths.numel():
        _check_value(lengths.max() <= variant.max_length, _max_length_message(variant.max_length))
    return sequences * variant.max_length


def _max_length_message(max_length: int) -> str:
    """The one-line error of a seq_sum L_max below a sequence's length (under 255 characters: the
    message of a device assertion)."""
    return (f"variant.max_length (L_max = {max_length}) must be >= every sequence's length (its tokens in "
            f"mask): seq_sum divides by sequences x L_max; for each sequence's token sum averaged over "
            f"the sequences use aggregation='seq_mean_token_sum'")


def _sequence_kl_weight(variant: PolicyLossVariant, local: torch.Tensor, lengths: torch.Tensor,
                        global_normalizer: bool) -> float | torch.Tensor:
    """The factor u with ``(1/D) sum_i u KL_i = (1/S) sum_i KL_i``, S the number of non-empty
    sequences (``kl_scale="sequence"``, md eq. (19)): u = D / S, 1 for the aggregations that count
    sequences (D = S), L_max under seq_sum (D = S L_max), and the local token count / S under
    token_mean (which then needs the local denominator: a token normaliser does not carry the
    batch's sequence count)."""
    if variant.aggregation in _SEQUENCE_COUNTS:
        return 1.0
    if variant.aggregation == "seq_sum":
        return float(variant.max_length)
    if global_normalizer:
        raise ValueError("normalizer: variant.kl_scale='sequence' averages the KL over sequences, and a "
                         "token_mean normalizer (a token count) does not give the batch's number of "
                         "sequences; call without normalizer= or use kl_scale='token'")
    return local.clamp(min=1.0) / (lengths > 0).sum(dtype=lengths.dtype).clamp(min=1.0)


def _unit_log_ratio(log_ratio: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor,
                    ratio: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log-ratio, log-prob, detached ratio) per unit: [N, T] for token levels, [N] for sequence
    levels (spec: policy_losses.md eqs. (2)-(5)). ``log_ratio`` and ``logp`` are zero at masked
    positions; so are the results (ratio 1), except GSPO-token's log-ratio, which is log s_i on
    every token of row i (its advantage is 0 at masked positions)."""
    if ratio == "token":
        return log_ratio, logp, torch.exp(log_ratio.detach())
    total = log_ratio.sum(dim=-1)
    if ratio == "gspo_token":
        log_s = (total / lengths.clamp(min=1.0)).detach()
        detached_ratio = torch.where(mask, torch.exp(log_s).unsqueeze(-1), 1.0)
        return logp - logp.detach() + log_s.unsqueeze(-1), logp, detached_ratio
    total_logp = logp.sum(dim=-1)
    if ratio == "sequence_mean":
        total, total_logp = total / lengths.clamp(min=1.0), total_logp / lengths.clamp(min=1.0)
    return total, total_logp, torch.exp(total.detach())  # sequence_mean, sequence_product


def _hard_clip_surrogate(log_ratio: torch.Tensor, ratio: torch.Tensor, adv: torch.Tensor,
                         positive: torch.Tensor, variant: PolicyLossVariant
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``, with ``max(., c A)`` for A < 0 under
    dual clip, written as ``r A`` where the gate of md eq. (6) is open and ``bound * A``
    elsewhere, so that the gradient on a boundary follows the inclusive gate (md eqs. (6)-(7)).
    ``ratio`` is the detached ``exp(log_ratio)``; ``positive`` is ``A > 0`` (broadcastable).
    Returns (term, gate open)."""
    full = functools.partial(ratio.new_full, ())
    upper = math.inf if variant.eps_high is None else 1.0 + variant.eps_high
    lower = 0.0 if variant.eps_low is None else 1.0 - variant.eps_low
    negative_open = ratio >= lower
    negative_bound = full(lower)
    if variant.dual_clip is not None:
        above = ratio > variant.dual_clip
        negative_open = negative_open & ~above
        negative_bound = torch.where(above, variant.dual_clip, negative_bound)
    gate = torch.where(positive, ratio <= upper, negative_open)
    bound = torch.where(positive, full(1.0 if variant.eps_high is None else upper), negative_bound)
    # exp only where the gate is open and A != 0: the closed branch must not back-propagate
    # 0 * inf, and an open unit with A = 0 (padding, a zero-variance group, a masked behaviour
    # weight) must not give 0 * inf = NaN where its ratio overflows; its term is exactly 0.
    r_open = torch.exp(torch.where(gate & (adv != 0), log_ratio, 0.0))
    return torch.where(gate, r_open, bound) * adv, gate


def _log_clip(log_ratio: torch.Tensor, positive: torch.Tensor, variant: PolicyLossVariant) -> torch.Tensor:
    """GMPO's token clip in log space (md eq. (18)): ``min(l, eps_high)`` for A > 0 and
    ``max(l, -eps_low)`` for A <= 0, written as ``l`` where the inclusive gate is open and the bound
    (a constant) elsewhere, so a token exactly on a bound keeps its gradient. ``positive`` is
    ``A > 0`` broadcastable to ``log_ratio``; masked positions (log-ratio 0) stay 0."""
    full = functools.partial(torch.full, (), dtype=log_ratio.dtype, device=log_ratio.device)
    upper = math.inf if variant.eps_high is None else variant.eps_high
    lower = -math.inf if variant.eps_low is None else -variant.eps_low
    gate = torch.where(positive, log_ratio <= upper, log_ratio >= lower)
    return torch.where(gate, log_ratio, torch.where(positive, full(upper), full(lower)))


def _sapo_surrogate(log_ratio: torch.Tensor, adv: torch.Tensor, positive: torch.Tensor,
                    variant: PolicyLossVariant) -> torch.Tensor:
    """``f(r) A = 4 / tau * sigmoid(tau (r - 1)) A`` with tau by the sign of A (Gao et al. 2025; md eq. (8)).

    The log-ratio is capped at ``log(finfo.max) - 1``, where exp still fits the dtype: beyond it
    the gate is saturated (tau (r - 1) > 1e-30 * 1e38 >> 40, so sigmoid rounds to 1 in float32
    and float64 alike, with tau >= 1e-30 by the variant's check) and the exact derivative
    ``4 A sigmoid (1 - sigmoid) r`` is below the dtype's smallest subnormal; without the cap the
    backward pass multiplies sigmoid' = 0 by exp(log r) = inf (NaN).

    ``r - 1`` is ``expm1(log r)`` in value, but its derivative is taken as ``exp(log r)``:
    autograd's derivative of expm1 is ``expm1(x) + 1``, which carries r with an absolute error of
    one unit roundoff (2e-8 relative at log r = -20; 0 instead of 4e-309 at -709.79)."""
    full = functools.partial(adv.new_full, ())  # where(c, float, float) would be the default dtype
    tau = torch.where(positive, full(variant.tau_pos), variant.tau_neg)
    scale = torch.where(positive, full(4.0 / variant.tau_pos), 4.0 / variant.tau_neg)
    capped = log_ratio.clamp(max=math.log(torch.finfo(adv.dtype).max) - 1.0)
    ratio = torch.exp(capped)
    ratio_minus_one = torch.expm1(capped.detach()) + (ratio - ratio.detach())  # value + 0 exactly
    return torch.sigmoid(tau * ratio_minus_one) * (scale * adv)


def _cispo_surrogate(ratio: torch.Tensor, unit_logp: torch.Tensor, adv: torch.Tensor,
                     variant: PolicyLossVariant) -> torch.Tensor:
    """``sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * logp`` (md eq. (9); MiniMax-M1); ``ratio``
    is the detached ``exp(log_ratio)``."""
    weight = ratio
    if variant.eps_low is not None or variant.eps_high is not None:
        weight = weight.clamp(min=None if variant.eps_low is None else 1.0 - variant.eps_low,
                              max=None if variant.eps_high is None else 1.0 + variant.eps_high)
    if variant.eps_high is None:  # an unbounded weight may overflow: A = 0 must still give 0, not NaN
        weight = torch.where(adv != 0, weight, 0.0)
    return weight * adv * unit_logp


def _behavior_weight(log_w: torch.Tensor, lengths: torch.Tensor, variant: PolicyLossVariant) -> torch.Tensor:
    """Detached ``w = exp(old_logp - behavior_logp)`` at the ratio's level (``log_w`` per token,
    zero at masked positions), truncated or masked at ``behavior_cap`` (md eq. (13))."""
    if variant.ratio in _SEQUENCE_LEVELS:
        log_w = log_w.sum(dim=-1)
        if variant.ratio == "sequence_mean":
            log_w = log_w / lengths.clamp(min=1.0)
    log_cap = math.log(variant.behavior_cap)
    weight = torch.exp(log_w.clamp(max=log_cap))
    if variant.behavior_correction == "truncate":
        return weight
    return torch.where(log_w <= log_cap, weight, 0.0)


def _kl_per_token(logp: torch.Tensor, ref_logp: torch.Tensor | None, kl: torch.Tensor | None,
                  variant: PolicyLossVariant) -> torch.Tensor | None:
    """Per-token KL (zero at masked positions: all inputs are), exact or estimated by refimpl.kl."""
    if kl is not None:
        return kl
    if ref_logp is None:
        return None
    return _KL_FUNCTIONS[variant.kl_estimator](logp, ref_logp, check_finite=False)


# ----------------------------------------------------------------------------------------------
# the loss


def policy_loss(
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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy loss of ``variant`` to minimise (spec: policy_losses.md eq. (12); Schulman et al. 2017, eq. (7);
    Shao et al. 2024, eq. (3); Liu et al. 2025 (Dr. GRPO), section 3.2; Yu et al. 2025, section 3;
    Zheng et al. 2025, section 4.1; Gao et al. 2025).

    ``loss = (1 / D) * sum_i c_i`` with per-sequence contributions ``c_i`` of the per-unit term
    ``-w * surrogate + kl_coef * KL - entropy_coef * H`` (md eqs. (10)-(12)) and the denominator
    ``D = normalizer`` if given, else ``loss_normalizer(mask, variant)`` (at least 1). With
    ``variant.kl_scale="sequence"`` the KL enters as ``beta * (1/S) sum_i sum_t KL_{i,t}`` instead,
    S the number of non-empty sequences (md eq. (19)); under token_mean only with the local
    denominator (``normalizer=`` raises ValueError there).

    Args:
        logp: [N, T] log-probs of the sampled tokens under the policy being optimised (grad flows).
        old_logp: [N, T] log-probs under the policy that sampled the batch (theta_old); detached.
        advantages: [N] (one per sequence) or [N, T] (per token; token-level ratios only).
        mask: [N, T] bool or 0/1; tokens that count. Values at masked positions are ignored (they
            may be anything, even NaN) and get zero gradient.
        variant: a PolicyLossVariant (see the presets and ``get_preset``).
        ref_logp: [N, T] reference log-probs for the KL term via ``variant.kl_estimator``.
        behavior_logp: [N, T] the sampler's log-probs for the behaviour IS correction.
        entropy: [N, T] per-token entropy (from ``token_entropy``) for the bonus; its gradient flows.
        kl: [N, T] exact per-token KL (from ``categorical_kl``), used instead of ``ref_logp``; its
            gradient flows. (``old_logp``, ``ref_logp``, ``behavior_logp``, advantages: constants.)
        normalizer: the global denominator (> 0) when the batch is split into micro-batches / ranks.
    Returns:
        ``(loss, metrics)``: loss a scalar in ``promote_types(logp.dtype, float32)``; metrics a dict
        of detached scalar tensors (``policy_objective``, ``clip_fraction``, ``ratio_mean``,
        ``ratio_min``, ``ratio_max``, ``approx_kl``, ``normalizer``, plus ``kl`` / ``entropy`` when
        given). With an empty mask the ratio metrics are 1 and the others 0.
    Empty rows: an all-masked row contributes nothing and is not counted as a sequence; a fully
    masked batch gives loss 0 with zero gradient (md section 5).
    Range: the loss is computed in its dtype; a unit with A = 0 (or a masked-out behaviour weight)
    contributes exactly 0 whatever its ratio, and saturated gates (clip, SAPO) differentiate to
    exactly 0, so loss, gradient and metrics are never NaN. Where a ratio that enters the loss
    (open gate, A != 0), a KL term, or their sum exceeds the dtype's range, no finite answer
    exists and ValueError("the loss overflows ...") is raised; ratio metrics may then be +inf.
    """
    optional = {"ref_logp": ref_logp, "behavior_logp": behavior_logp, "entropy": entropy, "kl": kl}
    check_policy_inputs(logp, old_logp, advantages, mask, variant, optional)
    fast = closed_form_policy_loss(logp, old_logp, advantages, mask, variant, optional, normalizer)
    if fast is not None:
        return fast
    return reference_policy_loss(logp, old_logp, advantages, mask, variant, ref_logp=ref_logp,
                                 behavior_logp=behavior_logp, entropy=entropy, kl=kl, normalizer=normalizer)


def reference_policy_loss(
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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``policy_loss`` as the spec states it, op by op with autograd's chain rule: the readable
    reference (md eq. (12)) that ``policy_loss`` runs where its closed form
    (``refimpl.losses.closed_form``) hands a batch back, and that the tests hold the closed form to.
    Arguments, results and errors: ``policy_loss``'s."""
    optional = {"ref_logp": ref_logp, "behavior_logp": behavior_logp, "entropy": entropy, "kl": kl}
    shape, device = check_policy_inputs(logp, old_logp, advantages, mask, variant, optional)
    mask = _as_bool_mask(mask, shape, device)
    dtype = torch.promote_types(logp.dtype, torch.float32)
    lengths = mask.sum(dim=-1, dtype=dtype)
    local = _normalizer_from_lengths(lengths, variant)
    adv_mask = mask if advantages.ndim == 2 else lengths > 0
    # Everything is zeroed at masked positions first: padding may hold anything (even NaN) and
    # gets zero gradient; every later quantity is then exactly zero (or a ratio of 1) there.
    logp_c = torch.where(mask, logp.to(dtype), 0.0)
    old_c = torch.where(mask, old_logp.detach().to(dtype), 0.0)
    adv = torch.where(adv_mask, advantages.detach().to(dtype), 0.0)
    # ref_logp / behavior_logp are constants; entropy and kl keep their gradients (the bonus and
    # an exact KL differentiate through the logits that produced them).
    given = {name: torch.where(mask, (value.detach() if name.endswith("logp") else value).to(dtype), 0.0)
             for name, value in optional.items() if value is not None}
    log_ratio = logp_c - old_c
    _check_finite([log_ratio, adv, *given.values()],
                  {"logp": logp_c, "old_logp": old_c, "advantages": adv, **given})
    gated_log_ratio = log_ratio
    if variant.gate == "log_clip":  # GMPO clips each token before the ratio level (md eq. (18))
        gated_log_ratio = _log_clip(log_ratio, (adv > 0).unsqueeze(-1) if adv.ndim == 1 else adv > 0, variant)
    unit_log_ratio, unit_logp, ratio = _unit_log_ratio(gated_log_ratio, logp_c, mask, lengths, variant.ratio)
    # the sign of A decides the gate and SAPO's temperature: [N, 1] broadcasts for per-sequence A
    positive = (adv > 0).unsqueeze(-1) if not variant.sequence_level and adv.ndim == 1 else adv > 0
    if not variant.sequence_level and adv.ndim == 1:
        adv = torch.where(mask, adv.unsqueeze(-1), 0.0)
    if behavior_logp is not None:
        # the detached weight w >= 0 multiplies A before the gate: every gate is positively
        # homogeneous in A (min / max / clip of r A; SAPO's and CISPO's terms are linear in A) and the
        # sign of A is taken above, so this is md eq. (13)'s w * term; a masked-out w = 0 then
        # gives A = 0, whose term is exactly 0 even where the ratio overflows.
        adv = adv * _behavior_weight(old_c - given["behavior_logp"].detach(), lengths, variant)
    gate_open = None
    if variant.gate == "clip":
        surrogate, gate_open = _hard_clip_surrogate(unit_log_ratio, ratio, adv, positive, variant)
    elif variant.gate == "sapo":
        surrogate = _sapo_surrogate(unit_log_ratio, adv, positive, variant)
    elif variant.gate == "cispo":
        surrogate = _cispo_surrogate(ratio, unit_logp, adv, variant)
    else:  # "none", and "log_clip" (its clip is already in the log-ratio); exp only where A != 0:
        # a zero advantage times an overflowing ratio is 0, not NaN
        surrogate = torch.exp(torch.where(adv != 0, unit_log_ratio, 0.0)) * adv

    # per-sequence contributions c_i (md eq. (10)); the surrogate is zero at masked positions / rows
    per_sequence_mean = variant.aggregation in ("seq_mean_token_mean", "seq_sqrt_token_mean")
    if variant.sequence_level:
        surrogate_units = surrogate
        policy_rows = surrogate * lengths if variant.per_token_copies else surrogate
    else:
        surrogate_units = surrogate.sum(dim=-1)
        policy_rows = surrogate_units / lengths.clamp(min=1.0) if per_sequence_mean else surrogate_units
    # seq_sqrt_token_mean: sqrt(G) c_i over the sequence count, i.e. each group's sum over sqrt(G)
    row_scale = math.sqrt(variant.group_size) if variant.aggregation == "seq_sqrt_token_mean" else None
    if row_scale is not None:
        policy_rows = policy_rows * row_scale
    contributions = -policy_rows
    kl_tokens = _kl_per_token(logp_c, given.get("ref_logp"), given.get("kl"), variant)
    entropy_tokens = given.get("entropy")
    regulariser = None
    if kl_tokens is not None and variant.kl_coef > 0:
        if variant.kl_scale == "sequence":  # beta KL_i summed over tokens, averaged over sequences (19)
            weight = _sequence_kl_weight(variant, local, lengths, normalizer is not None)
            contributions = contributions + variant.kl_coef * kl_tokens.sum(dim=-1) * weight
        else:
            regulariser = variant.kl_coef * kl_tokens
    if entropy_tokens is not None and variant.entropy_coef > 0:
        bonus = variant.entropy_coef * entropy_tokens
        regulariser = -bonus if regulariser is None else regulariser - bonus
    if regulariser is not None:
        regulariser_rows = regulariser.sum(dim=-1)
        if per_sequence_mean:
            regulariser_rows = regulariser_rows / lengths.clamp(min=1.0)
        if row_scale is not None:
            regulariser_rows = regulariser_rows * row_scale
        contributions = contributions + regulariser_rows
    denominator = _resolve_normalizer(normalizer, local)
    loss = contributions.sum() / denominator
    # No silent inf / NaN: a finite loss has a finite gradient (each unit's derivative is bounded
    # by its term, and saturated gates differentiate to exactly 0), so one scalar check suffices.
    hint = "" if dtype == torch.float64 else "; pass float64 logp"
    _check_value(torch.isfinite(loss), f"the loss overflows {dtype} (a ratio exp(logp - old_logp), a "
                 f"KL term from ref_logp / kl, or their sum exceeds its range at unmasked positions){hint}")

    metrics = _metrics(ratio, log_ratio, surrogate_units, gate_open, mask, lengths, kl_tokens,
                       entropy_tokens, denominator, variant)
    return loss, metrics


def _metrics(ratio, log_ratio, surrogate_units, gate_open, mask, lengths, kl_tokens, entropy_tokens,
             denominator, variant) -> dict[str, torch.Tensor]:
    """Detached diagnostics (tensors, no host sync). Units are tokens (token levels) or non-empty
    sequences; ``ratio`` is the detached unit ratio, exactly 1 at masked positions / empty rows."""
    with torch.no_grad():
        tokens = lengths.sum().clamp(min=1.0)
        if variant.sequence_level:
            unit_mask = lengths > 0
            units = unit_mask.sum(dtype=lengths.dtype).clamp(min=1.0)
        else:
            unit_mask, units = mask, tokens
        ratio_minus_one = ratio - 1.0
        ratio_mean = 1.0 + ratio_minus_one.sum() / units
        # masked units are filled with the mean, which lies between the unmasked min and max
        if ratio.numel() == 0:  # a batch of zero sequences (a shape fact: no host sync)
            ratio_min = ratio_max = ratio_mean
        else:
            ratio_min, ratio_max = torch.aminmax(torch.where(unit_mask, ratio, ratio_mean))
        # approx KL(old || new) with samples from old: k3 with log r = logp - old_logp, per token,
        # without cancellation (r - 1 - log r from the rounded r loses every digit at |log r| < 1e-8)
        approx_kl = _exp_minus_one_minus_identity(log_ratio).sum() / tokens
        # a tensor of lengths' device and dtype (no torch.as_tensor, which allocates on the default device)
        closed = lengths.new_zeros(()) if gate_open is None else gate_open.numel() - gate_open.sum(
            dtype=lengths.dtype)
        metrics = {
            "policy_objective": surrogate_units.detach().sum() / units,
            "clip_fraction": closed / units,
            "ratio_mean": ratio_mean,
            "ratio_min": ratio_min,
            "ratio_max": ratio_max,
            "approx_kl": approx_kl,
            "normalizer": denominator.detach(),
        }
        if kl_tokens is not None:
            metrics["kl"] = kl_tokens.detach().sum() / tokens
        if entropy_tokens is not None:
            metrics["entropy"] = entropy_tokens.detach().sum() / tokens
    return metrics

"""Numerical conventions as data: the named flags on which real frameworks differ from the spec.

A ``Convention`` is a frozen dataclass of flags. The kit computes every expected value from the
spec's composable loss (``refimpl.losses.policy_loss``, ``refimpl.advantages.group_advantages``,
``refimpl.kl``) with the flags applied by one interpreter (``refimpl.conformance.expected``), so a
convention is a value, never a code fork, and expected values never come from a framework.

The ``reference`` convention (``Convention()``) is the spec (specs/policy_losses.md, advantages.md,
kl.md): no clamps, empty rows dropped from sequence means, Dr. GRPO over ``sequences x L_max``,
GSPO's sequence ratio with its exact gradient, the global normaliser over micro-batches, the loss
computed in at least float32, masked positions never reaching the loss, population std with eps
inside the square root (seed 001 (90)-(91)).

A framework's profile is data kept with its driver: each ``Mode`` of
``refimpl.conformance.frameworks.<name>`` (trl, verl, openrlhf) carries ``Mode.convention``, the
flags that make the reference reproduce that mode of the installed framework exactly; they are
proven against the installed TRL 1.16.0, verl 0.9.1 and OpenRLHF 0.11.2 by
tests/test_framework_<name>.py and ``refimpl check --framework NAME --mode MODE`` (``refimpl
matrix``: docs/conformance-matrix.md). ``convention_from_flags(name, flags)`` turns such a dict into
a ``Convention``; it is the only way a profile is built.

``profile(name, preset)`` is that profile for a spec preset: the flags of the driver modes listed in
``PROFILE_MODES[name][preset]`` (verl adds its GRPO advantage flags;
``profile("trl", preset, scale_rewards="batch")`` selects TRL's batch std, advantages.md eq. (14)).
``framework_config(name, preset)`` gives the framework's own configuration keys for the preset
(TRL ``GRPOConfig``, verl's actor / algorithm config, OpenRLHF's ``--actor.*`` / ``--algo.*``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = [
    "Convention",
    "FLAG_REASONS",
    "PROFILE_MODES",
    "PROFILE_NAMES",
    "convention_from_flags",
    "profile",
    "profile_flags",
    "profile_modes",
    "framework_config",
    "unsupported_flags",
]

_EMPTY_ROWS = ("drop", "keep")
_SEQ_SUM_WIDTH = ("max_length", "padded_width")
_SEQUENCE_RATIO_GRADIENT = ("sequence", "token")
_MICRO_BATCH = ("global", "local_mean", "local_sum")
_SEQ_SUM_ROWS = ("nonempty", "all", "none")
_KL_GRADIENTS = ("estimator", "k2")
_STDS = ("population", "sample")
_ZERO_VARIANCE = ("zero", "formula")
_SINGLETON = ("zero", "error", "raw")
_ADV_SCALES = ("group", "none", "batch_rewards")
_NORMALIZER_ROUNDING = ("exact", "float32_per_micro_batch")
_KL_COMPUTE_DTYPES = ("input", "float32")
_KL_K3_FORMS = ("accurate", "naive")
_KL_VALUE_CLAMP_SCOPES = ("k3", "all")
_KL_AGGREGATIONS = ("policy", "token_mean")
# TRL GRPOConfig.scale_rewards -> group_advantages(scale=...) (advantages.md eq. (5), (14))
_TRL_SCALE_REWARDS = {"group": "group", "batch": "batch_rewards", "none": "none"}
_COMPUTE_DTYPES = ("float32_min", "input")
_MASKED_NONFINITE = ("ignore", "propagate")


@dataclass(frozen=True)
class Convention:
    """The flags of one numerical convention (each documented in ``FLAG_REASONS``).

    Fields:
        name: label shown in reports.
        log_ratio_clamp: clamp ``logp - old_logp`` to ``[-c, c]`` before ``exp`` (None: no clamp); for
            CISPO inside its detached weight only (``A * logp`` keeps the raw ``logp``).
        sequence_log_ratio_cap: clamp GSPO's per-token log-ratio ``log s_i,t`` above at this value.
        dual_clip: dual-clip constant applied to every hard-clip preset (None: the preset's own).
        kl_log_ratio_clamp: clamp ``log r = ref_logp - logp`` to ``[-c, c]`` inside the k3 KL.
        kl_value_clamp: clamp the per-token k3 value to ``[-c, c]``.
        empty_rows: fully masked rows "drop"-ped from sequence means or "keep"-t (counted, 0).
        seq_sum_width: Dr. GRPO's length constant: "max_length" (L_max) or "padded_width" (T).
        seq_sum_rows: Dr. GRPO's row count: "nonempty" rows (spec), "all" rows of the batch, or
            "none" (no row count: with ``max_length=1``, verl's un-normalised "token-sum").
        sequence_ratio_gradient: GSPO's ratio with its exact "sequence" gradient or the
            "token" form ``exp(logp - sg(logp) + sg(log s))`` (GSPO-token).
        micro_batch: "global" (each micro-batch divides by the global normaliser; losses summed),
            "local_mean" (each micro-batch divides by its own normaliser; losses averaged) or
            "local_sum" (each divides by its own normaliser; losses summed, not averaged).
        adv_std, adv_eps, adv_eps_inside_sqrt, adv_zero_variance, adv_singleton: the arguments of
            ``group_advantages`` (``adv_singleton="raw"``: verl's mean 0 / std 1, eq. (15)).
        adv_scale: "group" (divide by the group std), "none" (Dr. GRPO: mean-centred only) or
            "batch_rewards" (TRL ``scale_rewards="batch"``: the std of all rewards, eq. (14)).
        normalizer_rounding: "exact" or "float32_per_micro_batch": the global normaliser is stored
            as ``float32(count / micro_batches)`` and each micro-batch loss is divided by the
            number of micro-batches again (OpenRLHF's ``_optimizer_step_loss_norm`` + DeepSpeed).
        kl_compute_dtype: the KL estimator is evaluated in the "input" dtype or in "float32"
            (OpenRLHF's ``compute_approx_kl`` casts both log-probs to float32 first).
        kl_k3_form: k3 as "accurate" ``expm1(log r) - log r`` (kl.md eq. (4)) or "naive"
            ``exp(log r) - 1 - log r`` (cancels for small ``|log r|`` in float32).
        kl_log_ratio_max: clamp ``log r`` above at this value inside k3 (one-sided; OpenRLHF: 10).
        kl_value_clamp_scope: ``kl_value_clamp`` applies to "k3" only (verl's low_var_kl) or to
            "all" estimators (OpenRLHF).
        kl_aggregation: the KL term of the loss is aggregated like the "policy" term (spec) or
            always as a global "token_mean" (OpenRLHF's training_step; verl's geo_mean, whose KL
            loss is agg_loss(kl, 'token-mean') over the global tokens), reduced in the KL's
            compute dtype (``kl_compute_dtype``).
        sapo_tau_float32: SAPO's temperatures are float32 numbers (TRL builds them with
            ``torch.where(A > 0, tau_pos, tau_neg)``, a default-dtype tensor).
        kl_importance_weight: the per-token KL term is multiplied by the unit's importance ratio,
            differentiated (TRL ``use_bias_correction_kl=True``, its default).
        compute_dtype: "float32_min" (the loss is computed in at least float32: the spec) or
            "input" (computed in the inputs' dtype, bf16 / fp16 included; the half-precision
            tolerance then follows from that dtype's unit roundoff, see ``checks.half_tolerance``).
        masked_nonfinite: "ignore" (NaN / inf at masked positions never reach the loss or its
            gradient: the spec) or "propagate" (they may, e.g. ``(x * mask).sum()``).
        adv_leave_one_out: RLOO's leave-one-out baseline ``R_i - mean_{j != i} R_j`` instead of the
            group mean (advantages.md; ``group_advantages(leave_one_out=True)``).
        kl_gradient: the KL term's gradient: its own "estimator" (spec) or "k2" (verl's "+" kl
            types: the estimator's value with the k2 gradient, straight-through).
        adv_singleton_float32: with ``adv_singleton="raw"`` and ``adv_scale="group"``, the singleton's
            divisor ``1 + eps`` is rounded to float32 (verl holds its std 1 in a float32 tensor).
    """

    name: str = "reference"
    log_ratio_clamp: float | None = None
    sequence_log_ratio_cap: float | None = None
    dual_clip: float | None = None
    kl_log_ratio_clamp: float | None = None
    kl_value_clamp: float | None = None
    empty_rows: str = "drop"
    seq_sum_width: str = "max_length"
    seq_sum_rows: str = "nonempty"
    sequence_ratio_gradient: str = "sequence"
    micro_batch: str = "global"
    adv_scale: str = "group"
    adv_std: str = "population"
    adv_eps: float = 1e-6
    adv_eps_inside_sqrt: bool = True
    adv_zero_variance: str = "zero"
    adv_singleton: str = "zero"
    normalizer_rounding: str = "exact"
    kl_compute_dtype: str = "input"
    kl_k3_form: str = "accurate"
    kl_log_ratio_max: float | None = None
    kl_value_clamp_scope: str = "k3"
    kl_aggregation: str = "policy"
    sapo_tau_float32: bool = False
    kl_importance_weight: bool = False
    compute_dtype: str = "float32_min"
    masked_nonfinite: str = "ignore"
    adv_leave_one_out: bool = False
    kl_gradient: str = "estimator"
    adv_singleton_float32: bool = False

    def __post_init__(self) -> None:
        choices = {
            "empty_rows": _EMPTY_ROWS,
            "seq_sum_width": _SEQ_SUM_WIDTH,
            "sequence_ratio_gradient": _SEQUENCE_RATIO_GRADIENT,
            "micro_batch": _MICRO_BATCH,
            "adv_std": _STDS,
            "adv_zero_variance": _ZERO_VARIANCE,
            "adv_singleton": _SINGLETON,
            "adv_scale": _ADV_SCALES,
            "normalizer_rounding": _NORMALIZER_ROUNDING,
            "kl_compute_dtype": _KL_COMPUTE_DTYPES,
            "kl_k3_form": _KL_K3_FORMS,
            "kl_value_clamp_scope": _KL_VALUE_CLAMP_SCOPES,
            "kl_aggregation": _KL_AGGREGATIONS,
            "compute_dtype": _COMPUTE_DTYPES,
            "masked_nonfinite": _MASKED_NONFINITE,
            "seq_sum_rows": _SEQ_SUM_ROWS,
            "kl_gradient": _KL_GRADIENTS,
        }
        for field, allowed in choices.items():
            if getattr(self, field) not in allowed:
                raise ValueError(f"convention.{field} must be one of {allowed}, got {getattr(self, field)!r}")
        for field in (
            "log_ratio_clamp",
            "sequence_log_ratio_cap",
            "dual_clip",
            "kl_log_ratio_clamp",
            "kl_value_clamp",
            "kl_log_ratio_max",
        ):
            value = getattr(self, field)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
            ):
                raise ValueError(f"convention.{field} must be None or a number > 0, got {value!r}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"convention.dual_clip must be > 1, got {self.dual_clip}")
        if not isinstance(self.adv_eps, (int, float)) or isinstance(self.adv_eps, bool) or self.adv_eps < 0:
            raise ValueError(f"convention.adv_eps must be a number >= 0, got {self.adv_eps!r}")
        for field in ("sapo_tau_float32", "kl_importance_weight", "adv_singleton_float32"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"convention.{field} must be a bool, got {getattr(self, field)!r}")
        if not isinstance(self.adv_leave_one_out, bool):
            raise ValueError(f"convention.adv_leave_one_out must be a bool, got {self.adv_leave_one_out!r}")
        if self.adv_singleton == "raw" and self.adv_scale not in ("group", "none"):
            raise ValueError("convention.adv_singleton='raw' (verl) needs adv_scale 'group' or 'none', "
                             f"got {self.adv_scale!r}")

    def differences(self) -> dict[str, tuple[object, object]]:
        """``{flag: (reference value, this value)}`` for every flag that differs from the spec."""
        reference = Convention()
        return {
            f.name: (getattr(reference, f.name), getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name != "name" and getattr(reference, f.name) != getattr(self, f.name)
        }


#: Why a framework might choose each flag (printed by ``refimpl check --list-conventions``).
FLAG_REASONS: dict[str, str] = {
    "log_ratio_clamp": "exp(logp - old_logp) overflows float16/32 for stale or mismatched log-probs; "
    "verl clamps the log-ratio to [-20, 20] (the gradient is 0 beyond the clamp; CISPO's clamp is "
    "inside its detached weight sg(clip(exp(.))), so A * logp keeps logp and its gradient).",
    "sequence_log_ratio_cap": "verl's GSPO caps the token-level sequence log-ratio at 10 for stability.",
    "dual_clip": "dual-clip PPO (Ye et al. 2020) bounds the loss of negative-advantage tokens whose "
    "ratio exploded; verl's vanilla loss always applies clip_ratio_c (3.0) to A < 0.",
    "kl_log_ratio_clamp": "verl's low_var_kl clamps log(ref/pi) to [-20, 20] before exp.",
    "kl_value_clamp": "verl's low_var_kl clamps the k3 value to [-10, 10] so one token cannot "
    "dominate the KL penalty.",
    "empty_rows": "an all-masked row (a filtered or zero-length sample) either leaves the sequence "
    "mean (spec) or counts as a zero in a mean over the padded batch (TRL divides by N).",
    "seq_sum_width": "Dr. GRPO divides by a constant L_max; frameworks without one use the padded "
    "width, which changes with the batch (verl's seq-mean-token-sum-norm).",
    "seq_sum_rows": "Dr. GRPO divides by (sequences x L_max): the spec counts non-empty sequences, "
    "TRL (per_token_loss.size(0)) and verl (global batch size) count every row; 'none' "
    "divides by nothing (verl's loss_agg_mode='token-sum', with max_length=1).",
    "sequence_ratio_gradient": "GSPO's sequence ratio s_i can be back-propagated exactly or through the "
    "GSPO-token form exp(logp - sg(logp) + sg(log s)) that allows per-token "
    "advantages (verl); the two agree for per-sequence advantages.",
    "micro_batch": "with gradient accumulation the token mean is over the global batch (spec, TRL's "
    "loss_type='dapo') or each micro-batch is a local mean and the losses are "
    "averaged (TRL's grpo/bnpo, older verl): the mean of micro-batch means; or summed "
    "('local_sum': verl's geo_mean ignores the global batch info and its engine sums the "
    "micro-batch losses, so the loss grows with the number of micro-batches).",
    "adv_scale": "GRPO divides the centred reward by the group std; Dr. GRPO does not (verl's "
    "norm_adv_by_std_in_grpo=False, TRL's scale_rewards='none'); TRL's scale_rewards='batch' "
    "divides by the std of all rewards of the batch ('batch_rewards', advantages.md eq. (14)).",
    "adv_std": "torch.std is the sample (Bessel, n - 1) std; GRPO's formula (seed 001 (90)) is the "
    "population std.",
    "adv_eps": "epsilon keeps zero-variance groups finite; TRL adds 1e-4, verl 1e-6.",
    "adv_eps_inside_sqrt": "sqrt(var + eps) (seed 001 (91)) or std + eps (TRL, verl).",
    "adv_zero_variance": "a group whose rewards are all equal gets exactly 0 (spec) or the formula "
    "(R - mean) / eps, 0 up to the rounding of the mean (TRL, verl).",
    "kl_gradient": "verl's kl_loss_type with a '+' (k1+, k3+) keeps the estimator's value but "
    "back-propagates the k2 gradient (logp - ref_logp), whose expectation is the KL's gradient.",
    "adv_singleton_float32": "verl's GRPO gives a singleton group mean torch.tensor(0.0) and std "
    "torch.tensor(1.0), float32 tensors: std + eps is float32(1 + 1e-6), so a singleton's "
    "advantage is R / 1.00000095..., 4.6e-8 away from R / (1 + 1e-6).",
    "adv_singleton": "a group of one sample has no baseline: advantage 0 (spec), an error (TRL "
    "requires num_generations >= 2), or 'raw': mean 0 and std 1, i.e. R / (1 + eps) (verl's "
    "compute_grpo_outcome_advantage; R with norm_adv_by_std_in_grpo=False; eq. (15)).",
    "normalizer_rounding": "OpenRLHF's _optimizer_step_loss_norm stores the step's global token / "
    "sequence count divided by the gradient-accumulation steps as a float32 tensor and DeepSpeed "
    "divides each micro-batch loss by those steps again: the denominator is "
    "gas * float32(count / gas), off by up to 2^-24 relative when gas does not divide the count.",
    "kl_compute_dtype": "OpenRLHF's compute_approx_kl casts both log-probs to float32 (.float()) "
    "before the log-ratio, so float64 inputs are evaluated in float32.",
    "kl_k3_form": "k3 = r - 1 - log r evaluated directly (OpenRLHF, verl, TRL) cancels for |log r| << 1 "
    "(in float32 the error is ~1e-7 absolute on a value ~(log r)^2 / 2, in float64 ~1e-16); the spec "
    "uses expm1 / a series.",
    "kl_log_ratio_max": "OpenRLHF's k3 clamps log(pi / pi_ref) below at -10 before exp, i.e. "
    "log r = log(pi_ref / pi) above at 10 (one-sided; no gradient beyond).",
    "kl_value_clamp_scope": "verl clamps only low_var_kl (k3) to [-10, 10]; OpenRLHF clamps the value "
    "of every estimator (k1, k2, k3) to [-10, 10].",
    "kl_aggregation": "OpenRLHF adds its KL loss outside PolicyLoss as aggregate_loss(kl, mask, "
    "**loss_batch_info): always a global token mean (in float32), also when the policy term is a "
    "sequence mean (seq-mean-token-mean); verl's geo_mean (GMPO) ignores loss_agg_mode for its "
    "policy term (a mean over rows) but ppo_loss aggregates its KL loss with it (token-mean over "
    "the global tokens); the spec aggregates both terms alike.",
    "sapo_tau_float32": "TRL builds SAPO's temperatures with torch.where(A > 0, tau_pos, tau_neg) from "
    "Python floats, a float32 tensor: tau_neg = 1.05 becomes 1.0499999523 (1.3e-8 to 2.6e-6 relative "
    "in float64 losses).",
    "kl_importance_weight": "TRL's use_bias_correction_kl (default True; DeepSeek-V3.2) multiplies the "
    "per-token k3 term by the importance ratio exp(logp - old_logp) (GSPO: the sequence ratio), "
    "differentiated, so the KL gradient is the unbiased reverse-KL gradient under off-policy samples.",
    "compute_dtype": "the spec computes the loss in at least float32 ('float32_min'); TRL, verl and "
    "OpenRLHF compute it in the log-probs' own dtype ('input'), so bf16 / fp16 inputs give a loss with "
    "bf16 / fp16 rounding (checked against a bound from the dtype's unit roundoff and the reduction "
    "length instead of float32's).",
    "masked_nonfinite": "the spec never lets a value at a masked position reach the loss ('ignore': "
    "torch.where before any arithmetic); '(x * mask).sum()' turns a NaN or inf there into a NaN loss "
    "('propagate': a hazard, reported as this named departure).",
    "adv_leave_one_out": "RLOO (Ahmadian et al. 2024) uses the mean of the other samples of the group "
    "as baseline, R_i - mean_{j != i} R_j = n / (n - 1) (R_i - mean R) (verl's rloo estimator).",
}

PROFILE_NAMES = ("reference", "trl", "verl", "openrlhf")

# The driver modes (kind, mode name) whose Mode.convention flags, merged left to right, are each
# framework's profile for a preset (refimpl.conformance.frameworks.<name>.modes(kind)[mode]).
# TRL: ppo's variant equals bnpo's. verl: its GRPO advantages (norm_adv_by_std_in_grpo=False for
# dr_grpo) plus the policy-loss mode. OpenRLHF: bnpo's loss is PPO's token mean.
_TRL_PRESETS = {p: p for p in ("grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo")} | {"ppo": "bnpo"}
_VERL_PRESETS = {
    "ppo": "vanilla/token-mean",
    "grpo": "vanilla/seq-mean-token-mean",
    "bnpo": "vanilla/token-mean",
    "dapo": "vanilla/token-mean",
    "dr_grpo": "vanilla/seq-mean-token-sum-norm",
    "gspo": "gspo",
    "gspo_token": "gspo",
    "sapo": "sapo",
    "cispo": "cispo",
}
_OPENRLHF_PRESETS = {
    "ppo": "ppo/token-mean",
    "bnpo": "ppo/token-mean",
    "dapo": "ppo/token-mean/clip-higher",
    "grpo": "ppo/seq-mean-token-mean",
    "gspo": "gspo",
}
PROFILE_MODES: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {
    "trl": {p: (("policy_loss", m),) for p, m in _TRL_PRESETS.items()},
    "verl": {
        p: (("group_advantages", "grpo"),)
        + ((("group_advantages", "grpo/no_std"),) if p == "dr_grpo" else ())
        + (("policy_loss", m),)
        for p, m in _VERL_PRESETS.items()
    },
    "openrlhf": {p: (("policy_loss", m),) for p, m in _OPENRLHF_PRESETS.items()},
}
_FRAMEWORK_TITLES = {"trl": "TRL GRPOConfig", "verl": "verl loss_mode", "openrlhf": "OpenRLHF PolicyLoss"}


def _preset_key(preset: str) -> str:
    return preset.strip().lower().replace("-", "_")


def profile_modes(name: str, preset: str) -> tuple[tuple[str, str], ...]:
    """The (kind, mode) pairs of framework ``name``'s driver whose flags make its profile for
    ``preset`` (ValueError naming the preset when the framework has no equivalent)."""
    table = PROFILE_MODES[name]
    key = _preset_key(preset)
    if key not in table:
        raise ValueError(
            f"preset {preset!r} has no {_FRAMEWORK_TITLES[name]} equivalent; {name} profile supports "
            f"{sorted(table)}"
        )
    return table[key]


def profile(name: str | Convention, preset: str = "grpo", *, scale_rewards: str | None = None) -> Convention:
    """The flags of profile ``name`` ("reference", "trl", "verl", "openrlhf") for ``preset``.

    A framework's profile is ``convention_from_flags(name, flags)`` of its driver's modes for the
    preset (``PROFILE_MODES``). ``scale_rewards`` (TRL profile only) is TRL's
    ``GRPOConfig.scale_rewards``: "group", "batch" (advantages.md eq. (14)) or "none"; None takes
    TRL's value for the preset ("none" for dr_grpo, else "group"). A ``Convention`` passed as
    ``name`` is returned unchanged (custom conventions are plain values). Raises ValueError for an
    unknown profile, a preset the framework has no equivalent of, or ``scale_rewards`` outside the
    TRL profile.
    """
    if isinstance(name, Convention):
        if scale_rewards is not None:
            raise ValueError("scale_rewards applies to the 'trl' profile, not to a Convention value")
        return name
    if not isinstance(name, str) or name.lower() not in PROFILE_NAMES:
        raise ValueError(f"convention must be one of {PROFILE_NAMES} or a Convention, got {name!r}")
    name = name.lower()
    if scale_rewards is not None and name != "trl":
        raise ValueError(f"scale_rewards is TRL's GRPOConfig option; profile {name!r} does not take it")
    if scale_rewards is not None and scale_rewards not in _TRL_SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {tuple(_TRL_SCALE_REWARDS)}, got {scale_rewards!r}")
    if name == "reference":
        return Convention()
    conv = convention_from_flags(name, profile_flags(name, preset))
    if scale_rewards is not None:
        conv = dataclasses.replace(conv, adv_scale=_TRL_SCALE_REWARDS[scale_rewards])
    return conv


def profile_flags(name: str, preset: str) -> dict[str, object]:
    """The merged ``Mode.convention`` flags of ``profile_modes(name, preset)`` (ValueError when the
    installed driver lacks one of those modes)."""
    from .frameworks import load_driver

    driver = load_driver(name)
    flags: dict[str, object] = {}
    for kind, mode in profile_modes(name, preset):
        table = driver.modes(kind)
        if mode not in table:
            raise ValueError(f"the {name} driver has no {kind} mode {mode!r} for preset {preset!r}")
        flags.update(table[mode].convention)
    return flags


def convention_from_flags(name: str, flags: dict) -> Convention:
    """A ``Convention`` called ``name`` from a flag dict (a driver's ``Mode.convention``; a "name"
    key there is ignored). Raises ValueError naming unknown flags."""
    known = {f.name for f in dataclasses.fields(Convention)} - {"name"}
    unknown = set(flags) - known - {"name"}
    if unknown:
        raise ValueError(f"unknown convention flags {sorted(unknown)}; known: {sorted(known)}")
    return Convention(name=name, **{k: v for k, v in flags.items() if k != "name"})


def framework_config(
    name: str, preset: str, variant: object | None = None, *, scale_rewards: str | None = None
) -> dict[str, object]:
    """The framework's own config keys that reproduce ``preset`` under profile ``name``.

    ``variant`` (a PolicyLossVariant, default the preset) supplies eps / tau / L_max / beta;
    ``scale_rewards`` is passed to ``profile`` (TRL only).
    TRL keys follow ``GRPOConfig``; verl keys follow ``actor_rollout_ref.actor`` and ``algorithm``;
    OpenRLHF keys follow ``train_ppo_ray.py``'s ``--actor.*`` / ``--algo.*`` options.
    """
    from refimpl.losses import get_preset

    key = _preset_key(preset)
    v = get_preset(key) if variant is None else variant
    conv = profile(name, key if name != "trl" or key in _TRL_PRESETS else "grpo", scale_rewards=scale_rewards)
    trl_scale_rewards = {ours: theirs for theirs, ours in _TRL_SCALE_REWARDS.items()}
    if name == "trl":
        from .checks import resolve_preset
        from .frameworks import trl

        v = resolve_preset(v)[1]  # a seq_sum variant without L_max gets the kit's L_max
        if key in _TRL_PRESETS or variant is None:
            mode = trl.modes()[profile_modes("trl", key)[0][1]]
        else:
            mode = trl.mode_of_variant(v)
        return {**trl.grpo_config_kwargs(mode, v), "scale_rewards": trl_scale_rewards[conv.adv_scale]}
    if name == "openrlhf":
        from .frameworks.openrlhf import config_for_variant

        return config_for_variant(v)
    if name == "verl":
        loss_mode, _, agg = _VERL_PRESETS[key].partition("/")
        agg = agg or ("token-mean" if loss_mode == "cispo" else "seq-mean-token-mean")
        return {
            "actor.policy_loss.loss_mode": loss_mode,
            # a side without a clip: 1 - 1 = 0 and 1 + inf (what the verl driver passes)
            "actor.clip_ratio_low": 1.0 if v.eps_low is None else v.eps_low,
            "actor.clip_ratio_high": float("inf") if v.eps_high is None else v.eps_high,
            "actor.clip_ratio_c": conv.dual_clip if conv.dual_clip is not None else (v.dual_clip or 3.0),
            "actor.loss_agg_mode": agg,
            "actor.loss_scale_factor": v.max_length if agg == "seq-mean-token-sum-norm" else None,
            "actor.use_kl_loss": v.kl_coef > 0,
            "actor.kl_loss_coef": v.kl_coef,
            "actor.kl_loss_type": {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}[v.kl_estimator],
            "algorithm.norm_adv_by_std_in_grpo": conv.adv_scale == "group",
            "actor.tau_pos": v.tau_pos,
            "actor.tau_neg": v.tau_neg,
        }
    return dataclasses.asdict(v)


def unsupported_flags(name: str) -> dict[str, str]:
    """Framework behaviours the profile does not reproduce (stated, not silently approximated)."""
    if name in ("trl", "openrlhf"):
        from .frameworks import load_driver

        return load_driver(name).unsupported_modes()
    if name == "verl":
        return {
            "dual-clip tie": "at a ratio exactly equal to clip_ratio_c verl's torch.min splits the "
            "gradient in half; the kit follows the inclusive gate of seed 001 (116) (no float64 "
            "log-ratio has exp exactly 3.0, so no case reaches the tie).",
            "loss_scale_factor=None": "verl's default Dr. GRPO constant is the micro-batch's padded "
            "width (flag seq_sum_width='padded_width'); the profile sets loss_scale_factor = L_max.",
            "standalone agg_loss": "called without global batch info, verl's sequence modes drop "
            "empty rows from the row count; the profile describes the trainer, whose "
            "global_batch_size counts every row (empty_rows='keep').",
        }
    return {}

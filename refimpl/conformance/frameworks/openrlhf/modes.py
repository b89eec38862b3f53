"""OpenRLHF 0.11.2: the modes as data (profiles, variants, config keys, modes out of scope)."""

from __future__ import annotations

import dataclasses

from .. import Mode
from ..findings import Finding
from .advantages import ADV_MODES, ADV_UNSUPPORTED

# The profile (flags of conventions.Convention, as data). Every mode carries the KL flags, since
# OpenRLHF computes every KL (reward penalty or loss) with compute_approx_kl (models/utils.py):
# * kl_compute_dtype "float32": log_ratio = log_probs.float() - log_probs_base.float();
# * kl_k3_form "naive": k3 = exp(-x) - 1 + x evaluated directly;
# * kl_log_ratio_max 10: k3 clamps x = logp - ref below at -10 (log r = -x above at 10);
# * kl_value_clamp 10 with scope "all": every estimator's value is clamped to [-10, 10].
_KL_PROFILE = {
    "kl_compute_dtype": "float32",
    "kl_k3_form": "naive",
    "kl_log_ratio_max": 10.0,
    "kl_value_clamp": 10.0,
    "kl_value_clamp_scope": "all",
}


# PolicyLoss modes add:
# * compute_dtype "input" (kit flag): bf16/fp16 log-probs are never upcast (the surrogate is formed
#   in the input dtype; aggregate_loss divides by OpenRLHF's float32 normalisers);
# * masked_nonfinite "propagate" (kit flag): aggregate_loss and masked_mean reduce with
#   (loss * mask).sum(), so a NaN at a masked position reaches the loss;
# * normalizer_rounding "float32_per_micro_batch": _optimizer_step_loss_norm's float32 count / gas;
# * kl_aggregation "token_mean": with algo.kl.use_loss the KL term is aggregate_loss(kl, mask,
#   **loss_batch_info), a global token mean whatever actor.loss_agg_mode says;
# * log_ratio_clamp 20 (ppo only): log_probs - old_log_probs is clamped to [-20, 20] before exp.
_POLICY_PROFILE = {
    **_KL_PROFILE,
    "compute_dtype": "input",
    "masked_nonfinite": "propagate",
    "normalizer_rounding": "float32_per_micro_batch",
    "kl_aggregation": "token_mean",
    # a step without tokens: the step's float32 count is 0 and the loss 0 / 0 = NaN (M3)
    "empty_step": "nan",
}


_PPO_PROFILE = {**_POLICY_PROFILE, "log_ratio_clamp": 20.0}


# dual_clip: torch.max(clip1, dual_clip * A) at float32 r == dual_clip is a tie whose gradient torch
# halves (loss.py:210: r = 3.0, A = -1 gives 1.5)
_DUAL_PROFILE = {**_PPO_PROFILE, "dual_clip_tie": "half"}


# GSPO (policy_loss_type "gspo") exponentiates the masked mean log-ratio without a clamp.
# A closed gate on a sequence ratio past float32's range: 0 * inf = NaN (ratio_overflow, loss.py:196).
_GSPO_PROFILE = {**_POLICY_PROFILE, "ratio_overflow": "nan"}


def _ppo_config(eps_low: float, eps_high: float, agg: str, dual_clip: float | None = None) -> dict:
    return {
        "actor.policy_loss_type": "ppo",
        "actor.eps_clip_low_high": (eps_low, eps_high),
        "actor.dual_clip": dual_clip,
        "actor.loss_agg_mode": agg,
        "algo.advantage.is_correction_level": "off",
        "algo.kl.use_loss": False,
    }


def _kl_loss_config(config: dict, estimator: str, coef: float) -> dict:
    return {**config, "algo.kl.use_loss": True, "algo.kl.init_coef": coef, "algo.kl.estimator": estimator,
            "algo.kl.unbiased_gradient": False, "algo.kl.target": None}


_POLICY_MODES = (
    Mode(
        "ppo/token-mean",
        preset="ppo",
        framework_config=_ppo_config(0.2, 0.2, "token-mean"),
        convention=_PPO_PROFILE,
        description="PolicyLoss(policy_loss_type='ppo', token_level_loss=True): clipped surrogate, "
        "global token mean",
    ),
    Mode(
        "ppo/token-mean/clip-higher",
        preset="dapo",
        framework_config=_ppo_config(0.2, 0.28, "token-mean"),
        convention=_PPO_PROFILE,
        description="asymmetric clip [1 - 0.2, 1 + 0.28] (DAPO's clip-higher), global token mean",
    ),
    Mode(
        "ppo/token-mean/dual-clip",
        preset="ppo",
        variant_overrides={"dual_clip": 3.0},
        framework_config=_ppo_config(0.2, 0.2, "token-mean", 3.0),
        convention=_DUAL_PROFILE,
        description="dual-clip PPO (dual_clip=3.0), global token mean",
    ),
    Mode(
        "ppo/seq-mean-token-mean",
        preset="grpo",
        framework_config=_ppo_config(0.2, 0.2, "seq-mean-token-mean"),
        convention=_PPO_PROFILE,
        description="PolicyLoss(token_level_loss=False): mean over non-empty sequences of token means",
    ),
    Mode(
        "ppo/seq-mean-token-mean/dual-clip",
        preset="grpo",
        variant_overrides={"dual_clip": 3.0},
        framework_config=_ppo_config(0.2, 0.2, "seq-mean-token-mean", 3.0),
        convention=_DUAL_PROFILE,
        description="dual-clip PPO (dual_clip=3.0), sequence mean of token means",
    ),
    Mode(
        "ppo/token-mean+kl-loss/k3",
        preset="bnpo",
        variant_overrides={"kl_coef": 0.01, "kl_estimator": "k3"},
        framework_config=_kl_loss_config(_ppo_config(0.2, 0.2, "token-mean"), "k3", 0.01),
        convention=_PPO_PROFILE,
        description="clipped surrogate + 0.01 * k3 KL loss (fixed KL controller), global token means",
    ),
    Mode(
        "ppo/seq-mean-token-mean+kl-loss/k3",
        preset="grpo",
        variant_overrides={"kl_coef": 0.01, "kl_estimator": "k3"},
        framework_config=_kl_loss_config(_ppo_config(0.2, 0.2, "seq-mean-token-mean"), "k3", 0.01),
        convention=_PPO_PROFILE,
        description="OpenRLHF's GRPO recipe: sequence-mean surrogate + 0.01 * k3 KL loss (token mean)",
    ),
    Mode(
        "ppo/seq-mean-token-mean+kl-loss/k2",
        preset="grpo",
        variant_overrides={"kl_coef": 0.01, "kl_estimator": "k2"},
        framework_config=_kl_loss_config(_ppo_config(0.2, 0.2, "seq-mean-token-mean"), "k2", 0.01),
        convention=_PPO_PROFILE,
        description="sequence-mean surrogate + 0.01 * k2 KL loss (token mean)",
    ),
    Mode(
        "gspo",
        preset="gspo",
        framework_config={
            "actor.policy_loss_type": "gspo",
            "actor.eps_clip_low_high": (3e-4, 4e-4),
            "actor.dual_clip": None,
            "actor.loss_agg_mode": "seq-mean-token-mean",
            "algo.advantage.is_correction_level": "off",
            "algo.kl.use_loss": False,
        },
        convention=_GSPO_PROFILE,
        description="PolicyLoss(policy_loss_type='gspo'): sequence ratio exp(mean log-ratio) with its "
        "exact gradient, sequence mean (forced)",
    ),
)


_KL_MODES = tuple(
    Mode(
        f"kl/{k}",
        kind="kl",
        variant_overrides={"kl_estimator": k},
        framework_config={"algo.kl.estimator": k, "algo.kl.unbiased_gradient": False},
        convention=_KL_PROFILE,
        description=f"compute_approx_kl(log_probs, log_probs_base, kl_estimator='{k}')",
    )
    for k in ("k1", "k2", "k3")
)


#: preset -> the mode whose flags are ``--convention openrlhf --preset P`` (bnpo's loss is PPO's token mean)
PROFILE = {
    "ppo": ("ppo/token-mean",),
    "bnpo": ("ppo/token-mean",),
    "dapo": ("ppo/token-mean/clip-higher",),
    "grpo": ("ppo/seq-mean-token-mean",),
    "gspo": ("gspo",),
}


_UNSUPPORTED = {
    "policy_loss": {
        "is_correction token clip / mask (TIS / ICEPOP)": "equal to the spec's behavior_correction "
        "'truncate' / 'mask' with is_correction_threshold (0, cap) (tests/test_framework_openrlhf.py, "
        "direct inputs), but PolicyLossCall and the kit's cases carry no rollout (behaviour) log-probs",
        "is_correction seq level, binary_kl / tv gating, lower threshold > 0": "no spec variant: a "
        "per-sequence geometric-mean or divergence gate that keeps per-token weights, or a lower cut "
        "(finding is_correction_gating; the seq level's logged is_filter_ratio counts an empty row as "
        "filtered: finding is_filter_ratio_empty_rows)",
        "gspo + is_correction": "GSPO then takes its ratio against rollout_log_probs (not in the cases: "
        "finding gspo_rollout_ratio) and ignores is_correction_mode / _gating / _threshold (finding "
        "config:is_correction_mode)",
        "gspo/dual-clip": "a spec variant (GSPO's sequence_mean ratio with the clip gate and dual_clip >= "
        "1 + eps_high, policy_losses.md eq. (7): the dual clip needs the clip gate, not the token level) "
        "that the driver does not run; OpenRLHF applies dual_clip to GSPO's ratio (models/loss.py:203-212)",
        "dr_grpo (seq_sum)": "aggregate_loss has only token-mean and seq-mean-token-mean; no "
        "sum / (sequences x L_max) aggregation (--algo.advantage.estimator dr_grpo changes only the "
        "advantages: mean-centred, not divided by the std; finding dr_grpo_aggregation)",
        "gspo with --actor.loss_agg_mode token-mean": "PolicyLoss replaces it by the sequence mean "
        "(models/loss.py:152) without a word (finding config:loss_agg_mode); the gspo mode runs that mean",
        "gspo_token": "OpenRLHF has no GSPO-token form (its gspo back-propagates the sequence ratio "
        "exactly; the two agree for per-sequence advantages)",
        "sapo": "no SAPO gate in OpenRLHF 0.11.2",
        "cispo": "no CISPO gate in OpenRLHF 0.11.2",
        "KL loss with algo.kl.target (adaptive KL controller)": "kl_ctl changes between steps; "
        "the kit checks one step with a fixed coefficient (the fixed controller is in scope); the KL the "
        "controller reads is each response's per-token mean, not the response's KL (finding "
        "adaptive_kl_per_token), and NaN for a response without an action token, which makes the "
        "coefficient and the next rewards NaN (finding kl_mean_empty_row)",
        "a trailing partial gradient-accumulation window": "iter_grad_accum_global_norm normalises it as a "
        "whole optimizer step, but DeepSpeed, which the kit does not run, folds it into the next step "
        "(finding grad_accum_partial_window); the kit's cases are whole steps",
        "logged policy_loss / entropy_loss": "the logs of ppo_train, not the loss the optimizer steps on "
        "(finding logged_loss_weighting, value only; a micro-batch without action tokens logs a NaN "
        "ppo_clip_ratio / ppo_kl for the step: finding empty_micro_batch_metrics; ppo_clip_ratio leaves "
        "out the tokens the dual clip cuts: finding clip_ratio_dual_clip).",
        "entropy bonus": "actor.entropy_coef needs the model's logits (entropy computed by the Actor); "
        "the kit's cases carry no entropy (its token-mean aggregation: finding entropy_aggregation; NaN "
        "for a -inf logit: finding entropy_neg_inf)",
    },
    "kl": {
        "kl/*+unbiased_gradient": "algo.kl.unbiased_gradient=True returns the estimator's value with a "
        "straight-through k2 gradient (w * (logp - ref)); the kit's KL check differentiates the value; "
        "without --algo.kl.use_loss the KL in the reward never reads the flag (finding "
        "config:unbiased_gradient)",
    },
    "group_advantages": ADV_UNSUPPORTED,
}


NOTES = {
    "device": "OpenRLHF's _optimizer_step_loss_norm (utils/loss_utils.py) builds the step's float32 token / "
    "sequence counts on torch.cuda.current_device() whenever CUDA is available, and divides them by the "
    "accumulation steps there (on a GPU a division by a scalar may round differently from the CPU's, "
    "~1e-7 relative): its numerics depend on the machine. The driver runs that function on the CPU, "
    "as on a machine without CUDA (its copy of loss_utils sees torch.cuda.is_available() False), so the "
    "profile (normalizer_rounding='float32_per_micro_batch') and the matrix describe that arithmetic "
    "on every machine; OpenRLHF's GPU arithmetic is not checked.",
    "per-token advantages": "PolicyLoss takes advantages per token. With the default KL in the reward "
    "(--algo.kl.init_coef 0.01, --algo.kl.use_loss off: compute_approx_kl in make_experience, "
    "experience_maker.py:205-210, then -kl_coef * kl on every token in compute_reward, models/utils.py:144) "
    "get_cumulative_returns makes them vary along the response, and gspo multiplies its one sequence "
    "ratio by each token's advantage (models/loss.py:200), where GSPO (Zheng et al. 2025) has one "
    "advantage per sequence. The kit's calls give one advantage per sequence, which the driver repeats "
    "on every token: the case without KL in the reward (PolicyLoss accepts per-token advantages for gspo "
    "without a check: finding config:advantages).",
    "KL loss with k1": "--algo.kl.use_loss keeps the default estimator k1 unless --algo.kl.estimator is set: "
    "the loss term is then the token mean of log(pi / pi_ref), whose gradient is the score function, zero in "
    "expectation on-policy (kl.md); the launcher only prints a recommendation "
    "(cli/train_ppo_ray.py:730-731). The driver's KL-loss modes use k2 and k3.",
    "adaptive KL controller": "--algo.kl.target selects AdaptiveKLController (trainer/ppo_utils/"
    "kl_controller.py:4), the proportional rule of Ziegler et al. 2019 (arXiv:1909.08593): error "
    "clip(KL / target - 1, -0.2, 0.2), coefficient times 1 + error * n_steps / horizon. It changes the "
    "coefficient between steps; the kit checks one step with a fixed coefficient.",
    "gspo clip": "--actor.policy_loss_type gspo keeps PPO's --actor.eps_clip default 0.2 "
    "(cli/train_ppo_ray.py:406, 633-634) for its sequence ratio (finding gspo_clip_default); the driver's "
    "gspo mode sets GSPO's (3e-4, 4e-4) with --actor.eps_clip_low_high.",
}


#: what a release computes differently from the pinned one (releases.py): before 0.10.4 there is no
#: iter_grad_accum_global_norm (utils/loss_utils.py): training_step normalises each micro-batch by its
#: own token / sequence counts (get_loss_batch_info), DeepSpeed divides by the accumulation steps
#: and before 0.11 compute_approx_kl has no log_probs_old and no clamp of log(pi / pi_ref) at -10
#: (models/utils.py)
#: and get_loss_batch_info's loss_mask.reshape(loss_mask.shape[0], -1) raises on a micro-batch without
#: rows (0.10.3 utils/loss_utils.py:40: zero_rows "raise")
_NO_KL_MAX = {"kl_log_ratio_max": None}
_LOCAL_MICRO_BATCH = {"micro_batch": "local_mean", "normalizer_rounding": "exact", "zero_rows": "raise",
                      **_NO_KL_MAX}
RELEASE_FLAGS = {"0.10.3": {**{m.name: _LOCAL_MICRO_BATCH for m in _POLICY_MODES},
                            **{m.name: _NO_KL_MAX for m in _KL_MODES}},
                 "0.10.4": {m.name: _NO_KL_MAX for m in _POLICY_MODES + _KL_MODES}}

#: the findings of a release before the pinned one only (findings.py), each keyed by the case class it
#: fails, its line verified in that release's installed code
_ICEPOP = Finding(
    "masked_nonfinite", "bug",
    "the ICEPOP correction (enable_vllm_is_correction, vllm_is_correction_type='icepop'; mode "
    "is_correction/token/mask) drops a token outside the threshold by multiplying its weight "
    "exp(old_log_probs - rollout_log_probs) by the boolean band: a padding position whose rollout "
    "log-prob is -inf has weight inf, and inf * 0 is NaN, which (loss * mask).sum() carries into the "
    "step's loss and gradient; 0.11.2 selects with torch.where (models/loss.py:239), which gives 0.",
    affected="openrlhf 0.10.3 (models/loss.py:196), 0.10.4",
    fixed_in="openrlhf 0.11.2, the next release driven (is_correction_mode='mask': torch.where(keep, "
    "token_is, 0.0))",
)
RELEASE_FINDINGS = {
    "0.10.3": (
        Finding(
            "padding_micro_batch", "bug",
            "training_step normalises each micro-batch by its own token (sequence) count "
            "(get_loss_batch_info: loss_mask.sum()), so a micro-batch whose rows are all padding divides "
            "0 by 0 (models/loss.py:23): its loss and gradient are NaN, and the optimizer step that "
            "accumulates them is NaN; the spec's step counts the tokens of the whole step.",
            where="utils/loss_utils.py:33", quote="batch_num_tokens = loss_mask.sum().to(loss_mask.device",
            affected="openrlhf 0.10.3",
            fixed_in="openrlhf 0.10.4 (the optimizer step's normalisers, _optimizer_step_loss_norm)",
        ),
        dataclasses.replace(_ICEPOP, where="models/loss.py:196", quote="vllm_is = vllm_is * mask"),
    ),
    "0.10.4": (dataclasses.replace(_ICEPOP, where="models/loss.py:205", quote="vllm_is = vllm_is * mask"),),
}


def modes(kind: str = "policy_loss") -> dict[str, Mode]:
    """The OpenRLHF modes in scope for ``kind`` ("policy_loss", "kl" or "group_advantages")."""
    from ..releases import release_modes

    _check_kind(kind)
    chosen = {"policy_loss": _POLICY_MODES, "kl": _KL_MODES, "group_advantages": ADV_MODES}[kind]
    flags = {v: {k: f for k, f in by_mode.items() if k in {m.name for m in chosen}}
             for v, by_mode in RELEASE_FLAGS.items()}
    return {m.name: m for m in release_modes(chosen, flags, "openrlhf")}


def unsupported_modes(kind: str = "policy_loss") -> dict[str, str]:
    """OpenRLHF 0.11.2 modes (and spec presets) out of scope for ``kind``, with the reason."""
    _check_kind(kind)
    return dict(_UNSUPPORTED[kind])


def mode_for_preset(preset: str) -> Mode:
    """The mode that reproduces refimpl preset ``preset`` without variant overrides (``PROFILE``,
    from which ``profile("openrlhf", preset)`` is built)."""
    from refimpl.conformance.presets import preset_key

    key = preset_key(preset)
    if key not in PROFILE:
        raise ValueError(f"preset {preset!r} has no OpenRLHF PolicyLoss equivalent; openrlhf profile "
                         f"supports {sorted(PROFILE)}")
    return modes("policy_loss")[PROFILE[key][0]]


def _check_kind(kind: str) -> None:
    if kind not in ("policy_loss", "kl", "group_advantages"):
        raise ValueError(f"kind must be 'policy_loss', 'kl' or 'group_advantages', got {kind!r}")


def _mode(kind: str, mode: str | Mode) -> Mode:
    if isinstance(mode, Mode):
        return mode
    table = modes(kind)
    if mode not in table:
        why = unsupported_modes(kind).get(mode)
        raise ValueError(
            f"mode {mode!r} is not an OpenRLHF {kind} mode in scope"
            + (f" ({why})" if why else f"; modes: {sorted(table)}")
        )
    return table[mode]


def _mode_variant(mode: Mode):
    from refimpl.losses import get_preset

    return dataclasses.replace(get_preset(mode.preset), **mode.variant_overrides)


def policy_loss_kwargs(variant) -> dict[str, object]:
    """``PolicyLoss(...)`` constructor arguments for a ``PolicyLossVariant`` (raises ValueError
    for a variant OpenRLHF cannot express)."""
    v = variant
    if v.gate != "clip" or v.eps_low is None or v.eps_high is None:
        raise ValueError(f"variant: OpenRLHF PolicyLoss has only the two-sided clip gate, got "
                         f"gate={v.gate!r} eps_low={v.eps_low} eps_high={v.eps_high}")
    if v.behavior_correction != "none" or v.entropy_coef != 0:
        raise ValueError("variant: behavior_correction / entropy_coef are not expressible through the kit's "
                         "OpenRLHF driver (no rollout log-probs or entropy in the cases)")
    if v.ratio == "token":
        if v.aggregation not in ("token_mean", "seq_mean_token_mean"):
            raise ValueError(f"variant.aggregation: OpenRLHF has token-mean and seq-mean-token-mean, "
                             f"got {v.aggregation!r}")
        return dict(
            clip_eps_low=v.eps_low,
            clip_eps_high=v.eps_high,
            dual_clip=v.dual_clip,
            token_level_loss=v.aggregation == "token_mean",
            policy_loss_type="ppo",
        )
    if v.ratio == "sequence_mean":
        if v.dual_clip is not None:
            raise ValueError("variant.dual_clip: the driver does not run OpenRLHF's gspo with dual_clip")
        if v.aggregation not in ("seq_mean", "seq_mean_token_mean"):
            raise ValueError(
                f"variant.aggregation: OpenRLHF's gspo forces the sequence mean, got {v.aggregation!r}"
            )
        return dict(clip_eps_low=v.eps_low, clip_eps_high=v.eps_high, policy_loss_type="gspo")
    raise ValueError(f"variant.ratio: OpenRLHF has 'token' (ppo) and 'sequence_mean' (gspo), got {v.ratio!r}")


def config_for_variant(variant) -> dict[str, object]:
    """OpenRLHF's own options (``train_ppo_ray.py``) that run ``variant`` (a ``PolicyLossVariant``;
    raises ValueError where ``policy_loss_kwargs`` does)."""
    kwargs = policy_loss_kwargs(variant)
    config = {
        "actor.policy_loss_type": kwargs["policy_loss_type"],
        "actor.eps_clip_low_high": (kwargs["clip_eps_low"], kwargs["clip_eps_high"]),
        "actor.dual_clip": kwargs.get("dual_clip"),
        "actor.loss_agg_mode": "token-mean" if kwargs.get("token_level_loss") else "seq-mean-token-mean",
        "algo.advantage.is_correction_level": "off",
        "algo.kl.use_loss": variant.kl_coef > 0,
    }
    if variant.kl_coef > 0:
        config = _kl_loss_config(config, variant.kl_estimator, variant.kl_coef)
    return config


def framework_config(mode: Mode, variant) -> dict[str, object]:
    """OpenRLHF's own options that run ``variant`` (``config_for_variant``)."""
    return config_for_variant(variant) if mode.kind == "policy_loss" else dict(mode.framework_config)

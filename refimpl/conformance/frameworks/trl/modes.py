"""TRL 1.16.0: the modes as data (profiles, variants, GRPOConfig keys, modes out of scope)."""

from __future__ import annotations

import dataclasses

from .. import Mode
from ..findings import Finding, ratio_overflow_finding, zero_rows_finding
from .findings import TRAINER_FINDINGS

#: Flags every TRL mode carries (see conventions.FLAG_REASONS), besides the row counting below:
#: - compute_dtype "input": TRL's loss runs in the dtype of the log-probs it is given;
#: - masked_nonfinite "propagate": TRL masks by multiplication, ``(per_token_loss * mask).sum()``, so a
#:   NaN / inf at a masked position reaches the loss (and every gradient);
#: - kl_importance_weight: ``use_bias_correction_kl=True`` (TRL's default) multiplies the k3 term by the
#:   differentiated importance ratio ``coef_1``;
#: - kl_k3_form "naive": the k3 term is ``exp(log r) - log r - 1`` evaluated directly (in float64 its
#:   absolute rounding u (e^|log r| + |log r| + 1) is all of the value when |log r| < 1e-8);
#: - the adv_* flags: TRL's inline advantage code (``_generate_and_score_completions``), read from the
#:   source (nanstd is Bessel-corrected, ``/ (std + 1e-4)``, no zero-variance special case, and
#:   ``num_generations >= 2`` is enforced by GRPOConfig). That code cannot run without a model, so these
#:   flags only shape the inputs of the group case classes.
_COMMON = {
    # TRL counts every row: an empty row is a 0 in grpo's / sapo's mean over rows and a row of
    # dr_grpo's / luspo's per_token_loss.size(0) (the flags change nothing in token-mean modes)
    "empty_rows": "keep",
    "token_sum_rows": "all",
    "compute_dtype": "input",
    "masked_nonfinite": "propagate",
    "kl_importance_weight": True,
    "kl_k3_form": "naive",
    "adv_std": "sample",
    "adv_eps": 1e-4,
    "adv_eps_inside_sqrt": False,
    "adv_zero_variance": "formula",
    "adv_singleton": "error",
}


# Micro-batches. grpo / sapo / gspo (``(per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)``,
# mean over rows), bnpo (local token mean), dr_grpo (``/ (per_token_loss.size(0) * max_completion_length)``)
# and luspo (row sums, mean over rows) divide their local value by current_gradient_accumulation_steps:
# the mean of micro-batch means. dapo / cispo divide the sum by num_items_in_batch (the global token
# count): the reference.
_LOCAL_MEAN = {"micro_batch": "local_mean"}


_GLOBAL_TOKENS: dict = {}
# coef_1 = torch.exp(log_importance_weights) (grpo_trainer.py:3095) overflows above 88.72 in float32: a
# closed gate's 0 times inf is a NaN gradient (cispo's min(coef_1, epsilon_high) is finite, but with
# beta > 0 its bias-corrected KL term k3 * coef_1 is k3 (> 0 there) times inf: an infinite loss and a
# NaN gradient)
_EXP = {"ratio_overflow": "nan"}
# grpo / sapo / gspo / dr_grpo / luspo take a .mean() or divide by size(0) over the rows: 0 rows, 0 / 0
_ROWS = {"zero_rows": "nan"}


_MODES = {
    "grpo": Mode(
        "grpo",
        preset="grpo",
        framework_config={"loss_type": "grpo", "importance_sampling_level": "token"},
        convention={**_EXP, **_ROWS, **_COMMON, **_LOCAL_MEAN},
        description="GRPO: token ratio, hard clip, mean over each row, mean over rows (empty rows count)",
    ),
    "dr_grpo": Mode(
        "dr_grpo",
        preset="dr_grpo",
        framework_config={
            "loss_type": "dr_grpo", "importance_sampling_level": "token", "scale_rewards": "none"
        },
        convention={**_EXP, **_ROWS, **_COMMON, **_LOCAL_MEAN, "adv_scale": "none"},
        description="Dr. GRPO: token sum / (all rows x max_completion_length)",
    ),
    "dapo": Mode(
        "dapo",
        preset="dapo",
        framework_config={"loss_type": "dapo", "importance_sampling_level": "token"},
        convention={**_EXP, **_COMMON, **_GLOBAL_TOKENS},
        description="DAPO: token mean over the global batch (num_items_in_batch)",
    ),
    "bnpo": Mode(
        "bnpo",
        preset="bnpo",
        framework_config={"loss_type": "bnpo", "importance_sampling_level": "token"},
        convention={**_EXP, **_COMMON, **_LOCAL_MEAN},
        description="BNPO: token mean over the local (micro-)batch",
    ),
    "sapo": Mode(
        "sapo",
        preset="sapo",
        framework_config={"loss_type": "sapo", "importance_sampling_level": "token"},
        convention={**_EXP, **_ROWS, **_COMMON, **_LOCAL_MEAN, "sapo_tau_float32": True},
        description="SAPO: soft sigmoid gate (temperatures in float32), GRPO's aggregation",
    ),
    "sapo/sequence": Mode(
        "sapo/sequence",
        preset="sapo",
        # the sigmoid gate on GSPO's sequence ratio, each row's token mean (grpo's aggregation)
        variant_overrides={"ratio": "sequence_mean"},
        framework_config={"loss_type": "sapo", "importance_sampling_level": "sequence"},
        convention={**_EXP, **_ROWS, **_COMMON, **_LOCAL_MEAN, "sapo_tau_float32": True},
        description="SAPO on the sequence ratio (importance_sampling_level='sequence', which TRL accepts "
        "for sapo without a warning, grpo_trainer.py:928)",
    ),
    "cispo": Mode(
        "cispo",
        preset="cispo",
        framework_config={"loss_type": "cispo", "importance_sampling_level": "token"},
        convention={**_EXP, **_COMMON, **_GLOBAL_TOKENS},
        description="CISPO: sg(min(r, epsilon_high)) A logp, token mean over the global batch",
    ),
    "gspo": Mode(
        "gspo",
        preset="gspo",
        # TRL's grpo aggregation is a token mean per row: with a sequence ratio the policy term is the
        # same as GSPO's per-sequence mean, and the KL term (per token) is averaged per row.
        variant_overrides={"aggregation": "seq_mean_token_mean"},
        framework_config={"loss_type": "grpo", "importance_sampling_level": "sequence"},
        convention={**_EXP, **_ROWS, **_COMMON, **_LOCAL_MEAN},
        description="GSPO: importance_sampling_level='sequence' with loss_type='grpo'",
    ),
    "luspo": Mode(
        "luspo",
        preset="gspo",
        # ``(per_token_loss * mask).sum(-1).mean()``: each row's token sum (a sequence ratio counted once per
        # token, i.e. scaled by the length), mean over all rows: seq_mean_token_sum.
        variant_overrides={"aggregation": "seq_mean_token_sum"},
        framework_config={"loss_type": "luspo", "importance_sampling_level": "sequence"},
        convention={**_EXP, **_ROWS, **_COMMON, **_LOCAL_MEAN},
        description="LUSPO: GSPO's sequence ratio, each row's loss scaled by its length, mean over rows",
    ),
}


#: preset -> the modes whose flags are ``--convention trl --preset P`` (ppo's variant equals bnpo's)
PROFILE = {p: (p,) for p in ("grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo")} | {"ppo": ("bnpo",)}


#: TRL GRPOConfig.scale_rewards -> the profile's adv_scale (advantages.md eq. (5), (14))
SCALE_REWARDS = {"group": "group", "batch": "batch_rewards", "none": "none"}


_UNSUPPORTED = {
    "vespo": "VESPO (loss_type='vespo'): its Gamma weighting of the sequence ratio (get_gamma_weights) has "
    "no gate in refimpl's policy-loss family (a lambda <= 0 is silently raised to 1e-4 and a k <= 0 is "
    "accepted: finding config:vespo_lambda_neg).",
    "importance_sampling_level='sequence' with bnpo / dr_grpo / dapo / cispo": "TRL warns against it "
    "(grpo_trainer.py:928: length-weighted sequence ratios); not a mode of the matrix.",
    "use_bias_correction_kl=False": "the profiles use TRL's default (True); False is the reference KL term "
    "(kl_importance_weight=False).",
    "top_entropy_quantile < 1": "the entropy mask needs the model's per-token entropies, which the kit "
    "does not provide; its quantile is taken per micro-batch, not over the optimizer step's batch (finding "
    "entropy_quantile_micro_batch), and values outside [0, 1] are accepted (finding "
    "config:top_entropy_quantile).",
    "entropy_coef / use_adaptive_entropy": "the entropy bonus needs the model's per-token entropies "
    "(note 'entropy bonus': a token mean whatever the loss type); the adaptive controller's band and step "
    "are not checked (finding config:entropy_coef_min).",
    "off_policy_mask_threshold": "off-policy sequence masking (DeepSeek-V3.2) has no refimpl equivalent; a "
    "negative threshold is accepted and drops on-policy negative-advantage rows (finding "
    "config:off_policy_mask_threshold); tokens vLLM could not score count as KL 0 in the sequence's mean "
    "(finding opsm_unscored_tokens).",
    "use_vllm with vllm_importance_sampling_correction": "the behaviour importance ratio is computed "
    "outside the loss (_generate_and_score_completions) from vLLM's log-probs; the kit's call has none "
    "(its level, a sequence product by default whatever the ratio's: finding vllm_is_level; its lower "
    "bound clip_min: finding vllm_is_clip_min; a cap below 1 is accepted: finding "
    "config:vllm_importance_sampling_clip_max; its logged weights count emptied rows: finding "
    "vllm_is_metrics).",
    "steps_per_generation != gradient_accumulation_steps": "the driver runs one generation batch per "
    "optimizer step (TRL's default), where dapo's num_items_in_batch normaliser is exact; over several steps "
    "it is their mean token count, over a part of a step that part's own (finding "
    "generation_batch_normalizer).",
    "RLOOTrainer, GMPOTrainer (experimental)": "RLOOTrainer._compute_loss (a clipped sequence-product ratio, "
    "advantages with the leave-one-out baseline and the KL in the reward) and GMPOTrainer have no mode; "
    "RLOO's exp of the summed log-ratio overflows under a closed gate (finding rloo_ratio_overflow) and "
    "both average over every row, empty ones included (finding empty_rows); GMPOTrainer drops the vLLM "
    "importance-sampling weight its generation computes (finding gmpo_vllm_is) and ignores entropy_coef "
    "and other GRPOConfig settings (finding config:entropy_coef). RLOOConfig accepts an inverted "
    "reward_clip_range (finding config:reward_clip_range) and a negative beta (finding config:beta).",
    "sync_ref_model": "the reference is a fixed input of the kit's calls; TR-DPO's mixing weight is not "
    "checked to lie in [0, 1] (finding config:ref_model_mixup_alpha).",
    "AsyncGRPOTrainer (experimental)": "its compute_loss (the clip loss on packed tree rows, vLLM's "
    "log-probs as the old ones) needs the packing collator's inputs and a fused-head model; it divides "
    "each micro-batch by its own token count (finding async_grpo_normalizer) and exponentiates the raw "
    "log-ratio (finding async_grpo_ratio_overflow).",
    "SDPOTrainer (experimental)": "its policy term (_compute_policy_loss, beside the self-distillation "
    "loss) needs its teacher and rollout machinery; its 'dapo' is a micro-batch token mean, not the global "
    "one its help states (finding sdpo_dapo_normalizer), and scale_rewards='none' still divides the "
    "advantages by 1 + 1e-4 (finding sdpo_scale_none); an unscorable completion gets reward 0 inside its "
    "group's baseline (finding sdpo_unscorable_rewards); its beta is accepted and ignored (finding "
    "config:beta).",
    "A2POTrainer (experimental)": "A*-PO's regression of beta2 log(pi / pi_ref) on r - V* is no "
    "policy-gradient loss of refimpl's family, and Stage 1 needs generation; beta1 / beta2 are not checked "
    "(finding config:beta1) and filter_all_incorrect tests a zero reward sum (finding a2po_all_incorrect).",
    "logged metrics": "the kit judges the loss, not TRL's logged metrics (cispo's clip fraction counts a "
    "capped token only when A > 0: finding cispo_clip_ratio; at importance_sampling_level='sequence' the "
    "clip fractions count empty rows too: finding sequence_metrics_rows; with delta the clip fractions test "
    "the delta-capped ratio: finding delta_clip_metrics; frac_reward_zero_std is a batch "
    "value under scale_rewards='batch': finding frac_reward_zero_std; the vLLM weight's metrics: finding "
    "vllm_is_metrics).",
    "delta with sapo / cispo / vespo": "delta is read only in the clip losses' branch "
    "(grpo_trainer.py:3115); with the other loss types it is accepted and has no effect (finding "
    "config:loss_type).",
    "cispo with epsilon_high as the cap": "the cispo mode is driven with epsilon_high = 1 + eps_high, "
    "eq. (9)'s cap; TRL's documented cap is epsilon_high itself, ScaleRL's eps_max (finding cispo_cap; "
    "0.2 when unset: finding config:epsilon_high).",
    "router_aux_loss_coef": "the MoE auxiliary loss comes from the model's router logits.",
    "tool_mask": "multi-turn tool masks only change the mask, which the kit supplies directly.",
    "eval mode": "model.training=False drops the gradient-accumulation scaling; not a training loss.",
    "num_processes > 1": "the driver runs TRL on one process; ranks are micro-batches of the global batch.",
}


def modes(kind: str = "policy_loss") -> dict[str, Mode]:
    """TRL's loss modes in scope for ``kind`` (only ``"policy_loss"`` has any)."""
    _check_kind(kind)
    return dict(_MODES) if kind == "policy_loss" else {}


def unsupported_modes(kind: str = "policy_loss") -> dict[str, str]:
    """TRL 1.16.0's modes and options outside the driver, with the reason."""
    _check_kind(kind)
    if kind == "kl":
        return {"k3": "TRL has no standalone KL function: its k3 term is inline in _compute_loss "
                      "(checked as policy_loss with beta > 0; the kit's cases keep ref_logp - logp below "
                      "float32's exp overflow, where TRL's k3 is inf and its bias-corrected gradient NaN: "
                      "finding kl_k3_overflow)."}
    if kind == "group_advantages":
        return {"group": "TRL's advantages are inline in _generate_and_score_completions (they need a "
                         "model, generation and reward functions) and assume contiguous equal-size groups "
                         "(rewards.view(-1, num_generations)); they cannot be called on their own (a "
                         "constant group's rounding divided by std + 1e-4: finding constant_group_rounding; "
                         "multi_objective_aggregation='normalize_then_sum' ignores scale_rewards: finding "
                         "config:multi_objective_aggregation; frac_reward_zero_std counts the batch, "
                         "not the groups, under scale_rewards='batch': finding frac_reward_zero_std)."}
    return dict(_UNSUPPORTED)


def _check_kind(kind: str) -> None:
    from .. import KINDS

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def grpo_config_kwargs(mode: str | Mode, variant) -> dict[str, object]:
    """The ``GRPOConfig`` keys that make TRL run ``variant`` (a PolicyLossVariant) in ``mode``.

    TRL's clip bounds are ``[1 - epsilon, 1 + epsilon_high]``, but its cispo clamps the ratio at
    ``epsilon_high`` itself; ``delta`` caps the ratio (refimpl's dual clip for A < 0); ``beta`` is the
    k3 KL weight; ``max_completion_length`` is Dr. GRPO's L_max.
    Raises ValueError for a variant TRL cannot express in that mode.
    """
    m = _mode(mode)
    _check_shape(m, variant)
    loss_type = m.framework_config["loss_type"]
    if variant.kl_coef > 0 and variant.kl_estimator != "k3":
        raise ValueError(f"variant.kl_estimator must be 'k3' for TRL (its only KL), "
                         f"got {variant.kl_estimator!r}")
    if variant.entropy_coef or variant.behavior_correction != "none":
        raise ValueError("variant.entropy_coef / behavior_correction are not driven for TRL "
                         "(see unsupported_modes)")
    keys = dict(m.framework_config)
    if loss_type == "cispo":
        if variant.eps_low is not None or variant.eps_high is None:
            raise ValueError("TRL's cispo clamps only above: variant.eps_low must be None and eps_high set")
        keys.update(epsilon_high=1.0 + variant.eps_high)
    elif loss_type != "sapo":
        if variant.eps_low is None or variant.eps_high is None:
            raise ValueError(f"TRL's {loss_type} clips on both sides: variant.eps_low and eps_high "
                             "must be set")
        keys.update(epsilon=variant.eps_low, epsilon_high=variant.eps_high, delta=variant.dual_clip)
    else:
        keys.update(sapo_temperature_pos=variant.tau_pos, sapo_temperature_neg=variant.tau_neg)
    keys.update(beta=variant.kl_coef, use_bias_correction_kl=True)
    if loss_type == "dr_grpo":
        if variant.max_length is None:
            raise ValueError("variant.max_length (TRL's max_completion_length) is required by dr_grpo")
        keys["max_completion_length"] = variant.max_length
    return keys


_SHAPE_FIELDS = ("ratio", "gate", "aggregation")


def _shape(variant) -> tuple:
    return tuple(getattr(variant, f) for f in _SHAPE_FIELDS)


def _check_shape(m: Mode, variant) -> None:
    """The variant must have the mode's ratio level, gate and aggregation (GSPO's per-sequence mean
    ``seq_mean`` equals TRL's per-row token mean when there is no per-token KL term)."""
    want, got = _shape(mode_variant(m)), _shape(variant)
    gspo_alias = (m.name == "gspo" and variant.kl_coef == 0 and got == (want[0], want[1], "seq_mean"))
    if got != want and not gspo_alias:
        shown = ", ".join(f"{f}={v!r}" for f, v in zip(_SHAPE_FIELDS, want, strict=True))
        raise ValueError(f"TRL mode {m.name!r} runs {shown}; the variant has "
                         + ", ".join(f"{f}={v!r}" for f, v in zip(_SHAPE_FIELDS, got, strict=True)))


def mode_of_variant(variant) -> Mode:
    """The TRL mode whose ratio level, gate and aggregation are the variant's (ValueError if none)."""
    for m in _MODES.values():
        try:
            _check_shape(m, variant)
        except ValueError:
            continue
        return m
    raise ValueError(f"no TRL mode runs ratio={variant.ratio!r}, gate={variant.gate!r}, "
                     f"aggregation={variant.aggregation!r}")


def _mode(mode: str | Mode) -> Mode:
    if isinstance(mode, Mode):
        return mode
    if mode not in _MODES:
        raise ValueError(f"TRL mode must be one of {sorted(_MODES)}, got {mode!r}")
    return _MODES[mode]


def framework_config(mode: str | Mode, variant) -> dict[str, object]:
    """TRL's own ``GRPOConfig`` keys that run ``variant`` in ``mode`` (with the mode's scale_rewards)."""
    from refimpl.conformance.presets import resolve_preset

    m = _mode(mode)
    variant = resolve_preset(variant)[1]  # a seq_sum variant without L_max gets the kit's L_max
    adv_scale = m.convention.get("adv_scale", "group")
    scale_rewards = {ours: theirs for theirs, ours in SCALE_REWARDS.items()}[adv_scale]
    return {**grpo_config_kwargs(m, variant), "scale_rewards": scale_rewards}


def mode_variant(mode: str | Mode):
    """The PolicyLossVariant of ``mode``: its preset with ``variant_overrides``."""
    from refimpl.losses import get_preset

    m = _mode(mode)
    return dataclasses.replace(get_preset(m.preset), **m.variant_overrides)


#: What the driver found in TRL's code (the matrix lists them with the modes that show them).
FINDINGS = (
    Finding(
        "entropy_aggregation", "documented_default",
        "the entropy bonus (entropy_coef, use_adaptive_entropy) is a token mean over the micro-batch for "
        "every loss_type, as the code's comment documents ('the documented objective L = L_policy - coef * "
        "H'), not the loss type's own aggregation (policy_losses.md eq. (12), e.g. a mean of row means for "
        "grpo). Not driven: the kit's calls carry no per-token entropies.",
        where="trainer/grpo_trainer.py:3200",
        quote="(entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0) / "
              "accumulation_factor",
        affected="trl 1.16.0",
    ),
    ratio_overflow_finding("trainer/grpo_trainer.py:3095", "coef_1 = torch.exp(log_importance_weights)",
                           "trl 1.16.0 (grpo, bnpo, dr_grpo, dapo, luspo, sapo; cispo with beta > 0)",
                           extra="loss_type='sapo' has no closed branch, but its gate saturates "
                           "(grpo_trainer.py:3123, sigmoid(tau (inf - 1)) = 1): the sigmoid's zero "
                           "derivative times exp's inf is NaN for either sign of A, where SAPO's exact "
                           "gradient is 0 (policy_losses.md section 5, Range)."),
    zero_rows_finding("trainer/grpo_trainer.py:3154",
                      "loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()",
                      "trl 1.16.0 (grpo, sapo, gspo; dr_grpo and luspo likewise)"),
    Finding(
        "config:delta", "validation",
        "GRPOConfig accepts a two-sided clip delta below 1 + epsilon_high without an error or a warning "
        "(its help only recommends delta > 1 + epsilon): the ratio is capped at delta inside the clip band, "
        "and an A > 0 token there loses its gradient (e.g. delta 1.1, epsilon_high 0.28, ratio 1.22; below "
        "1 even an on-policy token's). delta = 1 + epsilon_high itself is eq. (7)'s dual clip, exact.",
        where="trainer/grpo_trainer.py:3116", quote="coef_1 = torch.clamp(coef_1, max=self.args.delta)",
        affected="trl 1.16.0",
    ),
    Finding(
        "config:epsilon_high", "validation",
        "loss_type='cispo' caps the detached weight at epsilon_high itself (ScaleRL's eps_max, "
        "recommended 5.0 by the help text), but GRPOConfig accepts a cap below 1 without an error or a "
        "warning, and leaving epsilon_high unset gives one: it defaults to epsilon, 0.2 "
        "(grpo_trainer.py:946), so every token's weight is capped at 0.2 and an on-policy token's gradient "
        "is 0.2 A instead of A (CISPO's cap is 1 + eps_high).",
        where="trainer/grpo_trainer.py:3110",
        quote="clamped_ratios = torch.clamp(coef_1, max=self.epsilon_high).detach()", affected="trl 1.16.0",
    ),
    *TRAINER_FINDINGS,  # the trainers' rows, advantages, normaliser, vLLM weight, RLOO (findings.py)
)


#: What the profiles do not reproduce (the matrix lists them with the framework)
NOTES = {
    "entropy bonus": "not driven (the kit's calls carry no per-token entropies): finding "
    "entropy_aggregation",
}

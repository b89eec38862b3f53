"""verl 0.9.1's modes as data: which refimpl variant each mode runs, the convention flags of its
profile (``PROFILE``), the modes out of scope (``unsupported_modes``) and verl's own config keys
(``framework_config``). Evidence for each flag: tests/test_framework_verl.py."""

from __future__ import annotations

from .. import Mode

__all__ = ["PROFILE", "NOTES", "framework_config", "modes", "unsupported_modes"]

# Flags every vanilla mode shares (each explained in conventions.FLAG_REASONS; evidence in
# tests/test_framework_verl.py and the report of this driver's introduction):
# - the log-ratio is clamped to [-20, 20] before exp; clip_ratio_c (3.0) dual-clips A < 0 always;
# - the engine sums micro-batch losses that agg_loss divides by the global counts it is given; the
#   row count is the trainer's global_batch_size, every row of the mini-batch, empty ones included;
# - the loss is computed in the input dtype (bf16 / fp16 log-probs are not upcast).
# the actor's KL loss (use_kl_loss): kl_penalty's low_var_kl clamps log r to +-20 and k3 to +-10, and
# evaluates k3 as exp(log r) - log r - 1 (the "naive" form: in float64 its absolute rounding
# u (e^|log r| + |log r| + 1) is all of the value when |log r| < 1e-8)
_K3 = {"kl_log_ratio_clamp": 20.0, "kl_value_clamp": 10.0, "kl_k3_form": "naive"}
_KL_LOSS = dict(_K3)
_VANILLA = {
    **_KL_LOSS,
    "log_ratio_clamp": 20.0,
    "dual_clip": 3.0,
    "token_sum_rows": "all",  # the trainer's global_batch_size: every row of the mini-batch
    "micro_batch": "global",
    "compute_dtype": "input",
    # torch.min(-A c, loss) at r == c (float32 r = 3.0) splits the gradient in half
    "dual_clip_tie": "half",
}
# NaN / inf at masked positions (measured, see tests/test_framework_verl.py): agg_loss's token modes
# mask the value with torch.where, but its sequence modes sum loss_mat * loss_mask, and NaN * 0 is
# NaN (the +-20 log-ratio clamp turns +-inf into finite values first); with an mse (k2) KL loss on,
# every mode's gradient is NaN there (where's zero cotangent times mse's NaN derivative; the clamps
# of low_var_kl zero it).
_PROPAGATES = {"masked_nonfinite": "propagate"}
# agg_loss's "seq-mean-token-mean" divides by the trainer's global_batch_size (every row). Its
# "/ (tokens + 1e-8)" is exact: the bool mask's int64 count plus 1e-8 is a float32, where the 1e-8
# vanishes for any count >= 1.
_ROW_MEAN = {"empty_rows": "keep", "zero_rows": "nan"}  # a batch of 0 rows: a mean over none, 0 / 0
_AGG_MODES = {
    # loss_agg_mode: (our aggregation, variant overrides, convention flags)
    # a step without tokens: agg_loss divides by batch_num_tokens = 0 (0 / 0)
    "token-mean": ("token_mean", {}, {**_PROPAGATES, "empty_step": "nan"}),  # NaN: via an mse KL only
    "seq-mean-token-mean": ("seq_mean_token_mean", {}, {**_ROW_MEAN, **_PROPAGATES}),
    # sum over the row's tokens, mean over all rows of the batch (policy_losses.md eq. (11))
    "seq-mean-token-sum": ("seq_mean_token_sum", {},
                           {"token_sum_rows": "all", "zero_rows": "nan", **_PROPAGATES}),
    # Dr. GRPO: / (all rows x loss_scale_factor); the driver sets loss_scale_factor = L_max (the default
    # None is the padded width: rollout.response_length in the legacy trainer, each micro-batch's
    # longest response in the v1 one; NOTES, finding seq_sum_width)
    "seq-mean-token-sum-norm": ("seq_sum", {"max_length": 16},
                                {"token_sum_rows": "all", "zero_rows": "nan", **_PROPAGATES}),
    # plain sum over the tokens, no denominator at all
    "token-sum": (
        "seq_mean_token_sum",
        {},
        {"token_sum_rows": "none", "micro_batch": "local_sum", **_PROPAGATES},  # through an mse KL only
    ),
}
_SEQ_MEAN = "seq-mean-token-mean"
_VANILLA_PRESET = {
    "token-mean": "ppo",
    "seq-mean-token-mean": "grpo",
    "seq-mean-token-sum": "dr_grpo",
    "seq-mean-token-sum-norm": "dr_grpo",
    "token-sum": "dr_grpo",
}


def _policy_modes() -> dict[str, Mode]:
    out = {}
    for agg, (aggregation, overrides, flags) in _AGG_MODES.items():
        preset = _VANILLA_PRESET[agg]
        out[f"vanilla/{agg}"] = Mode(
            name=f"vanilla/{agg}",
            preset=preset,
            variant_overrides={**overrides, "aggregation": aggregation} if preset == "dr_grpo" else overrides,
            framework_config={
                "actor.policy_loss.loss_mode": "vanilla",
                "actor.loss_agg_mode": agg,
                # Dr. GRPO's constant: L_max (verl's default None is the padded width: finding
                # seq_sum_width; the kit's cases are narrower than L_max)
                **({"actor.loss_scale_factor": 16} if agg == "seq-mean-token-sum-norm" else {}),
            },
            convention={**_VANILLA, **flags},
            description=f"compute_policy_loss_vanilla + agg_loss({agg!r}), dual clip clip_ratio_c",
        )
    out["gspo"] = Mode(
        name="gspo",
        preset="gspo",
        framework_config={"actor.policy_loss.loss_mode": "gspo", "actor.loss_agg_mode": _SEQ_MEAN},
        convention={
            **_KL_LOSS,
            "sequence_ratio_gradient": "token",
            "sequence_log_ratio_cap": 10.0,
            "micro_batch": "global",
            "compute_dtype": "input",
            **_ROW_MEAN,
            **_PROPAGATES,  # NaN and +-inf: GSPO's log-ratio is not clamped, inf * 0 is NaN
        },
        description="compute_policy_loss_gspo (GSPO-token ratio, log s capped at 10), seq-mean-token-mean",
    )
    # loss_agg_mode is honoured by compute_policy_loss_gspo from 0.9.1 on (core_algos.py:1603-1606);
    # 0.9.0 forced seq-mean-token-mean (RELEASE_FLAGS, docs/conformance-drift.md)
    out["gspo/token-mean"] = Mode(
        name="gspo/token-mean",
        preset="gspo",
        variant_overrides={"aggregation": "token_mean"},
        framework_config={"actor.policy_loss.loss_mode": "gspo", "actor.loss_agg_mode": "token-mean"},
        convention={**{k: v for k, v in out["gspo"].convention.items() if k not in _ROW_MEAN},
                    "empty_step": "nan"},
        description="compute_policy_loss_gspo with loss_agg_mode='token-mean' (verl's default)",
    )
    out["sapo"] = Mode(
        name="sapo",
        preset="sapo",
        framework_config={"actor.policy_loss.loss_mode": "sapo", "actor.loss_agg_mode": _SEQ_MEAN},
        convention={
            **_KL_LOSS,
            "log_ratio_clamp": 20.0,
            "micro_batch": "global",
            "compute_dtype": "input",
            **_ROW_MEAN,
            **_PROPAGATES,
        },
        description="compute_policy_loss_sapo (always seq-mean-token-mean)",
    )
    out["sapo/token-mean"] = Mode(
        name="sapo/token-mean",
        preset="sapo",
        variant_overrides={"aggregation": "token_mean"},
        framework_config={"actor.policy_loss.loss_mode": "sapo", "actor.loss_agg_mode": "token-mean"},
        convention={**out["sapo"].convention, "fixed_aggregation": "seq_mean_token_mean"},
        description="compute_policy_loss_sapo with loss_agg_mode='token-mean', which it ignores "
        "(core_algos.py:1689: always seq-mean-token-mean)",
    )
    out["cispo"] = Mode(
        name="cispo",
        preset="cispo",
        framework_config={
            "actor.policy_loss.loss_mode": "cispo",
            "actor.loss_agg_mode": "token-mean",
            "actor.clip_ratio_low": 0.2,
        },
        convention={
            **_KL_LOSS,
            # log_prob - old_log_prob clamped to +-20 before exp, inside the detached weight only
            "log_ratio_clamp": 20.0,
            # the default config clips the weight below too (clip_ratio_low 0.2, actor.py:159,
            # core_algos.py:2079): CISPO's preset caps it above only
            "cispo_clip_low": 0.2,
            "empty_step": "nan",
            "micro_batch": "global",
            "compute_dtype": "input",
            **_PROPAGATES,  # NaN at a masked position: the value is masked, its gradient -sg(NaN) A is NaN
        },
        description="compute_policy_loss_cispo: sg(clip(exp(clamp(x, +-20)), 1 - low, 1 + high)) A logp, "
        "token-mean",
    )
    # Clip-Cov with an empty covariance band, clip_cov_lb = clip_cov_ub (the open band (1, 1) selects no
    # token, so its unseeded torch.randperm never runs): PPO's clipped loss without verl's +-20 clamp of
    # the log-ratio or its dual clip. What remains is checkable, the raw exp(log r) above all
    # (core_algos.py:1798: ratio_overflow)
    out["clip_cov"] = Mode(
        name="clip_cov",
        preset="ppo",
        framework_config={"actor.policy_loss.loss_mode": "clip_cov", "actor.loss_agg_mode": "token-mean",
                          "actor.policy_loss.clip_cov_lb": 1.0, "actor.policy_loss.clip_cov_ub": 1.0},
        convention={
            **_KL_LOSS,
            "ratio_overflow": "nan",
            "empty_step": "nan",
            "micro_batch": "global",
            "compute_dtype": "input",
            **_PROPAGATES,
        },
        description="compute_policy_loss_clip_cov with clip_cov_lb = clip_cov_ub = 1 (an empty covariance "
        "band: no token selected, so no random choice): PPO's clip on exp(log r), no clamp, no dual clip; "
        "token-mean",
    )
    out["geo_mean"] = Mode(
        name="geo_mean",
        preset="gspo",
        # GMPO = GSPO's geometric-mean ratio with each token clipped in log space (md eq. (18)), at
        # verl's default clip_ratio 0.2
        variant_overrides={"gate": "log_clip", "eps_low": 0.2, "eps_high": 0.2},
        framework_config={"actor.policy_loss.loss_mode": "geo_mean", "actor.loss_agg_mode": "token-mean"},
        convention={
            **_KL_LOSS,
            # the policy term ignores loss_agg_mode; ppo_loss's KL loss uses it: a global token mean
            "kl_aggregation": "token_mean",
            # and that token mean divides by the step's 0 tokens on an empty step: 0 / 0 (with a KL term)
            "empty_step": "nan",
            "empty_rows": "keep",
            "micro_batch": "local_sum",
            "compute_dtype": "input",
            **_PROPAGATES,  # (x * mask).sum(-1) for the ratio and the advantage: NaN and +-inf
        },
        description="compute_policy_loss_geo_mean (GMPO): torch.mean over the micro-batch's rows",
    )
    return out


_KL_MODES = {
    # kl_penalty name: (our estimator, convention flags)
    "kl": ("k1", {}),
    "k1": ("k1", {}),
    "mse": ("k2", {}),
    "k2": ("k2", {}),
    "low_var_kl": ("k3", dict(_K3)),
    "k3": ("k3", dict(_K3)),
    "kl+": ("k1", {"kl_gradient": "k2"}),
    "k1+": ("k1", {"kl_gradient": "k2"}),
    # k2's own gradient, through the straight-through form (inf - inf = NaN at an infinite log-ratio)
    "mse+": ("k2", {"kl_gradient": "k2"}),
    "k2+": ("k2", {"kl_gradient": "k2"}),
    "low_var_kl+": ("k3", {**_K3, "kl_gradient": "k2"}),
    "k3+": ("k3", {**_K3, "kl_gradient": "k2"}),
}

# verl's GRPO: sample std, std + eps, (R - mean) / eps for a constant group, a singleton's mean 0 /
# std 1 held in float32 tensors, so its divisor is float32(1 + eps).
_GRPO_ADV = {
    "adv_std": "sample",
    "adv_eps": 1e-6,
    "adv_eps_inside_sqrt": False,
    "adv_zero_variance": "formula",
    "adv_singleton": "raw",
    "adv_singleton_float32": True,
}
_ADV_MODES = {
    "grpo": ("compute_grpo_outcome_advantage", {"norm_adv_by_std_in_grpo": True}, {**_GRPO_ADV}),
    "grpo/no_std": (
        "compute_grpo_outcome_advantage",
        {"norm_adv_by_std_in_grpo": False},
        {"adv_scale": "none", "adv_singleton": "raw"},
    ),
    "rloo": (
        "compute_rloo_outcome_advantage",
        {},
        {"adv_scale": "none", "adv_leave_one_out": True, "adv_singleton": "raw"},
    ),
    "grpo_vectorized": (
        "compute_grpo_vectorized_outcome_advantage",
        {"norm_adv_by_std_in_grpo": True},
        # group_mean_std (utils/groupwise.py:191): scores, mean and variance in float32
        {**_GRPO_ADV, "adv_compute_dtype": "float32"},
    ),
    "rloo_vectorized": (
        "compute_rloo_vectorized_outcome_advantage",
        {},
        {"adv_scale": "none", "adv_leave_one_out": True, "adv_singleton": "zero"},
    ),
}


#: preset -> the modes whose flags are ``--convention verl --preset P``: verl's GRPO advantages
#: (norm_adv_by_std_in_grpo=False for dr_grpo) plus the policy-loss mode
_PRESET_POLICY_MODE = {
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
PROFILE = {
    p: ("grpo",) + (("grpo/no_std",) if p == "dr_grpo" else ()) + (m,) for p, m in _PRESET_POLICY_MODE.items()
}
#: behaviours of verl 0.9.1 the profiles do not reproduce (stated, not silently approximated)
NOTES = {
    "dual-clip tie": "at a ratio exactly equal to clip_ratio_c verl's torch.min splits the "
    "gradient in half; the kit follows the inclusive gate of policy_losses.md eq. (6) (no float64 "
    "log-ratio has exp exactly 3.0, so no case reaches the tie).",
    "loss_scale_factor=None": "a bug of the default trainer (finding seq_sum_width): agg_loss's "
    "seq-mean-token-sum-norm (Dr. GRPO) divides by the padded width of its mask, loss_mask.shape[-1] "
    "(core_algos.py:1191; flag seq_sum_width='padded_width'). The legacy trainer pads every response to "
    "rollout.response_length (experimental/agent_loop/agent_loop.py:760-763), L_max; the default v1 "
    "trainer (trainer.use_v1: true) pads each micro-batch to its own longest response "
    "(workers/utils/losses.py:91), so there the divisor varies. The profile sets loss_scale_factor = "
    "L_max, Dr. GRPO's constant, since the kit's cases are narrower than L_max.",
    "adaptive KL controller": "not checked (no KL-controller kind): finding kl_controller",
    "standalone agg_loss": "called without global batch info, verl's sequence modes drop "
    "empty rows from the row count; the profile describes the trainer, whose "
    "global_batch_size counts every row (empty_rows='keep').",
}


def framework_config(mode: Mode, variant) -> dict[str, object]:
    """verl's own ``actor_rollout_ref.actor`` / ``algorithm`` keys that run ``variant`` in a
    policy-loss ``mode`` (other kinds: the mode's keys)."""
    if mode.kind != "policy_loss":
        return dict(mode.framework_config)
    v = variant
    loss_mode, _, agg = mode.name.partition("/")
    agg = agg or ("token-mean" if loss_mode == "cispo" else "seq-mean-token-mean")
    dual_clip = mode.convention.get("dual_clip")
    return {
        "actor.policy_loss.loss_mode": loss_mode,
        # a side without a clip: 1 - 1 = 0 and 1 + inf (what the verl driver passes)
        "actor.clip_ratio_low": (mode.convention.get("cispo_clip_low", 1.0) if v.eps_low is None
                                 else v.eps_low),
        "actor.clip_ratio_high": float("inf") if v.eps_high is None else v.eps_high,
        "actor.clip_ratio_c": dual_clip if dual_clip is not None else (v.dual_clip or 3.0),
        "actor.loss_agg_mode": agg,
        "actor.loss_scale_factor": v.max_length if agg == "seq-mean-token-sum-norm" else None,
        "actor.use_kl_loss": v.kl_coef > 0,
        "actor.kl_loss_coef": v.kl_coef,
        "actor.kl_loss_type": {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}[v.kl_estimator],
        "algorithm.norm_adv_by_std_in_grpo": mode.preset != "dr_grpo",
        "actor.tau_pos": v.tau_pos,
        "actor.tau_neg": v.tau_neg,
        **{k: val for k, val in mode.framework_config.items() if k.startswith("actor.policy_loss.")},
    }


#: what a release computes differently from the pinned one (releases.py): verl 0.9.0's (and 0.8.0's)
#: compute_policy_loss_gspo passed loss_agg_mode="seq-mean-token-mean" whatever the config
_GSPO_SEQ_MEAN = {"gspo/token-mean": {"fixed_aggregation": "seq_mean_token_mean", **_ROW_MEAN}}
RELEASE_FLAGS = {"0.8.0": _GSPO_SEQ_MEAN, "0.9.0": _GSPO_SEQ_MEAN}


def modes(kind: str = "policy_loss") -> dict[str, Mode]:
    """verl's modes in scope for ``kind`` ("policy_loss", "kl" or "group_advantages")."""
    if kind == "policy_loss":
        from ..releases import release_modes

        return {m.name: m for m in release_modes(tuple(_policy_modes().values()), RELEASE_FLAGS, "verl")}
    if kind == "kl":
        return {
            name: Mode(
                name=name,
                kind="kl",
                variant_overrides={"kl_estimator": estimator},
                framework_config={"actor.kl_loss_type": name},
                convention=flags,
                description=f"kl_penalty(logp, ref_logp, {name!r}): {estimator}"
                + (" value, k2 gradient (straight-through)" if "kl_gradient" in flags else ""),
            )
            for name, (estimator, flags) in _KL_MODES.items()
        }
    if kind == "group_advantages":
        return {
            name: Mode(
                name=name,
                kind="group_advantages",
                framework_config={"algorithm.adv_estimator": name.split("/")[0], **kwargs},
                convention=flags,
                description=f"{function}({', '.join(f'{k}={v}' for k, v in kwargs.items())})",
            )
            for name, (function, kwargs, flags) in _ADV_MODES.items()
        }
    raise ValueError(f"kind must be one of ('policy_loss', 'kl', 'group_advantages'), got {kind!r}")


def unsupported_modes(kind: str = "policy_loss") -> dict[str, str]:
    """verl 0.9.1 modes of ``kind`` that the kit does not check, with the reason."""
    if kind == "policy_loss":
        return {
            "dppo_tv": "DPPO total-variation trust region: a mask from the probability difference "
            "|pi - pi_old| needs the token probabilities' own trust-region family, not in the spec (its "
            "ratio is truncated at the dual clip's 3.0, not the code's 20: finding dppo_truncation_cap)",
            "dppo_kl": "DPPO KL trust region: a binary-KL mask, not in the spec's policy-loss family "
            "(truncated at 3.0 like dppo_tv: finding dppo_truncation_cap)",
            "gpg": "GPG: -logp * A without a ratio (a REINFORCE loss); not a member of the family",
            "clip_cov with a covariance band": "Clip-Cov: clips a random subset of the tokens whose "
            "covariance lies in (clip_cov_lb, clip_cov_ub) (torch.randperm without a seed): no "
            "deterministic expected value; the mode clip_cov runs it with an empty band",
            "kl_cov": "KL-Cov: a KL penalty on the top-k covariance tokens; not in the spec",
            "dro": "DRO: logp * A - beta / 2 (log r)^2, a quadratic penalty the spec does not define",
            "bypass_mode": "rollout-correction bypass (reinforce / ppo_clip over rollout log-probs, "
            "with rejection-sampling masks): needs rollout_log_probs and RolloutCorrectionConfig (its "
            "rejection sampling: finding rejection_sampling_returns, finding rejection_sampling_sessions, "
            "finding rs_k1_bounds; its token-mean keeps rejected tokens in the denominator, as the v1 "
            "trainer's decoupled mode does; the legacy trainer's drops them: finding rs_normalizer)",
            "rollout_is_weights": "rollout importance weights (any loss mode) need "
            "rollout_log_probs; the kit's behaviour correction is a separate variant field (geo_mean's "
            "token weights: finding geo_mean_is_weights)",
            "seq-mean-token-sum-norm without loss_scale_factor": "divides by the padded width, which the "
            "kit's calls set to L_max through loss_scale_factor (finding seq_sum_width; a factor below the "
            "responses' lengths, 0 or negative is accepted: finding config:loss_scale_factor)",
        }
    if kind == "kl":
        return {
            "abs": "|logp - ref_logp| is not a KL estimator of kl.md (no k-form, biased)",
            "full": "raises NotImplementedError in verl 0.9.1",
        }
    if kind == "group_advantages":
        why_token = "token-level returns over a trajectory, not an outcome advantage of a group"
        return {
            "gae": why_token + " (needs values and a discount)",
            "reinforce_plus_plus": why_token + " (discounted returns, then whitened over the batch)",
            "reinforce_plus_plus_baseline": "group-mean baseline, then whitened over the whole batch "
            "with masked_whiten: a batch-std scale of centred values that masks tokens",
            "remax": "needs the greedy rollout's reward as baseline",
            "opo": "length-weighted group mean baseline: needs response lengths",
            "grpo_passk": "pass@k advantage: only the best response of a group gets a non-zero value",
            "gpg": "GPG's rescaling alpha = B / count_nonzero(rewards) (finding gpg_alpha: not GPG's "
            "B / (B - M)), then the group mean without a std",
            "gdpo": "multi-reward decoupled normalisation: needs several reward channels",
            "filter_groups (DAPO dynamic sampling)": "drops whole groups before the estimator; not an "
            "advantage (finding dapo_filter)",
            "optimal_token_baseline": "token-level baseline from sum pi^2 statistics of the model",
            "tir_optimal_token_baseline": "token-level baseline from sum pi^2 statistics of the model",
        }
    raise ValueError(f"kind must be one of ('policy_loss', 'kl', 'group_advantages'), got {kind!r}")

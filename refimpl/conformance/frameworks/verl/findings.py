"""verl 0.9.1's findings (findings.py: each with its class, line, releases): what the driver found in
verl's code beyond its profiles' flags. The matrix lists them with the modes that show them; each bug and
validation finding has a standalone script (repro_verl.py, repro_bodies.py)."""

from __future__ import annotations

from ..findings import Finding, dual_clip_tie_finding, ratio_overflow_finding

__all__ = ["FINDINGS"]

_AFFECTED = "verl 0.9.1"

#: Departures verl would likely want to change (the matrix lists them with the modes that show them).
FINDINGS = (
    Finding(
        "kl_controller", "documented_default",
        "kl_ctrl.type='adaptive' is the proportional controller of Ziegler et al. 2019 (arXiv:1909.08593) "
        "that its docstring cites, beta *= 1 + clip(KL / target - 1, -0.2, 0.2) n_steps / horizon, not the "
        "PPO paper's adaptive rule (policy_losses.md eq. (20): halve or double beta outside [target / 1.5, "
        "1.5 target]). Not driven: the kit has no KL-controller kind.",
        where="trainer/ppo/core_algos.py:173", quote="mult = 1 + proportional_error * n_steps / self.horizon",
        affected="verl 0.9.1",
    ),
    Finding(
        "fixed_aggregation", "bug",
        "compute_policy_loss_sapo aggregates with 'seq-mean-token-mean' whatever actor.loss_agg_mode "
        "says: the configured aggregation (and so each token's weight in the gradient) is ignored "
        "without a word.",
        where="trainer/ppo/core_algos.py:1689", quote='loss_agg_mode="seq-mean-token-mean"',
        affected="verl 0.9.1",
    ),
    Finding(
        "cispo_clip_low", "documented_default",
        "compute_policy_loss_cispo clips its detached weight on both sides, to [1 - clip_ratio_low, "
        "1 + clip_ratio_high] (0.2 below by default): the two-sided form of the CISPO paper's general "
        "formula, with a documented default; MiniMax's setting caps it above only (clip_ratio_low = 1).",
        where="trainer/ppo/core_algos.py:2079",
        quote="clipped_ratio = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)",
        affected="verl 0.9.1",
    ),
    # the driven compute_policy_loss_vanilla's line; the deprecated compute_policy_loss repeats it (:1274)
    dual_clip_tie_finding("trainer/ppo/core_algos.py:1356",
                          "clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)", "verl 0.9.1",
                          function="compute_policy_loss_vanilla"),
    Finding(
        "zero_rows", "value_only",
        "agg_loss called without global batch info on a batch with no rows divides by its 0 rows "
        "(global_batch_size = seq_mask.sum()): a NaN loss, while the gradient w.r.t. the empty log-probs has "
        "no entry. In verl's trainer each micro-batch gets the mini-batch's global_batch_size and "
        "batch_num_tokens (workers/utils/losses.py:65-68), so an empty micro-batch gives 0 there; only a "
        "caller of agg_loss (or of a policy loss with an empty global_batch_info) sees the NaN.",
        where="trainer/ppo/core_algos.py:1188",
        quote="loss = verl_F.masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size",
        affected="verl 0.9.1 (the sequence aggregations; the token ones through empty_step)",
    ),
    Finding(
        "empty_step", "value_only",
        "the token-mean losses divide by the step's token count: a step with no token logs the loss "
        "0 / 0 = NaN, while its gradient is exactly 0 (masked_sum zeroes the masked entries first), as "
        "the spec's.",
        where="trainer/ppo/core_algos.py:1175",
        quote="loss = verl_F.masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size",
        affected="verl 0.9.1",
    ),
    ratio_overflow_finding("trainer/ppo/core_algos.py:1798", "ratio = torch.exp(negative_approx_kl)",
                           "verl 0.9.1 (clip_cov; kl_cov, without a clip gate, exponentiates the raw "
                           "log-ratio too, core_algos.py:1891: there a token with A = 0 gets -0 * inf = NaN)",
                           function="compute_policy_loss_clip_cov",
                           upstream="https://github.com/verl-project/verl/pull/6538 (open: clamps the "
                           "log-ratio of clip_cov, kl_cov and geo_mean)"),
    Finding(
        "config:clip_ratio", "validation",
        "actor.clip_ratio has no effect on the clip losses (vanilla, gspo, clip_cov, geo_mean, cispo): "
        "ActorConfig (and actor.yaml) default clip_ratio_low and clip_ratio_high to 0.2, not None, so "
        "their fallback to clip_ratio (core_algos.py:1321-1322 in vanilla, likewise in the others) never "
        "fires. A user who sets only clip_ratio=0.1 trains with the band [0.8, 1.2], without an error or a "
        "warning. The DPPO losses read clip_ratio_low / clip_ratio_high first too (core_algos.py:1414-1416, "
        "1495-1497), so clip_ratio is without effect there as well.",
        where="workers/config/actor.py:159", quote="clip_ratio_low: float = 0.2", affected="verl 0.9.1",
    ),
    Finding(
        "config:tau_pos", "validation",
        "ActorConfig accepts SAPO temperatures tau_pos / tau_neg <= 0 (SAPO's gate sigmoid(tau (r - 1)) "
        "4 / tau needs tau > 0): tau = 0 gives an infinite loss and a NaN gradient (4 / 0 times "
        "sigmoid's zero slope); a negative tau makes the gate's value negative, with the gradient of "
        "|tau| (sigmoid's slope is even).",
        where="trainer/ppo/core_algos.py:1659", quote="return torch.sigmoid(tau * (x - 1.0)) * (4.0 / tau)",
        affected="verl 0.9.1", function="gate_function",
    ),
    Finding(
        "kl_value_clamp", "bug",
        "kl_penalty's low_var_kl / k3 (the default actor.kl_loss_type, and algorithm.kl_penalty for the KL "
        "in the reward) clamps k3 to [-10, 10] after clamping log r to [-20, 20]: where k3 exceeds 10 "
        "(ref_logp - logp > 2.61 or < -11: the tokens that moved farthest from the reference) its value "
        "stops at 10 and its gradient is exactly 0 (kl.md eq. (4) has no clamp; flags kl_value_clamp, "
        "kl_log_ratio_clamp). The same clamp is a finding of OpenRLHF and skyrl 0.4.0.",
        where="trainer/ppo/core_algos.py:2245", quote="return torch.clamp(kld, min=-10, max=10)",
        affected=_AFFECTED, function="kl_penalty_forward",
    ),
    # -- outside the driven calls (the trainer's assembly, estimators and helpers the kit does not drive) --
    Finding(
        "rejection_sampling_returns", "bug",
        "the rollout correction's rejection sampling (algorithm.rollout_correction.rollout_rs, decoupled "
        "mode) writes its mask into response_mask before the advantages are computed "
        "(ray_trainer.py:1658 then 1667; v1/trainer_base.py:1771 then 1775), and GAE and REINFORCE++ treat a "
        "masked token like an observation token: its reward and value are skipped (core_algos.py:254-256, "
        "720-726). A rejected token that carries the outcome score (the last one, where the reward "
        "managers put it) takes the score out of every return of its response: a rejected-at-the-end "
        "response trains its other tokens on return 0 and the critic on it. Rejection should drop the token "
        "from the loss only (policy_losses.md eq. (13); estimators.md eq. (1), (5)). GRPO's row sum keeps "
        "the score.",
        where="trainer/ppo/rollout_corr_helper.py:1061",
        quote='batch.batch["response_mask"] = modified_response_mask', affected=_AFFECTED,
    ),
    Finding(
        "rejection_sampling_sessions", "bug",
        "the v1 trainer's GRPO over agent sessions with several outputs "
        "(compute_advantage_for_multi_trajectories) computes the group advantage of each session's final "
        "output and reads it at argmax(response_mask) of that output, then gives it to every output of the "
        "session. Rejection sampling runs first (v1/trainer_base.py:1771 then 1775): when it empties the "
        "final output's mask (a sequence-level rollout_rs), the value read is advantage * 0 = 0, and the "
        "session's other, unrejected outputs train on advantage 0 instead of the session's (advantages.md "
        "eq. (1)-(5)).",
        where="trainer/ppo/v1/utils.py:208",
        quote='first_nnz_indices = final_data.batch["response_mask"].argmax(dim=1)', affected=_AFFECTED,
    ),
    Finding(
        "rs_k1_bounds", "bug",
        "rollout_rs token_k1 / seq_sum_k1 / seq_mean_k1 compare their lower_upper bounds, documented as "
        "ratio bounds (RolloutCorrectionConfig, rollout_is_threshold's lower_upper bounds the ratio "
        "itself), with -log r, i.e. with 1 / r for r = pi_train / pi_rollout: the bounds 0.5_1.5 keep r in "
        "[0.667, 2], rejecting r = 0.6 and keeping r = 1.9. Symmetric bounds (the default lower = 1 / "
        "upper) are unaffected.",
        where="trainer/ppo/rollout_corr_helper.py:263", quote="token_k1: torch.Tensor = -log_ratio_safe",
        affected=_AFFECTED,
        upstream="https://github.com/verl-project/verl/pull/6377 (closed without merging)",
    ),
    Finding(
        "rollout_is_sequence", "documented_default",
        "rollout_is='sequence' multiplies every token term of a token-ratio loss (vanilla PPO, the "
        "default) by the sequence's product weight exp(sum log w), where policy_losses.md eq. (13) puts "
        "the behaviour weight at the ratio's level (a token's own weight for token ratios); "
        "RolloutCorrectionConfig documents the level ('product of tokens; unbiased, high variance').",
        where="trainer/ppo/rollout_corr_helper.py:586",
        quote="raw_rollout_is_weights = torch.exp(log_ratio_sum_safe).expand_as(log_ratio)",
        affected=_AFFECTED,
    ),
    Finding(
        "geo_mean_is_weights", "bug",
        "compute_policy_loss_geo_mean (GMPO) turns token rollout weights into a sequence weight "
        "exp(mean log(w + 1e-10)): a token whose weight the rollout correction set to 0 (IcePop's "
        "lower_upper threshold) gives the sequence the weight (1e-10)^(1 / T), 0.32 at T = 20, instead of "
        "0, and a truncated (TIS) weight is capped per token before the mean, not at the sequence level "
        "(policy_losses.md eq. (13): the weight at the ratio's level, here the geometric mean, then capped "
        "or masked).",
        where="trainer/ppo/core_algos.py:1996", quote="torch.log(rollout_is_weights + 1e-10)",
        affected=_AFFECTED,
    ),
    Finding(
        "gspo_aggregation", "documented_default",
        "compute_policy_loss_gspo aggregates with actor.loss_agg_mode, whose default is token-mean (the "
        "code's comment says so): each response's sequence-level term then weighs its length, where "
        "GSPO's objective is a mean over the responses (policy_losses.md table 2: seq_mean; mode "
        "gspo/token-mean runs the default).",
        where="trainer/ppo/core_algos.py:1604",
        quote="we support aggregate the loss in different modes, default is token-mean.", affected=_AFFECTED,
    ),
    Finding(
        "seq_sum_width", "bug",
        "agg_loss's seq-mean-token-sum-norm (Dr. GRPO) with loss_scale_factor=None divides by "
        "loss_mask.shape[-1], the padded width of the loss's tensors, where actor.yaml documents 'If null, "
        "uses response_length' (flag seq_sum_width='padded_width'). The legacy trainer pads every response "
        "to rollout.response_length, as documented; the default trainer (trainer.use_v1: true) stores each "
        "response unpadded (v1/agent_loop_tq.py:183-199) and ppo_loss pads each micro-batch to its own "
        "longest response (workers/utils/losses.py:91; workers/utils/padding.py:113-119), so there the "
        "divisor is neither response_length nor a constant: it changes from micro-batch to micro-batch "
        "(policy_losses.md eq. (11): L_max, never the padded width), which the documentation does not "
        "choose. Setting loss_scale_factor gives the paper's loss.",
        where="trainer/ppo/core_algos.py:1191", quote="horizon = loss_mask.shape[-1]", affected=_AFFECTED,
    ),
    Finding(
        "gae_padding_output", "value_only",
        "compute_gae_advantage_return returns masked_whiten's (x - mean) / std at the masked positions too "
        "(-mean / std at padding, not 0: advantages.md eq. (22)); the other estimators multiply by the "
        "mask. Every verl loss masks those positions, so only the returned tensor departs.",
        where="trainer/ppo/core_algos.py:262",
        quote="advantages = verl_F.masked_whiten(advantages, response_mask)",
        affected=_AFFECTED,
    ),
    Finding(
        "gpg_alpha", "bug",
        "compute_gpg_outcome_advantage scales by alpha = B / count_nonzero(scores), the batch over its "
        "non-zero *rewards* before centring, where GPG (Chu et al. 2025, arXiv:2504.02546) rescales by "
        "B / (B - M), M the samples whose advantage is 0 (groups with equal rewards): with 0/1 rewards "
        "(1, 0 | 0, 0) verl's alpha is 4, GPG's 2; with -1/+1 rewards it is always 1. The function's alpha "
        "and f_norm arguments are overwritten / unused.",
        where="trainer/ppo/core_algos.py:810", quote="m = torch.count_nonzero(scores)", affected=_AFFECTED,
        upstream="https://github.com/verl-project/verl/pull/6803 (open; its author keeps alpha = bsz / "
        "count_nonzero(scores) as 'the actual GPG scaling', against the paper's B / (B - M))",
    ),
    Finding(
        "dapo_filter", "bug",
        "the v1 trainer's DAPO dynamic sampling (algorithm.filter_groups) drops a group only when it has "
        "more than one sample and float(np.std(values)) == 0.0: a singleton group is kept (advantages.md "
        "eq. (7) drops it: it has no baseline), and equality goes through a rounded std, so a constant group "
        "of 0.1 rewards (np.std([0.1] * 3) = 1.4e-17) is kept and trains on the rounding noise its "
        "estimator amplifies (advantages.md: 'compares rewards exactly (max == min), never a rounded "
        "variance').",
        where="trainer/ppo/v1/replay_buffer.py:312", quote="float(np.std(values)) == 0.0", affected=_AFFECTED,
        function="_dapo_filtered_keys",
    ),
    Finding(
        "config:clip_ratio_c", "validation",
        "compute_policy_loss_vanilla asserts only clip_ratio_c > 1, while the dual clip needs c >= 1 + "
        "clip_ratio_high (policy_losses.md eq. (7)): c = 1.1 with the default band [0.8, 1.2] caps the loss "
        "of an A < 0 token at r in (1.1, 1.2], inside the band, and takes its gradient away.",
        where="trainer/ppo/core_algos.py:1331", quote="assert clip_ratio_c > 1.0", affected=_AFFECTED,
        function="compute_policy_loss_vanilla",
    ),
    # -- the audit of issue 27 (source first): departures the kit named only in prose or not at all --
    Finding(
        "micro_batch", "bug",
        "compute_policy_loss_geo_mean (GMPO) returns torch.mean(pg_losses), a mean over the rows of the "
        "micro-batch it is given, ignoring actor.loss_agg_mode and the global batch info ppo_loss fills "
        "(workers/utils/losses.py:65-68) that every other verl loss divides by (flag "
        "micro_batch='local_sum', mode geo_mean). The engine sums the "
        "micro-batch losses without rescaling (workers/engine/fsdp/transformer_impl.py:761-767, "
        "loss.backward() per micro-batch) and FSDP averages over the dp ranks, so the GMPO gradient of a "
        "mini-batch is multiplied by its number of micro-batches per rank (ppo_mini_batch_size x n / dp / "
        "ppo_micro_batch_size_per_gpu) and empty rows count in the mean (policy_losses.md eq. (11): "
        "seq_mean over the non-empty rows of the whole batch).",
        where="trainer/ppo/core_algos.py:2000", quote="pg_loss = torch.mean(pg_losses)", affected=_AFFECTED,
    ),
    Finding(
        "rs_normalizer", "documented_default",
        "rollout rejection sampling (rollout_rs) in decoupled mode writes its mask into response_mask "
        "before the update (rollout_corr_helper.py:1061; documented: 'RS exclusions removed from "
        "training'), while the engine divides token-mean by data['loss_mask'].sum() "
        "(workers/engine/fsdp/transformer_impl.py:730), so the denominator depends on the trainer. The "
        "legacy trainer (trainer.use_v1: false) re-derives loss_mask from the rewritten response_mask "
        "(ray_trainer.py:1335, workers/utils/padding.py:71): the rejected tokens leave the denominator. "
        "The default trainer (trainer.use_v1: true) stores loss_mask once, from the rollout's "
        "response_mask (v1/agent_loop_tq.py:199), and writes back only response_mask after the "
        "correction (v1/trainer_base.py:1790-1791): there, as in bypass mode (the rejection applied "
        "inside the loss, core_algos.py:2514, effective_mask, after the count), the rejected tokens stay "
        "in it. policy_losses.md eq. (13) 'mask' sets the rejected token's weight to 0 and keeps D (the "
        "v1 trainer's and bypass mode's normaliser); one of 4 tokens rejected gives the kept tokens the "
        "weight 1/3 in the legacy trainer's decoupled mode, 1/4 in the v1 trainer and in bypass mode.",
        where="trainer/ppo/rollout_corr_helper.py:1061",
        quote='batch.batch["response_mask"] = modified_response_mask', affected=_AFFECTED,
    ),
    Finding(
        "config:clip_ratio_low", "validation",
        "ActorConfig accepts a negative clip_ratio_low or clip_ratio_high (workers/config/actor.py checks "
        "neither): clip_ratio_low = -0.1 makes the band [1.1, 1.2], which excludes ratio 1, so an on-policy "
        "token with A < 0 is clipped and gets no gradient (policy_losses.md eq. (6): 0 <= eps_low < 1, "
        "eps_high >= 0). clip_ratio_low >= 1 is meaningful (no lower clip: 1 - eps <= 0).",
        where="trainer/ppo/core_algos.py:1348", quote="ratio, 1 - cliprange_low, 1 + cliprange_high",
        affected=_AFFECTED, function="compute_policy_loss_vanilla",
    ),
    Finding(
        "config:loss_scale_factor", "validation",
        "agg_loss's seq-mean-token-sum-norm divides by actor.loss_scale_factor without checking it: a "
        "factor below the longest response (policy_losses.md eq. (11): L_max bounds every response's "
        "length, a longer one is an error), 0 (an infinite loss) or a negative one (the loss's sign "
        "flips: gradient ascent) is accepted without an error or a warning.",
        where="trainer/ppo/core_algos.py:1193", quote="loss /= loss_scale_factor", affected=_AFFECTED,
    ),
    Finding(
        "dppo_truncation_cap", "bug",
        "compute_policy_loss_dppo_tv / dppo_kl truncate their detached ratio at config.get('clip_ratio_c', "
        "20.0), with the comment 'a large threshold is recommended to avoid performance degradation due to "
        "the truncation bias' (the DPPO paper, section 5.4), but ActorConfig.clip_ratio_c (the dual clip's "
        "constant) defaults to 3.0 (workers/config/actor.py:163, actor.yaml:83), so the fallback 20 never "
        "applies and DPPO's weight is capped at 3 by default: a token at ratio 10 gets 3 A of gradient, "
        "not 10 A.",
        where="trainer/ppo/core_algos.py:1427", quote='clip_ratio_c = config.get("clip_ratio_c", 20.0)',
        affected=_AFFECTED, function="compute_policy_loss_dppo_tv",
    ),
    Finding(
        "value_clip", "documented_default",
        "compute_value_loss always uses the clipped value loss, max((V - R)^2, (V_old + clip(V - V_old, "
        "-c, c) - R)^2) (policy_losses.md eq. (23)), with critic.cliprange_value = 0.5 by default "
        "(critic.yaml: 'PPO value function clipping range'); the plain squared error of eq. (22), which "
        "eq. (24) combines, is not selectable (only a cliprange_value larger than any value change "
        "approximates it). The kind value_loss checks the clipped form (its 0.5 factor: flag value_scale).",
        where="trainer/ppo/core_algos.py:2174", quote="clipped_vf_losses = torch.max(vf_losses1, vf_losses2)",
        affected=_AFFECTED,
    ),
)

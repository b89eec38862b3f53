"""What the TRL driver found in TRL 1.16.0's trainers beyond the modes it drives (``TRAINER_FINDINGS``;
modes.py's ``FINDINGS`` lists them after the loss's own): the rows a truncated completion leaves empty,
the advantages of a constant group, the normaliser of a generation batch spread over several optimizer
steps, the vLLM importance-sampling weight's level, RLOOTrainer's sequence ratio, the CISPO metric and
two settings accepted silently. Each has its class and verified line (findings.py); every bug and
validation finding has a standalone script (repro_trl.py)."""

from __future__ import annotations

from ..findings import Finding

__all__ = ["TRAINER_FINDINGS"]

_AFFECTED = "trl 1.16.0"

TRAINER_FINDINGS = (
    Finding(
        "empty_rows", "bug",
        "mask_truncated_completions=True zeroes the mask of every truncated completion, which its help says "
        "are 'excluded from the loss calculation', but the row still counts in the denominator: grpo and "
        "sapo average the row means over every row (:3154), dr_grpo divides by per_token_loss.size(0) * "
        "max_completion_length (:3164), luspo takes .sum(-1).mean() (:3179), RLOOTrainer "
        "per_sequence_loss.mean() (rloo_trainer.py:1833) and the experimental GMPOTrainer likewise "
        "(experimental/gmpo/gmpo_trainer.py:120); policy_losses.md eq. (11) counts rows with T_i > 0. Each "
        "empty row scales the others' gradient by (rows - empty) / rows (an all-zero tool_mask too): two "
        "rows, one truncated, A = 1, ratio 1: -0.25 per token instead of -0.5 (grpo).",
        where="trainer/grpo_trainer.py:3154",
        quote="loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()",
        affected=_AFFECTED + " (grpo, sapo, gspo, dr_grpo, luspo; RLOOTrainer, GMPOTrainer)",
    ),
    Finding(
        "constant_group_rounding", "bug",
        "a group whose rewards are all equal gets (R - mean) / (std + 1e-4) with mean and std rounded in "
        "float32 (torch.nanmean, nanstd): the centred values are rounding noise, and dividing them by "
        "std + 1e-4 ~ 1e-4 makes them advantages of up to 7e-5 (R = 0.1), 1.2e-3 (R = 1.3) and 0.37 "
        "(R = 1000.1, groups of 8); advantages.md (6): a zero-variance group's advantage is exactly 0. "
        "frac_reward_zero_std counts the group (torch.isclose) but its advantages are not zeroed. 0/1 "
        "rewards are exact and unaffected; weighted sums of reward functions or offset rewards are.",
        where="trainer/grpo_trainer.py:2787", quote="advantages = advantages / (std_rewards + 1e-4)",
        affected=_AFFECTED + " (scale_rewards 'group' or 'batch')",
    ),
    Finding(
        "generation_batch_normalizer", "bug",
        "dapo, cispo and vespo divide each optimizer step's token sum by num_items_in_batch (the generation "
        "batch's tokens) times gradient_accumulation_steps / steps_per_generation: the generation batch's "
        "mean token count per step, not the step's own count (the loss_type help: 'the number of active "
        "token in the global accumulated batch'; policy_losses.md eq. (11)). With steps_per_generation > "
        "gradient_accumulation_steps a step with fewer tokens than the average gets a larger weight per "
        "token: steps of 1 and 3 tokens, A = 1, ratio 1: -0.5 per token in both instead of -1 and -1/3. "
        "The default (steps_per_generation = gradient_accumulation_steps) is exact.",
        where="trainer/grpo_trainer.py:3172",
        quote="normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_gen",
        affected=_AFFECTED + " (dapo, cispo, vespo with steps_per_generation > gradient_accumulation_steps)",
    ),
    Finding(
        "vllm_is_level", "documented_default",
        "the vLLM importance-sampling weight's level is vllm_importance_sampling_mode's, independent of the "
        "ratio's importance_sampling_level: the default 'sequence_mask' takes exp(sum_t (old - sampler)), "
        "a sequence product, and multiplies every token's term of the token-level loss by it (masked "
        "outside [clip_min, clip_max = 3]); policy_losses.md eq. (13) weighs at the ratio's level (the "
        "token's own weight; the mean over the sequence for GSPO's ratio, never the sum). Documented as the "
        "field's default ('sequence_mask'), though the docstring's list calls 'token_truncate' the default "
        "(grpo_config.py:331). Not driven (the kit's calls carry no vLLM log-probs).",
        where="trainer/grpo_trainer.py:2669",
        quote="per_sequence_logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)",
        affected=_AFFECTED + " (use_vllm=True)",
    ),
    Finding(
        "rloo_ratio_overflow", "bug",
        "RLOOTrainer's ratio is the sequence product exp(sum_t log r_t) (policy_losses.md eq. (4)), taken "
        "with torch.exp of the raw sum: above 88.72 in float32 it is inf, and with a closed clip gate (A > 0"
        " beyond 1 + epsilon_high) every token of the row gets 0 * inf = NaN where the exact gradient is 0. "
        "A sum over the response reaches 88.72 far sooner than one token's log-ratio (30 tokens 3 nats "
        "more likely each). Not driven (RLOOTrainer has no mode).",
        where="trainer/rloo_trainer.py:1828", quote="coef_1 = torch.exp(log_ratio)", affected=_AFFECTED,
    ),
    Finding(
        "cispo_clip_ratio", "value_only",
        "the logged cispo_clip_ratio counts a capped token only when A > 0 (the PPO rule), while cispo's cap "
        "(:3110, min(r, epsilon_high) detached) scales every token above it whatever the advantage's sign "
        "(CISPO, policy_losses.md eq. (9)): the metric under-reports; the gradient is right.",
        where="trainer/grpo_trainer.py:3285",
        quote="is_cispo_clipped = (coef_1 > self.epsilon_high) & (advantages > 0)", affected=_AFFECTED,
    ),
    Finding(
        "config:sapo_temperature_neg", "validation",
        "GRPOConfig accepts sapo_temperature_neg / sapo_temperature_pos <= 0 without an error or a warning: "
        "tau = 0 gives an infinite loss and a NaN gradient (4 / tau), a negative tau flips the gate "
        "(policy_losses.md eq. (8) needs tau > 0).",
        where="trainer/grpo_trainer.py:3123",
        quote="soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures",
        affected=_AFFECTED,
    ),
    Finding(
        "config:epsilon", "validation",
        "GRPOConfig checks neither epsilon nor epsilon_high: a negative epsilon puts the lower clip bound "
        "1 - epsilon above 1 (with epsilon_high set, an on-policy token with A < 0 is clipped and gets no "
        "gradient; unset, epsilon_high = epsilon and the band is [1.1, 0.9] for epsilon = -0.1: one with "
        "A > 0 gets none), epsilon >= 1 a lower bound <= 0, a negative epsilon_high an upper bound below 1 "
        "(policy_losses.md eq. (6): 0 <= eps < 1).",
        where="trainer/grpo_trainer.py:3113",
        quote="coef_2 = torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)", affected=_AFFECTED,
    ),
)

"""What the TRL driver found in TRL 1.16.0's trainers beyond the modes it drives (``TRAINER_FINDINGS``;
modes.py's ``FINDINGS`` lists them after the loss's own): the rows a truncated completion leaves empty,
the advantages of a constant group, the normaliser of a generation batch spread over several optimizer
steps, the vLLM importance-sampling weight's level and lower bound, RLOOTrainer's sequence ratio, the
CISPO metric and cap, delta with the losses that ignore it, the sequence-level metrics' rows, the
entropy mask's per-micro-batch quantile, the experimental GMPOTrainer's dropped behaviour weight,
AsyncGRPOTrainer's normaliser and ratio, SDPOTrainer's dapo normaliser, unscaled advantages and unscorable
rewards, A2POTrainer's all-incorrect filter, the logged zero-std fraction and vLLM weights, the off-policy
mask's unscorable tokens, the clip metrics under delta, the k3 term's overflow, and settings accepted silently
(sweep 15: beta, the off-policy threshold, VESPO's lambda, the entropy band, RLOO's reward clip, the vLLM
cap, A*-PO's beta1). Each has its class and verified line (findings.py); every bug and validation finding
has a standalone script (repro_trl.py)."""

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
        "(experimental/gmpo/gmpo_trainer.py:120), as do the experimental SDPOTrainer's grpo and dr_grpo "
        "(sdpo_trainer.py:1169, :1173); policy_losses.md eq. (11) counts rows with T_i > 0. Each "
        "empty row scales the others' gradient by (rows - empty) / rows (an all-zero tool_mask too): two "
        "rows, one truncated, A = 1, ratio 1: -0.25 per token instead of -0.5 (grpo). In RLOOTrainer and "
        "GMPOTrainer the empty row's ratio is exp(0) = 1, so it also adds -A_i / rows to the loss value "
        "(with no gradient): rows (1 token, A = 1 | empty, A = 3): loss -2 instead of -1.",
        where="trainer/grpo_trainer.py:3154",
        quote="loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()",
        affected=_AFFECTED + " (grpo, sapo, gspo, dr_grpo, luspo; RLOOTrainer, GMPOTrainer, SDPOTrainer)",
        upstream="https://github.com/huggingface/trl/issues/6369 (closed by pull request 6439, in 1.16.0, "
        "for dapo, cispo and vespo only: the paths above are not reported)",
    ),
    Finding(
        "constant_group_rounding", "bug",
        "a group whose rewards are all equal gets (R - mean) / (std + 1e-4) with mean and std rounded in "
        "float32 (torch.nanmean, nanstd): the centred values are rounding noise, and dividing them by "
        "std + 1e-4 ~ 1e-4 makes them advantages of up to 7e-5 (R = 0.1), 1.2e-3 (R = 1.3) and 0.37 "
        "(R = 1000.1, groups of 8); advantages.md (6): a zero-variance group's advantage is exactly 0. "
        "The logged frac_reward_zero_std (torch.isclose(std, 0), atol 1e-8, :2788) counts the group only "
        "while its float32 std residue is below 1e-8 (R = 0.1: 8e-9); at R = 1.3 (1.3e-7) and 1000.1 "
        "(6.5e-5) it misses it too. 0/1 rewards are exact and unaffected; weighted sums of reward "
        "functions or offset rewards are.",
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
        "With steps_per_generation < gradient_accumulation_steps (set explicitly) each micro-batch is a "
        "generation batch of its own and is divided by its own token count times GA / spg: the step is a "
        "mean of micro-batch token means (micro-batches of 1 and 3 tokens, spg 1, GA 2: -1/2 and -1/6 per "
        "token instead of -1/4). The default (steps_per_generation = gradient_accumulation_steps) is exact.",
        where="trainer/grpo_trainer.py:3172",
        quote="normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_gen",
        affected=_AFFECTED + " (dapo, cispo, vespo with steps_per_generation != gradient_accumulation_steps)",
        upstream="https://github.com/huggingface/trl/pull/6024 (merged: the rescale, meant as 'the token "
        "count expected in one accumulation window'; the per-step count is not discussed)",
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
        "tau = 0 gives an infinite loss and a NaN gradient (4 / tau; policy_losses.md eq. (8) needs tau > "
        "0). A negative tau is harmless for training: the gate's derivative 4 sigma(z) (1 - sigma(z)), z = "
        "tau (r - 1), is even in z, so the gradient is that of |tau|, and only the logged loss moves, by "
        "the constant 4 A / |tau|.",
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
        "(policy_losses.md eq. (6): 0 <= eps < 1). RLOOConfig, AsyncGRPOConfig, GMPOConfig and the "
        "experimental SDPOConfig check them no more (each accepts epsilon=-0.1 silently).",
        where="trainer/grpo_trainer.py:3113",
        quote="coef_2 = torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)", affected=_AFFECTED,
    ),
    # the experimental trainers (GMPOTrainer, AsyncGRPOTrainer) and GRPOTrainer's options the modes do not
    # drive (audit 14: each found in the installed source, reproduced by its script where a bug or a setting)
    Finding(
        "gmpo_vllm_is", "bug",
        "the experimental GMPOTrainer inherits GRPOTrainer's generation, which computes the vLLM "
        "importance-sampling weight (vllm_importance_sampling_correction=True is the default), but its "
        "_compute_loss never reads inputs['importance_sampling_ratio']: the behaviour correction "
        "(policy_losses.md eq. (13)) is silently dropped (its docstring: 'everything else ... is inherited "
        "unchanged'). A weight of 0.5 at ratio 1, A = 1: loss -1 and gradient -1 instead of -0.5.",
        where="experimental/gmpo/gmpo_trainer.py:105", quote="per_sequence_loss = -coef * advantages",
        affected=_AFFECTED + " (GMPOTrainer with use_vllm=True)",
    ),
    Finding(
        "config:entropy_coef", "validation",
        "GMPOConfig inherits every GRPOConfig field, and GMPOTrainer accepts without an error or a warning "
        "settings its _compute_loss never reads: entropy_coef and use_adaptive_entropy (no entropy bonus "
        "is added), off_policy_mask_threshold, delta, loss_type, importance_sampling_level, "
        "use_bias_correction_kl and the MoE router_aux_loss_coef. entropy_coef 1 with entropy 2 and A = 0: "
        "loss 0 instead of -2.",
        where="experimental/gmpo/gmpo_trainer.py:120", quote="loss = per_sequence_loss.mean()",
        affected=_AFFECTED + " (GMPOTrainer)",
    ),
    Finding(
        "async_grpo_normalizer", "bug",
        "the experimental AsyncGRPOTrainer divides each micro-batch's token sum by global_n_tokens, the "
        "token count of that micro-batch only (the collator's n_trained_tokens, async_grpo_trainer.py:613), "
        "then by gradient_accumulation_steps: an optimizer step is the mean of its micro-batches' token "
        "means, not policy_losses.md eq. (11)'s token mean over the accumulated batch (the code's comment "
        "claims 'correct per-token normalization'; undocumented). Micro-batches of 1 and 3 tokens, GA 2, "
        "A = 1, ratio 1: -1/2 and -1/6 per token instead of -1/4; exact with GA 1 or equal token counts "
        "(the TokenBudgetBatcher and variable lengths make them unequal).",
        where="experimental/async_grpo/async_grpo_trainer.py:1541",
        quote="loss = loss / tokens_per_rank.to(torch.float32)",
        affected=_AFFECTED + " (AsyncGRPOTrainer, gradient_accumulation_steps > 1)",
    ),
    Finding(
        "async_grpo_ratio_overflow", "bug",
        "the experimental AsyncGRPOTrainer takes torch.exp of the raw log-ratio against vLLM's sampling "
        "log-probs before its clip gate: above 88.72 in float32 the ratio is inf and a token with a closed "
        "gate (A > 0 beyond 1 + epsilon_high) gets 0 * inf = NaN where the exact gradient is 0 (as "
        "GRPOTrainer's finding ratio_overflow). The experimental SDPOTrainer's policy term does the same "
        "(experimental/sdpo/sdpo_trainer.py:1163, coef_1 = torch.exp(log_ratio) before its clip).",
        where="experimental/async_grpo/async_grpo_trainer.py:1528", quote="coef_1 = torch.exp(log_ratio)",
        affected=_AFFECTED + " (AsyncGRPOTrainer, SDPOTrainer)",
    ),
    Finding(
        "config:top_entropy_quantile", "validation",
        "GRPOConfig documents top_entropy_quantile's range as [0.0-1.0] but checks it nowhere: 1.5 is "
        "accepted and silently means 1.0 (no entropy mask: the branch runs only below 1.0), and -0.5 is "
        "accepted and fails only at the first training step, inside torch.quantile (1 - rho = 1.5).",
        where="trainer/grpo_trainer.py:3049", quote="if self.top_entropy_quantile < 1.0:",
        affected=_AFFECTED,
    ),
    Finding(
        "config:multi_objective_aggregation", "validation",
        "with multi_objective_aggregation='normalize_then_sum' the advantages are always divided by stds "
        "(each reward function's per group, then the batch std of their weighted sum) and scale_rewards "
        "is never read: GRPOConfig accepts scale_rewards='none' (Dr. GRPO, advantages.md eq. (5) "
        "scale='none') or 'batch' with it without an error or a warning. Rewards (0, 2 | 0, 4), groups "
        "of 2, one reward function, scale_rewards='none': advantages +-0.866 instead of (-1, 1, -2, 2).",
        where="trainer/grpo_trainer.py:2799",
        quote="advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)",
        affected=_AFFECTED,
    ),
    Finding(
        "vllm_is_clip_min", "documented_default",
        "vllm_importance_sampling_clip_min (default None, documented) adds a lower bound that "
        "policy_losses.md eq. (13) does not have: the '*_truncate' modes raise a weight below C_min to "
        "C_min (w <- clamp(w, C_min, C_max), eq. (13): min(w, cap)) and the '*_mask' modes set it to 0 "
        "(eq. (13) keeps every w <= cap). Not driven (the kit's calls carry no vLLM log-probs).",
        where="trainer/grpo_trainer.py:2683", quote="min=self.vllm_importance_sampling_clip_min,",
        affected=_AFFECTED + " (use_vllm=True with vllm_importance_sampling_clip_min set)",
    ),
    # audit 14b (source first): the cispo cap's documented form, delta read by the clip losses only, and
    # the sequence-level metrics' row count
    Finding(
        "cispo_cap", "documented_default",
        "loss_type='cispo' caps the detached weight at epsilon_high itself, sg(min(r, epsilon_high)), "
        "ScaleRL's eps_max (the epsilon_high help: 'corresponds to the eps_max param ... recommended "
        "value is 5.0'), not at 1 + eps_high as CISPO writes it (MiniMax 2025; policy_losses.md eq. (9), "
        "eps_high 0.28): the paper's epsilon_high=0.28 caps every weight at 0.28 (an on-policy token's "
        "gradient 0.28 A instead of A). The driver passes epsilon_high = 1 + eps_high, so the cispo mode "
        "runs eq. (9)'s cap; unset, the cap is 0.2 (finding config:epsilon_high).",
        where="trainer/grpo_trainer.py:3110",
        quote="clamped_ratios = torch.clamp(coef_1, max=self.epsilon_high).detach()", affected=_AFFECTED,
    ),
    Finding(
        "config:loss_type", "validation",
        "delta (the two-sided clip's cap) is read only in the branch of the clip losses (grpo, bnpo, "
        "dr_grpo, dapo, luspo): GRPOConfig accepts it with loss_type 'sapo', 'cispo' or 'vespo' without "
        "an error or a warning, and it has no effect there (sapo with delta=1.1, a token with ratio 1.65 "
        "and A = -1: the same gradient as without delta, where the dual clip it stands for gives 0). "
        "Likewise epsilon / epsilon_high set explicitly with 'sapo' or 'vespo' (neither reads a clip bound) "
        "and epsilon with 'cispo' and epsilon_high set (only the cap epsilon_high is read; with "
        "epsilon_high unset, epsilon becomes the cap, :946, finding config:epsilon_high) are accepted and "
        "have no effect.",
        where="trainer/grpo_trainer.py:3115", quote="if self.args.delta is not None:",
        affected=_AFFECTED + " (loss_type sapo, cispo, vespo)",
    ),
    Finding(
        "sequence_metrics_rows", "value_only",
        "with importance_sampling_level='sequence' the logged clip fractions (clip_ratio/low_mean, "
        "high_mean, region_mean) and vespo/phi_seq_mean divide by x.shape[0], every row of the batch, "
        "including the rows mask_truncated_completions empties (the token-level path divides by "
        "mask.sum()): two rows clipped and one empty row log 0.667 instead of 1. The loss is right. "
        "RLOOTrainer's clip fractions (rloo_trainer.py:1854, a nanmean over the gathered rows) count the "
        "rows mask_truncated_completions empties likewise (their ratio is exp(0) = 1, never clipped).",
        where="trainer/grpo_trainer.py:3261",
        quote="local_sum, local_count = x.sum(), torch.tensor(float(x.shape[0]), device=x.device)",
        affected=_AFFECTED + " (importance_sampling_level='sequence')",
    ),
    # audit 15 (source first): the entropy mask's quantile and the experimental SDPOTrainer's policy term
    Finding(
        "entropy_quantile_micro_batch", "bug",
        "top_entropy_quantile (rho, Wang et al. 2025, 'Beyond the 80/20 rule') keeps the tokens whose "
        "entropy is at least the batch's (1 - rho)-quantile; get_high_entropy_mask takes that quantile over "
        "the tokens of one micro-batch (gathered across ranks, called from _compute_loss), not over the "
        "batch of the optimizer step, so under gradient accumulation the kept set depends on the split "
        "(the help: 'Keeps ... only the top-rho quantile of tokens by entropy'; exact with one micro-batch "
        "per step). rho 0.25, micro-batches of entropies (1, 2, 3, 4) and (5, 6, 7, 8): the tokens 4 and 8 "
        "are kept instead of 7 and 8. Not driven (the kit's calls carry no entropies).",
        where="trainer/grpo_trainer.py:1413", quote="entropy_threshold = torch.quantile(gathered, threshold)",
        affected=_AFFECTED + " (GRPOTrainer, GMPOTrainer with top_entropy_quantile < 1 and "
        "gradient_accumulation_steps > 1)",
    ),
    Finding(
        "sdpo_dapo_normalizer", "bug",
        "the experimental SDPOTrainer's policy term with loss_type='dapo' (its default) divides by the "
        "micro-batch's own token count, the same line as its 'bnpo' (:1171), and compute_loss then divides "
        "by gradient_accumulation_steps (:1143): an optimizer step is the mean of its micro-batches' token "
        "means, while SDPOConfig's help says 'normalizing with the number of active tokens in the global "
        "accumulated batch' (GRPOTrainer's dapo does, with num_items_in_batch; policy_losses.md eq. (11) "
        "token_mean). Micro-batches of 4 tokens (A = 1) and 1 token (A = -1), GA 2, ratio 1: step loss 0 "
        "instead of -0.6.",
        where="experimental/sdpo/sdpo_trainer.py:1175",
        quote="loss = (per_token_loss * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)",
        affected=_AFFECTED + " (SDPOTrainer, distillation_weight < 1, gradient_accumulation_steps > 1)",
    ),
    Finding(
        "sdpo_scale_none", "bug",
        "the experimental SDPOTrainer with scale_rewards='none' sets std_rewards to 1 (:859) and still "
        "divides by std_rewards + 1e-4: every advantage is the centred reward times 1 / 1.0001, where "
        "advantages.md eq. (5) scale='none' (Dr. GRPO) is the centred reward itself (GRPOTrainer's 'none' "
        "skips the division). A constant factor 0.9999 on the policy term: negligible alone, it shifts the "
        "balance against the distillation term by 1e-4. Rewards (1, 0, 0, 0): 0.749925 instead of 0.75.",
        where="experimental/sdpo/sdpo_trainer.py:864",
        quote="advantages = (rewards - mean_grouped_rewards) / (std_rewards + 1e-4)",
        affected=_AFFECTED + " (SDPOTrainer with scale_rewards='none')",
    ),
    # sweep 15 (every GRPOConfig / RLOOConfig / experimental config field on the loss, advantage, reward, KL,
    # masking and sampling-correction path): settings accepted in a nonsensical range
    Finding(
        "config:beta", "validation",
        "GRPOConfig and RLOOConfig (and GMPOConfig, SDPOConfig, which inherit or copy the field) accept a "
        "negative beta without an error or a warning: GRPOTrainer adds beta * k3 to every token's loss, so "
        "the KL 'penalty' rewards moving away from the reference (a token 1 nat above the reference, A = 0, "
        "beta = -0.1, the default use_bias_correction_kl: d loss / d logp = -0.1, a descent step raises it "
        "further), and RLOOTrainer's "
        "rewards - beta * KL_seq pays a bonus per nat of divergence (policy_losses.md eq. (12): beta >= 0). "
        "SDPOConfig documents beta as the 'KL coefficient' (DeepSeek-R1's 0.001), but SDPOTrainer only "
        "stores it (sdpo_trainer.py:583) and never loads a reference or adds a KL term: any beta is "
        "accepted and ignored.",
        where="trainer/grpo_trainer.py:3150",
        quote="per_token_loss = per_token_loss + self.beta * per_token_kl",
        affected=_AFFECTED + " (GRPOTrainer, RLOOTrainer, GMPOTrainer, SDPOTrainer)",
    ),
    Finding(
        "config:off_policy_mask_threshold", "validation",
        "off_policy_mask_threshold (DeepSeek-V3.2's delta) 'expects a positive value' (its help) but "
        "GRPOConfig checks nothing: a negative threshold drops every negative-advantage sequence whose mean "
        "log(pi_old / pi_theta) is above it, on-policy ones included (their mean is 0 > delta), so the "
        "policy learns from A >= 0 rows only (two on-policy rows, A = +1 and -1, delta = -0.1: mask (1, 0) "
        "instead of (1, 1)). GMPOTrainer accepts and ignores it (finding config:entropy_coef).",
        where="trainer/grpo_trainer.py:2967", quote="is_low_kl = avg_seq_kl <= off_policy_threshold",
        affected=_AFFECTED + " (GRPOTrainer with off_policy_mask_threshold < 0)",
    ),
    Finding(
        "config:vespo_lambda_neg", "validation",
        "VESPO's weight phi(w) = e^lambda w^k e^(-lambda w) needs lambda > 0 (the decay for w > 1) and k > 0 "
        "(the down-weighting of w < 1, as the help of vespo_k_* says); GRPOConfig checks none of "
        "vespo_k_pos, vespo_k_neg, vespo_lambda_pos, vespo_lambda_neg, and get_gamma_weights silently "
        "replaces a lambda <= 0 by 1e-4 (phi = w^k: no decay at all), while a k <= 0 is used as given "
        "(phi grows as w falls, up to w = 1e-8's clamp). vespo_lambda_neg = -1, A = -1, w = e: phi = 20.09 "
        "(the clamp's lambda 1e-4) for the lambda the user set. Not driven (vespo is an unsupported mode).",
        where="trainer/grpo_trainer.py:3012",
        quote="lambda_seq = torch.where(is_nonneg_adv, lambda_pos, lambda_neg).clamp(min=1e-4)",
        affected=_AFFECTED + " (loss_type='vespo')",
    ),
    Finding(
        "config:entropy_coef_min", "validation",
        "use_adaptive_entropy's band [entropy_coef_min, entropy_coef_max] and step entropy_coef_delta are "
        "not checked: GRPOConfig accepts entropy_coef_min > entropy_coef_max (the controller then jumps to "
        "entropy_coef_min = the larger value when the entropy is above the target and to entropy_coef_max "
        "when it falls below: inverted, Skywork-OR1 raises the coefficient when the entropy is low), a "
        "negative entropy_coef_delta (the same inversion) and an initial entropy_coef outside the band. "
        "entropy_coef 0.3, band (0.5, 0.1), entropy 3 > target 0.2: the coefficient becomes 0.5 instead of "
        "0.295. Not driven (the kit's calls carry no entropies).",
        where="trainer/grpo_trainer.py:3237",
        quote="self.entropy_coef - self.args.entropy_coef_delta, self.args.entropy_coef_min",
        affected=_AFFECTED + " (GRPOTrainer with use_adaptive_entropy=True)",
    ),
    Finding(
        "config:reward_clip_range", "validation",
        "RLOOConfig accepts an inverted reward_clip_range (low > high) without an error or a warning: "
        "torch.clamp with min > max gives every reward the upper bound, so every leave-one-out advantage "
        "is 0 and nothing is learned (rewards (0, 0.5, 1, -1), range (1, -1): all -1). Not driven "
        "(RLOOTrainer has no mode).",
        where="trainer/rloo_trainer.py:1661",
        quote="rewards = rewards.clamp(min=self.reward_clip_range[0], max=self.reward_clip_range[1])",
        affected=_AFFECTED + " (RLOOTrainer)",
    ),
    Finding(
        "config:vllm_importance_sampling_clip_max", "validation",
        "GRPOConfig checks only vllm_importance_sampling_clip_min < clip_max: a cap below 1 (even <= 0) is "
        "accepted, and the behaviour weight of a token the sampler and the trainer agree on (w = 1) is "
        "truncated to the cap ('*_truncate') or set to 0 ('*_mask', every on-policy token dropped; "
        "policy_losses.md eq. (13): a cap >= 1 keeps w = 1); a '*_truncate' mode with clip_min set and "
        "clip_max=None is accepted too and truncates nothing from above (the sequence product's exp can be "
        "inf). token_mask, clip_max 0.5, three tokens with w = 1: weights (0, 0, 0). Not driven (the kit's "
        "calls carry no vLLM log-probs).",
        where="trainer/grpo_trainer.py:2698",
        quote="invalid_mis_mask = (vllm_importance_sampling_ratio < min_val) | (",
        affected=_AFFECTED + " (use_vllm=True, vllm_importance_sampling_correction=True)",
    ),
    # sweep 15: logged metrics, the experimental SDPOTrainer's unscorable rewards and A2POTrainer (A*-PO)
    Finding(
        "frac_reward_zero_std", "value_only",
        "the logged frac_reward_zero_std (the fraction of groups whose rewards do not vary) is computed from "
        "the std the advantages divide by: with scale_rewards='batch' (:2777) or "
        "multi_objective_aggregation='normalize_then_sum' (:2798) that is the batch's std, broadcast to "
        "every row, so the metric is 0 or 1 for the whole batch (groups (1, 1) and (0, 1): 0.0 instead of "
        "0.5). RLOOTrainer's (rloo_trainer.py:1701) is the std of the rewards after the KL penalty "
        "(beta > 0), so a group whose task rewards are all equal is not counted (its logged reward_std "
        "leaves the KL out). The advantages are unaffected.",
        where="trainer/grpo_trainer.py:2788",
        quote="is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))  # for logging",
        affected=_AFFECTED + " (scale_rewards='batch', normalize_then_sum; RLOOTrainer with beta > 0)",
    ),
    Finding(
        "vllm_is_metrics", "value_only",
        "the logged sampling/importance_sampling_ratio/{min, mean, max} in the sequence_* modes take every "
        "row's weight (:2875, flatten()), rows the masks empty included (mask_truncated_completions: their "
        "log-weight sum is 0, weight 1), where the token modes take the masked tokens only; and the /mean "
        "and sampling/sampling_logp_difference/mean are the mean over ranks of each rank's mean, not the "
        "mean over the batch's tokens (or rows) when ranks hold different counts. The weights applied to "
        "the loss are unaffected.",
        where="trainer/grpo_trainer.py:2875",
        quote="flat_is_ratio = vllm_importance_sampling_ratio.flatten()",
        affected=_AFFECTED + " (use_vllm=True, vllm_importance_sampling_correction=True)",
    ),
    Finding(
        "sdpo_unscorable_rewards", "bug",
        "the experimental SDPOTrainer turns a completion for which every reward function returned None into "
        "reward 0 (nansum of NaNs) and keeps it in its group's mean and std, so it shifts the baseline and "
        "gets an advantage of its own; GRPOTrainer (grpo_trainer.py:2756, 'nansum would collapse it to 0, "
        "which both biases the per-group baseline and hands the completion a spurious advantage'), "
        "RLOOTrainer and AsyncGRPOTrainer mark it NaN, leave it out of the baseline and give it 0. Rewards "
        "(1, 0, None, 0): advantages (1.4997, -0.4999, -0.4999, -0.4999) instead of (1.1545, -0.5773, 0, "
        "-0.5773).",
        where="experimental/sdpo/sdpo_trainer.py:850",
        quote="rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)",
        affected=_AFFECTED + " (SDPOTrainer with reward functions that return None)",
    ),
    Finding(
        "config:beta1", "validation",
        "the experimental A2POConfig (A*-PO) has no __post_init__ checks: beta1 <= 0 is accepted, and Stage "
        "1's V* = beta1 (logsumexp(r / beta1) - log n) becomes a soft minimum for beta1 < 0 (rewards (0, 1), "
        "beta1 -0.5: V* = 0.283 instead of 0.717 with 0.5) and 0 / 0 = NaN for beta1 = 0; beta2 <= 0 is "
        "accepted too (the regression target r - V* is then matched by beta2 log(pi / pi_ref) of the "
        "opposite sign, or not at all). A*-PO's V* is a KL-regularised soft maximum (beta1 > 0).",
        where="experimental/a2po/a2po_trainer.py:268",
        quote="v_star = beta1 * (torch.logsumexp(rewards / beta1, dim=1) - math.log(n))",
        affected=_AFFECTED + " (A2POTrainer)",
    ),
    Finding(
        "a2po_all_incorrect", "bug",
        "the experimental A2POTrainer's filter_all_incorrect (default True; its help: 'drop prompts for "
        "which all reference samples are incorrect') treats a prompt as all-incorrect when its reference "
        "rewards sum to 0: with rewards that are not 0 / 1 (e.g. +-1, or a format penalty) a prompt with "
        "correct samples is dropped from training (rewards (1, -1)) and one whose samples are all wrong "
        "is kept (rewards (-1, -1)). Right for 0 / 1 rewards only.",
        where="experimental/a2po/a2po_trainer.py:272", quote="if rewards[j].sum() == 0:",
        affected=_AFFECTED + " (A2POTrainer, filter_all_incorrect=True, rewards other than 0 / 1)",
    ),
    Finding(
        "config:ref_model_mixup_alpha", "validation",
        "sync_ref_model's mixing weight (TR-DPO's alpha, 'pi_ref = alpha * pi_theta + (1 - alpha) * "
        "pi_ref_prev') is not checked by GRPOConfig or RLOOConfig: alpha > 1 extrapolates the reference "
        "past the policy and alpha < 0 moves it away, so the KL term (GRPOTrainer's loss, RLOOTrainer's "
        "reward) is taken against a model that is no mixture of the two (alpha 1.5, policy weight 1, "
        "reference 0: the new reference weight 1.5; TR-DPO: 0 <= alpha <= 1). ref_model_sync_steps = 0 "
        "fails only at the first step's end (a modulo by zero).",
        where="trainer/callbacks.py:132",
        quote="target_param.data.mul_(1.0 - alpha).add_(copy_param.data, alpha=alpha)",
        affected=_AFFECTED + " (GRPOTrainer, RLOOTrainer with sync_ref_model=True, beta > 0)",
    ),
    # audit 15 round 5 (source first): the k3 term's own overflow
    Finding(
        "kl_k3_overflow", "bug",
        "the k3 term is evaluated as exp(x) - x - 1, x = ref_logp - logp (:3101): above x = 88.72 in "
        "float32 exp(x) is inf, so k3 is inf without an error (specs/kl.md eq. (4): kl_k3 raises where "
        "the value overflows), and with use_bias_correction_kl=True (the default) the gradient of "
        "coef_1 * k3, coef_1 k3 + coef_1 (1 - e^x), is inf - inf = NaN, where the exact one is finite: "
        "the two e^x cancel, -x at ratio 1 (x = 90, beta 0.1: -9 per token instead of NaN); one such "
        "token poisons the step's gradient. A token the trainer's policy finds e^88.7 times less likely "
        "than the reference (a vLLM-sampled token the trainer scores near -inf, or a policy far from the "
        "reference). The experimental GMPOTrainer evaluates the same expression "
        "(experimental/gmpo/gmpo_trainer.py:112, no importance weight: an infinite gradient). Not the "
        "flag kl_k3_form='naive' (the cancellation of small |x|); the ratio's own overflow is finding "
        "ratio_overflow.",
        where="trainer/grpo_trainer.py:3101",
        quote="torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps)",
        affected=_AFFECTED + " (beta > 0; GMPOTrainer)",
    ),
    # audit 15 round 4 (source first): the off-policy mask's unscorable tokens, the clip metrics under delta
    Finding(
        "opsm_unscored_tokens", "bug",
        "off_policy_mask_threshold (DeepSeek-V3.2's off-policy sequence masking: drop a sequence with A < 0 "
        "whose mean over its tokens of log(pi_sampler / pi_theta) exceeds delta) sets the KL of a token "
        "vLLM could not score (NaN log-prob) to 0 (:2961) but still counts it in the sequence's length "
        "(:2964): the mean is diluted by every unscorable token, so a sequence that is off-policy on the "
        "tokens that carry evidence is kept (TRL's own vLLM metrics exclude such tokens because 'counting "
        "them as zero instead would understate the divergence', :2864). Four tokens, one scored with KL 1, "
        "three NaN, A = -1, delta 0.5: mean 0.25, kept (dapo gradient 0.25 per token) where the mean "
        "over the scored tokens, 1, drops it (gradient 0). Not driven (the kit's calls carry no vLLM "
        "log-probs).",
        where="trainer/grpo_trainer.py:2964",
        quote="avg_seq_kl = seq_kl_sum / mask.sum(dim=1, keepdim=True).clamp(min=1.0)",
        affected=_AFFECTED + " (off_policy_mask_threshold set, use_vllm=True with unscorable tokens)",
    ),
    Finding(
        "delta_clip_metrics", "value_only",
        "with delta set, the logged clip fractions (clip_ratio/high_mean, high_max, region_mean) test "
        "coef_1 after it was capped at delta (:3116): with delta <= 1 + epsilon_high (finding config:delta) "
        "no token is ever counted as high-clipped although the cap zeroes their gradient, and with delta "
        "above the band the count is right. delta 1.1, epsilon_high 0.2, a token with ratio 1.3 and A = 1: "
        "clip_ratio/high_mean 0 instead of 1. The loss is the one finding config:delta describes.",
        where="trainer/grpo_trainer.py:3275",
        quote="is_high_clipped = (coef_1 > 1 + self.epsilon_high) & (advantages > 0)",
        affected=_AFFECTED + " (delta set, clip losses)",
    ),
)

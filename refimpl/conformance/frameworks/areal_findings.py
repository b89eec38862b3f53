"""What the AReaL driver found in AReaL 1.0.4's trainer beyond the functions its modes drive
(``TRAINER_FINDINGS``; areal.py's ``FINDINGS`` lists them after the losses' own): ``PPOActor``'s KL reward
without a reference model, its test for a missing EOS, M2PO's token count, the rejection-sampling weight's
level and the clip bounds it never checks; then the audit of issue 27 (``AUDIT_FINDINGS``): the task
reward's position, rejection sampling's KL metric and non-finite weights, Normalization's leave-one-out
std, uncentred std, group size and empty input, the distillation terms, the reward clip, GSPO's
per-token advantages and the settings accepted silently; then a second audit's: mask_no_eos_with_zero
zeroing only the reward, the overlong budget's own field, M2PO and the critic's setting without effect,
the log-linear proximal policy; then a third audit's: SAPO's ignored clip settings, rejection sampling's
band above 1 and its warning, the logged entropy and approx_kl; then a fourth audit's: a group std about
the batch mean, the KL reward's estimator; then a sweep's (``SWEEP_FINDINGS``,
areal_sweep.py): settings accepted in a nonsensical range or ignored, two logged values.
Each has its class and verified line (findings.py); every bug
and validation finding has a standalone script (repro_areal.py)."""

from __future__ import annotations

from .findings import Finding

__all__ = ["TRAINER_FINDINGS", "AUDIT_FINDINGS"]

_AFFECTED = "areal 1.0.4"

TRAINER_FINDINGS = (
    Finding(
        "kl_reward_no_reference", "bug",
        "PPOActor._compute_advantages replaces a missing ref_logp by zeros and still adds the KL reward "
        "-kl_ctl * KLEstimator(old_logp, 0): with the shipped defaults (actor.kl_ctl 0.1, kl_estimator k1, "
        "ref None, so rl_trainer.py:179 builds no reference model) every response token gets +0.1 * (-log "
        "pi) of reward, an entropy-like bonus nobody asked for (0.2 per token at log pi = -2; with k3 the "
        "clamp at 10 on rare tokens). Without a reference there is no KL term (kl.md; policy_losses.md eq. "
        "(12)): the reward should be the task reward alone, or the setting an error.",
        where="trainer/ppo/actor.py:194", quote="ref_logp = torch.zeros_like(old_logp)",
        affected=_AFFECTED + " (defaults: kl_ctl 0.1 with ref None)",
    ),
    Finding(
        "eos_by_width", "bug",
        "PPOActor._compute_advantages decides 'no EOS' by seqlen == the padded width of the batch "
        "(prompt + response), not by the response: the longest row is treated as truncated even when it "
        "ends with EOS, and a truncated response in a shorter row as finished. With mask_no_eos_with_zero "
        "the finished longest row loses its reward (a correct answer scored 0) while the truncated one "
        "keeps it; with a critic the finished row's GAE bootstraps from values[:, -1] (actor.py:223) and "
        "the truncated row's does not (estimators.md eq. (1), (4): bootstrap after a truncation, never "
        "after a termination). The logged no_eos_ratios (actor.py:301) uses the same rule.",
        where="trainer/ppo/actor.py:201", quote="seq_no_eos_mask = seqlens == attn_mask.shape[1]",
        affected=_AFFECTED + " (mask_no_eos_with_zero=True, or a critic)",
    ),
    Finding(
        "m2po_normalizer", "bug",
        "with m2_threshold (M2PO) grpo_loss_fn masks tokens before ppo_actor_loss_fn, which divides by the "
        "masked count, while the engine weighs each micro-batch by its original token count (actor.py:363, "
        "loss_weight_fn; fsdp_engine.py:2120): a kept token weighs 1 / (kept in its micro-batch) * (tokens "
        "in it) / (tokens in the step), unequal across micro-batches (the rejection-sampling path keeps the "
        "original count for exactly this reason, functional.py:479-483). Two micro-batches of 2 tokens, "
        "one token masked in the first, A = 1: -0.5 and -0.25 per kept token instead of one weight for all.",
        where="trainer/ppo/actor.py:448",
        quote="loss_mask = _apply_m2po_masking(old_logp, prox_logp, loss_mask, m2_threshold)",
        affected=_AFFECTED + " (use_decoupled_loss with m2_threshold set, more than one micro-batch)",
        upstream="https://github.com/areal-project/AReaL/issues/1730 (open; fix proposed in pull request "
        "1732)",
    ),
    Finding(
        "rejection_sampling_level", "documented_default",
        "the behaviour weight's level is rejection_sampling.level, independent of the ratio's "
        "importance_sampling_level: level='sequence' (metric 'ratio') weighs every token of a token-level "
        "PPO loss by the sequence's geometric-mean weight, and the default level='token' weighs a GSPO "
        "sequence ratio token by token (policy_losses.md eq. (13): the weight at the ratio's level). "
        "Documented by RejectionSamplingConfig's help (the sequence level uses the geometric mean). Not "
        "driven (the behavior_correction modes are token level).",
        where="utils/functional/functional.py:356",
        quote="behave_imp_weight = torch.exp(seq_log_mean).expand_as(log_ratio)",
        affected=_AFFECTED + " (rejection_sampling.level != importance_sampling_level)",
    ),
    Finding(
        "config:eps_clip", "validation",
        "neither PPOActorConfig nor ppo_actor_loss_fn checks eps_clip or eps_clip_higher: a negative "
        "eps_clip_higher puts the upper clip bound below 1 (an on-policy token with A > 0 is clipped and "
        "gets no gradient), eps_clip >= 1 a lower bound <= 0 (policy_losses.md eq. (6): 0 <= eps < 1).",
        where="utils/functional/functional.py:518", quote="1.0 - eps_clip,", affected=_AFFECTED,
    ),
)


AUDIT_FINDINGS = (
    Finding(
        "reward_last_trainable", "bug",
        "PPOActor._compute_advantages puts the task reward on position seqlens - 2 (the sequence's last "
        "token), not on the last trainable one, and the GAE loop skips every position whose loss mask is 0 "
        "(lastgaelam * (1 - mask), actor.py:231): a multi-turn trajectory that ends with tokens the policy "
        "did not generate (a tool or environment turn, loss mask 0) loses its reward entirely, every "
        "advantage 0 (estimators.md eq. (1), (5): the reward of the last action reaches every earlier one).",
        where="trainer/ppo/actor.py:206", quote="indices = torch.clip(seqlens - 2, min=0)",
        affected=_AFFECTED + " (trajectories whose last token has loss mask 0)",
    ),
    Finding(
        "rejection_kl_metric", "bug",
        "apply_rejection_sampling's metric 'kl_k3' calls KLEstimator._compute_approx_kl(log_probs=prox, "
        "log_probs_base=behave), whose k3 negates the log-ratio: it filters on 1/r - 1 + log r "
        "(r = pi_prox / pi_behave), while RejectionSamplingConfig's help documents k3 = r - log(r) - 1 "
        "(kl.md eq. (4) with "
        "the samples from pi_behave). The two disagree on which tokens are rejected: r = (6.69, 0.061), "
        "upper 2: the documented k3 (3.79, 1.86) keeps (False, True), AReaL keeps (True, False). (The help's "
        "'kl_k1 = log(r), forward KL unbiased estimator' has mean -KL(behave || prox) under those samples.)",
        where="utils/functional/functional.py:242", quote="metric = KLEstimator._compute_approx_kl(",
        affected=_AFFECTED + " (rejection_sampling.metric 'kl_k3')",
    ),
    Finding(
        "rejection_nonfinite_weight", "bug",
        "apply_rejection_sampling replaces a non-finite log(pi_prox / pi_behave) by 0 before it filters and "
        "weighs: a token whose behaviour log-prob is -inf (w = +inf, policy_losses.md eq. (13): masked or "
        "capped) gets weight 1 and passes the filter as an on-policy token.",
        where="utils/functional/functional.py:233",
        quote="log_ratio = torch.where(torch.isfinite(log_ratio), log_ratio, 0.0)",
        affected=_AFFECTED + " (rejection_sampling set, a non-finite behaviour or proximal log-prob)",
    ),
    Finding(
        "adv_leave_one_out_std", "bug",
        "Normalization with mean_leave1out and a std level takes the std about each element's leave-one-out "
        "mean, i.e. of n/(n-1) (x - mean): n/(n-1) times the std of the rewards, so RLOO's factor cancels "
        "and A = (x - mean) / std, not advantages.md eq. (2) + (5)'s n/(n-1) (x - mean) / std. "
        "Rewards (1, 0, 0, 0), one group, eps 0: (1.5, -0.5, -0.5, -0.5) instead of (2, -0.667, -0.667, "
        "-0.667).",
        where="utils/data.py:1472", quote="group_mean_slice = mean[s]  # already computed and expanded",
        affected=_AFFECTED + " (reward_norm / adv_norm with mean_leave1out and std_level set)",
    ),
    Finding(
        "adv_std_uncentred", "bug",
        "Normalization with mean_level None and a std level divides by the root mean square about 0, not by "
        "the std (its mean is the zero tensor it did not subtract): rewards (1, 2, 3), std_level 'batch', "
        "eps 0: (0.378, 0.756, 1.134) instead of x / std = (1, 2, 3).",
        where="utils/data.py:1445", quote='else:  # mean_level == "none"',
        affected=_AFFECTED + " (mean_level None with std_level set)",
    ),
    Finding(
        "adv_all_masked", "value_only",
        "Normalization returns its input unnormalised when the loss mask has no token (advantages.md eq. "
        "(22): no counted entry gives 0); the loss masks every position of such a batch, so training is "
        "unchanged, the logged advantages are the raw ones.",
        where="utils/data.py:1409", quote="return x.float()", affected=_AFFECTED,
    ),
    Finding(
        "distill_k1_loss", "bug",
        "with a teacher and rl_loss_weight != 0 (KDRL, the default 1.0) grpo_loss_fn adds "
        "distill_loss_weight times the token mean of logp - teacher_logp, k1 used as a loss term: its "
        "expected gradient is 0 "
        "(kl.md eq. (7)), so the teacher moves the policy only through noise. One state, 3 tokens, logits "
        "(0.3, -0.2, 0.5), teacher logits (2, -1, 0): E[grad] = (0, 0, 0) where grad KL(pi || teacher) = "
        "(-0.526, 0.217, 0.308).",
        where="trainer/ppo/actor.py:507",
        quote="rkl_penalty_per_token = (logprobs - teacher_logp) * loss_mask",
        affected=_AFFECTED + " (teacher_logp given, rl_loss_weight != 0)",
    ),
    Finding(
        "distill_per_token_reward", "documented_default",
        "pure distillation (rl_loss_weight 0) uses teacher_logp - logp of each token as that token's reward "
        "with an importance weight and no return-to-go (the 'reverse KL' of its comment, the discount-0 "
        "on-policy distillation recipe): the gradient of the sequence reverse KL also credits a token with "
        "the later tokens' terms (kl.md eq. (8b)).",
        where="trainer/ppo/actor.py:496", quote="rkl_reward = teacher_logp - logprobs.detach()",
        affected=_AFFECTED + " (teacher_logp given, rl_loss_weight 0)",
    ),
    Finding(
        "reward_clip_default", "documented_default",
        "PPOActor clips (reward + reward_bias) * reward_scaling to [-reward_clip, reward_clip] before the "
        "advantages, with reward_clip 20 by default ('Maximum absolute value for reward clipping', "
        "cli_args.py:1488-1490): rewards beyond +-20 are cut (advantages.md has no clip).",
        where="trainer/ppo/actor.py:169", quote="reward_score = torch.clip(",
        affected=_AFFECTED + " (|reward * reward_scaling| > 20)",
    ),
    Finding(
        "gspo_token_advantages", "documented_default",
        "importance_sampling_level='sequence' with per-token advantages (a critic's GAE) replaces them by "
        "each row's mean advantage (its docstring says so, functional.py:74-77); GSPO's sequence ratio is "
        "defined with one advantage per sequence (policy_losses.md section 2).",
        where="utils/functional/functional.py:145",
        quote="masked_advantages.sum(dim=-1, keepdim=True) / seq_lengths",
        affected=_AFFECTED + " (importance_sampling_level 'sequence', per-token advantages)",
    ),
    Finding(
        "config:group_size", "validation",
        "NormConfig accepts mean_level 'group' with its default group_size 1 (it rejects only "
        "group_size < 1): every group is one sample, its mean the sample itself, and every advantage "
        "is 0 (std_unbiased, the "
        "default, sets a singleton's std to 1), silently. Rewards (1, 0, 1, 0): (0, 0, 0, 0). Nor is "
        "group_size ever compared with gconfig.n_samples, the size of the groups the rollout samples "
        "(rl_trainer.py:616 passes n_samples to prepare_batch only; no __post_init__ reads both): "
        "group_size 2 with n_samples 4 normalises each half of a group on its own, silently. Rewards (1, "
        "0, 1, 0.5), eps 0: (0.707, -0.707, 0.707, -0.707) where the group of 4 gives (0.783, -1.306, "
        "0.783, -0.261).",
        where="api/cli_args.py:93", quote=") and self.group_size < 1:",
        affected=_AFFECTED + " (reward_norm / adv_norm with mean_level 'group' and no group_size, or a "
        "group_size other than gconfig.n_samples)",
    ),
    Finding(
        "config:overlong_tokens", "validation",
        "overlong_tokens is never checked: 0 divides by zero in reward_overlong_penalty, a NaN reward at "
        "L = max_new_tokens and -inf beyond (advantages.md eq. (8) needs L_cache > 0); overlong_tokens > "
        "max_new_tokens is accepted too.",
        where="utils/functional/functional.py:798",
        quote="-exceed_len / overlong_tokens * overlong_penalty_factor, 0",
        affected=_AFFECTED + " (overlong_reward_penalty with overlong_tokens <= 0)",
    ),
    Finding(
        "config:m2_threshold", "validation",
        "m2_threshold <= 0 is accepted: no suffix of second moments averages below it, so M2PO masks every "
        "token of the micro-batch but one, silently.",
        where="trainer/ppo/actor.py:841", quote="num_to_mask = n - 1",
        affected=_AFFECTED + " (m2_threshold <= 0)",
    ),
    # a second audit (source first, kit second): four settings and one approximation no finding named
    Finding(
        "mask_no_eos_reward_only", "bug",
        "mask_no_eos_with_zero ('Mask truncated generations (no EOS token) and exclude from training', "
        "cli_args.py:1503-1507) only adds 0 instead of the task reward for a row without EOS "
        "(actor.py:207-210), after reward_norm has normalised the group with that reward (actor.py:172-173): "
        "the row's tokens keep their loss mask, stay in the loss with the KL-only advantage and in its token "
        "count, and its raw reward still shifts its group's baseline (advantages.md eq. (9): every token of "
        "a truncated sample leaves the mask). Group of 2 (the longest row truncated, rewards (1, 0)): loss "
        "mask (1, 1, 1, 1) kept and advantages (0, -0.707) where dropping the sample leaves the other "
        "alone in its group. Which row counts as truncated is finding eos_by_width.",
        where="trainer/ppo/actor.py:209", quote="seq_no_eos_mask, 0, reward_score",
        affected=_AFFECTED + " (mask_no_eos_with_zero=True)",
    ),
    Finding(
        "config:max_new_tokens", "validation",
        "the overlong penalty's budget is actor.max_new_tokens (actor.py:163; default 1024, "
        "cli_args.py:1593-1596), a field of its own, never compared with the generation budget "
        "gconfig.max_new_tokens (default 16384, cli_args.py:170-172): with overlong_reward_penalty and the "
        "two defaults, every response longer than 1024 - overlong_tokens tokens is punished, without the "
        "floor (finding overlong_floor), though the rollout allowed it (advantages.md eq. (8): L_max is the "
        "generation limit). L = 1100, overlong_tokens 64, factor 1: -2.19 where the rollout's budget "
        "gives 0.",
        where="trainer/ppo/actor.py:163", quote="max_response_length=self.config.max_new_tokens,",
        affected=_AFFECTED + " (overlong_reward_penalty with actor.max_new_tokens != gconfig.max_new_tokens)",
    ),
    Finding(
        "config:m2_threshold_coupled", "validation",
        "m2_threshold (M2PO) is accepted without use_decoupled_loss, where it does nothing: the coupled "
        "path makes the proximal log-probs the old ones (actor.py:186 with recompute_logprob, :191 "
        "without), so every second moment (old - prox)^2 is 0 and no token is ever masked, silently. "
        "Behaviour log-probs 3 nats from the recomputed ones, m2_threshold 1: every token kept.",
        where="trainer/ppo/actor.py:191", quote='data["prox_logp"] = old_logp',
        affected=_AFFECTED + " (m2_threshold set, use_decoupled_loss=False)",
    ),
    Finding(
        "config:critic_mask_no_eos", "validation",
        "PPOCriticConfig.mask_no_eos_with_zero (cli_args.py:1662-1667, 'Mask truncated generations ... and "
        "exclude from training') is read only into the logged scalars (critic.py:49-53): the critic trains "
        "on the returns the actor computed with the actor's own setting, whatever the critic's says.",
        where="trainer/ppo/critic.py:50", quote="mask_no_eos_with_zero=self.config.mask_no_eos_with_zero,",
        affected=_AFFECTED + " (critic.mask_no_eos_with_zero != actor.mask_no_eos_with_zero)",
    ),
    Finding(
        "prox_logp_loglinear", "documented_default",
        "prox_logp_method='loglinear' skips the proximal forward pass and takes pi_prox as old_logp + "
        "alpha (logp - old_logp), alpha = (v_theta - 1 - v_behave) / (v_theta - v_behave) clipped to [0, 1], "
        "logp detached (actor.py:648-667, 735-745): an interpolation, not the proximal policy of the "
        "decoupled loss (policy_losses.md eq. (13): the recomputed log-probs); the help documents it "
        "('log-linear interpolation to approximate proximal policy', cli_args.py:1577).",
        where="trainer/ppo/actor.py:665",
        quote="approximations[PROX_APPROX_METHOD_LOGLINEAR] = old_logp + alpha * (",
        affected=_AFFECTED + " (use_decoupled_loss=True, prox_logp_method 'loglinear')",
    ),
    # a third audit (source first, kit second): two settings accepted silently, two logged values
    Finding(
        "config:sapo_ignores_clip", "validation",
        "with use_sapo_loss=True, grpo_loss_fn calls sapo_loss_fn, which takes no clip arguments: eps_clip, "
        "eps_clip_higher and c_clip are accepted and have no effect, and PPOActorConfig.__post_init__'s SAPO "
        "check (cli_args.py:1637-1647) reads only the temperatures and use_decoupled_loss. A user who sets "
        "a clip band or a dual clip for SAPO (policy_losses.md eq. (8): SAPO's soft gate replaces the clip) "
        "gets the same loss and gradient, silently.",
        where="api/cli_args.py:1637", quote="if self.use_sapo_loss:",
        affected=_AFFECTED + " (use_sapo_loss with eps_clip / eps_clip_higher / c_clip set)",
    ),
    Finding(
        "config:rejection_sampling_lower", "validation",
        "RejectionSamplingConfig with metric 'ratio' checks only lower > 0 and lower <= upper: a lower bound "
        ">= 1 (e.g. 1.5) is accepted, and every token whose pi_prox / pi_behave is below it, the on-policy "
        "ones (ratio 1) included, is rejected (mask) or raised to it (clamp). Without use_decoupled_loss the "
        "start-up warning says 'Filtering will be ignored' (cli_args.py:1614-1618), but grpo_loss_fn passes "
        "rejection_sampling to ppo_actor_loss_fn whatever use_decoupled_loss says (actor.py:353, 477), with "
        "the proximal log-probs equal to the old ones: ratio 1, so lower 1.5 masks every token and the "
        "gradient is 0 (policy_losses.md eq. (13): the cap bounds w from above; w = 1 is never rejected).",
        where="api/cli_args.py:1421", quote="if self.lower is not None and self.lower <= 0:",
        affected=_AFFECTED + " (rejection_sampling metric 'ratio' with lower >= 1)",
    ),
    Finding(
        "entropy_masked_logit", "value_only",
        "_gather_logprobs_entropy forms the entropy as -sum(p log p) from log_softmax: a logit of -inf (a "
        "masked vocabulary entry, kl.md section 6) gives 0 * -inf = NaN, so the logged entropy is NaN "
        "(kl.md eq. (5): 0 log 0 = 0; the tensor-parallel path's softmax * logits likewise, "
        "vocab_parallel.py:297). "
        "grpo_loss_fn detaches the entropy and only logs it (actor.py:434, 533): the gradient is unchanged.",
        where="utils/functional/vocab_parallel.py:27",
        quote="entropy = -torch.sum(log_probs.exp() * log_probs, dim=-1)",
        affected=_AFFECTED + " (a logit of -inf)",
    ),
    Finding(
        "approx_kl_sign", "value_only",
        "ppo_actor_loss_fn logs approx_kl = logprobs - proximal_logprobs = log(pi_theta / pi_prox) (and "
        "behave_approx_kl = log(pi_prox / pi_behave), functional.py:536): under samples from the older "
        "policy its mean is -KL(pi_prox || pi_theta), the negative of the k1 estimate (kl.md eq. (2)), and "
        "the opposite sign of the same log's kl_div_direct (actor.py:1052). Logging only.",
        where="utils/functional/functional.py:548",
        quote="approx_kl=(logprobs - proximal_logprobs).detach(),",
        affected=_AFFECTED,
    ),
    # a fourth audit (source first, kit second): a std about another level's mean, the KL reward's estimator
    Finding(
        "adv_std_batch_mean", "bug",
        "Normalization with mean_level 'batch' and std_level 'group' passes the batch mean to each group's "
        "_compute_std (utils/data.py:1472, 1481-1484), so a group is divided by its spread about the batch "
        "mean, not by its own std (advantages.md eq. (3): the group's variance about the group's mean): a "
        "group far from the batch mean gets a small advantage whatever its internal spread. Rewards (3, 1, "
        "0, 0), groups of 2, std_unbiased, eps 0: the first group's (1.0, 0.0) where (x - batch mean) / "
        "std_g gives (1.414, 0.0). (mean_level None is finding adv_std_uncentred.)",
        where="utils/data.py:1484", quote="group_mean_slice,",
        affected=_AFFECTED + " (mean_level 'batch' with std_level 'group')",
    ),
    Finding(
        "config:kl_estimator", "validation",
        "kl_estimator 'k2' or 'k3' is accepted for the actor's KL reward (actor.py:202; PPOActorConfig's "
        "choices k1, k2, k3, its help 'KL divergence estimator'), where the estimate is a detached per-token "
        "reward followed by the score-function gradient: only k1 gives the gradient of the KL there; k3 "
        "lacks its pathwise term and k2 is biased in value (kl.md section 3, table: 'as reward with score "
        "function'). One decision, pi = softmax(0.3, -0.2, 0.5), pi_ref = softmax(2, -1, 0), kl_ctl 1: "
        "E[grad log pi * (-k)] w.r.t. the logits is (0.526, -0.217, -0.308) = -grad KL(pi || pi_ref) with "
        "k1, (0.149, -0.113, -0.036) with k2 and (0.035, -0.045, 0.009) with k3, silently.",
        where="trainer/ppo/actor.py:202",
        quote="rewards = -self.kl_ctl * self.kl_estimator(old_logp, ref_logp)",
        affected=_AFFECTED + " (kl_estimator 'k2' / 'k3' with a reference model)",
    ),
)

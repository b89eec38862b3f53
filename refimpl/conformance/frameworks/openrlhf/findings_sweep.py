"""OpenRLHF 0.11.2's findings of the sweep of its CLI options, metrics and training path (the entries
findings.py has no room for; frameworks/findings.py explains the classes), each line checked against the
installed code by tests/test_framework_findings.py."""

from __future__ import annotations

from ..findings import Finding

__all__ = ["SWEEP_FINDINGS"]

SWEEP_FINDINGS = (
    Finding(
        "config:clip_range", "validation",
        "--reward.clip_range LOW HIGH (nargs=2, 'Reward clip range') is not checked for LOW <= HIGH "
        "(cli/train_ppo_ray.py validates neither order nor sign): compute_reward's clamp(min=LOW, max=HIGH) "
        "with LOW > HIGH returns HIGH for every input, so every response's score becomes the same constant "
        "and every advantage of the group estimators (and, without the KL, of reinforce) is 0: nothing is "
        "learnt from the reward, without an error or a warning (--reward.clip_range 5 -5: scores 1, -1, 0 "
        "all train as -5).",
        where="models/utils.py:142", quote="r = r.clamp(min=reward_clip_range[0], max=reward_clip_range[1])",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:gamma", "validation",
        "--algo.advantage.gamma and --algo.advantage.lambd ('PPO GAE gamma / lambd', type=float) are not "
        "range-checked: get_advantages_and_returns and get_cumulative_returns accept gamma > 1 or < 0 and "
        "lambd outside [0, 1] (estimators.md eqs. (4)-(5): 0 <= gamma, lambda <= 1), so a reward two tokens "
        "later is amplified, not discounted (gamma 1.5, lambd 1, reward 1 on the last of 3 tokens, V = 0: "
        "A_0 = 2.25; a return of reward 1 is at most 1). lambd is read by gae only: with every other "
        "estimator it is ignored without a word (gamma is reset to 1 with a warning for all but reinforce, "
        "experience_maker.py:308-310).",
        where="trainer/ppo_utils/experience_maker.py:382",
        quote="delta = rewards[:, t] + gamma * nextvalues - values[:, t]",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:kl_target", "validation",
        "--algo.kl.target and --algo.kl.horizon (no help text) are not checked: the trainer picks the "
        "controller by truthiness (ppo_trainer.py:171 'if self.args.algo.kl.target:'), so a target of 0 "
        "silently gives the fixed coefficient; a negative target makes current / target - 1 < -1, the error "
        "is clipped to -0.2 at every step and the coefficient shrinks whatever the KL (target -0.5, KL 2, "
        "n_steps 1000, horizon 10000: beta 0.1 -> 0.098, where a KL above any target raises it); a negative "
        "horizon reverses the controller's sign (the coefficient shrinks when the KL is above the target) "
        "and horizon 0 divides by zero at the first update. Ziegler et al. 2019 (arXiv:1909.08593): "
        "KL_target > 0, horizon > 0.",
        where="trainer/ppo_utils/kl_controller.py:17",
        quote="proportional_error = np.clip(current / target - 1, -0.2, 0.2)",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:overlong_buffer_len", "validation",
        "--reward.overlong_buffer_len is checked only against the length limit (length_penalty.py:37-39, "
        "max_new_tokens >= buffer): a buffer of 0 or below is accepted and apply_overlong_penalty then "
        "penalises nothing (exceed_len = min(length - (limit - buffer), buffer) <= 0), so DAPO's overlong "
        "penalty (advantages.md eq. (8), L_cache > 0) is silently off: buffer 0, a response at the limit of "
        "100 tokens keeps its reward 1 (the penalty at L_max is -1).",
        where="trainer/ppo_utils/length_penalty.py:51",
        quote="exceed_len = min(valid_response_length - expected_len, overlong_buffer_len)",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:overlong_penalty_factor", "validation",
        "--reward.overlong_penalty_factor ('overlong penalty factor', default 1) is not checked for sign: a "
        "negative factor turns DAPO's overlong penalty (advantages.md eq. (8): 0 down to -1 over the buffer) "
        "into a bonus growing with the length (factor -1, limit 100, buffer 20: a 100-token response gets "
        "+1, a 50-token one 0), without an error or a warning.",
        where="trainer/ppo_utils/length_penalty.py:54",
        quote="overlong_penalty = -exceed_len / overlong_buffer_len * overlong_penalty_factor",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:stop_properly_penalty_coef", "validation",
        "--reward.stop_properly_penalty_coef in [0, 1] ('Penalty for truncated samples ... If >= 0: "
        "multiplicative scaling') multiplies a truncated response's reward: a penalty only while the reward "
        "is positive. With rewards that can be negative (a -1 for a wrong answer, or any reward after the "
        "DAPO overlong penalty, which apply_length_penalties applies first, length_penalty.py:126-149, and "
        "which is largest exactly on the truncated responses) the scaling raises the truncated response's "
        "reward toward 0: coefficient 0.5, two wrong answers with reward -1, one truncated: -1 and -0.5, the "
        "truncated one preferred; with the overlong penalty on, coefficient 0 erases it. Accepted without a "
        "check of the reward's sign or a warning about the combination.",
        where="trainer/ppo_utils/length_penalty.py:103",
        quote="experience.rewards[j] = experience.rewards[j] * stop_properly_penalty_coef",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:value_clip", "validation",
        "--critic.value_clip (type=float, 'PPO value clip range') is not checked for sign: 0 (a user's way "
        "to turn the clip off, which no value does, finding value_clip_default) makes V_clip = V_old, so "
        "max((V_old - R)^2, (V - R)^2) keeps the constant term whenever V is closer to the return than V_old "
        "and the critic gets no gradient after its first step of each rollout (V_old 0, V 0.5, return 1: "
        "gradient 0 instead of -0.5); a negative clip c makes clamp(-c, c) return its upper bound c < 0, a "
        "constant shift. policy_losses.md eq. (23): eps_v > 0.",
        where="models/loss.py:283",
        quote="values_clipped = old_values + (values - old_values).clamp(-self.clip_eps, self.clip_eps)",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:max_new_tokens", "validation",
        "with --train.agent_func_path (the multi-turn MultiTurnAgentExecutor) --rollout.max_new_tokens is "
        "ignored: every turn's budget is overwritten with max_length - len(current_obs_tokens), the rest of "
        "--data.max_len (utils/agent.py:94), so a response may run to the context limit whatever the option "
        "says (max_new_tokens 16, max_len 1000, a 10-token prompt: 990 tokens generated), while the DAPO "
        "overlong penalty still takes max_new_tokens as its limit L_max (length_penalty.py:127): every long "
        "response exceeds it and gets the full -1 (with exceed_len capped at the buffer). The single-turn "
        "executor honours the option; no warning for the agent path.",
        where="utils/agent.py:94", quote="sampling_params.max_tokens = max_length - len(current_obs_tokens)",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:async_enable", "validation",
        "--train.async_enable (PPOTrainerAsync, trainer/ppo_trainer_async.py: the sampler runs up to "
        "--train.async_queue_size batches ahead of the trainer) and --train.partial_rollout_enable (a "
        "response's tokens sampled across weight updates) are accepted with --algo.advantage."
        "is_correction_level off, the default, without an error or a warning (the launcher's checks, "
        "cli/train_ppo_ray.py:630-771, never read is_correction_level; vLLM then returns no log-probs, "
        "samples_generator.py:206): the samples of an older policy are trained as if drawn from pi_old, the "
        "trainer's recomputed log-probs, with no behaviour weight, where policy_losses.md eq. (13) "
        "(decoupled "
        "PPO) weighs each token by w = pi_old / pi_behaviour; only the correction options make the async "
        "modes off-policy-correct (a token whose behaviour probability is e times pi_old: loss -1.0 per unit "
        "advantage instead of -0.368).",
        where="cli/train_ppo_ray.py:714", quote="if args.train.async_enable:",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:normalize_enable", "validation",
        "--reward.normalize_enable ('Enable Reward Normalization') is read only where a reward model is "
        "loaded (RewardModelActor, trainer/ray/launcher.py:164, and the critic, ppo_critic.py:196): with "
        "--reward.remote_url (an HTTP reward server or a reward_func .py file) or --train.agent_func_path "
        "the rewards come from utils/agent.py unchanged and the option does nothing, without an error or a "
        "warning (a remote reward of 5.0 trains as 5.0; OpenRLHF's own reward server, cli/serve_rm.py, "
        "has a flag of the same name that must be set there instead); with a local reward model whose "
        "config.json has "
        "no mean / std (a model not trained by OpenRLHF's reward-model trainer, whose evaluation writes "
        "them, rm_trainer.py:295-296) it subtracts 0 and divides by 1, again without a word.",
        where="trainer/ray/launcher.py:164", quote="normalize_reward=strategy.args.reward.normalize_enable,",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "critic_logged_values", "value_only",
        "the critic's logged 'values' is each micro-batch's masked_mean of the values (trainer/ray/"
        "ppo_critic.py:179), averaged over the ranks and then over the micro-batches with equal weights "
        "(ppo_train, lines 106 and 112-118): a mean of means, the token mean of the step's values only "
        "when every "
        "micro-batch holds the same number of response tokens (micro-batches of 1 and 3 tokens with values "
        "0 and 1: logged 0.5, the token mean 0.75). The critic's gradient is not affected.",
        where="trainer/ray/ppo_critic.py:179",
        quote='"values": masked_mean(values, experience.action_mask).detach().item(),',
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:top_p", "validation",
        "--rollout.top_p < 1 (no help text) makes vLLM sample from the nucleus-truncated policy, while the "
        "trainer's log-probs (models/actor.py:266-271: the temperature is applied, top_p is not) are the "
        "full softmax's; with --algo.advantage.is_correction_level off, the default, the samples are "
        "trained as draws of pi_old with no behaviour weight (only the correction asks vLLM for its "
        "processed log-probs, cli/train_ppo_ray.py:78), and the launcher ties neither option to the other. "
        "The policy gradient then estimates E_q[A grad log pi], not E_pi (policy_losses.md eq. (13) weighs "
        "by pi_old / pi_behaviour): a constant advantage 1 at logits (2, 1, 0, -1) with top_p 0.8 (the "
        "nucleus: "
        "the first two tokens) gives the expected loss gradient pi - q = (-0.087, -0.032, 0.087, 0.032), "
        "a push toward the nucleus independent of the reward, where the textbook's is 0.",
        where="cli/train_ppo_ray.py:417",
        quote='parser.add_argument("--rollout.top_p", type=float, default=1.0)',
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:micro_batch_size", "validation",
        "ppo_train's DataLoader over the replay buffer (trainer/ray/ppo_actor.py:163-170, the critic's at "
        "ppo_critic.py:75-82) has drop_last=True: when a rank's experiences are not a multiple of "
        "--train.micro_batch_size (not checked: cli/train_ppo_ray.py:757-763 asserts only that there are "
        "enough sample batches for the actor processes; an episode's short last rollout batch, "
        "samples_generator.py:16-37, leaves any count) the remainder is never trained on, every epoch, "
        "although its advantages entered the batch whitening; with shuffling off (ring attention, tensor "
        "parallelism) it is always the last experiences of the buffer (5 experiences, micro-batch 2: 4 "
        "trained). The policy gradient of the rollout (policy_losses.md eq. (12)) sums over all of its "
        "responses; no warning.",
        where="trainer/ray/ppo_actor.py:167", quote="drop_last=True,",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "logged_return_baselined", "value_only",
        "the logged 'return' (experience.info['return'], merged into the actor's status and logged with "
        "the rewards) is the sum of the per-token rewards compute_reward returns, which for rloo, "
        "reinforce_baseline, dr_grpo, group_norm and flash_reinforce is the baseline-subtracted (group_norm: "
        "the z-scored) score, clipped by --reward.clip_range, plus the KL reward: its batch mean is about "
        "the KL term, not the episode return sum_t r_t of the score (scores 1 and 0 in a group of 2 with "
        "group_norm: logged 0.707 and -0.707, the returns 1 and 0). The gradient uses the advantages, not "
        "this value; the logged 'reward' is the raw score.",
        where="trainer/ppo_utils/experience_maker.py:321",
        quote='experience.info["return"] = reward.sum(dim=-1)',
        affected="openrlhf 0.11.2",
    ),
    # audit 15r4 (source first, kit second): the departures it found that the kit did not name
    Finding(
        "config:loss_agg_mode", "validation",
        "--actor.policy_loss_type gspo sets PolicyLoss.token_level_loss to False in its constructor "
        "(models/loss.py:150-152: 'GSPO requires sequence-level loss'), so --actor.loss_agg_mode token-mean, "
        "the default, is replaced by the sequence mean without an error or a warning: the launcher "
        "(cli/train_ppo_ray.py:630-771) never compares the two options. GSPO's own aggregation is the "
        "sequence mean (Zheng et al. 2025; policy_losses.md eq. (11)), so the loss is GSPO's; the setting "
        "the user gave is ignored (responses of 1 and 3 tokens: each weighs 1/2, not 1/4 and 3/4).",
        where="models/loss.py:152", quote="self.token_level_loss = False",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "kl_loss_k1_default", "documented_default",
        "--algo.kl.use_loss keeps --algo.kl.estimator's default k1 (cli/train_ppo_ray.py:449-456; the help: "
        "'In GRPO, k3 is utilized as the loss function'), and the launcher only prints a recommendation "
        "(line 731): the KL loss is then the token mean of log(pi / pi_ref), whose gradient is the score "
        "function grad log pi, zero in expectation on-policy (kl.md section 3; policy_losses.md eq. (26): "
        "k1 gives 0), so the KL term does not regularise in expectation; GRPO (Shao et al. 2024, eq. (4)) "
        "uses k3. Setting --algo.kl.estimator k3 (or k2) gives the paper's form (the driver's KL-loss modes "
        "do).",
        where="cli/train_ppo_ray.py:731",
        quote="to 'k2' or 'k3' when using KL as a loss",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "gae_lambda_default", "documented_default",
        "--algo.advantage.lambd and --algo.advantage.gamma ('PPO GAE lambd / gamma') default to 1 "
        "(cli/train_ppo_ray.py:410-411): with the gae estimator the advantage is the Monte-Carlo return "
        "minus V(s_t) (estimators.md eq. (5) at lambda = 1), not the lambda = 0.95, gamma = 0.99 of PPO's "
        "experiments (Schulman et al. 2017, Table 3; GAE, Schulman et al. 2016). Setting the two options "
        "gives the paper's (the kit's gae kind passes gamma and lambda explicitly).",
        where="cli/train_ppo_ray.py:410",
        quote='parser.add_argument("--algo.advantage.lambd", type=float, default=1, help="PPO GAE lambd")',
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "empty_micro_batch_metrics", "value_only",
        "PolicyLoss's metrics clip_ratio and ppo_kl are masked_mean over the micro-batch's action tokens "
        "(models/loss.py:257-258; masked_mean, models/utils.py:202, divides by mask.sum() unclamped): a "
        "micro-batch without an action token (every row padding, e.g. a prompt that fills "
        "--data.max_len, samples_generator.py:263) gives 0 / 0 = NaN, and ppo_train multiplies each value "
        "by the micro-batch's token count, here 0 (trainer/ray/ppo_actor.py:207-209: NaN * 0 = NaN), so "
        "the logged ppo_clip_ratio and ppo_kl of the whole step are NaN. The loss divides by the step's "
        "global count and its gradient is right; policy_losses.md section 5: an empty batch's metrics are "
        "finite (0).",
        where="models/loss.py:257",
        quote="clip_ratio = masked_mean(torch.lt(surr2, surr1).float(), action_mask, dim=None)",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "kl_coef_default", "documented_default",
        "--algo.kl.init_coef ('KL penalty in PPO') defaults to 0.01 for both places the KL can go: with "
        "--algo.kl.use_loss (the help: 'whether to use KL loss from GRPO') it is the KL loss's coefficient "
        "(trainer/ray/ppo_actor.py:338, 'loss = actor_loss + kl_loss * kl_ctl'), a quarter of GRPO's "
        "beta = 0.04 "
        "(Shao et al. 2024, section 4.2: 'the KL coefficient is 0.04'); in the reward (the default) it is "
        "half of InstructGPT's beta = 0.02 (Ouyang et al. 2022, appendix C.4). Setting --algo.kl.init_coef "
        "gives the paper's; the kit's kinds pass the coefficient explicitly.",
        where="cli/train_ppo_ray.py:438",
        quote='parser.add_argument("--algo.kl.init_coef", type=float, default=0.01, '
              'help="KL penalty in PPO")',
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "reinforce_gae_mean_subtracted", "documented_default",
        "--algo.advantage.estimator reinforce and gae always have the step's token-weighted mean advantage "
        "subtracted (compute_advantages_and_returns, experience_maker.py:325-338), and divided by its std "
        "unless --algo.advantage.no_std_norm: 'reinforce' is REINFORCE with a batch-mean baseline and a "
        "batch scale, not Williams's (1992) return-weighted score function (estimators.md: the return "
        "itself), and gae's advantages are whitened where the GAE / PPO papers use A_t as computed. The "
        "estimator's help does not say so; the mean subtraction is documented only through no_std_norm's "
        "help ('while keeping mean normalization'), and no option turns it off, so the paper's unwhitened "
        "advantage is not available (reinforce, a step of one response with reward 1: every token's "
        "advantage 0).",
        where="trainer/ppo_utils/experience_maker.py:330",
        quote="mean = (all_advantages * all_action_masks).sum() / num_actions",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "clip_ratio_dual_clip", "value_only",
        "the logged clip_ratio (ppo_clip_ratio) counts a token iff surr2 < surr1 (models/loss.py:257), i.e. "
        "only the hard clip's cut-off; with --actor.dual_clip c a token with A < 0 and ratio > c, whose "
        "loss the dual clip replaces by -c A with zero gradient (loss.py:208-212), has surr1 < surr2 and is "
        "not counted: ratios (4, 1.5, 1), A = -1, eps 0.2, c 3 log clip_ratio 0 while the first token's "
        "gradient is cut (the usual clip fraction, |r - 1| > eps, is 2/3; the tokens whose gradient a clip "
        "removes are 1/3). The gradient is right.",
        where="models/loss.py:257",
        quote="clip_ratio = masked_mean(torch.lt(surr2, surr1).float(), action_mask, dim=None)",
        affected="openrlhf 0.11.2",
    ),
    # audit 15r5 (source first, kit second): the departures it found that the kit did not name
    Finding(
        "kl_mean_empty_row", "bug",
        "make_experience logs each response's KL as masked_mean(kl, action_mask, dim=-1) "
        "(trainer/ppo_utils/experience_maker.py:215; masked_mean, models/utils.py:202, divides by the "
        "unclamped mask sum): a response without an action token (a prompt that fills --data.max_len, "
        "samples_generator.py:263) gives 0 / 0 = NaN in info['kl'], ppo_train's sample-weighted mean of the "
        "step's metrics is then NaN, and ppo_trainer.py:253 hands that status['kl'] to kl_ctl.update: with "
        "--algo.kl.target (AdaptiveKLController, kl_controller.py:17-19) the KL coefficient becomes NaN "
        "and, with the KL in the reward (the default), compute_reward's -kl_coef * kl makes every reward, "
        "advantage and gradient of the next step NaN. With the fixed coefficient only the logged kl is "
        "NaN. policy_losses.md section 5: an all-masked row contributes 0 and is not counted, and an empty "
        "batch's metrics are finite (one empty and one 2-token response with KL 0.1 per token, target 0.1: "
        "logged kl NaN instead of 0.1, coefficient and next rewards NaN instead of finite).",
        where="trainer/ppo_utils/experience_maker.py:215",
        quote="kl_mean = masked_mean(kl, samples.action_mask, dim=-1)",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "behavior_correction_default", "documented_default",
        "--algo.advantage.is_correction_level defaults to off (cli/train_ppo_ray.py:261-267): in the default "
        "synchronous training PolicyLoss forms the ratio against old_log_probs, the DeepSpeed actor's "
        "recomputed log-probs (models/loss.py:185), and applies no weight for the responses having been "
        "sampled by vLLM, whose numerics (kernels, precision) give different log-probs for the same weights; "
        "vLLM is not even asked for them (samples_generator.py:206). The sampling policy then differs from "
        "pi_old with no correction, where decoupled PPO (Hilton et al. 2022; policy_losses.md eq. (13)) and "
        "the truncated IS of Yao et al. 2025 weigh each token by pi_old / pi_behaviour (a token that vLLM "
        "gives probability 0.5 and the trainer 0.25: weight 0.5, default 1). Setting "
        "--algo.advantage.is_correction_level token (mode clip or mask) gives the correction; findings "
        "config:async_enable and config:top_p state the same gap for async training and for top_p < 1.",
        where="models/loss.py:216",
        quote='if self.is_correction_level != "off" and self.policy_loss_type == "ppo":',
        affected="openrlhf 0.11.2",
    ),
)

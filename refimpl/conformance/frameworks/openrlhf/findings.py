"""OpenRLHF 0.11.2's findings (frameworks/findings.py explains the classes), each line checked against
the installed code by tests/test_framework_findings.py."""

from __future__ import annotations

from ..findings import Finding, dual_clip_tie_finding, ratio_overflow_finding
from .findings_sweep import SWEEP_FINDINGS

__all__ = ["FINDINGS"]

#: Departures OpenRLHF would likely want to change (the matrix lists them with the modes that show them).
FINDINGS = (
    Finding(
        "empty_step", "bug",
        "a step with no token (every row padding) divides the masked sum by a token count of 0: the loss "
        "is 0 / 0 = NaN and so is every gradient entry (d/dx of sum(x * 0) / 0), which the optimizer "
        "step then applies; the spec's loss is 0 with zero gradient.",
        where="models/loss.py:32", quote="return (loss * loss_mask).sum() / batch_num_tokens * dp_size",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "value_empty_step", "bug",
        "the critic's loss has the same division: ValueLoss.forward (models/loss.py:290) reduces through "
        "aggregate_loss, so a critic step with no token (every row padding) is 0 / 0 = NaN in the loss "
        "and in the gradient of every value whose term the value clip does not cut off, which the "
        "critic's optimizer step then applies; the spec's value loss is 0 with zero gradient.",
        where="models/loss.py:32", quote="return (loss * loss_mask).sum() / batch_num_tokens * dp_size",
        affected="openrlhf 0.10.3 (models/loss.py:23), 0.10.4 and 0.11.2",
    ),
    Finding(
        "config:kl_coef", "validation",
        "a negative KL coefficient (--algo.kl.init_coef) is accepted without an error or a warning and "
        "silently replaced by 0: compute_reward drops the KL reward and the actor skips the KL loss "
        "(ppo_actor.py:319), so a sign mistake trains without any KL regularisation.",
        where="models/utils.py:138", quote="if kl_coef <= 0.0:",
        affected="openrlhf 0.11.2",
    ),
    dual_clip_tie_finding("models/loss.py:210", "clip2 = torch.max(clip1, self.dual_clip * advantages)",
                          "openrlhf 0.11.2"),
    # policy_loss_type "gspo" only: "ppo" clamps the log-ratio to +-20 first (loss.py:187)
    ratio_overflow_finding("models/loss.py:196", "ratio = ratio.exp().unsqueeze(-1) * action_mask",
                           "openrlhf 0.11.2 (policy_loss_type gspo)",
                           upstream="https://github.com/OpenRLHF/OpenRLHF/pull/1293 (open)"),
    Finding(
        "config:is_correction_mode", "validation",
        "with policy_loss_type gspo and is_correction_level token or seq, PolicyLoss takes GSPO's sequence "
        "ratio against rollout_log_probs instead of the old log-probs (models/loss.py:192) and skips the "
        "train/rollout correction, which runs for 'ppo' only: is_correction_mode, _gating and _threshold "
        "are accepted and unused (a token the 'ppo' path masks, its weight pi_train / pi_rollout = e^3 "
        "outside [0.5, 5], keeps GSPO's clipped term). The ratio against the rollout log-probs changes the "
        "loss itself, whatever the options: finding gspo_rollout_ratio (a bug).",
        where="models/loss.py:216",
        quote='if self.is_correction_level != "off" and self.policy_loss_type == "ppo":',
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "entropy_aggregation", "bug",
        "the entropy bonus (--actor.entropy_coef) is aggregate_loss's default, a token mean over the step's "
        "tokens, whatever --actor.loss_agg_mode (its help: 'Policy-loss aggregation', "
        "cli/train_ppo_ray.py:445; neither --actor.entropy_coef's help nor the README says how the entropy "
        "is aggregated): under seq-mean-token-mean the policy term weighs each sequence 1 / N and the "
        "entropy each token, not the variant's aggregation for every term (policy_losses.md eq. (12)); the "
        "KL loss likewise (flag kl_aggregation='token_mean'). Not driven: the kit's calls carry no "
        "entropies.",
        where="trainer/ray/ppo_actor.py:347", quote="entropy_loss = aggregate_loss(",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "logged_loss_weighting", "value_only",
        "the logged policy_loss and entropy_loss (ppo_train, trainer/ray/ppo_actor.py:203-219) multiply each "
        "micro-batch's loss, already divided by the step's global token count over the accumulation steps "
        "gas and multiplied by dp_size, by the micro-batch's own token count and divide the all-reduced sum "
        "by the all-reduced tokens, and lines 253-254 weigh the micro-batches by their tokens again: exact "
        "only when every micro-batch of the step, on every rank and at every accumulation step, holds the "
        "same number of tokens, biased otherwise (2 ranks with 1 and 3 tokens of loss l: logged 1.25 l; one "
        "rank, gas 2, micro-batches of 1 and 4 tokens whose token losses are -1 and 1: logged 1.2, the "
        "step's loss 0.6). The gradient is the step's (the kit checks it); only the logs depart, the logged "
        "kl of --algo.kl.use_loss (line 333) too, which ppo_trainer.py:253 hands to kl_ctl.update: with "
        "--algo.kl.target (finding adaptive_kl_controller) that biased value moves the KL coefficient.",
        where="trainer/ray/ppo_actor.py:209",
        quote="value.float().mean().item() * scale if isinstance(value, torch.Tensor) else value * scale",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "constant_group_rounding", "bug",
        "group_norm divides by the sample std plus 1e-9, outside the square root, with no test for a "
        "constant group: in the trainer's float32 (samples_generator.py:304 makes the rewards with "
        "torch.tensor) a group of equal rewards that binary does not hold exactly has a mean that rounds "
        "off them, a std of ~1e-8 and one advantage of magnitude 0.8-0.96 for every member instead of 0 "
        "(0.1 x 8: -0.831 "
        "each; 0.7 x 8: 0.921 in magnitude; 0.1 x 3..6: 0), so a group without any signal pushes all its "
        "responses one way. "
        "float64 rewards (the kit's cases) give ~1e-8; the spec's constant group gives 0 (advantages.md eq. "
        "(5)).",
        where="trainer/ppo_utils/experience_maker.py:274",
        quote="rewards = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "reward_clip_range", "bug",
        "--reward.clip_range (default (-10, 10)) is documented as a reward clip (help 'Reward clip range', "
        "cli/train_ppo_ray.py:474) but applied in compute_reward, after the group estimators have replaced "
        "the reward by its baseline-subtracted or normalised value (experience_maker.py:268-278, then "
        "284-290): for rloo / reinforce_baseline / dr_grpo / group_norm it clips the advantage, not the "
        "reward, which no setting of the option avoids short of widening it (rloo rewards 8 and -8, inside "
        "the clip, in a group of 2: advantages 10 and -10 instead of 16 and -16; group_norm with one "
        "success among n >= 102 responses: z = (n - 1) / sqrt(n) > 10, clipped; advantages.md eqs. (1)-(5) "
        "have no clip). "
        "The kit's cases stay inside +-10; the driver passes the default.",
        where="models/utils.py:142", quote="r = r.clamp(min=reward_clip_range[0], max=reward_clip_range[1])",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "overlong_max_len", "bug",
        "the DAPO overlong penalty (--reward.overlong_buffer_len) takes its length limit from "
        "--rollout.max_new_tokens and, when that is None (the default: the response limit is then "
        "max_len - prompt_len per sample, cli/train_ppo_ray.py:403), from --data.max_len, the prompt + "
        "response limit: the penalty starts prompt_len tokens late (max_len 2048, buffer 512, a 600-token "
        "prompt: a response truncated at its limit of 1448 tokens gets no penalty; DAPO's is -1).",
        where="trainer/ppo_utils/length_penalty.py:127",
        quote='max_new_tokens = getattr(args.rollout, "max_new_tokens", None) or args.data.max_len',
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "kl_value_clamp", "bug",
        "compute_approx_kl clamps every estimator's value to [-10, 10]; with --algo.kl.use_loss the KL loss "
        "is that value, so the clamp's zero derivative removes the KL gradient exactly where the policy has "
        "moved farthest from the reference (k3 > 10; k2 > 10: |log r| > 4.47): k3 at log(pi / ref) = -3 is "
        "10 with gradient 0, exact 16.09 and -19.09 (kl.md eq. (4)). The same clamp as SkyRL's (finding "
        "kl_value_clamp of skyrl_pkg).",
        where="models/utils.py:113", quote="value = value.clamp(min=-10, max=10)", affected="openrlhf 0.11.2",
    ),
    Finding(
        "kl_reward_value_clamp", "bug",
        "the KL in the reward (compute_reward, -kl_coef * compute_approx_kl) is clamped to [-10, 10] per "
        "token, k1 included (the default estimator): where the policy has moved farthest from the reference "
        "(|log r| > 10 for k1, k3 > 10) the penalty stops growing. The same clamp as AReaL's KLEstimator "
        "(finding kl_reward_value_clamp of areal).",
        where="models/utils.py:113", quote="value = value.clamp(min=-10, max=10)", affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:dual_clip", "validation",
        "PolicyLoss asserts only dual_clip > 1: a dual clip inside the clip band (dual_clip <= 1 + eps_high, "
        "e.g. 1.1 with eps 0.2) is accepted and clips A < 0 tokens that PPO's own clip leaves alone (the "
        "dual clip needs c >= 1 + eps_high, policy_losses.md eq. (7)); AReaL's identical assert is its "
        "finding config:c_clip.",
        where="models/loss.py:156", quote="assert dual_clip > 1.0",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "gspo_clip_default", "documented_default",
        "--actor.policy_loss_type gspo clips its sequence ratio with --actor.eps_clip, whose documented "
        "default is PPO's 0.2 ('PPO clip range'; cli/train_ppo_ray.py:633-634 makes it both bounds): GSPO "
        "(Zheng et al. 2025, arXiv:2507.18071) clips the length-normalised sequence ratio at 3e-4 / 4e-4, "
        "a band about 500 times as wide. Setting --actor.eps_clip_low_high 3e-4 4e-4 "
        "gives the paper's (the driver's gspo mode).",
        where="cli/train_ppo_ray.py:406",
        quote='parser.add_argument("--actor.eps_clip", type=float, default=0.2, help="PPO clip range")',
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "dr_grpo_aggregation", "documented_default",
        "--algo.advantage.estimator dr_grpo is Dr. GRPO's advantage only (the group mean subtracted, no "
        "std); the loss keeps --actor.loss_agg_mode, whose only choices are token-mean and "
        "seq-mean-token-mean (cli/train_ppo_ray.py:444): Dr. GRPO's constant normaliser (each sequence's "
        "token sum over N x L_max, policy_losses.md eq. (11)) is not offered, so 'dr_grpo' trains its "
        "advantages under a token or sequence mean. Documented: the README's estimator table says "
        "'dr_grpo ... Removes local /std norm', and --help lists the two aggregations.",
        where="trainer/ppo_utils/experience_maker.py:271",
        quote='elif args.algo.advantage.estimator in ["reinforce_baseline", "dr_grpo"]:',
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "gae_interior_mask", "bug",
        "get_advantages_and_returns zeroes the values and rewards at every masked position (lines 377-378) "
        "and runs the recursion over all of them: in a multi-turn response (the agent's observation tokens "
        "inside it, masked by samples_generator.py:256-258) the value bootstrapped after a turn's last "
        "action token is the 0 of the next, masked, position, and each observation token is one more "
        "discount step. estimators.md eqs. (4)-(5) step over the actions (the next action's value "
        "bootstraps): action, observation, observation, action with V = 0.5, reward 1 at the end, gamma "
        "0.9, lambda 0.95: A_0 = 0.1415 instead of 0.3775. Exact with gamma = lambd = 1 (the defaults: the "
        "sum telescopes); the kit's GAE cases have prefix masks only.",
        where="trainer/ppo_utils/experience_maker.py:377", quote="values = action_mask * values",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:eps_clip", "validation",
        "--actor.eps_clip / --actor.eps_clip_low_high are not range-checked (PolicyLoss checks only "
        "dual_clip, models/loss.py:155-156): a negative epsilon makes the band [1 - eps_low, 1 + eps_high] "
        "exclude ratio 1 (torch.clamp with min > max returns max), so an on-policy token gets the clipped "
        "constant and no gradient (eps -0.1, A = 1: gradient 0 instead of -1 per token), and eps_low >= 1 "
        "removes the lower clip without a word (policy_losses.md eq. (6): 0 <= eps < 1). Given both, "
        "--actor.eps_clip_low_high silently replaces --actor.eps_clip (cli/train_ppo_ray.py:633-634 reads "
        "eps_clip only when eps_clip_low_high is None; no warning).",
        where="models/loss.py:201",
        quote="surr2 = ratio.clamp(1 - self.clip_eps_low, 1 + self.clip_eps_high) * advantages",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:is_correction_threshold", "validation",
        "--algo.advantage.is_correction_threshold LOW HIGH is checked for its length only "
        "(cli/train_ppo_ray.py:642): LOW > HIGH is accepted, and mask mode (the default) then keeps no "
        "token at all (stat >= LOW and stat <= HIGH never holds): the policy loss is 0 with zero gradient "
        "on every step, without a word (clip mode clamps every weight to HIGH).",
        where="models/loss.py:217", quote="low, high = self.is_correction_threshold",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "adaptive_kl_controller", "documented_default",
        "--algo.kl.target selects AdaptiveKLController, the proportional rule of Ziegler et al. 2019 "
        "(arXiv:1909.08593, cited in its docstring): beta times 1 + clip(KL / target - 1, -0.2, 0.2) * "
        "n_steps / horizon, not PPO's adaptive KL penalty (policy_losses.md eq. (20): doubled or halved "
        "outside [target / 1.5, 1.5 target]); KL = 2 target, n_steps 256, horizon 10000: beta 0.1 -> 0.1005, "
        "eq. (20) gives 0.2. Not driven: the kit checks one step with a fixed coefficient.",
        where="trainer/ppo_utils/kl_controller.py:17",
        quote="proportional_error = np.clip(current / target - 1, -0.2, 0.2)",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "kl_unbiased_weight_cap", "documented_default",
        "--algo.kl.unbiased_gradient's help promises 'the true reverse-KL gradient' with the importance "
        "weight w = pi_theta / pi_theta_old; compute_approx_kl caps w at KL_IS_WEIGHT_CLIP = 10 "
        "(models/utils.py:64-66: 'we clamp for stability'), so the gradient is biased wherever w > 10. "
        "Not driven (unsupported mode kl/*+unbiased_gradient).",
        where="models/utils.py:124",
        quote="w = (log_probs.float() - log_probs_old.float()).exp().clamp(max=KL_IS_WEIGHT_CLIP).detach()",
        affected="openrlhf 0.11.2",
    ),
    # audit 14 (source first, kit second): the departures it found that the kit did not name
    Finding(
        "gspo_rollout_ratio", "bug",
        "with --actor.policy_loss_type gspo and the train/rollout correction on "
        "(--algo.advantage.is_correction_level token or seq), PolicyLoss forms GSPO's sequence ratio "
        "against rollout_log_probs, the sampler's log-probs, instead of old_log_probs, the trainer's own "
        "(models/loss.py:191-192), and applies no behaviour weight: the clip then reads the train/rollout"
        " mismatch as a policy change, so on the first mini-batch of a step (pi_theta = pi_old) a "
        "sequence whose mean mismatch leaves GSPO's band loses its gradient. policy_losses.md eqs. (3) "
        "and (13): s from old_logp, the detached weight exp(mean(old_logp - rollout_logp)) outside the "
        "gate. Three tokens with a mismatch of 0.01 nats each, eps 3e-4 / 4e-4, A = 1: gradient 0 per "
        "token instead of -e^0.01 / 3 = -0.3367 (the options this path ignores: finding "
        "config:is_correction_mode).",
        where="models/loss.py:192", quote="log_ratio = log_probs - rollout_log_probs",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "reinforce_gamma", "bug",
        "--algo.advantage.estimator reinforce with --algo.advantage.gamma < 1 (the only estimator that keeps "
        "a gamma other than 1, experience_maker.py:308-310) gives every token the reward-to-go G_t, "
        "discounted from t (get_cumulative_returns, lines 417-419), as its advantage (line 317), without "
        "the gamma^t that weighs step t in the policy gradient: estimators.md eq. (17) "
        "(reward_to_go_no_gamma, errata.md entry 8), not the gradient of J for gamma < 1; eq. (15) weighs "
        "gamma^t G_t. Three tokens, reward 1 on the last, gamma 0.5: 0.25, 0.5, 1 (before the batch "
        "whitening) instead of 0.25, 0.25, 0.25. Exact with gamma = 1, the default.",
        where="trainer/ppo_utils/experience_maker.py:317",
        quote="experience.advantages = experience.returns.clone()",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "is_filter_ratio_empty_rows", "value_only",
        "with --algo.advantage.is_correction_level seq the logged is_filter_ratio is filtered.float().mean() "
        "over every row of the micro-batch (models/loss.py:243-244): an all-padding row's statistic is "
        "masked_mean's 0 / 0 = NaN, which the band test reads as out of band, so the row counts as a "
        "filtered sequence (one kept sequence and one empty row: 0.5 instead of 0). Its coefficient 0 "
        "multiplies a masked term: the loss and gradient are right, only the logged fraction departs.",
        where="models/loss.py:244", quote="is_filter_ratio = filtered.float().mean()",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "is_correction_gating", "documented_default",
        "--algo.advantage.is_correction_level seq and --algo.advantage.is_correction_gating binary_kl / tv "
        "(--help: 'a rejection filter, mask only', 'a trust region, upper bound only') gate a unit on a "
        "statistic the spec's behaviour correction does not have, the geometric mean of the sequence's "
        "weights pi_train / pi_rollout or the mean of a sampled-token binary KL / total variation between "
        "the two policies, and drop the whole unit, its kept tokens keeping their own weights "
        "(models/loss.py:222-239); policy_losses.md eq. (13) weighs each unit by its own weight, truncated "
        "or masked at a cap. No spec variant: not driven (the token level is, modes is_correction/token/*, "
        "with the lower bound of the default band [0.5, 5] as flag behavior_cap_low).",
        where="models/loss.py:222", quote='if self.is_correction_gating == "ratio":',
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "reinforce_baseline_whitening", "documented_default",
        "--algo.advantage.estimator reinforce_baseline subtracts the group mean (experience_maker.py:272) "
        "and then whitens over every response token of the step (lines 325-338: the masked token mean "
        "subtracted, divided by the token-weighted population std floored at 1e-4; "
        "--algo.advantage.no_std_norm 'disable dividing by std for advantages while keeping mean "
        "normalization'): a response counts once per token, so long responses set the batch's mean and std "
        "and the group-centred advantages move (in one group a 1-token response with reward 1 and a 3-token "
        "one with reward 0: 1.73 and -0.58 per token, where advantages.md eq. (5)'s batch scale, one value "
        "per response, gives 1 and -1). gae and reinforce go through the same whitening (the whitening "
        "kind's mode advantage_whitening passes: token weights are eq. (20)'s 'token' option).",
        where="trainer/ppo_utils/experience_maker.py:325",
        quote='if args.algo.advantage.estimator in ["gae", "reinforce", "reinforce_baseline"]:',
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "dynamic_filtering_mean", "documented_default",
        "--algo.dynamic_filtering_enable keeps a prompt's group when the mean of its scores lies strictly "
        "inside --algo.dynamic_filtering_range ('Dynamic filtering rewards range', default (0, 1); "
        "samples_generator.py:169-177); DAPO's dynamic sampling (advantages.md eq. (7)) keeps a group unless "
        "all its rewards are equal. The two agree for 0/1 scores under the default range; for graded scores "
        "a constant group inside the range is kept (no signal) and a varied one whose mean is outside it is "
        "dropped (scores 0 and 2: mean 1, dropped).",
        where="trainer/ppo_utils/samples_generator.py:173", quote="if not (min_r < avg_reward < max_r):",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:advantages", "validation",
        "PolicyLoss(policy_loss_type='gspo') takes advantages per token and gates its one sequence ratio "
        "with each token's own (models/loss.py:200-205), with no check that they are constant along the "
        "response; GSPO has one advantage per sequence (policy_losses.md section 2: sequence levels need "
        "per-sequence advantages). OpenRLHF makes them vary whenever the KL is in the reward (the default: "
        "--algo.kl.init_coef 0.01 without --algo.kl.use_loss; compute_reward puts -kl_coef * kl on every "
        "token and get_cumulative_returns sums it from t on) and with the gae estimator. A sequence ratio "
        "1.01, above GSPO's band, with token advantages 1 and -1 (their mean 0): a non-zero loss and "
        "gradient where the sequence's advantage 0 gives 0 and 0.",
        where="models/loss.py:200", quote="surr1 = ratio * advantages",
        affected="openrlhf 0.11.2",
    ),
    # audit 14b (source first, kit second): the departures it found that the kit did not name
    Finding(
        "config:unbiased_gradient", "validation",
        "--algo.kl.unbiased_gradient ('When using KL as a loss, keep the chosen estimator's value but "
        "backprop the true reverse-KL gradient ...') is read by the actor's KL loss only "
        "(trainer/ray/ppo_actor.py:325); without --algo.kl.use_loss the KL is in the reward, computed by "
        "make_experience's compute_approx_kl call, which does not pass it (experience_maker.py:206-210), and "
        "the launcher's check of the KL options (cli/train_ppo_ray.py:727-734) prints only an estimator "
        "recommendation: the flag is accepted and has no effect, without a word (the default KL in the "
        "reward trains with the plain estimator).",
        where="trainer/ppo_utils/experience_maker.py:206", quote="kl = compute_approx_kl(",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "value_clip_default", "documented_default",
        "--critic.value_clip defaults to 0.5 ('PPO value clip range'), so the critic's ValueLoss "
        "(models/loss.py:282-286, built as ValueLoss(value_clip) by ppo_critic.py:60) is the clipped form "
        "max((V - R)^2, (V_old + clip(V - V_old, -0.5, 0.5) - R)^2), policy_losses.md eq. (23), an absolute "
        "band in the reward's units, where PPO's value loss (Schulman et al. 2017, eq. (9); eq. (22)) is "
        "unclipped; the option is type=float, so no command-line value turns the clip off (only a band wider "
        "than any value change). The value_loss kind's cases give the clip explicitly.",
        where="cli/train_ppo_ray.py:409",
        quote='"--critic.value_clip", type=float, default=0.5, help="PPO value clip range")',
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "reward_clip_default", "documented_default",
        "--reward.clip_range defaults to (-10, 10) ('Reward clip range'): compute_reward clamps every score "
        "(models/utils.py:141-142), so with the gae and reinforce estimators (no group baseline) a reward "
        "model's score beyond +-10 is clipped before the KL is added and the returns are formed (scores 15 "
        "and 25 both train as 10), where the spec's returns (estimators.md eq. (1)) take the reward as it "
        "is; the option's default is on, and only a wider range turns it off. For the group estimators the "
        "same clamp falls on the advantages (finding reward_clip_range, a bug).",
        where="cli/train_ppo_ray.py:474",
        quote='parser.add_argument("--reward.clip_range", type=float, nargs=2, default=(-10, 10)',
        affected="openrlhf 0.11.2",
    ),
    # audit 15 (source first, kit second): the departures it found that the kit did not name
    Finding(
        "multiturn_response_length", "bug",
        "the sample generator sets response_length, documented as the 'number of generated tokens' "
        "(trainer/ppo_utils/experience.py:59), to the span from the first to the last action token "
        "(samples_generator.py:273): in a multi-turn (agent) rollout the observation tokens between the "
        "turns are counted as generated, and the DAPO overlong penalty (length_penalty.py:49) and the length "
        "metrics "
        "read that span. DAPO (Yu et al. 2025, section 3.4; advantages.md eq. (8)) measures the response's "
        "generated length: two turns of 3 action tokens around 10 observation tokens give 16, not 6, so a "
        "response is penalised (or cut off the buffer) for the environment's tokens. Exact for single-turn "
        "responses.",
        where="trainer/ppo_utils/samples_generator.py:273",
        quote="response_length = (ones_indices[-1] - ones_indices[0] + 1).item()",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "kl_in_reward_default", "documented_default",
        "the group estimators (group_norm, dr_grpo, rloo, reinforce_baseline) keep the default KL in the "
        "reward (--algo.kl.init_coef 0.01, --algo.kl.use_loss off): make_experience computes the estimator "
        "(k1 by default) against the reference (experience_maker.py:205-210) and compute_reward adds "
        "-kl_coef * kl to every token, so each token's return is the group-normalised score plus the "
        "unnormalised KL reward-to-go and the advantage varies along the response; GRPO (Shao et al. 2024, "
        "eq. (3)) puts the KL (k3) in the loss and gives every token the normalised outcome reward. "
        "--algo.kl.use_loss ('whether to use KL loss from GRPO') with --algo.kl.estimator k3 gives GRPO's "
        "form (the driver's modes run it).",
        where="cli/train_ppo_ray.py:524",
        quote='"--algo.kl.use_loss", action="store_true", default=False, help="whether to use KL loss from',
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "rloo_kl_outside_baseline", "bug",
        "--algo.advantage.estimator rloo applies the leave-one-out baseline to the score only "
        "(experience_maker.py:269-270); with the default KL in the reward (finding kl_in_reward_default) "
        "compute_reward then adds -kl_coef * kl per token and get_cumulative_returns sums it from t on, "
        "outside the baseline. RLOO (Ahmadian et al. 2024; Kool et al. 2019) baselines the "
        "KL-regularised sequence reward R(y) - beta KL(y) with the other samples' mean of the same quantity: "
        "the expectation is the same (a baseline independent of the sample, reward-to-go), the per-sample "
        "estimate is not (scores 1 and 0, summed KL 2 and 0, beta 0.1: first-token advantages 0.8 and -1.0 "
        "instead of 0.8 and -0.8), and no option gives RLOO's (with --algo.kl.use_loss the KL leaves the "
        "reward).",
        where="trainer/ppo_utils/experience_maker.py:269",
        quote="baseline = (rewards.sum(-1, keepdim=True) - rewards) / (args.rollout.n_samples_per_prompt",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "adaptive_kl_per_token", "bug",
        "--algo.kl.target (AdaptiveKLController, the rule of Ziegler et al. 2019, arXiv:1909.08593: "
        "e = clip(KL_t / KL_target - 1, -0.2, 0.2) with KL_t the KL between the policy's and the reference's "
        "response distributions) is fed status['kl'] (ppo_trainer.py:253), which is each response's "
        "per-token mean of the estimator (experience_maker.py:215, masked_mean(kl, action_mask, dim=-1)) "
        "averaged over the responses (with --algo.kl.use_loss the token-mean KL loss): a per-token quantity, "
        "1/length of the sequence KL, so a target set in the paper's units (nats per response) is reached "
        "only by a KL that many times larger, and long and short responses weigh alike (two responses of "
        "1 and 9 tokens with 0.1 nats per token: 0.1 fed, the sequence KL 0.5; target 0.5: beta shrinks by "
        "the "
        "clipped -0.2 step instead of staying). --algo.kl.target has no help text; ppo_trainer.py:252 says "
        "'AdaptiveKLController is incompatible here'.",
        where="trainer/ppo_utils/experience_maker.py:215",
        quote="kl_mean = masked_mean(kl, samples.action_mask, dim=-1)",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "grad_accum_partial_window", "bug",
        "iter_grad_accum_global_norm (utils/loss_utils.py:102-105) gives a trailing window of k < gas "
        "micro-batches its own token count divided by gas, as if it were a whole optimizer step, but "
        "DeepSpeed runs with gradient_accumulation_steps = gas (utils/deepspeed/deepspeed.py:455-456) and "
        "its "
        "engine.step(), called after every micro-batch (trainer/ray/ppo_actor.py:360, ppo_critic.py:174), "
        "steps only at each gas-th micro-step of its own global counter: the partial window's gradient stays "
        "in the buffers and is summed into the next step, whose micro-batches carry another window's "
        "normaliser, and every later step of the run stays shifted. A step is one token mean over its own "
        "micro-batches (policy_losses.md section 4: the per-token weights of a step sum to 1); two ppo_train "
        "calls of 6 micro-batches each with gas 4 give steps whose token weights sum to 1, then 1.4 and 1.6 "
        "(tokens 3, 5, 2, 4, 6, 1 and 2, 2, 3, 3, 4, 4). It happens whenever the "
        "micro-batches per epoch are not a multiple of gas: rollout.batch_size * n_samples_per_prompt not a "
        "multiple of train.batch_size (not checked by cli/train_ppo_ray.py), or an episode's short last "
        "rollout batch (samples_generator.py:16-37 returns the prompts left).",
        where="utils/loss_utils.py:102", quote="if window:  # trailing partial step",
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "config:no_std_norm", "validation",
        "--algo.advantage.no_std_norm ('disable dividing by std for advantages while keeping mean "
        "normalization', cli/train_ppo_ray.py:526-531) is read only by the batch whitening of gae, reinforce "
        "and reinforce_baseline (experience_maker.py:325-335); with --algo.advantage.estimator group_norm "
        "the advantages are still divided by the group std (line 274) without an error or a warning (one "
        "success in a group of 4: 1.5, -0.5, -0.5, -0.5 where the mean-centred advantages, Dr. GRPO's "
        "(Liu et al. 2025, section 3.2; the estimator dr_grpo), are 0.75, -0.25, -0.25, -0.25).",
        where="trainer/ppo_utils/experience_maker.py:325",
        quote='if args.algo.advantage.estimator in ["gae", "reinforce", "reinforce_baseline"]:',
        affected="openrlhf 0.11.2",
    ),
    Finding(
        "entropy_neg_inf", "bug",
        "compute_entropy forms logsumexp(z) - sum(softmax(z) * z) (models/utils.py:216-219): a logit of -inf "
        "(a token masked out of the vocabulary) gives softmax 0 times -inf = NaN, so that position's "
        "entropy, the entropy bonus of --actor.entropy_coef (trainer/ray/ppo_actor.py:347-353, computed "
        "whenever the option is set, 0 included) and, with a non-zero coefficient, every gradient entry of "
        "the step are NaN. H = -sum_v p_v log p_v with 0 log 0 = 0: a -inf logit drops out (kl.md eq. (5) "
        "and section 6); logits (0, 1, -inf) give 0.5822, not NaN. Reached only where the model's logits "
        "hold -inf (a vocabulary mask in the model's head or a caller's); OpenRLHF itself sets none.",
        where="models/utils.py:218",
        quote="entropy = torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)",
        affected="openrlhf 0.11.2",
    ),
)

# the sweep of the CLI options, metrics and training path (findings_sweep.py)
FINDINGS = FINDINGS + SWEEP_FINDINGS

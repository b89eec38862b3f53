"""What a systematic sweep of AReaL 1.0.4's RL settings and logged values found beyond the audits
(``SWEEP_FINDINGS``; areal.py's ``FINDINGS`` lists them last): settings accepted in a nonsensical range
(the reward clip and scaling, the normaliser's eps, the discount and GAE lambda, the KL coefficient,
the critic's value clip, the overlong factor, the distillation weight), settings without effect in a
mode they can be combined with (mean_leave1out without a mean, the actor's temperature against the
rollout's), two logged values under rejection sampling and the logged task reward. Each has its class
and verified line (findings.py); every validation finding has a standalone script
(repro_areal_sweep.py)."""

from __future__ import annotations

from .findings import Finding

__all__ = ["SWEEP_FINDINGS"]

_AFFECTED = "areal 1.0.4"

SWEEP_FINDINGS = (
    Finding(
        "config:temperature", "validation",
        "the trainer's log-probs (recomputed, current and reference) are log_softmax(logits / "
        "actor.temperature) (TrainEngineConfig.temperature, default 1.0, whose help says 'Temperature "
        "during generation'; fsdp_engine.py:2000, vocab_parallel.py:26), while the rollout samples at "
        "gconfig.temperature (sglang_remote.py:61, vllm_remote.py:57); nothing compares the two "
        "(PPOConfig.__post_init__ reads gconfig only for eval_gconfig and the LoRA name). With "
        "gconfig.temperature 0.7 and the default actor.temperature the policy trained is not the one that "
        "sampled (policy_losses.md eq. (1): old_logp is the policy that sampled the batch): an "
        "on-policy token's ratio against the rollout's log-probs is not 1 (logits (2, 0, -1): log-probs "
        "-0.069 at T = 0.7, -0.170 at T = 1, ratio 0.904), and the clip acts on that mismatch. "
        "ref.temperature likewise; gconfig.top_p < 1, top_k and min_new_tokens change the sampling "
        "distribution too, while the trainer's log-probs are always the full softmax.",
        where="api/cli_args.py:1099",
        quote='default=1.0, metadata={"help": "Temperature during generation."}',
        affected=_AFFECTED + " (gconfig.temperature != actor.temperature)",
    ),
    Finding(
        "config:reward_clip", "validation",
        "PPOActorConfig accepts any reward_clip: PPOActor clips the reward to [-reward_clip, reward_clip] "
        "(actor.py:169-171), so reward_clip 0 sets every reward to 0 (no training signal) and a negative "
        "one sets every reward to reward_clip itself (torch.clip with min > max returns max), silently. "
        "Rewards (1, 0), reward_clip -1: (-1, -1).",
        where="trainer/ppo/actor.py:170", quote="reward_score, max=self.reward_clip, min=-self.reward_clip",
        affected=_AFFECTED + " (reward_clip <= 0)",
    ),
    Finding(
        "config:reward_scaling", "validation",
        "reward_scaling is never checked: 0 is accepted and multiplies every reward by 0 before the "
        "advantages (actor.py:168), so the task reward is gone and only the KL reward is left (no "
        "training signal from the task), and a negative scaling turns the reward into a cost, silently. "
        "Rewards (1, 0), reward_scaling 0, kl_ctl 0: advantages (0, 0).",
        where="trainer/ppo/actor.py:168",
        quote="reward_score = (reward_score + self.reward_bias) * self.reward_scaling",
        affected=_AFFECTED + " (reward_scaling <= 0)",
    ),
    Finding(
        "config:distill_loss_weight", "validation",
        "TeacherConfig.__post_init__ checks only the teacher's engines: a negative distill_loss_weight (or "
        "rl_loss_weight) is accepted and copied to every trajectory (rl_trainer.py:671-674); pure "
        "distillation (rl_loss_weight 0) then minimises -distill_loss_weight * mean(w (log T - log pi)) "
        "with a positive coefficient and drives the policy away from the teacher (kl.md eq. (8b): the "
        "reverse KL to the teacher is minimised, its weight > 0). log pi -2, log T -0.5, weight -1: d loss "
        "/ d log pi = +1.5 (the token the teacher prefers is pushed down) where weight 1 gives -1.5.",
        where="trainer/ppo/actor.py:501", quote="kd_coef = -1 * distill_loss_weight",
        affected=_AFFECTED + " (teacher with distill_loss_weight < 0)",
    ),
    Finding(
        "config:norm_eps", "validation",
        "NormConfig accepts any eps (its __post_init__ checks the levels and group_size only) and "
        "Normalization divides by std + eps: eps 0 turns a group of equal rewards into 0 / 0 = NaN "
        "advantages, and a negative eps larger than a group's std flips the sign of its advantages "
        "(advantages.md eq. (4): eps > 0). Rewards (1, 0), group std, eps -1: (-1.707, 1.707); rewards "
        "(1, 1), eps 0: (NaN, NaN).",
        where="utils/data.py:1496", quote="return (x_centered / (std + eps)).float()",
        affected=_AFFECTED + " (reward_norm / adv_norm with eps <= 0)",
    ),
    Finding(
        "config:discount", "validation",
        "discount and gae_lambda are never checked (PPOActorConfig.__post_init__ reads neither): a "
        "discount above 1 or below 0, a gae_lambda outside [0, 1] are accepted and run through the GAE "
        "recursion (estimators.md eq. (4)-(5): 0 <= gamma <= 1, 0 <= lambda <= 1). discount 1.5, a reward "
        "of 1 after three tokens: advantages (2.25, 1.5, 1.0), the earliest token credited most.",
        where="trainer/ppo/actor.py:226",
        quote="newgaelam = delta + self.discount * self.gae_lambda * lastgaelam",
        affected=_AFFECTED + " (discount or gae_lambda outside [0, 1])",
    ),
    Finding(
        "config:kl_ctl", "validation",
        "kl_ctl is never checked: a negative kl_ctl is accepted and rewards divergence from the reference "
        "(-kl_ctl * KL > 0, actor.py:202; a KL penalty's coefficient is >= 0, policy_losses.md eq. (12)), "
        "and then rl_trainer builds no reference model although ref is configured (rl_trainer.py:179 "
        "requires kl_ctl > 0), so "
        "the KL term is taken against zeros (finding kl_reward_no_reference): -kl_ctl * log pi_old, a "
        "penalty on rare tokens. With a reference, log pi_old - log pi_ref = 2 and kl_ctl -0.1: +0.2 of "
        "reward per token.",
        where="trainer/rl_trainer.py:179", quote="if config.actor.kl_ctl > 0 and config.ref is not None:",
        affected=_AFFECTED + " (kl_ctl < 0)",
    ),
    Finding(
        "config:critic_eps_clip", "validation",
        "PPOCriticConfig.eps_clip (the value clip) is never checked: a negative value is accepted and "
        "(value - old_value).clamp(-eps, eps) with -eps > eps returns eps, so the clipped value is "
        "old_value - |eps| whatever the critic predicts, and the loss max(orig, clipped) keeps a constant "
        "term (policy_losses.md eq. (23): clip(V - V_old, -eps, eps), eps >= 0). value = old = return = 1, "
        "eps_clip -0.5: loss 0.125 with zero gradient instead of 0.",
        where="utils/functional/functional.py:757", quote="-value_eps_clip, value_eps_clip",
        affected=_AFFECTED + " (critic.eps_clip < 0)",
    ),
    Finding(
        "config:mean_leave1out", "validation",
        "NormConfig accepts mean_leave1out=True with mean_level None, where Normalization subtracts no mean "
        "at all (utils/data.py:1445-1446) and the leave-one-out setting does nothing, silently: a user who "
        "asked for RLOO's baseline (advantages.md eq. (2)) gets the raw rewards. Rewards (1, 0, 0, 0): "
        "(1, 0, 0, 0) where RLOO gives (1, -0.333, -0.333, -0.333).",
        where="utils/data.py:1445", quote='else:  # mean_level == "none"',
        affected=_AFFECTED + " (mean_leave1out with mean_level None)",
    ),
    Finding(
        "config:overlong_penalty_factor", "validation",
        "overlong_penalty_factor is checked only for None (actor.py:158): a negative factor is accepted and "
        "inverts DAPO's soft overlong punishment (advantages.md eq. (8): a penalty, factor > 0): "
        "min(-(L - (L_max - L_cache)) / L_cache * factor, 0) then punishes every response shorter than "
        "L_max - L_cache, the shorter the more, and no overlong one. max_new_tokens 20, overlong_tokens 5, "
        "factor -1: a 10-token response gets -1, a 20-token one 0 (DAPO with factor 1: 0 and -1).",
        where="utils/functional/functional.py:798",
        quote="-exceed_len / overlong_tokens * overlong_penalty_factor, 0",
        affected=_AFFECTED + " (overlong_reward_penalty with overlong_penalty_factor < 0)",
    ),
    Finding(
        "importance_weight_rejected", "value_only",
        "with rejection_sampling action 'mask', ppo_actor_loss_fn's ratio is 0 at every rejected token "
        "(torch.where over the updated loss mask, functional.py:509), and grpo_loss_fn logs it as "
        "importance_weight over n_valid_tokens, the mask before the rejection (actor.py:516, 529): the "
        "logged average is the kept tokens' mean ratio times the kept fraction and the logged min is 0 "
        "(one of two on-policy tokens rejected: avg 0.5 where every ratio is 1). Logging only.",
        where="trainer/ppo/actor.py:529", quote='importance_weight=stat["importance_weight"],',
        affected=_AFFECTED + " (rejection_sampling with action 'mask')",
    ),
    Finding(
        "rs_filtered_fraction_mean", "value_only",
        "rs_filtered_fraction is logged as a scalar per micro-batch (each its own filtered / valid tokens) "
        "and the stats tracker's scalar is the unweighted mean over the calls: micro-batches of 10 tokens "
        "(5 filtered) and 1 token (none) log 0.25 where the step filtered 5 / 11 = 0.455 of its tokens. "
        "Logging only.",
        where="trainer/ppo/actor.py:547",
        quote='stats_tracker.scalar(rs_filtered_fraction=stat["filtered_fraction"])',
        affected=_AFFECTED + " (rejection_sampling with more than one micro-batch)",
    ),
    Finding(
        "task_reward_overlong", "value_only",
        "reward_overlong_penalty writes the penalised reward back into data['rewards'] (functional.py:801, "
        "803), and _ppo_update logs that tensor as task_reward and splits correct_n_seqs / incorrect_n_seqs "
        "by it (actor.py:264-265, 302): with overlong_reward_penalty a correct answer (reward 1) of "
        "max_new_tokens tokens is logged as task reward 0 and counted incorrect, and correct_seq_len moves "
        "with it. The training reward is right; the logged task reward is the shaped one.",
        where="trainer/ppo/actor.py:302", quote="task_reward=reward_score.float(),",
        affected=_AFFECTED + " (overlong_reward_penalty=True)",
    ),
)

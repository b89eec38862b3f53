"""OpenRLHF's group advantages (kind "group_advantages"): the estimators ``group_norm``, ``dr_grpo`` and
``rloo`` of ``RemoteExperienceMaker.compute_advantages_and_returns`` (trainer/ppo_utils/experience_maker.py),
run through the method itself as kinds.py runs it for the whitening. This module holds the modes (data);
kinds.py's ``advantage_target`` runs them.

What a call does (experience_maker.py:244-338): the rewards, promoted to at least float32 (line 244), are
put back in prompt order and reshaped to ``(-1, n_samples_per_prompt)`` (line 256), then

* group_norm (line 274): ``(r - mean) / (r.std() + 1e-9)``: sample std, eps 1e-9 outside the square root
  (advantages.md eq. (5));
* dr_grpo (line 272): ``r - mean`` (Dr. GRPO's centring, eq. (1));
* rloo (line 269): ``r - (sum - r) / (n - 1)``, the leave-one-out baseline (eq. (2)).

Each result goes through ``compute_reward`` (the default ``reward.clip_range`` (-10, 10) clamps it: finding
reward_clip_range) onto the response's last token and ``get_cumulative_returns`` with gamma 1 (the method
forces it, lines 308-310), so every token of a response carries it; the driver's responses have one token.

Precision. The driver passes the kit's float64 rewards, which line 244 keeps float64. The trainer's own
rewards are float32 (``torch.tensor([reward_val])``, samples_generator.py:304), and in float32 a constant
group of rewards that binary does not hold exactly (0.1 x 8) has a mean that rounds off the rewards, a
std of ~1e-8 and advantages of about -0.83 for every member instead of 0: finding
constant_group_rounding, shown by its standalone reproduction (the kit's cases have no such group).

The batches one call cannot take. ``reshape(-1, n_samples_per_prompt)`` needs contiguous groups of one
size: a batch of unequal or interleaved groups (the kit's cases unequal_groups, partial_group,
singleton_group) is run one call per group, each with ``n_samples_per_prompt`` = that group's size, as a
run with that setting computes it (AReaL's driver does the same, areal_kinds.py). A group of one is
refused in one line, as OpenRLHF's launcher refuses ``n_samples_per_prompt`` 1 for these estimators
(cli/train_ppo_ray.py:656-659); the modes' flag ``adv_singleton="error"`` expects that refusal.
``reinforce_baseline`` (dr_grpo's centring, then the batch whitening of lines 324-338, driven as the
whitening kind's mode advantage_whitening) is not a group estimator: modes.py lists it as unsupported.
"""

from __future__ import annotations

from .. import Mode

__all__ = ["ADV_MODES", "ADV_UNSUPPORTED"]

# group_norm: torch's sample std, eps 1e-9 added to it (a constant group: the formula, whose numerator
# is the mean's rounding: in float32 that is finding constant_group_rounding, not 0)
_GROUP_NORM = {"adv_std": "sample", "adv_eps": 1e-9, "adv_eps_inside_sqrt": False,
               "adv_zero_variance": "formula", "adv_singleton": "error"}
_CENTRED = {"adv_scale": "none", "adv_singleton": "error"}
ADV_MODES = (
    Mode("group_norm", kind="group_advantages", framework_config={"algo.advantage.estimator": "group_norm"},
         convention=_GROUP_NORM,
         description="compute_advantages_and_returns, estimator group_norm (experience_maker.py:274): "
         "(r - mean) / (std + 1e-9), sample std"),
    Mode("dr_grpo", kind="group_advantages", framework_config={"algo.advantage.estimator": "dr_grpo"},
         convention=_CENTRED,
         description="compute_advantages_and_returns, estimator dr_grpo (experience_maker.py:272): "
         "r - mean"),
    Mode("rloo", kind="group_advantages", framework_config={"algo.advantage.estimator": "rloo"},
         convention={**_CENTRED, "adv_leave_one_out": True},
         description="compute_advantages_and_returns, estimator rloo (experience_maker.py:269): "
         "r - (sum - r) / (n - 1)"),
)

ADV_UNSUPPORTED = {
    "reinforce_baseline": "dr_grpo's centring (experience_maker.py:272, mode dr_grpo) followed by the "
    "batch whitening over every token of the step (lines 324-338, the whitening kind's mode "
    "advantage_whitening): not a group estimator of the spec (finding reinforce_baseline_whitening).",
    "flash_reinforce": "the reward minus the rollout batch's mean (line 278): no group.",
    "--reward.clip_range reached": "the clip applies to the estimators' output (finding reward_clip_range); "
    "the advantages of the kit's cases stay inside the default +-10.",
    "gae / reinforce": "per-token returns (driven as the gae kind), not a group estimator; reinforce with "
    "gamma < 1 takes G_t without gamma^t (finding reinforce_gamma).",
    "--algo.dynamic_filtering_enable": "a filter on each group's mean score in the rollout loop "
    "(samples_generator.py:169-177), before the advantages: the kind's cases are the advantages of the "
    "groups kept (finding dynamic_filtering_mean).",
    "KL in the reward (--algo.kl.use_loss off, the default)": "compute_reward adds -kl_coef * kl to every "
    "token after the estimator (experience_maker.py:284-290), outside the group normalisation (finding "
    "kl_in_reward_default) and, for rloo, outside the leave-one-out baseline (finding "
    "rloo_kl_outside_baseline); the kind's cases have no KL.",
    "--algo.advantage.no_std_norm with group_norm": "the flag is read by the batch whitening only "
    "(experience_maker.py:325): group_norm still divides by the std (finding config:no_std_norm).",
    "float32 rewards": "the trainer's rewards are float32 (samples_generator.py:304); the kit's cases are "
    "float64, which OpenRLHF keeps (experience_maker.py:244), so the float32 mean's rounding of a constant "
    "group is shown by a script (finding constant_group_rounding).",
    "the logged return": "experience.info['return'] (experience_maker.py:321) is a log, not an input of "
    "the loss: for the group estimators it sums the baseline-subtracted score and the KL reward (finding "
    "logged_return_baselined, value only).",
}

"""What the AReaL driver found in AReaL 1.0.4's trainer beyond the functions its modes drive
(``TRAINER_FINDINGS``; areal.py's ``FINDINGS`` lists them after the losses' own): ``PPOActor``'s KL reward
without a reference model, its test for a missing EOS, M2PO's token count, the rejection-sampling weight's
level and the clip bounds it never checks. Each has its class and verified line (findings.py); every bug
and validation finding has a standalone script (repro_areal.py)."""

from __future__ import annotations

from .findings import Finding

__all__ = ["TRAINER_FINDINGS"]

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
        "after a termination).",
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
        affected=_AFFECTED + " (m2_threshold set, more than one micro-batch)",
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

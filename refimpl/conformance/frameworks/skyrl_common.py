"""What the two SkyRL drivers share beyond their profiles: Clip-Cov's mode (Cui et al. 2025, run where
it is a spec variant) and the findings of code that SkyRL-train
0.3.1 (driver ``skyrl``) and the ``skyrl`` package 0.4.0 (driver ``skyrl_pkg``) share, each built with
the release's own line. Kept apart from skyrl.py and skyrl_pkg.py, which list them."""

from __future__ import annotations

from .driver import Mode
from .findings import Finding

__all__ = ["clip_cov_mode", "clip_cov_scaled_finding", "clip_ratio_c_finding", "cispo_defaults_finding",
           "kl_cov_frac_finding", "kl_cov_scaled_finding", "loss_term_findings", "scaled_advantage_findings",
           "token_mean_legacy_finding",
           "kl_value_clamp_finding", "max_seq_len_finding", "maxrl_rewards_finding",
           "overflow_finding"]

#: exp of the raw log-ratio (no _safe_exp_delta): past float32's range a NaN where the exact is 0
OVERFLOW = {"ratio_overflow": "nan"}


def clip_cov_mode(common: dict, cfg) -> Mode:
    """Clip-Cov where it is a spec variant, its ratio ``torch.exp`` of the raw log-ratio:
    ``clip_cov_lb > clip_cov_ub`` selects no token (``corr`` all ones), leaving PPO-clip's
    ``max(-A r, -A clip(r))`` (policy_losses.md eq. (6)). ``cfg(loss, reduction, **keys)`` is the
    driver's config builder; ``common`` its shared flags. (KL-Cov with ``ppo_kl_coef = 0`` would be
    gate ``none``; one mode per release names the flag, the finding lists every such line.)"""
    return Mode("clip_cov/no-selection", preset="ppo",
                framework_config=cfg("clip_cov", "token_mean",
                                     **{"clip_cov.clip_cov_lb": 5.0, "clip_cov.clip_cov_ub": 1.0}),
                convention={**common, **OVERFLOW},
                description="compute_policy_loss_clip_cov with clip_cov_lb 5 > clip_cov_ub 1: no token is "
                "cov-selected, so max(-A r, -A clip(r)) with r = exp(log r) unclamped, token mean")


def overflow_finding(where: str, quote: str, affected: str, losses: str, function: str = "") -> Finding:
    """``ratio_overflow="nan"`` of the losses without ``_safe_exp_delta`` (``losses`` names them and
    their lines)."""
    return Finding(
        "ratio_overflow", "bug",
        f"{losses} take ratio = torch.exp(log_probs - old_log_probs) of the raw log-ratio, where SkyRL's "
        "regular, dual_clip, cispo and sapo losses clamp it to +-20 first: above 88.72 in float32 the "
        "ratio is inf, and a token whose clip gate is closed (clip_cov: A > 0 beyond 1 + eps_clip_high) "
        "or whose advantage is 0 (every token of a group with equal rewards) gets 0 * inf = NaN instead "
        "of 0, in the gradient (clip_cov) or the loss itself (A = 0); one stale token poisons the step.",
        where=where, quote=quote, affected=affected, function=function,
    )


def clip_ratio_c_finding(where: str, quote: str, affected: str) -> Finding:
    """The dual clip's constant is not checked (policy_losses.md eq. (7): c > 1 + eps_high)."""
    return Finding(
        "config:clip_ratio_c", "validation",
        "dual_clip accepts any clip_ratio_c, below 1 included (the config, the trainer and the loss check "
        "nothing): the dual clip of Ye et al. 2020 needs c > 1 (beyond the clip band, 1 + eps_clip_high); "
        "with c = 0.5 every A < 0 token gets the constant -A c and no gradient, whatever r, inside the band "
        "too (its clipped loss is at least (1 - eps_clip_low) |A| > c |A|).",
        where=where, quote=quote, affected=affected,
    )


def max_seq_len_finding(where: str, quote: str, affected: str, setting: str, upstream: str = "") -> Finding:
    """Dr. GRPO's constant is not checked against the rows' lengths (policy_losses.md eq. (11));
    ``setting`` says who sets max_seq_len."""
    return Finding(
        "config:max_seq_len", "validation",
        "seq_mean_token_sum_norm divides each row's token sum by max_seq_len without checking that the "
        "row fits (T_i <= max_seq_len): a max_seq_len below a response's length is accepted and the "
        f"row weighs T_i / max_seq_len > 1, where Dr. GRPO's constant bounds every length. {setting}",
        where=where, quote=quote, affected=affected, upstream=upstream,
    )


def kl_cov_frac_finding(where: str, quote: str, affected: str) -> Finding:
    """KL-Cov's default fraction of tokens, 100x the reference code's."""
    return Finding(
        "kl_cov_frac", "documented_default",
        "KL-Cov's kl_cov_frac defaults to 0.2, documented as 20 % of the tokens (int(n * kl_cov_frac) "
        "get the KL penalty), where the code of Cui et al. 2025 (The Entropy Mechanism of Reinforcement "
        "Learning for Reasoning Language Models, arXiv:2505.22617), which SkyRL's docstring cites, takes "
        "int(n * k_percent / 100) (PRIME-RL/Entropy-Mechanism-of-RL, verl/trainer/ppo/core_algos.py:458) "
        "with k_percent = 0.2 in its 7B and 0.02 in its 32B KL-Cov recipes (recipe/dapo/*_kl_cov.sh): "
        "0.2 % and 0.02 % of the tokens; verl's kl_cov_ratio defaults to 0.0002. SkyRL's default "
        "penalises 100x the 7B recipe's tokens.",
        where=where, quote=quote, affected=affected,
    )


def cispo_defaults_finding(where: str, quote: str, affected: str) -> Finding:
    """CISPOConfig's defaults (skyrl 0.4.0): ScaleRL's, not the spec preset's eps_high."""
    return Finding(
        "cispo_eps_clip_high", "documented_default",
        "CISPOConfig defaults to cispo_eps_clip_low = 1.0 and cispo_eps_clip_high = 4.0, the weight "
        "clip(r, 0, 5), documented as the ScaleRL recipe (Khatri et al. 2025, arXiv:2510.13786); the "
        "spec's cispo preset (CISPO of MiniMax 2025, policy_losses.md eq. (9)) caps the weight at "
        "1 + 0.28. A user who sets cispo_eps_clip_high = 0.28 gets the preset.",
        where=where, quote=quote, affected=affected,
    )


def kl_value_clamp_finding(where: str, quote: str, affected: str) -> Finding:
    """compute_approx_kl's k3 clamps, once its gradient was restored (skyrl 0.3.0 and later)."""
    return Finding(
        "kl_value_clamp", "bug",
        "compute_approx_kl clamps k3 to [-10, 10] (and log r to +-20): since skyrl 0.3.0 removed "
        "@torch.no_grad() the KL loss has its gradient, but the clamp's zero derivative removes it exactly "
        "where the policy has moved farthest from the reference (k3 > 10: log(ref / pi) > 2.61 or < -11; "
        "log r = 3: k3 10 and gradient 0, exact 16.09 and -19.09).",
        where=where, quote=quote, affected=affected,
    )


def maxrl_rewards_finding(where: str, quote: str, affected: str) -> Finding:
    """MaxRL's divisor, the group mean, is a pass rate only for binary rewards (skyrl 0.4.0)."""
    return Finding(
        "config:maxrl_rewards", "validation",
        "compute_maxrl_advantage divides the centred reward by the group mean, (R - mean) / (mean + 1e-6), "
        "whatever the rewards: MaxRL (Tajwar et al. 2026, Maximum Likelihood Reinforcement Learning, "
        "arXiv:2602.02710) is defined for binary success rewards, whose group mean is the pass rate in "
        "[0, 1]. Rewards with a negative group mean (-1 / +1, shaped rewards) flip every advantage's sign "
        "(rewards -1, 0.5 give +3, -3: the better response is pushed down), and a mean near -1e-6 divides "
        "by about 0; nothing checks the rewards or warns.",
        where=where, quote=quote, affected=affected,
    )


def clip_cov_scaled_finding(where: str, quote: str, affected: str) -> Finding:
    """Clip-Cov's and KL-Cov's covariance on the advantages the trainer has divided by the loss
    reduction's normaliser (skyrl 0.4.0)."""
    return Finding(
        "clip_cov_scaled_advantages", "bug",
        "RayPPOTrainer._normalize_advantages divides the advantages by the loss reduction's normaliser "
        "(token_mean: the mini-batch's token count; apply_loss_reduction_to_advantages_minibatch, "
        "train/trainer.py:1527) before every policy loss, and the losses return masked sums. Clip-Cov "
        "compares the covariance of those scaled advantages with the log-probs against the absolute band "
        "clip_cov_lb = 1, clip_cov_ub = 5 (train/config/config.py:813-815), so the covariance shrinks by "
        "the token count and no token is cov-clipped: Clip-Cov is PPO-clip. The method (Cui et al. 2025, "
        "arXiv:2505.22617; PRIME-RL's code, which the docstring cites, and verl) takes the raw advantages. "
        "KL-Cov's top-k ranking changes likewise under per-row scalings (sequence_mean, prompt_mean).",
        where=where, quote=quote, affected=affected,
    )


def loss_term_findings(kl_where: str, entropy_where: str, affected: str, micro_batches: str,
                       kl_kind: str = "documented_default") -> tuple:
    """The KL loss's and the entropy bonus's aggregations, fixed whatever ``loss_reduction`` says (the
    KL's: flag ``kl_aggregation="row_mean_all_rows"``; the entropy's is not driven, the kit's calls carry
    no entropies). ``micro_batches`` says how the release combines the micro-batches' terms; the quoted
    lines read the same in every release the drivers cover. ``kl_kind="value_only"``: a release whose
    KL term has no gradient (SkyRL-train 0.3.1, finding kl_gradient) logs the aggregation only."""
    kl_note = (" In this release compute_approx_kl runs under @torch.no_grad() (finding kl_gradient): the "
               "KL term has no gradient, so its aggregation changes only the logged loss."
               if kl_kind == "value_only" else "")
    kl = Finding(
        "kl_aggregation", kl_kind,
        "the KL loss (use_kl_loss, on by default) is kl_loss_coef * masked_mean(kl, loss_mask, "
        "dim=-1).mean(): each row's token mean averaged over every row, an empty row counting 0 (GRPO's "
        f"1/|o_i| form, Shao et al. 2024 eq. (3)), whatever loss_reduction says; {micro_batches}. Under "
        "the default token_mean the policy term weighs each token 1 / (the batch's tokens) and the KL "
        "term 1 / (rows x T_i), where the spec aggregates both terms alike (policy_losses.md eq. (12)); "
        "with sequence_mean they agree. SkyRL documents loss_reduction as the policy loss's reduction "
        "(skyrl 0.4.0: 'applied per mini-batch by rescaling advantages', train/config/config.py:958) and "
        "the KL loss as 'policy_loss + kl * kl_loss_coef' (config.py:915), with no reduction of its own."
        + kl_note,
        where=kl_where, quote="kl_loss = masked_mean(kl_loss, loss_mask, dim=-1).mean()", affected=affected,
    )
    entropy = Finding(
        "entropy_aggregation", "documented_default",
        "the entropy bonus (use_entropy_loss, off by default) is entropy_loss_coef * masked_mean(entropy, "
        "loss_mask): a token mean over the micro-batch's tokens whatever loss_reduction says, its "
        "micro-batches combined as the KL loss's. Under sequence_mean the policy term weighs each row "
        "1 / rows and the entropy each token 1 / (the micro-batch's tokens), where the spec aggregates every "
        "term alike (policy_losses.md eq. (12)). SkyRL documents it as 'an entropy bonus to the policy "
        "loss' (skyrl 0.4.0, train/config/config.py:920), with no reduction of its own, and 0.4.0's worker "
        "says the KL and entropy terms 'are not pre-scaled, so we just average them across microbatches' "
        "(backends/skyrl_train/workers/worker.py:1242). Not driven: the kit's calls carry no entropies.",
        where=entropy_where, quote="entropy = masked_mean(entropy_BS, loss_mask)", affected=affected,
    )
    return kl, entropy


def kl_cov_scaled_finding(where: str, quote: str, affected: str) -> Finding:
    """KL-Cov's penalty beside the advantages the trainer has divided by the normaliser (skyrl 0.4.0)."""
    return Finding(
        "kl_cov_scaled_penalty", "bug",
        "compute_policy_loss_kl_cov adds ppo_kl_coef * |log r| to -A r on the selected tokens and returns "
        "the masked sum (reduce_loss); the trainer has divided A by the loss reduction's normaliser "
        "(RayPPOTrainer._normalize_advantages, train/trainer.py:1527: token_mean / the mini-batch's "
        "tokens), not the penalty, so the KL-Cov penalty is summed over the tokens where Cui et al. 2025 "
        "(and SkyRL-train 0.3.1, whose reduce_loss averaged both parts alike) average it: its weight "
        "grows with the mini-batch's token count (token_mean; rows x T_i under sequence_mean). Four "
        "tokens at |log r| = 0.5, A = 0, coefficient 1, token_mean: loss 2.0, where the token mean is 0.5.",
        where=where, quote=quote, affected=affected, function="compute_policy_loss_kl_cov",
    )


def token_mean_legacy_finding(where: str, quote: str, affected: str) -> Finding:
    """The per-micro-batch token mean kept as an option (skyrl 0.4.0)."""
    return Finding(
        "token_mean_legacy", "documented_default",
        "loss_reduction='token_mean_legacy' keeps SkyRL-train 0.3.1's token mean per micro-batch (each "
        "micro-batch divided by its own token count, the micro-batches averaged: driver skyrl's flag "
        "micro_batch='local_mean'), documented as 'retaining the previous token_mean behavior' "
        "(train/config/config.py:971); the spec's global normaliser (policy_losses.md section 4) differs "
        "whenever the micro-batches hold unequal token counts. Not driven here (the kit's calls carry no "
        "micro-batch size).",
        where=where, quote=quote, affected=affected,
    )


def scaled_advantage_findings(backend: str) -> tuple:
    """skyrl 0.4.0's findings of the reduction folded into the advantages (verified in 0.4.0 only;
    0.3.0 has Clip-Cov's selection at ppo_utils.py:919, its advantages not checked)."""
    ppo = f"{backend}/utils/ppo_utils.py"
    return (clip_cov_scaled_finding(
                f"{ppo}:976",
                "top_k_idx = (cov_all < clip_cov_ub) & (cov_all > clip_cov_lb) & (loss_mask > 0)",
                "skyrl 0.4.0 (clip_cov; kl_cov's ranking, ppo_utils.py:1033)"),
            kl_cov_scaled_finding(f"{ppo}:1024",
                                  "pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl", "skyrl 0.4.0"),
            token_mean_legacy_finding(f"{ppo}:1184", 'elif loss_reduction == "token_mean_legacy":',
                                      "skyrl 0.4.0"))

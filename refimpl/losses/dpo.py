"""Preference losses: DPO and the Bradley-Terry reward-model loss (spec: kl.md section 5;
Rafailov et al. 2023;
"Reward Modeling", "Direct Preference Optimization").

Bradley-Terry: ``P(y_w > y_l) = sigma(r(y_w) - r(y_l))``; the reward model minimises
``-log sigma(r_w - r_l)``. DPO substitutes the implicit reward ``beta log(pi / pi_ref)`` of the
KL-regularised optimum ``pi* = pi_ref exp(r / beta) / Z`` (whose ``beta log Z`` cancels in the
difference) and minimises ``-log sigma(beta (log pi(y_w)/pi_ref(y_w) - log pi(y_l)/pi_ref(y_l)))``.
Both return ``(loss, metrics)`` with the loss a weighted mean over pairs (plain mean by default).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["dpo_loss", "bradley_terry_loss"]


def _check_pair_tensors(tensors: dict[str, torch.Tensor], weights: torch.Tensor | None) -> torch.dtype:
    first_name, first = next(iter(tensors.items()))
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point torch.Tensor")
        if t.ndim != 1 or t.shape != first.shape:
            raise ValueError(f"{name} must have shape [B] = {tuple(first.shape)} like {first_name}, "
                             f"got {tuple(t.shape)}")
        if t.device != first.device:
            raise ValueError(f"{name} must be on {first.device}, got {t.device}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} contains NaN or inf")
    dtype = torch.float32
    for t in tensors.values():
        dtype = torch.promote_types(dtype, t.dtype)
    if weights is not None:
        if not isinstance(weights, torch.Tensor) or not weights.is_floating_point():
            raise TypeError("weights must be a floating-point torch.Tensor")
        if weights.shape != first.shape or weights.device != first.device:
            raise ValueError(f"weights must have shape {tuple(first.shape)} on {first.device}, "
                             f"got {tuple(weights.shape)} on {weights.device}")
        if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
            raise ValueError("weights must be finite and >= 0")
        if first.numel() and not bool(weights.sum() > 0):
            raise ValueError("weights must have a positive sum")
    return dtype


def _weighted_mean(values: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    if values.numel() == 0:
        return values.sum()  # an empty batch: 0, with zero gradient
    if weights is None:
        return values.mean()
    w = weights.to(values.dtype)
    return (values * w).sum() / w.sum()


def _preference_metrics(margin: torch.Tensor, weights: torch.Tensor | None) -> dict[str, torch.Tensor]:
    margin = margin.detach()
    return {
        "reward_margin": _weighted_mean(margin, weights),
        "reward_accuracy": _weighted_mean((margin > 0).to(margin.dtype), weights),
    }


def bradley_terry_loss(
    chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, *, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Reward-model loss ``-log sigma(r_w - r_l)`` (Ouyang et al. 2022, eq. (1); Bradley & Terry 1952),
    weighted mean over pairs.

    Args:
        chosen_rewards, rejected_rewards: ``[B]`` scalar rewards of the preferred / rejected responses.
        weights: optional ``[B]`` non-negative pair weights (e.g. preference probabilities for soft
            labels: a pair (a, b) with weight P(a > b) and (b, a) with 1 - P(a > b)).
    Returns:
        ``(loss, metrics)``: loss a scalar in ``promote_types(dtype, float32)`` (0 for B = 0);
        metrics ``reward_margin`` (mean r_w - r_l) and ``reward_accuracy`` (fraction with r_w > r_l).
    """
    dtype = _check_pair_tensors({"chosen_rewards": chosen_rewards, "rejected_rewards": rejected_rewards},
                                weights)
    margin = chosen_rewards.to(dtype) - rejected_rewards.to(dtype)
    loss = _weighted_mean(-F.logsigmoid(margin), weights)
    return loss, _preference_metrics(margin, weights)


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO loss ``-log sigma(beta (log pi(y_w)/pi_ref(y_w) - log pi(y_l)/pi_ref(y_l)))``
    (Rafailov et al. 2023, eq. (7)).

    Args:
        policy_chosen_logps, policy_rejected_logps: ``[B]`` sequence log-probabilities
            ``log pi_theta(y|x)`` (sums of token log-probs over the response) of the preferred and
            rejected responses.
        ref_chosen_logps, ref_rejected_logps: ``[B]`` the same under pi_ref (treated as constants).
        beta: the KL-regularisation strength (> 0) of the objective DPO solves.
        weights: optional ``[B]`` non-negative pair weights (default: plain mean).
    Returns:
        ``(loss, metrics)``; metrics (detached): ``chosen_reward`` and ``rejected_reward`` (means of
        the implicit rewards ``beta log(pi / pi_ref)``), ``reward_margin``, ``reward_accuracy``.
    """
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")
    tensors = {"policy_chosen_logps": policy_chosen_logps, "policy_rejected_logps": policy_rejected_logps,
               "ref_chosen_logps": ref_chosen_logps, "ref_rejected_logps": ref_rejected_logps}
    dtype = _check_pair_tensors(tensors, weights)
    chosen = beta * (policy_chosen_logps.to(dtype) - ref_chosen_logps.to(dtype).detach())
    rejected = beta * (policy_rejected_logps.to(dtype) - ref_rejected_logps.to(dtype).detach())
    margin = chosen - rejected
    loss = _weighted_mean(-F.logsigmoid(margin), weights)
    metrics = _preference_metrics(margin, weights)
    metrics["chosen_reward"] = _weighted_mean(chosen.detach(), weights)
    metrics["rejected_reward"] = _weighted_mean(rejected.detach(), weights)
    return loss, metrics

"""Value loss (plain and clipped), entropy bonus and the combined PPO objective as a loss.

spec: policy_losses.md section 10; Schulman et al. 2017, eq. (9); Schulman et al. 2016.

- ``value_loss``: ``(V - V_targ)^2`` per sample (Schulman et al. 2017, eq. (9), no factor 1/2), or the clipped
  form
  ``max((V - V_targ)^2, (V_old + clip(V - V_old, -eps, eps) - V_targ)^2)`` (md eq. (23)), averaged
  over the masked samples (or divided by a global ``normalizer``).
- ``entropy_bonus_loss``: ``-mean H`` (the bonus is maximised, so its loss is minus the mean).
- ``ppo_combined_loss``: ``-L^{CLIP+VF+S} = policy loss + c1 * value loss - c2 * mean H``, all three with
  the same token-mean aggregation over the same samples (md eq. (24)).
"""

from __future__ import annotations

import torch

from refimpl.losses.policy import PPO, PolicyLossVariant, _as_bool_mask, _check_tensor, policy_loss

__all__ = ["value_loss", "entropy_bonus_loss", "ppo_combined_loss"]


def _masked_mean(values: torch.Tensor, mask: torch.Tensor, normalizer) -> torch.Tensor:
    total = torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device)).sum()
    if normalizer is None:
        return total / mask.sum(dtype=values.dtype).clamp(min=1.0)
    if isinstance(normalizer, torch.Tensor):
        normalizer = normalizer.detach().to(values.dtype)
    elif isinstance(normalizer, bool) or not isinstance(normalizer, (int, float)) or not normalizer > 0:
        raise ValueError(f"normalizer must be a positive number or a scalar tensor, got {normalizer!r}")
    return total / normalizer


def _check_finite(x: torch.Tensor, mask: torch.Tensor, name: str) -> None:
    if x.device.type == "cpu" and not bool((torch.isfinite(x) | ~mask).all()):
        raise ValueError(f"{name} contains NaN or inf at unmasked positions")


def value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
               old_values: torch.Tensor | None = None, clip_eps: float | None = None,
               normalizer: float | torch.Tensor | None = None
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Squared-error value loss, plain (Schulman et al. 2017, eq. (9)) or clipped (md eq. (23)), masked mean.

    Args:
        values: V_phi(s) for every sample, any shape (e.g. [N, T]); gradients flow.
        returns: the targets V_targ (Schulman et al. 2016), same shape; detached.
        mask: bool or 0/1 of the same shape.
        old_values: V_phi_old(s), same shape; required exactly when ``clip_eps`` is given.
        clip_eps: the value clip range (> 0), or None for the plain loss.
        normalizer: global denominator instead of the local number of masked samples.
    Returns:
        ``(loss, metrics)``: a scalar in ``promote_types(values.dtype, float32)``; metrics
        ``value_clip_fraction`` (samples where the clipped branch is strictly larger),
        ``value_mean`` and ``value_error`` (the unclipped mean squared error).
    """
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"values must be a torch.Tensor, got {type(values).__name__}")
    shape, device = tuple(values.shape), values.device
    mask = _as_bool_mask(mask, shape, device)
    if (clip_eps is None) != (old_values is None):
        raise ValueError("old_values must be given exactly when clip_eps is given")
    if clip_eps is not None and (isinstance(clip_eps, bool) or not isinstance(clip_eps, (int, float))
                                 or not clip_eps > 0):
        raise ValueError(f"clip_eps must be a positive number, got {clip_eps!r}")
    for x, name in ((values, "values"), (returns, "returns"), (old_values, "old_values")):
        if x is not None:
            _check_tensor(x, name, shape, device)
            _check_finite(x, mask, name)
    dtype = torch.promote_types(values.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=device)
    v = torch.where(mask, values.to(dtype), zero)
    target = torch.where(mask, returns.to(dtype), zero).detach()
    squared = (v - target) ** 2
    clipped_active = torch.zeros_like(mask)
    if clip_eps is not None:
        old = torch.where(mask, old_values.to(dtype), zero).detach()
        v_clipped = old + (v - old).clamp(-clip_eps, clip_eps)
        squared_clipped = (v_clipped - target) ** 2
        clipped_active = squared_clipped > squared
        squared = torch.maximum(squared, squared_clipped)
    loss = _masked_mean(squared, mask, normalizer)
    with torch.no_grad():
        weights = mask.to(dtype)
        count = weights.sum().clamp(min=1.0)
        metrics = {
            "value_clip_fraction": (clipped_active.to(dtype) * weights).sum() / count,
            "value_mean": (v * weights).sum() / count,
            "value_error": ((v - target) ** 2 * weights).sum() / count,
        }
    return loss, metrics


def entropy_bonus_loss(entropy: torch.Tensor, mask: torch.Tensor, *,
                       normalizer: float | torch.Tensor | None = None
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``-mean H`` over the masked samples (Schulman et al. 2017, eq. (9)): minimising it raises entropy.

    ``entropy`` is the per-sample entropy (e.g. ``token_entropy(logits)``), any shape, gradients
    flow; returns ``(loss, {"entropy": mean H})``.
    """
    if not isinstance(entropy, torch.Tensor):
        raise TypeError(f"entropy must be a torch.Tensor, got {type(entropy).__name__}")
    shape = tuple(entropy.shape)
    _check_tensor(entropy, "entropy", shape, entropy.device)
    mask = _as_bool_mask(mask, shape, entropy.device)
    _check_finite(entropy, mask, "entropy")
    dtype = torch.promote_types(entropy.dtype, torch.float32)
    mean_entropy = _masked_mean(entropy.to(dtype), mask, normalizer)
    return -mean_entropy, {"entropy": mean_entropy.detach()}


def ppo_combined_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      values: torch.Tensor, returns: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor,
                      *, value_coef: float, entropy_coef: float, variant: PolicyLossVariant = PPO,
                      old_values: torch.Tensor | None = None, value_clip_eps: float | None = None,
                      normalizer: float | torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Minus the combined PPO objective (Schulman et al. 2017, eq. (9); md eq. (24)):
    ``L = policy_loss(variant) + c1 * value_loss - c2 * mean H``.

    All inputs share ``mask``'s shape (``[N, T]``; advantages may be [N]); ``variant`` must use
    the token-mean aggregation (Schulman et al. 2017, eq. (9), averages over the m samples) and no entropy or
    KL
    term of its own (the entropy enters here, once). Returns ``(loss, metrics)`` with the three
    parts' metrics and ``policy_loss``, ``value_loss``, ``entropy_loss``.
    """
    if not isinstance(variant, PolicyLossVariant):
        raise TypeError(f"variant must be a PolicyLossVariant, got {type(variant).__name__}")
    if variant.aggregation != "token_mean" or variant.entropy_coef != 0 or variant.kl_coef != 0:
        raise ValueError("variant must have aggregation='token_mean', entropy_coef=0 and kl_coef=0 "
                         f"(Schulman et al. 2017, eq. (9)), got {variant}")
    for c, name in ((value_coef, "value_coef"), (entropy_coef, "entropy_coef")):
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not c >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {c!r}")
    pi_loss, pi_metrics = policy_loss(logp, old_logp, advantages, mask, variant, normalizer=normalizer)
    vf_loss, vf_metrics = value_loss(values, returns, mask, old_values=old_values, clip_eps=value_clip_eps,
                                     normalizer=normalizer)
    ent_loss, ent_metrics = entropy_bonus_loss(entropy, mask, normalizer=normalizer)
    loss = pi_loss + value_coef * vf_loss + entropy_coef * ent_loss
    metrics = {**pi_metrics, **vf_metrics, **ent_metrics, "policy_loss": pi_loss.detach(),
               "value_loss": vf_loss.detach(), "entropy_loss": ent_loss.detach()}
    return loss, metrics

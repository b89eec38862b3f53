"""KL-penalty coefficient controllers (spec: policy_losses.md section 9).

Small stateful objects that update the weight of a KL penalty between policy updates:

- ``AdaptiveKLController``: Schulman et al. 2017, section 4 (PPO with adaptive KL penalty):
  after an update with mean KL ``d`` and target ``delta``, ``beta <- 2 beta`` if
  ``d > 1.5 delta``, ``beta <- beta / 2`` if ``d < delta / 1.5``, unchanged otherwise (md eq. (20)).
- ``DualAscentKLController``: ``lambda <- lambda + alpha (KL - eps)`` (dual
  ascent on the multiplier of the constraint ``KL <= eps``), projected onto ``lambda >= 0``
  because the multiplier of an inequality constraint is non-negative (md eq. (21); a plain
  dual step is unprojected).

Both hold a Python float (the update is a host-side decision between optimisation phases; reading
the measured KL synchronises once per update, never inside a loss).
"""

from __future__ import annotations

import math

import torch

__all__ = ["AdaptiveKLController", "DualAscentKLController"]


def _as_float(value: float | torch.Tensor, name: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got shape {tuple(value.shape)}")
        value = float(value.detach())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number or a scalar tensor, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


class AdaptiveKLController:
    """Doubling / halving rule for the KL coefficient beta (Schulman et al. 2017, section 4; md eq. (20)).

    Args:
        beta: initial coefficient (> 0).
        target_kl: the target delta (> 0).
        factor: the multiplicative step (2 in Schulman et al. 2017; > 1).
        band: the tolerance ratio (1.5 in Schulman et al. 2017; > 1): increase above ``band * delta``,
            decrease
            below ``delta / band``.
    """

    def __init__(self, beta: float, target_kl: float, *, factor: float = 2.0, band: float = 1.5) -> None:
        self.beta = _as_float(beta, "beta")
        self.target_kl = _as_float(target_kl, "target_kl")
        self.factor = _as_float(factor, "factor")
        self.band = _as_float(band, "band")
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if self.target_kl <= 0:
            raise ValueError(f"target_kl must be > 0, got {self.target_kl}")
        if self.factor <= 1 or self.band <= 1:
            raise ValueError(f"factor and band must be > 1, got factor={self.factor}, band={self.band}")

    def update(self, kl: float | torch.Tensor) -> float:
        """Apply the rule to the measured mean KL of the last update; returns the new beta."""
        d = _as_float(kl, "kl")
        if d < 0:
            raise ValueError(f"kl must be >= 0, got {d}")
        if d > self.band * self.target_kl:
            self.beta *= self.factor
        elif d < self.target_kl / self.band:
            self.beta /= self.factor
        return self.beta


class DualAscentKLController:
    """Projected dual ascent on the KL multiplier (md eq. (21)):
    ``lambda <- max(0, lambda + lr (KL - target_kl))``.

    Args:
        coef: initial multiplier (>= 0).
        target_kl: the constraint level eps (> 0).
        lr: the dual step size alpha (> 0).
    """

    def __init__(self, coef: float, target_kl: float, lr: float) -> None:
        self.coef = _as_float(coef, "coef")
        self.target_kl = _as_float(target_kl, "target_kl")
        self.lr = _as_float(lr, "lr")
        if self.coef < 0:
            raise ValueError(f"coef must be >= 0, got {self.coef}")
        if self.target_kl <= 0 or self.lr <= 0:
            raise ValueError(f"target_kl and lr must be > 0, got target_kl={self.target_kl}, lr={self.lr}")

    def update(self, kl: float | torch.Tensor) -> float:
        """One dual step from the measured KL; returns the new multiplier."""
        d = _as_float(kl, "kl")
        if d < 0:
            raise ValueError(f"kl must be >= 0, got {d}")
        self.coef = max(0.0, self.coef + self.lr * (d - self.target_kl))
        return self.coef

"""REINFORCE as a surrogate loss whose autograd gradient is the policy-gradient estimator.

spec: specs/estimators.md section 4; Williams 1992; Sutton et al. 2000; Sutton & Barto 2018,
sections 13.3-13.4. Each row of the ``[N, T]`` inputs is one
complete episode starting at column 0 (``mask`` marks its steps, a prefix of the row); the return
after its last step is 0 (it terminated, or the finite-horizon objective ends there). The loss is
``-(1/N) sum_i sum_t mask logp_t * sg(weight_t)`` with ``sg`` a stop-gradient, so
``-grad loss`` is the estimator of ``grad J`` named by ``form``:

=========================  =========================================  =====================
form                       weight_t                                   expectation
=========================  =========================================  =====================
``whole_return``           ``G_0``                                    ``grad J`` (Williams 1992)
``reward_to_go``           ``gamma^t G_t``                            ``grad J``
``reward_to_go_baseline``  ``gamma^t (G_t - b(s_t))``                 ``grad J`` (Williams 1992;
Sutton & Barto 2018, section 13.4)
``reward_to_go_no_gamma``  ``G_t`` (the form without ``gamma^t``, errata.md entry 8)  biased for gamma < 1
=========================  =========================================  =====================

The last form drops ``gamma^t``; it is what most code computes and is kept as a named,
documented *biased* variant (errata.md entry 8; Thomas 2014, Nota & Thomas 2020): its expectation is
``sum_t gamma^0 E[grad log pi(a_t|s_t) G_t]``, the gradient of no objective in general.
"""

from __future__ import annotations

import torch

from refimpl._checks import check_discount

__all__ = ["REINFORCE_FORMS", "reinforce_loss", "episode_returns_to_go"]

REINFORCE_FORMS = ("whole_return", "reward_to_go", "reward_to_go_baseline", "reward_to_go_no_gamma")


def _check(x, name: str, shape=None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be [N, T], got shape {tuple(x.shape)}")
    if shape is not None and tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} (like logp), got {tuple(x.shape)}")
    if x.is_floating_point() and not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")
    return x


def _prefix_mask(mask, shape) -> torch.Tensor:
    mask = _check(mask, "mask", shape)
    if mask.dtype != torch.bool:
        if not ((mask == 0) | (mask == 1)).all():
            raise ValueError("mask must be bool or 0/1")
        mask = mask != 0
    if (mask[:, 1:] & ~mask[:, :-1]).any():
        raise ValueError("mask must be a prefix of each row (one episode per row, starting at column 0)")
    return mask


def episode_returns_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = sum_{j >= t} gamma^(j - t) r_j`` inside each row's episode, 0 outside (spec:
    estimators.md eq. (1); Williams 1992; Sutton & Barto 2018, section 13.3). ``rewards``, ``mask`` ``[N,
    T]``; returns ``[N, T]``."""
    rewards = _check(rewards, "rewards")
    mask = _prefix_mask(mask, tuple(rewards.shape))
    dt = torch.float64 if rewards.dtype == torch.float64 else torch.float32
    m = mask.to(dt)
    out = torch.zeros(rewards.shape, dtype=dt, device=rewards.device)
    g = torch.zeros(rewards.shape[0], dtype=dt, device=rewards.device)
    for t in range(rewards.shape[1] - 1, -1, -1):
        g = m[:, t] * (rewards[:, t].to(dt) + gamma * g)
        out[:, t] = g
    return out


def reinforce_loss(logp, rewards, mask, gamma: float, *, form: str, baseline=None):
    """REINFORCE surrogate loss (minimised); ``-grad`` of it is the estimator named by ``form``.

    spec: estimators.md eq. (14)-(17); Williams 1992; Sutton & Barto 2018, sections 13.3-13.4, with the
    ``gamma^t``
    erratum. Args: ``logp [N, T]`` log pi(a_t|s_t) carrying the gradient; ``rewards [N, T]``;
    ``mask [N, T]`` prefix mask of each row's episode; ``gamma`` in [0, 1]; ``form`` one of
    :data:`REINFORCE_FORMS`; ``baseline [N, T]`` b(s_t), required by and only allowed with
    ``reward_to_go_baseline`` (used without gradient).

    Returns ``(loss, metrics)``: the scalar ``-(1/N) sum_{i,t} mask logp sg(weight)`` and detached
    diagnostics (``mean_return`` = mean G_0, ``mean_length``, ``mean_abs_weight``).
    """
    if form not in REINFORCE_FORMS:
        raise ValueError(f"form must be one of {REINFORCE_FORMS}, got {form!r}")
    logp = _check(logp, "logp")
    if not logp.is_floating_point():
        raise TypeError(f"logp must be floating, got dtype {logp.dtype}")
    shape = tuple(logp.shape)
    rewards = _check(rewards, "rewards", shape)
    gamma = check_discount(gamma)
    mask = _prefix_mask(mask, shape)
    if (form == "reward_to_go_baseline") != (baseline is not None):
        raise ValueError("baseline is required by form='reward_to_go_baseline' and only allowed with it")
    G = episode_returns_to_go(rewards, mask, gamma)
    dt = G.dtype
    disc = gamma ** torch.arange(shape[1], dtype=dt, device=logp.device)
    if form == "whole_return":
        weight = G[:, :1].expand(shape)
    elif form == "reward_to_go":
        weight = disc * G
    elif form == "reward_to_go_baseline":
        b = _check(baseline, "baseline", shape).detach().to(dt)
        weight = disc * (G - b)
    else:  # reward_to_go_no_gamma: the biased form without gamma^t (errata.md entry 8)
        weight = G
    m = mask.to(dt)
    weight = (weight * m).detach()
    loss = -(logp.to(dt) * m * weight).sum() / shape[0]
    metrics = {
        "mean_return": G[:, 0].mean().detach(),
        "mean_length": m.sum(1).mean().detach(),
        "mean_abs_weight": (weight.abs().sum() / m.sum().clamp_min(1.0)).detach(),
    }
    return loss, metrics

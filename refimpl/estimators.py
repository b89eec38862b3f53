"""Return, advantage and importance-sampling estimators, batched over trajectories (torch).

spec: specs/estimators.md. Per-step inputs are ``[N, T]`` (N rows, time along dim 1). A row may
hold several episodes back to back (a vectorised environment resets in place): episode ends are
given by two distinct flags,

- ``terminated[:, t]``: step t reached a terminal state; nothing is bootstrapped after it;
- ``truncated[:, t]``: a time limit cut the episode after step t in a non-terminal state; the
  value of its *final* observation, ``next_values[:, t]``, is bootstrapped and the trace stops.

Merging the two is impossible by construction: every function that cuts traces takes both flags,
rejects a step flagged as both, and every truncated step (and the last step of a row that ends
mid-episode) is bootstrapped from ``next_values``, which is required whenever such a step exists.

Dtypes: float16/bfloat16 inputs are computed in float32, float32 and float64 in their own dtype.
A loop over time is used for recursions; everything is vectorised over the batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from refimpl._checks import as_int, check_discount

__all__ = [
    "GAEOutput",
    "discounted_returns",
    "n_step_returns",
    "td_errors",
    "lambda_returns",
    "gae_advantages",
    "importance_weights",
    "is_estimate",
    "snis_estimate",
    "trajectory_importance_weights",
    "trajectory_is",
    "per_decision_is",
]


class GAEOutput(NamedTuple):
    """``advantages [N, T]`` and value targets ``returns = advantages + values`` ``[N, T]``."""

    advantages: torch.Tensor
    returns: torch.Tensor


# ---------------------------------------------------------------------------------------------
# validation helpers


def _all_finite(x: torch.Tensor) -> bool:
    """True when x has no NaN/inf; ``aminmax`` propagates both and is one fused pass (an order of
    magnitude faster than ``isfinite(x).all()`` on large tensors)."""
    if x.numel() == 0:
        return True
    lo, hi = torch.aminmax(x)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _float_2d(x, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got dtype {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be [N, T], got shape {tuple(x.shape)}")
    if shape is not None and tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} (like rewards), got {tuple(x.shape)}")
    if not _all_finite(x):
        raise ValueError(f"{name} contains NaN or inf")
    return x


def _flag_2d(x, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} (like rewards), got {tuple(x.shape)}")
    if x.dtype != torch.bool:
        if not ((x == 0) | (x == 1)).all():
            raise ValueError(f"{name} must be bool or 0/1")
        x = x != 0
    return x


def _episode_flags(rewards, terminated, truncated):
    shape = tuple(rewards.shape)
    term = _flag_2d(terminated, "terminated", shape)
    trunc = _flag_2d(truncated, "truncated", shape)
    if (term & trunc).any():
        raise ValueError("a step cannot be both terminated and truncated (terminated takes precedence "
                         "in the environment; fix the flags)")
    return term, trunc


def _bootstrap_points(term: torch.Tensor, trunc: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` bool: steps after which the return is cut and bootstrapped from next_values:
    truncated steps and the last column where the episode has not terminated."""
    boot = trunc.clone()
    if boot.shape[1]:  # an empty time axis has no last column
        boot[:, -1] |= ~term[:, -1]
    return boot


def _backward_linear_recursion(const: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """``x_t = const_t + decay_t x_{t+1}`` for t = T-1 .. 0 with ``x_T = 0``, ``[N, T]``.

    Runs on time-major contiguous copies so each step reads and writes one contiguous row
    (a column of ``[N, T]`` is strided), with one fused ``addcmul`` per step.
    """
    c, d = const.t().contiguous(), decay.t().contiguous()
    out = torch.empty_like(c)
    if c.shape[0] == 0:  # T = 0: an empty [N, 0] result
        return out.t().contiguous()
    out[-1] = c[-1]
    for t in range(c.shape[0] - 2, -1, -1):
        torch.addcmul(c[t], d[t], out[t + 1], out=out[t])
    return out.t().contiguous()


# ---------------------------------------------------------------------------------------------
# returns and advantages


def discounted_returns(rewards, terminated, truncated, gamma: float, next_values=None) -> torch.Tensor:
    """Reward-to-go ``G_t = r_t + gamma G_{t+1}`` restarted at every episode end.

    spec: estimators.md eq. (1)-(2); Williams 1992; Sutton & Barto 2018, section 13.3. ``G_t = r_t`` after a
    terminated step,
    ``G_t = r_t + gamma next_values_t`` after a truncated step and at the last column of a row that
    ends mid-episode. ``next_values [N, T]`` (V of the observation after each step) is required
    when such a bootstrap step exists: a silent zero bootstrap is never used (pass zeros
    explicitly for a finite-horizon objective). Returns ``[N, T]``.
    """
    rewards = _float_2d(rewards, "rewards")
    shape = tuple(rewards.shape)
    term, trunc = _episode_flags(rewards, terminated, truncated)
    gamma = check_discount(gamma)
    boot = _bootstrap_points(term, trunc)
    dt = _compute_dtype(rewards)
    if next_values is None:
        if boot.any():
            raise ValueError("next_values is required: some steps are truncated or the rollout ends "
                             "mid-episode, and their returns must be bootstrapped")
        nv = torch.zeros(shape, dtype=dt, device=rewards.device)
    else:
        nv = _float_2d(next_values, "next_values", shape).to(dt)
    zero = torch.zeros((), dtype=dt, device=rewards.device)
    # G_t = [r_t + gamma [boot_t] V'_t] + gamma [not terminated, not boot] G_{t+1}
    const = rewards.to(dt) + gamma * torch.where(boot, nv, zero)
    decay = gamma * (~(term | boot)).to(dt)
    return _backward_linear_recursion(const, decay)


def n_step_returns(rewards, next_values, terminated, truncated, gamma: float, n: int) -> torch.Tensor:
    """n-step returns ``sum_{k<m} gamma^k r_{t+k} + gamma^m V(s_{t+m})``, ``m = min(n, ...)``.

    spec: estimators.md eq. (3); Mnih et al. 2016 (A3C(k) uses n = k + 1). The sum
    stops early at an episode end or the end of the row: after a terminated step nothing is added,
    after a truncated step (or the row's last step) ``next_values`` of that step is bootstrapped.
    Returns ``[N, T]``.
    """
    rewards = _float_2d(rewards, "rewards")
    shape = tuple(rewards.shape)
    nv = _float_2d(next_values, "next_values", shape)
    term, trunc = _episode_flags(rewards, terminated, truncated)
    gamma = check_discount(gamma)
    if as_int(n) is None or as_int(n) < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    n = as_int(n)
    dt = _compute_dtype(rewards)
    N, T = shape
    dev = rewards.device

    def shifted(x: torch.Tensor, k: int, fill) -> torch.Tensor:
        """x[:, t + k], padded with ``fill`` beyond the row."""
        pad = torch.full((N, min(k, T)), fill, dtype=x.dtype, device=dev)
        return torch.cat([x[:, k:], pad], dim=1)

    r, v = rewards.to(dt), nv.to(dt)
    ended = term | trunc
    if T:  # the row's last step ends every partial sum (an empty time axis has none)
        ended[:, -1] = True
    out = torch.zeros(shape, dtype=dt, device=dev)
    alive = torch.ones(shape, dtype=torch.bool, device=dev)
    disc = 1.0
    for k in range(n):
        r_k, v_k = shifted(r, k, 0.0), shifted(v, k, 0.0)
        term_k, end_k = shifted(term, k, True), shifted(ended, k, True)
        out = out + torch.where(alive, disc * r_k, torch.zeros_like(r_k))
        last = alive & (end_k | (k == n - 1))
        boot = torch.where(last & ~term_k, disc * gamma * v_k, torch.zeros_like(v_k))
        out = out + boot
        alive = alive & ~last
        disc *= gamma
    return out


def td_errors(rewards, values, next_values, terminated, gamma: float) -> torch.Tensor:
    """``delta_t = r_t + gamma (1 - terminated_t) next_values_t - values_t``.

    spec: estimators.md eq. (4); Schulman et al. 2016, eq. (16). A truncated step bootstraps from the value of
    its
    final observation like any other non-terminated step, so no truncation flag is needed here.
    Returns ``[N, T]``.
    """
    rewards = _float_2d(rewards, "rewards")
    shape = tuple(rewards.shape)
    values = _float_2d(values, "values", shape)
    nv = _float_2d(next_values, "next_values", shape)
    term = _flag_2d(terminated, "terminated", shape)
    return _td_errors_unchecked(rewards, values, nv, term, check_discount(gamma))


def _td_errors_unchecked(rewards, values, next_values, term, gamma: float) -> torch.Tensor:
    dt = _compute_dtype(rewards)
    zero = torch.zeros((), dtype=dt, device=rewards.device)
    delta = torch.where(term, zero, next_values.to(dt))  # a fresh tensor: updated in place below
    return delta.mul_(gamma).add_(rewards.to(dt)).sub_(values.to(dt))


def lambda_returns(rewards, next_values, terminated, truncated, gamma: float, lam: float) -> torch.Tensor:
    """lambda-returns by their own recursion (independent of GAE):

    ``G^lam_t = r_t + gamma (1 - terminated_t) [(1 - lam) next_values_t + lam G^lam_{t+1}]``, with
    ``G^lam_{t+1}`` replaced by ``next_values_t`` after a truncated step or at the row's end.
    spec: estimators.md eq. (6). Equals ``gae_advantages(...).returns`` when
    ``next_values[:, t] == values[:, t + 1]`` inside episodes. Returns ``[N, T]``.
    """
    rewards = _float_2d(rewards, "rewards")
    shape = tuple(rewards.shape)
    nv = _float_2d(next_values, "next_values", shape)
    term, trunc = _episode_flags(rewards, terminated, truncated)
    gamma, lam = check_discount(gamma), check_discount(lam, "lam")
    boot = _bootstrap_points(term, trunc)
    dt = _compute_dtype(rewards)
    v = nv.to(dt)
    zero = torch.zeros((), dtype=dt, device=rewards.device)
    # G_t = [r_t + gamma [not terminated] (boot ? V'_t : (1 - lam) V'_t)] + gamma lam [continues] G_{t+1}
    bootstrap = torch.where(term, zero, torch.where(boot, v, (1.0 - lam) * v))
    const = rewards.to(dt) + gamma * bootstrap
    decay = gamma * lam * (~(term | boot)).to(dt)
    return _backward_linear_recursion(const, decay)


def gae_advantages(
    rewards, values, next_values, terminated, truncated, gamma: float, lam: float
) -> GAEOutput:
    """Generalised advantage estimates ``A_t = sum_l (gamma lam)^l delta_{t+l}``.

    spec: estimators.md eq. (5); Schulman et al. 2016, eq. (16); Sutton & Barto 2018, section 12.1. ``delta_t
    = r_t + gamma (1 - terminated_t)
    next_values_t - values_t``, where ``next_values_t`` is V of the observation after step t (for
    a truncated step, its final observation). The trace stops after terminated or truncated steps
    and at the end of the row. Shapes: all inputs ``[N, T]``. Returns
    ``GAEOutput(advantages, returns)`` with ``returns = advantages + values`` (Schulman et al. 2016;
    Sutton & Barto 2018, section 12.1).
    """
    rewards = _float_2d(rewards, "rewards")
    shape = tuple(rewards.shape)
    term, trunc = _episode_flags(rewards, terminated, truncated)
    values = _float_2d(values, "values", shape)
    nv = _float_2d(next_values, "next_values", shape)
    gamma, lam = check_discount(gamma), check_discount(lam, "lam")
    delta = _td_errors_unchecked(rewards, values, nv, term, gamma)
    decay = gamma * lam * (~(term | trunc)).to(delta.dtype)
    adv = _backward_linear_recursion(delta, decay)
    return GAEOutput(adv, adv + values.to(adv.dtype))


# ---------------------------------------------------------------------------------------------
# importance sampling


def importance_weights(target_logp, behavior_logp) -> torch.Tensor:
    """``w = exp(target_logp - behavior_logp)`` elementwise (spec: estimators.md eq. (8);
    Sutton & Barto 2018, section 5.5); log-space, never a ratio of probabilities. Same shape as the inputs."""
    for name, x in (("target_logp", target_logp), ("behavior_logp", behavior_logp)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{name} must be a floating torch.Tensor")
        if not _all_finite(x):
            raise ValueError(f"{name} contains NaN or inf (a zero-probability action under the "
                             "behaviour policy breaks importance sampling, Sutton & Barto 2018, section 5.5)")
    if target_logp.shape != behavior_logp.shape:
        raise ValueError(f"target_logp {tuple(target_logp.shape)} and behavior_logp "
                         f"{tuple(behavior_logp.shape)} must have the same shape")
    dt = _compute_dtype(target_logp)
    return torch.exp(target_logp.to(dt) - behavior_logp.to(dt))


def _check_samples(f, weights, dim: int):
    for name, x in (("f", f), ("weights", weights)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{name} must be a floating torch.Tensor")
        if not _all_finite(x):
            raise ValueError(f"{name} contains NaN or inf")
    if f.shape != weights.shape:
        raise ValueError(f"f {tuple(f.shape)} and weights {tuple(weights.shape)} must have the same shape")
    if f.ndim == 0:
        raise ValueError("f must have at least one dimension (the samples)")
    if as_int(dim) is None or not -f.ndim <= as_int(dim) < f.ndim:
        raise ValueError(f"dim must be an int in [{-f.ndim}, {f.ndim}) for f of shape {tuple(f.shape)}, "
                         f"got {dim!r}")
    dim = as_int(dim)
    if f.shape[dim] == 0:
        raise ValueError(f"f, weights: no samples along dim {dim} (shape {tuple(f.shape)}): an estimate "
                         f"from N = 0 samples is undefined")
    if (weights < 0).any():
        raise ValueError("weights must be non-negative")
    dt = _compute_dtype(f)
    return f.to(dt), weights.to(dt)


def is_estimate(f, weights, dim: int = -1) -> torch.Tensor:
    """Importance-sampling estimate ``(1/N) sum_i w_i f(x_i)`` over ``dim`` (spec: estimators.md
    eq. (9); Sutton & Barto 2018, section 5.5). Unbiased for ``E_p[f]`` when ``x_i ~ q`` and ``w = p/q``. No
    samples
    along ``dim`` (N = 0) raises ValueError."""
    f, w = _check_samples(f, weights, dim)
    return (w * f).mean(dim)


def snis_estimate(f, weights, dim: int = -1) -> torch.Tensor:
    """Self-normalised IS ``sum_i w_i f_i / sum_i w_i`` over ``dim`` (spec: estimators.md
    eq. (10); Sutton & Barto 2018, section 5.5). Biased for finite N; with N = 1 it returns ``f(x_1)``, whose
    expectation is ``E_q[f]``. A set of samples whose weights sum to 0 raises ValueError."""
    f, w = _check_samples(f, weights, dim)
    total = w.sum(dim)
    if (total == 0).any():
        raise ValueError("snis_estimate: the weights of a sample set sum to zero")
    return (w * f).sum(dim) / total


def _check_episode_rows(rewards, target_logp, behavior_logp, mask, gamma):
    rewards = _float_2d(rewards, "rewards")
    shape = tuple(rewards.shape)
    mask = _flag_2d(mask, "mask", shape)
    gamma = check_discount(gamma)
    dt = _compute_dtype(rewards)
    log_ratio = (_float_2d(target_logp, "target_logp", shape).to(dt)
                 - _float_2d(behavior_logp, "behavior_logp", shape).to(dt))
    m = mask.to(dt)
    disc = gamma ** torch.arange(shape[1], dtype=dt, device=rewards.device)
    return rewards.to(dt) * m, log_ratio * m, disc


def trajectory_importance_weights(target_logp, behavior_logp, mask) -> torch.Tensor:
    """``w(tau) = prod_t pi'(a_t|s_t) / pi(a_t|s_t)`` over the steps in ``mask`` (spec:
    estimators.md eq. (11); mdp.md section 7.2), computed as ``exp(sum_t mask (logp' - logp))``.
    Inputs ``[N, T]``; returns ``[N]``."""
    target_logp = _float_2d(target_logp, "target_logp")
    shape = tuple(target_logp.shape)
    mask = _flag_2d(mask, "mask", shape)
    behavior_logp = _float_2d(behavior_logp, "behavior_logp", shape)
    dt = _compute_dtype(target_logp)
    return torch.exp(((target_logp.to(dt) - behavior_logp.to(dt)) * mask.to(dt)).sum(1))


def trajectory_is(rewards, target_logp, behavior_logp, mask, gamma: float) -> torch.Tensor:
    """Per-trajectory IS estimates ``w(tau) sum_t gamma^t r_t`` (spec: estimators.md eq. (12);
    Sutton & Barto 2018, section 5.5). Each row is one episode starting at column 0; ``mask`` marks its steps.
    Returns ``[N]``; their mean is the IS estimate of ``J(pi')``."""
    r, log_ratio, disc = _check_episode_rows(rewards, target_logp, behavior_logp, mask, gamma)
    return torch.exp(log_ratio.sum(1)) * (r * disc).sum(1)


def per_decision_is(rewards, target_logp, behavior_logp, mask, gamma: float) -> torch.Tensor:
    """Per-decision IS ``sum_t gamma^t (prod_{j<=t} pi'(a_j|s_j)/pi(a_j|s_j)) r_t`` per row (spec:
    estimators.md eq. (13)): each reward is weighted only by the ratios of the actions before it.
    Rows are episodes starting at column 0, ``mask`` marks their steps. Returns ``[N]``."""
    r, log_ratio, disc = _check_episode_rows(rewards, target_logp, behavior_logp, mask, gamma)
    return (torch.exp(log_ratio.cumsum(1)) * r * disc).sum(1)

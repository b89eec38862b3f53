"""Compact PPO (actor-critic) and TRPO training loops on a :class:`refimpl.envs.TabularEnv`.

spec: specs/trust_region.md section 7; Schulman et al. 2015 (TRPO) and Schulman et al. 2017, Algorithm 1
(PPO). Both learn a tabular
softmax policy ``pi(a|s) = softmax(theta[s])`` and a tabular critic ``V[s]`` from sampled
rollouts; they are readable end-to-end uses of the project's verified pieces:

- advantages: :func:`refimpl.estimators.gae_advantages` (Schulman et al. 2016, eq. (16); Sutton & Barto 2018,
section 12.1) from the critic;
- PPO: :func:`refimpl.losses.ppo_combined_loss` (Schulman et al. 2017, eq. (9): the PPO preset of
  :func:`refimpl.losses.policy_loss`, value loss, entropy bonus), minimised by Adam over K epochs
  of minibatches (Schulman et al. 2017, Algorithm 1);
- TRPO: :func:`refimpl.trust_region.trpo_step` on the sample surrogate (Schulman et al. 2015, section 5),
  which is
  ``-policy_loss`` with the PPO preset's gate switched off, and the empirical mean KL (Schulman et al. 2015,
  section 5)
  over the visited states; the critic is refitted to the GAE returns by least squares.

All tensors live on the environment's device and use its float dtype; every random draw comes
from one ``torch.Generator`` seeded by ``seed``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from refimpl._checks import as_int
from refimpl.envs import Rollout, TabularEnv
from refimpl.estimators import gae_advantages
from refimpl.losses import PPO, policy_loss, ppo_combined_loss
from refimpl.trust_region import trpo_step

__all__ = [
    "PPOConfig",
    "TRPOConfig",
    "TrainingResult",
    "softmax_log_policy",
    "train_ppo",
    "train_trpo",
]

# : The sample surrogate of TRPO (Schulman et al. 2015, section 5): PPO's ratio and aggregation without the
# clip gate.
UNCLIPPED_SURROGATE = dataclasses.replace(PPO, gate="none", eps_low=None, eps_high=None)


@dataclass(frozen=True)
class PPOConfig:
    """Hyper-parameters of :func:`train_ppo` (names follow Schulman et al. 2017, Algorithm 1).

    Each iteration samples ``num_envs x num_steps`` transitions with the current policy, computes
    GAE(gamma, ``gae_lambda``) advantages from the critic, then runs ``epochs`` passes of
    ``minibatches`` Adam steps (learning rate ``lr``, policy and critic together) on
    ``ppo_combined_loss`` with clip range ``clip_eps``, value coefficient ``value_coef`` (c1) and
    entropy coefficient ``entropy_coef`` (c2). ``normalize_advantages`` standardises the batch's
    advantages (mean 0, population std 1) before the loss.
    """

    iterations: int = 60
    num_envs: int = 16
    num_steps: int = 16
    epochs: int = 4
    minibatches: int = 2
    lr: float = 0.1
    clip_eps: float = 0.2
    gae_lambda: float = 0.95
    value_coef: float = 0.5
    entropy_coef: float = 0.0
    normalize_advantages: bool = True
    max_episode_steps: int | None = None


@dataclass(frozen=True)
class TRPOConfig:
    """Hyper-parameters of :func:`train_trpo` (Schulman et al. 2015, section 6 and Appendix C).

    Each iteration samples ``num_envs x num_steps`` transitions, computes GAE advantages, takes one
    :func:`~refimpl.trust_region.trpo_step` with radius ``max_kl`` (CG with ``cg_iters`` and
    ``damping``, backtracking by ``backtrack_ratio`` up to ``max_backtracks`` times), then refits
    the critic: ``V[s]`` moves by ``critic_step`` towards the mean GAE return observed at s
    (``critic_step = 1`` is the least-squares fit on the batch; unvisited states keep their value).
    """

    iterations: int = 60
    num_envs: int = 16
    num_steps: int = 16
    max_kl: float = 0.02
    gae_lambda: float = 0.95
    cg_iters: int = 10
    damping: float = 0.1
    backtrack_ratio: float = 0.5
    max_backtracks: int = 10
    critic_step: float = 1.0
    max_episode_steps: int | None = None


@dataclass
class TrainingResult:
    """What a training loop returns: final ``theta [S, A]`` and critic ``values [S]`` (detached),
    and one dict of scalar diagnostics per iteration in ``history``."""

    theta: torch.Tensor
    values: torch.Tensor
    history: list[dict[str, float]] = field(default_factory=list)

    @property
    def policy(self) -> torch.Tensor:
        """``softmax(theta)``, the learned ``[S, A]`` policy."""
        return torch.softmax(self.theta, dim=-1)


def softmax_log_policy(theta: torch.Tensor) -> torch.Tensor:
    """``log softmax(theta[s])`` per state: the tabular softmax policy, ``[S, A]`` -> ``[S, A]``."""
    return torch.log_softmax(theta, dim=-1)


def _check_config_ints(config, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(config, name)
        if as_int(value) is None or as_int(value) < 1:
            raise ValueError(f"config.{name} must be a positive int, got {value!r}")


def _check_env(env) -> None:
    if not isinstance(env, TabularEnv):
        raise TypeError(f"env must be a refimpl.envs.TabularEnv, got {type(env).__name__}")
    if not env.gamma < 1.0:
        raise ValueError(f"env.gamma must be < 1 for these discounted learners, got {env.gamma}")


def _collect(env: TabularEnv, theta: torch.Tensor, config, generator: torch.Generator) -> Rollout:
    policy = torch.softmax(theta.detach(), dim=-1)
    return env.rollout(policy, config.num_envs, config.num_steps, generator,
                       max_episode_steps=config.max_episode_steps)


def _advantages(batch: Rollout, values: torch.Tensor, gamma: float, lam: float):
    """GAE (Schulman et al. 2016, eq. (16); Sutton & Barto 2018, section 12.1) with the critic table; V of a
    terminal next state is masked by gae."""
    v = values.detach()
    return gae_advantages(batch.rewards, v[batch.states], v[batch.next_states], batch.terminated,
                          batch.truncated, gamma, lam)


def _standardize(x: torch.Tensor) -> torch.Tensor:
    std = x.std(correction=0)
    return (x - x.mean()) / std if float(std) > 0 else x - x.mean()


def _taken_log_probs(theta: torch.Tensor, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    return softmax_log_policy(theta)[states, actions]


def train_ppo(env: TabularEnv, config: PPOConfig = PPOConfig(), *, seed: int = 0) -> TrainingResult:
    """PPO actor-critic (Schulman et al. 2017, Algorithm 1) with a tabular softmax policy and a tabular
    critic.

    Starts from ``theta = 0`` (the uniform policy) and ``V = 0``. Per iteration: sample, GAE,
    then ``epochs x minibatches`` Adam steps on ``ppo_combined_loss`` (Schulman et al. 2017, eq. (9)) over
    random
    minibatches of the batch's transitions (each transition is one unit of the token-mean
    aggregation). ``history`` records the clip fraction, approximate KL, losses and mean reward.
    """
    _check_env(env)
    _check_config_ints(config, ("iterations", "num_envs", "num_steps", "epochs", "minibatches"))
    generator = torch.Generator(device=env.device).manual_seed(seed)
    dtype, device = env.P.dtype, env.device
    theta = torch.zeros(env.num_states, env.num_actions, dtype=dtype, device=device, requires_grad=True)
    values = torch.zeros(env.num_states, dtype=dtype, device=device, requires_grad=True)
    optimizer = torch.optim.Adam([theta, values], lr=config.lr)
    variant = dataclasses.replace(PPO, eps_low=config.clip_eps, eps_high=config.clip_eps)
    result = TrainingResult(theta, values)
    for _ in range(config.iterations):
        batch = _collect(env, theta, config, generator)
        gae = _advantages(batch, values, env.gamma, config.gae_lambda)
        states, actions = batch.states.reshape(-1), batch.actions.reshape(-1)
        adv = gae.advantages.reshape(-1)
        adv = _standardize(adv) if config.normalize_advantages else adv
        returns = gae.returns.reshape(-1)
        old_logp = _taken_log_probs(theta, states, actions).detach()
        m = states.numel()
        size = max(1, m // config.minibatches)
        for _ in range(config.epochs):
            order = torch.randperm(m, generator=generator, device=device)
            for start in range(0, size * config.minibatches, size):
                idx = order[start:start + size]
                logits = theta[states[idx]]
                logp = torch.log_softmax(logits, dim=-1).gather(1, actions[idx, None])
                entropy = -(torch.softmax(logits, dim=-1) * torch.log_softmax(logits, dim=-1)).sum(-1)
                loss, metrics = ppo_combined_loss(
                    logp, old_logp[idx, None], adv[idx], values[states[idx], None], returns[idx, None],
                    entropy[:, None], torch.ones_like(logp, dtype=torch.bool),
                    value_coef=config.value_coef, entropy_coef=config.entropy_coef, variant=variant)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        result.history.append({
            "mean_reward": float(batch.rewards.mean()),
            "loss": float(loss.detach()),
            "clip_fraction": float(metrics["clip_fraction"]),
            "approx_kl": float(metrics["approx_kl"]),
            "value_loss": float(metrics["value_loss"]),
        })
    result.theta, result.values = theta.detach(), values.detach()
    return result


def _visit_weights(states: torch.Tensor, num_states: int, dtype: torch.dtype) -> torch.Tensor:
    """Empirical state distribution of the batch: the weights of the sample mean KL (Schulman et al. 2015,
    section 5)."""
    counts = torch.bincount(states.reshape(-1), minlength=num_states).to(dtype)
    return counts / counts.sum()


def _refit_critic(values: torch.Tensor, states: torch.Tensor, returns: torch.Tensor, step: float):
    """Move ``V[s]`` by ``step`` towards the mean return observed at s (least squares on the batch)."""
    num_states = values.shape[0]
    counts = torch.bincount(states, minlength=num_states).to(values.dtype)
    sums = torch.zeros_like(values).index_add_(0, states, returns.to(values.dtype))
    visited = counts > 0
    target = torch.where(visited, sums / counts.clamp_min(1.0), values)
    return values + step * (target - values)


def train_trpo(env: TabularEnv, config: TRPOConfig = TRPOConfig(), *, seed: int = 0) -> TrainingResult:
    """TRPO (Schulman et al. 2015, section 6 and Appendix C) with a tabular softmax policy and a tabular
    least-squares critic.

    Starts from ``theta = 0`` and ``V = 0``. Per iteration: sample; GAE advantages (standardised);
    one :func:`~refimpl.trust_region.trpo_step` whose surrogate is the sample mean of
    ``ratio * A`` (Schulman et al. 2015, section 5, ``-policy_loss`` with the unclipped PPO variant) and whose
    KL is
    weighted by the empirical state distribution of the batch (Schulman et al. 2015, section 5); then the
    critic refit.
    ``history`` records the line-search outcome, the KL and the improvement of each step.
    """
    _check_env(env)
    _check_config_ints(config, ("iterations", "num_envs", "num_steps", "cg_iters"))
    generator = torch.Generator(device=env.device).manual_seed(seed)
    dtype, device = env.P.dtype, env.device
    theta = torch.zeros(env.num_states, env.num_actions, dtype=dtype, device=device)
    values = torch.zeros(env.num_states, dtype=dtype, device=device)
    result = TrainingResult(theta, values)
    for _ in range(config.iterations):
        batch = _collect(env, theta, config, generator)
        gae = _advantages(batch, values, env.gamma, config.gae_lambda)
        states, actions = batch.states.reshape(-1), batch.actions.reshape(-1)
        adv = _standardize(gae.advantages.reshape(-1))
        old_logp = _taken_log_probs(theta, states, actions)[:, None]
        mask = torch.ones_like(old_logp, dtype=torch.bool)

        def surrogate(params, states=states, actions=actions, adv=adv, old_logp=old_logp, mask=mask):
            logp = _taken_log_probs(params, states, actions)[:, None]
            return -policy_loss(logp, old_logp, adv, mask, UNCLIPPED_SURROGATE)[0]

        theta, record = trpo_step(surrogate, softmax_log_policy, theta,
                                  _visit_weights(states, env.num_states, dtype), config.max_kl,
                                  cg_iters=config.cg_iters, damping=config.damping,
                                  backtrack_ratio=config.backtrack_ratio,
                                  max_backtracks=config.max_backtracks)
        values = _refit_critic(values, states, gae.returns.reshape(-1), config.critic_step)
        result.history.append({
            "mean_reward": float(batch.rewards.mean()),
            "accepted": float(record.accepted),
            "backtracks": float(record.backtracks),
            "kl": record.kl,
            "expected_improvement": record.expected_improvement,
            "actual_improvement": record.actual_improvement,
        })
    result.theta, result.values = theta.detach(), values.detach()
    return result

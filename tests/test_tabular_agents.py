"""PPO and TRPO training loops (refimpl.tabular_agents) judged by exact tabular evaluation.

spec: specs/trust_region.md section 7. The learners only see sampled rollouts of a
refimpl.envs.TabularEnv; the final softmax policy is then evaluated exactly by tabular and must be
within 1 % of the range ``J* - J(uniform)`` below ``J*`` for 5 fixed seeds (5 different MDPs).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import tabular
from refimpl.envs import TabularEnv
from refimpl.tabular_agents import PPOConfig, TRPOConfig, train_ppo, train_trpo
from tabular.examples import random_mdp

SEEDS = range(5)


def env_of(mdp: tabular.MDP) -> TabularEnv:
    return TabularEnv(torch.tensor(mdp.P), torch.tensor(mdp.r), torch.tensor(mdp.rho0), mdp.gamma)


def relative_gap(mdp: tabular.MDP, policy: torch.Tensor) -> float:
    """``(J* - J(policy)) / (J* - J(uniform))``, all exact."""
    j_star = float(mdp.rho0 @ tabular.policy_iteration(mdp).V)
    uniform = np.full((mdp.num_states, mdp.num_actions), 1.0 / mdp.num_actions)
    j_uniform = tabular.expected_return(mdp, uniform)
    assert j_star - j_uniform > 1e-3  # a non-trivial problem
    return (j_star - tabular.expected_return(mdp, policy.numpy())) / (j_star - j_uniform)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_ppo_reaches_one_percent_of_the_optimum(seed):
    mdp = random_mdp(seed, 4, 3, gamma=0.9)
    result = train_ppo(env_of(mdp), PPOConfig(), seed=seed)
    assert relative_gap(mdp, result.policy) <= 0.01
    assert len(result.history) == PPOConfig().iterations
    # The clipped objective kept every epoch's policy near the sampling one (approx KL small).
    assert max(h["approx_kl"] for h in result.history) < 0.5


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_trpo_reaches_one_percent_of_the_optimum(seed):
    mdp = random_mdp(seed, 4, 3, gamma=0.9)
    config = TRPOConfig()
    result = train_trpo(env_of(mdp), config, seed=seed)
    assert relative_gap(mdp, result.policy) <= 0.01
    accepted = [h for h in result.history if h["accepted"]]
    assert accepted  # it learned by accepted trust-region steps ...
    assert all(h["kl"] <= config.max_kl and h["actual_improvement"] > 0 for h in accepted)  # ... within delta


def test_training_is_deterministic_given_the_seed():
    mdp = random_mdp(11, 3, 2, gamma=0.8)
    short_ppo = dataclasses.replace(PPOConfig(), iterations=2)
    short_trpo = dataclasses.replace(TRPOConfig(), iterations=2)
    for train, config in ((train_ppo, short_ppo), (train_trpo, short_trpo)):
        a, b = train(env_of(mdp), config, seed=3), train(env_of(mdp), config, seed=3)
        c = train(env_of(mdp), config, seed=4)
        assert torch.equal(a.theta, b.theta) and torch.equal(a.values, b.values)
        assert not torch.equal(a.theta, c.theta)
        assert a.theta.dtype == torch.float64 and a.policy.shape == (3, 2)


def test_trpo_critic_fits_the_batch_returns_by_least_squares():
    # With critic_step = 1 each visited state's value is the mean GAE return observed there; with
    # gamma = 0 and V = 0 the returns are the rewards. The first iteration's batch is the first
    # draw of the seeded generator under the uniform policy (theta = 0), so it can be replayed.
    mdp = random_mdp(2, 3, 2, gamma=0.0)
    config = dataclasses.replace(TRPOConfig(), iterations=1)
    result = train_trpo(env_of(mdp), config, seed=5)
    batch = env_of(mdp).rollout(torch.full((3, 2), 0.5, dtype=torch.float64), config.num_envs,
                                config.num_steps, torch.Generator().manual_seed(5))
    states, rewards = batch.states.reshape(-1).numpy(), batch.rewards.reshape(-1).numpy()
    expected = [rewards[states == s].mean() if np.any(states == s) else 0.0 for s in range(3)]
    assert np.allclose(result.values.numpy(), expected, rtol=1e-12, atol=1e-15)


def test_learners_reject_bad_input():
    mdp = random_mdp(0, 3, 2, gamma=0.9)
    with pytest.raises(TypeError, match="env"):
        train_ppo(mdp)
    episodic = TabularEnv(torch.tensor(mdp.P), torch.tensor(mdp.r), torch.tensor(mdp.rho0), 1.0)
    with pytest.raises(ValueError, match="gamma"):
        train_trpo(episodic)
    with pytest.raises(ValueError, match="iterations"):
        train_ppo(env_of(mdp), dataclasses.replace(PPOConfig(), iterations=0))
    with pytest.raises(ValueError, match="minibatches"):
        train_ppo(env_of(mdp), dataclasses.replace(PPOConfig(), minibatches=0))

"""PPO and TRPO training loops (refimpl.tabular_agents).

spec: specs/trust_region.md section 7. Each update is pinned by an exact replay of the first two
iterations (an independent numpy recomputation from the same random draws, at the bottom of this
file). End to end, the learners only see sampled rollouts of a refimpl.envs.TabularEnv; the final
softmax policy is then evaluated exactly by tabular and must be within 1 % of the range
``J* - J(uniform)`` below ``J*`` (one seed each: the replays carry the ability to find subtle bugs,
this check that the pieces learn together).
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
from tests.test_value_learning import gae_by_loop, softmax_rows  # the same definitions replay A2C

SEEDS = [0]


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


# ------------------------------------------ exact replays of the first iterations (issue 13)
#
# The replays draw the learner's random numbers from a generator with its seed, in its order (the
# environment's rollouts, PPO's minibatch permutations), and recompute every update independently
# in numpy float64 from the definitions: a GAE loop, the softmax score and entropy gradients, the
# inclusive clip gate of policy_losses.md eq. (6), Adam, and TRPO's damped natural step solved per state
# (the Fisher matrix of a tabular softmax is block diagonal, w_s (diag pi_s - pi_s pi_s^T)).


def replayed_batch(env, theta, config, gen, values, gamma):
    batch = env.rollout(torch.tensor(softmax_rows(theta)), config.num_envs, config.num_steps, gen,
                        max_episode_steps=config.max_episode_steps)
    s, a, r, s2, term, trunc = (x.numpy() for x in (batch.states, batch.actions, batch.rewards,
                                                   batch.next_states, batch.terminated, batch.truncated))
    adv, ret = gae_by_loop(r, values[s], values[s2], term, trunc, gamma, config.gae_lambda)
    return s.ravel(), a.ravel(), adv.ravel(), ret.ravel(), bool(trunc.any())


def standardized(x):
    return (x - x.mean()) / x.std() if x.std() > 0 else x - x.mean()


def ppo_replay(env, config, seed):
    gen = torch.Generator().manual_seed(seed)
    S, A, gamma = env.num_states, env.num_actions, env.gamma
    theta, values = np.zeros((S, A)), np.zeros(S)
    m1, v1, m2, v2 = np.zeros((S, A)), np.zeros((S, A)), np.zeros(S), np.zeros(S)
    beta1, beta2, step, closed, truncated = 0.9, 0.999, 0, 0, False
    eps = config.clip_eps
    for _ in range(config.iterations):
        s, a, adv, ret, trunc = replayed_batch(env, theta, config, gen, values, gamma)
        truncated |= trunc
        adv = standardized(adv) if config.normalize_advantages else adv
        old_logp = np.log(softmax_rows(theta))[s, a]
        m = s.size
        size = max(1, m // config.minibatches)
        for _ in range(config.epochs):
            order = torch.randperm(m, generator=gen).numpy()
            for start in range(0, size * config.minibatches, size):
                idx = order[start:start + size]
                pi = softmax_rows(theta[s[idx]])
                ratio = np.exp(np.log(pi[np.arange(idx.size), a[idx]]) - old_logp[idx])
                gate = ((adv[idx] > 0) & (ratio <= 1 + eps)) | ((adv[idx] <= 0) & (ratio >= 1 - eps))
                closed += int((~gate).sum())
                entropy = -(pi * np.log(pi)).sum(1)
                g_theta, g_values = np.zeros((S, A)), np.zeros(S)
                for k, i in enumerate(idx):
                    score = np.eye(A)[a[i]] - pi[k]
                    g_theta[s[i]] += -adv[i] * ratio[k] * gate[k] * score / idx.size  # policy loss
                    # -c2 mean H: dH/dtheta = -pi (log pi + H)
                    g_theta[s[i]] += config.entropy_coef * pi[k] * (np.log(pi[k]) + entropy[k]) / idx.size
                    g_values[s[i]] += config.value_coef * 2 * (values[s[i]] - ret[i]) / idx.size
                step += 1
                m1, v1 = beta1 * m1 + (1 - beta1) * g_theta, beta2 * v1 + (1 - beta2) * g_theta**2
                m2, v2 = beta1 * m2 + (1 - beta1) * g_values, beta2 * v2 + (1 - beta2) * g_values**2
                c1, c2 = 1 - beta1**step, 1 - beta2**step
                theta = theta - config.lr * (m1 / c1) / (np.sqrt(v1 / c2) + 1e-8)
                values = values - config.lr * (m2 / c1) / (np.sqrt(v2 / c2) + 1e-8)
    return theta, values, closed, truncated


def test_ppo_first_iterations_equal_an_independent_replay():
    """Two iterations (2 epochs x 2 minibatches of Adam on the clipped loss, value loss and entropy
    bonus of Schulman et al. 2017, eq. (9)), with time-limit truncations and clipped tokens in the batch.
    Tolerance: a
    gradient coordinate's absolute rounding (~1e-16) can be amplified by Adam's g / (|g| + 1e-8)
    to lr * 1e-8 = 3e-9 per step; 8 steps stay below 1e-7, any real difference is O(lr) = 0.3."""
    mdp = random_mdp(1, 4, 3, gamma=0.9)
    config = dataclasses.replace(PPOConfig(), iterations=2, num_envs=4, num_steps=6, epochs=2, minibatches=2,
                                 lr=0.3, entropy_coef=0.01, max_episode_steps=4)
    result = train_ppo(env_of(mdp), config, seed=7)
    theta, values, closed, truncated = ppo_replay(env_of(mdp), config, seed=7)
    assert closed > 0 and truncated  # the clip gate and the truncation bootstrap were exercised
    np.testing.assert_allclose(result.theta.numpy(), theta, rtol=0, atol=1e-7)
    np.testing.assert_allclose(result.values.numpy(), values, rtol=0, atol=1e-7)
    assert np.abs(theta).max() > 0.3


def trpo_replay(env, config, seed):
    gen = torch.Generator().manual_seed(seed)
    S, A, gamma = env.num_states, env.num_actions, env.gamma
    theta, values = np.zeros((S, A)), np.zeros(S)
    outcomes = []
    for _ in range(config.iterations):
        s, a, adv, ret, _ = replayed_batch(env, theta, config, gen, values, gamma)
        adv = standardized(adv)
        pi = softmax_rows(theta)
        m = s.size
        w = np.bincount(s, minlength=S) / m

        def surrogate(th, s=s, a=a, adv=adv, pi=pi):
            return float(np.mean(softmax_rows(th)[s, a] / pi[s, a] * adv))

        g = np.zeros((S, A))
        for i in range(m):
            g[s[i]] += adv[i] * (np.eye(A)[a[i]] - pi[s[i]]) / m
        fisher = [w[k] * (np.diag(pi[k]) - np.outer(pi[k], pi[k])) for k in range(S)]
        x = np.stack([np.linalg.solve(fisher[k] + config.damping * np.eye(A), g[k]) for k in range(S)])
        beta = np.sqrt(2 * config.max_kl / sum(x[k] @ fisher[k] @ x[k] for k in range(S)))
        old = surrogate(theta)
        outcome = "rejected"
        for k in range(config.max_backtracks + 1):
            cand = theta + config.backtrack_ratio**k * beta * x
            new = softmax_rows(cand)
            kl = float(np.sum(w * np.sum(pi * (np.log(pi) - np.log(new)), axis=1)))
            if surrogate(cand) - old > 0 and kl <= config.max_kl:
                theta, outcome = cand, k
                break
        outcomes.append(outcome)
        for state in np.unique(s):  # critic_step = 1: the batch's mean return at each visited state
            values[state] += config.critic_step * (ret[s == state].mean() - values[state])
    return theta, values, outcomes


def test_trpo_first_iterations_equal_an_independent_replay():
    """Two TRPO iterations: damped natural direction (solved exactly per state; CG reaches it since
    the system has at most S (A - 1) = 8 dimensions), the step scale sqrt(2 delta / x^T F x) with the
    undamped F (Schulman et al. 2015, Appendix C), backtracking on the exact mean KL, and the least-squares
    critic refit.
    Tolerance: CG stops at a residual of ~1e-10 (cg_tol), i.e. a direction error ~1e-9 relative."""
    mdp = random_mdp(2, 4, 3, gamma=0.9)
    config = dataclasses.replace(TRPOConfig(), iterations=2, num_envs=4, num_steps=8, max_episode_steps=5)
    result = train_trpo(env_of(mdp), config, seed=3)
    theta, values, outcomes = trpo_replay(env_of(mdp), config, seed=3)
    assert all(o != "rejected" for o in outcomes)
    assert [h["backtracks"] for h in result.history] == [float(o) for o in outcomes]
    np.testing.assert_allclose(result.theta.numpy(), theta, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(result.values.numpy(), values, rtol=1e-12, atol=1e-14)
    assert np.abs(theta).max() > 0.1

"""Classic learners against exact tabular ground truth (spec: estimators.md section 6).

Statistical acceptance on seeded random MDPs with S = 6, A = 3, gamma = 0.9: each check runs for
the 5 fixed seeds 0..4, all of which must pass (no seed picking). The learners run on an
environment whose start distribution is uniform ("exploring starts"; values do not depend on
rho0) and episodes are cut by a short time limit, so every learner must bootstrap through
truncations correctly: treating a truncation as a termination would bias every value by far more
than the tolerances below.
"""

import numpy as np
import pytest
import torch

import tabular
from refimpl import value_learning as vl
from refimpl.envs import TabularEnv
from tabular.examples import random_mdp, random_policy

pytestmark = pytest.mark.slow
SEEDS = [0, 1, 2, 3, 4]
S, A, GAMMA = 6, 3, 0.9


def case(seed: int):
    mdp = random_mdp(seed, num_states=S, num_actions=A, gamma=GAMMA)
    env = TabularEnv(torch.tensor(mdp.P), torch.tensor(mdp.r), torch.full((S,), 1.0 / S, dtype=torch.float64),
                     GAMMA)
    return mdp, env, torch.Generator().manual_seed(1000 + seed)


def optimal_q(mdp):
    return tabular.q_values(mdp, tabular.policy_iteration(mdp).policy)


@pytest.mark.parametrize("seed", SEEDS)
def test_mc_evaluation_within_four_exact_standard_errors(seed):
    mdp, env, gen = case(seed)
    pi = random_policy(seed + 1, S, A)
    n, H = 1000, 150
    res = vl.mc_evaluation(env, torch.tensor(pi), n, H, gen)
    mean_H, second_H = tabular.return_moments(mdp, pi, H)
    se = np.sqrt((second_H - mean_H**2) / n)  # exact standard error of the mean of n H-step returns
    assert np.all(se > 0.01)
    # the estimator is unbiased for V_H, which is V up to gamma^H max|r| / (1 - gamma) < 1e-6 << se
    V = tabular.policy_evaluation(mdp, pi)
    assert np.abs(V - mean_H).max() <= GAMMA**H * np.abs(mdp.r).max() / (1 - GAMMA) + 1e-12
    z = np.abs(res.values.numpy() - V) / se
    assert z.max() < 4.0, z
    # the sample std agrees with the exact std (a loose sanity check on the spread itself)
    np.testing.assert_allclose(res.sample_std.numpy(), np.sqrt(second_H - mean_H**2), rtol=0.15)


@pytest.mark.parametrize("seed", SEEDS)
def test_td0_within_005_of_v(seed):
    mdp, env, gen = case(seed)
    pi = random_policy(seed + 1, S, A)
    V = vl.td0_evaluation(env, torch.tensor(pi), gen).numpy()
    assert np.abs(V - tabular.policy_evaluation(mdp, pi)).max() < 0.05


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("learner", ["q_learning", "sarsa"])
def test_q_learning_and_sarsa_reach_q_star(seed, learner):
    mdp, env, gen = case(seed)
    Q = getattr(vl, learner)(env, gen).numpy()
    assert np.abs(Q - optimal_q(mdp)).max() < 0.05


def near_optimal(mdp, policy: np.ndarray) -> None:
    J_star = tabular.expected_return(mdp, tabular.policy_iteration(mdp).policy)
    J_unif = tabular.expected_return(mdp, np.full((S, A), 1.0 / A))
    assert J_star - J_unif > 0.1  # a meaningful range
    gap = J_star - tabular.expected_return(mdp, policy)
    assert gap <= 0.01 * (J_star - J_unif), gap / (J_star - J_unif)


@pytest.mark.parametrize("seed", SEEDS)
def test_a2c_reaches_near_optimal_policy(seed):
    mdp, env, gen = case(seed)
    near_optimal(mdp, vl.a2c(env, gen).policy.numpy())


@pytest.mark.parametrize("seed", SEEDS)
def test_dqn_reaches_near_optimal_policy(seed):
    mdp, env, gen = case(seed)
    near_optimal(mdp, vl.dqn(env, gen).greedy_policy.numpy())


# ----------------------------------------------------------------------------------- units


def test_schedules_and_epsilon_greedy():
    step = vl.robbins_monro(1.0, 10.0, 1.0)
    assert step(0) == 1.0 and step(10) == pytest.approx(0.5, rel=1e-15)
    with pytest.raises(ValueError, match="power"):
        vl.robbins_monro(1.0, 10.0, 0.5)
    with pytest.raises(ValueError, match="initial"):
        vl.glie_epsilon(0.0, 10.0)
    eps = vl.glie_epsilon(0.5, 4.0)
    assert eps(4) == pytest.approx(0.25, rel=1e-15)
    q = torch.tensor([[0.0, 2.0, 1.0], [3.0, 3.0, 0.0]], dtype=torch.float64)
    probs = vl.epsilon_greedy(q, 0.3)
    expected = torch.tensor([[0.1, 0.8, 0.1], [0.8, 0.1, 0.1]], dtype=torch.float64)
    torch.testing.assert_close(probs, expected, rtol=0, atol=1e-15)


def test_learners_reject_bad_arguments():
    mdp, env, gen = case(0)
    with pytest.raises(TypeError, match="env"):
        vl.q_learning(mdp, gen)
    with pytest.raises(ValueError, match="num_envs"):
        vl.td0_evaluation(env, torch.full((S, A), 1.0 / A, dtype=torch.float64), gen, num_envs=0)


def test_td0_bootstraps_through_truncation():
    """Every episode is cut after one step; TD(0) must still learn V (not r_pi), because a
    truncated step bootstraps from its final observation."""
    mdp, env, gen = case(0)
    pi = random_policy(1, S, A)
    V = vl.td0_evaluation(env, torch.tensor(pi), gen, max_episode_steps=1).numpy()
    assert np.abs(V - tabular.policy_evaluation(mdp, pi)).max() < 0.05
    r_pi = (pi * mdp.r).sum(1)
    assert np.abs(tabular.policy_evaluation(mdp, pi) - r_pi).max() > 0.5  # the wrong answer is far


def test_terminated_stops_bootstrapping_in_q_learning():
    """An episodic MDP with terminal states: Q-learning still reaches Q* (terminated steps do
    not bootstrap; terminal values are 0)."""
    mdp = random_mdp(7, num_states=5, num_actions=2, gamma=0.9, num_terminal=1, termination_prob=0.3)
    rho0 = torch.tensor(np.where(mdp.terminal, 0.0, 1.0 / 4))
    env = TabularEnv(torch.tensor(mdp.P), torch.tensor(mdp.r), rho0, 0.9, terminal=torch.tensor(mdp.terminal))
    Q = vl.q_learning(env, torch.Generator().manual_seed(0)).numpy()
    Q_star = optimal_q(mdp)
    assert np.abs(Q - Q_star)[~mdp.terminal].max() < 0.05

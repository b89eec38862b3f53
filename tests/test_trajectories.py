"""tabular.trajectories: the enumeration oracle and finite-horizon quantities, each checked by an
independent route (spec: estimators.md section 5)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tabular
from tabular.examples import random_mdp, random_policy
from tabular.gradients import softmax_policy
from tests.strategies import episodic_mdps, mdps, policies


def matrix_power_values(mdp, pi, H):
    """V_0 = sum_{t<H} gamma^t P_pi^t r_pi (terminal rows of P_pi kept: they pay 0)."""
    P_pi = np.einsum("sa,sat->st", pi, mdp.P)
    r_pi = (pi * mdp.r).sum(1)
    V, M = np.zeros(mdp.num_states), np.eye(mdp.num_states)
    for t in range(H):
        V += mdp.gamma**t * M @ r_pi
        M = M @ P_pi
    return V


@given(st.data())
def test_enumeration_is_a_distribution_with_the_right_marginals_and_mean(data):
    mdp = data.draw(episodic_mdps(max_states=4, max_actions=2))
    pi = data.draw(policies(mdp.num_states, mdp.num_actions))
    H = data.draw(st.integers(1, 3))
    dist = tabular.enumerate_trajectories(mdp, pi, H)
    # each probability is a product of <= 2H + 1 rounded factors and the sum adds one rounding per term
    assert dist.prob.sum() == pytest.approx(1.0, abs=(len(dist.prob) + 2 * H + 1) * 2.0**-53)
    assert np.all(dist.prob > 0)
    # no step both terminated and truncated, each episode ends exactly once at its last step
    assert not np.any(dist.terminated & dist.truncated)
    ends = dist.terminated | dist.truncated
    lengths = dist.mask.sum(1)
    np.testing.assert_array_equal(lengths, dist.length)
    assert np.all(ends.sum(1) == (lengths > 0))
    # the state marginals equal d_t from the forward recursion, on steps inside the episode
    d = tabular.state_distributions(mdp, pi, H)
    for t in range(H):
        marg = np.zeros(mdp.num_states)
        np.add.at(marg, dist.states[dist.mask[:, t], t], dist.prob[dist.mask[:, t]])
        live = ~mdp.terminal
        np.testing.assert_allclose(marg[live], d[t][live], atol=1e-12)
    # E[G_0] = J_H = rho0 . (sum_t gamma^t P_pi^t r_pi)
    G = dist.discounted_returns(mdp.gamma)
    J_H = tabular.finite_horizon_return(mdp, pi, H)
    assert dist.expectation(G[:, 0]) == pytest.approx(J_H, rel=1e-10, abs=1e-12)
    assert J_H == pytest.approx(mdp.rho0 @ matrix_power_values(mdp, pi, H), rel=1e-10, abs=1e-12)


@given(st.data())
def test_finite_horizon_values_by_matrix_powers_and_bellman(data):
    mdp = data.draw(mdps(max_states=4, gamma=0.9))
    pi = data.draw(policies(mdp.num_states, mdp.num_actions))
    H = data.draw(st.integers(1, 6))
    fh = tabular.finite_horizon_values(mdp, pi, H)
    for t in range(H + 1):
        np.testing.assert_allclose(fh.V[t], matrix_power_values(mdp, pi, H - t), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fh.V[:-1], np.einsum("sa,tsa->ts", pi, fh.Q), rtol=1e-12, atol=1e-12)


def test_long_horizon_approaches_infinite_horizon_within_the_bound():
    mdp = random_mdp(0, num_states=5, num_actions=3, gamma=0.9)
    pi = random_policy(1, 5, 3)
    V = tabular.policy_evaluation(mdp, pi)
    for H in (10, 50, 200):
        V_H = tabular.finite_horizon_values(mdp, pi, H).V[0]
        bound = mdp.gamma**H * np.abs(mdp.r).max() / (1 - mdp.gamma)
        assert np.abs(V_H - V).max() <= bound + 1e-12
    assert (
        np.abs(tabular.finite_horizon_values(mdp, pi, 10).V[0] - V).max() > 1e-3
    )  # the bound is not vacuous


def test_time_dependent_policy():
    mdp = random_mdp(2, num_states=4, num_actions=2, gamma=0.8)
    pis = np.stack([random_policy(k, 4, 2) for k in range(3)])
    fh = tabular.finite_horizon_values(mdp, pis, 3)
    Q2 = mdp.r
    V2 = (pis[2] * Q2).sum(1)
    Q1 = mdp.r + 0.8 * mdp.P @ V2
    np.testing.assert_allclose(fh.Q[1], Q1, rtol=1e-12)
    dist = tabular.enumerate_trajectories(mdp, pis, 3)
    assert dist.expectation(dist.discounted_returns(0.8)[:, 0]) == pytest.approx(
        mdp.rho0 @ fh.V[0], rel=1e-12, abs=0.0
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_return_moments_equal_enumeration_and_infinite_limit(seed):
    mdp = random_mdp(seed, num_states=4, num_actions=2, gamma=0.8, num_terminal=1, termination_prob=0.3)
    pi = random_policy(seed, 4, 2)
    H = 3
    mean, second = tabular.return_moments(mdp, pi, H)
    for s in np.flatnonzero(~mdp.terminal):
        rho0 = np.zeros(4)
        rho0[s] = 1.0
        start = tabular.MDP(mdp.P, mdp.r, rho0, mdp.gamma, terminal=mdp.terminal)
        dist = tabular.enumerate_trajectories(start, pi, H)
        G0 = dist.discounted_returns(mdp.gamma)[:, 0]
        assert mean[s] == pytest.approx(dist.expectation(G0), rel=1e-12, abs=0.0)
        assert second[s] == pytest.approx(dist.expectation(G0**2), rel=1e-12, abs=0.0)
    m_inf, s_inf = tabular.return_moments(mdp, pi)
    m_long, s_long = tabular.return_moments(mdp, pi, 300)
    np.testing.assert_allclose(m_inf, tabular.policy_evaluation(mdp, pi), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(s_inf, s_long, rtol=1e-10, atol=1e-12)
    assert np.all((s_inf - m_inf**2)[~mdp.terminal] > 0)


@given(st.data())
def test_finite_horizon_softmax_gradient_equals_finite_differences(data):
    mdp = data.draw(episodic_mdps(max_states=4, max_actions=3))
    H = data.draw(st.integers(1, 4))
    rng = np.random.default_rng(data.draw(st.integers(0, 10_000)))
    theta = rng.normal(size=(mdp.num_states, mdp.num_actions))
    grad = tabular.finite_horizon_softmax_gradient(mdp, softmax_policy(theta), H)
    fd = np.zeros_like(theta)
    h = 1e-5
    for idx in np.ndindex(theta.shape):
        e = np.zeros_like(theta)
        e[idx] = h
        up = tabular.finite_horizon_return(mdp, softmax_policy(theta + e), H)
        down = tabular.finite_horizon_return(mdp, softmax_policy(theta - e), H)
        fd[idx] = (up - down) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


def test_long_horizon_gradient_approaches_the_infinite_horizon_policy_gradient():
    mdp = random_mdp(4, num_states=4, num_actions=2, gamma=0.7)
    theta = np.random.default_rng(0).normal(size=(4, 2))
    g_inf = tabular.policy_gradient(mdp, theta)
    g_H = tabular.finite_horizon_softmax_gradient(mdp, softmax_policy(theta), 120)
    np.testing.assert_allclose(g_H, g_inf, rtol=1e-9, atol=1e-12)


def test_bad_inputs_raise():
    mdp = random_mdp(0, num_states=3, num_actions=2)
    pi = random_policy(0, 3, 2)
    with pytest.raises(ValueError, match="horizon"):
        tabular.enumerate_trajectories(mdp, pi, 0)
    with pytest.raises(ValueError, match="max_trajectories"):
        tabular.enumerate_trajectories(mdp, pi, 8, max_trajectories=100)
    with pytest.raises(ValueError, match=r"\[H, S, A\]"):
        tabular.finite_horizon_values(mdp, np.stack([pi, pi]), 3)
    with pytest.raises(ValueError, match="rows must sum to 1"):
        tabular.finite_horizon_values(mdp, pi * 2, 3)
    gamma1 = tabular.MDP(mdp.P, mdp.r, mdp.rho0, 1.0)
    with pytest.raises(ValueError, match="gamma < 1"):
        tabular.return_moments(gamma1, pi)
    dist = tabular.enumerate_trajectories(mdp, pi, 2)
    with pytest.raises(ValueError, match="leading dimension"):
        dist.expectation(np.zeros(dist.num_trajectories + 1))

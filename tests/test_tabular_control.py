"""Value iteration and policy iteration (spec: specs/mdp.md section 4, eq. (16)-(19)).

VI and PI agree, satisfy the Bellman optimality equation, beat every deterministic policy found by
brute-force enumeration, and VI's stopping bound holds (and is tight where it can be).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tabular as T
from tests.strategies import episodic_mdps, mdps


def all_deterministic_policies(S: int, A: int):
    for actions in itertools.product(range(A), repeat=S):
        pi = np.zeros((S, A))
        pi[np.arange(S), actions] = 1.0
        yield pi


def horizon(mdp):
    return 1.0 / (1.0 - mdp.gamma)


def assert_one_hot(policy, S, A):
    assert policy.shape == (S, A)
    assert np.all((policy == 0.0) | (policy == 1.0))
    np.testing.assert_array_equal(policy.sum(axis=1), np.ones(S))


@given(mdps(max_states=4))
def test_vi_and_pi_agree_and_satisfy_bellman_optimality(mdp):
    tol = 1e-8
    pi_res = T.policy_iteration(mdp)
    vi_res = T.value_iteration(mdp, tol=tol)
    S, A = mdp.num_states, mdp.num_actions
    assert_one_hot(pi_res.policy, S, A)
    assert_one_hot(vi_res.policy, S, A)
    # Bellman optimality: V* = max_a (r + gamma P V*), to rounding of the linear solve.
    backup = (mdp.r + mdp.gamma * np.einsum("sat,t->sa", mdp.P, pi_res.V)).max(axis=1)
    np.testing.assert_allclose(pi_res.V, backup, rtol=0, atol=1e-12 * horizon(mdp))
    # PI's V is the value of its policy, and its policy is greedy w.r.t. its own Q.
    np.testing.assert_allclose(
        pi_res.V, T.policy_evaluation(mdp, pi_res.policy), rtol=0, atol=1e-12 * horizon(mdp)
    )
    chosen = np.sum(pi_res.policy * pi_res.Q, axis=1)
    np.testing.assert_allclose(chosen, pi_res.Q.max(axis=1), rtol=0, atol=1e-12 * horizon(mdp))
    # VI's guarantees: ||V - V*|| <= tol / 2 and its greedy policy is tol-optimal at every state.
    assert np.max(np.abs(vi_res.V - pi_res.V)) <= tol / 2
    assert np.all(T.policy_evaluation(mdp, vi_res.policy) >= pi_res.V - tol)


@given(st.one_of(mdps(max_states=3, max_actions=3), episodic_mdps(max_states=3, max_actions=3, gamma=1.0)))
def test_policy_iteration_beats_every_deterministic_policy(mdp):
    res = T.policy_iteration(mdp)
    best = np.full(mdp.num_states, -np.inf)
    for pi in all_deterministic_policies(mdp.num_states, mdp.num_actions):
        best = np.maximum(best, T.policy_evaluation(mdp, pi))
    scale = 100.0 if mdp.gamma == 1.0 else horizon(mdp)
    np.testing.assert_allclose(res.V, best, rtol=0, atol=1e-12 * scale)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tol", [1e-2, 1e-5, 1e-8])
def test_vi_bound_at_gamma_099_with_100_states(seed, tol):
    mdp = T.random_mdp(seed, num_states=100, num_actions=4, gamma=0.99, zero_fraction=0.5)
    v_star = T.policy_iteration(mdp).V
    res = T.value_iteration(mdp, tol=tol)
    assert np.max(np.abs(res.V - v_star)) <= tol / 2
    assert np.min(T.policy_evaluation(mdp, res.policy) - v_star) >= -tol


@pytest.mark.parametrize("gamma", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("tol", [1e-3, 1e-8])
def test_vi_stopping_rule_is_the_first_backup_meeting_the_bound(gamma, tol):
    # One state paying 1 forever: V_k = (1 - gamma^k)/(1 - gamma), delta after backup k is
    # gamma^(k-1) and V* - V_k = gamma^k / (1 - gamma) = gamma delta / (1 - gamma): the bound is
    # tight, so the exact stopping index and the tol / 2 guarantee can both be checked.
    mdp = T.MDP(np.ones((1, 1, 1)), np.ones((1, 1)), np.ones(1), gamma)
    k = 1
    while 2 * gamma * gamma ** (k - 1) / (1 - gamma) > tol:
        k += 1
    res = T.value_iteration(mdp, tol=tol)
    assert res.iterations == k
    v_star = 1 / (1 - gamma)
    assert res.V[0] == pytest.approx((1 - gamma**k) / (1 - gamma), rel=1e-12, abs=0.0)
    assert v_star - res.V[0] <= tol / 2
    assert v_star - res.V[0] > gamma * tol / 2  # one backup fewer would not have been enough


def test_vi_at_gamma_zero_is_one_exact_backup():
    mdp = T.random_mdp(3, num_states=4, num_actions=3, gamma=0.0)
    res = T.value_iteration(mdp, tol=1e-12)
    assert res.iterations == 1
    np.testing.assert_array_equal(res.V, mdp.r.max(axis=1))


def test_vi_refuses_gamma_one_and_bad_tol():
    mdp = T.random_mdp(0, num_states=3, num_actions=2, gamma=1.0, num_terminal=1)
    with pytest.raises(ValueError, match="gamma < 1"):
        T.value_iteration(mdp)
    ok = T.random_mdp(0, num_states=3, num_actions=2, gamma=0.5)
    for tol in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="tol"):
            T.value_iteration(ok, tol=tol)
    with pytest.raises(TypeError, match="mdp"):
        T.value_iteration("not an mdp")


@given(episodic_mdps(max_states=4, gamma=1.0))
def test_policy_iteration_on_episodic_mdps_at_gamma_one(mdp):
    res = T.policy_iteration(mdp)
    backup = (mdp.r + np.einsum("sat,t->sa", mdp.P, res.V)).max(axis=1)
    np.testing.assert_allclose(res.V, backup, rtol=0, atol=1e-10)
    assert np.all(res.V[mdp.terminal] == 0.0)


def test_greedy_tie_breaking_is_deterministic():
    Q = np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 2.0], [3.0, 3.0 - 1e-14, 1.0]])
    np.testing.assert_array_equal(T.greedy_policy(Q), [[1, 0, 0], [0, 1, 0], [1, 0, 0]])
    # a gap far above rounding is not a tie, even a small one
    np.testing.assert_array_equal(T.greedy_policy(np.array([[1.0, 1.0 + 1e-9]])), [[0, 1]])
    np.testing.assert_array_equal(
        T.greedy_policy(np.array([[5.0, 5.0 + 1e-9]]), current=np.array([0])), [[0, 1]]
    )
    # current actions are kept while tied, replaced when strictly worse
    np.testing.assert_array_equal(
        T.greedy_policy(Q, current=np.array([1, 2, 2])), [[0, 1, 0], [0, 0, 1], [1, 0, 0]]
    )


def test_policy_iteration_stops_at_once_from_an_optimal_policy_and_keeps_ties():
    # Two actions with identical effects everywhere: every policy is optimal, PI must not switch.
    P = np.zeros((2, 2, 2))
    P[:, :, 1] = 1.0
    mdp = T.MDP(P, np.zeros((2, 2)), np.array([1.0, 0.0]), 0.9)
    start = np.array([[0.0, 1.0], [1.0, 0.0]])
    res = T.policy_iteration(mdp, initial_policy=start)
    assert res.iterations == 1
    np.testing.assert_array_equal(res.policy, start)


def test_policy_iteration_improves_a_stochastic_initial_policy():
    mdp = T.chain_mdp(num_states=5, gamma=0.95)
    res = T.policy_iteration(mdp, initial_policy=np.full((5, 2), 0.5))
    # optimal: always move right (1 / (1 - gamma) * gamma^4 beats 0.1 / (1 - gamma) from state 0)
    np.testing.assert_array_equal(res.policy.argmax(axis=1), np.ones(5, dtype=int))
    assert res.V[0] == pytest.approx(0.95**4 / 0.05, rel=1e-12, abs=0.0)

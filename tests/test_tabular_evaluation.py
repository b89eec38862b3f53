"""Policy evaluation and occupancy (spec: specs/mdp.md sections 2-3; Kakade & Langford 2002;
Sutton & Barto 2018, section 3.5).

Each quantity is checked against an equation it must satisfy (Bellman expectation, centring,
flow equation), against a second computation (power series, forward propagation of the state
distribution) and against the exact rational path.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

import tabular as T
from tabular.exact import (
    ExactMDP,
    exact_advantages,
    exact_expected_return,
    exact_policy_evaluation,
    exact_q_values,
    exact_state_action_occupancy,
    exact_state_occupancy,
)
from tests.strategies import episodic_mdps, mdps, policies


def mdp_and_policy(mdp_strategy):
    return mdp_strategy.flatmap(lambda m: policies(m.num_states, m.num_actions).map(lambda pi: (m, pi)))


def assert_close(actual, expected, terms_scale=1.0, rel=1e-10):
    """float64 rule of docs/architecture.md: rel 1e-10 with an absolute floor of 1e-12 x scale of the
    terms."""
    actual, expected = np.asarray(actual, float), np.asarray(expected, float)
    np.testing.assert_allclose(actual, expected, rtol=rel, atol=1e-12 * max(1.0, terms_scale))


def value_scale(mdp):
    # gamma = 1: episodic_mdps terminates w.p. >= 1/24 per step, so episodes last < 100 steps on average
    horizon = 1.0 / (1.0 - mdp.gamma) if mdp.gamma < 1 else 100.0
    return float(np.abs(mdp.r).max(initial=0.0)) * horizon


ANY_MDP = st.one_of(mdps(), episodic_mdps())


# --------------------------------------------------------------------- Bellman (24)-(27), (28)-(30)
@given(mdp_and_policy(ANY_MDP))
def test_bellman_expectation_equations_001_24_to_27(case):
    mdp, pi = case
    V, Q = T.policy_evaluation(mdp, pi), T.q_values(mdp, pi)
    scale = value_scale(mdp)
    # (24) V = E_{a~pi} Q
    assert_close(np.sum(pi * Q, axis=1), V, scale)
    # (25) Q = r + gamma E_{s'} V
    assert_close(Q, mdp.r + mdp.gamma * np.einsum("sat,t->sa", mdp.P, V), scale)
    # (26) V = E_{a, s'}[r + gamma V(s')], written as an explicit loop over (s, a, s')
    S, A = pi.shape
    rhs26 = np.zeros(S)
    for s in range(S):
        for a in range(A):
            for s2 in range(S):
                rhs26[s] += pi[s, a] * mdp.P[s, a, s2] * (mdp.r[s, a] + mdp.gamma * V[s2])
    assert_close(rhs26, V, scale)
    # (27) Q = r + gamma E_{s', a'} Q(s', a')
    assert_close(Q, mdp.r + mdp.gamma * np.einsum("sat,tb,tb->sa", mdp.P, pi, Q), scale)
    # terminal states are worth 0
    assert np.all(V[mdp.terminal] == 0.0)


@given(mdp_and_policy(ANY_MDP))
def test_advantage_centring_001_28_29_and_one_step_form_30(case):
    mdp, pi = case
    adv = T.advantages(mdp, pi)
    scale = value_scale(mdp)
    assert_close(np.sum(pi * adv, axis=1), np.zeros(mdp.num_states), scale)  # (28)
    d_sa = T.state_action_occupancy(mdp, pi, normalized=True)
    assert abs(float(np.sum(d_sa * adv))) <= 1e-12 * max(1.0, scale)  # (29)
    V = T.policy_evaluation(mdp, pi)
    assert_close(adv, T.q_values(mdp, pi) - V[:, None], scale)  # (23)
    assert_close(adv, mdp.r + mdp.gamma * np.einsum("sat,t->sa", mdp.P, V) - V[:, None], scale)  # (30)


@given(mdp_and_policy(mdps(gamma=st.floats(0.0, 0.8))))
def test_values_equal_the_power_series_of_the_definition(case):
    # V = sum_t gamma^t P_pi^t r_pi (Sutton & Barto 2018, sections 3.3 and 3.5), truncated where gamma^t <
    # 1e-16.
    mdp, pi = case
    P_pi = np.einsum("sa,sat->st", pi, mdp.P)
    term = np.einsum("sa,sa->s", pi, mdp.r)
    V = np.zeros(mdp.num_states)
    for _ in range(200):
        V += term
        term = mdp.gamma * (P_pi @ term)
    assert_close(T.policy_evaluation(mdp, pi), V, value_scale(mdp))
    assert T.expected_return(mdp, pi) == pytest.approx(float(mdp.rho0 @ V), rel=1e-10, abs=1e-12)


# -------------------------------------------------------------------------- occupancy (19)-(20)
@given(mdp_and_policy(ANY_MDP))
def test_flow_equation_and_return_as_occupancy_times_reward(case):
    mdp, pi = case
    rho = T.state_occupancy(mdp, pi, normalized=False)
    P_pi = np.einsum("sa,sat->st", pi, mdp.P)
    live = ~mdp.terminal if mdp.gamma == 1.0 else np.ones(mdp.num_states, bool)
    # rho = rho0 + gamma P_pi^T rho  (over the non-terminal states at gamma = 1)
    flow = mdp.rho0 + mdp.gamma * P_pi[live].T @ rho[live]
    scale = 1.0 / (1.0 - mdp.gamma) if mdp.gamma < 1 else float(rho.sum())
    assert_close(rho[live], flow[live], scale)
    if mdp.gamma == 1.0:
        assert np.all(rho[mdp.terminal] == 0.0)
    # J = sum_{s,a} rho(s, a) r(s, a)
    rho_sa = T.state_action_occupancy(mdp, pi, normalized=False)
    assert_close(rho_sa, rho[:, None] * pi, scale)
    J = T.expected_return(mdp, pi)
    assert float(np.sum(rho_sa * mdp.r)) == pytest.approx(
        J, rel=1e-10, abs=1e-12 * max(1.0, value_scale(mdp))
    )
    assert np.all(rho >= -1e-15)


@given(mdp_and_policy(ANY_MDP))
def test_normalised_occupancy_sums_to_one_and_total_is_horizon(case):
    mdp, pi = case
    d = T.state_occupancy(mdp, pi, normalized=True)
    d_sa = T.state_action_occupancy(mdp, pi, normalized=True)
    assert float(d.sum()) == pytest.approx(1.0, abs=1e-12)
    assert float(d_sa.sum()) == pytest.approx(1.0, abs=1e-12)
    rho = T.state_occupancy(mdp, pi, normalized=False)
    if mdp.gamma < 1.0:
        assert float(rho.sum()) == pytest.approx(1.0 / (1.0 - mdp.gamma), rel=1e-12, abs=0.0)
    else:
        # gamma = 1: the total is the expected episode length (number of non-terminal steps),
        # which is the value of the policy under reward 1 on every non-terminal state.
        ones = np.where(mdp.terminal[:, None], 0.0, np.ones((mdp.num_states, mdp.num_actions)))
        length = T.expected_return(T.MDP(mdp.P, ones, mdp.rho0, 1.0, terminal=mdp.terminal), pi)
        assert float(rho.sum()) == pytest.approx(length, rel=1e-10, abs=0.0)
    assert_close(d, rho / rho.sum())


@given(mdp_and_policy(mdps(gamma=st.floats(0.0, 0.7))))
def test_occupancy_equals_forward_propagation_of_the_state_distribution(case):
    # rho(s) = sum_t gamma^t P(s_t = s), with P(s_t = .) = rho0 P_pi^t (Schulman et al. 2015, section 2).
    mdp, pi = case
    P_pi = np.einsum("sa,sat->st", pi, mdp.P)
    mu, rho = mdp.rho0.copy(), np.zeros(mdp.num_states)
    for t in range(120):
        rho += mdp.gamma**t * mu
        mu = mu @ P_pi
    assert_close(T.state_occupancy(mdp, pi, normalized=False), rho, 1.0 / (1.0 - mdp.gamma))


def test_episodic_occupancy_counts_expected_visits_on_a_hand_computed_chain():
    # s0 -> s1 -> terminal, with s1 repeating itself with probability 1/2: rho = [1, 2, 0].
    P = np.zeros((3, 1, 3))
    P[0, 0, 1] = 1.0
    P[1, 0, 1] = P[1, 0, 2] = 0.5
    P[2, 0, 2] = 1.0
    mdp = T.MDP(
        P, np.array([[1.0], [3.0], [0.0]]), np.array([1.0, 0.0, 0.0]), 1.0, terminal=np.array([0, 0, 1], bool)
    )
    pi = np.ones((3, 1))
    np.testing.assert_array_equal(T.state_occupancy(mdp, pi, normalized=False), [1.0, 2.0, 0.0])
    np.testing.assert_allclose(T.state_occupancy(mdp, pi), [1 / 3, 2 / 3, 0.0], rtol=1e-15)
    np.testing.assert_allclose(T.policy_evaluation(mdp, pi), [7.0, 6.0, 0.0], rtol=1e-15)


def test_terminal_states_leave_the_solves_as_gamma_nears_one():
    """gamma = 1 - 2**-53 with a terminal state (found by the thorough profile): a policy whose row sums
    to 1 + 2**-52 in floating point made ``I - gamma P_pi`` over every state exactly singular. The
    solves now run on the non-terminal states: V(terminal) = 0 (mdp.md eq. (3)) and the terminal
    state's occupancy from its row of the flow equation, (rho0(T) + gamma inflow) / (1 - gamma)."""
    P = np.zeros((2, 3, 2))
    P[:, :, 1] = 1.0  # s0 -> terminal s1 under every action
    gamma = 1.0 - 2.0**-53
    mdp = T.MDP(P, np.zeros((2, 3)), np.array([1.0, 0.0]), gamma, terminal=np.array([False, True]))
    theta = np.array([[0.0, 0.0, 0.0], [0.0, 2.001, 0.0]])
    pi = np.exp(theta) / np.exp(theta).sum(axis=1, keepdims=True)
    assert pi[1].sum() != 1.0  # the rounding that made the old solve singular
    np.testing.assert_array_equal(T.policy_evaluation(mdp, pi), [0.0, 0.0])
    # rho(s0) = 1; rho(s1) = gamma / (1 - gamma) = 2**53 - 1, exactly
    np.testing.assert_array_equal(T.state_occupancy(mdp, pi, normalized=False), [1.0, 2.0**53 - 1.0])


# ------------------------------------------------------------------------ float vs exact rationals
@given(mdp_and_policy(st.one_of(mdps(max_states=4), episodic_mdps(max_states=4))))
def test_float_path_equals_exact_rational_path(case):
    mdp, pi = case
    emdp = ExactMDP.from_mdp(mdp)
    # 1e-12 relative to the scale of the quantities: values (|r| x horizon) and the occupancy's
    # total (at gamma = 1 the expected episode length, which can be in the hundreds).
    V_exact = exact_policy_evaluation(emdp, pi).astype(float)
    total = float(sum(exact_state_occupancy(emdp, pi, normalized=False)))
    tol = 1e-12 * max(1.0, value_scale(mdp), float(np.max(np.abs(V_exact))), total)
    pairs = [
        (T.policy_evaluation(mdp, pi), exact_policy_evaluation(emdp, pi)),
        (T.q_values(mdp, pi), exact_q_values(emdp, pi)),
        (T.advantages(mdp, pi), exact_advantages(emdp, pi)),
        (T.expected_return(mdp, pi), exact_expected_return(emdp, pi)),
        (T.state_occupancy(mdp, pi, normalized=False), exact_state_occupancy(emdp, pi, normalized=False)),
        (T.state_occupancy(mdp, pi), exact_state_occupancy(emdp, pi)),
        (T.state_action_occupancy(mdp, pi), exact_state_action_occupancy(emdp, pi)),
    ]
    for approx, exact in pairs:
        exact = np.asarray(exact, dtype=object)
        assert all(isinstance(x, sympy.Rational) for x in exact.reshape(-1))
        np.testing.assert_allclose(np.asarray(approx, float), exact.astype(float), rtol=0.0, atol=tol)


def test_exact_path_solves_the_bellman_equation_exactly():
    # Rational inputs: the exact V satisfies (26) with equality, not up to rounding.
    F = sympy.Rational
    P = [[[F(1, 2), F(1, 2)], [F(1, 3), F(2, 3)]], [[F(1), F(0)], [F(1, 4), F(3, 4)]]]
    r = [[F(1), F(-2)], [F(3, 7), F(0)]]
    emdp = ExactMDP.from_arrays(P, r, [F(1, 5), F(4, 5)], F(9, 10))
    pi = [[F(1, 3), F(2, 3)], [F(1, 2), F(1, 2)]]
    V = exact_policy_evaluation(emdp, pi)
    for s in range(2):
        rhs = sum(
            pi[s][a] * (r[s][a] + F(9, 10) * sum(P[s][a][t] * V[t] for t in range(2))) for a in range(2)
        )
        assert sympy.simplify(rhs - V[s]) == 0
    rho = exact_state_occupancy(emdp, pi, normalized=False)
    assert sum(rho) == 10
    assert exact_expected_return(emdp, pi) == sum(
        rho[s] * pi[s][a] * r[s][a] for s in range(2) for a in range(2)
    )


# ------------------------------------------------------------------ reward conventions (errata.md entry 3)
@given(mdps(), st.integers(0, 2**32 - 1))
def test_reward_on_transitions_is_reduced_to_its_expectation(mdp, seed):
    # r[S, A, S] is reduced at construction to r(s, a) = sum_s' P(s'|s, a) r(s, a, s').
    r_sas = np.random.default_rng(seed).uniform(-1, 1, size=mdp.P.shape)
    reduced = T.MDP(mdp.P, r_sas, mdp.rho0, mdp.gamma)
    S, A = mdp.num_states, mdp.num_actions
    expected = np.array(
        [[sum(mdp.P[s, a, t] * r_sas[s, a, t] for t in range(S)) for a in range(A)] for s in range(S)]
    )
    assert_close(reduced.r, expected, 1.0)


@given(mdp_and_policy(mdps(min_states=2, reward_shape="sa")), st.integers(0, 2**32 - 1))
def test_seed_003_reward_on_arrival_vs_reward_in_state(case, seed):
    # Erratum (errata.md entry 3): evaluation uses R(s') but the Bellman equations R(s).
    # With a state reward R, the arrival convention is r[s, a, s'] = R(s') and the "being in s"
    # convention r[s, a] = R(s); their values differ and satisfy V_in = R + gamma V_arrival.
    mdp, pi = case
    R = np.random.default_rng(seed).uniform(-1, 1, size=mdp.num_states)
    arrival = T.MDP(mdp.P, np.broadcast_to(R[None, None, :], mdp.P.shape), mdp.rho0, mdp.gamma)
    in_state = T.MDP(
        mdp.P, np.broadcast_to(R[:, None], (mdp.num_states, mdp.num_actions)), mdp.rho0, mdp.gamma
    )
    V_arr, V_in = T.policy_evaluation(arrival, pi), T.policy_evaluation(in_state, pi)
    scale = 1.0 / (1.0 - mdp.gamma)
    # the erratum's evaluation step: V(s) = sum_a pi sum_s' P [R(s') + gamma V(s')]
    assert_close(V_arr, np.einsum("sa,sat,t->s", pi, mdp.P, R + mdp.gamma * V_arr), scale)
    # the erratum's Bellman expectation: V(s) = sum_a pi [R(s) + gamma sum_s' P V(s')]
    assert_close(V_in, R + mdp.gamma * np.einsum("sa,sat,t->s", pi, mdp.P, V_in), scale)
    assert_close(V_in, R + mdp.gamma * V_arr, scale)


def test_exact_mdp_reduces_transition_rewards_exactly():
    F = sympy.Rational
    P = [[[F(1, 3), F(2, 3)]], [[F(0), F(1)]]]
    r_sas = [[[F(3), F(-6, 5)]], [[F(7), F(1, 2)]]]
    emdp = ExactMDP.from_arrays(P, r_sas, [F(1), F(0)], F(1, 2))
    assert emdp.r[0, 0] == F(1, 3) * 3 + F(2, 3) * F(-6, 5)
    assert emdp.r[1, 0] == F(1, 2)
    assert float(emdp.mdp.r[0, 0]) == pytest.approx(float(emdp.r[0, 0]), rel=1e-15, abs=0.0)

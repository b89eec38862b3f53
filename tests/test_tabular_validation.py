"""Every bad input to the tabular layer raises a clear error naming the argument
(docs/architecture.md "Bad input gets a clear error"; spec: specs/mdp.md section 1)."""

from __future__ import annotations

import numpy as np
import pytest

import tabular as T
from tabular.exact import ExactMDP, exact_policy_evaluation, exact_state_occupancy


def good_arrays():
    P = np.zeros((3, 2, 3))
    P[0, 0, 1] = 1.0
    P[0, 1, [1, 2]] = 0.5
    P[1, :, 2] = 1.0
    P[2, :, 2] = 1.0
    r = np.array([[1.0, 0.0], [0.5, -1.0], [0.0, 0.0]])
    rho0 = np.array([0.5, 0.5, 0.0])
    return P, r, rho0


def test_good_arrays_build_an_mdp():
    P, r, rho0 = good_arrays()
    mdp = T.MDP(P, r, rho0, 0.9, terminal=np.array([False, False, True]))
    assert mdp.num_states == 3 and mdp.num_actions == 2
    assert not mdp.P.flags.writeable  # read-only: an MDP cannot be mutated after validation
    assert P.flags.writeable and r.flags.writeable and rho0.flags.writeable  # caller's arrays untouched
    P[0, 0, 1] = 0.0
    assert mdp.P[0, 0, 1] == 1.0


def bad_P_cases():
    P, _, _ = good_arrays()
    row = P.copy()
    row[0, 0, 1] = 0.9
    neg = P.copy()
    neg[0, 1, 1], neg[0, 1, 2] = -0.5, 1.5
    nan = P.copy()
    nan[1, 0, 2] = np.nan
    inf = P.copy()
    inf[1, 0, 2] = np.inf
    return [
        (row, ValueError, "P rows must sum to 1"),
        (neg, ValueError, "P has a negative probability"),
        (nan, ValueError, "P contains NaN"),
        (inf, ValueError, "P contains NaN or inf"),
        (P[:, :, :2], ValueError, r"P must have shape \[S, A, S\]"),
        (P[0], ValueError, "P must have 3 dimensions"),
        (np.zeros((0, 2, 0)), ValueError, "S, A >= 1"),
        ("P", TypeError, "P must be a numeric array"),
    ]


@pytest.mark.parametrize(("P", "exc", "match"), bad_P_cases())
def test_bad_transitions(P, exc, match):
    _, r, rho0 = good_arrays()
    with pytest.raises(exc, match=match):
        T.MDP(P, r, rho0, 0.9)


@pytest.mark.parametrize(
    ("r", "match"),
    [
        (np.zeros((3, 3)), r"r must have shape \[S, A\]"),
        (np.zeros((3, 2, 2)), r"r must have shape"),
        (np.zeros(3), "r must have 2 or 3 dimensions"),
        (np.array([[np.nan, 0], [0, 0], [0, 0]]), "r contains NaN"),
        (np.array([[np.inf, 0], [0, 0], [0, 0]]), "r contains NaN or inf"),
    ],
)
def test_bad_rewards(r, match):
    P, _, rho0 = good_arrays()
    with pytest.raises(ValueError, match=match):
        T.MDP(P, r, rho0, 0.9)


@pytest.mark.parametrize(
    ("rho0", "match"),
    [
        (np.array([0.5, 0.4, 0.0]), "rho0 rows must sum to 1"),
        (np.array([1.5, -0.5, 0.0]), "rho0 has a negative probability"),
        (np.array([0.5, 0.5]), r"rho0 must have shape \[S\]"),
        (np.array([[1.0, 0.0, 0.0]]), "rho0 must have 1 dimensions"),
        (np.array([np.nan, 0.5, 0.5]), "rho0 contains NaN"),
    ],
)
def test_rho0_not_a_distribution(rho0, match):
    P, r, _ = good_arrays()
    with pytest.raises(ValueError, match=match):
        T.MDP(P, r, rho0, 0.9)


@pytest.mark.parametrize(
    ("gamma", "exc"),
    [(-0.1, ValueError), (1.0000001, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
     (True, TypeError), ("0.9", TypeError), (None, TypeError)],
)  # fmt: skip
def test_gamma_out_of_range(gamma, exc):
    P, r, rho0 = good_arrays()
    with pytest.raises(exc, match="gamma"):
        T.MDP(P, r, rho0, gamma)


def test_bad_terminal_marks():
    P, r, rho0 = good_arrays()
    with pytest.raises(ValueError, match=r"terminal must have shape \[S\]"):
        T.MDP(P, r, rho0, 0.9, terminal=np.array([False, True]))
    with pytest.raises(TypeError, match="terminal must be a bool array"):
        T.MDP(P, r, rho0, 0.9, terminal=np.array([0, 0, 1]))
    with pytest.raises(ValueError, match="terminal state 1 must be absorbing"):
        T.MDP(P, r, rho0, 0.9, terminal=np.array([False, True, True]))
    r_bad = r.copy()
    r_bad[2, 1] = 0.25
    with pytest.raises(ValueError, match="terminal state 2 must pay zero reward"):
        T.MDP(P, r_bad, rho0, 0.9, terminal=np.array([False, False, True]))
    # a reward on the transition INTO an absorbing terminal state's self-loop counts too
    r_sas = np.zeros((3, 2, 3))
    r_sas[2, 0, 2] = 1.0
    with pytest.raises(ValueError, match="terminal state 2 must pay zero reward"):
        T.MDP(P, r_sas, rho0, 0.9, terminal=np.array([False, False, True]))


@pytest.mark.parametrize(
    ("pi", "match"),
    [
        (np.array([[0.5, 0.6], [1, 0], [1, 0]]), "pi rows must sum to 1"),
        (np.array([[1.5, -0.5], [1, 0], [1, 0]]), "pi has a negative probability"),
        (np.array([[1.0, 0.0], [1, 0]]), r"pi must have shape \[S, A\]"),
        (np.ones((3, 3)) / 3, r"pi must have shape \[S, A\]"),
        (np.array([[np.nan, 1.0], [1, 0], [1, 0]]), "pi contains NaN"),
        (np.array([0.5, 0.5]), "pi must have 2 dimensions"),
    ],
)
def test_bad_policies(pi, match):
    P, r, rho0 = good_arrays()
    mdp = T.MDP(P, r, rho0, 0.9)
    for fn in (T.policy_evaluation, T.q_values, T.advantages, T.expected_return, T.state_occupancy):
        with pytest.raises(ValueError, match=match):
            fn(mdp, pi)


def test_gamma_one_with_an_improper_policy_raises_everywhere():
    # State 0 can loop on itself with action 0 forever: improper; action 1 leads to the terminal.
    P = np.zeros((2, 2, 2))
    P[0, 0, 0] = 1.0
    P[0, 1, 1] = 1.0
    P[1, :, 1] = 1.0
    mdp = T.MDP(
        P, np.array([[1.0, 0.0], [0.0, 0.0]]), np.array([1.0, 0.0]), 1.0, terminal=np.array([False, True])
    )
    improper = np.array([[1.0, 0.0], [1.0, 0.0]])
    proper = np.array([[0.9, 0.1], [1.0, 0.0]])  # leaves with probability 1 eventually
    # 1 / 0.1 steps x 0.9 reward
    assert T.expected_return(mdp, proper) == pytest.approx(9.0, rel=1e-12, abs=0.0)
    for fn in (T.policy_evaluation, T.q_values, T.advantages, T.expected_return, T.state_occupancy):
        with pytest.raises(ValueError, match="gamma = 1 requires a policy that reaches a terminal state"):
            fn(mdp, improper)
    emdp = ExactMDP.from_mdp(mdp)
    for fn in (exact_policy_evaluation, exact_state_occupancy):
        with pytest.raises(ValueError, match="gamma = 1 requires"):
            fn(emdp, improper)
    with pytest.raises(ValueError, match="gamma = 1 requires"):
        T.performance_difference(mdp, proper, improper)
    # no terminal state at all at gamma = 1: every policy is improper
    no_terminal = T.MDP(P, np.zeros((2, 2)), np.array([1.0, 0.0]), 1.0)
    with pytest.raises(ValueError, match="gamma = 1 requires"):
        T.policy_evaluation(no_terminal, proper)


def test_normalised_occupancy_undefined_when_every_start_is_terminal():
    P, r, _ = good_arrays()
    mdp = T.MDP(P, r, np.array([0.0, 0.0, 1.0]), 1.0, terminal=np.array([False, False, True]))
    pi = np.full((3, 2), 0.5)
    np.testing.assert_array_equal(T.state_occupancy(mdp, pi, normalized=False), 0.0)
    with pytest.raises(ValueError, match="every start state is terminal"):
        T.state_occupancy(mdp, pi)


def test_bad_example_and_generator_arguments():
    with pytest.raises(ValueError, match="outside"):
        T.grid_world(goal=(8, 0))
    with pytest.raises(ValueError, match="different cells"):
        T.grid_world(goal=(1, 1), trap=(1, 1))
    with pytest.raises(ValueError, match="size"):
        T.grid_world(size=1)
    with pytest.raises(TypeError, match="seed"):
        T.random_mdp(1.5)
    with pytest.raises(ValueError, match="num_terminal"):
        T.random_mdp(0, num_states=2, num_terminal=2)
    with pytest.raises(ValueError, match="zero_fraction"):
        T.random_mdp(0, zero_fraction=1.0)
    with pytest.raises(ValueError, match="gamma"):
        T.distribution_shift_example(gamma=1.0)
    with pytest.raises(ValueError, match="eta"):
        T.distribution_shift_example(eta=0.0)
    with pytest.raises(ValueError, match="H"):
        T.trajectory_is_example(-1)
    with pytest.raises(ValueError, match="reward"):
        T.trajectory_is_example(3, reward="twice")
    with pytest.raises(ValueError, match="p"):
        T.is_weight_variance(0.0, 0.5, 3)


def test_reaching_a_terminal_with_positive_probability_is_not_enough_at_gamma_one():
    # State 0 ends with probability 1/2 and otherwise falls into state 1, a non-terminal trap it
    # never leaves: a terminal state is reachable from 0, but not reached surely.
    P = np.zeros((3, 1, 3))
    P[0, 0, [1, 2]] = 0.5
    P[1, 0, 1] = 1.0
    P[2, 0, 2] = 1.0
    mdp = T.MDP(P, np.zeros((3, 1)), np.array([1.0, 0.0, 0.0]), 1.0, terminal=np.array([False, False, True]))
    pi = np.ones((3, 1))
    np.testing.assert_array_equal(T.reaches_terminal_surely(mdp, pi), [False, False, True])
    with pytest.raises(ValueError, match=r"from states \[0, 1\] it does not"):
        T.policy_evaluation(mdp, pi)
    # the same chain with the trap leaking to the terminal state is proper
    P[1, 0, [1, 2]] = 0.5
    leaky = T.MDP(
        P, np.zeros((3, 1)), np.array([1.0, 0.0, 0.0]), 1.0, terminal=np.array([False, False, True])
    )
    np.testing.assert_array_equal(T.reaches_terminal_surely(leaky, pi), [True, True, True])
    np.testing.assert_allclose(T.state_occupancy(leaky, pi, normalized=False), [1.0, 1.0, 0.0])

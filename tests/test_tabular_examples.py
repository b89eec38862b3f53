"""The examples of specs/mdp.md section 7: sections 7.1 and 7.2 with their exact numbers (and
the return erratum, errata.md entry 2), the grid world (section 7.3) against a breadth-first-search closed
form,
the random-MDP generator and the chain."""

from __future__ import annotations

import itertools
from collections import deque
from fractions import Fraction

import numpy as np
import pytest
import sympy

import tabular as T
from tabular.exact import ExactMDP, exact_advantages, exact_expected_return, exact_state_occupancy

F = Fraction


# ------------------------------------------------------------------- distribution shift (7.1)
def seed_001_closed_forms(gamma, M, eta, eta2):
    """The example's own formulas (mdp.md section 7.1), evaluated in exact rationals."""
    V1 = 1 - eta2 * (1 + M)
    return {
        "J_pi": eta * gamma * V1,
        "J_pi_new": -gamma * M,
        "L_minus_J": gamma * ((1 - eta) * V1 - eta * (1 + M) * (1 - eta2)),
        "A_s1_b": -(1 + M) * (1 - eta2),
        "A_s0_a1": (1 - eta) * gamma * V1,
        "d_pi_s1": (1 - gamma) * gamma * eta,
        "d_pi_new_s1": (1 - gamma) * gamma,
    }


def exact_example(ex):
    e = ex.exact
    return ExactMDP.from_arrays(e.P, e.r, e.rho0, e.gamma, e.terminal)


def test_distribution_shift_example_reproduces_the_seed_numbers():
    ex = T.distribution_shift_example()
    want = seed_001_closed_forms(F(9, 10), F(100), F(1, 10**4), F(1, 10**3))
    assert want["J_pi"] == F(8091, 10**8)  # 8.091e-5 as first stated
    assert want["J_pi_new"] == -90
    assert round(float(want["L_minus_J"]), 5) == 0.79994  # "approx 0.79994" as first stated
    # float path
    mdp, pi, pi_new = ex.mdp, ex.pi, ex.pi_new
    J, J_new = T.expected_return(mdp, pi), T.expected_return(mdp, pi_new)
    assert J == pytest.approx(8.091e-5, rel=1e-12, abs=0.0)
    assert J_new == pytest.approx(-90.0, rel=1e-14, abs=0.0)
    assert T.surrogate(mdp, pi, pi_new) - J == pytest.approx(float(want["L_minus_J"]), rel=1e-12, abs=0.0)
    adv = T.advantages(mdp, pi)
    assert adv[1, 1] == pytest.approx(float(want["A_s1_b"]), rel=1e-13, abs=0.0)
    assert adv[0, 1] == pytest.approx(float(want["A_s0_a1"]), rel=1e-12, abs=0.0)
    assert T.state_occupancy(mdp, pi)[1] == pytest.approx(float(want["d_pi_s1"]), rel=1e-12, abs=0.0)
    assert T.state_occupancy(mdp, pi_new)[1] == pytest.approx(float(want["d_pi_new_s1"]), rel=1e-12, abs=0.0)
    assert T.performance_difference(mdp, pi, pi_new) == pytest.approx(J_new - J, rel=1e-12, abs=0.0)


def test_distribution_shift_example_in_exact_rationals():
    ex = T.distribution_shift_example()
    emdp = exact_example(ex)
    pi, pi_new = ex.exact.pi, ex.exact.pi_new
    want = seed_001_closed_forms(F(9, 10), F(100), F(1, 10**4), F(1, 10**3))
    assert exact_expected_return(emdp, pi) == sympy.Rational(8091, 10**8)
    assert exact_expected_return(emdp, pi_new) == -90
    adv = exact_advantages(emdp, pi)
    rho = exact_state_occupancy(emdp, pi, normalized=False)
    rho_new = exact_state_occupancy(emdp, pi_new, normalized=False)
    abar = [sum(pi_new[s, a] * adv[s, a] for a in range(2)) for s in range(3)]
    L_minus_J = sum(rho[s] * abar[s] for s in range(3))
    assert L_minus_J == sympy.Rational(want["L_minus_J"].numerator, want["L_minus_J"].denominator)
    assert L_minus_J == sympy.Rational(79993818, 10**8)
    # PDL (Kakade & Langford 2002, Lemma 6.1) and L + DSP (mdp.md eq. (24)) in exact arithmetic
    pdl = sum(rho_new[s] * abar[s] for s in range(3))
    assert pdl == -90 - sympy.Rational(8091, 10**8)
    dsp = sum((rho_new[s] - rho[s]) * abar[s] for s in range(3))
    assert sympy.Rational(8091, 10**8) + L_minus_J + dsp == -90


def test_distribution_shift_example_parameters_flow_through():
    ex = T.distribution_shift_example(gamma=F(1, 2), M=3, eta=F(1, 4), eta2=F(1, 3))
    want = seed_001_closed_forms(F(1, 2), F(3), F(1, 4), F(1, 3))
    assert exact_expected_return(exact_example(ex), ex.exact.pi) == sympy.Rational(
        want["J_pi"].numerator, want["J_pi"].denominator
    )
    assert T.expected_return(ex.mdp, ex.pi_new) == pytest.approx(float(want["J_pi_new"]), rel=1e-14, abs=0.0)


# ---------------------------------------------------------------------- trajectory IS (7.2)
@pytest.mark.parametrize("H", [0, 1, 2, 3, 5, 8])
@pytest.mark.parametrize(("p", "q"), [(F(1, 2), F(9, 10)), (F(1, 3), F(1, 5)), (F(1, 2), F(1, 2))])
def test_is_weight_variance_by_exact_enumeration(H, p, q):
    # E_pi[w] = 1 and Var_pi[w] = E_pi[w^2] - 1 over all 2^H action sequences, in rationals.
    ex = T.trajectory_is_example(H, p=p, q=q)
    pi, pi_new = ex.exact.pi, ex.exact.pi_new
    mean = second = F(0)
    for actions in itertools.product((0, 1), repeat=H):
        prob = w = F(1)
        for t, a in enumerate(actions):
            prob *= pi[t, a]
            w *= pi_new[t, a] / pi[t, a]
        mean += prob * w
        second += prob * w * w
    assert mean == 1
    assert second - 1 == T.is_weight_variance(p, q, H)
    assert T.is_weight_variance(p, q, H) == (q * q / p + (1 - q) ** 2 / (1 - p)) ** H - 1


def test_is_weight_variance_numbers_of_the_seed():
    assert F(81, 100) / F(1, 2) + F(1, 100) / F(1, 2) == F(164, 100)
    for H in (1, 5, 10, 20):
        assert T.is_weight_variance(F(1, 2), F(9, 10), H) == F(164, 100) ** H - 1
    assert T.is_weight_variance(0.5, 0.9, 10) == pytest.approx(1.64**10 - 1, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("H", [1, 4, 9])
def test_seed_001_4_1_2_return_erratum(H):
    # As written (absorbing state paying 1 at every step) the return is gamma^H / (1 - gamma),
    # not gamma^H (errata.md entry 2); paying once (reward="once") gives gamma^H. Same for every policy.
    gamma = 0.9
    absorbing = T.trajectory_is_example(H, gamma=gamma, reward="absorbing")
    once = T.trajectory_is_example(H, gamma=gamma, reward="once")
    for ex in (absorbing, once):
        assert T.expected_return(ex.mdp, ex.pi) == pytest.approx(
            T.expected_return(ex.mdp, ex.pi_new), rel=1e-13, abs=0.0
        )
    J_abs = T.expected_return(absorbing.mdp, absorbing.pi)
    assert J_abs == pytest.approx(gamma**H / (1 - gamma), rel=1e-12, abs=0.0)
    assert abs(J_abs - gamma**H) > 1.0  # gamma^H is wrong for this MDP (errata.md entry 2)
    assert T.expected_return(once.mdp, once.pi) == pytest.approx(gamma**H, rel=1e-12, abs=0.0)
    exact = exact_expected_return(exact_example(absorbing), absorbing.exact.pi)
    assert exact == sympy.Rational(9, 10) ** H / (1 - sympy.Rational(9, 10))


# ------------------------------------------------------------------------------- grid world
def bfs_distances(size, goal, trap):
    """Shortest number of moves to enter ``goal`` without entering ``trap`` (walls: stay put)."""
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        row, col = queue.popleft()
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            nxt = (row + dr, col + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in dist and nxt != trap:
                dist[nxt] = dist[(row, col)] + 1
                queue.append(nxt)
    return dist


@pytest.mark.parametrize(
    ("goal", "trap", "gamma"), [((0, 7), (3, 3), 0.9), ((4, 4), (4, 3), 0.5), ((7, 0), (0, 7), 0.99)]
)
def test_grid_world_optimal_values_are_gamma_to_distance_minus_one(goal, trap, gamma):
    # Reward on arrival: entering the goal pays 1, so V*(s) = gamma^(d(s) - 1) with d the BFS
    # distance avoiding the trap (entering the trap pays -1 and ends the episode: never optimal).
    g = T.grid_world(goal=goal, trap=trap, gamma=gamma)
    assert g.mdp.gamma == gamma
    res = T.policy_iteration(g.mdp)
    dist = bfs_distances(8, goal, trap)
    for s in range(64):
        cell = g.cell(s)
        expected = 0.0 if cell in (goal, trap) else gamma ** (dist[cell] - 1)
        assert res.V[s] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert np.all(g.mdp.terminal == np.isin(np.arange(64), [g.state(*goal), g.state(*trap)]))


def test_grid_world_dynamics_and_rewards():
    g = T.grid_world()
    mdp = g.mdp
    assert mdp.P.shape == (64, 4, 64) and np.all((mdp.P == 0) | (mdp.P == 1))
    up, right, down, left = range(4)
    assert [name for name, _, _ in T.GRID_ACTIONS] == ["up", "right", "down", "left"]
    corner = g.state(7, 0)
    assert mdp.P[corner, down, corner] == 1 and mdp.P[corner, left, corner] == 1  # walls: stay put
    assert mdp.P[corner, up, g.state(6, 0)] == 1 and mdp.P[corner, right, g.state(7, 1)] == 1
    assert mdp.r[g.state(0, 6), right] == 1.0 and mdp.r[g.state(1, 7), up] == 1.0  # arrival in goal
    assert mdp.r[g.state(2, 3), down] == -1.0 and mdp.r[g.state(3, 4), left] == -1.0  # arrival in trap
    assert np.count_nonzero(mdp.r) == 2 + 4  # goal in a corner: 2 ways in; trap: 4 ways in
    np.testing.assert_allclose(mdp.rho0[~mdp.terminal], 1 / 62)
    start = T.grid_world(start=(7, 0)).mdp.rho0
    assert start[g.state(7, 0)] == 1.0 and start.sum() == 1.0


# ------------------------------------------------------------------------------ random MDPs
def test_random_mdp_is_reproducible_and_seed_dependent():
    a, b, c = (T.random_mdp(s, num_states=6, num_actions=3, zero_fraction=0.4) for s in (7, 7, 8))
    np.testing.assert_array_equal(a.P, b.P)
    np.testing.assert_array_equal(a.r, b.r)
    assert not np.array_equal(a.P, c.P)
    assert np.count_nonzero(a.P == 0) > 0  # zero-probability transitions
    rng = np.random.default_rng(0)
    assert T.random_mdp(rng).num_states == 5  # a Generator works too


@pytest.mark.parametrize("seed", range(5))
def test_episodic_random_mdps_make_every_policy_proper(seed):
    mdp = T.random_mdp(seed, num_states=6, num_actions=3, gamma=1.0, num_terminal=2, reward_shape="sas")
    assert mdp.gamma == 1.0 and mdp.terminal.tolist() == [False] * 4 + [True] * 2
    rng = np.random.default_rng(seed)
    for actions in itertools.product(range(3), repeat=4):  # every deterministic policy
        pi = np.zeros((6, 3))
        pi[np.arange(4), actions] = 1.0
        pi[4:, 0] = 1.0
        assert np.all(T.reaches_terminal_surely(mdp, pi))
    assert np.all(T.reaches_terminal_surely(mdp, T.random_policy(rng, 6, 3)))
    assert np.all(mdp.P[:4, :, 4:].sum(axis=2) >= 0.2 - 1e-12)


def test_chain_mdp():
    mdp = T.chain_mdp(num_states=4, gamma=0.9, slip=0.25)
    assert mdp.P[0, 0, 0] == 0.75 and mdp.P[0, 0, 1] == 0.25
    assert mdp.P[3, 1, 3] == 0.75 and mdp.P[3, 1, 2] == 0.25
    np.testing.assert_allclose(mdp.P.sum(axis=2), 1.0)
    assert mdp.r[0, 0] == 0.1 and mdp.r[3, 1] == 1.0 and np.count_nonzero(mdp.r) == 2
    stay_left = np.tile([1.0, 0.0], (4, 1))
    # always-left without slip: 0.1 per step forever
    assert T.expected_return(T.chain_mdp(4, 0.9), stay_left) == pytest.approx(1.0, rel=1e-12, abs=0.0)

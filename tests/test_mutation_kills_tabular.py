"""tabular: checks that mutation testing (tools/mutation.py) showed missing. Error messages are
matched from their start (the contract: errors name the argument / say what is wrong), and the
helpers' documented contracts are checked where the public result cannot show them."""

import numpy as np
import pytest

import tabular as T
from tabular.evaluation import _reachable_from_start
from tabular.exact import ExactMDP, exact_state_occupancy


def mdp_with_unreachable_states(seed: int, gamma: float) -> tuple[T.MDP, np.ndarray]:
    """S = 6 states, the start distribution on 3 of them, which never move to the other 3 (those
    move anywhere); and a random policy."""
    rng = np.random.default_rng(seed)
    S, A = 6, 2
    perm = rng.permutation(S)
    reach, unreach = perm[:3], perm[3:]
    P = rng.random((S, A, S)) ** 2
    P[np.ix_(reach, np.arange(A), unreach)] = 0.0
    P /= P.sum(axis=-1, keepdims=True)
    rho0 = np.zeros(S)
    rho0[reach[: 1 + seed % 3]] = 1.0  # one, two or three start states
    rho0 /= rho0.sum()
    pi = rng.random((S, A))
    pi /= pi.sum(axis=1, keepdims=True)
    return T.MDP(P, rng.standard_normal((S, A)), rho0, gamma), pi


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("gamma", [0.0, 0.9])
def test_reachable_from_start_is_exactly_the_support_of_the_occupancy(seed, gamma):
    # state_occupancy zeroes the states _reachable_from_start excludes; LAPACK's LU already returns
    # exact zeros there (I - gamma P_pi^T is column diagonally dominant: no row swaps), so the
    # helper's contract ("exactly the support of the occupancy") is checked against exact rationals.
    mdp, pi = mdp_with_unreachable_states(seed, gamma)
    exact = exact_state_occupancy(ExactMDP.from_mdp(mdp), pi, normalized=False)
    support = np.array([x > 0 for x in exact])
    P_pi = T.policy_transition_matrix(mdp, pi)
    np.testing.assert_array_equal(_reachable_from_start(mdp, P_pi), support)
    assert not support.all()  # the case has unreachable states


def test_normalised_occupancy_error_message():
    P = np.zeros((2, 1, 2))
    P[:, 0, 1] = 1.0
    mdp = T.MDP(P, np.zeros((2, 1)), np.array([0.0, 1.0]), 1.0, terminal=np.array([False, True]))
    message = r"^the normalised occupancy is undefined: every start state is terminal$"
    with pytest.raises(ValueError, match=message):
        T.state_occupancy(mdp, np.ones((2, 1)))

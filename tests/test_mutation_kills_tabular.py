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


# ------------------------------------------------------------------------------------------ mdp


def three_state_arrays():
    P = np.zeros((3, 2, 3))
    P[0, 0] = [0.5, 0.5, 0.0]
    P[0, 1] = [0.0, 0.0, 1.0]
    P[1, :] = [0.25, 0.25, 0.5]
    P[2, :, 2] = 1.0
    r = np.array([[1.0, 0.0], [0.5, -1.0], [0.0, 0.0]])
    return P, r, np.array([1.0, 0.0, 0.0])


def test_negative_probability_message_names_the_first_negative_entry():
    P, r, rho0 = three_state_arrays()
    P[1, 1] = [0.75, 0.5, -0.25]  # entries < 1 come earlier; the first negative is (1, 1, 2)
    # (the value is printed with repr: "np.float64(-0.25)" under numpy 2)
    with pytest.raises(ValueError, match=r"^P has a negative probability \S*-0.25\S* at index \(1, 1, 2\)$"):
        T.MDP(P, r, rho0, 0.9)


def test_terminal_self_loop_must_be_one_to_the_atol_not_a_relative_tolerance():
    P, r, rho0 = three_state_arrays()
    P[2, :, 2] = 1.0 - 1e-6  # within rtol = 1e-5 of 1, far outside STOCHASTIC_ATOL
    P[2, :, 0] = 1e-6
    absorbing = r"^terminal state 2 must be absorbing: P\[2, a, 2\] = 1 for every a$"
    with pytest.raises(ValueError, match=absorbing):
        T.MDP(P, r, rho0, 0.9, terminal=np.array([False, False, True]))


@pytest.mark.parametrize("gamma", [1, np.float32(0.75), np.int64(0), np.float64(0.5)])
def test_gamma_is_stored_as_a_python_float(gamma):
    P, r, rho0 = three_state_arrays()
    mdp = T.MDP(P, r, rho0, gamma, terminal=np.array([False, False, True]))
    assert type(mdp.gamma) is float and mdp.gamma == float(gamma)


def test_validate_policy_default_name_is_pi():
    with pytest.raises(ValueError, match=r"^pi must have shape \[S, A\] = \(3, 2\), got \(2, 2\)$"):
        T.validate_policy(np.full((2, 2), 0.5), 3, 2)
    with pytest.raises(ValueError, match=r"^pi rows must sum to 1; row \(0,\) sums to \S*0.5\S*$"):
        T.validate_policy(np.full((3, 2), 0.25), 3, 2)


# ------------------------------------------------------------------------------------------ control


def test_backup_and_greedy_messages():
    mdp = T.MDP(*three_state_arrays(), 0.9)
    with pytest.raises(ValueError, match=r"^V contains NaN or inf$"):
        T.bellman_optimality_backup(mdp, [0.0, np.nan, 0.0])
    with pytest.raises(ValueError, match=r"^V must have shape \[S\] = \(3,\), got \(2,\)$"):
        T.bellman_optimality_backup(mdp, [0.0, 0.0])
    with pytest.raises(ValueError, match=r"^Q contains NaN or inf$"):
        T.greedy_policy([[0.0, np.inf]])
    with pytest.raises(ValueError, match=r"^Q must have shape \[S, A\], got \(2,\)$"):
        T.greedy_policy([0.0, 1.0])


def test_backup_and_greedy_take_exact_numbers_as_float64():
    from fractions import Fraction

    mdp = T.MDP(*three_state_arrays(), 0.9)
    V = [Fraction(1, 2), Fraction(-3, 4), 0]
    got = T.bellman_optimality_backup(mdp, V)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, T.bellman_optimality_backup(mdp, np.array([0.5, -0.75, 0.0])))
    Q = [[Fraction(1, 3), Fraction(2, 3)], [Fraction(1), Fraction(0)]]
    np.testing.assert_array_equal(T.greedy_policy(Q), [[0.0, 1.0], [1.0, 0.0]])


def test_tie_tolerance_grows_with_the_size_of_q():
    # tolerance TIE_RTOL (1 + max |Q|) = 1.01e-10 at |Q| = 100: a gap of 5e-11 is a tie (lowest index)
    big = T.greedy_policy([[100.0 - 5e-11, 100.0]])
    np.testing.assert_array_equal(big, [[1.0, 0.0]])
    # at |Q| ~ 0 the tolerance is 1e-12: the same gap is not a tie
    small = T.greedy_policy([[-5e-11, 0.0]])
    np.testing.assert_array_equal(small, [[0.0, 1.0]])


def test_value_iteration_default_tol_and_iteration_cap():
    gamma = 0.9
    # one state paying 1 forever: V_k = (1 - gamma^k) / (1 - gamma)
    mdp = T.MDP(np.ones((1, 1, 1)), np.ones((1, 1)), np.ones(1), gamma)
    res = T.value_iteration(mdp)  # default tol = 1e-8: V within tol / 2 of V* = 10
    assert 10.0 - res.V[0] <= 0.5e-8
    k = res.iterations
    assert T.value_iteration(mdp, max_iterations=k).iterations == k
    cap = rf"^value_iteration did not reach tol=1e-08 within {k - 1} backups$"
    with pytest.raises(RuntimeError, match=cap):
        T.value_iteration(mdp, max_iterations=k - 1)
    with pytest.raises(TypeError, match=r"^mdp must be a tabular.MDP, got str$"):
        T.value_iteration("mdp")


def test_policy_iteration_messages():
    mdp = T.MDP(*three_state_arrays(), 0.9)
    with pytest.raises(TypeError, match=r"^mdp must be a tabular.MDP, got dict$"):
        T.policy_iteration({})
    shape = r"^initial_policy must have shape \[S, A\] = \(3, 2\), got \(3, 3\)$"
    with pytest.raises(ValueError, match=shape):
        T.policy_iteration(mdp, initial_policy=np.full((3, 3), 1 / 3))
    # from the uniform (stochastic) policy one evaluation cannot end the loop
    cap = r"^policy_iteration did not converge within 1 evaluations \(S=3\)$"
    with pytest.raises(RuntimeError, match=cap):
        T.policy_iteration(mdp, initial_policy=np.full((3, 2), 0.5), max_iterations=1)


# ------------------------------------------------------------------------------------------ improvement


def two_state_bandit_mdp(gamma: float) -> T.MDP:
    """Two states, each action moves to either state with probability 1/2; r = identity, so
    under the uniform policy A = [[1/2, -1/2], [-1/2, 1/2]] and rho = [1, 1] / (2 (1 - gamma))."""
    P = np.full((2, 2, 2), 0.5)
    return T.MDP(P, np.eye(2), np.array([0.5, 0.5]), gamma)


def test_policy_arguments_are_named_in_errors():
    ok = np.full((2, 2), 0.5)
    for bad in ([["a", "b"], ["c", "d"]], [[0.5, 0.5], [1.0]]):
        with pytest.raises(TypeError, match=r"^pi must be a numeric array, got list$"):
            T.policy_total_variation(bad, ok)
    with pytest.raises(ValueError, match=r"^pi must have shape \[S, A\], got \(2,\)$"):
        T.policy_kl(np.array([0.5, 0.5]), ok)
    with pytest.raises(ValueError, match=r"^pi rows must sum to 1; row \(1,\) sums to \S*0.75\S*$"):
        T.policy_kl(np.array([[0.5, 0.5], [0.5, 0.25]]), ok)
    with pytest.raises(ValueError, match=r"^pi_new rows must sum to 1; row \(0,\) sums to \S*1.5\S*$"):
        T.policy_kl(ok, np.array([[1.0, 0.5], [0.5, 0.5]]))
    with pytest.raises(TypeError, match=r"^alpha must be a real number, got str$"):
        T.mixture(ok, ok, "0.5")
    episodic = r"^cpi_step_size needs gamma < 1: it has \(1 - gamma\) in a denominator"
    with pytest.raises(ValueError, match=episodic):
        T.cpi_step_size(T.MDP(np.ones((1, 1, 1)), np.zeros((1, 1)), np.ones(1), 1.0,
                              terminal=np.array([True])), np.ones((1, 1)), np.ones((1, 1)))


def test_policy_kl_with_zeros_in_the_new_policy_is_inf_without_a_warning():
    import warnings

    pi = np.array([[0.5, 0.5], [1.0, 0.0]])
    pi_new = np.array([[1.0, 0.0], [1.0, 0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kl = T.policy_kl(pi, pi_new)
    assert kl[0] == np.inf and kl[1] == 0.0


def test_cpi_step_size_counts_a_gain_at_rounding_level_as_zero():
    # pi_new improves state 0 and worsens state 1 by almost the same occupancy-weighted amount, so
    # g ~ 3e-12 max|Q| sits between the guard's 1e-12 max|Q| (1 - gamma) and 1e-12 max|Q| / (1 - gamma)
    # while eps = 1/4 is far from rounding level: the step size is 0 (documented guard).
    gamma = 0.9
    mdp = two_state_bandit_mdp(gamma)
    pi = np.full((2, 2), 0.5)
    max_q = float(np.abs(T.q_values(mdp, pi)).max())
    rho = T.state_occupancy(mdp, pi, normalized=False)
    t1 = 0.25
    t2 = (3e-12 * max_q - rho[0] * t1) / (-rho[1])  # g = rho0 t1 (+1) + rho1 t2 (-1)
    pi_new = np.array([[0.5 + t1, 0.5 - t1], [0.5 + t2, 0.5 - t2]])
    g = T.cpi_gain(mdp, pi, pi_new)
    noise = 1e-12 * max_q
    assert noise * (1 - gamma) < g <= noise / (1 - gamma)  # the case is inside the guard's window
    assert T.cpi_epsilon(mdp, pi, pi_new) == pytest.approx(0.25, rel=1e-9, abs=0.0)
    assert T.cpi_step_size(mdp, pi, pi_new) == 0.0


def test_trpo_lower_bound_default_divergence_is_tv():
    mdp = two_state_bandit_mdp(0.8)
    pi = np.full((2, 2), 0.5)
    pi_new = np.array([[0.7, 0.3], [0.4, 0.6]])
    assert T.trpo_lower_bound(mdp, pi, pi_new) == T.trpo_lower_bound(mdp, pi, pi_new, divergence="tv")
    assert T.trpo_lower_bound(mdp, pi, pi_new) != T.trpo_lower_bound(mdp, pi, pi_new, divergence="kl")


def test_trpo_lower_bound_with_a_zero_coefficient_ignores_an_infinite_kl():
    # gamma = 0: coefficient 4 eps gamma / (1 - gamma)^2 = 0 and KL = inf; the penalty is 0, not NaN
    mdp = two_state_bandit_mdp(0.0)
    pi = np.full((2, 2), 0.5)
    pi_new = np.array([[1.0, 0.0], [0.5, 0.5]])
    bound = T.trpo_lower_bound(mdp, pi, pi_new, divergence="kl")
    assert bound == T.surrogate(mdp, pi, pi_new)


# ------------------------------------------------------------------------------------------ gradients


def test_softmax_is_shifted_per_state():
    # rows of very different scale: a shift by the global max would underflow the second row to 0/0
    theta = np.array([[1000.0, 999.0], [0.0, -1.0]])
    expected_row = np.array([1.0, np.exp(-1.0)]) / (1.0 + np.exp(-1.0))
    pi = T.softmax_policy(theta)
    np.testing.assert_allclose(pi, [expected_row, expected_row], rtol=4 * np.finfo(float).eps)
    mdp = two_state_bandit_mdp(0.5)
    # KL(pi_theta || pi_theta) = 0 exactly per state; the shift must not turn a row into -inf - -inf
    assert T.mean_kl(mdp, theta, theta) == 0.0
    theta_new = np.array([[1000.0, 1000.0], [0.0, 0.0]])
    p = expected_row
    kl_state = float(p @ (np.log(p) - np.log([0.5, 0.5])))
    # d is uniform here (symmetric MDP), so the mean KL is the per-state KL; a few ulps of log terms
    assert T.mean_kl(mdp, theta, theta_new) == pytest.approx(kl_state, rel=1e-13, abs=0.0)


def test_theta_errors_name_the_argument():
    mdp = two_state_bandit_mdp(0.5)
    with pytest.raises(TypeError, match=r"^theta must be a numeric array, got str$"):
        T.softmax_policy("abc")
    with pytest.raises(ValueError, match=r"^theta must have shape \[S, A\], got \(2,\)$"):
        T.softmax_policy(np.zeros(2))
    with pytest.raises(ValueError, match=r"^theta contains NaN or inf$"):
        T.softmax_policy(np.array([[0.0, np.nan]]))
    with pytest.raises(ValueError, match=r"^theta_new must have shape \[S, A\] = \(2, 2\), got \(2, 3\)$"):
        T.mean_kl(mdp, np.zeros((2, 2)), np.zeros((2, 3)))
    with pytest.raises(TypeError, match=r"^theta_new must be a numeric array, got str$"):
        T.mean_kl(mdp, np.zeros((2, 2)), "x")

    with pytest.raises(ValueError, match=r"^theta must have shape \[S, A\] = \(2, 2\), got \(3, 2\)$"):
        T.mean_kl(mdp, np.zeros((3, 2)), np.zeros((2, 2)))
    message = r"^natural_gradient_closed_form needs gamma < 1: it divides by \(1 - gamma\)$"
    with pytest.raises(ValueError, match=message):
        T.natural_gradient_closed_form(two_state_bandit_mdp(1.0), np.zeros((2, 2)))


@pytest.mark.parametrize("seed", range(2))
def test_natural_gradients_are_zero_on_unreachable_states(seed):
    """mdp.md eq. (36)-(37): states with d = 0 get 0 (F has a zero block there; both forms)."""
    mdp, _ = mdp_with_unreachable_states(seed, 0.9)
    theta = np.random.default_rng(seed).standard_normal((mdp.num_states, mdp.num_actions))
    unreachable = T.state_occupancy(mdp, T.softmax_policy(theta)) == 0.0
    assert unreachable.sum() == 3
    for f in (T.natural_gradient, T.natural_gradient_closed_form):
        result = f(mdp, theta)
        assert np.all(result[unreachable] == 0.0) and np.all(np.any(result[~unreachable] != 0.0, axis=1))


def test_natural_gradient_counts_eigenvalues_below_1e_12_of_the_largest_as_zero():
    """The documented cutoff of natural_gradient's pseudo-inverse: in a state with
    pi = (~1/2, ~1/2, 4.7e-14) the block M = diag pi - pi pi^T has an eigenvalue ~4.7e-14, below
    1e-12 times its largest (~1/2), so the result has no component along its eigenvector (numpy's
    default cutoff, a few eps, would keep it: about 1.3 here). Near-deterministic states therefore
    differ from natural_gradient_closed_form by design."""
    theta = np.array([[0.0, 0.0, -30.0], [0.0, 1.0, 2.0]])
    rewards = np.array([[1.0, -1.0, 2.0], [0.5, 0.0, -0.5]])
    P = np.zeros((2, 3, 2))
    P[:, :, 1] = 1.0
    mdp = T.MDP(P, rewards, np.array([0.5, 0.5]), 0.9)
    pi = T.softmax_policy(theta)
    eigenvalues, vectors = np.linalg.eigh(np.diag(pi[0]) - np.outer(pi[0], pi[0]))
    assert eigenvalues[1] < 1e-12 * eigenvalues[2] and eigenvalues[1] > 1e-15
    row = T.natural_gradient(mdp, theta)[0]
    # rounding: the kept part has norm ~1; its projection on an orthogonal unit vector is ~eps
    assert abs(vectors[:, 1] @ row) <= 1e-12 * np.linalg.norm(row)
    assert abs(vectors[:, 1] @ T.natural_gradient_closed_form(mdp, theta)[0]) > 0.1


# ------------------------------------------------------------------------------------------ exact


def test_to_rational_of_integers_and_bad_input():
    from fractions import Fraction

    import sympy

    from tabular.exact import to_rational

    assert to_rational(3) == sympy.Integer(3) and isinstance(to_rational(3), sympy.Integer)
    assert to_rational(np.int64(-2)) == sympy.Integer(-2)
    assert to_rational(2**70 + 1) == sympy.Integer(2**70 + 1)
    assert to_rational(Fraction(-3, 4)) == sympy.Rational(-3, 4)
    assert to_rational(0.1) == sympy.Rational(3602879701896397, 36028797018963968)  # the binary value
    with pytest.raises(TypeError, match=r"^expected a number, got a bool$"):
        to_rational(True)
    with pytest.raises(TypeError, match=r"^expected a number, got a bool$"):
        to_rational(np.bool_(False))
    with pytest.raises(ValueError, match=r"^expected a finite number, got nan$"):
        to_rational(float("nan"))
    with pytest.raises(TypeError, match=r"^expected an int, float, Fraction or sympy Rational, got str$"):
        to_rational("1")


def test_rational_array_keeps_every_entry_exact():
    import sympy

    from tabular.exact import rational_array

    # a float64 array would round 2^60 + 1 to 2^60
    got = rational_array([[2**60 + 1, 0.5], [-3, 0.25]])
    assert got.dtype == object and got.shape == (2, 2)
    assert list(got.ravel()) == [sympy.Integer(2**60 + 1), sympy.Rational(1, 2), sympy.Integer(-3),
                                 sympy.Rational(1, 4)]


def test_exact_mdp_validation_messages_come_from_tabular_mdp():
    with pytest.raises(ValueError, match=r"^P must have shape \[S, A, S\] with S, A >= 1, got \(0, 0, 0\)$"):
        ExactMDP.from_arrays(np.zeros((0, 0, 0)), np.zeros((0, 0)), np.zeros(0), 0.5)


def test_exact_normalised_occupancy_error_message():
    P = np.zeros((2, 1, 2))
    P[:, 0, 1] = 1.0
    emdp = ExactMDP.from_arrays(P, np.zeros((2, 1)), [0, 1], 1, terminal=np.array([False, True]))
    message = r"^the normalised occupancy is undefined: every start state is terminal$"
    with pytest.raises(ValueError, match=message):
        exact_state_occupancy(emdp, np.ones((2, 1)))


def test_exact_evaluation_when_every_state_is_terminal():
    # gamma = 1 with every state terminal: no linear system is left (n = 0); V = 0 and rho = 0
    import sympy

    from tabular.exact import exact_policy_evaluation

    P = np.zeros((2, 1, 2))
    P[0, 0, 0] = P[1, 0, 1] = 1.0
    emdp = ExactMDP.from_arrays(P, np.zeros((2, 1)), [1, 0], 1, terminal=np.array([True, True]))
    pi = np.ones((2, 1))
    assert list(exact_policy_evaluation(emdp, pi)) == [sympy.Integer(0)] * 2
    assert list(exact_state_occupancy(emdp, pi, normalized=False)) == [sympy.Integer(0)] * 2


def test_improper_policy_at_gamma_one_full_message():
    P = np.zeros((2, 1, 2))
    P[0, 0, 1] = P[1, 0, 0] = 1.0  # a two-state cycle, no terminal state
    mdp = T.MDP(P, np.zeros((2, 1)), np.array([1.0, 0.0]), 1.0)
    message = (r"^gamma = 1 requires a policy that reaches a terminal state with probability 1 from every "
               r"state; from states \[0, 1\] it does not \(use gamma < 1 or mark terminal states\)$")
    with pytest.raises(ValueError, match=message):
        T.policy_evaluation(mdp, np.ones((2, 1)))


def test_tie_tolerance_boundaries():
    # at max |Q| = 1 the tolerance is exactly TIE_RTOL (1 + 1) = 2e-12, and "within" includes the
    # boundary: 1 - 2e-12 is the same double greedy_policy computes as max - tolerance
    np.testing.assert_array_equal(T.greedy_policy([[1.0 - 2e-12, 1.0]]), [[1.0, 0.0]])
    np.testing.assert_array_equal(T.greedy_policy([[-1.5e-12, 0.0]]), [[0.0, 1.0]])


def test_greedy_current_must_match_the_states():
    prefix = r"^current must be an int array of shape \[S\] = \(2,\), got "
    with pytest.raises(ValueError, match=prefix + r"\(3,\)$"):
        T.greedy_policy(np.zeros((2, 2)), current=np.array([0, 1, 0]))
    with pytest.raises(ValueError, match=prefix + r"\(2,\)$"):
        T.greedy_policy(np.zeros((2, 2)), current=np.array([0.0, 1.0]))


def test_value_iteration_stops_when_delta_equals_the_threshold():
    # one state paying 1, gamma = 1/2: delta after backup k is 2^-(k-1); tol = 2^-2 makes the threshold
    # tol (1 - gamma) / (2 gamma) = 2^-3 exactly, met with equality at backup 4
    mdp = T.MDP(np.ones((1, 1, 1)), np.ones((1, 1)), np.ones(1), 0.5)
    res = T.value_iteration(mdp, tol=0.25)
    assert res.iterations == 4 and res.V[0] == 1.875
    np.testing.assert_array_equal(res.Q, [[1.875]])  # r + gamma V_3 = 1 + 0.875
    message = (r"^value_iteration needs gamma < 1: its stopping bound gamma delta / \(1 - gamma\) is "
               r"infinite at gamma = 1 \(use policy_iteration for episodic MDPs\)$")
    episodic = T.MDP(np.ones((1, 1, 1)), np.zeros((1, 1)), np.ones(1), 1.0, terminal=np.array([True]))
    with pytest.raises(ValueError, match=message):
        T.value_iteration(episodic)


def test_policy_iteration_iteration_cap_and_stochastic_start():
    mdp = T.MDP(*three_state_arrays(), 0.9)
    uniform = np.full((3, 2), 0.5)
    k = T.policy_iteration(mdp, initial_policy=uniform).iterations
    assert k >= 2
    assert T.policy_iteration(mdp, initial_policy=uniform, max_iterations=k).iterations == k
    # all actions tied (zero rewards): a stochastic start is improved greedily, ties to the lowest index
    flat = T.MDP(np.full((2, 2, 2), 0.5), np.zeros((2, 2)), np.array([0.5, 0.5]), 0.9)
    res = T.policy_iteration(flat, initial_policy=np.array([[0.2, 0.8], [0.3, 0.7]]))
    np.testing.assert_array_equal(res.policy, [[1.0, 0.0], [1.0, 0.0]])


def test_mdp_type_errors_name_the_argument_and_its_type():
    P, r, rho0 = three_state_arrays()
    with pytest.raises(TypeError, match=r"^P must be a numeric array, got str$"):
        T.MDP("abc", r, rho0, 0.9)
    with pytest.raises(TypeError, match=r"^gamma must be a real number, got str$"):
        T.MDP(P, r, rho0, "0.9")


def test_mdp_arrays_are_frozen_float64_copies():
    P, r, rho0 = three_state_arrays()
    mdp = T.MDP(P.tolist(), r.tolist(), [1, 0, 0], 0.9, terminal=np.array([False, False, True]))
    for name in ("P", "r", "rho0", "terminal"):
        arr = getattr(mdp, name)
        assert isinstance(arr, np.ndarray) and not arr.flags.writeable, name
    assert mdp.rho0.dtype == np.float64 and mdp.P.dtype == np.float64 and mdp.r.dtype == np.float64


def test_terminal_self_loop_atol_is_stochastic_atol():
    P, r, rho0 = three_state_arrays()
    # rows still sum to 1; 5e-9 > STOCHASTIC_ATOL = 1e-9 (numpy's default atol would be 1e-8)
    P[2, :, 2] = 1.0 - 5e-9
    P[2, :, 0] = 5e-9
    with pytest.raises(ValueError, match=r"^terminal state 2 must be absorbing"):
        T.MDP(P, r, rho0, 0.9, terminal=np.array([False, False, True]))


def test_reaches_terminal_surely_looks_beyond_one_step():
    # s0 -> s1; s1 -> terminal s3 or trap s2 (1/2 each): every state one step from s0 can reach the
    # terminal, but s0 reaches the trap in two steps
    P = np.zeros((4, 1, 4))
    P[0, 0, 1] = 1.0
    P[1, 0, [2, 3]] = 0.5
    P[2, 0, 2] = 1.0
    P[3, 0, 3] = 1.0
    terminal = np.array([False, False, False, True])
    mdp = T.MDP(P, np.zeros((4, 1)), np.array([1.0, 0, 0, 0]), 1.0, terminal=terminal)
    np.testing.assert_array_equal(T.reaches_terminal_surely(mdp, np.ones((4, 1))), terminal)


def test_exact_path_with_a_terminal_state_that_is_not_last():
    # gamma = 1 solves on the non-terminal states only; with the terminal state first, idx = [1, 2]
    # (rows AND columns of P_pi must be restricted to it)
    P = np.zeros((3, 2, 3))
    P[0, :, 0] = 1.0  # terminal
    P[1, 0] = [0.5, 0.0, 0.5]
    P[1, 1] = [0.25, 0.75, 0.0]
    P[2, 0] = [0.5, 0.5, 0.0]
    P[2, 1] = [1.0, 0.0, 0.0]
    r = np.array([[0.0, 0.0], [1.0, -0.5], [2.0, 0.25]])
    terminal = np.array([True, False, False])
    emdp = ExactMDP.from_arrays(P, r, [0, 0.5, 0.5], 1, terminal=terminal)
    np.testing.assert_array_equal(emdp.terminal, terminal)
    pi = np.array([[0.5, 0.5], [0.25, 0.75], [0.5, 0.5]])
    from tabular.exact import exact_policy_evaluation, exact_state_action_occupancy

    V = np.array([float(x) for x in exact_policy_evaluation(emdp, pi)])
    rho = np.array([float(x) for x in exact_state_occupancy(emdp, pi, normalized=False)])
    # the float path solves the same systems; a few ulps of values of size ~10
    np.testing.assert_allclose(V, T.policy_evaluation(emdp.mdp, pi), rtol=0, atol=1e-13)
    np.testing.assert_allclose(rho, T.state_occupancy(emdp.mdp, pi, normalized=False), rtol=0, atol=1e-13)
    assert V[0] == 0.0 and rho[0] == 0.0
    sa = exact_state_action_occupancy(emdp, pi, normalized=False)
    assert (sa == exact_state_occupancy(emdp, pi, normalized=False)[:, None] * rational_pi(pi)).all()


def rational_pi(pi):
    from tabular.exact import rational_array

    return rational_array(pi)


def test_bounds_name_themselves_and_the_mdp_argument():
    pi = np.full((1, 1), 1.0)
    episodic = T.MDP(np.ones((1, 1, 1)), np.zeros((1, 1)), np.ones(1), 1.0, terminal=np.array([True]))
    for name, call_bound in (("cpi_lower_bound", lambda m: T.cpi_lower_bound(m, pi, pi, 0.5)),
                             ("trpo_lower_bound", lambda m: T.trpo_lower_bound(m, pi, pi))):
        message = rf"^{name} needs gamma < 1: it has \(1 - gamma\) in a denominator"
        with pytest.raises(ValueError, match=message):
            call_bound(episodic)
        with pytest.raises(TypeError, match=r"^mdp must be a tabular.MDP, got str$"):
            call_bound("mdp")

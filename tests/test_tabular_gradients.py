"""Softmax policy gradients, Fisher matrix, natural gradient (spec: specs/mdp.md section 6).

Finite differences (central, Richardson-extrapolated: error O(h^4)) and a sympy Hessian are the
independent references; the natural gradient is checked against its closed form and against the
two properties that define the minimum-norm solution.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

import tabular as T
from tabular.gradients import softmax_policy
from tests.strategies import episodic_mdps, mdps, softmax_params


def mdp_and_theta(mdp_strategy):
    return mdp_strategy.flatmap(lambda m: st.tuples(st.just(m), softmax_params(m.num_states, m.num_actions)))


def richardson_derivative(f, x: np.ndarray, direction: np.ndarray, h: float = 1e-3) -> float:
    """Directional derivative by central differences with one Richardson step (error O(h^4))."""

    def central(step):
        return (f(x + step * direction) - f(x - step * direction)) / (2 * step)

    return (4 * central(h / 2) - central(h)) / 3


def fd_gradient(f, theta: np.ndarray, h: float = 1e-3) -> np.ndarray:
    grad = np.zeros_like(theta)
    for idx in np.ndindex(theta.shape):
        e = np.zeros_like(theta)
        e[idx] = 1.0
        grad[idx] = richardson_derivative(f, theta, e, h)
    return grad


def scale(mdp):
    # gamma = 1: episodic_mdps terminates w.p. >= 1/24 per step, so episodes last < 100 steps on average
    horizon = 1.0 / (1.0 - mdp.gamma) if mdp.gamma < 1 else 100.0
    return max(1.0, float(np.abs(mdp.r).max(initial=0.0)) * horizon)


def J_of(mdp):
    return lambda th: T.expected_return(mdp, softmax_policy(th))


ANY = st.one_of(mdps(gamma=st.floats(0.0, 0.9)), episodic_mdps(max_states=4))


# -------------------------------------------------------------------------------- softmax
@given(st.integers(1, 4).flatmap(lambda s: softmax_params(s, 3, scale=50.0)), st.floats(-100, 100))
def test_softmax_policy_is_a_stable_row_stochastic_map(theta, shift):
    pi = softmax_policy(theta)
    assert np.all(np.isfinite(pi)) and np.all(pi >= 0)
    np.testing.assert_allclose(pi.sum(axis=1), 1.0, rtol=0, atol=1e-15)
    np.testing.assert_allclose(softmax_policy(theta + shift), pi, rtol=1e-12, atol=1e-300)
    expected = np.exp(theta - theta.max(axis=1, keepdims=True))
    np.testing.assert_allclose(pi, expected / expected.sum(axis=1, keepdims=True), rtol=1e-13)
    assert np.all(np.isfinite(softmax_policy(np.array([[1000.0, -1000.0, 0.0]]))))


# -------------------------------------------------------------------------------- policy gradient
@given(mdp_and_theta(ANY))
def test_policy_gradient_equals_finite_differences(case):
    mdp, theta = case
    grad = T.policy_gradient(mdp, theta)
    np.testing.assert_allclose(grad, fd_gradient(J_of(mdp), theta), rtol=0, atol=1e-8 * scale(mdp))
    # the softmax closed form rho(s) pi(a|s) A(s, a)
    pi = softmax_policy(theta)
    rho = T.state_occupancy(mdp, pi, normalized=False)
    np.testing.assert_allclose(
        grad, rho[:, None] * pi * T.advantages(mdp, pi), rtol=0, atol=1e-12 * scale(mdp)
    )


@given(mdp_and_theta(ANY))
def test_surrogate_matches_J_in_value_and_gradient_at_theta(case):
    # Schulman et al. 2015, eq. (4): L_{theta}(theta') and J(theta') agree to first order at theta' = theta.
    mdp, theta = case
    pi = softmax_policy(theta)
    assert T.surrogate(mdp, pi, pi) == pytest.approx(
        T.expected_return(mdp, pi), rel=1e-12, abs=1e-12 * scale(mdp)
    )

    def L(th_new):
        return T.surrogate(mdp, pi, softmax_policy(th_new))

    np.testing.assert_allclose(
        fd_gradient(L, theta), T.policy_gradient(mdp, theta), rtol=0, atol=1e-8 * scale(mdp)
    )


# ----------------------------------------------------------------------------------- Fisher matrix
@given(mdp_and_theta(mdps(max_states=3, gamma=st.floats(0.0, 0.9))))
def test_fisher_matrix_is_the_hessian_of_the_mean_kl(case):
    mdp, theta = case
    F = T.fisher_matrix(mdp, theta)
    n = theta.size
    x0 = theta.reshape(-1)

    def grad_i(i):
        # d/dx_i of mean_kl at x, as a function of x, by Richardson central differences
        e = np.zeros(n)
        e[i] = 1.0
        return lambda x: richardson_derivative(
            lambda y: T.mean_kl(mdp, theta, y.reshape(theta.shape)), x, e, 1e-3
        )

    H = np.zeros((n, n))
    for i in range(n):
        gi = grad_i(i)
        for j in range(n):
            e = np.zeros(n)
            e[j] = 1.0
            H[i, j] = richardson_derivative(gi, x0, e, 1e-2)
    np.testing.assert_allclose(F, H, rtol=0, atol=1e-7)
    assert T.mean_kl(mdp, theta, theta) == 0.0


@given(
    mdps(max_states=4, gamma=st.floats(0.0, 0.9)).flatmap(
        lambda m: st.tuples(
            st.just(m),
            softmax_params(m.num_states, m.num_actions),
            softmax_params(m.num_states, m.num_actions),
        )
    )
)
def test_mean_kl_value_old_policy_first(case):
    # E_{s ~ d_theta}[KL(pi_theta(.|s) || pi_theta_new(.|s))]: occupancy and expectation of the OLD theta.
    mdp, theta, theta_new = case
    pi, pi_new = softmax_policy(theta), softmax_policy(theta_new)
    d = T.state_occupancy(mdp, pi)
    expected = 0.0
    for s in range(mdp.num_states):
        for a in range(mdp.num_actions):
            expected += d[s] * pi[s, a] * np.log(pi[s, a] / pi_new[s, a])
    assert T.mean_kl(mdp, theta, theta_new) == pytest.approx(expected, rel=1e-10, abs=1e-14)


def test_fisher_matrix_equals_sympy_hessian_of_the_mean_kl():
    mdp = T.random_mdp(5, num_states=2, num_actions=3, gamma=0.8)
    theta = np.array([[0.3, -1.2, 0.5], [2.0, 0.1, -0.7]])
    d = T.state_occupancy(mdp, softmax_policy(theta))  # fixed weights: the old policy's occupancy
    x = sympy.symbols("x0:6")
    old = [[sympy.Rational(*v.as_integer_ratio()) for v in row] for row in theta]
    kl = 0
    for s in range(2):
        new_logits = x[3 * s : 3 * s + 3]
        log_z_new = sympy.log(sum(sympy.exp(v) for v in new_logits))
        z_old = sum(sympy.exp(v) for v in old[s])
        for a in range(3):
            p_old = sympy.exp(old[s][a]) / z_old
            log_p_new = new_logits[a] - log_z_new
            kl += d[s] * p_old * (sympy.log(p_old) - log_p_new)
    hess = sympy.hessian(kl, x)
    at = dict(zip(x, [sympy.Rational(*v.as_integer_ratio()) for v in theta.reshape(-1)], strict=True))
    H = np.array(hess.subs(at).evalf(30), dtype=float)
    np.testing.assert_allclose(T.fisher_matrix(mdp, theta), H, rtol=1e-12, atol=1e-15)


@given(mdp_and_theta(ANY))
def test_fisher_matrix_is_the_expected_outer_product_of_scores(case):
    mdp, theta = case
    pi = softmax_policy(theta)
    d = T.state_occupancy(mdp, pi)
    S, A = theta.shape
    F = np.zeros((S * A, S * A))
    for s in range(S):
        for a in range(A):
            score = np.zeros((S, A))
            score[s] = -pi[s]
            score[s, a] += 1.0  # d log pi(a|s) / d theta[s, .] = e_a - pi(.|s)
            F += d[s] * pi[s, a] * np.outer(score.reshape(-1), score.reshape(-1))
    np.testing.assert_allclose(T.fisher_matrix(mdp, theta), F, rtol=0, atol=1e-14)
    ones_per_state = np.kron(np.eye(S), np.ones((1, A)))  # [S, S*A]: the null space
    np.testing.assert_allclose(T.fisher_matrix(mdp, theta) @ ones_per_state.T, 0.0, atol=1e-15)


# ------------------------------------------------------------------------------ natural gradient
@given(mdp_and_theta(mdps(gamma=st.floats(0.0, 0.95))))
def test_natural_gradient_equals_centred_advantage_over_one_minus_gamma(case):
    mdp, theta = case
    pi = softmax_policy(theta)
    adv = T.advantages(mdp, pi)
    d = T.state_occupancy(mdp, pi)
    ng = T.natural_gradient(mdp, theta)
    expected = (adv - adv.mean(axis=1, keepdims=True)) / (1 - mdp.gamma)
    reached = d > 0
    tol = 1e-9 * scale(mdp) / max(float(pi.min()), 1e-3)  # pinv of a block with small pi loses digits
    np.testing.assert_allclose(ng[reached], expected[reached], rtol=0, atol=tol)
    np.testing.assert_array_equal(ng[~reached], 0.0)
    np.testing.assert_allclose(
        T.natural_gradient_closed_form(mdp, theta), np.where(reached[:, None], expected, 0.0)
    )


@given(mdp_and_theta(ANY))
def test_natural_gradient_is_the_minimum_norm_solution(case):
    # x = F^+ g  <=>  F x = g and x orthogonal to the null space of F (per state: the ones vector,
    # and the whole block for states with d = 0).
    mdp, theta = case
    S, A = theta.shape
    x = T.natural_gradient(mdp, theta)
    F = T.fisher_matrix(mdp, theta)
    g = T.policy_gradient(mdp, theta)
    pi = softmax_policy(theta)
    tol = 1e-9 * scale(mdp) / max(float(pi.min()), 1e-3)
    np.testing.assert_allclose(F @ x.reshape(-1), g.reshape(-1), rtol=0, atol=tol)
    np.testing.assert_allclose(x.sum(axis=1), 0.0, atol=tol * A)
    d = T.state_occupancy(mdp, pi)
    np.testing.assert_array_equal(x[d == 0], 0.0)
    if mdp.gamma == 1.0:
        # gamma = 1: (A - mean_a A) times the expected episode length sum_s rho(s)
        adv = T.advantages(mdp, pi)
        length = T.state_occupancy(mdp, pi, normalized=False).sum()
        centred = (adv - adv.mean(axis=1, keepdims=True)) * length
        np.testing.assert_allclose(x[d > 0], centred[d > 0], rtol=0, atol=tol * length)
        with pytest.raises(ValueError, match="gamma < 1"):
            T.natural_gradient_closed_form(mdp, theta)


def test_gradient_functions_reject_bad_theta():
    mdp = T.random_mdp(0, num_states=3, num_actions=2, gamma=0.9)
    good = np.zeros((3, 2))
    for fn in (T.policy_gradient, T.fisher_matrix, T.natural_gradient, T.natural_gradient_closed_form):
        with pytest.raises(ValueError, match="theta"):
            fn(mdp, np.zeros((3, 3)))
        with pytest.raises(ValueError, match="theta"):
            fn(mdp, np.zeros(6))
        with pytest.raises(ValueError, match="NaN"):
            fn(mdp, np.where(np.eye(3, 2) > 0, np.nan, 0.0))
        with pytest.raises(TypeError, match="theta"):
            fn(mdp, "theta")
    with pytest.raises(ValueError, match="theta_new"):
        T.mean_kl(mdp, good, np.full((3, 2), np.inf))
    with pytest.raises(ValueError, match="theta"):
        softmax_policy(np.zeros(3))


def test_package_exports_one_softmax_policy():
    # tabular.sequences reuses the MDP softmax; the package-level name must be this one.
    assert T.softmax_policy is softmax_policy

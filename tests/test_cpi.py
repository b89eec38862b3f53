"""refimpl.cpi against tabular ground truth (spec: specs/trust_region.md section 5; Kakade & Langford 2002).

Each piece (trust_region.md: greedy step (15), g and eps (16), step size (17), mixture (13), bound (14))
equals tabular.improvement's independent implementation; the whole loop with exact advantages
satisfies the improvement bound (14) at every iteration, never decreases J, converges to J* within
the stated number of iterations, and stops cleanly at an optimal policy.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tabular
from refimpl import cpi
from tabular.examples import random_mdp
from tests.strategies import mdps, policies


def t64(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def exact_inputs(mdp, pi):
    """Exact advantages and normalised occupancy of pi, as torch tensors."""
    return t64(tabular.advantages(mdp, pi)), t64(tabular.state_occupancy(mdp, pi, normalized=True))


# ----------------------------------------------------------------------------- the pieces
@given(data=st.data())
def test_greedy_policy_maximises_the_importance_weighted_surrogate(data):
    # trust_region.md eq. (15): sum_a pi'(a|s) A(s, a) is maximal at the greedy pi' among all policies.
    mdp = data.draw(mdps(max_states=5, max_actions=4, gamma=0.9))
    S, A = mdp.num_states, mdp.num_actions
    pi = data.draw(policies(S, A, "positive"))
    other = data.draw(policies(S, A))
    adv = tabular.advantages(mdp, pi)
    greedy = cpi.greedy_policy(t64(adv)).numpy()
    assert np.array_equal(greedy.sum(axis=1), np.ones(S)) and set(np.unique(greedy)) <= {0.0, 1.0}
    best = (greedy * adv).sum(axis=1)
    assert np.allclose(best, adv.max(axis=1), rtol=0, atol=0)
    assert np.all((other * adv).sum(axis=1) <= best + 1e-12 * np.abs(adv).sum(axis=1))


def test_greedy_policy_breaks_ties_towards_the_lowest_action():
    adv = t64([[0.5, 0.5, -1.0], [-2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert torch.equal(cpi.greedy_policy(adv), t64([[1, 0, 0], [0, 1, 0], [1, 0, 0]]))


@given(data=st.data())
def test_bound_parameters_step_size_and_bound_equal_tabular(data):
    mdp = data.draw(mdps(max_states=5, max_actions=3, gamma=st.floats(0.05, 0.95)))
    S, A = mdp.num_states, mdp.num_actions
    pi, target = data.draw(policies(S, A)), data.draw(policies(S, A))
    alpha = data.draw(st.floats(0.0, 1.0))
    adv, d = exact_inputs(mdp, pi)
    g, eps = cpi.cpi_bound_parameters(t64(target), adv, d, mdp.gamma)
    g_ref, eps_ref = tabular.cpi_gain(mdp, pi, target), tabular.cpi_epsilon(mdp, pi, target)
    # Rounding level: A = Q - V carries errors of order eps |Q|, so the floor scales with |Q|.
    scale = 1e-12 * (np.abs(tabular.q_values(mdp, pi)).max() + 1.0) / (1.0 - mdp.gamma)
    assert math.isclose(g, g_ref, rel_tol=1e-10, abs_tol=scale)
    assert math.isclose(eps, eps_ref, rel_tol=1e-10, abs_tol=scale)
    alpha_star = cpi.cpi_step_size(g, eps, mdp.gamma)
    if g_ref > 1e3 * scale:
        assert math.isclose(alpha_star, tabular.cpi_step_size(mdp, pi, target), rel_tol=1e-9)
    else:  # g at rounding level (e.g. pi optimal): the ratio g / eps is noise, the gain alpha g is not
        assert alpha_star * g <= 1e3 * scale
    j = tabular.expected_return(mdp, pi)
    assert math.isclose(j + cpi.cpi_improvement_bound(g, eps, alpha, mdp.gamma),
                        tabular.cpi_lower_bound(mdp, pi, target, alpha), rel_tol=1e-9, abs_tol=1e-11)
    assert np.allclose(cpi.mixture_policy(t64(pi), t64(target), alpha).numpy(),
                       tabular.mixture(pi, target, alpha), rtol=0, atol=1e-15)


def test_step_size_closed_form_cases():
    # (61): min(1, (1 - gamma)^2 g / (4 gamma eps)); 0 when g <= 0; 1 when gamma = 0.
    assert cpi.cpi_step_size(0.2, 1.0, 0.5) == pytest.approx(0.25 * 0.2 / 2.0, rel=1e-15, abs=0.0)
    assert cpi.cpi_step_size(100.0, 1.0, 0.5) == 1.0
    assert cpi.cpi_step_size(0.0, 1.0, 0.5) == 0.0
    assert cpi.cpi_step_size(0.0, 0.0, 0.5) == 0.0  # g = eps = 0 (pi optimal): no step, not alpha = 1
    assert cpi.cpi_step_size(-0.3, 1.0, 0.5) == 0.0
    # subnormal g and eps (4 gamma eps would underflow to 0): the ratio g / eps = 1 decides
    assert cpi.cpi_step_size(1e-323, 1e-323, 0.05) == 1.0
    assert cpi.cpi_step_size(1e-323, 1e-323, 0.9) == pytest.approx(0.01 / 3.6, rel=1e-15, abs=0.0)
    assert cpi.cpi_step_size(0.3, 1.0, 0.0) == 1.0
    assert cpi.cpi_improvement_bound(0.2, 1.0, 0.05, 0.5) == pytest.approx(
        0.01 - 2 * 0.5 * 0.0025 / 0.25, abs=0.0
    )


# ----------------------------------------------------------------------------- the loop
#: Stated iteration budgets for J* - J <= 1e-3 (J* - J(uniform)) from the uniform policy, random
#: MDPs with S <= 8, A <= 4 (tabular.examples.random_mdp, dense and 50 % sparse transitions). The
#: step (trust_region.md eq. (17)) is at most (1 - gamma)^2 / (4 gamma) * g / eps, so the budget grows like
#: 1 / (1 - gamma)^2; measured maxima over 25 MDPs were 61 (gamma = 0.5) and 476 (gamma = 0.9).
CPI_ITERATION_BUDGET = {0.5: 150, 0.9: 1000}


def run_exact_cpi(mdp, budget):
    """CPI from the uniform policy with exact A and d; checks trust_region.md eq. (14) and monotonicity every
    step."""
    S, A = mdp.num_states, mdp.num_actions
    j_star = float(mdp.rho0 @ tabular.policy_iteration(mdp).V)
    pi = np.full((S, A), 1.0 / A)
    j_uniform = j = tabular.expected_return(mdp, pi)
    for k in range(budget):
        if j_star - j <= 1e-3 * (j_star - j_uniform):
            return k
        adv, d = exact_inputs(mdp, pi)
        step = cpi.cpi_step(t64(pi), adv, d, mdp.gamma)
        assert not step.stopped  # not yet optimal, so the greedy gain is positive
        g, eps = step.g, step.eps
        if k % 20 == 0:  # exact g, eps independently from tabular (every step would cost 2x)
            target = step.target_policy.numpy()
            assert math.isclose(g, tabular.cpi_gain(mdp, pi, target), rel_tol=1e-9)
            assert math.isclose(eps, tabular.cpi_epsilon(mdp, pi, target), rel_tol=1e-9)
        # alpha is trust_region.md eq. (17) and the bound (14) at that alpha is positive and holds.
        alpha_star = min(1.0, (1 - mdp.gamma) ** 2 * g / (4 * mdp.gamma * eps))
        assert math.isclose(step.alpha, alpha_star, rel_tol=1e-12)
        bound = step.alpha * g - 2.0 * mdp.gamma * eps * step.alpha**2 / (1.0 - mdp.gamma) ** 2
        assert bound > 0.0 and math.isclose(step.improvement_bound, bound, rel_tol=1e-9)
        pi = step.policy.numpy()
        j_new = tabular.expected_return(mdp, pi)
        assert j_new - j >= bound - 1e-12 * abs(j), (k, j_new - j, bound)
        assert j_new >= j
        j = j_new
    raise AssertionError(f"CPI did not reach 1e-3 of the range within {budget} iterations")


@pytest.mark.parametrize("gamma, seeds", [(0.5, range(8)), (0.9, range(100, 103))])
def test_exact_cpi_obeys_the_bound_and_converges_within_the_stated_budget(gamma, seeds):
    for seed in seeds:
        rng = np.random.default_rng(seed)
        S, A = int(rng.integers(2, 9)), int(rng.integers(2, 5))
        mdp = random_mdp(rng, S, A, gamma=gamma, zero_fraction=float(rng.choice([0.0, 0.5])))
        iterations = run_exact_cpi(mdp, CPI_ITERATION_BUDGET[gamma])
        assert iterations >= 1


def test_cpi_stops_cleanly_at_an_optimal_policy():
    mdp = random_mdp(3, 6, 3, gamma=0.9)
    optimal = tabular.policy_iteration(mdp).policy
    adv, d = exact_inputs(mdp, optimal)
    # In exact arithmetic g = 0 here; in float64 it is rounding noise of order 1e-16 |V|.
    rounding = 1e-12 * np.abs(tabular.policy_evaluation(mdp, optimal)).max() / (1.0 - mdp.gamma)
    step = cpi.cpi_step(t64(optimal), adv, d, mdp.gamma, min_gain=rounding)
    assert step.stopped and step.alpha == 0.0 and step.improvement_bound == 0.0
    assert abs(step.g) <= rounding
    assert torch.equal(step.policy, t64(optimal))
    # A policy that is one small mixture step away from optimal does not stop at that min_gain.
    near = 0.999 * optimal + 0.001 / mdp.num_actions
    adv, d = exact_inputs(mdp, near)
    assert not cpi.cpi_step(t64(near), adv, d, mdp.gamma, min_gain=rounding).stopped


def test_cpi_stops_when_estimated_gain_is_negative():
    # Estimated advantages that are negative everywhere (biased estimates): g < 0, no step.
    pi = t64(np.full((3, 2), 0.5))
    adv = t64([[-1.0, -2.0], [-0.5, -0.1], [-3.0, -3.0]])
    d = t64([0.2, 0.3, 0.5])
    step = cpi.cpi_step(pi, adv, d, 0.9)
    assert step.stopped and step.alpha == 0.0 and step.g < 0.0
    assert torch.equal(step.policy, pi)


def test_cpi_rejects_bad_input():
    pi = t64(np.full((2, 2), 0.5))
    adv = t64(np.zeros((2, 2)))
    d = t64([0.5, 0.5])
    with pytest.raises(ValueError, match="gamma"):
        cpi.cpi_step(pi, adv, d, 1.0)
    with pytest.raises(ValueError, match="policy"):
        cpi.cpi_step(t64([[0.7, 0.7], [0.5, 0.5]]), adv, d, 0.9)
    with pytest.raises(ValueError, match="advantages"):
        cpi.cpi_step(pi, t64(np.zeros((2, 3))), d, 0.9)
    with pytest.raises(ValueError, match="state_weights"):
        cpi.cpi_step(pi, adv, t64([0.7, 0.7]), 0.9)
    with pytest.raises(ValueError, match="advantages contains NaN"):
        cpi.cpi_step(pi, t64([[0.0, float("nan")], [0.0, 0.0]]), d, 0.9)
    with pytest.raises(ValueError, match="alpha"):
        cpi.mixture_policy(pi, pi, 1.5)

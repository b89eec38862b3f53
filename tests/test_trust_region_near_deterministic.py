"""Near-deterministic softmax policies: what float64 can resolve, and refusal below it.

spec: specs/trust_region.md section 6, eq. (18). With m = min_{s, a} w_s pi(a|s) (states with
w_s > 0, actions with pi > 0), W = max_s w_s, lambda the damping and u = 2^-53, the natural-gradient
routines return a direction accurate to about sqrt(u) when m + lambda >= sqrt(u) (W + lambda) and
refuse (UnresolvableFisherError) below it; trpo_step returns status "unresolvable_fisher".

The references are exact or independent of refimpl: mpmath at 400 digits (the Fisher-vector
product), tabular.natural_gradient_closed_form (the centred advantage (A - mean_a A) / (1 - gamma),
which does not involve F and stays accurate as pi -> 0 or 1), tabular.fisher_matrix with numpy.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

import tabular
from refimpl import trust_region as tr
from tabular.examples import random_mdp

UNIT_ROUNDOFF = 2.0**-53  # float64
SQRT_U = math.sqrt(UNIT_ROUNDOFF)  # 1.05e-8: eq. (18)'s threshold for W = 1, lambda = 0
# The acceptance bound of issue 11. Above the threshold eq. (18) bounds the error by about
# u (W + lambda) / (m + lambda) <= sqrt(u) = 1.05e-8 times modest constants (CG's sqrt(n) and
# iteration count); measured worst 3.6e-8 over 1500 bandits. One decade below the threshold 2 % of
# the steps are already wrong by more than this, so refusing there is necessary, not cautious.
DIRECTION_RTOL = 1e-6


def log_softmax(theta: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(theta, dim=-1)


def t64(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def centred(x: np.ndarray) -> np.ndarray:
    """Per-state centring: the softmax Fisher is singular along each state's all-ones direction,
    so directions are compared modulo it (the minimum-norm solution is the centred one)."""
    return x - x.mean(axis=1, keepdims=True)


def min_weighted_prob(theta: np.ndarray, weights: np.ndarray) -> float:
    """m of eq. (18), computed with numpy in log space (independent of refimpl)."""
    z = theta - theta.max(axis=1, keepdims=True)
    log_pi = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    with np.errstate(divide="ignore"):
        log_w = np.log(weights)
    return float(np.exp((log_w[:, None] + log_pi)[weights > 0].min()))


def bandit_gradient(theta: np.ndarray, rewards: np.ndarray):
    """The issue's bandit: A = r - pi.r and the gradient pi * A (one state, weight 1), in float64."""
    pi = torch.softmax(t64(theta), dim=-1)
    adv = t64(rewards) - (pi * t64(rewards)).sum(-1, keepdim=True)
    return pi * adv, (adv - adv.mean(-1, keepdim=True)).numpy()


def assert_refused_or_correct(theta, gradient, weights, reference, scale, **kwargs):
    """The property of eq. (18): below the threshold a refusal; at or above it no refusal and the
    centred direction equal to the reference within DIRECTION_RTOL of ``scale``. Returns True when
    refused. (A case within 1e-12 relative of the threshold may go either way: numpy's and torch's
    log-softmax differ by rounding.)"""
    m = min_weighted_prob(theta, weights)
    damping = kwargs.get("damping", 0.0)
    threshold = SQRT_U * (weights.max() + damping) - damping
    try:
        step = tr.natural_gradient_step(log_softmax, t64(theta), gradient, t64(weights), 1.0, **kwargs)
    except tr.UnresolvableFisherError:
        assert m < threshold * (1.0 + 1e-12), ("refused above the threshold", m, threshold)
        return True
    assert m >= threshold * (1.0 - 1e-12), ("a step below the threshold", m, threshold)
    assert math.isclose(step.resolution.min_weighted_prob, m, rel_tol=1e-12)
    error = np.linalg.norm(centred(step.direction.numpy()) - reference)
    assert error <= DIRECTION_RTOL * scale, (error / scale, m)
    return False


# ----------------------------------------------------------------------------- the issue's case
ISSUE_THETA = np.array([[-13.0, -3.5, 33.3]])
ISSUE_REWARDS = np.array([[0.08, 0.61, 0.38]])


def test_issue_bandit_is_refused_because_its_float64_gradient_has_no_resolvable_natural_gradient():
    gradient, closed_form = bandit_gradient(ISSUE_THETA, ISSUE_REWARDS)
    weights = torch.ones(1, dtype=torch.float64)
    pi = tabular.softmax_policy(ISSUE_THETA)[0]
    assert math.isclose(closed_form[0, 0], -0.2766666, rel_tol=1e-6)  # (-0.28, 0.25, 0.02)
    # m = pi(a=0) = 7.8e-21, twelve orders of magnitude below sqrt(u) = 1.05e-8.
    resolution = tr.fisher_resolution(log_softmax, t64(ISSUE_THETA), weights)
    assert resolution == (pytest.approx(pi[0], rel=1e-12, abs=0.0), SQRT_U, False)
    with pytest.raises(tr.UnresolvableFisherError, match=r"^params: the policy is too close to determin"):
        tr.natural_gradient_step(log_softmax, t64(ISSUE_THETA), gradient, weights, 1.0)
    with pytest.raises(ValueError, match=r"7\.8e-21 is below the threshold 1\.05e-08"):
        tr.natural_gradient_direction(log_softmax, t64(ISSUE_THETA), gradient, weights)
    # Why no solver can do better: the float64 gradient's third entry is rounding (5.6e-17, larger
    # than the exact |g| = 2.4e-17), and the exact minimum-norm solution of F s = g for that g is far
    # from the closed form: 1 / pi_min = 1.3e20 amplifies it.
    one_state = tabular.MDP(np.ones((1, 3, 1)), ISSUE_REWARDS, np.ones(1), 0.5)
    fisher = tabular.fisher_matrix(one_state, ISSUE_THETA)  # score form: accurate entrywise here
    exact_for_this_g = np.linalg.pinv(fisher, rcond=1e-10, hermitian=True) @ gradient.numpy()[0]
    assert np.linalg.norm(centred(exact_for_this_g[None]) - closed_form) > 100 * np.linalg.norm(closed_form)


def test_trpo_step_honours_the_refusal_and_damping_lifts_it():
    gradient, _ = bandit_gradient(ISSUE_THETA, ISSUE_REWARDS)
    weights = torch.ones(1, dtype=torch.float64)
    adv = gradient / torch.softmax(t64(ISSUE_THETA), dim=-1)

    def surrogate(th):
        return (torch.softmax(th, dim=-1) * adv).sum()

    new, record = tr.trpo_step(surrogate, log_softmax, t64(ISSUE_THETA), weights, 0.01)
    assert record.status == "unresolvable_fisher" and not record.accepted and not record.candidates
    assert record.cg.iterations == 0 and not record.cg.converged and record.cg.relative_residual == 1.0
    assert not record.resolution.resolvable and torch.equal(new, t64(ISSUE_THETA))
    # Damping lambda >= sqrt(u) W / (1 - sqrt(u)) makes every policy resolvable (eq. (18)).
    damping = SQRT_U / (1.0 - SQRT_U) * 1.01
    assert tr.fisher_resolution(log_softmax, t64(ISSUE_THETA), weights, damping=damping).resolvable
    _, record = tr.trpo_step(surrogate, log_softmax, t64(ISSUE_THETA), weights, 0.01, damping=damping)
    assert record.status != "unresolvable_fisher" and record.resolution.resolvable


# ----------------------------------------------------------------------------- the threshold itself
@pytest.mark.parametrize("side", [1.0 - 1e-3, 1.0 + 1e-3])
def test_threshold_in_pi_bandit_refuses_just_below_and_is_correct_just_above(side):
    # Two actions with pi(a=0) = side * sqrt(u): theta = (0, log((1 - p) / p)).
    p = side * SQRT_U
    theta = np.array([[0.0, math.log((1.0 - p) / p)]])
    gradient, closed_form = bandit_gradient(theta, np.array([[0.9, 0.2]]))
    refused = assert_refused_or_correct(theta, gradient, np.ones(1), closed_form, np.linalg.norm(closed_form))
    assert refused == (side < 1.0)


@pytest.mark.parametrize("side", [1.0 - 1e-3, 1.0 + 1e-3])
def test_threshold_in_weight_a_rarely_visited_state_counts(side):
    # State 1 has moderate probabilities but a tiny weight: m = w_1 min_a pi(a|1) decides, and its
    # natural gradient is as large as state 0's, so it must be resolved too.
    theta = np.array([[0.3, -0.2, 0.1], [0.0, 1.0, -1.0]])
    pi1_min = tabular.softmax_policy(theta)[1].min()
    w1 = side * SQRT_U / (pi1_min + side * SQRT_U)  # w1 pi1_min = side sqrt(u) (1 - w1), W = 1 - w1
    weights = np.array([1.0 - w1, w1])
    rewards = np.array([[0.5, 0.1, 0.9], [0.2, 0.8, 0.4]])
    pi = tabular.softmax_policy(theta)
    adv = rewards - (pi * rewards).sum(axis=1, keepdims=True)
    gradient = t64(weights[:, None] * pi * adv)
    reference = centred(adv)
    refused = assert_refused_or_correct(theta, gradient, weights, reference, np.linalg.norm(reference),
                                        cg_iters=24, cg_tol=1e-13)
    assert refused == (side < 1.0)


# ----------------------------------------------------------------------------- random policies
def test_150_random_near_deterministic_bandit_steps_are_correct_or_refused_below_the_threshold():
    # As in the issue: logits of spread up to ~50 (pi_min down to 1e-40), rewards in [0, 1].
    rng = np.random.default_rng(11)
    refused = 0
    for _ in range(150):
        A = int(rng.integers(2, 6))
        theta = 10 ** rng.uniform(0.3, 1.7) * rng.standard_normal((1, A))
        rewards = rng.uniform(0.0, 1.0, (1, A))
        gradient, closed_form = bandit_gradient(theta, rewards)
        # Scale: the gradient's rounding is relative to |r| (A = r - pi.r), eq. (18) part (b).
        scale = np.linalg.norm(closed_form) + math.sqrt(A) * np.abs(rewards).max()
        refused += assert_refused_or_correct(theta, gradient, np.ones(1), closed_form, scale,
                                             cg_iters=4 * A)
    assert 20 <= refused <= 130, refused  # both sides of the threshold are exercised


@pytest.mark.parametrize("cg_tol", [1e-10, 1e-13])
def test_random_near_deterministic_mdps_are_correct_or_refused_below_the_threshold(cg_tol):
    # Several states weighted by the exact occupancy d (so W = max_s d(s) and rarely visited states
    # count), the exact gradient tabular.policy_gradient in float64, and the closed form (eq. (8)).
    rng = np.random.default_rng(12)
    refused = 0
    for _ in range(60):
        S, A = int(rng.integers(2, 6)), int(rng.integers(2, 5))
        gamma = float(rng.choice([0.0, 0.5, 0.9]))
        zero_fraction = float(rng.choice([0.0, 0.5]))
        mdp = random_mdp(int(rng.integers(2**31)), S, A, gamma=gamma, zero_fraction=zero_fraction)
        theta = 10 ** rng.uniform(0.3, 1.5) * rng.standard_normal((S, A))
        pi = tabular.softmax_policy(theta)
        d = tabular.state_occupancy(mdp, pi, normalized=True)
        reference = tabular.natural_gradient_closed_form(mdp, theta)
        q_scale = np.abs(tabular.q_values(mdp, pi)).max() / (1.0 - gamma)
        scale = np.linalg.norm(reference) + math.sqrt(S * A) * q_scale  # rounding of Q - V, eq. (18) (b)
        refused += assert_refused_or_correct(theta, t64(tabular.policy_gradient(mdp, theta)), d, reference,
                                             scale, cg_iters=4 * S * A, cg_tol=cg_tol)
    assert 10 <= refused <= 50, refused


def test_damped_direction_is_the_damped_solve_even_for_a_deterministic_policy():
    # With damping the system is well conditioned whatever pi: (F + lambda I) s = g, reference by
    # numpy.linalg.solve with tabular's Fisher (accurate entrywise: the score form has no
    # cancellation). kappa <= (1/2 + lambda) / lambda = 501, so 1e-12 covers u kappa with margin.
    gradient, _ = bandit_gradient(ISSUE_THETA, ISSUE_REWARDS)
    damping = 1e-3
    mdp = tabular.MDP(np.ones((1, 3, 1)), np.zeros((1, 3)), np.ones(1), 0.5)
    fisher = tabular.fisher_matrix(mdp, ISSUE_THETA)
    expected = np.linalg.solve(fisher + damping * np.eye(3), gradient.numpy()[0])
    got = tr.natural_gradient_direction(log_softmax, t64(ISSUE_THETA), gradient, t64([1.0]), damping=damping,
                                        cg_tol=1e-14)
    assert np.allclose(got.solution.numpy()[0], expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())


def test_curvature_floor_stops_cg_before_the_rounded_gradients_null_part_derails_it():
    # A case from the random sweep (m / W = 2.8e-8, just above the threshold): the float64 gradient
    # has a component along the Fisher's null space (per-state sums 4e-10 |g|) that CG cannot
    # reduce. With the rounding-level floor (64 eps) CG steps along it, 1 / p^T F p blows up, and the
    # direction is wrong by 5e-3; the floor sqrt(u) of eq. (18) stops it at 9e-10.
    theta = np.array([[2.8508749336158092, -12.523808077090887], [-14.162281747559438, 3.2436483656011132]])
    rewards = np.array([[0.8346992928069484, 0.32378354211943594], [0.6231937935705739, 0.540022972411323]])
    weights = np.array([0.1744231015068287, 0.8255768984931713])
    pi = torch.softmax(t64(theta), dim=-1)
    adv = t64(rewards) - (pi * t64(rewards)).sum(-1, keepdim=True)
    gradient = t64(weights)[:, None] * pi * adv
    reference = centred(adv.numpy())
    fvp = tr.fisher_vector_product_fn(log_softmax, t64(theta), t64(weights))
    rounding_floor = tr.conjugate_gradient(fvp, gradient, 8, 1e-13)
    error = np.linalg.norm(centred(rounding_floor.solution.numpy()) - reference) / np.linalg.norm(reference)
    assert error > 1e-4 and not rounding_floor.converged
    assert not assert_refused_or_correct(theta, gradient, weights, reference, np.linalg.norm(reference),
                                         cg_iters=8, cg_tol=1e-13)


# ----------------------------------------------------------------------------- Fisher-vector products
def test_fisher_vector_product_is_accurate_entrywise_as_pi_approaches_0_and_1():
    # Exact reference: w_s pi_a (v_a - pi.v) at 400 digits from the float64 logits. Bound: the
    # rounding of the terms w_s pi_a (|v_a| + pi.|v|), times A (the dot product's length) plus
    # |log pi_a| (exp amplifies the rounding of a log-probability by |log pi|); measured <= 2.5.
    rng = np.random.default_rng(13)
    worst = 0.0
    for _ in range(40):
        S, A = int(rng.integers(1, 4)), int(rng.integers(2, 6))
        theta = 10 ** rng.uniform(0.0, 2.3) * rng.standard_normal((S, A))  # pi_min down to ~1e-200
        weights = rng.dirichlet(np.ones(S))
        v = rng.standard_normal((S, A)) * 10 ** rng.uniform(-3.0, 3.0, (S, A))
        got = tr.fisher_vector_product(log_softmax, t64(theta), t64(v), t64(weights)).numpy()
        with mpmath.workdps(400):
            worst = max(worst, worst_entrywise_ratio(theta, weights, v, got))
    assert worst <= 8.0, worst


def worst_entrywise_ratio(theta, weights, v, got) -> float:
    """max over entries of |got - exact| / (u w_s pi_a (|v_a| + pi.|v|) (A + |log pi_a|))."""
    S, A = theta.shape
    worst = 0.0
    for s in range(S):
        z = [mpmath.mpf(x) for x in theta[s]]
        e = [mpmath.exp(x - max(z)) for x in z]
        p = [x / sum(e) for x in e]
        vv = [mpmath.mpf(x) for x in v[s]]
        p_v = sum(pa * va for pa, va in zip(p, vv, strict=True))
        p_abs_v = sum(pa * abs(va) for pa, va in zip(p, vv, strict=True))
        for a in range(A):
            exact = mpmath.mpf(weights[s]) * p[a] * (vv[a] - p_v)
            terms = float(mpmath.mpf(weights[s]) * p[a] * (abs(vv[a]) + p_abs_v))
            bound = UNIT_ROUNDOFF * terms * (A + float(abs(mpmath.log(p[a]))))
            if terms < 1e-290:  # near the subnormal range only an absolute error of ~1e-308 holds
                bound = max(bound, 1e-300)
            worst = max(worst, float(abs(mpmath.mpf(got[s, a]) - exact)) / bound)
    return worst


def test_trpo_uses_the_same_curvature_floor():
    # The regression case above through trpo_step: a linear surrogate (t * g).sum() has exactly the
    # rounded gradient g; TRPO's CG must stop where natural_gradient_direction's does.
    theta = np.array([[2.8508749336158092, -12.523808077090887], [-14.162281747559438, 3.2436483656011132]])
    rewards = np.array([[0.8346992928069484, 0.32378354211943594], [0.6231937935705739, 0.540022972411323]])
    weights = t64([0.1744231015068287, 0.8255768984931713])
    pi = torch.softmax(t64(theta), dim=-1)
    adv = t64(rewards) - (pi * t64(rewards)).sum(-1, keepdim=True)
    gradient = weights[:, None] * pi * adv
    reference = centred(adv.numpy())
    _, record = tr.trpo_step(lambda t: (t * gradient).sum(), log_softmax, t64(theta), weights, 0.01,
                             cg_iters=8, cg_tol=1e-13)
    error = np.linalg.norm(centred(record.cg.solution.numpy()) - reference) / np.linalg.norm(reference)
    assert error <= DIRECTION_RTOL, error
    # The refusal message states the damping it was computed with.
    with pytest.raises(tr.UnresolvableFisherError, match=r"add damping \(now 0\.0\)$"):
        issue_gradient, _ = bandit_gradient(ISSUE_THETA, ISSUE_REWARDS)
        tr.natural_gradient_direction(log_softmax, t64(ISSUE_THETA), issue_gradient, t64([1.0]))

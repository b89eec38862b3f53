"""refimpl.trust_region against exact tabular ground truth (spec: specs/trust_region.md).

Conjugate gradient against numpy.linalg.solve; Fisher-vector products against
tabular.fisher_matrix; the natural gradient against its closed form (Kakade 2001) and the NPG rate
of Agarwal, Kakade, Lee and Mahajan; TRPO's line search against an independent re-computation of
its backtracking sequence with tabular.mean_kl; the natural-step erratum (errata.md entry 9).

Tolerances (float64, u = 2^-53 = 1.1e-16; they must hold on any CPU and thread count):
- a product or sum of a few O(1) terms (F v, the mean KL, a quadratic form): a few u per term,
  asserted at 1e-13..1e-10 relative with an absolute floor at u times the summed terms' scale;
- a CG solution: relative error about n u kappa (Greenbaum 1997, ch. 7) plus the stopping
  tolerance times kappa. The CG tests choose kappa <= 1e4 (1e-8 leaves 1e3 for n <= 50); the
  tabular cases draw softmax logits in [-2, 2] on MDPs with full-support rho0, so
  pi >= e^-4 / A and kappa of F on its range is at most (max d / 2) / (min d e^-4 / A) ~ 1e2
  max d / min d (spec eq. (18)'s spectrum), and CG at tol 1e-13 gives directions to ~1e-8
  (asserted 1e-8) and TRPO quantities derived from them (beta, the candidates' KL and gains:
  smooth functions of the direction) to 1e-7;
- near-deterministic policies: eq. (18) of the spec, in test_trust_region_near_deterministic.py;
- low precision: the input's rounding (float32 2^-24, bfloat16 2^-8) times the conditioning.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tabular
from refimpl import trust_region as tr
from tabular.examples import random_mdp
from tests.strategies import mdps, seeded_random_mdps, softmax_params


# ----------------------------------------------------------------------------- conjugate gradient
def spd_matrix(n: int, eigenvalues: np.ndarray, seed: int) -> np.ndarray:
    """``Q diag(eigenvalues) Q^T`` with a random orthogonal Q (so the spectrum is chosen exactly)."""
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    q = q * np.sign(np.diag(r))
    m = (q * eigenvalues) @ q.T
    return 0.5 * (m + m.T)


def as_matvec(m: np.ndarray):
    mt = torch.tensor(m, dtype=torch.float64)
    return lambda x: mt @ x


def cg_error(n: int, eigenvalues: np.ndarray, seed: int, iters: int) -> tuple[float, int]:
    m = spd_matrix(n, eigenvalues, seed)
    b = np.random.default_rng(seed + 1).standard_normal(n)
    expected = np.linalg.solve(m, b)
    result = tr.conjugate_gradient(as_matvec(m), torch.tensor(b, dtype=torch.float64), iters, tol=1e-14)
    err = np.linalg.norm(result.solution.numpy() - expected) / np.linalg.norm(expected)
    return float(err), result.iterations


@given(n=st.integers(1, 50), log10_cond=st.floats(0.0, 4.0), seed=st.integers(0, 2**31 - 1))
def test_cg_matches_linalg_solve_within_2n_iterations(n, log10_cond, seed):
    # Chosen spectrum: the extremes 1 and cond (so the condition number is exactly cond) and the
    # other eigenvalues uniform in between.
    rng = np.random.default_rng(seed)
    cond = 10.0**log10_cond
    eigenvalues = np.concatenate([[cond, 1.0], rng.uniform(1.0, cond, max(n - 2, 0))])[:n]
    err, iterations = cg_error(n, eigenvalues, seed, 2 * n)
    assert iterations <= 2 * n
    assert err <= 1e-8, (err, iterations)


@given(n=st.integers(1, 50), log10_cond=st.floats(0.0, 4.0), seed=st.integers(0, 2**31 - 1))
def test_cg_geometric_spectrum_within_3n_iterations(n, log10_cond, seed):
    # Geometrically spread eigenvalues are the hard case for CG in floating point: lost
    # orthogonality delays convergence beyond n (Greenbaum & Strakos 1992); at cond 1e4 float64 CG
    # needs up to ~2.5 n iterations for 1e-8 (measured), so 2n does not hold here; 3n does.
    eigenvalues = np.random.default_rng(seed).permutation(np.logspace(0.0, log10_cond, n))
    err, iterations = cg_error(n, eigenvalues, seed, 3 * n)
    assert err <= 1e-8, (err, iterations)


@pytest.mark.parametrize("distinct", [1, 2, 5, 9])
def test_cg_converges_in_as_many_iterations_as_distinct_eigenvalues(distinct):
    # Krylov theory: exact after k steps when M has k distinct eigenvalues; n = 40 >> k.
    n = 40
    eigenvalues = np.resize(np.arange(1.0, distinct + 1.0), n)
    m = spd_matrix(n, eigenvalues, seed=distinct)
    b = np.random.default_rng(7).standard_normal(n)
    result = tr.conjugate_gradient(as_matvec(m), torch.tensor(b, dtype=torch.float64), 2 * n, tol=1e-10)
    assert result.converged
    assert distinct - 1 <= result.iterations <= distinct
    assert np.allclose(result.solution.numpy(), np.linalg.solve(m, b), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("tol", [1e-1, 1e-3, 1e-6])
def test_cg_stops_at_the_first_iterate_within_tol(tol):
    n = 50
    m = spd_matrix(n, np.logspace(0.0, 1.0, n), seed=3)  # cond 10: ~0.52^k convergence
    b = torch.tensor(np.random.default_rng(5).standard_normal(n), dtype=torch.float64)
    mv = as_matvec(m)
    result = tr.conjugate_gradient(mv, b, 2 * n, tol=tol)
    assert result.converged and result.relative_residual <= tol
    assert 1 <= result.iterations < n  # stopped early
    # The reported residual is the true one (up to rounding) ...
    true_residual = float(torch.linalg.vector_norm(b - mv(result.solution)))
    assert math.isclose(true_residual, result.residual_norm, rel_tol=1e-6)
    # ... and one iteration fewer would not have been within tol.
    previous = tr.conjugate_gradient(mv, b, result.iterations - 1, tol=tol) if result.iterations > 1 else None
    if previous is not None:
        assert not previous.converged and previous.relative_residual > tol


def test_cg_reports_non_convergence_when_out_of_iterations():
    n = 30
    m = spd_matrix(n, np.logspace(0.0, 4.0, n), seed=11)
    b = torch.ones(n, dtype=torch.float64)
    result = tr.conjugate_gradient(as_matvec(m), b, 3, tol=1e-12)
    assert result.iterations == 3 and not result.converged and result.relative_residual > 1e-12


def test_cg_zero_right_hand_side_returns_zero_without_iterating():
    calls = []
    result = tr.conjugate_gradient(lambda x: calls.append(1) or x, torch.zeros(4, dtype=torch.float64), 5)
    assert result.iterations == 0 and result.converged and not calls
    assert result.residual_norm == 0.0 and result.relative_residual == 0.0
    assert torch.equal(result.solution, torch.zeros(4, dtype=torch.float64))


def test_cg_works_on_matrix_shaped_unknowns():
    # Inner products run over all entries, so [S, A] parameters need no flattening.
    m = spd_matrix(6, np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), seed=2)
    mt = torch.tensor(m, dtype=torch.float64)
    b = torch.arange(6, dtype=torch.float64).reshape(2, 3) + 1.0
    result = tr.conjugate_gradient(lambda x: (mt @ x.reshape(-1)).reshape(2, 3), b, 12, tol=1e-13)
    assert np.allclose(result.solution.reshape(-1).numpy(), np.linalg.solve(m, b.reshape(-1).numpy()),
                       rtol=1e-10, atol=0.0)


def test_cg_rejects_bad_input():
    b = torch.ones(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="iters"):
        tr.conjugate_gradient(lambda x: x, b, 0)
    with pytest.raises(TypeError, match="iters"):
        tr.conjugate_gradient(lambda x: x, b, 2.0)
    with pytest.raises(ValueError, match="tol"):
        tr.conjugate_gradient(lambda x: x, b, 3, tol=-1.0)
    with pytest.raises(ValueError, match="b contains NaN"):
        tr.conjugate_gradient(lambda x: x, torch.tensor([1.0, float("nan")]), 3)
    with pytest.raises(TypeError, match="b must be a floating-point"):
        tr.conjugate_gradient(lambda x: x, torch.ones(3, dtype=torch.int64), 3)
    with pytest.raises(ValueError, match="matvec"):
        tr.conjugate_gradient(lambda x: x[:2], b, 3)


def test_pcg_with_unit_diagonal_is_plain_cg_bit_for_bit():
    # Eq. (1') with D = 1 performs exactly the operations of (1): z = r / 1 = r, p^T D p = p^T p.
    m = spd_matrix(8, np.geomspace(1.0, 1e3, 8), seed=3)
    b = torch.tensor(np.random.default_rng(4).standard_normal(8))
    for iters in (1, 3, 8, 20):
        plain = tr.conjugate_gradient(as_matvec(m), b, iters, tol=1e-14)
        unit = tr.conjugate_gradient(as_matvec(m), b, iters, tol=1e-14, preconditioner=torch.ones(8).double())
        assert torch.equal(plain.solution, unit.solution) and plain[1:] == unit[1:]


def test_pcg_is_cg_on_the_scaled_matrix_and_solves_a_badly_scaled_system():
    # M = D^1/2 K D^1/2 with K well conditioned (kappa 10) and D spread over 12 decades: plain CG
    # faces kappa ~1e13, PCG with D faces K's 10 and reaches the solution within 2n iterations
    # (error ~ u kappa(K) ~ 1e-15; asserted 1e-10 relative in the D-norm the scaling preserves).
    n = 10
    k = spd_matrix(n, np.linspace(1.0, 10.0, n), seed=5)
    d = np.geomspace(1e-6, 1e6, n)
    m = np.sqrt(d)[:, None] * k * np.sqrt(d)[None, :]
    b = np.random.default_rng(6).standard_normal(n)
    expected = np.linalg.solve(k, b / np.sqrt(d)) / np.sqrt(d)  # M^-1 b through the scaling, exactly
    result = tr.conjugate_gradient(as_matvec(m), torch.tensor(b), 2 * n, tol=1e-14,
                                   preconditioner=torch.tensor(d))
    error = np.sqrt(d) * (result.solution.numpy() - expected)
    assert np.linalg.norm(error) <= 1e-10 * np.linalg.norm(np.sqrt(d) * expected) and result.converged
    # Its residual is measured in the D^-1 norm: recompute it from the solution.
    r = b - m @ result.solution.numpy()
    b_norm = math.sqrt(float(b @ (b / d)))
    assert math.isclose(result.relative_residual * b_norm, math.sqrt(float(r @ (r / d))), rel_tol=1e-3,
                        abs_tol=1e-14 * b_norm)
    plain = tr.conjugate_gradient(as_matvec(m), torch.tensor(b), 2 * n, tol=1e-14)
    assert not plain.converged


def test_pcg_converges_in_one_iteration_when_the_scaled_matrix_is_a_projector():
    # The tabular softmax Fisher of trust_region.md eq. (19): D^-1/2 F D^-1/2 = I - q q^T with
    # D = pi, q = sqrt(pi). For b in F's range the first iterate is b / pi (up to the null
    # direction): exactly the closed form.
    pi = torch.tensor([1e-30, 1e-3, 0.3, 1.0 - 0.301 - 1e-30], dtype=torch.float64)
    adv = torch.tensor([0.4, -0.2, 0.7, 0.1], dtype=torch.float64)
    adv = adv - (pi * adv).sum()

    def fisher(v):
        return pi * v - pi * (pi * v).sum()

    result = tr.conjugate_gradient(fisher, pi * adv, 5, tol=1e-12, preconditioner=pi)
    assert result.iterations == 1 and result.converged
    assert torch.allclose(result.solution, adv, rtol=1e-14, atol=1e-15)


def test_pcg_rejects_a_bad_preconditioner_by_name():
    b = torch.ones(3, dtype=torch.float64)
    cases = [
        (torch.ones(4).double(), ValueError, r"^preconditioner must have b's shape \(3,\), got \(4,\)$"),
        (torch.tensor([1.0, 0.0, 1.0]), ValueError, r"^preconditioner must be positive"),
        (torch.tensor([1.0, -2.0, 1.0]), ValueError, r"^preconditioner must be positive"),
        (torch.tensor([1.0, math.nan, 1.0]), ValueError, r"^preconditioner contains NaN or inf$"),
        (torch.tensor([1.0, math.inf, 1.0]), ValueError, r"^preconditioner contains NaN or inf$"),
        (torch.ones(3, dtype=torch.int64), TypeError, r"^preconditioner must be a floating-point tensor"),
        ([1.0, 1.0, 1.0], TypeError, r"^preconditioner must be a torch.Tensor, got list$"),
    ]
    for preconditioner, error, message in cases:
        with pytest.raises(error, match=message):
            tr.conjugate_gradient(lambda x: x, b, 3, preconditioner=preconditioner)


# ----------------------------------------------------------------------------- tabular helpers
def t64(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def log_softmax(theta: torch.Tensor) -> torch.Tensor:
    """The tabular softmax policy as refimpl sees it: parameters [S, A] -> log-probabilities [S, A]."""
    return torch.log_softmax(theta, dim=-1)


def flat_log_softmax(num_states: int, num_actions: int):
    """The same softmax policy with its parameters passed flattened, ``[S * A]``: a general
    ``log_prob_fn`` to the natural-gradient routines (plain CG and eq. (18); trust_region.md
    section 6), where ``log_softmax`` of ``[S, A]`` logits takes the tabular path (eq. (19))."""
    return lambda flat: torch.log_softmax(flat.reshape(num_states, num_actions), dim=-1)


def occupancy(mdp: tabular.MDP, theta: np.ndarray) -> torch.Tensor:
    return t64(tabular.state_occupancy(mdp, tabular.softmax_policy(theta), normalized=True))


def exact_surrogate_fn(mdp: tabular.MDP, theta: np.ndarray):
    """``theta' -> L_theta(theta') - J(theta)`` of Schulman et al. 2015, section 4, with exact d and A of
    pi_theta:
    ``sum_s d(s) sum_a pi_theta'(a|s) A(s, a) / (1 - gamma)`` (its gradient at theta is grad J)."""
    pi = tabular.softmax_policy(theta)
    d = t64(tabular.state_occupancy(mdp, pi, normalized=True))
    adv = t64(tabular.advantages(mdp, pi))
    return lambda th: (d[:, None] * torch.softmax(th, dim=-1) * adv).sum() / (1.0 - mdp.gamma)


def full_support_mdp(seed: int, num_states: int, num_actions: int, gamma: float, zero_fraction: float = 0.0):
    """tabular.random_mdp: rho0 is a Dirichlet(1) draw, so it has full support (almost surely)."""
    mdp = random_mdp(seed, num_states, num_actions, gamma=gamma, zero_fraction=zero_fraction)
    assert np.all(mdp.rho0 > 0)
    return mdp


def random_theta(seed: int, num_states: int, num_actions: int, scale: float = 1.0) -> np.ndarray:
    return scale * np.random.default_rng(seed).standard_normal((num_states, num_actions))


# ----------------------------------------------------------------------------- Fisher-vector products
@given(data=st.data())
def test_fisher_vector_product_equals_tabular_fisher_matrix(data):
    mdp = data.draw(mdps(max_states=6, max_actions=4))
    S, A = mdp.num_states, mdp.num_actions
    theta = data.draw(softmax_params(S, A))
    v = data.draw(softmax_params(S, A, scale=2.0))
    fisher = tabular.fisher_matrix(mdp, theta)
    expected = fisher @ v.reshape(-1)
    got = tr.fisher_vector_product(log_softmax, t64(theta), t64(v), occupancy(mdp, theta))
    assert got.shape == (S, A) and got.dtype == torch.float64
    floor = 1e-12 * (np.abs(fisher) @ np.abs(v.reshape(-1)))
    assert np.all(np.abs(got.reshape(-1).numpy() - expected) <= 1e-10 * np.abs(expected) + floor + 1e-300)


def test_fisher_vector_product_damping_adds_damping_times_v():
    mdp = full_support_mdp(4, 4, 3, 0.9)
    theta, v = random_theta(1, 4, 3), random_theta(2, 4, 3)
    d = occupancy(mdp, theta)
    plain = tr.fisher_vector_product(log_softmax, t64(theta), t64(v), d)
    damped = tr.fisher_vector_product(log_softmax, t64(theta), t64(v), d, damping=0.25)
    assert torch.allclose(damped, plain + 0.25 * t64(v), rtol=1e-13, atol=1e-15)
    expected = tabular.fisher_matrix(mdp, theta) @ v.reshape(-1) + 0.25 * v.reshape(-1)
    assert np.allclose(damped.reshape(-1).numpy(), expected, rtol=1e-10, atol=1e-14)


def test_fisher_vector_product_of_a_non_tabular_policy_equals_the_explicit_fisher():
    # A log-linear policy logits[s] = phi[s] @ W: parameters shared across states, so the Fisher is
    # not block diagonal. Explicit F = sum_s w_s sum_a pi (grad log pi)(grad log pi)^T by Jacobian.
    gen = torch.Generator().manual_seed(0)
    N, A, K = 7, 3, 4
    phi = torch.randn(N, K, generator=gen, dtype=torch.float64)
    w = torch.rand(N, generator=gen, dtype=torch.float64)
    w = w / w.sum()
    params = torch.randn(K * A, generator=gen, dtype=torch.float64)
    v = torch.randn(K * A, generator=gen, dtype=torch.float64)

    def policy(p):
        return torch.log_softmax(phi @ p.reshape(K, A), dim=-1)

    jac = torch.autograd.functional.jacobian(policy, params)  # [N, A, K*A]
    pi = policy(params).exp()
    fisher = torch.einsum("n,na,nai,naj->ij", w, pi, jac, jac)
    got = tr.fisher_vector_product(policy, params, v, w)
    assert torch.allclose(got, fisher @ v, rtol=1e-10, atol=1e-13)


@given(data=st.data())
def test_mean_kl_equals_tabular_mean_kl(data):
    mdp = data.draw(seeded_random_mdps())
    S, A = mdp.num_states, mdp.num_actions
    theta, theta_new = data.draw(softmax_params(S, A)), data.draw(softmax_params(S, A))
    got = tr.mean_kl(log_softmax, log_softmax(t64(theta)), t64(theta_new), occupancy(mdp, theta))
    assert math.isclose(float(got), tabular.mean_kl(mdp, theta, theta_new), rel_tol=1e-10, abs_tol=1e-15)


# ----------------------------------------------------------------------------- natural gradient
@given(data=st.data())
def test_natural_gradient_direction_is_the_centred_advantage_over_one_minus_gamma(data):
    # Kakade (2001): with the exact gradient and F weighted by the exact normalised occupancy, the
    # minimum-norm solution of F w = grad J is (A - mean_a A) / (1 - gamma) (rho0 full support).
    mdp = data.draw(seeded_random_mdps())
    S, A, gamma = mdp.num_states, mdp.num_actions, mdp.gamma
    theta = data.draw(softmax_params(S, A, scale=2.0))
    result = tr.natural_gradient_direction(log_softmax, t64(theta), t64(tabular.policy_gradient(mdp, theta)),
                                           occupancy(mdp, theta), cg_iters=4 * S * A, cg_tol=1e-13)
    pi = tabular.softmax_policy(theta)
    adv = tabular.advantages(mdp, pi)
    closed_form = (adv - adv.mean(axis=1, keepdims=True)) / (1.0 - gamma)
    assert result.converged
    assert np.allclose(result.solution.numpy(), closed_form, rtol=1e-8, atol=1e-8 * np.abs(closed_form).max())


@given(data=st.data(), eta=st.sampled_from([0.01, 0.3, 2.0]))
def test_natural_step_is_the_multiplicative_weights_update(data, eta):
    # pi_new(a|s) ∝ pi(a|s) exp(eta A(s, a) / (1 - gamma)) (Agarwal, Kakade, Lee, Mahajan, eq. (16)).
    mdp = data.draw(seeded_random_mdps())
    S, A, gamma = mdp.num_states, mdp.num_actions, mdp.gamma
    theta = data.draw(softmax_params(S, A, scale=2.0))
    step = tr.natural_gradient_step(log_softmax, t64(theta), t64(tabular.policy_gradient(mdp, theta)),
                                    occupancy(mdp, theta), eta, cg_iters=4 * S * A, cg_tol=1e-13)
    pi = tabular.softmax_policy(theta)
    unnormalised = pi * np.exp(eta * tabular.advantages(mdp, pi) / (1.0 - gamma))
    expected = unnormalised / unnormalised.sum(axis=1, keepdims=True)
    assert np.allclose(tabular.softmax_policy(step.params.numpy()), expected, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("seed, gamma, eta", [(0, 0.5, 0.3), (1, 0.8, 0.3), (2, 0.9, 0.05)])
def test_npg_rate_from_zero_init(seed, gamma, eta):
    # Agarwal et al. (2021) Thm 16: V*(rho) - V_T(rho) <= log|A| / (eta T) + 1 / ((1 - gamma)^2 T)
    # for softmax NPG from theta_0 = 0 with rewards in [0, 1], for every T. On the tabular path
    # (trust_region.md eq. (19)) CG is preconditioned by diag(d pi), under which the Fisher is a
    # projector whatever pi_min, so it converges at every step (one iteration) to its default 1e-10;
    # plain CG needed a tolerance growing with the Fisher's condition number and stopped at kappa
    # 1e8. The iteration to underflow is test_trust_region_near_deterministic.py's.
    base = full_support_mdp(seed, 6, 3, gamma, zero_fraction=0.3)
    mdp = tabular.MDP(base.P, (base.r + 1.0) / 2.0, base.rho0, gamma)  # rewards in [0, 1]
    A = mdp.num_actions
    j_star = float(mdp.rho0 @ tabular.policy_iteration(mdp).V)
    theta = np.zeros((mdp.num_states, A))
    gaps = []
    for t in range(1, 41):
        step = tr.natural_gradient_step(log_softmax, t64(theta), t64(tabular.policy_gradient(mdp, theta)),
                                        occupancy(mdp, theta), eta)
        assert step.cg.converged and step.cg.iterations == 1, t
        theta = step.params.numpy()
        gap = j_star - tabular.expected_return(mdp, tabular.softmax_policy(theta))
        assert gap <= math.log(A) / (eta * t) + 1.0 / ((1.0 - gamma) ** 2 * t), (t, gap)
        gaps.append(gap)
    assert len(gaps) == 40
    assert gaps[-1] < 0.05 * gaps[0]  # NPG actually converges (a zero step would satisfy the bound)


# ----------------------------------------------------------------------------- TRPO
def exact_backtracking_sequence(mdp, theta, max_kl, ratio, max_backtracks):
    """The line search recomputed from tabular quantities only: direction = the closed-form natural
    gradient, beta = sqrt(2 delta / w^T F w) with tabular.fisher_matrix, and for each candidate the
    exact surrogate gain (tabular.surrogate - J) and exact mean KL (tabular.mean_kl)."""
    w = tabular.natural_gradient_closed_form(mdp, theta)
    fisher = tabular.fisher_matrix(mdp, theta)
    beta = math.sqrt(2.0 * max_kl / float(w.reshape(-1) @ fisher @ w.reshape(-1)))
    pi = tabular.softmax_policy(theta)
    j_old = tabular.expected_return(mdp, pi)
    rows = []
    for k in range(max_backtracks + 1):
        cand = theta + ratio**k * beta * w
        gain = tabular.surrogate(mdp, pi, tabular.softmax_policy(cand)) - j_old
        rows.append((cand, gain, tabular.mean_kl(mdp, theta, cand)))
    return beta, rows


@given(data=st.data(), max_kl=st.sampled_from([1e-3, 0.05, 0.5, 2.0]), ratio=st.sampled_from([0.5, 0.8]))
def test_trpo_accepts_the_largest_candidate_with_gain_and_exact_kl_within_delta(data, max_kl, ratio):
    mdp = data.draw(seeded_random_mdps())
    S, A = mdp.num_states, mdp.num_actions
    theta = data.draw(softmax_params(S, A, scale=2.0))
    new, record = tr.trpo_step(exact_surrogate_fn(mdp, theta), log_softmax, t64(theta), occupancy(mdp, theta),
                               max_kl, cg_iters=4 * S * A, cg_tol=1e-13, backtrack_ratio=ratio,
                               max_backtracks=6)
    beta, rows = exact_backtracking_sequence(mdp, theta, max_kl, ratio, 6)
    assert math.isclose(record.full_step_scale, beta, rel_tol=1e-7)
    for cand, (_, gain, kl) in zip(record.candidates, rows, strict=False):
        assert math.isclose(cand.improvement, gain, rel_tol=1e-7, abs_tol=1e-12)
        assert math.isclose(cand.kl, kl, rel_tol=1e-7, abs_tol=1e-14)
    acceptable = [k for k, (_, gain, kl) in enumerate(rows) if gain > 0 and kl <= max_kl]
    if not acceptable:
        assert record.status == "no_acceptable_step" and len(record.candidates) == 7
        assert torch.equal(new, t64(theta))
        return
    k = acceptable[0]
    assert record.status == "accepted" and record.accepted
    assert record.backtracks == k and len(record.candidates) == k + 1
    assert record.step_fraction == ratio**k
    assert np.allclose(new.numpy(), rows[k][0], rtol=1e-7, atol=1e-9)
    assert record.kl <= max_kl and math.isclose(record.kl, rows[k][2], rel_tol=1e-7, abs_tol=1e-14)
    assert math.isclose(record.actual_improvement, rows[k][1], rel_tol=1e-7, abs_tol=1e-12)
    assert math.isclose(record.quadratic_kl, ratio ** (2 * k) * max_kl, rel_tol=1e-12)
    # Expected improvement: the linear model g^T (theta_new - theta) with g = grad J.
    step = rows[k][0] - theta
    expected = float(tabular.policy_gradient(mdp, theta).reshape(-1) @ step.reshape(-1))
    assert math.isclose(record.expected_improvement, expected, rel_tol=1e-7)


def bandit(logits, rewards, gamma=0.5):
    """One state, len(rewards) actions: KL and surrogate in closed form."""
    A = len(rewards)
    mdp = tabular.MDP(np.ones((1, A, 1)), np.asarray([rewards], dtype=np.float64), np.ones(1), gamma)
    return mdp, np.asarray([logits], dtype=np.float64)


def test_trpo_backtracks_when_the_full_step_breaks_the_exact_kl():
    # pi_old = softmax(2, 0) = (0.88, 0.12) and action 1 pays: the step moves mass onto the unlikely
    # action, where KL(old || new) grows faster than its quadratic model, so the full step
    # (quadratic KL = delta) has exact KL 0.139 > delta = 0.1; half of it has exact KL 0.030.
    mdp, theta = bandit([2.0, 0.0], [0.0, 1.0])
    delta = 0.1
    new, record = tr.trpo_step(exact_surrogate_fn(mdp, theta), log_softmax, t64(theta), occupancy(mdp, theta),
                               delta, backtrack_ratio=0.5)
    beta, rows = exact_backtracking_sequence(mdp, theta, delta, 0.5, 1)
    assert rows[0][1] > 0 and rows[0][2] > delta  # the full step gains but breaks the KL limit
    assert rows[1][1] > 0 and rows[1][2] <= delta
    assert record.accepted and record.backtracks == 1 and record.step_fraction == 0.5
    assert record.candidates[0].kl > delta >= record.kl
    assert np.allclose(new.numpy(), rows[1][0], rtol=1e-9, atol=0.0)
    assert math.isclose(tabular.mean_kl(mdp, theta, new.numpy()), record.kl, rel_tol=1e-10)


def test_trpo_gives_up_cleanly_when_no_candidate_is_acceptable():
    mdp, theta = bandit([2.0, 0.0], [0.0, 1.0])
    new, record = tr.trpo_step(exact_surrogate_fn(mdp, theta), log_softmax, t64(theta), occupancy(mdp, theta),
                               0.1, backtrack_ratio=0.5, max_backtracks=0)
    assert record.status == "no_acceptable_step" and not record.accepted
    assert record.backtracks == 0 and record.kl == 0.0 and record.actual_improvement == 0.0
    assert torch.equal(new, t64(theta))


def test_trpo_zero_gradient_takes_no_step():
    mdp, theta = bandit([0.3, -0.2, 1.0], [0.5, 0.5, 0.5])  # every action equally good: A = 0
    new, record = tr.trpo_step(exact_surrogate_fn(mdp, theta), log_softmax, t64(theta), occupancy(mdp, theta),
                               0.01)
    assert record.status == "zero_gradient" and not record.candidates
    assert torch.equal(new, t64(theta))


def test_trpo_improves_j_on_200_random_mdps_and_never_breaks_the_kl_limit():
    # Exact advantages, delta = 1e-3, the practical CG budget (10 iterations), gamma = 0.9.
    delta, improved, accepted = 1e-3, 0, 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        S, A = int(rng.integers(2, 9)), int(rng.integers(2, 5))
        mdp = random_mdp(rng, S, A, gamma=0.9, zero_fraction=float(rng.choice([0.0, 0.5])))
        theta = rng.standard_normal((S, A))
        new, record = tr.trpo_step(exact_surrogate_fn(mdp, theta), log_softmax, t64(theta),
                                   occupancy(mdp, theta), delta)
        if record.accepted:
            accepted += 1
            assert tabular.mean_kl(mdp, theta, new.numpy()) <= delta  # independent check of the limit
        j_old = tabular.expected_return(mdp, tabular.softmax_policy(theta))
        improved += tabular.expected_return(mdp, tabular.softmax_policy(new.numpy())) > j_old
    assert improved >= 198, improved
    assert accepted >= 198, accepted


# ----------------------------------------------------------------------------- natural-step erratum
@given(data=st.data(), delta=st.sampled_from([1e-3, 0.01, 0.1]))
def test_natural_step_erratum_of_seeds_000_and_002(data, delta):
    # errata.md entry 9: theta' = theta + alpha F^-1 g with alpha = sqrt(2 delta / (g^T F g)). Its quadratic
    # KL
    # 0.5 alpha^2 (F^-1 g)^T F (F^-1 g) = delta (g^T F^-1 g) / (g^T F g), not delta; the step of
    # Schulman et al. 2015, Appendix C,
    # beta = sqrt(2 delta / (s^T F s)) with s = F^-1 g gives exactly delta.
    mdp = data.draw(seeded_random_mdps())
    S, A = mdp.num_states, mdp.num_actions
    theta = data.draw(softmax_params(S, A, scale=2.0))
    g = tabular.policy_gradient(mdp, theta).reshape(-1)
    fisher = tabular.fisher_matrix(mdp, theta)
    s = tabular.natural_gradient(mdp, theta).reshape(-1)  # F^+ g
    d = occupancy(mdp, theta)
    fs = tr.fisher_vector_product(log_softmax, t64(theta), t64(s.reshape(S, A)), d)
    beta = tr.trust_region_step_scale(t64(s), fs.reshape(-1), delta)
    assert math.isclose(0.5 * beta**2 * float(s @ fisher @ s), delta, rel_tol=1e-9)
    g_f_g = float(g @ fisher @ g)
    g_finv_g = float(g @ s)
    alpha_erratum = math.sqrt(2.0 * delta / g_f_g)
    quadratic_kl_erratum = 0.5 * alpha_erratum**2 * float(s @ fisher @ s)
    assert math.isclose(quadratic_kl_erratum, delta * g_finv_g / g_f_g, rel_tol=1e-9)
    if abs(g_finv_g / g_f_g - 1.0) > 1e-6:  # g not an eigenvector of F with eigenvalue 1
        assert not math.isclose(quadratic_kl_erratum, delta, rel_tol=1e-6)


def test_natural_step_erratum_differs_from_delta_on_a_fixed_case():
    mdp, theta = bandit([1.0, 0.0, -1.0], [1.0, 0.0, 0.5], gamma=0.0)
    g = tabular.policy_gradient(mdp, theta).reshape(-1)
    fisher = tabular.fisher_matrix(mdp, theta)
    s = tabular.natural_gradient(mdp, theta).reshape(-1)
    ratio = float(g @ s) / float(g @ fisher @ g)  # the erratum's KL is delta * ratio
    assert ratio > 2.0  # the small Fisher eigenvalues make the erratum's step overshoot delta


# ----------------------------------------------------------------------------- masks, devices, errors
def test_trpo_with_damping_still_scales_by_the_undamped_quadratic_kl():
    mdp = full_support_mdp(8, 5, 3, 0.9)
    theta = random_theta(8, 5, 3)
    new, record = tr.trpo_step(exact_surrogate_fn(mdp, theta), log_softmax, t64(theta), occupancy(mdp, theta),
                               0.01, damping=0.5, cg_iters=60)
    step = (new.numpy() - theta).reshape(-1)
    quadratic = 0.5 * float(step @ tabular.fisher_matrix(mdp, theta) @ step)
    assert record.accepted and math.isclose(quadratic, record.quadratic_kl, rel_tol=1e-9)
    assert math.isclose(record.quadratic_kl, record.step_fraction**2 * 0.01, rel_tol=1e-12)


def test_zero_probability_actions_are_handled():
    # A -inf logit is an action the policy never takes: it contributes nothing to the KL or Fisher.
    theta = torch.tensor([[0.5, -0.5, 7.0], [0.0, 1.0, 2.0]], dtype=torch.float64)
    action_mask = torch.tensor([[0.0, 0.0, float("-inf")], [0.0, 0.0, 0.0]], dtype=torch.float64)
    w = torch.tensor([0.25, 0.75], dtype=torch.float64)
    v = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]], dtype=torch.float64)
    got = tr.fisher_vector_product(lambda t: log_softmax(t + action_mask), theta, v, w)
    pi = torch.softmax(theta + action_mask, dim=-1)
    expected = w[:, None] * (pi * v - pi * (pi * v).sum(-1, keepdim=True))  # (diag pi - pi pi^T) v
    assert torch.isfinite(got).all() and torch.allclose(got, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_parameters_compute_in_float32(dtype):
    mdp = full_support_mdp(9, 4, 3, 0.9)
    theta, v = random_theta(9, 4, 3), random_theta(10, 4, 3)
    d = occupancy(mdp, theta)
    exact = tr.fisher_vector_product(log_softmax, t64(theta), t64(v), d)
    low = tr.fisher_vector_product(log_softmax, t64(theta).to(dtype), t64(v).to(dtype), d.to(dtype))
    assert low.dtype == torch.float32
    # Inputs rounded to dtype (bfloat16: 8 bits), arithmetic in float32.
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert torch.allclose(low.double(), exact, rtol=tol, atol=tol * float(exact.abs().max()))
    new, record = tr.trpo_step(lambda th: torch.softmax(th, dim=-1)[:, 0].sum(), log_softmax,
                               t64(theta).to(dtype), d.to(dtype), 0.01)
    assert new.dtype == dtype and record.accepted


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA path, exercised only where CUDA exists")
def test_trpo_step_runs_on_cuda_and_matches_cpu():
    mdp = full_support_mdp(6, 4, 3, 0.9)
    theta = random_theta(6, 4, 3)
    pi = tabular.softmax_policy(theta)
    d, adv = occupancy(mdp, theta), t64(tabular.advantages(mdp, pi))

    def run(device):
        dd, aa = d.to(device), adv.to(device)
        def surrogate(th):
            return (dd[:, None] * torch.softmax(th, dim=-1) * aa).sum() / (1.0 - mdp.gamma)
        return tr.trpo_step(surrogate, log_softmax, t64(theta).to(device), dd, 0.01)

    cpu_new, cpu_record = run("cpu")
    gpu_new, gpu_record = run("cuda")
    assert gpu_new.device.type == "cuda"
    assert torch.allclose(gpu_new.cpu(), cpu_new, rtol=1e-9, atol=1e-12)
    assert cpu_record.backtracks == gpu_record.backtracks


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs two devices (CPU and CUDA)")
def test_state_weights_on_another_device_are_rejected():
    with pytest.raises(ValueError, match=r"^state_weights must be on cpu, got cuda"):
        weights = torch.ones(1, device="cuda")
        tr.fisher_vector_product(log_softmax, torch.zeros(1, 2), torch.ones(1, 2), weights)


def test_state_weights_on_another_device_than_the_log_probs_are_rejected():
    """Without an accelerator: the meta device exists on every build. mean_kl compares the weights'
    device with that of log_prob_fn's output before reading any value."""
    with pytest.raises(ValueError, match=r"^state_weights must be on meta, got cpu$"):
        tr.mean_kl(lambda theta: log_softmax(theta).to("meta"), torch.zeros(1, 2, device="meta"),
                   torch.zeros(1, 2), torch.ones(1))


def test_bad_input_is_rejected_with_the_argument_named():
    theta = torch.zeros(2, 3, dtype=torch.float64)
    w = torch.tensor([0.5, 0.5], dtype=torch.float64)
    v = torch.ones(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="state_weights must sum to 1"):
        tr.fisher_vector_product(log_softmax, theta, v, torch.tensor([0.5, 0.6], dtype=torch.float64))
    with pytest.raises(ValueError, match="state_weights must have shape"):
        tr.fisher_vector_product(log_softmax, theta, v, torch.ones(3, dtype=torch.float64) / 3)
    with pytest.raises(ValueError, match="non-negative"):
        tr.fisher_vector_product(log_softmax, theta, v, torch.tensor([1.5, -0.5], dtype=torch.float64))
    with pytest.raises(ValueError, match="vector"):
        tr.fisher_vector_product(log_softmax, theta, torch.ones(3, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="damping"):
        tr.fisher_vector_product(log_softmax, theta, v, w, damping=-1.0)
    with pytest.raises(ValueError, match="params contains NaN"):
        tr.fisher_vector_product(log_softmax, theta * float("nan"), v, w)
    with pytest.raises(ValueError, match=r"log_prob_fn must return a \[N, A\]"):
        tr.fisher_vector_product(lambda t: t.reshape(-1), theta, v, w)
    def surrogate(t):
        return torch.softmax(t, dim=-1)[:, 0].sum()
    with pytest.raises(ValueError, match="^max_kl must be > 0$"):
        tr.trpo_step(surrogate, log_softmax, theta, w, 0.0)
    with pytest.raises(ValueError, match="backtrack_ratio"):
        tr.trpo_step(surrogate, log_softmax, theta, w, 0.01, backtrack_ratio=1.0)
    with pytest.raises(ValueError, match="^surrogate_fn must return a scalar tensor$"):
        tr.trpo_step(lambda t: torch.softmax(t, dim=-1), log_softmax, theta, w, 0.01)
    with pytest.raises(ValueError, match="s\\^T F s"):
        tr.trust_region_step_scale(v, torch.zeros_like(v), 0.01)


# ------------------------------------------------------------------------ issue 11: gaps found by mutation
def test_cg_raises_on_a_non_finite_product_instead_of_returning_zero():
    # The contract: no silent non-finite values. Before, a NaN product broke the loop and returned
    # x = 0 with converged=False and no error.
    b = torch.ones(3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^matvec returned a non-finite product \(NaN or inf\) at"
                       r" iteration 1$"):
        tr.conjugate_gradient(lambda x: x * float("nan"), b, 5)
    with pytest.raises(ValueError, match="matvec returned a non-finite product"):
        tr.conjugate_gradient(lambda x: x * float("inf"), b, 5)
    calls = []

    def nan_on_second_call(x):
        calls.append(1)
        scale = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
        return scale * x if len(calls) == 1 else x * float("nan")

    with pytest.raises(ValueError, match="at iteration 2"):
        tr.conjugate_gradient(nan_on_second_call, b, 5)
    # An overflowing curvature p^T M p (finite entries, infinite inner product) is non-finite too.
    with pytest.raises(ValueError, match="non-finite product"):  # M p = 1e300 (finite), p.Mp = 3e310
        tr.conjugate_gradient(lambda x: 1e290 * x, torch.full((3,), 1e10, dtype=torch.float64), 5)


def test_cg_curvature_floor_stops_below_the_floor_and_not_above():
    # M = diag(1, 1e-6), b = (1, 1). p_0 = b has Rayleigh quotient (1 + 1e-6) / 2; after one step
    # p_1 is (up to rounding) the eigenvector of 1e-6, Rayleigh quotient ~1e-6: ratio ~2e-6.
    m = torch.tensor([1.0, 1e-6], dtype=torch.float64)
    b = torch.ones(2, dtype=torch.float64)
    # tol 1e-8: two iterations reach u kappa = 1e-10 (a third would chase rounding).
    exact = tr.conjugate_gradient(lambda x: m * x, b, 5, tol=1e-8)
    assert exact.converged and exact.iterations == 2
    assert torch.allclose(exact.solution, b / m, rtol=1e-8, atol=0.0)
    stopped = tr.conjugate_gradient(lambda x: m * x, b, 5, tol=1e-8, curvature_floor=1e-5)
    assert stopped.iterations == 1 and not stopped.converged
    below = tr.conjugate_gradient(lambda x: m * x, b, 5, tol=1e-8, curvature_floor=1e-7)
    assert below.converged and below.iterations == 2
    # floor 0: only p^T M p <= 0 stops; a zero-curvature direction does.
    zero = tr.conjugate_gradient(lambda x: torch.zeros_like(x), b, 5, curvature_floor=0.0)
    assert zero.iterations == 0 and not zero.converged and torch.equal(zero.solution, torch.zeros(2).double())
    with pytest.raises(ValueError, match=r"curvature_floor must lie in \[0, 1\)"):
        tr.conjugate_gradient(lambda x: x, b, 3, curvature_floor=1.0)
    with pytest.raises(ValueError, match="curvature_floor must be finite and >= 0"):
        tr.conjugate_gradient(lambda x: x, b, 3, curvature_floor=-1e-3)


def test_cg_reports_its_residual_and_iterations_exactly():
    # M = diag(2, 3): CG needs exactly 2 iterations; after 1, x = a b with a = b.b / b.Mb = 2/5 and
    # residual b - a M b = (1 - 4/5, 1 - 6/5) = (0.2, -0.2).
    m = torch.tensor([2.0, 3.0], dtype=torch.float64)
    b = torch.ones(2, dtype=torch.float64)
    one = tr.conjugate_gradient(lambda x: m * x, b, 1, tol=0.0)  # a few roundings of O(1) numbers
    assert one.iterations == 1 and not one.converged
    assert torch.allclose(one.solution, torch.full((2,), 0.4, dtype=torch.float64), rtol=1e-15, atol=0.0)
    assert math.isclose(one.residual_norm, math.sqrt(0.08), rel_tol=1e-14)
    assert math.isclose(one.relative_residual, math.sqrt(0.08) / math.sqrt(2.0), rel_tol=1e-14)
    # tol exactly at the residual reached: converged (<=), and the loop stops there.
    at_tol = tr.conjugate_gradient(lambda x: m * x, b, 5, tol=one.relative_residual)
    assert at_tol.iterations == 1 and at_tol.converged
    two = tr.conjugate_gradient(lambda x: m * x, b, 2, tol=0.0)
    assert two.iterations == 2 and torch.allclose(two.solution, 1.0 / m, rtol=1e-14, atol=0.0)
    assert two.residual_norm <= 1e-15 and two.converged == (two.residual_norm == 0.0)
    low = tr.conjugate_gradient(lambda x: m.float() * x, b.float(), 2, tol=1e-5)
    assert low.solution.dtype == torch.float32 and low.converged


def test_fisher_resolution_counts_only_visited_states_and_actions_of_the_policy():
    log_probs = torch.log(torch.tensor([[0.5, 0.5, 0.0], [1e-3, 0.999, 0.0], [1e-9, 0.5, 0.5 - 1e-9]],
                                       dtype=torch.float64))
    weights = torch.tensor([0.75, 0.25, 0.0], dtype=torch.float64)
    params = torch.zeros(3, 3, dtype=torch.float64)
    res = tr.fisher_resolution(lambda p: log_probs + 0.0 * p, params, weights)
    # The zero-probability actions (log -inf) and the unvisited state 2 (pi 1e-9) do not count.
    assert math.isclose(res.min_weighted_prob, 0.25 * 1e-3, rel_tol=1e-12)
    assert res.threshold == math.sqrt(2.0**-53) * 0.75 and res.resolvable
    damped = tr.fisher_resolution(lambda p: log_probs + 0.0 * p, params, weights, damping=0.5)
    assert damped.threshold == math.sqrt(2.0**-53) * (0.75 + 0.5) - 0.5 and damped.resolvable
    # A finite log-probability whose exponential underflows counts (as 0): not resolvable.
    tiny = torch.tensor([[0.0, -800.0]], dtype=torch.float64)
    res = tr.fisher_resolution(lambda p: tiny + 0.0 * p, torch.zeros(1, 2, dtype=torch.float64),
                               torch.ones(1, dtype=torch.float64))
    assert res.min_weighted_prob == 0.0 and not res.resolvable
    assert not res.tabular_softmax  # log_prob_fn is not log_softmax(params): eq. (18)
    # float32 parameters: u = 2^-24, threshold sqrt(2^-24) = 2^-12 (eq. (18), general path) and
    # sqrt(2^-24) f_min = 2^-12 2^-126 (eq. (19), tabular softmax path).
    res = tr.fisher_resolution(flat_log_softmax(1, 2), torch.zeros(2), torch.ones(1))
    assert res.threshold == 2.0**-12 and res.resolvable and not res.tabular_softmax
    assert math.isclose(res.min_weighted_prob, 0.5, rel_tol=2.0**-22)  # log(0.5) rounded to float32
    res = tr.fisher_resolution(log_softmax, torch.zeros(1, 2), torch.ones(1))
    assert res.threshold == 2.0**-138 and res.resolvable and res.tabular_softmax
    damped = tr.fisher_resolution(log_softmax, torch.zeros(1, 2), torch.ones(1), damping=0.5)
    assert damped.threshold == 2.0**-138 - 0.5
    all_minus_inf = torch.full((1, 2), float("-inf"))
    with pytest.raises(ValueError, match="log_prob_fn.params. must have no NaN and a finite entry in every"):
        tr.fisher_resolution(lambda p: all_minus_inf + p, torch.zeros(1, 2), torch.ones(1))
    message = r"^log_prob_fn\(params\) must have no NaN and a finite entry in every row$"
    with pytest.raises(ValueError, match=message):  # a NaN next to a finite entry
        tr.fisher_resolution(lambda p: p + torch.tensor([[math.nan, 0.0]]), torch.zeros(1, 2), torch.ones(1))
    two_rows = torch.tensor([[0.0, 0.0], [float("-inf"), float("-inf")]])  # every column has a finite entry
    with pytest.raises(ValueError, match=message):
        tr.fisher_resolution(lambda p: p + two_rows, torch.zeros(2, 2), torch.full((2,), 0.5))
    with pytest.raises(TypeError, match="^params must be a floating-point tensor"):
        tr.fisher_resolution(log_softmax, torch.zeros(1, 2, dtype=torch.int64), torch.ones(1))
    with pytest.raises(ValueError, match="damping must be finite and >= 0"):
        tr.fisher_resolution(log_softmax, torch.zeros(1, 2), torch.ones(1), damping=-1.0)


def test_natural_gradient_step_moves_by_step_size_times_direction_in_the_parameters_dtype():
    mdp = full_support_mdp(3, 3, 3, 0.5)
    theta = random_theta(4, 3, 3)
    g = t64(tabular.policy_gradient(mdp, theta))
    d = occupancy(mdp, theta)
    step = tr.natural_gradient_step(log_softmax, t64(theta), g, d, 0.7, cg_iters=36, cg_tol=1e-13)
    assert torch.equal(step.params, t64(theta) + 0.7 * step.direction)
    assert step.resolution == tr.fisher_resolution(log_softmax, t64(theta), d)
    low = tr.natural_gradient_step(log_softmax, t64(theta).float(), g.float(), d.float(), 0.7, cg_iters=36,
                                   cg_tol=1e-5)
    assert low.params.dtype == torch.float32 and low.direction.dtype == torch.float32
    # cg_iters and cg_tol reach CG (general path, plain CG): one iteration is the steepest-descent
    # step (b.b / b.Fb) b.
    flat, g_flat = flat_log_softmax(3, 3), g.reshape(-1)
    one = tr.natural_gradient_step(flat, t64(theta).reshape(-1), g_flat, d, 1.0, cg_iters=1)
    fg = tabular.fisher_matrix(mdp, theta) @ g.numpy().reshape(-1)
    expected = float(g_flat @ g_flat) / float(g.numpy().reshape(-1) @ fg) * g_flat
    assert one.cg.iterations == 1 and torch.allclose(one.direction, expected, rtol=1e-12, atol=0.0)
    loose = tr.natural_gradient_direction(flat, t64(theta).reshape(-1), g_flat, d, cg_iters=36, cg_tol=0.5)
    tight = tr.natural_gradient_direction(flat, t64(theta).reshape(-1), g_flat, d, cg_iters=36, cg_tol=1e-13)
    assert loose.converged and loose.relative_residual <= 0.5
    assert loose.iterations < tight.iterations and tight.converged
    # The tabular path (eq. (19)): preconditioned by diag(d pi), under which F is a projector, CG
    # converges in one iteration to the centred closed form (eq. (8)), with one step or fifty.
    closed_form = tabular.natural_gradient_closed_form(mdp, theta)
    for iters in (1, 50):
        tab = tr.natural_gradient_direction(log_softmax, t64(theta), g, d, cg_iters=iters, cg_tol=1e-13)
        assert tab.iterations == 1 and tab.converged
        atol = 1e-13 * np.abs(closed_form).max()
        assert np.allclose(tab.solution.numpy(), closed_form, rtol=1e-12, atol=atol)
    # damping reaches the products: (F + lambda I) s = g.
    damped = tr.natural_gradient_direction(log_softmax, t64(theta), g, d, cg_iters=60, cg_tol=1e-13,
                                           damping=0.3)
    fisher = tabular.fisher_matrix(mdp, theta)  # kappa(F + 0.3 I) <= (0.5 + 0.3) / 0.3: 1e-10 is ample
    expected = np.linalg.solve(fisher + 0.3 * np.eye(9), g.numpy().reshape(-1))
    assert np.allclose(damped.solution.numpy().reshape(-1), expected, rtol=1e-10, atol=1e-13)
    with pytest.raises(ValueError, match="step_size must be finite and >= 0"):
        tr.natural_gradient_step(log_softmax, t64(theta), g, d, -1.0)
    with pytest.raises(ValueError, match=r"gradient must have the parameters' shape \(3, 3\), got \(9,\)"):
        tr.natural_gradient_direction(log_softmax, t64(theta), g.reshape(-1), d)
    with pytest.raises(ValueError, match="cg_iters must be >= 1"):
        tr.natural_gradient_direction(log_softmax, t64(theta), g, d, cg_iters=0)
    with pytest.raises(ValueError, match="cg_tol must be finite and >= 0"):
        tr.natural_gradient_direction(log_softmax, t64(theta), g, d, cg_tol=float("nan"))


def test_trpo_improvement_is_measured_from_the_old_surrogate_whatever_its_offset():
    # A surrogate plus a constant has the same gradient, step and improvements: the record reports
    # L(candidate) - L(old), not L(candidate) + L(old).
    mdp, theta = bandit([2.0, 0.0], [0.0, 1.0])
    surrogate = exact_surrogate_fn(mdp, theta)
    w = occupancy(mdp, theta)
    _, plain = tr.trpo_step(surrogate, log_softmax, t64(theta), w, 0.1, backtrack_ratio=0.5)
    _, offset = tr.trpo_step(lambda th: surrogate(th) + 7.25, log_softmax, t64(theta), w, 0.1,
                             backtrack_ratio=0.5)
    _, rows = exact_backtracking_sequence(mdp, theta, 0.1, 0.5, 1)
    assert offset.status == plain.status == "accepted" and offset.backtracks == plain.backtracks == 1
    for got, (_, gain, _) in zip(offset.candidates, rows, strict=True):
        # The offset's rounding: 7.25 has spacing 2^-50 ~ 9e-16, on gains of order 0.1.
        assert math.isclose(got.improvement, gain, rel_tol=1e-12, abs_tol=4e-15)
    assert math.isclose(offset.actual_improvement, rows[1][1], rel_tol=1e-12, abs_tol=4e-15)


def test_trpo_passes_damping_cg_iters_and_cg_tol_to_cg():
    mdp = full_support_mdp(8, 5, 3, 0.9)
    theta = random_theta(8, 5, 3)
    surrogate, w = exact_surrogate_fn(mdp, theta), occupancy(mdp, theta)
    g = tabular.policy_gradient(mdp, theta).reshape(-1)
    fisher = tabular.fisher_matrix(mdp, theta)
    _, damped = tr.trpo_step(surrogate, log_softmax, t64(theta), w, 0.01, damping=0.5, cg_iters=60,
                             cg_tol=1e-13)
    expected = np.linalg.solve(fisher + 0.5 * np.eye(15), g)  # kappa <= 2.1: 1e-10 is generous
    assert np.allclose(damped.cg.solution.numpy().reshape(-1), expected, rtol=1e-10, atol=1e-13)
    # General path (flattened parameters, plain CG): cg_iters and cg_tol reach CG.
    flat, flat_theta = flat_log_softmax(5, 3), t64(theta).reshape(-1)

    def flat_surrogate(t):
        return surrogate(t.reshape(5, 3))

    _, one = tr.trpo_step(flat_surrogate, flat, flat_theta, w, 0.01, cg_iters=1)
    assert one.cg.iterations == 1
    steepest = float(g @ g) / float(g @ fisher @ g) * g  # one step: two inner products, a few u each
    assert np.allclose(one.cg.solution.numpy(), steepest, rtol=1e-12, atol=0.0)
    _, loose = tr.trpo_step(flat_surrogate, flat, flat_theta, w, 0.01, cg_iters=60, cg_tol=0.3)
    _, tight = tr.trpo_step(flat_surrogate, flat, flat_theta, w, 0.01, cg_iters=60, cg_tol=1e-13)
    assert loose.cg.converged and loose.cg.relative_residual <= 0.3
    assert loose.cg.iterations < tight.cg.iterations
    # Tabular path: one preconditioned iteration whatever the budget.
    _, tab = tr.trpo_step(surrogate, log_softmax, t64(theta), w, 0.01, cg_iters=60, cg_tol=1e-13)
    assert tab.cg.iterations == 1 and tab.resolution.tabular_softmax
    assert loose.resolution.resolvable and damped.resolution.threshold < 0.0  # damping 0.5 >> sqrt(u)


def test_trpo_no_curvature_when_the_gradient_moves_a_parameter_the_policy_ignores():
    # params = (theta[0], theta[1], z): the policy uses theta only, the surrogate also rewards z, so
    # g has a component along z where F is exactly 0. With damping CG returns s = g / lambda there,
    # and if g lies only along z, s^T F s = 0: no step.
    def policy(p):
        return torch.log_softmax(p[:2], dim=-1)[None, :]

    params = torch.tensor([0.3, -0.2, 1.0], dtype=torch.float64)
    w = torch.ones(1, dtype=torch.float64)
    for damping in (0.0, 0.25):
        new, record = tr.trpo_step(lambda p: 2.0 * p[2], policy, params, w, 0.01, damping=damping)
        assert record.status == "no_curvature" and not record.accepted and not record.candidates
        assert record.backtracks == 0 and record.full_step_scale == 0.0 and record.kl == 0.0
        assert torch.equal(new, params)
    # F's z row is exactly 0: CG's first step is s = (r.r / (lambda r.r)) r = g / lambda = (0, 0, 8) exactly
    assert torch.equal(record.cg.solution, torch.tensor([0.0, 0.0, 8.0], dtype=torch.float64))


def test_trpo_record_when_no_candidate_is_acceptable_lists_them_all():
    mdp, theta = bandit([2.0, 0.0], [0.0, 1.0])
    new, record = tr.trpo_step(exact_surrogate_fn(mdp, theta), log_softmax, t64(theta), occupancy(mdp, theta),
                               0.1, backtrack_ratio=0.5, max_backtracks=0)
    beta, _ = exact_backtracking_sequence(mdp, theta, 0.1, 0.5, 0)
    assert record.status == "no_acceptable_step" and torch.equal(new, t64(theta))
    assert record.backtracks == 0 and len(record.candidates) == 1 and record.step_fraction == 0.0
    assert math.isclose(record.full_step_scale, beta, rel_tol=1e-10)
    assert record.quadratic_kl == 0.0 and record.expected_improvement == 0.0 and record.max_kl == 0.1
    # A surrogate with the same gradient but a steep concave penalty: every candidate (steps of
    # size >= 0.1) loses about 1e6 |step|^2, so none is acceptable; all 4 are listed.
    theta0 = t64(theta)

    def penalised(th):
        return exact_surrogate_fn(mdp, theta)(th) - 1e6 * ((th - theta0) ** 2).sum()

    new, record = tr.trpo_step(penalised, log_softmax, theta0, occupancy(mdp, theta), 0.1,
                               backtrack_ratio=0.5, max_backtracks=3)
    assert record.status == "no_acceptable_step" and torch.equal(new, theta0)
    assert record.backtracks == 3 and [c.fraction for c in record.candidates] == [1.0, 0.5, 0.25, 0.125]
    assert all(c.improvement < 0.0 for c in record.candidates)


def test_trpo_rejects_bad_arguments_by_name():
    theta = torch.zeros(2, 3, dtype=torch.float64)
    w = torch.tensor([0.5, 0.5], dtype=torch.float64)

    def surrogate(t):
        return torch.softmax(t, dim=-1)[:, 0].sum()

    cases = [
        (dict(max_kl=-1.0), ValueError, "max_kl must be finite and >= 0"),
        (dict(max_kl=float("inf")), ValueError, "max_kl must be finite and >= 0"),
        (dict(max_kl="0.1"), TypeError, "max_kl must be a real number, got str"),
        (dict(backtrack_ratio=0.0), ValueError, r"backtrack_ratio must lie in \(0, 1\), got 0.0"),
        (dict(backtrack_ratio=True), TypeError, "backtrack_ratio must be a real number, got bool"),
        (dict(max_backtracks=-1), ValueError, "max_backtracks must be >= 0, got -1"),
        (dict(max_backtracks=2.0), TypeError, "max_backtracks must be an int, got float"),
        (dict(cg_iters=0), ValueError, "cg_iters must be >= 1, got 0"),
        (dict(cg_iters=True), TypeError, "cg_iters must be an int, got bool"),
        (dict(cg_tol=-1e-3), ValueError, "cg_tol must be finite and >= 0"),
        (dict(damping=-0.1), ValueError, "damping must be finite and >= 0"),
    ]
    for overrides, error, message in cases:
        kwargs = dict(max_kl=0.01) | overrides
        max_kl = kwargs.pop("max_kl")
        with pytest.raises(error, match=message):
            tr.trpo_step(surrogate, log_softmax, theta, w, max_kl, **kwargs)
    with pytest.raises(ValueError, match="surrogate_fn must return a scalar tensor"):
        tr.trpo_step(lambda t: 1.0, log_softmax, theta, w, 0.01)
    with pytest.raises(ValueError, match="state_weights must sum to 1"):
        tr.trpo_step(surrogate, log_softmax, theta, torch.tensor([0.5, 0.6], dtype=torch.float64), 0.01)
    with pytest.raises(TypeError, match="params must be a floating-point tensor"):
        tr.trpo_step(surrogate, log_softmax, torch.zeros(2, 3, dtype=torch.int64), w, 0.01)


def test_check_messages_name_the_argument():
    theta = torch.zeros(2, 3, dtype=torch.float64)
    w = torch.tensor([0.5, 0.5], dtype=torch.float64)
    v = torch.ones(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"state_weights must have shape \[N\] = \(2,\) matching "
                                         r"log_prob_fn's output, got \(3,\)"):
        tr.fisher_vector_product(log_softmax, theta, v, torch.ones(3, dtype=torch.float64) / 3)
    with pytest.raises(ValueError, match=r"^state_weights must be non-negative$"):
        tr.fisher_vector_product(log_softmax, theta, v, torch.tensor([1.5, -0.5], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"state_weights must sum to 1 \(a distribution over states\), "
                                         r"got 1\.1"):
        tr.fisher_vector_product(log_softmax, theta, v, torch.tensor([0.5, 0.6], dtype=torch.float64))
    with pytest.raises(TypeError, match="state_weights must be a floating-point tensor"):
        tr.fisher_vector_product(log_softmax, theta, v, torch.tensor([1, 0]))
    with pytest.raises(ValueError, match=r"log_prob_fn must return a \[N, A\] tensor of log-probabilities, "
                                         r"got list"):
        tr.fisher_vector_product(lambda t: [t], theta, v, w)
    with pytest.raises(ValueError, match=r"log_prob_fn must return a \[N, A\] tensor of log-probabilities, "
                                         r"got \(6,\)$"):
        tr.fisher_vector_product(lambda t: t.reshape(-1), theta, v, w)
    with pytest.raises(ValueError, match="^damping must be finite and >= 0"):
        tr.fisher_vector_product(log_softmax, theta, v, w, damping=-1.0)
    with pytest.raises(TypeError, match="^params must be a floating-point tensor"):
        tr.mean_kl(log_softmax, theta, torch.zeros(2, 3, dtype=torch.int64), w)
    with pytest.raises(ValueError, match="^gradient contains NaN or inf"):
        tr.natural_gradient_direction(log_softmax, theta, v * float("nan"), w)
    with pytest.raises(TypeError, match="^gradient must be a floating-point tensor"):
        tr.natural_gradient_step(log_softmax, theta, torch.ones(2, 3, dtype=torch.int64), w, 1.0)
    with pytest.raises(ValueError, match=r"vector must be a tensor of the parameters' shape \(2, 3\)"):
        tr.fisher_vector_product_fn(log_softmax, theta, w)([1.0])
    with pytest.raises(TypeError, match="vector must be a floating-point tensor"):
        tr.fisher_vector_product(log_softmax, theta, torch.ones(2, 3, dtype=torch.int64), w)
    with pytest.raises(ValueError, match=r"log_prob_fn\(params\) has shape \(2, 3\) but old_log_probs has "
                                         r"shape \(2, 2\)"):
        tr.mean_kl(log_softmax, torch.zeros(2, 2, dtype=torch.float64), theta, w)
    with pytest.raises(ValueError, match="max_kl must be finite and >= 0"):
        tr.trust_region_step_scale(v, v, -0.1)
    with pytest.raises(ValueError, match=r"^direction, fisher_direction: s\^T F s must be > 0"):
        tr.trust_region_step_scale(v, -v, 0.1)
    with pytest.raises(TypeError, match="iters must be an int, got bool"):
        tr.conjugate_gradient(lambda x: x, v, True)
    with pytest.raises(ValueError, match=r"tol must be finite and >= 0, got inf"):
        tr.conjugate_gradient(lambda x: x, v, 3, tol=float("inf"))
    with pytest.raises(TypeError, match="tol must be a real number, got NoneType"):
        tr.conjugate_gradient(lambda x: x, v, 3, tol=None)
    with pytest.raises(ValueError, match=r"matvec must return a tensor of shape \(2, 3\)"):
        tr.conjugate_gradient(lambda x: x.tolist(), v, 3)


def test_state_weights_tolerance_follows_the_weights_dtype():
    # Sums are checked to max(1e-6, N eps(dtype)): float64 weights off by 2e-6 are rejected, by
    # 5e-7 accepted; 20 float32 weights may be off by 20 eps32 = 2.4e-6 but not by 4e-6. The bound
    # is inclusive: 10 float32 weights summing (exactly, in float64) to 1 + 10 eps32 pass.
    theta10 = torch.zeros(10, 2)
    exact_bound = torch.zeros(10)
    exact_bound[0], exact_bound[1] = 0.5 + 10 * 2.0**-23, 0.5  # representable in float32 (ulp 2^-24)
    assert float(exact_bound.double().sum()) - 1.0 == 10 * 2.0**-23
    tr.fisher_vector_product(log_softmax, theta10, torch.ones(10, 2), exact_bound)
    exact_bound[0] += 2.0**-24
    with pytest.raises(ValueError, match="sum to 1"):
        tr.fisher_vector_product(log_softmax, theta10, torch.ones(10, 2), exact_bound)
    theta = torch.zeros(2, 3, dtype=torch.float64)
    v = torch.ones(2, 3, dtype=torch.float64)
    tr.fisher_vector_product(log_softmax, theta, v, torch.tensor([0.5, 0.5 + 5e-7], dtype=torch.float64))
    with pytest.raises(ValueError, match="sum to 1"):
        tr.fisher_vector_product(log_softmax, theta, v, torch.tensor([0.5, 0.5 + 2e-6], dtype=torch.float64))
    theta20, v20 = torch.zeros(20, 2), torch.ones(20, 2)
    tr.fisher_vector_product(log_softmax, theta20, v20, torch.full((20,), (1.0 + 2.2e-6) / 20))
    with pytest.raises(ValueError, match="sum to 1"):
        tr.fisher_vector_product(log_softmax, theta20, v20, torch.full((20,), (1.0 + 4e-6) / 20))


def test_resolution_exactly_at_the_threshold_is_not_a_refusal():
    # Eq. (18) is inclusive: m = threshold resolves. The threshold sqrt(u) (W + lambda) - lambda is
    # tuned by a tiny damping until it equals, in floating point, the m the implementation computed.
    root_u = math.sqrt(2.0**-53)
    weights = torch.ones(1, dtype=torch.float64)
    params = torch.zeros(1, 2, dtype=torch.float64)
    for k in range(1, 50):
        log_p = math.log(root_u) - k * float(np.spacing(abs(math.log(root_u))))
        log_probs = torch.tensor([[log_p, math.log1p(-math.exp(log_p))]], dtype=torch.float64)
        m = tr.fisher_resolution(lambda p, lp=log_probs: lp + 0.0 * p, params, weights).min_weighted_prob
        if not m < root_u:
            continue
        guess = (root_u - m) / (1.0 - root_u)
        for j in range(-3000, 3000):
            damping = guess + j * float(np.spacing(guess))
            if root_u * (1.0 + damping) - damping == m:
                res = tr.fisher_resolution(lambda p, lp=log_probs: lp + 0.0 * p, params, weights,
                                           damping=damping)
                assert res.threshold == res.min_weighted_prob == m and res.resolvable
                undamped = tr.fisher_resolution(lambda p, lp=log_probs: lp + 0.0 * p, params, weights)
                assert undamped.threshold == root_u > m and not undamped.resolvable
                return
    pytest.fail("no damping puts the threshold exactly on m")


def spread_bandit(num_actions: int = 80):
    """One state, logits 0..12 (pi from 1 down to 6e-6, above eq. (18)): a Fisher with 79 distinct
    eigenvalues spread geometrically, so CG needs more than 50 iterations for 1e-10."""
    theta = torch.linspace(0.0, 12.0, num_actions, dtype=torch.float64)[None]
    rewards = torch.tensor(np.random.default_rng(0).uniform(size=(1, num_actions)))
    pi = torch.softmax(theta, dim=-1)
    adv = rewards - (pi * rewards).sum(-1, keepdim=True)
    return theta, pi * adv, adv


def test_default_cg_budgets_are_the_documented_ones():
    # On the general path (plain CG; flattened parameters) the spread bandit needs more than 50.
    theta, gradient, adv = spread_bandit()
    flat, num_actions = flat_log_softmax(1, theta.shape[1]), theta.shape[1]
    w = torch.ones(1, dtype=torch.float64)
    direction = tr.natural_gradient_direction(flat, theta.reshape(-1), gradient.reshape(-1), w)
    assert direction.iterations == 50 and not direction.converged  # cg_iters = 50, cg_tol = 1e-10
    step = tr.natural_gradient_step(flat, theta.reshape(-1), gradient.reshape(-1), w, 1.0)
    assert step.cg.iterations == 50 and torch.equal(step.direction, direction.solution)
    # The tabular path resolves it in one preconditioned iteration.
    tab = tr.natural_gradient_direction(log_softmax, theta, gradient, w)
    assert tab.iterations == 1 and tab.converged and num_actions == 80
    assert torch.allclose(tab.solution, adv - adv.mean(), rtol=0.0, atol=1e-14)
    # The default tolerance is 1e-10: a well-conditioned case converges to it (not to 1 or 0).
    mild = torch.tensor([[0.2, -0.1, 0.4]], dtype=torch.float64)
    pi = torch.softmax(mild, dim=-1)
    r = torch.tensor([[0.3, 0.9, 0.1]], dtype=torch.float64)
    g = pi * (r - (pi * r).sum())
    res = tr.natural_gradient_direction(flat_log_softmax(1, 3), mild.reshape(-1), g.reshape(-1), w)
    assert res.converged and res.relative_residual <= 1e-10 and res.iterations == 2
    centred_adv = (r - (pi * r).sum()) - (r - (pi * r).sum()).mean()  # kappa ~ 3: residual 1e-10 -> 1e-9
    assert torch.allclose(res.solution, centred_adv.reshape(-1), rtol=1e-9, atol=1e-12)
    _, record = tr.trpo_step(lambda th: (torch.softmax(th.reshape(1, -1), dim=-1) * adv).sum(), flat,
                             theta.reshape(-1), w, 0.01)
    assert record.cg.iterations == 10  # cg_iters = 10


def test_trpo_default_max_backtracks_is_10():
    mdp, theta = bandit([2.0, 0.0], [0.0, 1.0])
    theta0 = t64(theta)

    def penalised(th):  # same gradient, but every candidate loses ~1e6 |step|^2
        return exact_surrogate_fn(mdp, theta)(th) - 1e6 * ((th - theta0) ** 2).sum()

    _, record = tr.trpo_step(penalised, log_softmax, theta0, occupancy(mdp, theta), 0.1)
    assert record.status == "no_acceptable_step" and record.backtracks == 10 and len(record.candidates) == 11
    assert record.candidates[-1].fraction == 0.5**10 and record.cg.iterations >= 1


def test_trpo_kl_limit_is_inclusive_and_the_improvement_strict():
    # A policy whose logits saturate (clamped): every step beyond the clamp gives the same policy,
    # hence bit-identically the same exact KL. With max_kl equal to that KL, the full step (which
    # overshoots the clamp: moving mass to the unlikely action, the exact KL outgrows its quadratic
    # model) has KL == max_kl and is accepted (<=); with the next float below, it backtracks.
    h = 0.5

    def clamped(th):
        return torch.stack([th[..., 0].clamp(min=2.0 - h), th[..., 1].clamp(max=h)], dim=-1)

    def policy(th):
        return torch.log_softmax(clamped(th), dim=-1)

    def surrogate(th):
        return torch.softmax(clamped(th), dim=-1)[0, 1]

    theta0, w = torch.tensor([[2.0, 0.0]], dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    far = torch.tensor([[-5.0, 5.0]], dtype=torch.float64)
    kl_saturated = float(tr.mean_kl(policy, policy(theta0), far, w))
    new, record = tr.trpo_step(surrogate, policy, theta0, w, kl_saturated)
    assert record.accepted and record.backtracks == 0 and record.kl == kl_saturated == record.max_kl
    _, below = tr.trpo_step(surrogate, policy, theta0, w, float(np.nextafter(kl_saturated, 0.0)))
    assert below.accepted and below.backtracks == 1 and below.candidates[0].kl > below.max_kl
    # A surrogate whose value cannot change in float64 (an offset of 1e20) has a gradient but an
    # improvement of exactly 0 at every candidate: no step is accepted (Schulman et al. 2015, Appendix C, with
    # strict >).
    _, flat = tr.trpo_step(lambda th: surrogate(th) + 1e20, policy, theta0, w, kl_saturated, max_backtracks=2)
    assert flat.status == "no_acceptable_step" and all(c.improvement == 0.0 for c in flat.candidates)


def test_trpo_rejects_a_candidate_whose_policy_is_not_finite():
    # From the uniform policy towards the paying action the full step (0.316, -0.316) is acceptable
    # (exact KL 0.049 <= 0.05). A log_prob_fn that overflows to NaN beyond |theta| = 0.25 makes that
    # candidate's exact KL NaN, which fails the limit: the line search backtracks to half the step
    # instead of raising or accepting it.
    mdp, theta = bandit([0.0, 0.0], [1.0, 0.0])

    def fragile(th):
        logp = torch.log_softmax(th, dim=-1)
        return torch.where(th.abs().max() > 0.25, torch.full_like(logp, float("nan")), logp)

    new, record = tr.trpo_step(exact_surrogate_fn(mdp, theta), fragile, t64(theta), occupancy(mdp, theta),
                               0.05)
    assert math.isnan(record.candidates[0].kl) and record.accepted and record.backtracks == 1
    # the step sqrt(2 delta / s.F s) s / 2 takes a handful of float64 roundings: 8 u relative
    assert torch.allclose(new, torch.tensor([[0.5, -0.5]], dtype=torch.float64) * 0.31622776601683794,
                          rtol=8 * 2.0**-53, atol=0.0)


def test_trpo_record_of_the_no_step_branches_is_exact():
    mdp, theta = bandit([0.3, -0.2, 1.0], [0.5, 0.5, 0.5])
    _, record = tr.trpo_step(exact_surrogate_fn(mdp, theta), log_softmax, t64(theta), occupancy(mdp, theta),
                             0.01)
    assert record.status == "zero_gradient" and record.max_kl == 0.01
    assert record.cg.iterations == 0 and record.cg.converged is True
    assert record.cg.residual_norm == 0.0 and record.cg.relative_residual == 0.0
    assert torch.equal(record.cg.solution, torch.zeros(1, 3, dtype=torch.float64))
    # Unresolvable (eq. (18), general path: flattened parameters): no CG was run; the residual is
    # the gradient's norm.
    theta = torch.tensor([-13.0, -3.5, 33.3], dtype=torch.float64)
    adv = torch.tensor([[0.3, -0.2, 0.1]], dtype=torch.float64)
    _, record = tr.trpo_step(lambda th: (torch.softmax(th, dim=-1) * adv).sum(), flat_log_softmax(1, 3),
                             theta, torch.ones(1, dtype=torch.float64), 0.01)
    pi = torch.softmax(theta, dim=-1)
    g = pi * (adv - (pi * adv).sum())
    assert record.status == "unresolvable_fisher" and record.cg.converged is False
    assert torch.equal(record.cg.solution, torch.zeros(3, dtype=torch.float64))
    assert math.isclose(record.cg.residual_norm, float(g.norm()), rel_tol=1e-6)


def test_trpo_computes_in_float32_for_bfloat16_parameters():
    # The working dtype is promote(dtype, float32): bfloat16 parameters give exactly the float32
    # computation on the same values.
    mdp = full_support_mdp(9, 4, 3, 0.9)
    theta = t64(random_theta(4, 4, 3)).to(torch.bfloat16)
    d = occupancy(mdp, theta.double().numpy()).float()

    def surrogate(th):
        return torch.softmax(th, dim=-1)[:, 0].sum()

    new_bf16, rec_bf16 = tr.trpo_step(surrogate, log_softmax, theta, d, 0.01)
    new_f32, rec_f32 = tr.trpo_step(surrogate, log_softmax, theta.float(), d, 0.01)
    assert torch.equal(rec_bf16.cg.solution, rec_f32.cg.solution) and new_bf16.dtype == torch.bfloat16
    assert torch.equal(new_bf16, new_f32.to(torch.bfloat16))


def test_mixed_dtypes_follow_the_parameters():
    theta32 = torch.tensor([[0.2, -0.4, 0.1], [0.0, 0.5, -0.5]])
    w64 = torch.tensor([0.25, 0.75], dtype=torch.float64)
    v64 = torch.ones(2, 3, dtype=torch.float64)
    assert tr.mean_kl(log_softmax, log_softmax(theta32), theta32 + 0.1, w64).dtype == torch.float32
    assert tr.fisher_vector_product(log_softmax, theta32, v64, w64, damping=0.1).dtype == torch.float32
    g64 = torch.softmax(theta32, dim=-1).double() * torch.tensor([[0.3, -0.2, -0.1], [0.1, 0.1, -0.2]],
                                                                 dtype=torch.float64)
    step = tr.natural_gradient_step(log_softmax, theta32, g64, w64, 0.5, cg_tol=1e-6)
    assert step.params.dtype == torch.float32
    # float64 parameters with a float32 gradient are not rounded to float32. The general path runs
    # CG in the gradient's dtype (float32), the tabular one in the wider of the two (float64).
    theta64 = torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.7, -0.1]], dtype=torch.float64)
    still = tr.natural_gradient_step(flat_log_softmax(2, 3), theta64.reshape(-1), g64.float().reshape(-1),
                                     w64, 0.0, cg_tol=1e-6)
    assert still.direction.dtype == torch.float32 and torch.equal(still.params, theta64.reshape(-1))
    still = tr.natural_gradient_step(log_softmax, theta64, g64.float(), w64, 0.0, cg_tol=1e-6)
    assert still.direction.dtype == torch.float64 and torch.equal(still.params, theta64)
    res = tr.fisher_resolution(flat_log_softmax(2, 3), theta32.to(torch.bfloat16).reshape(-1), w64)
    assert res.threshold == math.sqrt(2.0**-24) * 0.75  # float32's u, not bfloat16's
    res = tr.fisher_resolution(log_softmax, theta32.to(torch.bfloat16), w64)
    assert res.threshold == 2.0**-138 and res.tabular_softmax  # float32's u and f_min
    # CG keeps b's working dtype when matvec returns another one.
    b = torch.ones(3)
    diagonal = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)  # 3 iterations, so p is updated
    assert tr.conjugate_gradient(lambda x: diagonal * x.double(), b, 3).solution.dtype == torch.float32
    low = tr.conjugate_gradient(lambda x: 2.0 * x.float(), b.to(torch.bfloat16), 3)
    assert low.solution.dtype == torch.float32


def test_cg_default_curvature_floor_is_64_eps():
    # M = diag(1, lam), b = (1, 1): the second direction's Rayleigh quotient is lam (to rounding)
    # and the largest seen (1 + lam) / 2, a ratio of 2 lam / (1 + lam). At 64.5 eps it is above
    # the default floor 64 eps (CG takes the second step), at 63.5 eps below (CG stops).
    eps = float(np.finfo(np.float64).eps)
    b = torch.ones(2, dtype=torch.float64)
    for ratio, iterations in ((64.5, 2), (63.5, 1)):
        lam = ratio * eps / (2.0 - ratio * eps)
        m = torch.tensor([1.0, lam], dtype=torch.float64)
        assert tr.conjugate_gradient(lambda x, m=m: m * x, b, 2, tol=0.0).iterations == iterations

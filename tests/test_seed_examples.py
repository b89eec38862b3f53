"""Textbook statements that had no test (issue 13, section 3): worked examples of Monte-Carlo, IS,
the score function and TD (Sutton & Barto 2018), the bound on the distribution-shift penalty
(Schulman et al. 2015), the properties of the
conservative mixture (Kakade & Langford 2002; TV and the ratio of the mixture), and the sequence-level
``KL_i`` (Shao et al. 2024, eq. (4)).

Exact values are sympy rationals (or exact logarithms) derived from the definitions; the project's
float functions are compared with them to a few float64 unit roundoffs (well-conditioned O(1) sums).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import sympy as sp
import torch

import tabular
from refimpl.estimators import discounted_returns, td_errors
from refimpl.kl import kl_k3
from specs.estimators import discounted_return_exprs, td_error_exprs
from tabular.exact import ExactMDP, exact_advantages, exact_expected_return, exact_state_occupancy
from tabular.examples import distribution_shift_example, random_mdp, random_policy
from tabular.improvement import mixture, policy_total_variation
from tabular.sequences import make_token_tree, sequence_kl

Q = sp.Rational
F64 = torch.float64


# -------------------------------------------------- worked examples (MC, IS, score function, TD)


def test_example_1_1_discrete_expectation():
    p = {1: Q(1, 5), 2: Q(1, 2), 3: Q(3, 10)}
    assert sum(px * x**2 for x, px in p.items()) == Q(49, 10)  # 0.2 + 2.0 + 2.7 = 4.9


def test_example_1_2_continuous_expectation():
    x = sp.Symbol("x", real=True)
    phi = sp.exp(-x**2 / 2) / sp.sqrt(2 * sp.pi)
    second = sp.integrate(x**2 * phi, (x, -sp.oo, sp.oo))
    mean = sp.integrate(x * phi, (x, -sp.oo, sp.oo))
    assert second == 1 and mean == 0 and second == (second - mean**2) + mean**2  # Var + mean^2


def test_example_1_3_bernoulli_frequency_is_monte_carlo():
    """``p_hat = (1/N) sum x_i`` by enumeration of all 2^N samples: mean p, variance p(1-p)/N."""
    p, N = Q(3, 10), 4
    mean = second = sp.Integer(0)
    for xs in itertools.product((0, 1), repeat=N):
        prob = sp.Mul(*[p if x else 1 - p for x in xs])
        p_hat = Q(sum(xs), N)
        mean += prob * p_hat
        second += prob * p_hat**2
    assert mean == p
    assert second - mean**2 == p * (1 - p) / N


def test_example_1_4_monte_carlo_return():
    """``G_0 = r_0 + 0.9 r_1 + 0.9^2 r_2`` (spec, symbolically), refimpl's discounted_returns on
    (1, 2, 3) gives 5.23, and the mean of G_0 over all trajectories is J (enumeration)."""
    r = sp.symbols("r0:3")
    G = discounted_return_exprs(r, [False, False, True], [False] * 3, Q(9, 10))
    assert sp.expand(G[0] - (r[0] + Q(9, 10) * r[1] + Q(81, 100) * r[2])) == 0
    got = discounted_returns(torch.tensor([[1.0, 2.0, 3.0]], dtype=F64), torch.tensor([[False, False, True]]),
                             torch.zeros(1, 3, dtype=torch.bool), 0.9)
    assert float(got[0, 0]) == pytest.approx(523 / 100, rel=1e-15, abs=0.0)  # a few ulps of 3 roundings
    mdp = random_mdp(3, num_states=4, num_actions=2, gamma=0.9, num_terminal=1, termination_prob=0.4)
    pi = random_policy(4, 4, 2)
    dist = tabular.enumerate_trajectories(mdp, pi, 3)
    G0 = discounted_returns(torch.tensor(dist.rewards), torch.tensor(dist.terminated),
                            torch.tensor(dist.truncated), 0.9,
                            next_values=torch.zeros(dist.rewards.shape, dtype=F64))[:, 0].numpy()
    assert dist.expectation(G0) == pytest.approx(
        tabular.finite_horizon_return(mdp, pi, 3), rel=1e-13, abs=0.0
    )


def test_example_1_7_bernoulli_score_function():
    """``d/dtheta E[f(x)] = E[f(x) (x/theta - (1 - x)/(1 - theta))]`` for any f (symbols f0, f1)."""
    theta = sp.Symbol("theta", positive=True)
    f0, f1 = sp.symbols("f0 f1")
    p = {0: 1 - theta, 1: theta}
    f = {0: f0, 1: f1}
    lhs = sp.diff(sum(p[x] * f[x] for x in (0, 1)), theta)
    score = {x: sp.diff(x * sp.log(theta) + (1 - x) * sp.log(1 - theta), theta) for x in (0, 1)}
    rhs = sum(p[x] * f[x] * score[x] for x in (0, 1))
    assert sp.simplify(lhs - rhs) == 0 and sp.simplify(lhs - (f1 - f0)) == 0
    assert score[1] == 1 / theta and sp.simplify(score[0] + 1 / (1 - theta)) == 0


def test_example_1_9_td_update_by_hand():
    """``y = 1 + 0.9 * 0.7 = 1.63``, ``delta = 1.43``, ``V(A) <- 0.2 + 0.1 * 1.43 = 0.343`` (all three
    numbers are this one example's)."""
    (delta,) = td_error_exprs([1], [Q(1, 5)], [Q(7, 10)], [False], Q(9, 10))
    y = delta + Q(1, 5)
    assert (y, delta, Q(1, 5) + Q(1, 10) * delta) == (Q(163, 100), Q(143, 100), Q(343, 1000))
    got = td_errors(torch.tensor([[1.0]], dtype=F64), torch.tensor([[0.2]], dtype=F64),
                    torch.tensor([[0.7]], dtype=F64), torch.tensor([[False]]), 0.9)
    assert float(got[0, 0]) == pytest.approx(1.43, rel=1e-15, abs=0.0)  # a few ulps of 3 roundings


# ------------------------------------------------------------ distribution-shift penalty bound


def exact_example(ex):
    e = ex.exact
    return ExactMDP.from_arrays(e.P, e.r, e.rho0, e.gamma, e.terminal), e.pi, e.pi_new


def dsp_and_bound(emdp, pi, pi_new):
    """Exact ``DSP_pi(pi')`` (Schulman et al. 2015, eq. (2) minus eq. (3)) and its bound
    (Schulman et al. 2015, section 3),
    ``(1/(1 - gamma)) ||d_{pi'} - d_pi||_1 max_s |E_{a ~ pi'}[A_pi(s, a)]|``."""
    A = exact_advantages(emdp, pi)
    abar = np.array([sum(pi_new[s, a] * A[s, a] for a in range(emdp.num_actions))
                     for s in range(emdp.num_states)], dtype=object)
    d, d_new = exact_state_occupancy(emdp, pi), exact_state_occupancy(emdp, pi_new)
    dsp = sum((d_new - d) * abar) / (1 - emdp.gamma)
    bound = sum(abs(x) for x in d_new - d) * max(abs(x) for x in abar) / (1 - emdp.gamma)
    return sp.nsimplify(dsp), sp.nsimplify(bound)


def test_distribution_shift_penalty_bound_on_the_4_1_1_example_exactly():
    """On the distribution-shift example (mdp.md section 7.1) the penalty is large (the surrogate predicts
    +0.8, J falls to -90):
    the exact DSP equals ``J(pi') - L_pi(pi')`` (Schulman et al. 2015, eq. (2) minus eq. (3)) and satisfies
    the bound, which is exactly
    ``2 |DSP|`` here: ``d' - d`` is positive only at s1, where ``|E_{pi'}[A_pi]|`` is largest, and
    negative only at the terminal state, where it is 0; so ``||d' - d||_1 = 2 (d'(s1) - d(s1))``."""
    ex = distribution_shift_example()
    emdp, pi, pi_new = exact_example(ex)
    dsp, bound = dsp_and_bound(emdp, pi, pi_new)
    J, J_new = exact_expected_return(emdp, pi), exact_expected_return(emdp, pi_new)
    surrogate_gain = sp.Rational(39996909, 50000000)  # L - J, the 0.79994 of mdp.md section 7.1
    assert dsp == J_new - (J + surrogate_gain)
    assert dsp == Q(-9080001909, 100000000)
    assert abs(dsp) <= bound == 2 * abs(dsp)
    got = tabular.distribution_shift_penalty(ex.mdp, ex.pi, ex.pi_new)
    assert got == pytest.approx(float(dsp), rel=1e-12, abs=0.0)


@pytest.mark.parametrize("seed", range(6))
def test_distribution_shift_penalty_bound_on_random_mdps(seed):
    """The bound, with exact rationals, on random MDPs and random policy pairs."""
    mdp = random_mdp(seed, num_states=3, num_actions=2, gamma=0.8)
    emdp = ExactMDP.from_mdp(mdp)
    pi, pi_new = (emdp.policy(random_policy(seed + k, 3, 2)) for k in (10, 20))
    dsp, bound = dsp_and_bound(emdp, pi, pi_new)
    assert dsp != 0 and abs(dsp) <= bound
    f_pi, f_new = random_policy(seed + 10, 3, 2), random_policy(seed + 20, 3, 2)
    got = tabular.distribution_shift_penalty(mdp, f_pi, f_new)
    assert got == pytest.approx(float(dsp), rel=1e-10, abs=1e-13)


# ----------------------------------------------------------------------- the conservative mixture


def test_mixture_total_variation_is_alpha_times_tv_and_eq_56():
    """``TV(pi, pi_alpha) = alpha TV(pi, pi') <= alpha`` per state and ``pi_alpha / pi = (1 - alpha)
    + alpha pi'/pi``: exact in sympy, and exactly equal in float64 with dyadic policies and
    alpha (every intermediate is a multiple of 2^-7, so tabular's floats carry no rounding)."""
    pi = np.array([[Q(1, 2), Q(1, 4), Q(1, 4)], [Q(1, 8), Q(5, 8), Q(1, 4)]], dtype=object)
    pi_new = np.array([[Q(0), Q(1, 4), Q(3, 4)], [Q(1, 2), Q(1, 2), Q(0)]], dtype=object)
    for alpha in (Q(0), Q(1, 4), Q(3, 4), Q(1)):
        pi_a = (1 - alpha) * pi + alpha * pi_new
        tv = [sum(abs(x) for x in pi[s] - pi_new[s]) / 2 for s in range(2)]
        tv_a = [sum(abs(x) for x in pi[s] - pi_a[s]) / 2 for s in range(2)]
        assert tv_a == [alpha * x for x in tv] and all(x <= alpha for x in tv_a)
        ratios = pi_a / pi
        assert all(ratios[s, a] == (1 - alpha) + alpha * pi_new[s, a] / pi[s, a]
                   for s in range(2) for a in range(3))
        f_pi, f_new = pi.astype(float), pi_new.astype(float)
        f_mix = mixture(f_pi, f_new, float(alpha))
        assert np.array_equal(f_mix, pi_a.astype(float))
        assert np.array_equal(policy_total_variation(f_pi, f_mix), np.array([float(alpha * x) for x in tv]))
    assert tv == [Q(1, 2), Q(3, 8)]  # TV(pi, pi') itself: alpha TV < alpha (equality needs disjoint rows)


# -------------------------------------------------------------------- the sequence-level KL_i


def test_002_sequence_level_kl_i_is_unbiased_for_the_sequence_kl():
    """Shao et al. 2024, eq. (4), per response: ``KL_i = r - 1 - log r`` with ``r = pi_ref(o_i|q) /
    pi_theta(o_i|q)`` (whole responses).
    Its exact expectation under pi_theta is ``sum_o ref(o) - 1 + KL(pi_theta || pi_ref)`` =
    the sequence-level KL (the responses' probabilities sum to 1), here an exact sum of logarithms
    on a token tree (vocabulary 3, length 2, 7 responses). refimpl's ``kl_k3`` on the summed token
    log-probabilities and tabular's ``sequence_kl`` both equal it to float64 precision."""
    tree = make_token_tree(3, 2)
    policy = [[Q(1, 5), Q(1, 2), Q(3, 10)], [Q(1, 2), Q(1, 4), Q(1, 4)], [Q(1, 10), Q(3, 5), Q(3, 10)]]
    ref = [[Q(1, 3), Q(1, 3), Q(1, 3)], [Q(1, 4), Q(1, 2), Q(1, 4)], [Q(2, 5), Q(1, 5), Q(2, 5)]]

    def seq_prob(table, k):
        n = tree.lengths[k]
        return sp.Mul(*[table[tree.seq_states[k, t]][tree.seq_tokens[k, t]] for t in range(n)])

    K = len(tree.sequences)
    p = [seq_prob(policy, k) for k in range(K)]
    q = [seq_prob(ref, k) for k in range(K)]
    assert sum(p) == 1 and sum(q) == 1
    kl_seq = sum(pk * sp.log(pk / qk) for pk, qk in zip(p, q, strict=True))
    expected_kl_i = sum(pk * (qk / pk - 1 - sp.log(qk / pk)) for pk, qk in zip(p, q, strict=True))
    assert sp.simplify(expected_kl_i - kl_seq) == 0
    exact = float(sp.N(kl_seq, 30))
    assert exact > 0.05
    token_logp = np.zeros((K, tree.max_len))
    token_ref = np.zeros((K, tree.max_len))
    for k in range(K):
        for t in range(tree.lengths[k]):
            s, tok = tree.seq_states[k, t], tree.seq_tokens[k, t]
            token_logp[k, t] = np.log(float(policy[s][tok]))
            token_ref[k, t] = np.log(float(ref[s][tok]))
    seq_logp = torch.tensor(token_logp.sum(1), dtype=F64)
    seq_ref = torch.tensor(token_ref.sum(1), dtype=F64)
    probs = torch.tensor([float(x) for x in p], dtype=F64)
    assert float((probs * kl_k3(seq_logp, seq_ref)).sum()) == pytest.approx(exact, rel=1e-13, abs=0.0)
    f_policy = np.array([[float(x) for x in row] for row in policy])
    f_ref = np.array([[float(x) for x in row] for row in ref])
    assert sequence_kl(tree, f_policy, f_ref) == pytest.approx(exact, rel=1e-13, abs=0.0)

"""The mathematical errata of issue 13 (specs/errata.md entries 15-25): each test pins the correct
form with an exact value (sympy rationals, exact logarithms, or exact enumeration of outcomes) and
shows that the printed form gives a different value.

Every exact quantity here is derived in the test from the definitions; where the project's code
implements the correct form (refimpl, tabular, specs), it is compared with that exact value with a
tolerance of a few float64 unit roundoffs (the inputs are well conditioned, O(1) sums of O(1)
terms).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import sympy as sp
import torch

import specs.policy_losses as spec
import tabular
from refimpl.kl import kl_k3
from refimpl.losses import PPO, policy_loss, ppo_combined_loss
from tabular.exact import ExactMDP, exact_advantages, exact_state_occupancy

F64 = torch.float64
Q = sp.Rational


# ------------------------------------------------------------------ 1. 003, GRPO KL: inverted ratio


def test_erratum_003_grpo_kl_ratio_is_inverted():
    """errata.md entry 15: written as ``pi_theta/pi_ref - log(pi_theta/pi_ref) - 1``; with samples from
    pi_theta
    its expectation is ``sum p^2/ref - 1 - KL``, not KL. The k3 of Schulman 2020 / kl.md eq. (4)
    (``r = pi_ref/pi_theta``) has expectation exactly ``KL(pi_theta || pi_ref)``."""
    p = [Q(7, 10), Q(2, 10), Q(1, 10)]
    ref = [Q(1, 10), Q(3, 10), Q(6, 10)]
    kl = sum(pi * sp.log(pi / qi) for pi, qi in zip(p, ref, strict=True))
    correct = sum(pi * (qi / pi - 1 - sp.log(qi / pi)) for pi, qi in zip(p, ref, strict=True))
    as_in_003 = sum(pi * (pi / qi - sp.log(pi / qi) - 1) for pi, qi in zip(p, ref, strict=True))
    assert sp.simplify(correct - kl) == 0
    assert sp.simplify(as_in_003 - (Q(81, 20) - kl)) == 0  # sum p^2/ref = 101/20
    assert sp.N(kl, 30) == pytest.approx(1.1018681, abs=1e-7)
    assert sp.N(as_in_003, 30) == pytest.approx(2.9481319, abs=1e-7)
    # refimpl's k3 is the correct form: its exact expectation under p is KL (float64, 4 ulp-scale terms).
    lp = torch.tensor([float(x) for x in p], dtype=F64).log()
    lref = torch.tensor([float(x) for x in ref], dtype=F64).log()
    probs = lp.exp()
    assert float((probs * kl_k3(lp, lref)).sum()) == pytest.approx(float(sp.N(kl, 30)), rel=1e-14, abs=0.0)
    # ... and with the arguments swapped it is the erratum's form, biased by sum p^2/ref - 1 - 2 KL.
    assert float((probs * kl_k3(lref, lp)).sum()) == pytest.approx(
        float(sp.N(as_in_003, 30)), rel=1e-14, abs=0.0
    )


# ------------------------------------------------------------ 2. 000, grad Delta misses (1 - gamma)


def exact_two_state_mdp():
    P = [[[Q(1, 2), Q(1, 2)], [Q(1, 5), Q(4, 5)]], [[Q(3, 4), Q(1, 4)], [Q(0), Q(1)]]]
    r = [[Q(1), Q(0)], [Q(-1, 2), Q(2)]]
    return ExactMDP.from_arrays(np.array(P, dtype=object), np.array(r, dtype=object),
                                np.array([Q(2, 3), Q(1, 3)], dtype=object), Q(3, 4))


def test_erratum_000_gradient_of_delta_carries_one_minus_gamma():
    """errata.md entry 16: ``Delta_pi(pi') = (1 - gamma) sum_s rho_pi(s) E_{pi'}[A_pi] = E_{d_pi, pi'}[A_pi]``
    and ``R~ = R + Delta / (1 - gamma)``; so ``grad R~ = grad R`` means ``grad Delta = (1 - gamma)
    grad R``, not ``grad Delta = grad R``. Exact directional derivatives along a
    tangent direction D (rows summing to 0) of the direct parametrisation, with R(pi + t D) solved
    symbolically in t."""
    emdp = exact_two_state_mdp()
    pi = np.array([[Q(1, 3), Q(2, 3)], [Q(1, 2), Q(1, 2)]], dtype=object)
    D = np.array([[Q(1, 4), Q(-1, 4)], [Q(-1, 3), Q(1, 3)]], dtype=object)
    t = sp.Symbol("t")
    pt = pi + t * D
    P_t = sp.Matrix(2, 2, lambda s, s2: sum(pt[s, a] * emdp.P[s, a, s2] for a in range(2)))
    r_t = sp.Matrix(2, 1, lambda s, _: sum(pt[s, a] * emdp.r[s, a] for a in range(2)))
    V_t = (sp.eye(2) - emdp.gamma * P_t).LUsolve(r_t)
    R_t = sum(emdp.rho0[s] * V_t[s] for s in range(2))
    dR = sp.nsimplify(sp.diff(R_t, t).subs(t, 0))
    d_pi = exact_state_occupancy(emdp, pi)  # normalised: the S ~ rho_pi of Delta
    A_pi = exact_advantages(emdp, pi)
    dDelta = sum(d_pi[s] * D[s, a] * A_pi[s, a] for s in range(2) for a in range(2))  # Delta is linear in pi'
    assert dR != 0
    assert dDelta == (1 - emdp.gamma) * dR
    assert dDelta != dR


# ---------------------------------------------------- 3. 000, PPO/TRPO bullets: E under pi, not pi'


BANDIT_PI = [Q(5, 10), Q(3, 10), Q(2, 10)]
BANDIT_PI_NEW = [Q(2, 10), Q(3, 10), Q(5, 10)]
BANDIT_Q = [Q(1), Q(0), Q(2)]


def bandit_mdp(q) -> tabular.MDP:
    """One state, gamma = 0: J(pi) = sum_a pi(a) Q(a)."""
    A = len(q)
    return tabular.MDP(np.ones((1, A, 1)), np.array([[float(x) for x in q]]), np.ones(1), 0.0)


def test_erratum_000_surrogate_expectation_is_under_the_old_policy():
    """``E_{A ~ pi'}[(pi'/pi) A_pi]`` (errata.md entry 17) is not the surrogate; ``E_{A ~ pi}``
    is, and on a bandit it equals ``J(pi') - J(pi)`` exactly."""
    V = sum(p * q for p, q in zip(BANDIT_PI, BANDIT_Q, strict=True))
    A = [q - V for q in BANDIT_Q]
    under_pi = sum(p * (pn / p) * a for p, pn, a in zip(BANDIT_PI, BANDIT_PI_NEW, A, strict=True))
    under_new = sum(pn * (pn / p) * a for p, pn, a in zip(BANDIT_PI, BANDIT_PI_NEW, A, strict=True))
    J_new = sum(p * q for p, q in zip(BANDIT_PI_NEW, BANDIT_Q, strict=True))
    assert under_pi == J_new - V == Q(3, 10)
    assert under_new == Q(1113, 1000)
    mdp = bandit_mdp(BANDIT_Q)
    pi, pi_new = (np.array([[float(x) for x in p]]) for p in (BANDIT_PI, BANDIT_PI_NEW))
    assert tabular.performance_difference(mdp, pi, pi_new) == pytest.approx(0.3, rel=1e-15, abs=0.0)
    gain = tabular.surrogate(mdp, pi, pi_new) - tabular.expected_return(mdp, pi)
    assert gain == pytest.approx(0.3, rel=1e-14, abs=0.0)


# ------------------------------------------------------- 4. 000, clip-higher drops the advantage


def test_erratum_000_clip_higher_keeps_the_advantage_inside_the_min():
    """errata.md entry 18: ``min{x, clip(x, 1 - eps_low, 1 + eps_high)}``; the term is
    ``min{r A, clip(r, 1 - eps_low, 1 + eps_high) A}`` (Yu et al. 2025, section 3.1). Multiplying the printed
    min by A
    afterwards is right only for A > 0: for A < 0 the min picks the other branch."""
    r = sp.Symbol("r", positive=True)
    eps_low, eps_high = Q(1, 5), Q(7, 25)
    clip = sp.Min(sp.Max(r, 1 - eps_low), 1 + eps_high)
    as_in_000 = sp.Min(r, clip)
    for ratio, adv, expected in ((Q(3, 2), Q(-2), Q(-3)), (Q(3, 2), Q(2), Q(64, 25)),
                                 (Q(1, 2), Q(-2), Q(-8, 5)), (Q(1, 2), Q(2), Q(1))):
        correct = spec.min_clip_term(ratio, adv, eps_low, eps_high)
        assert correct == expected
        times_a = adv * as_in_000.subs(r, ratio)
        assert (times_a == correct) == (adv > 0), (ratio, adv)
    assert as_in_000.subs(r, Q(3, 2)) == Q(32, 25)  # without A it is not even in units of A


# ------------------------------------------------------ 5. 002, Delta is J(theta); bias vs variance


def test_erratum_002_delta_is_a_difference_and_the_baseline_changes_variance_not_bias():
    """errata.md entry 19: ``Delta(theta, theta_old) = E_{o ~ pi_theta}[R]``: that is J(theta), not
    ``J(theta) - J(theta_old) = E_{o ~ pi_old}[(pi_theta/pi_old) A]``. And replacing R by the
    advantage ``A = R - V`` does not change the expected score-function gradient (no bias to reduce);
    it changes its variance. Exact on the bandit of erratum 3 (softmax score ``e_a - pi``)."""
    old, new, R = BANDIT_PI, BANDIT_PI_NEW, BANDIT_Q
    J_old = sum(p * x for p, x in zip(old, R, strict=True))
    J_new = sum(p * x for p, x in zip(new, R, strict=True))
    delta_is = sum(p * (pn / p) * (x - J_old) for p, pn, x in zip(old, new, R, strict=True))
    assert delta_is == J_new - J_old == Q(3, 10)
    assert J_new == Q(6, 5) != delta_is  # the erratum's printed first form
    K = len(old)
    score = [[int(a == b) - old[b] for b in range(K)] for a in range(K)]

    def moments(weight):
        mean = [sum(old[a] * weight[a] * score[a][b] for a in range(K)) for b in range(K)]
        second = sum(old[a] * weight[a] ** 2 * sum(s**2 for s in score[a]) for a in range(K))
        return mean, second - sum(m**2 for m in mean)

    mean_r, var_r = moments(R)
    mean_a, var_a = moments([x - J_old for x in R])
    assert mean_r == mean_a  # identical expectation: the baseline adds no bias and removes none
    assert var_a < var_r
    assert (var_r, var_a) == (Q(4251, 5000), Q(381, 1250))  # trace of the covariance


# -------------------------------------------- 6. 003, PPO: gradients flow on the pessimistic side


def test_erratum_003_ppo_gradient_flows_outside_the_band_on_the_pessimistic_side():
    """errata.md entry 20: "no gradients flow" whenever r leaves [1 - eps, 1 + eps]. False where the unclipped
    branch is the minimum: A > 0 with r < 1 - eps, and A < 0 with r > 1 + eps (d/dr = A there)."""
    r = sp.Symbol("r", positive=True)
    e = Q(1, 5)
    for ratio, adv, derivative in ((Q(1, 2), Q(1), Q(1)), (Q(3, 2), Q(-1), Q(-1)),
                                   (Q(3, 2), Q(1), Q(0)), (Q(1, 2), Q(-1), Q(0))):
        d = sp.diff(spec.min_clip_term(r, adv, e, e), r).subs(r, ratio)
        assert d == derivative, (ratio, adv)
    # refimpl: d loss / d logp = -A r on the pessimistic side (one token, token-mean aggregation).
    variant = dataclasses.replace(PPO, eps_low=0.2, eps_high=0.2)
    for ratio, adv, flows in ((0.5, 1.0, True), (1.5, -1.0, True), (1.5, 1.0, False), (0.5, -1.0, False)):
        logp = torch.tensor([[math.log(ratio)]], dtype=F64, requires_grad=True)
        loss, _ = policy_loss(logp, torch.zeros(1, 1, dtype=F64), torch.tensor([adv], dtype=F64),
                              torch.ones(1, 1, dtype=torch.bool), variant)
        (g,) = torch.autograd.grad(loss, logp)
        expected = -adv * ratio if flows else 0.0
        assert float(g) == pytest.approx(expected, rel=1e-15, abs=0.0)


# ------------------------------------------------------- 7. 003, MC and TD updates need a step size


def test_erratum_003_mc_and_td_updates_without_step_size_keep_only_the_last_sample():
    """errata.md entry 21: ``V <- V + [G - V]`` and ``V <- V + [R + gamma V(s') - V]``: with step size 1 the
    estimate is the last target, whatever came before, so it does not converge. With
    ``alpha_n = 1/n`` (estimators.md eq. (30)-(33)) it is the running mean of the targets."""
    returns = [Q(3), Q(-1), Q(4), Q(2)]
    V = Q(7)
    for G in returns:
        V = V + (G - V)
    assert V == returns[-1]
    V = Q(7)
    for n, G in enumerate(returns, start=1):
        V = V + (G - V) / n
    assert V == sum(returns) / len(returns) == Q(2)
    # TD: from s, reward 0, then s' in {B, C} with probability 1/2 each, V(B) = 0, V(C) = 1.
    gamma = Q(9, 10)
    V_pi = gamma * (Q(0) + Q(1)) / 2
    targets = {"B": Q(0), "C": gamma}
    sequence = ["B", "C", "C", "B"]
    V = Q(0)
    for s2 in sequence:
        V = V + (targets[s2] - V)
        assert V in (Q(0), gamma) and V != V_pi  # the step-size-1 update never reaches V_pi = 9/20
    V = Q(0)
    for n, s2 in enumerate(sequence, start=1):
        V = V + (targets[s2] - V) / n
    assert V == V_pi == Q(9, 20)  # balanced samples: the running mean is exact


# ------------------------------ 8./9. 003, REINFORCE: per-episode standardisation, missing gamma^t


def repeated_bandit_expectations(pi, rewards, gamma, horizon, weights_fn):
    """Exact ``E[sum_t grad log pi(a_t) w_t]`` over all ``A^horizon`` action sequences of a bandit
    played ``horizon`` times (softmax score ``e_a - pi``); ``weights_fn(rewards_seq) -> [w_t]``."""
    K = len(pi)
    total = [sp.Integer(0)] * K
    for seq in itertools.product(range(K), repeat=horizon):
        prob = sp.Mul(*[pi[a] for a in seq])
        w = weights_fn([rewards[a] for a in seq])
        for t, a in enumerate(seq):
            for b in range(K):
                total[b] += prob * w[t] * (int(a == b) - pi[b])
    return [sp.nsimplify(x) for x in total]


def returns_to_go(rs, gamma):
    return [sum(gamma ** (k - t) * rs[k] for k in range(t, len(rs))) for t in range(len(rs))]


PI3 = [Q(1, 2), Q(1, 3), Q(1, 6)]
R3 = [Q(1), Q(2), Q(4)]


def one_step_gradient(pi, rewards):
    """``grad_theta sum_a pi(a) r(a)`` for softmax at theta = log pi: ``pi (r - pi . r)``."""
    v = sum(p * x for p, x in zip(pi, rewards, strict=True))
    return [p * (x - v) for p, x in zip(pi, rewards, strict=True)]


def test_erratum_003_reward_to_go_without_gamma_t_is_biased():
    """errata.md entry 23: ``Psi_t = G_t`` (as entry 8) drops gamma^t. On a bandit played
    H times the exact expectations are ``H g`` (the erratum) and ``sum_t gamma^t g = grad J`` (with
    gamma^t), g the one-step gradient."""
    gamma, H = Q(1, 2), 2
    g = one_step_gradient(PI3, R3)
    as_in_003 = repeated_bandit_expectations(PI3, R3, gamma, H, lambda rs: returns_to_go(rs, gamma))
    correct = repeated_bandit_expectations(
        PI3, R3, gamma, H, lambda rs: [gamma**t * G for t, G in enumerate(returns_to_go(rs, gamma))])
    grad_J = [(1 + gamma) * x for x in g]
    assert correct == grad_J
    assert as_in_003 == [2 * x for x in g] != grad_J  # biased by the factor H / sum_t gamma^t = 4/3


def test_erratum_003_reinforce_code_per_episode_standardisation_is_biased():
    """errata.md entry 22: REINFORCE code that standardises the returns-to-go within each episode
    (``(G - mean G) / (std G + 1e-8)``, population std) and averages over its steps. The per-episode
    mean depends on the actions (an action-dependent baseline) and the scale on the rewards: exact
    expectation by enumeration (the code's eps = 1e-8 as a rational) on a bandit played twice,
    gamma = 1. With two steps the standardised returns are ``+-(G_0 - G_1) / (|G_0 - G_1| + 2e-8)``,
    ``G_0 - G_1 = r(a_0)``, so the expected gradient is ``(1/2) pi (z - pi . z)`` with
    ``z(a) = r(a) / (r(a) + 2e-8)``: about 1e-8 times the true gradient, in another direction."""
    eps = Q(1, 10**8)

    def standardised(rs):
        G = returns_to_go(rs, Q(1))
        mean = sum(G) / len(G)
        std = sp.sqrt(sum((x - mean) ** 2 for x in G) / len(G))
        return [(x - mean) / (std + eps) / len(G) for x in G]  # "/ len": the code's .mean()

    as_in_003 = repeated_bandit_expectations(PI3, R3, Q(1), 2, standardised)
    z = [x / (x + 2 * eps) for x in R3]
    zbar = sum(p * x for p, x in zip(PI3, z, strict=True))
    assert as_in_003 == [p * (x - zbar) / 2 for p, x in zip(PI3, z, strict=True)]
    grad_J = [2 * x for x in one_step_gradient(PI3, R3)]  # J = 2 pi . r
    ratios = [a / b for a, b in zip(as_in_003, grad_J, strict=True)]
    assert len(set(ratios)) == len(ratios)  # not a multiple of grad J: a different direction
    assert all(0 < x < Q(1, 10**7) for x in ratios)
    # the unstandardised reward-to-go (gamma = 1) is exactly unbiased on the same bandit
    assert repeated_bandit_expectations(PI3, R3, Q(1), 2, lambda rs: returns_to_go(rs, Q(1))) == grad_J


# ----------------------------------------------------- 11. 004, PPO total loss mixes signs


def test_erratum_004_ppo_total_loss_signs():
    """errata.md entry 24: ``L_Policy + c1 L_Value + c2 L_Entropy`` with L_Policy the clipped *objective*,
    L_Value a squared-error *loss* and L_Entropy the entropy (a *bonus*). The loss to minimise is
    ``-L_CLIP + c1 L_VF - c2 H`` (minus Schulman et al. 2017, eq. (9)); refimpl.ppo_combined_loss is that,
    exactly
    (every input below is a binary fraction and the ratio is 1, so float64 is exact)."""
    adv = [Q(2), Q(-1, 2)]
    values, returns, entropy = [Q(1, 2), Q(1)], [Q(3, 2), Q(1, 4)], [Q(1, 4), Q(3, 4)]
    c1, c2 = Q(1, 2), Q(1, 4)
    L_clip = sum(adv) / 2  # ratio 1: min-clip is A
    L_vf = sum((v - g) ** 2 for v, g in zip(values, returns, strict=True)) / 2
    H = sum(entropy) / 2
    correct = -L_clip + c1 * L_vf - c2 * H
    as_in_004 = L_clip + c1 * L_vf + c2 * H
    assert correct == Q(-31, 64) and as_in_004 == Q(81, 64)
    assert as_in_004 not in (correct, -correct)  # neither the loss nor the objective of Schulman et al. 2017,
    # eq. (9)

    def t(xs):
        return torch.tensor([[float(x)] for x in xs], dtype=F64)

    loss, _ = ppo_combined_loss(t([0, 0]), t([0, 0]), torch.tensor([float(x) for x in adv], dtype=F64),
                                t(values), t(returns), t(entropy), torch.ones(2, 1, dtype=torch.bool),
                                value_coef=float(c1), entropy_coef=float(c2))
    assert float(loss) == float(correct)

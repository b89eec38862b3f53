"""Sampled estimators against exact expectations by enumerating every trajectory (no sampling).

The oracle is ``tabular.enumerate_trajectories``: each estimator from ``refimpl`` is evaluated on
all trajectories at once (one row each), and its probability-weighted mean is compared with the
exact tabular quantity (spec: estimators.md section 5).
"""

import numpy as np
import pytest
import torch

import tabular
from refimpl.estimators import (
    discounted_returns,
    gae_advantages,
    importance_weights,
    is_estimate,
    lambda_returns,
    n_step_returns,
    per_decision_is,
    snis_estimate,
    td_errors,
    trajectory_importance_weights,
    trajectory_is,
)
from refimpl.policy_gradient import reinforce_loss
from tabular.examples import random_mdp, random_policy, trajectory_is_example
from tabular.gradients import softmax_policy

F64 = torch.float64
SEEDS = [0, 1, 2]


def t64(x):
    return torch.as_tensor(np.asarray(x), dtype=F64)


def episodic_case(seed: int, horizon: int = 3, gamma: float = 0.9):
    """A small episodic MDP (S = 4 with one terminal state, A = 2), a positive policy, and the
    enumeration of all its trajectories truncated at ``horizon``."""
    mdp = random_mdp(seed, num_states=4, num_actions=2, gamma=gamma, num_terminal=1, termination_prob=0.3)
    pi = random_policy(seed + 100, 4, 2)
    dist = tabular.enumerate_trajectories(mdp, pi, horizon)
    return mdp, pi, dist


def conditional_mean(dist, X: np.ndarray, S: int, A: int):
    """E[X_t | s_t = s, a_t = a] for every (t, s, a) with positive probability: ``(mean, reach)``
    where ``reach[t, s, a] = P(s_t = s, a_t = a, step t in the episode)``."""
    H = dist.mask.shape[1]
    mean = np.zeros((H, S, A))
    reach = np.zeros((H, S, A))
    for t in range(H):
        onehot = np.zeros((dist.num_trajectories, S, A))
        onehot[np.arange(dist.num_trajectories), dist.states[:, t], dist.actions[:, t]] = dist.mask[:, t]
        reach[t] = np.einsum("k,ksa->sa", dist.prob, onehot)
        num = np.einsum("k,ksa->sa", dist.prob * X[:, t], onehot)
        mean[t] = np.divide(num, reach[t], out=np.zeros_like(num), where=reach[t] > 0)
    return mean, reach


def assert_conditional_mean_is(dist, X, target_sa, mdp):
    """E[X_t | s_t = s, a_t = a] = target[s, a] wherever (t, s, a) has positive probability."""
    mean, reach = conditional_mean(dist, X, mdp.num_states, mdp.num_actions)
    seen = reach > 0
    assert seen.sum() >= 6
    np.testing.assert_allclose(
        mean[seen], np.broadcast_to(target_sa, mean.shape)[seen], rtol=1e-10, atol=1e-12
    )


def rollout_tensors(dist):
    return (t64(dist.rewards), torch.as_tensor(dist.terminated), torch.as_tensor(dist.truncated))


# ----------------------------------------------------------------------------------- returns


@pytest.mark.parametrize("seed", SEEDS)
def test_reward_to_go_conditional_mean_is_finite_horizon_q(seed):
    """E[G_t | s_t, a_t] = Q_t(s_t, a_t) for the finite-horizon objective (bootstrap 0 at H)."""
    mdp, pi, dist = episodic_case(seed)
    rew, term, trunc = rollout_tensors(dist)
    G = discounted_returns(rew, term, trunc, mdp.gamma, next_values=torch.zeros_like(rew)).numpy()
    assert_conditional_mean_is(dist, G, tabular.finite_horizon_values(mdp, pi, dist.mask.shape[1]).Q, mdp)
    # and the unconditional mean of G_0 is J_H
    assert dist.expectation(G[:, 0]) == pytest.approx(
        tabular.finite_horizon_return(mdp, pi, 3), rel=1e-12, abs=0.0
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_truncated_returns_bootstrapped_from_v_estimate_infinite_horizon_q(seed):
    """Truncating at H and bootstrapping from the exact infinite-horizon V of the final
    observation gives E[G_t | s_t, a_t] = Q(s_t, a_t) exactly. Treating truncation as termination
    (bootstrap 0) gives a different value, so this test catches that bug."""
    mdp, pi, dist = episodic_case(seed)
    V = tabular.policy_evaluation(mdp, pi)
    Q = tabular.q_values(mdp, pi)
    rew, term, trunc = rollout_tensors(dist)
    nv = t64(V[dist.next_states])
    G = discounted_returns(rew, term, trunc, mdp.gamma, next_values=nv).numpy()
    assert_conditional_mean_is(dist, G, Q, mdp)
    # marking the truncated steps as terminated (the popular bug) breaks the expectation:
    no_trunc = torch.zeros_like(trunc)
    G_wrong = discounted_returns(rew, term | trunc, no_trunc, mdp.gamma, next_values=nv).numpy()
    wrong_mean, reach = conditional_mean(dist, G_wrong, mdp.num_states, mdp.num_actions)
    seen = reach > 0
    assert np.abs(wrong_mean[seen] - np.broadcast_to(Q, wrong_mean.shape)[seen]).max() > 1e-3


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [1, 2, 5])
def test_n_step_return_conditional_mean_is_q(seed, n):
    mdp, pi, dist = episodic_case(seed)
    V, Q = tabular.policy_evaluation(mdp, pi), tabular.q_values(mdp, pi)
    rew, term, trunc = rollout_tensors(dist)
    Gn = n_step_returns(rew, t64(V[dist.next_states]), term, trunc, mdp.gamma, n).numpy()
    assert_conditional_mean_is(dist, Gn, Q, mdp)


# ----------------------------------------------------------------------------------- GAE


def gae_on(dist, mdp, V, lam):
    rew, term, trunc = rollout_tensors(dist)
    values = t64(np.where(dist.mask, V[dist.states], 0.0))
    nv = t64(V[dist.next_states])
    return gae_advantages(rew, values, nv, term, trunc, mdp.gamma, lam), rew, term, trunc, values, nv


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("lam", [0.0, 0.3, 0.95, 1.0])
def test_gae_with_exact_v_is_unbiased_for_the_advantage(seed, lam):
    mdp, pi, dist = episodic_case(seed)
    V, Adv = tabular.policy_evaluation(mdp, pi), tabular.advantages(mdp, pi)
    (adv, ret), *_ = gae_on(dist, mdp, V, lam)
    assert_conditional_mean_is(dist, adv.numpy(), Adv, mdp)


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_endpoints_are_td_error_and_mc_return_minus_v(seed):
    mdp, pi, dist = episodic_case(seed)
    V = tabular.policy_evaluation(mdp, pi)
    (adv0, _), rew, term, trunc, values, nv = gae_on(dist, mdp, V, 0.0)
    (adv1, ret1), *_ = gae_on(dist, mdp, V, 1.0)
    m = torch.as_tensor(dist.mask)
    delta = td_errors(rew, values, nv, term, mdp.gamma)
    torch.testing.assert_close(adv0[m], delta[m], rtol=1e-12, atol=1e-12)
    G = discounted_returns(rew, term, trunc, mdp.gamma, next_values=nv)
    torch.testing.assert_close(adv1[m], (G - values)[m], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret1[m], G[m], rtol=1e-12, atol=1e-12)
    # the TD error's exact conditional mean is the advantage (checked independently of GAE)
    assert_conditional_mean_is(dist, delta.numpy(), tabular.advantages(mdp, pi), mdp)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("lam", [0.0, 0.5, 1.0])
def test_lambda_returns_conditional_mean_is_q(seed, lam):
    mdp, pi, dist = episodic_case(seed)
    V, Q = tabular.policy_evaluation(mdp, pi), tabular.q_values(mdp, pi)
    rew, term, trunc = rollout_tensors(dist)
    G = lambda_returns(rew, t64(V[dist.next_states]), term, trunc, mdp.gamma, lam).numpy()
    assert_conditional_mean_is(dist, G, Q, mdp)


# ----------------------------------------------------------------------------------- importance sampling


def bandit_case(seed: int):
    """A categorical 'trajectory' space: K = 4 outcomes, behaviour q, target p, values f."""
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.ones(4))
    p = rng.dirichlet(np.ones(4))
    f = rng.normal(size=4)
    return p, q, f


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("N", [1, 2, 5])
def test_is_unbiased_and_snis_bias_exact(seed, N):
    """Enumerate all K^N sample tuples from q: E[is_estimate] = E_p[f]; E[snis_estimate] has the
    exact bias computed here by direct summation, and for N = 1 equals E_q[f] (no correction)."""
    p, q, f = bandit_case(seed)
    K = len(p)
    idx = np.array(np.meshgrid(*[np.arange(K)] * N, indexing="ij")).reshape(N, -1).T  # [K^N, N]
    prob = np.prod(q[idx], axis=1)
    w = importance_weights(t64(np.log(p[idx])), t64(np.log(q[idx])))
    fx = t64(f[idx])
    e_is = float((t64(prob) * is_estimate(fx, w)).sum())
    assert e_is == pytest.approx(float(p @ f), rel=1e-12, abs=0.0)
    e_snis = float((t64(prob) * snis_estimate(fx, w)).sum())
    # independent exact value: sum over tuples of prob * sum(w f) / sum(w) in numpy
    wn = p[idx] / q[idx]
    exact = float(np.sum(prob * (wn * f[idx]).sum(1) / wn.sum(1)))
    assert e_snis == pytest.approx(exact, rel=1e-12, abs=0.0)
    if N == 1:
        assert e_snis == pytest.approx(float(q @ f), rel=1e-12, abs=0.0)
    else:
        assert abs(e_snis - p @ f) > 1e-6  # biased for finite N on these examples


@pytest.mark.parametrize("H", [1, 2, 5])
@pytest.mark.parametrize(("p", "q"), [(0.5, 0.9), (0.3, 0.6)])
def test_trajectory_is_weight_variance_closed_form(H, p, q):
    """mdp.md section 7.2 (estimators.md eq. (11a)): Var_pi[w(tau)] = (q^2/p + (1-q)^2/(1-p))^H - 1, by
    enumerating every
    trajectory of the behaviour policy; and E[trajectory_is] = J(pi') (unbiased)."""
    ex = trajectory_is_example(H, p=p, q=q, gamma=0.9, reward="once")
    dist = tabular.enumerate_trajectories(ex.mdp, ex.pi, H + 1)
    logp_b = t64(np.where(dist.mask, np.log(ex.pi[dist.states, dist.actions]), 0.0))
    logp_t = t64(np.where(dist.mask, np.log(ex.pi_new[dist.states, dist.actions]), 0.0))
    m = torch.as_tensor(dist.mask)
    w = trajectory_importance_weights(logp_t, logp_b, m).numpy()
    closed = (q**2 / p + (1 - q) ** 2 / (1 - p)) ** H - 1
    assert dist.expectation(w) == pytest.approx(1.0, rel=1e-12, abs=0.0)
    assert dist.variance(w) == pytest.approx(closed, rel=1e-10, abs=0.0)
    J_new = tabular.finite_horizon_return(ex.mdp, ex.pi_new, H + 1)
    est = trajectory_is(t64(dist.rewards), logp_t, logp_b, m, 0.9).numpy()
    assert dist.expectation(est) == pytest.approx(J_new, rel=1e-12, abs=0.0)
    assert J_new == pytest.approx(0.9**H, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("seed", SEEDS)
def test_trajectory_and_per_decision_is_unbiased_on_episodic_mdps(seed):
    mdp, pi, dist = episodic_case(seed)
    pi_new = random_policy(seed + 200, 4, 2)
    m = torch.as_tensor(dist.mask)
    logp_b = t64(np.where(dist.mask, np.log(pi[dist.states, dist.actions]), 0.0))
    logp_t = t64(np.where(dist.mask, np.log(pi_new[dist.states, dist.actions]), 0.0))
    J_new = tabular.finite_horizon_return(mdp, pi_new, 3)
    rew = t64(dist.rewards)
    tis = trajectory_is(rew, logp_t, logp_b, m, mdp.gamma).numpy()
    pdis = per_decision_is(rew, logp_t, logp_b, m, mdp.gamma).numpy()
    assert dist.expectation(tis) == pytest.approx(J_new, rel=1e-10, abs=0.0)
    assert dist.expectation(pdis) == pytest.approx(J_new, rel=1e-10, abs=0.0)
    assert dist.variance(pdis) < dist.variance(tis)


# ----------------------------------------------------------------------------------- REINFORCE


def softmax_case(seed: int, gamma: float, horizon: int = 3):
    mdp = random_mdp(seed, num_states=4, num_actions=2, gamma=gamma, num_terminal=1, termination_prob=0.3)
    theta = np.random.default_rng(seed + 300).normal(size=(4, 2))
    pi = softmax_policy(theta)
    return mdp, theta, pi, tabular.enumerate_trajectories(mdp, pi, horizon)


def per_trajectory_gradients(dist, theta, gamma, form, baseline=None):
    """``[K, S*A]``: the gradient of reinforce_loss on each trajectory alone. One call on all K
    rows, each row reading its own copy of theta, so the gradient w.r.t. copy k is (1/K) times
    row k's gradient (the loss is a mean over rows)."""
    K = dist.num_trajectories
    th = t64(theta).expand(K, *theta.shape).clone().requires_grad_(True)
    rows = torch.arange(K)[:, None]
    logp = torch.log_softmax(th, dim=2)[rows, torch.as_tensor(dist.states), torch.as_tensor(dist.actions)]
    b = None if baseline is None else t64(baseline)
    loss, _ = reinforce_loss(
        logp, t64(dist.rewards), torch.as_tensor(dist.mask), gamma, form=form, baseline=b
    )
    (g,) = torch.autograd.grad(loss, th)
    return (K * g).reshape(K, -1).numpy()


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("gamma", [0.8, 1.0])
def test_reinforce_forms_unbiased_and_baseline_reduces_variance(seed, gamma):
    mdp, theta, pi, dist = softmax_case(seed, gamma)
    exact = tabular.finite_horizon_softmax_gradient(mdp, pi, 3).reshape(-1)
    fh = tabular.finite_horizon_values(mdp, pi, 3)
    b_v = np.where(dist.mask, fh.V[np.arange(3)[None, :], dist.states], 0.0)
    # any function of (t, s_t) is a valid baseline (Williams 1992); a random table of them:
    b_table = np.random.default_rng(seed).normal(size=(3, mdp.num_states))
    b_rand = np.where(dist.mask, b_table[np.arange(3)[None, :], dist.states], 0.0)
    var = {}
    for form, b in [
        ("whole_return", None),
        ("reward_to_go", None),
        ("reward_to_go_baseline", b_v),
        ("reward_to_go_baseline", b_rand),
    ]:
        g = per_trajectory_gradients(dist, theta, gamma, form, b)
        np.testing.assert_allclose(dist.expectation(-g), exact, rtol=1e-10, atol=1e-12 * np.abs(g).max())
        var[form if b is not b_rand else "random_baseline"] = dist.variance(g).sum()
    assert var["reward_to_go_baseline"] < var["reward_to_go"] < var["whole_return"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_baseline_is_free_identity(seed):
    """Williams 1992; Sutton & Barto 2018, section 13.4: E_{a~pi}[grad log pi(a|s) b(s)] = 0 for each state
    (autograd of log_softmax)."""
    rng = np.random.default_rng(seed)
    th = t64(rng.normal(size=(5, 3))).requires_grad_(True)
    b = t64(rng.normal(size=5))
    logp = torch.log_softmax(th, dim=1)
    pi = logp.exp().detach()
    (g,) = torch.autograd.grad((pi * logp * b[:, None]).sum(), th)
    assert g.abs().max() < 1e-14
    assert b.abs().min() > 0  # the identity is not trivially satisfied by b = 0


@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_without_gamma_t_is_biased_with_pinned_bias(seed):
    """The reward-to-go form without gamma^t (errata.md entry 8) has expectation sum_t d_t(s) pi(a|s) (Q_t -
    V_t) (no
    discount on the state distribution), computed here from tabular quantities directly."""
    gamma, H = 0.8, 3
    mdp, theta, pi, dist = softmax_case(seed, gamma, H)
    g = per_trajectory_gradients(dist, theta, gamma, "reward_to_go_no_gamma")
    fh = tabular.finite_horizon_values(mdp, pi, H)
    d = tabular.state_distributions(mdp, pi, H)
    undiscounted_weighting = np.einsum("ts,sa,tsa->sa", d, pi, fh.Q - fh.V[:-1, :, None]).reshape(-1)
    np.testing.assert_allclose(dist.expectation(-g), undiscounted_weighting, rtol=1e-10, atol=1e-13)
    bias = undiscounted_weighting - tabular.finite_horizon_softmax_gradient(mdp, pi, H).reshape(-1)
    assert np.abs(bias).max() > 1e-3
    # at gamma = 1 the same form is unbiased
    mdp1, theta1, pi1, dist1 = softmax_case(seed, 1.0, H)
    g1 = per_trajectory_gradients(dist1, theta1, 1.0, "reward_to_go_no_gamma")
    exact1 = tabular.finite_horizon_softmax_gradient(mdp1, pi1, H).reshape(-1)
    np.testing.assert_allclose(dist1.expectation(-g1), exact1, rtol=1e-10, atol=1e-13)

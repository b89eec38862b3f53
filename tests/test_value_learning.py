"""Classic learners against exact tabular ground truth (spec: estimators.md section 6).

Statistical acceptance on seeded random MDPs with S = 6, A = 3, gamma = 0.9: each check runs for
the 5 fixed seeds 0..4, all of which must pass (no seed picking). The learners run on an
environment whose start distribution is uniform ("exploring starts"; values do not depend on
rho0) and episodes are cut by a short time limit, so every learner must bootstrap through
truncations correctly: treating a truncation as a termination would bias every value by far more
than the tolerances below.
"""

import numpy as np
import pytest
import torch

import tabular
from refimpl import value_learning as vl
from refimpl.envs import TabularEnv
from tabular.examples import random_mdp, random_policy

pytestmark = pytest.mark.slow
SEEDS = [0, 1, 2, 3, 4]
S, A, GAMMA = 6, 3, 0.9


def case(seed: int):
    mdp = random_mdp(seed, num_states=S, num_actions=A, gamma=GAMMA)
    env = TabularEnv(torch.tensor(mdp.P), torch.tensor(mdp.r), torch.full((S,), 1.0 / S, dtype=torch.float64),
                     GAMMA)
    return mdp, env, torch.Generator().manual_seed(1000 + seed)


def optimal_q(mdp):
    return tabular.q_values(mdp, tabular.policy_iteration(mdp).policy)


@pytest.mark.parametrize("seed", SEEDS)
def test_mc_evaluation_within_four_exact_standard_errors(seed):
    mdp, env, gen = case(seed)
    pi = random_policy(seed + 1, S, A)
    n, H = 1000, 150
    res = vl.mc_evaluation(env, torch.tensor(pi), n, H, gen)
    mean_H, second_H = tabular.return_moments(mdp, pi, H)
    se = np.sqrt((second_H - mean_H**2) / n)  # exact standard error of the mean of n H-step returns
    assert np.all(se > 0.01)
    # the estimator is unbiased for V_H, which is V up to gamma^H max|r| / (1 - gamma) < 1e-6 << se
    V = tabular.policy_evaluation(mdp, pi)
    assert np.abs(V - mean_H).max() <= GAMMA**H * np.abs(mdp.r).max() / (1 - GAMMA) + 1e-12
    z = np.abs(res.values.numpy() - V) / se
    assert z.max() < 4.0, z
    # the sample std agrees with the exact std (a loose sanity check on the spread itself)
    np.testing.assert_allclose(res.sample_std.numpy(), np.sqrt(second_H - mean_H**2), rtol=0.15)


@pytest.mark.parametrize("seed", SEEDS)
def test_td0_within_005_of_v(seed):
    mdp, env, gen = case(seed)
    pi = random_policy(seed + 1, S, A)
    V = vl.td0_evaluation(env, torch.tensor(pi), gen).numpy()
    assert np.abs(V - tabular.policy_evaluation(mdp, pi)).max() < 0.05


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("learner", ["q_learning", "sarsa"])
def test_q_learning_and_sarsa_reach_q_star(seed, learner):
    mdp, env, gen = case(seed)
    Q = getattr(vl, learner)(env, gen).numpy()
    assert np.abs(Q - optimal_q(mdp)).max() < 0.05


def near_optimal(mdp, policy: np.ndarray) -> None:
    J_star = tabular.expected_return(mdp, tabular.policy_iteration(mdp).policy)
    J_unif = tabular.expected_return(mdp, np.full((S, A), 1.0 / A))
    assert J_star - J_unif > 0.1  # a meaningful range
    gap = J_star - tabular.expected_return(mdp, policy)
    assert gap <= 0.01 * (J_star - J_unif), gap / (J_star - J_unif)


@pytest.mark.parametrize("seed", SEEDS)
def test_a2c_critic_is_the_exact_value_of_its_final_policy(seed):
    """A2C's critic is a fixed point of the batch-mean TD(lambda) update for the current policy, so
    at the end it must equal ``V_pi`` of the final policy, computed exactly by tabular (measured
    sup errors 0.014-0.035 on these seeds; a wrong discount, bootstrap or truncation shifts V by
    more than 0.5, test_td0_bootstraps_through_truncation). The policy is also near-optimal. The
    first updates are pinned exactly by test_a2c_first_two_updates_equal_an_independent_replay."""
    mdp, env, gen = case(seed)
    res = vl.a2c(env, gen)
    policy = res.policy.numpy()
    assert np.abs(res.values.numpy() - tabular.policy_evaluation(mdp, policy)).max() < 0.06
    near_optimal(mdp, policy)


def test_dqn_end_to_end_reaches_near_optimal_policy():
    """One seed end to end with the defaults (hard target copy every 50 steps): the greedy policy
    of DQN's Q is judged exactly. Its values are still far from Q* with this budget (sup error
    0.9-1.9 on seeds 0-4: 580 gradient steps make only 11 target copies, 11 steps of value
    iteration); test_dqn_with_polyak_target_reaches_q_star checks the values."""
    mdp, env, gen = case(0)
    near_optimal(mdp, vl.dqn(env, gen).greedy_policy.numpy())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dqn_with_polyak_target_reaches_q_star(seed):
    """With the soft target update of Lillicrap et al. 2016 (tau = 0.1 after every gradient step) the same
    budget reaches the fixed point: the learned Q is within 0.15 of the exact Q* in sup norm
    (measured 0.04-0.08 on seeds 0-4). A wrong discount (0.89 for 0.9) moves Q* by about
    0.01 |V| / (1 - gamma) ~ 0.5, a missing bootstrap by far more."""
    mdp, env, gen = case(seed)
    res = vl.dqn(env, gen, target_period=1, tau=0.1)
    assert np.abs(res.q_values.numpy() - optimal_q(mdp)).max() < 0.15


# ----------------------------------------------------------------------------------- units


def test_schedules_and_epsilon_greedy():
    step = vl.robbins_monro(1.0, 10.0, 1.0)
    assert step(0) == 1.0 and step(10) == pytest.approx(0.5, rel=1e-15, abs=0.0)
    with pytest.raises(ValueError, match="power"):
        vl.robbins_monro(1.0, 10.0, 0.5)
    with pytest.raises(ValueError, match="initial"):
        vl.glie_epsilon(0.0, 10.0)
    eps = vl.glie_epsilon(0.5, 4.0)
    assert eps(4) == pytest.approx(0.25, rel=1e-15, abs=0.0)
    q = torch.tensor([[0.0, 2.0, 1.0], [3.0, 3.0, 0.0]], dtype=torch.float64)
    probs = vl.epsilon_greedy(q, 0.3)
    expected = torch.tensor([[0.1, 0.8, 0.1], [0.8, 0.1, 0.1]], dtype=torch.float64)
    torch.testing.assert_close(probs, expected, rtol=0, atol=1e-15)


def test_learners_reject_bad_arguments():
    mdp, env, gen = case(0)
    with pytest.raises(TypeError, match="env"):
        vl.q_learning(mdp, gen)
    with pytest.raises(ValueError, match="num_envs"):
        vl.td0_evaluation(env, torch.full((S, A), 1.0 / A, dtype=torch.float64), gen, num_envs=0)


def test_td0_bootstraps_through_truncation():
    """Every episode is cut after one step; TD(0) must still learn V (not r_pi), because a
    truncated step bootstraps from its final observation."""
    mdp, env, gen = case(0)
    pi = random_policy(1, S, A)
    V = vl.td0_evaluation(env, torch.tensor(pi), gen, max_episode_steps=1).numpy()
    assert np.abs(V - tabular.policy_evaluation(mdp, pi)).max() < 0.05
    r_pi = (pi * mdp.r).sum(1)
    assert np.abs(tabular.policy_evaluation(mdp, pi) - r_pi).max() > 0.5  # the wrong answer is far


def test_terminated_stops_bootstrapping_in_q_learning():
    """An episodic MDP with terminal states: Q-learning still reaches Q* (terminated steps do
    not bootstrap; terminal values are 0)."""
    mdp = random_mdp(7, num_states=5, num_actions=2, gamma=0.9, num_terminal=1, termination_prob=0.3)
    rho0 = torch.tensor(np.where(mdp.terminal, 0.0, 1.0 / 4))
    env = TabularEnv(torch.tensor(mdp.P), torch.tensor(mdp.r), rho0, 0.9, terminal=torch.tensor(mdp.terminal))
    Q = vl.q_learning(env, torch.Generator().manual_seed(0)).numpy()
    Q_star = optimal_q(mdp)
    assert np.abs(Q - Q_star)[~mdp.terminal].max() < 0.05


# ----------------------------------------------- exact replays of the first updates (issue 13)
#
# Each replay draws the same random numbers from a generator with the learner's seed (the same
# environment stream, the same network initialisation and minibatch draws, in the learner's order)
# and recomputes the updates independently in numpy float64 from the definitions: hand-written
# GAE recursion, softmax score, MLP back-propagation and Adam. Any change in a target, a mask, a
# sign, a step size or an order of operations that matters shows up at O(step size).


def episodic_case():
    mdp = random_mdp(7, num_states=5, num_actions=2, gamma=0.9, num_terminal=1, termination_prob=0.3)
    rho0 = torch.tensor(np.where(mdp.terminal, 0.0, 1.0 / 4))
    env = TabularEnv(torch.tensor(mdp.P), torch.tensor(mdp.r), rho0, 0.9, terminal=torch.tensor(mdp.terminal))
    return mdp, env


def softmax_rows(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def gae_by_loop(r, v, v_next, term, trunc, gamma, lam):
    """GAE from its definition, one row and one step at a time (estimators.md eq. (12))."""
    N, T = r.shape
    adv = np.zeros((N, T))
    for i in range(N):
        running = 0.0
        for t in reversed(range(T)):
            delta = r[i, t] + gamma * (0.0 if term[i, t] else v_next[i, t]) - v[i, t]
            cut = term[i, t] or trunc[i, t] or t == T - 1
            running = delta + (0.0 if cut else gamma * lam * running)
            adv[i, t] = running
    return adv, adv + v


def test_a2c_first_two_updates_equal_an_independent_replay():
    """Actor: ``logits += lr * grad mean_t A_t log pi(a_t|s_t)``; critic: batch-mean step towards the
    GAE returns. Truncation (3 steps), termination and segment ends all occur in the replay."""
    mdp, env = episodic_case()
    kw = dict(num_envs=6, rollout_length=4, num_updates=2, max_episode_steps=3, actor_lr=20.0, lam=0.95)
    result = vl.a2c(env, torch.Generator().manual_seed(3), **kw)
    S, A, gamma = mdp.num_states, mdp.num_actions, mdp.gamma
    logits, V = np.zeros((S, A)), np.zeros(S)
    gen = torch.Generator().manual_seed(3)
    stream = env.transitions(lambda s, _: torch.tensor(softmax_rows(logits[s.numpy()])), kw["num_envs"], gen,
                             max_episode_steps=kw["max_episode_steps"])
    seen = {"term": False, "trunc": False}
    for k in range(kw["num_updates"]):
        steps = [next(stream) for _ in range(kw["rollout_length"])]
        fields = list(zip(*steps, strict=True))[:6]
        s, a, r, s2, term, trunc = (np.stack([f.numpy() for f in field], 1) for field in fields)
        seen["term"] |= bool(term.any())
        seen["trunc"] |= bool(trunc.any())
        adv, ret = gae_by_loop(r, V[s], V[s2], term, trunc, gamma, kw["lam"])
        pi = softmax_rows(logits)
        grad = np.zeros((S, A))
        for si, ai, ad in zip(s.ravel(), a.ravel(), adv.ravel(), strict=True):
            grad[si] += ad * (np.eye(A)[ai] - pi[si]) / s.size
        logits = logits + kw["actor_lr"] * grad
        step = 0.5 / (1 + k / 50.0) ** 0.6  # the default critic schedule robbins_monro(0.5, 50, 0.6)
        V_new = V.copy()
        for state in np.unique(s):
            V_new[state] += step * np.mean((ret - V[s])[s == state])
        V = V_new
    assert seen["term"] and seen["trunc"]
    # O(1) sums of O(1) terms in float64; the actor step multiplies rounding by lr = 20.
    np.testing.assert_allclose(result.logits.numpy(), logits, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.values.numpy(), V, rtol=1e-12, atol=1e-14)
    assert np.abs(logits).max() > 0.1 and np.abs(V).max() > 0.1  # the updates are not trivial


def dqn_replay(env, seed, *, num_envs, num_steps, learning_starts, batch_size, hidden, lr, target_period,
               tau):
    """Independent numpy DQN: ``(params, target_params)`` after ``num_steps`` environment steps."""
    S, A, gamma = env.num_states, env.num_actions, env.gamma
    gen = torch.Generator().manual_seed(seed)

    def uniform(shape, fan_in):
        bound = fan_in ** -0.5
        return torch.empty(shape, dtype=torch.float64).uniform_(-bound, bound, generator=gen).numpy()

    params = [uniform((hidden, S), S), uniform((hidden,), S), uniform((A, hidden), hidden),
              uniform((A,), hidden)]
    target = [p.copy() for p in params]

    def forward(ps, states):
        W1, b1, W2, b2 = ps
        pre = W1[:, states].T + b1
        h = np.maximum(pre, 0.0)
        return h @ W2.T + b2, h, pre

    eps = [1.0]

    def behaviour(states, _):
        q = forward(params, states.numpy())[0]
        probs = np.full(q.shape, eps[0] / A)
        probs[np.arange(len(q)), q.argmax(1)] += 1.0 - eps[0]
        return torch.tensor(probs)

    stream = env.transitions(behaviour, num_envs, gen, max_episode_steps=20)
    buf = {key: [] for key in ("s", "a", "r", "s2", "term")}
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    beta1, beta2, adam_eps = 0.9, 0.999, 1e-8
    num_updates = max(num_steps - learning_starts, 1)
    for k in range(num_steps):
        eps[0] = 1.0 / (1.0 + k / 50.0)  # the default GLIE schedule glie_epsilon(1, 50)
        tr = next(stream)
        fields = (tr.states, tr.actions, tr.rewards, tr.next_states, tr.terminated)
        for key, x in zip(buf, fields, strict=True):
            buf[key].extend(x.numpy().tolist())
        if k < learning_starts:
            continue
        j = torch.randint(len(buf["s"]), (batch_size,), generator=gen).numpy()
        s, a, r, s2, term = (np.asarray(buf[key])[j] for key in buf)
        y = r + gamma * np.where(term, 0.0, forward(target, s2)[0].max(1))
        q, h, pre = forward(params, s)
        dq = np.zeros_like(q)
        dq[np.arange(batch_size), a] = 2.0 * (q[np.arange(batch_size), a] - y) / batch_size
        dpre = (dq @ params[2]) * (pre > 0)
        gW1 = np.zeros_like(params[0])
        np.add.at(gW1.T, s, dpre)
        grads = [gW1, dpre.sum(0), dq.T @ h, dq.sum(0)]
        step = k - learning_starts + 1
        lr_k = lr * (1.0 - (step - 1) / num_updates)
        for i, g in enumerate(grads):
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            m_hat, v_hat = m[i] / (1 - beta1**step), v[i] / (1 - beta2**step)
            params[i] = params[i] - lr_k * m_hat / (np.sqrt(v_hat) + adam_eps)
        if step % target_period == 0:
            target = [p.copy() if tau == 1.0 else tau * p + (1 - tau) * t
                      for p, t in zip(params, target, strict=True)]
    return params, target


def module_params(net) -> list[np.ndarray]:
    return [p.detach().numpy() for p in (net[0].weight, net[0].bias, net[2].weight, net[2].bias)]


@pytest.mark.parametrize("tau, target_period", [(0.25, 1), (1.0, 2)])
def test_dqn_first_updates_equal_an_independent_replay(tau, target_period):
    """Three Adam steps with the soft (Polyak, Lillicrap et al. 2016) and the hard (Mnih et al. 2015)
    target update: network and target network equal the numpy replay. Tolerance: a gradient
    coordinate carries an absolute rounding error of ~1e-15, which Adam's normalisation
    g / (|g| + 1e-8) can amplify to lr * 1e-15 / 1e-8 = 3e-10 per step."""
    mdp, env = episodic_case()
    kw = dict(num_envs=8, num_steps=6, learning_starts=3, batch_size=16, hidden=8, lr=3e-3,
              target_period=target_period, tau=tau)
    res = vl.dqn(env, torch.Generator().manual_seed(5), **kw)
    params, target = dqn_replay(env, 5, **kw)
    initial = dqn_replay(env, 5, **{**kw, "num_steps": kw["learning_starts"]})[0]
    for got, want, start in zip(module_params(res.q_network), params, initial, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-8)
        assert np.abs(want - start).max() > 1e-3  # three steps of about lr each moved it
    for got, want in zip(module_params(res.target_network), target, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-8)
    if tau < 1:  # the EMA target lies strictly between the initial and the online weights: it differs
        # from both by far more than the 1e-8 replay agreement above (an Adam step moves ~lr = 3e-3)
        assert np.abs(target[2] - params[2]).max() > 1e-4 and np.abs(target[2] - initial[2]).max() > 1e-4


def test_polyak_update_exact_values_and_tau_one_is_the_hard_copy():
    """``theta^- <- tau theta + (1 - tau) theta^-`` with dyadic weights (exact in float64), and
    ``tau = 1`` gives the hard copy bit for bit."""
    net, target = torch.nn.Linear(2, 1).double(), torch.nn.Linear(2, 1).double()
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, -2.0]]))
        net.bias.fill_(0.5)
        target.weight.copy_(torch.tensor([[3.0, 4.0]]))
        target.bias.fill_(-1.0)
    vl.polyak_update(target, net, 0.25)
    assert target.weight.tolist() == [[2.5, 2.5]] and target.bias.tolist() == [-0.625]
    vl.polyak_update(target, net, 1.0)
    assert torch.equal(target.weight, net.weight) and torch.equal(target.bias, net.bias)
    _, env = episodic_case()
    for bad in (0.0, -0.5, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="tau must be a number in"):
            vl.dqn(env, torch.Generator().manual_seed(0), num_steps=2, tau=bad)
        with pytest.raises(ValueError, match="tau must be a number in"):
            vl.polyak_update(target, net, bad)
    with pytest.raises(ValueError, match="same parameters"):
        vl.polyak_update(torch.nn.Linear(3, 1).double(), torch.nn.Sequential(torch.nn.Linear(2, 1)), 0.5)

"""refimpl.envs.TabularEnv: sampling law, episode bookkeeping (terminated vs truncated, final
observations, resets), reproducibility and input validation (spec: estimators.md section 1)."""

import numpy as np
import pytest
import torch

from refimpl.envs import TabularEnv, sample_categorical
from tabular.examples import random_mdp, random_policy

F64 = torch.float64


def episodic_env(seed=0, S=5, A=2):
    mdp = random_mdp(seed, num_states=S, num_actions=A, gamma=0.9, num_terminal=1, termination_prob=0.3)
    env = TabularEnv(
        torch.tensor(mdp.P),
        torch.tensor(mdp.r),
        torch.tensor(mdp.rho0),
        0.9,
        terminal=torch.tensor(mdp.terminal),
    )
    return mdp, env


def test_sample_categorical_frequencies_within_five_standard_errors():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=F64)
    n = 200_000
    idx = sample_categorical(probs.expand(n, -1), torch.Generator().manual_seed(0))
    freq = torch.bincount(idx, minlength=4).double() / n
    se = (probs * (1 - probs) / n).sqrt()
    assert freq[1] == 0.0  # a zero-probability index is never drawn
    assert ((freq - probs).abs() <= 5 * se + 1e-15).all(), (freq, probs)
    onehot = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=F64)
    assert sample_categorical(onehot, torch.Generator().manual_seed(1)).tolist() == [2, 0]


def test_transition_and_reward_law():
    """Empirical P(s'|s,a) from one step of many environments matches P within 5 standard errors,
    and rewards are r[s, a] (or r[s, a, s'] for 3-d rewards)."""
    mdp = random_mdp(3, num_states=3, num_actions=2, gamma=0.9, reward_shape="sas")
    r_sas = np.random.default_rng(0).normal(size=(3, 2, 3))
    env = TabularEnv(torch.tensor(mdp.P), torch.tensor(r_sas), torch.tensor(mdp.rho0), 0.9)
    n = 60_000
    s = torch.full((n,), 1, dtype=torch.int64)
    a = torch.full((n,), 0, dtype=torch.int64)
    s2, rew, term = env.step(s, a, torch.Generator().manual_seed(0))
    freq = torch.bincount(s2, minlength=3).double().numpy() / n
    p = mdp.P[1, 0]
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-15)
    np.testing.assert_array_equal(rew.numpy(), r_sas[1, 0, s2.numpy()])
    assert not term.any()


def test_rollout_bookkeeping_terminated_truncated_and_final_observations():
    mdp, env = episodic_env()
    pi = torch.tensor(random_policy(0, 5, 2))
    H = 3
    ro = env.rollout(pi, 64, 40, torch.Generator().manual_seed(0), max_episode_steps=H)
    term, trunc = ro.terminated, ro.truncated
    assert term.any() and trunc.any()
    assert not (term & trunc).any()
    # terminated exactly when the step arrives in a terminal state
    terminal = torch.tensor(mdp.terminal)
    assert torch.equal(term, terminal[ro.next_states])
    # truncated exactly when the episode reaches H steps without terminating
    assert torch.equal(trunc, ~term & (ro.episode_steps == H - 1))
    assert (ro.episode_steps < H).all()
    # inside an episode the next row entry continues from next_states; after an end it restarts
    ended = term | trunc
    cont = ~ended[:, :-1]
    assert torch.equal(ro.states[:, 1:][cont], ro.next_states[:, :-1][cont])
    assert (ro.episode_steps[:, 1:][ended[:, :-1]] == 0).all()
    assert torch.equal(ro.episode_steps[:, 1:][cont], ro.episode_steps[:, :-1][cont] + 1)
    # restarts come from rho0's support; final observations of truncated steps are kept
    assert (torch.tensor(mdp.rho0)[ro.states[:, 1:][ended[:, :-1]]] > 0).all()
    assert not terminal[ro.states].any()
    # behaviour log-probabilities
    torch.testing.assert_close(ro.behavior_logp, pi[ro.states, ro.actions].log(), rtol=0, atol=0)
    torch.testing.assert_close(ro.rewards, torch.tensor(mdp.r)[ro.states, ro.actions], rtol=0, atol=0)


def test_rollout_without_time_limit_never_truncates():
    _, env = episodic_env()
    ro = env.rollout(torch.full((5, 2), 0.5, dtype=F64), 16, 30, torch.Generator().manual_seed(0))
    assert not ro.truncated.any() and ro.terminated.any()


def test_start_states_and_callable_policy():
    _, env = episodic_env()
    seen_steps = []

    def policy(states, episode_steps):
        seen_steps.append(episode_steps.clone())
        return torch.nn.functional.one_hot(torch.ones_like(states), 2).double()

    start = torch.tensor([0, 1, 2, 3], dtype=torch.int64)
    ro = env.rollout(policy, 4, 5, torch.Generator().manual_seed(0), start_states=start, max_episode_steps=2)
    assert torch.equal(ro.states[:, 0], start)
    assert (ro.actions == 1).all() and (ro.behavior_logp == 0).all()
    assert torch.equal(torch.stack(seen_steps, 1), ro.episode_steps)


def test_same_seed_same_rollout_different_seed_different_rollout():
    _, env = episodic_env()
    pi = torch.full((5, 2), 0.5, dtype=F64)
    a = env.rollout(pi, 8, 20, torch.Generator().manual_seed(5), max_episode_steps=4)
    b = env.rollout(pi, 8, 20, torch.Generator().manual_seed(5), max_episode_steps=4)
    c = env.rollout(pi, 8, 20, torch.Generator().manual_seed(6), max_episode_steps=4)
    for x, y in zip(a.__dict__.values(), b.__dict__.values(), strict=True):
        assert torch.equal(x, y)
    assert not torch.equal(a.states, c.states)


def test_bad_inputs_raise_clear_errors():
    mdp, env = episodic_env()
    P, r, rho0 = torch.tensor(mdp.P), torch.tensor(mdp.r), torch.tensor(mdp.rho0)
    terminal = torch.tensor(mdp.terminal)
    with pytest.raises(ValueError, match="P rows must sum to 1"):
        TabularEnv(P * 1.1, r, rho0, 0.9)
    with pytest.raises(ValueError, match="P has negative"):
        TabularEnv(P - P * 2 * (P > 0.5), r, rho0, 0.9)
    with pytest.raises(ValueError, match="r contains NaN"):
        TabularEnv(P, r * float("nan"), rho0, 0.9)
    with pytest.raises(ValueError, match=r"r must have shape"):
        TabularEnv(P, r[:, :1], rho0, 0.9)
    with pytest.raises(ValueError, match="gamma"):
        TabularEnv(P, r, rho0, 1.5)
    with pytest.raises(TypeError, match="floating"):
        TabularEnv(P.long(), r, rho0, 0.9)
    bad_rho0 = torch.zeros(5, dtype=F64)
    bad_rho0[-1] = 1.0
    with pytest.raises(ValueError, match="rho0 puts mass on terminal"):
        TabularEnv(P, r, bad_rho0, 0.9, terminal=terminal)
    with pytest.raises(ValueError, match="terminal must be a bool"):
        TabularEnv(P, r, rho0, 0.9, terminal=terminal.long())
    with pytest.raises(ValueError, match="cannot step from a terminal"):
        env.step(torch.tensor([4]), torch.tensor([0]), None)
    with pytest.raises(ValueError, match="policy rows must sum"):
        env.rollout(torch.full((5, 2), 0.6, dtype=F64), 2, 2, None)
    with pytest.raises(ValueError, match="max_episode_steps"):
        env.rollout(torch.full((5, 2), 0.5, dtype=F64), 2, 2, None, max_episode_steps=0)
    with pytest.raises(ValueError, match="start_states"):
        env.rollout(torch.full((5, 2), 0.5, dtype=F64), 2, 2, None, start_states=torch.tensor([4, 0]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_rollout_on_cuda_stays_on_device():
    mdp, _ = episodic_env()
    dev = torch.device("cuda")
    env = TabularEnv(
        torch.tensor(mdp.P, device=dev),
        torch.tensor(mdp.r, device=dev),
        torch.tensor(mdp.rho0, device=dev),
        0.9,
        terminal=torch.tensor(mdp.terminal, device=dev),
    )
    ro = env.rollout(
        torch.full((5, 2), 0.5, dtype=F64, device=dev),
        4,
        6,
        torch.Generator(device=dev).manual_seed(0),
        max_episode_steps=3,
    )
    assert ro.states.device.type == "cuda" and ro.truncated.device.type == "cuda"

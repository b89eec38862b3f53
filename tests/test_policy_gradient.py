"""refimpl.policy_gradient.reinforce_loss: values and gradients by hand and against a loop, and
input validation (spec: estimators.md section 4). Unbiasedness and the gamma^t erratum are proven
by exact enumeration in test_estimators_exact.py."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from refimpl.policy_gradient import REINFORCE_FORMS, episode_returns_to_go, reinforce_loss

F64 = torch.float64


def loop_weights(rewards, lengths, gamma, form, baseline):
    """Per-step weights by explicit sums over each episode (no recursion)."""
    N, T = rewards.shape
    w = np.zeros((N, T))
    for i in range(N):
        L = lengths[i]
        for t in range(L):
            G_t = sum(gamma ** (j - t) * rewards[i, j] for j in range(t, L))
            G_0 = sum(gamma**j * rewards[i, j] for j in range(L))
            w[i, t] = {
                "whole_return": G_0,
                "reward_to_go": gamma**t * G_t,
                "reward_to_go_baseline": gamma**t * (G_t - baseline[i, t]),
                "reward_to_go_no_gamma": G_t,
            }[form]
    return w


@given(
    st.integers(1, 4),
    st.integers(1, 5),
    st.sampled_from(REINFORCE_FORMS),
    st.sampled_from([0.0, 0.7, 1.0]),
    st.integers(0, 2**31 - 1),
)
def test_loss_value_and_gradient_equal_the_explicit_sums(N, T, form, gamma, seed):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(N, T))
    lengths = rng.integers(0, T + 1, size=N)
    mask = np.arange(T)[None, :] < lengths[:, None]
    baseline = rng.normal(size=(N, T))
    logp = torch.tensor(rng.normal(size=(N, T)), dtype=F64, requires_grad=True)
    b = torch.tensor(baseline) if form == "reward_to_go_baseline" else None
    loss, metrics = reinforce_loss(
        logp, torch.tensor(rewards), torch.tensor(mask), gamma, form=form, baseline=b
    )
    w = loop_weights(rewards, lengths, gamma, form, baseline)
    expected = -(logp.detach().numpy() * w).sum() / N
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12, abs=1e-12 * (1 + np.abs(w).sum()))
    (grad,) = torch.autograd.grad(loss, logp)
    np.testing.assert_allclose(grad.numpy(), -w / N, rtol=1e-12, atol=1e-14)
    G0 = [sum(gamma**j * rewards[i, j] for j in range(lengths[i])) for i in range(N)]
    # the mean of N discounted sums of <= T rewards may cancel: one rounding per term, both sides
    floor = 4 * 2.0**-53 * (T + N) * float(np.abs(rewards).sum(axis=1).max())
    assert float(metrics["mean_return"]) == pytest.approx(np.mean(G0), rel=1e-12, abs=floor)
    assert float(metrics["mean_length"]) == pytest.approx(lengths.mean(), rel=1e-12, abs=0.0)
    assert all(not v.requires_grad for v in metrics.values())


def test_no_gradient_through_rewards_or_baseline():
    logp = torch.zeros(1, 2, dtype=F64, requires_grad=True)
    rewards = torch.ones(1, 2, dtype=F64, requires_grad=True)
    baseline = torch.ones(1, 2, dtype=F64, requires_grad=True)
    loss, _ = reinforce_loss(
        logp,
        rewards,
        torch.ones(1, 2, dtype=torch.bool),
        0.9,
        form="reward_to_go_baseline",
        baseline=baseline,
    )
    grads = torch.autograd.grad(loss, (rewards, baseline), allow_unused=True)
    assert all(g is None for g in grads)


def test_episode_returns_to_go_by_hand():
    r = torch.tensor([[1.0, 2.0, 4.0], [3.0, 5.0, 7.0]], dtype=F64)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    G = episode_returns_to_go(r, mask, 0.5)
    torch.testing.assert_close(G, torch.tensor([[3.0, 4.0, 4.0], [3.0, 0.0, 0.0]], dtype=F64), rtol=0, atol=0)


def test_bad_inputs_raise_clear_errors():
    logp = torch.zeros(2, 3, dtype=F64)
    r = torch.zeros(2, 3, dtype=F64)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="form must be one of"):
        reinforce_loss(logp, r, m, 0.9, form="gae")
    with pytest.raises(ValueError, match="baseline is required"):
        reinforce_loss(logp, r, m, 0.9, form="reward_to_go_baseline")
    with pytest.raises(ValueError, match="only allowed"):
        reinforce_loss(logp, r, m, 0.9, form="reward_to_go", baseline=r)
    with pytest.raises(ValueError, match="prefix"):
        reinforce_loss(
            logp, r, torch.tensor([[True, False, True], [True, True, True]]), 0.9, form="reward_to_go"
        )
    with pytest.raises(ValueError, match="gamma"):
        reinforce_loss(logp, r, m, 1.1, form="reward_to_go")
    with pytest.raises(ValueError, match="rewards must have shape"):
        reinforce_loss(logp, r[:, :2], m, 0.9, form="reward_to_go")
    with pytest.raises(ValueError, match="logp contains NaN"):
        reinforce_loss(logp * float("nan"), r, m, 0.9, form="reward_to_go")
    with pytest.raises(ValueError, match="mask must be bool or 0/1"):
        reinforce_loss(logp, r, m.double() * 3, 0.9, form="reward_to_go")


def test_float32_inputs():
    logp = torch.zeros(2, 3, dtype=torch.float32, requires_grad=True)
    loss, _ = reinforce_loss(
        logp, torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool), 1.0, form="reward_to_go"
    )
    (g,) = torch.autograd.grad(loss, logp)
    # rewards-to-go 3, 2, 1 over 2 rows: exact in float32
    torch.testing.assert_close(g, torch.tensor([[-1.5, -1.0, -0.5]] * 2), rtol=0.0, atol=0.0)

"""refimpl.estimators against the sympy spec, a slow loop reference, hand-computed rollouts, and
each other (spec: estimators.md sections 1-3). Exact-expectation checks are in
test_estimators_exact.py."""

import numpy as np
import pytest
import sympy as sp
import torch
from hypothesis import given
from hypothesis import strategies as st

import specs.estimators as spec
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
from tests.strategies import rollout_batches

F64 = torch.float64


def tensors(batch):
    return {k: torch.as_tensor(v, dtype=F64 if v.dtype != bool else torch.bool) for k, v in batch.items()}


def floor(batch) -> float:
    """Absolute floor: 1e-12 times the sum of magnitudes entering any estimate of a row."""
    return 1e-12 * (1.0 + max(np.abs(batch[k]).sum() for k in ("rewards", "values", "next_values")))


def assert_matches_spec(got: torch.Tensor, exprs_per_row, batch):
    expected = np.array([spec.evaluate_float64(row) for row in exprs_per_row])  # correctly rounded
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=floor(batch))


def rows(batch, *keys):
    """Per-row argument lists for the spec functions (python floats / bools)."""
    return [[batch[k][i].tolist() for k in keys] for i in range(batch["rewards"].shape[0])]


gammas = st.sampled_from([0.0, 0.5, 0.9, 1.0])
lams = st.sampled_from([0.0, 0.3, 0.95, 1.0])


# ----------------------------------------------------------------------------------- vs the sympy spec


@given(rollout_batches(), gammas)
def test_discounted_returns_match_spec(batch, gamma):
    b = tensors(batch)
    got = discounted_returns(
        b["rewards"], b["terminated"], b["truncated"], gamma, next_values=b["next_values"]
    )
    exprs = [
        spec.discounted_return_exprs(r, te, tr, gamma, nv)
        for r, te, tr, nv in rows(batch, "rewards", "terminated", "truncated", "next_values")
    ]
    assert_matches_spec(got, exprs, batch)


@given(rollout_batches(), gammas, st.integers(1, 7))
def test_n_step_returns_match_spec(batch, gamma, n):
    b = tensors(batch)
    got = n_step_returns(b["rewards"], b["next_values"], b["terminated"], b["truncated"], gamma, n)
    exprs = [
        spec.n_step_return_exprs(r, nv, te, tr, gamma, n)
        for r, nv, te, tr in rows(batch, "rewards", "next_values", "terminated", "truncated")
    ]
    assert_matches_spec(got, exprs, batch)


@given(rollout_batches(), gammas, lams)
def test_gae_td_and_lambda_returns_match_spec(batch, gamma, lam):
    b = tensors(batch)
    args = (b["rewards"], b["values"], b["next_values"], b["terminated"], b["truncated"], gamma, lam)
    adv, ret = gae_advantages(*args)
    per_row = rows(batch, "rewards", "values", "next_values", "terminated", "truncated")
    assert_matches_spec(adv, [spec.gae_exprs(*row, gamma, lam) for row in per_row], batch)
    torch.testing.assert_close(ret, adv + b["values"], rtol=0, atol=0)
    delta = td_errors(b["rewards"], b["values"], b["next_values"], b["terminated"], gamma)
    assert_matches_spec(
        delta, [spec.td_error_exprs(r, v, nv, te, gamma) for r, v, nv, te, _ in per_row], batch
    )
    lr = lambda_returns(b["rewards"], b["next_values"], b["terminated"], b["truncated"], gamma, lam)
    assert_matches_spec(
        lr, [spec.lambda_return_exprs(r, nv, te, tr, gamma, lam) for r, _, nv, te, tr in per_row], batch
    )


def test_spec_symbolic_facts():
    assert spec.prove_gae_is_normalised_nstep_mixture(4)
    assert spec.prove_lambda_return_is_gae_plus_value(4)
    assert spec.verify_erratum_004_gae(4)
    assert spec.prove_seed_000_lambda_return_form(4)
    assert spec.prove_trajectory_weight_variance(3)
    assert spec.prove_is_unbiased(3)


# ----------------------------------------------------------------------------------- identities


@given(rollout_batches(max_steps=7), gammas, lams)
def test_gae_is_normalised_mixture_of_n_step_advantages(batch, gamma, lam):
    """GAE_t = (1 - lam) sum_{n<m} lam^(n-1) A^(n)_t + lam^(m-1) A^(m)_t, m the steps left in the
    episode segment (the Monte-Carlo term gets the tail weight; errata.md entry 6), to 1e-12."""
    b = tensors(batch)
    adv, _ = gae_advantages(
        b["rewards"], b["values"], b["next_values"], b["terminated"], b["truncated"], gamma, lam
    )
    N, T = batch["rewards"].shape
    nstep = {
        n: n_step_returns(b["rewards"], b["next_values"], b["terminated"], b["truncated"], gamma, n)
        - b["values"]
        for n in range(1, T + 1)
    }
    expected = torch.zeros(N, T, dtype=F64)
    for i in range(N):
        for t in range(T):
            m = spec.segment_end(t, batch["terminated"][i], batch["truncated"][i]) - t + 1
            mix = sum((1 - lam) * lam ** (n - 1) * nstep[n][i, t] for n in range(1, m))
            expected[i, t] = mix + lam ** (m - 1) * nstep[m][i, t]
    torch.testing.assert_close(adv, expected, rtol=1e-12, atol=1e-12 * (1 + float(adv.abs().max())))


@given(rollout_batches(), gammas, lams)
def test_cross_function_equalities(batch, gamma, lam):
    b = tensors(batch)
    r, v, nv, te, tr = (b[k] for k in ("rewards", "values", "next_values", "terminated", "truncated"))
    atol = floor(batch) * 10
    _, ret = gae_advantages(r, v, nv, te, tr, gamma, lam)
    torch.testing.assert_close(lambda_returns(r, nv, te, tr, gamma, lam), ret, rtol=1e-12, atol=atol)
    G = discounted_returns(r, te, tr, gamma, next_values=nv)
    torch.testing.assert_close(n_step_returns(r, nv, te, tr, gamma, r.shape[1]), G, rtol=1e-12, atol=atol)
    torch.testing.assert_close(
        gae_advantages(r, v, nv, te, tr, gamma, 1.0).advantages, G - v, rtol=1e-12, atol=atol
    )
    torch.testing.assert_close(
        gae_advantages(r, v, nv, te, tr, gamma, 0.0).advantages,
        td_errors(r, v, nv, te, gamma),
        rtol=1e-12,
        atol=atol,
    )
    torch.testing.assert_close(
        n_step_returns(r, nv, te, tr, gamma, 1), td_errors(r, v, nv, te, gamma) + v, rtol=1e-12, atol=atol
    )


@given(rollout_batches(max_rows=4), gammas, lams, st.randoms(use_true_random=False))
def test_rows_are_independent(batch, gamma, lam, rnd):
    """Permuting rows permutes the output; each row alone gives the same result."""
    b = tensors(batch)
    perm = list(range(batch["rewards"].shape[0]))
    rnd.shuffle(perm)
    keys = ("rewards", "values", "next_values", "terminated", "truncated")
    full = gae_advantages(*(b[k] for k in keys), gamma, lam).advantages
    permuted = gae_advantages(*(b[k][perm] for k in keys), gamma, lam).advantages
    torch.testing.assert_close(permuted, full[perm], rtol=0, atol=0)
    single = gae_advantages(*(b[k][:1] for k in keys), gamma, lam).advantages
    torch.testing.assert_close(single, full[:1], rtol=0, atol=0)


# ----------------------------------------------------------------------------------- slow loop reference


def slow_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Per-trajectory Python loops: split each row into episodes, then the textbook backward pass."""
    out = np.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        start = 0
        T = rewards.shape[1]
        while start < T:
            end = start
            while end < T - 1 and not terminated[i, end] and not truncated[i, end]:
                end += 1
            running = 0.0
            for t in range(end, start - 1, -1):
                bootstrap = 0.0 if terminated[i, t] else next_values[i, t]
                delta = rewards[i, t] + gamma * bootstrap - values[i, t]
                running = delta + (gamma * lam * running if t < end else 0.0)
                out[i, t] = running
            start = end + 1
    return out


@given(rollout_batches(max_rows=4, max_steps=8), gammas, lams)
def test_gae_matches_slow_loop(batch, gamma, lam):
    b = tensors(batch)
    keys = ("rewards", "values", "next_values", "terminated", "truncated")
    adv, _ = gae_advantages(*(b[k] for k in keys), gamma, lam)
    np.testing.assert_allclose(
        adv.numpy(), slow_gae(*(batch[k] for k in keys), gamma, lam), rtol=1e-12, atol=floor(batch)
    )


def hand_built_row():
    """One row, two episode ends: terminated after step 1, truncated after step 3, and the row
    ends mid-episode after step 5."""
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], dtype=F64)
    values = torch.tensor([[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]], dtype=F64)
    # next_values: V(s_{t+1}) inside episodes, V(final obs) = 100 at the truncation, 200 at the
    # row's end; at the terminated step a junk 999 that must be ignored.
    next_values = torch.tensor([[20.0, 999.0, 40.0, 100.0, 60.0, 200.0]], dtype=F64)
    terminated = torch.tensor([[False, True, False, False, False, False]])
    truncated = torch.tensor([[False, False, False, True, False, False]])
    return rewards, values, next_values, terminated, truncated


def test_hand_built_row_returns_and_gae():
    r, v, nv, te, tr = hand_built_row()
    g = 0.5
    G = discounted_returns(r, te, tr, g, next_values=nv)
    # episode 1: G1 = 2, G0 = 1 + 0.5 * 2 = 2
    # episode 2: G3 = 4 + 0.5 * 100 = 54, G2 = 3 + 0.5 * 54 = 30
    # episode 3 (cut by the row end): G5 = 6 + 0.5 * 200 = 106, G4 = 5 + 0.5 * 106 = 58
    torch.testing.assert_close(
        G, torch.tensor([[2.0, 2.0, 30.0, 54.0, 58.0, 106.0]], dtype=F64), rtol=0, atol=0
    )
    adv, _ = gae_advantages(r, v, nv, te, tr, g, 1.0)
    torch.testing.assert_close(adv, G - v, rtol=0, atol=1e-12)
    # lam = 0.5: deltas = [1 + 10 - 10, 2 - 20, 3 + 20 - 30, 4 + 50 - 40, 5 + 30 - 50, 6 + 100 - 60]
    #                   = [1, -18, -7, 14, -15, 46]; A = delta_t + 0.25 A_{t+1} inside episodes
    adv, _ = gae_advantages(r, v, nv, te, tr, g, 0.5)
    expected = [1 + 0.25 * -18, -18, -7 + 0.25 * 14, 14, -15 + 0.25 * 46, 46]
    torch.testing.assert_close(adv, torch.tensor([expected], dtype=F64), rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        adv.numpy(), slow_gae(*(x.numpy() for x in (r, v, nv, te, tr)), g, 0.5), atol=1e-12
    )


def test_truncation_cannot_be_treated_as_termination():
    r, v, nv, te, tr = hand_built_row()
    # a step flagged as both is rejected
    with pytest.raises(ValueError, match="both terminated and truncated"):
        gae_advantages(r, v, nv, te | tr, tr, 0.5, 0.5)
    # a truncated step (or a row ending mid-episode) without next_values is an error, not a zero
    with pytest.raises(ValueError, match="next_values is required"):
        discounted_returns(r, te, tr, 0.5)
    # the value of the final observation enters at the truncation; junk at the termination does not
    for fn in (
        lambda nv_: discounted_returns(r, te, tr, 0.5, next_values=nv_),
        lambda nv_: gae_advantages(r, v, nv_, te, tr, 0.5, 0.5).advantages,
        lambda nv_: lambda_returns(r, nv_, te, tr, 0.5, 0.5),
        lambda nv_: n_step_returns(r, nv_, te, tr, 0.5, 3),
    ):
        base = fn(nv)
        junk = nv.clone()
        junk[0, 1] = -12345.0
        torch.testing.assert_close(fn(junk), base, rtol=0, atol=0)
        moved = nv.clone()
        moved[0, 3] += 1.0
        # gamma * 1 enters at the truncated step
        assert (fn(moved) - base)[0, 3] == pytest.approx(0.5, abs=0.0)
    # all episodes terminated: no next_values needed
    done = torch.tensor([[False, True, False, True, False, True]])
    G = discounted_returns(r, done, torch.zeros_like(done), 0.5)
    torch.testing.assert_close(G, torch.tensor([[2.0, 2.0, 5.0, 4.0, 8.0, 6.0]], dtype=F64), rtol=0, atol=0)


# ----------------------------------------------------------------------------------- bad input, dtypes


def test_bad_inputs_raise_clear_errors():
    r, v, nv, te, tr = hand_built_row()
    with pytest.raises(ValueError, match="rewards contains NaN"):
        discounted_returns(r * float("nan"), te, tr, 0.5, next_values=nv)
    with pytest.raises(ValueError, match="next_values must have shape"):
        gae_advantages(r, v, nv[:, :3], te, tr, 0.5, 0.5)
    with pytest.raises(ValueError, match=r"rewards must be \[N, T\]"):
        td_errors(r[0], v[0], nv[0], te[0], 0.5)
    with pytest.raises(ValueError, match="gamma must lie in"):
        lambda_returns(r, nv, te, tr, 1.5, 0.5)
    with pytest.raises(ValueError, match="lam must lie in"):
        gae_advantages(r, v, nv, te, tr, 0.5, -0.1)
    with pytest.raises(ValueError, match="n must be an integer"):
        n_step_returns(r, nv, te, tr, 0.5, 0)
    with pytest.raises(ValueError, match="terminated must be bool or 0/1"):
        td_errors(r, v, nv, te.double() * 2, 0.5)
    with pytest.raises(TypeError, match="rewards must be a floating"):
        discounted_returns(r.long(), te, tr, 0.5, next_values=nv)
    with pytest.raises(ValueError, match="same shape"):
        importance_weights(torch.zeros(3, dtype=F64), torch.zeros(4, dtype=F64))
    with pytest.raises(ValueError, match="behavior_logp contains NaN or inf"):
        importance_weights(torch.zeros(2, dtype=F64), torch.tensor([0.0, -float("inf")], dtype=F64))
    with pytest.raises(ValueError, match="sum to zero"):
        snis_estimate(torch.ones(2, dtype=F64), torch.zeros(2, dtype=F64))
    with pytest.raises(ValueError, match="non-negative"):
        is_estimate(torch.ones(2, dtype=F64), -torch.ones(2, dtype=F64))


def test_low_precision_inputs_are_computed_in_float32():
    r, v, nv, te, tr = hand_built_row()
    adv64, _ = gae_advantages(r, v, nv, te, tr, 0.5, 0.5)
    adv16, ret16 = gae_advantages(r.bfloat16(), v.bfloat16(), nv.bfloat16(), te, tr, 0.5, 0.5)
    assert adv16.dtype == torch.float32 and ret16.dtype == torch.float32
    torch.testing.assert_close(adv16.double(), adv64, rtol=1e-2, atol=0.5)  # bf16 inputs are rounded
    G32 = discounted_returns(r.float(), te, tr, 0.5, next_values=nv.float())
    assert G32.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    r, v, nv, te, tr = hand_built_row()
    cpu = gae_advantages(r, v, nv, te, tr, 0.5, 0.5).advantages
    gpu = gae_advantages(*(x.cuda() for x in (r, v, nv, te, tr)), 0.5, 0.5).advantages
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------- importance sampling


def test_seed_001_example_1_5_tiny_is_calculation():
    """A tiny IS example: p = (0.8, 0.2), q = (0.5, 0.5), f = (1, 3): w f = 1.6 and 1.2, mean 1.4."""
    f = torch.tensor([[1.0, 3.0]], dtype=F64)
    w = importance_weights(
        torch.tensor([[0.8, 0.2]], dtype=F64).log(), torch.tensor([[0.5, 0.5]], dtype=F64).log()
    )
    torch.testing.assert_close(w * f, torch.tensor([[1.6, 1.2]], dtype=F64), rtol=1e-15, atol=0)
    assert float(is_estimate(f, w)) == pytest.approx(1.4, rel=1e-15, abs=0.0)


@pytest.mark.parametrize("N", [1, 2, 3])
def test_snis_exact_expectation_matches_spec_rationals(N):
    """E[snis_estimate] over all K^N tuples equals the spec's exact rational (eq. (10b))."""
    from fractions import Fraction

    p = [Fraction(1, 2), Fraction(1, 3), Fraction(1, 6)]
    q = [Fraction(1, 4), Fraction(1, 4), Fraction(1, 2)]
    f = [Fraction(1), Fraction(-2), Fraction(5)]
    idx = np.array(np.meshgrid(*[np.arange(3)] * N, indexing="ij")).reshape(N, -1).T
    pf, qf, ff = (np.array([float(x) for x in a]) for a in (p, q, f))
    w = importance_weights(torch.tensor(np.log(pf[idx])), torch.tensor(np.log(qf[idx])))
    est = snis_estimate(torch.tensor(ff[idx]), w)
    got = float((torch.tensor(np.prod(qf[idx], axis=1)) * est).sum())
    exact = spec.snis_expectation(p, q, f, N)
    assert got == pytest.approx(float(exact), rel=1e-13, abs=0.0)
    if N == 1:
        assert exact == sp.Rational(sum(a * b for a, b in zip(q, f, strict=True)))


def test_trajectory_and_per_decision_is_by_hand():
    r = torch.tensor([[1.0, 2.0, 3.0]], dtype=F64)
    mask = torch.tensor([[True, True, False]])
    tgt = torch.tensor([[np.log(0.5), np.log(0.25), 0.0]], dtype=F64)
    beh = torch.tensor([[np.log(0.25), np.log(0.5), np.log(0.1)]], dtype=F64)
    # ratios 2, 0.5; masked third step ignored. w = 1; G = 1 + 0.9 * 2 = 2.8
    assert float(trajectory_importance_weights(tgt, beh, mask)) == pytest.approx(1.0, rel=1e-15, abs=0.0)
    assert float(trajectory_is(r, tgt, beh, mask, 0.9)) == pytest.approx(2.8, rel=1e-15, abs=0.0)
    # per-decision: 2 * 1 + 0.9 * (2 * 0.5) * 2 = 3.8
    assert float(per_decision_is(r, tgt, beh, mask, 0.9)) == pytest.approx(3.8, rel=1e-15, abs=0.0)

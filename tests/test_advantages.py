"""refimpl.advantages against the exact spec (specs/advantages.py) and a slow per-group loop, for
every convention on uneven non-contiguous groups; degenerate groups; DAPO's filters."""

import dataclasses
import itertools
import math

import numpy as np
import pytest
import sympy as sp
import torch
from hypothesis import given
from hypothesis import strategies as st

from refimpl.advantages import (
    dynamic_sampling_mask,
    group_advantages,
    overlong_filter_mask,
    overlong_penalty,
    oversampled_advantages,
)
from specs import to_float64
from specs.advantages import (
    atypical_selection_gradient_factor,
    binary_reward_gradient_factor,
    group_advantages_exact,
    group_advantages_float64,
)
from tests.strategies import grouped_rewards

F64 = torch.float64

CONVENTIONS = {
    "grpo_001": dict(scale="group", std="population", eps=1e-6, eps_inside_sqrt=True),
    "trl": dict(scale="group", std="sample", eps=1e-4, eps_inside_sqrt=False),
    "verl": dict(scale="group", std="sample", eps=1e-6, eps_inside_sqrt=False),
    "dr_grpo": dict(scale="none"),
    "rloo": dict(scale="none", leave_one_out=True),
    "rloo_group_std": dict(scale="group", std="population", eps=0.01, eps_inside_sqrt=False,
                           leave_one_out=True),
    "magistral_pop": dict(scale="batch", std="population", eps=1e-6, eps_inside_sqrt=False),
    "magistral_sample": dict(scale="batch", std="sample", eps=1e-3, eps_inside_sqrt=True),
    # advantages.md eq. (14): TRL scale_rewards="batch" (std of all raw rewards)
    "trl_batch": dict(scale="batch_rewards", std="sample", eps=1e-4, eps_inside_sqrt=False),
    "batch_rewards_pop": dict(scale="batch_rewards", std="population", eps=1e-3, eps_inside_sqrt=True),
    # eq. (15): verl's singletons (mean 0, std 1); a convention's own singleton rule wins
    "verl_raw": dict(scale="group", std="sample", eps=1e-6, eps_inside_sqrt=False, singleton="raw"),
    "raw_inside_sqrt": dict(scale="group", std="population", eps=0.25, eps_inside_sqrt=True, singleton="raw"),
    "dr_grpo_raw": dict(scale="none", singleton="raw"),
    "rloo_raw": dict(scale="none", leave_one_out=True, singleton="raw"),
}


def slow_loop_advantages(rewards, group_ids, *, scale, singleton, std=None, eps=None, eps_inside_sqrt=None,
                         zero_variance=None, leave_one_out=False):
    """Obviously-correct reference: one Python loop per sample over its group (float64 math)."""
    n = len(rewards)

    def stdev(values):
        m = sum(values) / len(values)
        var = sum((v - m) ** 2 for v in values) / (len(values) - (std == "sample"))
        return math.sqrt(var + eps) if eps_inside_sqrt else math.sqrt(var) + eps

    members = [[j for j in range(n) if group_ids[j] == group_ids[i]] for i in range(n)]
    if singleton == "error" and any(len(m) == 1 for m in members):
        raise ValueError("singleton")
    centred = []
    for i in range(n):
        others = [rewards[j] for j in members[i] if j != i]
        if not others:
            centred.append(rewards[i] if singleton == "raw" else 0.0)
        elif leave_one_out:
            centred.append(rewards[i] - sum(others) / len(others))
        else:
            centred.append(rewards[i] - (rewards[i] + sum(others)) / (len(others) + 1))
    if scale == "none":
        return centred
    out = []
    for i in range(n):
        if len(members[i]) == 1:
            unit = math.sqrt(1 + eps) if eps_inside_sqrt else 1 + eps  # verl: std 1
            out.append(rewards[i] / unit if singleton == "raw" else 0.0)
            continue
        if scale == "group":
            constant = len({rewards[j] for j in members[i]}) == 1
            s = stdev([rewards[j] for j in members[i]])
        elif scale == "batch_rewards":
            constant = len(set(rewards)) == 1
            s = stdev(list(rewards))
        else:
            constant = all(len({rewards[j] for j in m}) == 1 for m in members)
            s = stdev(centred)
        if constant and zero_variance == "error":
            raise ValueError("zero variance")
        out.append(0.0 if constant and zero_variance == "zero" else centred[i] / s)
    return out


def run(rewards, group_ids, **kwargs):
    return group_advantages(torch.tensor(rewards, dtype=F64), torch.tensor(group_ids), **kwargs)


def assert_close_to_exact(got, exact, rewards, scale_value=1.0):
    """docs/architecture.md tolerance: rel 1e-10 with an absolute floor of 1e-12 x the summed terms."""
    floor = 1e-12 * (np.abs(rewards).sum() + 1.0) / scale_value
    np.testing.assert_allclose(got, exact, rtol=1e-10, atol=floor)


@pytest.mark.parametrize("name", sorted(CONVENTIONS))
@given(grouped_rewards(), st.sampled_from(["zero", "formula"]))
def test_every_convention_matches_spec_and_loop(name, case, zero_variance):
    rewards, group_ids = case
    conv = dict(dict(singleton="zero"), **CONVENTIONS[name])
    if conv["scale"] != "none":
        conv["zero_variance"] = zero_variance
    got = run(rewards, group_ids, **conv).numpy()
    exact = np.array(group_advantages_float64(rewards, group_ids, **conv))  # correctly rounded
    loop = np.array(slow_loop_advantages(list(rewards), list(group_ids), **conv))
    smallest_scale = min(conv.get("eps", 1.0), 1.0)
    smallest_scale = math.sqrt(smallest_scale) if conv.get("eps_inside_sqrt") else smallest_scale
    assert_close_to_exact(got, exact, rewards, smallest_scale)
    assert_close_to_exact(got, loop, rewards, smallest_scale)


@given(grouped_rewards(), st.randoms(use_true_random=False))
def test_permutation_and_relabelling_equivariance(case, rnd):
    rewards, group_ids = case
    conv = dict(CONVENTIONS["trl"], singleton="zero", zero_variance="zero")
    base = run(rewards, group_ids, **conv)
    perm = list(range(len(rewards)))
    rnd.shuffle(perm)
    permuted = run(rewards[perm], group_ids[perm], **conv)
    np.testing.assert_allclose(permuted.numpy(), base.numpy()[perm], rtol=1e-12, atol=1e-12)
    relabelled = run(rewards, 1000 - 7 * group_ids, **conv)
    np.testing.assert_allclose(relabelled.numpy(), base.numpy(), rtol=0, atol=0)


def test_trl_and_verl_formulas_on_contiguous_groups():
    """The conventions reproduce the frameworks' own one-liners (equal contiguous groups)."""
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(4 * 5, generator=gen, dtype=F64)
    ids = torch.arange(4).repeat_interleave(5)
    grouped = rewards.view(4, 5)
    for eps, name in ((1e-4, "trl"), (1e-6, "verl")):
        frame = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + eps)).reshape(-1)
        ours = group_advantages(rewards, ids, singleton="error", zero_variance="formula", **CONVENTIONS[name])
        np.testing.assert_allclose(ours.numpy(), frame.numpy(), rtol=1e-12, atol=1e-14)
    # TRL scale_rewards="batch": group-centred, divided by the sample std of ALL raw rewards + 1e-4
    trl_batch = ((grouped - grouped.mean(1, keepdim=True)) / (rewards.std() + 1e-4)).reshape(-1)
    ours = group_advantages(rewards, ids, singleton="error", zero_variance="formula",
                            **CONVENTIONS["trl_batch"])
    np.testing.assert_allclose(ours.numpy(), trl_batch.numpy(), rtol=1e-12, atol=1e-14)
    rloo = (grouped - (grouped.sum(1, keepdim=True) - grouped) / 4).reshape(-1)
    np.testing.assert_allclose(group_advantages(rewards, ids, scale="none", singleton="error",
                                                leave_one_out=True).numpy(), rloo.numpy(), rtol=1e-12)


def test_magistral_divides_group_centred_values_by_the_minibatch_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0], dtype=F64)
    ids = torch.tensor([5, 5, 5, 9, 9, 2, 2])
    centred = torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.5, -0.5], dtype=F64)
    expected = centred / centred.std(unbiased=False)
    got = group_advantages(rewards, ids, scale="batch", std="population", eps=0.0, eps_inside_sqrt=False,
                           zero_variance="zero", singleton="error")
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-12)


def test_singleton_groups():
    rewards, ids = [1.0, 2.0, 4.0], [0, 0, 1]
    with pytest.raises(ValueError, match="single sample"):
        run(rewards, ids, scale="none", singleton="error")
    for conv in CONVENTIONS.values():
        kwargs = dict(conv, singleton="zero")
        if conv["scale"] != "none":
            kwargs["zero_variance"] = "zero"
        assert run(rewards, ids, **kwargs)[2].item() == 0.0
    # RLOO on a singleton has no leave-one-out mean: zero, not NaN
    out = run([3.0], [7], scale="none", leave_one_out=True, singleton="zero")
    assert out.tolist() == [0.0]
    # verl (eq. (15)): mean 0, std 1 -> R / (1 + eps) with the std, R without it; others unchanged
    verl = dict(scale="group", std="sample", eps=1e-6, eps_inside_sqrt=False, zero_variance="formula")
    raw = run(rewards, ids, singleton="raw", **verl)
    assert raw[2].item() == 4.0 / (1 + 1e-6)
    assert raw[:2].tolist() == run(rewards[:2], ids[:2], singleton="error", **verl).tolist()
    assert run(rewards, ids, scale="none", singleton="raw").tolist() == [-0.5, 0.5, 4.0]
    assert run([3.0], [7], scale="none", leave_one_out=True, singleton="raw").tolist() == [3.0]
    for scale in ("batch", "batch_rewards"):  # no framework mixes raw singletons with a batch std
        with pytest.raises(ValueError, match="singleton='raw'"):
            run(rewards, ids, scale=scale, std="sample", eps=1e-6, eps_inside_sqrt=False,
                zero_variance="zero", singleton="raw")


def test_zero_variance_groups():
    rewards, ids = [0.1, 0.1, 0.1, 1.0, 2.0], [3, 3, 3, 4, 4]
    conv = dict(CONVENTIONS["grpo_001"], singleton="error")
    assert run(rewards, ids, zero_variance="zero", **conv)[:3].tolist() == [0.0, 0.0, 0.0]
    formula = run(rewards, ids, zero_variance="formula", **conv)[:3]
    assert formula.abs().max().item() < 1e-12  # rounding of the mean only, divided by sqrt(eps)
    with pytest.raises(ValueError, match="zero-variance"):
        run(rewards, ids, zero_variance="error", **conv)
    with pytest.raises(ValueError, match="eps=0"):
        run(rewards, ids, scale="group", std="sample", eps=0.0, eps_inside_sqrt=False,
            zero_variance="formula", singleton="error")
    # eps = 0 with "zero": exact 0 and no NaN anywhere
    out = run(rewards, ids, scale="group", std="sample", eps=0.0, eps_inside_sqrt=False,
              zero_variance="zero", singleton="error")
    assert torch.isfinite(out).all() and out[3].item() == pytest.approx(
        -0.5 / math.sqrt(0.5), rel=1e-14, abs=0.0
    )
    # batch scale: zero variance means every group is constant
    batch = dict(scale="batch", std="population", eps=0.0, eps_inside_sqrt=False, singleton="zero")
    assert run([1.0, 1.0, 2.0, 2.0], [0, 0, 1, 1], zero_variance="zero", **batch).tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="zero-variance"):
        run([1.0, 1.0, 2.0, 2.0], [0, 0, 1, 1], zero_variance="error", **batch)
    # batch_rewards (eq. (14)): zero variance means every reward of the batch is equal, so constant
    # groups with different values are scaled by s_R > 0 (their centred values are exactly 0)
    rewards_scale = dict(batch, scale="batch_rewards")
    constant_groups = run([1.0, 1.0, 2.0, 2.0], [0, 0, 1, 1], zero_variance="error", **rewards_scale)
    assert constant_groups.tolist() == [0.0] * 4
    assert run([0.3] * 3 + [5.0], [0, 0, 0, 1], zero_variance="zero", **rewards_scale).tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="zero-variance"):
        run([0.3] * 4, [0, 0, 1, 1], zero_variance="error", **rewards_scale)
    with pytest.raises(ValueError, match="eps=0"):
        run([0.3] * 4, [0, 0, 1, 1], zero_variance="formula", **rewards_scale)


def test_erratum_000_std_without_square_is_zero():
    """errata.md entry 10: std r = sqrt(1/G sum (r_i - mean r)): the sum of deviations is 0 for any group."""
    r = [sp.Rational(k, 7) for k in (3, -2, 11, 5)]
    mean = sum(r) / 4
    assert sp.sqrt(sum(v - mean for v in r) / 4) == 0
    exact = group_advantages_exact(r, [0] * 4, scale="group", std="population", eps=0, eps_inside_sqrt=True,
                                   zero_variance="error", singleton="error")
    assert all(v.is_finite and v != 0 for v in exact)


def test_arguments_are_explicit():
    r, ids = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    with pytest.raises(TypeError, match="std"):
        group_advantages(r, ids, scale="group", singleton="zero", eps=1e-6, eps_inside_sqrt=True,
                         zero_variance="zero")
    with pytest.raises(TypeError):
        group_advantages(r, ids, scale="none")  # singleton is required
    with pytest.raises(ValueError, match="do not pass"):
        group_advantages(r, ids, scale="none", singleton="zero", std="sample")
    with pytest.raises(ValueError, match="scale"):
        group_advantages(r, ids, scale="grop", singleton="zero")
    with pytest.raises(ValueError, match="eps"):
        group_advantages(r, ids, scale="group", singleton="zero", std="sample", eps=-1.0,
                         eps_inside_sqrt=True, zero_variance="zero")
    with pytest.raises(ValueError, match="NaN"):
        group_advantages(torch.tensor([1.0, math.nan]), ids, scale="none", singleton="zero")
    with pytest.raises(ValueError, match="shape"):
        group_advantages(r, torch.tensor([0, 0, 1]), scale="none", singleton="zero")
    with pytest.raises(TypeError, match="group_ids"):
        group_advantages(r, torch.tensor([0.0, 0.0]), scale="none", singleton="zero")
    assert group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long), scale="none",
                            singleton="error").shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rewards(dtype):
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randn(64, generator=gen).to(dtype)
    ids = torch.randint(0, 9, (64,), generator=gen)
    conv = dict(CONVENTIONS["trl"], singleton="zero", zero_variance="zero")
    out = group_advantages(rewards, ids, **conv)
    assert out.dtype == torch.float32
    ref = group_advantages(rewards.double(), ids, **conv)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_dynamic_sampling_mask():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5], dtype=F64)
    ids = torch.tensor([4, 4, 8, 8, 6, 6, 3])
    assert dynamic_sampling_mask(rewards, ids).tolist() == [False, False, True, True, False, False, False]


def test_overlong_penalty_piecewise_linear():
    lengths = torch.tensor([0, 6, 7, 8, 9, 10, 11, 100])
    got = overlong_penalty(lengths, max_len=10, cache_len=4)
    expected = [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]
    assert got.tolist() == expected
    assert overlong_penalty(torch.tensor([4, 5]), max_len=5, cache_len=1).tolist() == [0.0, -1.0]
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(lengths, max_len=10, cache_len=11)
    with pytest.raises(ValueError, match="lengths"):
        overlong_penalty(torch.tensor([-1]), max_len=10, cache_len=2)


def test_overlong_filter_mask():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)
    truncated = torch.tensor([False, True, False])
    assert overlong_filter_mask(mask, truncated).tolist() == [[1, 1, 0], [0, 0, 0], [1, 0, 0]]
    assert overlong_filter_mask(mask.bool(), truncated).tolist() == [[True, True, False], [False] * 3,
                                                                     [True, False, False]]
    with pytest.raises(ValueError, match="truncated"):
        overlong_filter_mask(mask, torch.tensor([True]))


def test_binary_gradient_factors_match_the_closed_forms_of_the_spec():
    """advantages.md eq. (13) examples, written by hand, against the binomial sums."""
    p = sp.symbols("p")
    pop = dict(scale="group", std="population", eps=0, eps_inside_sqrt=True)
    sample = dict(scale="group", std="sample", eps=0, eps_inside_sqrt=True)
    closed = {2: sp.Integer(1), 3: sp.sqrt(2), 4: sp.sqrt(3) - (2 * sp.sqrt(3) - 3) * p * (1 - p),
              5: 2 + (6 - 2 * sp.sqrt(6)) * (p**2 - p)}
    for g, form in closed.items():
        assert sp.simplify(binary_reward_gradient_factor(g, p, **pop) - form) == 0
        shrink = sp.sqrt(sp.Rational(g - 1, g))
        assert sp.simplify(binary_reward_gradient_factor(g, p, **sample) - form * shrink) == 0
        assert sp.simplify(binary_reward_gradient_factor(g, p, scale="none") - (1 - sp.Rational(1, g))) == 0
        assert binary_reward_gradient_factor(g, p, scale="none", leave_one_out=True) == 1


@pytest.mark.parametrize("group_size", [2, 3, 4])
def test_binary_factor_against_brute_force_reward_vectors(group_size):
    """c_G(p) = sum over all 2^G reward vectors of P(vector) A_1 (1[R_1 = 1]/p - 1[R_1 = 0]/(1-p)),
    with A from refimpl.group_advantages (an enumeration independent of the binomial sums)."""
    p = 0.3
    total = 0.0
    for bits in itertools.product([0.0, 1.0], repeat=group_size):
        prob = math.prod(p if b else 1 - p for b in bits)
        adv = group_advantages(torch.tensor(bits, dtype=F64), torch.zeros(group_size, dtype=torch.long),
                               scale="group", std="population", eps=1e-3, eps_inside_sqrt=True,
                               zero_variance="formula", singleton="error")[0].item()
        total += prob * adv * (1 / p if bits[0] else -1 / (1 - p))
    exact = binary_reward_gradient_factor(group_size, sp.Rational(3, 10), scale="group", std="population",
                                          eps=sp.Rational(1, 1000), eps_inside_sqrt=True)
    assert total == pytest.approx(to_float64(exact), rel=1e-12, abs=0.0)


# ------------------------------------------------ the conformance kit's TRL / verl advantage profiles
def trl_batch_transcription(rewards, group_ids):
    """TRL GRPOTrainer, scale_rewards="batch": rewards - group mean, / (rewards.std() + 1e-4)."""
    centred = torch.empty_like(rewards)
    for g in torch.unique(group_ids):
        idx = group_ids == g
        if int(idx.sum()) < 2:
            raise ValueError("num_generations must be >= 2")
        centred[idx] = rewards[idx] - rewards[idx].mean()
    return centred / (rewards.std() + 1e-4)


def verl_transcription(norm_adv_by_std_in_grpo):
    """verl compute_grpo_outcome_advantage: a singleton gets mean 0 and std 1; eps 1e-6."""
    def advantages(rewards, group_ids):
        out = torch.empty_like(rewards)
        for i in range(len(rewards)):
            r = rewards[group_ids == group_ids[i]]
            # verl holds a singleton's mean 0 / std 1 in float32 tensors: std + eps is float32(1 + 1e-6)
            mean, std = (r.mean(), r.std()) if len(r) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
            out[i] = (rewards[i] - mean) / (std + 1e-6) if norm_adv_by_std_in_grpo else rewards[i] - mean
        return out
    return advantages


def test_conformance_profiles_reproduce_trl_batch_scale_and_verl_singletons():
    from refimpl.conformance import check_group_advantages, framework_config, profile, unsupported_flags

    trl_batch = profile("trl", "grpo", scale_rewards="batch")
    assert trl_batch.adv_scale == "batch_rewards"
    assert framework_config("trl", "grpo", scale_rewards="batch")["scale_rewards"] == "batch"
    assert framework_config("trl", "grpo")["scale_rewards"] == "group"
    assert check_group_advantages(trl_batch_transcription, convention=trl_batch).ok
    assert not check_group_advantages(trl_batch_transcription, convention="trl").ok
    verl_std, verl_dr = verl_transcription(True), verl_transcription(False)
    assert check_group_advantages(verl_std, convention="verl").ok
    assert check_group_advantages(verl_dr, convention=profile("verl", "dr_grpo")).ok
    zero_singletons = dataclasses.replace(profile("verl"), adv_singleton="zero")
    report = check_group_advantages(verl_std, convention=zero_singletons)
    assert report.failing_classes() == ["singleton_group"]
    assert not any("batch" in k for k in unsupported_flags("trl"))
    assert not any("singleton" in k for k in unsupported_flags("verl"))
    with pytest.raises(ValueError, match="scale_rewards"):
        profile("verl", "grpo", scale_rewards="batch")
    with pytest.raises(ValueError, match="scale_rewards"):
        profile("trl", "grpo", scale_rewards="global")


# ---------------------------------------------------------------------------------------------
# extreme magnitudes (issue 11: float32 rewards of +-1e20 gave all zeros, their squares overflowing)


def test_float32_rewards_of_1e20_give_plus_minus_one():
    """Issue 11's case: two groups of +-1e20 in float32; the exact answer is +-1 (population std
    1e20, eps = 0; with TRL's eps = 1e-4 outside the sqrt, 1e20 / (1e20 + 1e-4) rounds to 1)."""
    r = torch.tensor([1e20, -1e20, 1e20, -1e20], dtype=torch.float32)
    ids = torch.tensor([0, 0, 1, 1])
    for eps in (0.0, 1e-4):
        out = group_advantages(r, ids, scale="group", std="population", eps=eps, eps_inside_sqrt=False,
                               zero_variance="zero", singleton="error")
        assert out.tolist() == [1.0, -1.0, 1.0, -1.0]


MAGNITUDES = {
    torch.float32: [1e20, 1e30, 2.0**120, 1e-25, 2.0**-140, 1e-44],  # the last two subnormal
    torch.float64: [1e20, 1e200, 2.0**1000, 1e-200, 1e-310, 2.0**-1070],
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(CONVENTIONS))
def test_every_convention_at_extreme_magnitudes_equals_the_exact_spec(dtype, name):
    """Rewards k * M for small integers k and M from 1e-44 (float32 subnormal) to 2^1000, on an
    uneven grouping with a singleton and a constant group, against the exact spec at the
    dtype-rounded inputs. Tolerance: A = c / s with c = R - mean and s from sums of squares over a
    group of n <= 4: each a few roundings of terms bounded by max|R|, so |error| <= 16 u n
    max|R| / s (the conditioning of the centring), plus the smallest normal number absolutely
    (a result in the subnormal range keeps only that absolute accuracy). ``scale='none'``
    returns R - mean itself: there the bound is 16 u n max|R|, and a value past the dtype's range
    must raise."""
    conv = dict(dict(singleton="zero", zero_variance="zero"), **CONVENTIONS[name])
    if conv["scale"] == "none":
        conv.pop("zero_variance")
    u, tiny, big = torch.finfo(dtype).eps / 2, torch.finfo(dtype).tiny, torch.finfo(dtype).max
    ks = [3.0, -1.0, 0.0, 1.0, 2.0, 2.0, 5.0, -7.0]
    ids = [0, 0, 0, 1, 2, 2, 3, 3]  # sizes 3, 1 (singleton), 2 (constant), 2
    for magnitude in MAGNITUDES[dtype]:
        rewards = torch.tensor([k * magnitude for k in ks], dtype=torch.float64).to(dtype)
        exact = [float(v) for v in group_advantages_exact([float(x) for x in rewards], ids, **conv)]
        if any(abs(v) > big for v in exact):
            with pytest.raises(ValueError, match="rewards: the centred advantages overflow"):
                group_advantages(rewards, torch.tensor(ids), **conv)
            continue
        got = group_advantages(rewards, torch.tensor(ids), **conv)
        assert bool(torch.isfinite(got).all()), (magnitude, got)
        largest = float(rewards.abs().max())
        if conv["scale"] == "none":
            scale_ratio = largest
        else:
            # s >= sqrt(eps) or eps, and s >= the std of the values it is taken over; with
            # the group std the ratio max|R_group| / s_group <= n (a two-point group: 2)
            scale_ratio = 8.0 if conv["scale"] == "group" else _largest_over_batch_std(rewards, ids, conv)
        for g, e, k in zip(got.tolist(), exact, ks, strict=True):
            # (+ 4 u |e|: a raw singleton R / (1 + eps) is one rounded division of R)
            assert abs(g - e) <= 16 * u * 8 * scale_ratio + 4 * u * abs(e) + 2 * tiny, (magnitude, k, g, e)


def _largest_over_batch_std(rewards: torch.Tensor, ids: list[int], conv: dict) -> float:
    """max|R| / s for the batch std s of the exact spec (float64 math in units of max|R|, so
    nothing overflows; 1 % margin for its rounding)."""
    largest = float(rewards.abs().max())
    values = [float(x) / largest for x in rewards.double()]
    if conv["scale"] == "batch":
        groups = {g: [v for v, h in zip(values, ids, strict=True) if h == g] for g in set(ids)}
        values = [v - sum(groups[g]) / len(groups[g]) if len(groups[g]) > 1 else 0.0
                  for v, g in zip(values, ids, strict=True)]
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / len(values))
    eps_part = (math.sqrt(conv["eps"]) if conv["eps_inside_sqrt"] else conv["eps"]) / largest
    return 1.01 / max(s, eps_part)


def test_advantages_that_overflow_the_dtype_raise():
    """scale='none' returns R - mean: for float32 rewards 3e38, -3e38, -3e38 the centred value
    4e38 exceeds float32's range (float64 holds it): ValueError naming rewards, never inf."""
    ids = torch.tensor([0, 0, 0])
    r = torch.tensor([3e38, -3e38, -3e38])
    with pytest.raises(ValueError, match="rewards: the centred advantages overflow torch.float32"):
        group_advantages(r, ids, scale="none", singleton="error")
    out = group_advantages(r.double(), ids, scale="none", singleton="error")
    exact = [float(v) for v in group_advantages_exact([float(x) for x in r], [0, 0, 0], scale="none",
                                                      singleton="error")]
    np.testing.assert_allclose(out.numpy(), exact, rtol=4e-16)
    # the group-scaled advantages of the same float32 rewards are finite (c / s is about 1)
    scaled = group_advantages(r, ids, scale="group", std="population", eps=1e-6, eps_inside_sqrt=True,
                              zero_variance="zero", singleton="error")
    # a handful of float32 roundings (mean, deviations, squares, sqrt, division): 16 u
    np.testing.assert_allclose(scaled.numpy(), [math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2)],
                               rtol=16 * 2.0**-24)


def _grpo(**overrides):
    return dict(dict(scale="group", std="population", eps=1e-6, eps_inside_sqrt=True, zero_variance="zero",
                     singleton="error"), **overrides)


def test_error_messages_name_the_argument_exactly():
    """Every check rejects its own bad input (each condition alone, so `or` -> `and` fails) with
    one line naming the argument, matched in full (a changed message fails)."""
    r, ids, mask = torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.ones(2, 3, dtype=torch.bool)
    cases = [
        (lambda: group_advantages(torch.tensor([1, 0]), ids, **_grpo()), TypeError,
         r"^rewards must be a floating-point torch.Tensor, got Tensor of dtype torch.int64$"),
        (lambda: group_advantages([1.0, 0.0], ids, **_grpo()), TypeError,
         r"^rewards must be a floating-point torch.Tensor, got list$"),
        (lambda: group_advantages(r, torch.tensor([True, True]), **_grpo()), TypeError,
         r"^group_ids must be an integer torch.Tensor, got dtype torch.bool$"),
        (lambda: group_advantages(r, torch.tensor([0j, 0j]), **_grpo()), TypeError,
         r"^group_ids must be an integer torch.Tensor, got dtype torch.complex64$"),
        (lambda: group_advantages(r, [0, 0], **_grpo()), TypeError,
         r"^group_ids must be an integer torch.Tensor, got list$"),
        (lambda: group_advantages(r.reshape(1, 2), ids.reshape(1, 2), **_grpo()), ValueError,
         r"^rewards must have shape \[N\], got \(1, 2\)$"),
        (lambda: group_advantages(torch.tensor([1.0, math.inf]), ids, **_grpo()), ValueError,
         r"^rewards contains NaN or inf$"),
        (lambda: group_advantages(r, torch.tensor([0, 1]), **_grpo()), ValueError,
         r"^a group has a single sample \(singleton='error'\); pass singleton='zero' to give such "
         r"samples advantage 0$"),
        (lambda: group_advantages(torch.tensor([1.0, 1.0]), ids, **_grpo(zero_variance="error")), ValueError,
         r"^zero-variance rewards \(zero_variance='error'\); pass 'zero' or 'formula'$"),
        (lambda: group_advantages(torch.tensor([1.0, 1.0]), ids, **_grpo(zero_variance="formula", eps=0.0)),
         ValueError, r"^zero_variance='formula' with eps=0 divides by zero on a zero-variance group$"),
        (lambda: group_advantages(r, ids, **_grpo(std="biased")), ValueError,
         r"^std must be one of \('population', 'sample'\), got 'biased'$"),
        (lambda: group_advantages(r, ids, **_grpo(eps_inside_sqrt=1)), TypeError,
         r"^eps_inside_sqrt must be a bool, got 1$"),
        (lambda: group_advantages(r, ids, **_grpo(eps=True)), ValueError,
         r"^eps must be a finite number >= 0, got True$"),
        (lambda: group_advantages(r, ids, **_grpo(eps=math.inf)), ValueError,
         r"^eps must be a finite number >= 0, got inf$"),
        (lambda: group_advantages(r, ids, **_grpo(eps="0")), ValueError,
         r"^eps must be a finite number >= 0, got '0'$"),
        (lambda: group_advantages(r, ids, **_grpo(zero_variance="skip")), ValueError,
         r"^zero_variance must be one of \('zero', 'formula', 'error'\), got 'skip'$"),
        (lambda: group_advantages(r, ids, **_grpo(singleton="drop")), ValueError,
         r"^singleton must be one of \('error', 'zero', 'raw'\), got 'drop'$"),
        (lambda: group_advantages(r, ids, **_grpo(scale="batch", singleton="raw")), ValueError,
         r"^singleton='raw' \(verl: mean 0, std 1\) is defined for scale in \('group', 'none'\), "
         r"got scale='batch'$"),
        (lambda: group_advantages(r, ids, **_grpo(leave_one_out=1)), TypeError,
         r"^leave_one_out must be a bool, got 1$"),
        (lambda: group_advantages(r, ids, scale="group", singleton="zero"), TypeError,
         r"^scale='group' needs the explicit keyword argument\(s\) std, eps, eps_inside_sqrt, zero_variance "
         r"\(frameworks differ on each; none is chosen silently\)$"),
        (lambda: dynamic_sampling_mask(torch.tensor([1, 0]), ids), TypeError, r"^rewards must be a floating"),
        (lambda: overlong_penalty(torch.tensor([1.0]), max_len=4, cache_len=2), TypeError,
         r"^lengths must be an integer torch.Tensor$"),
        (lambda: overlong_penalty(torch.tensor([True]), max_len=4, cache_len=2), TypeError,
         r"^lengths must be an integer torch.Tensor$"),
        (lambda: overlong_penalty([1], max_len=4, cache_len=2), TypeError,
         r"^lengths must be an integer torch.Tensor$"),
        (lambda: overlong_penalty(torch.tensor([[1]]), max_len=4, cache_len=2), ValueError,
         r"^lengths must have shape \[N\], got \(1, 1\)$"),
        (lambda: overlong_penalty(torch.tensor([1]), max_len=4.0, cache_len=2), TypeError,
         r"^max_len must be an int, got 4.0$"),
        (lambda: overlong_penalty(torch.tensor([1]), max_len=4, cache_len=True), TypeError,
         r"^cache_len must be an int, got True$"),
        (lambda: overlong_penalty(torch.tensor([1]), max_len=0, cache_len=1), ValueError,
         r"^max_len must be >= 1, got 0$"),
        (lambda: overlong_penalty(torch.tensor([1]), max_len=4, cache_len=0), ValueError,
         r"^cache_len must be in \[1, max_len=4\], got 0$"),
        (lambda: overlong_penalty(torch.tensor([-1, 2]), max_len=4, cache_len=2), ValueError,
         r"^lengths must be >= 0$"),
        (lambda: overlong_filter_mask(torch.ones(3, dtype=torch.bool), torch.tensor([False] * 3)), ValueError,
         r"^mask must be a \[N, T\] torch.Tensor$"),
        (lambda: overlong_filter_mask([[True]], torch.tensor([False])), ValueError,
         r"^mask must be a \[N, T\] torch.Tensor$"),
        (lambda: overlong_filter_mask(mask, torch.tensor([0, 1])), TypeError,
         r"^truncated must be a bool torch.Tensor$"),
        (lambda: overlong_filter_mask(mask, [False, True]), TypeError,
         r"^truncated must be a bool torch.Tensor$"),
        (lambda: overlong_filter_mask(mask, torch.tensor([False])), ValueError,
         r"^truncated must have shape \[N\] = \[2\], got \(1,\)$"),
    ]
    for call, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            call()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.uint8, torch.bool])
def test_overlong_filter_mask_keeps_the_mask_dtype(dtype):
    """eq. (9) for numeric 0/1 masks as well as bool: rows of truncated samples become 0, the
    others are unchanged, and the dtype is the mask's."""
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]]).to(dtype)
    out = overlong_filter_mask(mask, torch.tensor([False, True, False]))
    assert out.dtype == dtype
    assert out.tolist() == torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]]).to(dtype).tolist()


def test_overlong_penalty_at_the_edges_of_the_soft_zone():
    """eq. (8) at L = max - cache (0), one past it (-1/cache), L = max (-1) and past max (-1)."""
    got = overlong_penalty(torch.tensor([5, 6, 8, 9, 30]), max_len=8, cache_len=3)
    one_third = float(torch.tensor(-1.0 / 3, dtype=torch.float32))  # -1/3 rounded once to float32
    assert got.tolist() == [0.0, one_third, -1.0, -1.0, -1.0]
    assert got.dtype == torch.float32


def test_overlong_penalty_with_a_one_token_limit():
    """max_len = cache_len = 1 is the smallest legal setting: L = 0 is free, L >= 1 costs 1."""
    assert overlong_penalty(torch.tensor([0, 1, 2]), max_len=1, cache_len=1).tolist() == [0.0, -1.0, -1.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_group_units_are_exact_powers_of_two(dtype):
    """The working unit of a group is a power of two u with max|R| / u in [1, 2) (so dividing by
    it is exact), for magnitudes from the smallest subnormal to the largest float; 1 for 0."""
    from refimpl.advantages import _power_of_two_unit

    info = torch.finfo(dtype)
    magnitudes = torch.tensor([info.smallest_normal * 2.0**-20, info.tiny, 1e-30, 0.3, 1.0, 1.5, 3.0, 1e20,
                               info.max, 0.0], dtype=dtype)
    unit = _power_of_two_unit(magnitudes)
    mantissa, _ = torch.frexp(unit)
    assert bool((mantissa == 0.5).all())
    ratio = (magnitudes / unit)[:-1]
    assert bool(((ratio >= 1) & (ratio < 2)).all()) and float(unit[-1]) == 1.0


@pytest.mark.parametrize("eps_inside_sqrt", [False, True])
def test_subnormal_rewards_with_a_large_eps_keep_their_exact_advantage(eps_inside_sqrt):
    """float32 rewards +-2^-140 (subnormal) with eps = 4 (outside) or 16 (inside): s = 2^-140 + 4
    or sqrt(2^-280 + 16), both 4 to float32 precision, so A = +-2^-142 (exactly representable).
    Here eps / u overflows float32 in the working units, and the eps-dominated limit applies."""
    r = torch.tensor([2.0**-140, -(2.0**-140)], dtype=torch.float32)
    eps = 16.0 if eps_inside_sqrt else 4.0
    out = group_advantages(r, torch.tensor([0, 0]), scale="group", std="population", eps=eps,
                           eps_inside_sqrt=eps_inside_sqrt, zero_variance="zero", singleton="error")
    assert out.tolist() == [2.0**-142, -(2.0**-142)]


def test_empty_batches_give_empty_results():
    """N = 0: an empty [0] result of the documented dtype (no groups to compute)."""
    empty, ids = torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.long)
    keep = dynamic_sampling_mask(empty, ids)
    assert keep.shape == (0,) and keep.dtype == torch.bool
    out = group_advantages(empty.float(), ids, scale="group", std="sample", eps=1e-4, eps_inside_sqrt=False,
                           zero_variance="zero", singleton="error")
    assert out.shape == (0,) and out.dtype == torch.float32


def _atypical_selection_gradient(probabilities, rewards, oversampled, selected) -> np.ndarray:
    """``E[(1/G) sum_{i selected} A_i grad log pi(y_i)]`` for a categorical policy over responses
    (logit parameters: ``grad log pi(y) = e_y - pi``), enumerating every ordered draw of G' i.i.d.
    responses: advantages from ``oversampled_advantages`` (mean-centred over the G'), the G of
    largest |A| (ties to the lower index) selected."""
    pi = np.asarray(probabilities, dtype=float)
    eye = np.eye(len(pi))
    total = np.zeros(len(pi))
    ids, everyone = torch.zeros(oversampled, dtype=torch.long), torch.ones(oversampled, dtype=torch.bool)
    for draw in itertools.product(range(len(pi)), repeat=oversampled):
        adv = oversampled_advantages(torch.tensor([rewards[y] for y in draw], dtype=F64), ids, everyone,
                                     scale="none", singleton="error").tolist()
        chosen = sorted(range(oversampled), key=lambda i: (-abs(adv[i]), i))[:selected]
        weight = np.prod(pi[list(draw)])
        for i in chosen:
            total += weight * adv[i] * (eye[draw[i]] - pi) / selected
    return total


@pytest.mark.parametrize("oversampled,selected", [(3, 1), (4, 2), (4, 1)])
def test_selecting_the_most_atypical_rewards_is_along_grad_j_exactly_when_rewards_are_binary(oversampled,
                                                                                               selected):
    """advantages.md eq. (19): with 0/1 rewards the selection by largest |R - mean| sees a response
    only through its reward, so the expected gradient is factor(p) grad J (factor from
    specs.advantages by summing the 2^G' reward patterns; e.g. 2 (2 p^2 - 2 p + 1) for G' = 3,
    G = 1); with three reward values it leaves grad J's direction. Float64 sums of <= 81 terms of
    size <= 1: 1e-13."""
    pi = np.array([0.5, 0.3, 0.2])
    eye = np.eye(3)
    for rewards in ([1.0, 0.0, 1.0], [0.0, 1.0, 0.0]):
        grad_j = sum(pi[y] * rewards[y] * (eye[y] - pi) for y in range(3))
        p = float(pi @ np.array(rewards))
        factor = float(atypical_selection_gradient_factor(oversampled, selected, sp.Float(p, 30)))
        got = _atypical_selection_gradient(pi, rewards, oversampled, selected)
        np.testing.assert_allclose(got, factor * grad_j, rtol=1e-13, atol=1e-13)
        assert factor > 0
    # Three reward values: grad P(R = v) are independent directions and the rule weights them
    # unlike v, so the expectation is not along grad J.
    rewards = [1.0, 0.0, 0.4]
    grad_j = sum(pi[y] * rewards[y] * (eye[y] - pi) for y in range(3))
    got = _atypical_selection_gradient(pi, rewards, oversampled, selected)
    cosine = got @ grad_j / (np.linalg.norm(got) * np.linalg.norm(grad_j))
    assert cosine < 1 - 1e-4, cosine


def test_atypical_selection_factor_closed_forms():
    """eq. (19)'s factor as polynomials in p (sympy). At G' = 2, G = 1 the two samples always tie
    (index 0 is taken) and it is eq. (18)'s 1 - 1/G'; at G' = 3, G = 1, p = 1/2 it is 1, not the
    2/3 of a selection independent of the rewards."""
    p = sp.Symbol("p")
    assert sp.expand(atypical_selection_gradient_factor(3, 1, p) - 2 * (2 * p**2 - 2 * p + 1)) == 0
    assert sp.expand(atypical_selection_gradient_factor(4, 2, p) - (5 * p**2 - 5 * p + 3) / 2) == 0
    assert atypical_selection_gradient_factor(2, 1, p) == sp.Rational(1, 2)  # = 1 - 1/G': a tie, index 0
    half = atypical_selection_gradient_factor(3, 1, sp.Rational(1, 2))
    assert half == 1 and half != 1 - sp.Rational(1, 3)

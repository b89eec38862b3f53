"""policy_loss against its sympy spec (50 digits) and the slow loop reference, for every preset:
random masks, ragged lengths (empty rows included), uneven groups, both advantage signs, ratios
inside, outside and exactly on the clip boundaries and the dual-clip constant
(spec: specs/policy_losses.md; errata.md entry 13)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refimpl.losses import (
    BNPO,
    CISPO,
    DAPO,
    DR_GRPO,
    GRPO,
    GSPO,
    GSPO_TOKEN,
    PPO,
    PRESETS,
    SAPO,
    PolicyLossVariant,
    get_preset,
    policy_loss,
)
from tests.strategies import policy_loss_batches
from tests.test_policy_loss_reference import assert_close, exact_ratio_log, loop_reference, spec_loss_and_grad

# Presets with clip bounds moved to binary fractions whose ratios round-trip exactly through
# exp(log(.)) in float64, so a token can sit *exactly* on a boundary both in the spec (exact
# log(b)) and in float64 (fl(log b), whose exp is b). Defaults are kept where already exact.
BOUNDARY_SAFE = {
    "ppo": dataclasses.replace(PPO, eps_low=0.25, eps_high=0.25),
    "ppo_dual": dataclasses.replace(PPO, eps_low=0.25, eps_high=0.25, dual_clip=2.5),
    "grpo": dataclasses.replace(GRPO, eps_low=0.25, eps_high=0.25, kl_coef=0.0625),
    "dr_grpo": dataclasses.replace(DR_GRPO, eps_low=0.25, eps_high=0.25, max_length=5),
    "dapo": dataclasses.replace(DAPO, eps_low=0.1875, eps_high=0.28125),
    "bnpo": dataclasses.replace(BNPO, eps_low=0.25, eps_high=0.25, kl_coef=0.125, kl_estimator="k2"),
    "gspo": dataclasses.replace(GSPO, eps_low=2.0**-12, eps_high=2.0**-11),
    "gspo_token": dataclasses.replace(GSPO_TOKEN, eps_low=2.0**-12, eps_high=2.0**-11),
    "sapo": dataclasses.replace(SAPO, tau_pos=1.0, tau_neg=1.0625),
    "cispo": dataclasses.replace(CISPO, eps_high=0.28125),
    "cispo_two_sided": dataclasses.replace(CISPO, eps_low=0.25, eps_high=0.28125),
    "dapo_truncated_is": dataclasses.replace(DAPO, eps_low=0.1875, eps_high=0.28125,
                                             behavior_correction="truncate", behavior_cap=1.25),
    "gspo_masked_is": dataclasses.replace(GSPO, eps_low=2.0**-12, eps_high=2.0**-11,
                                          behavior_correction="mask", behavior_cap=1.125),
    "ppo_entropy_k1": dataclasses.replace(PPO, eps_low=0.25, eps_high=0.25, entropy_coef=0.015625,
                                          kl_coef=0.25, kl_estimator="k1", aggregation="seq_mean"),
    "gspo_token_mean": dataclasses.replace(GSPO, eps_low=2.0**-12, eps_high=2.0**-11,
                                           aggregation="token_mean"),
    "seq_product_seq_sum": PolicyLossVariant(ratio="sequence_product", gate="none", aggregation="seq_sum",
                                             max_length=6),
    "seq_product": PolicyLossVariant(ratio="sequence_product", gate="clip", eps_low=0.25, eps_high=0.25,
                                     aggregation="seq_mean"),
    # GMPO (md eq. (18)): token log-ratios clipped in log space, geometric mean per sequence
    "gmpo": dataclasses.replace(GSPO, gate="log_clip", eps_low=0.25, eps_high=0.375),
    "gmpo_seq_mean_token_mean": dataclasses.replace(GSPO, gate="log_clip", eps_low=0.125, eps_high=None,
                                                    aggregation="seq_mean_token_mean"),
    "log_clip_token": dataclasses.replace(PPO, gate="log_clip", eps_low=0.25, eps_high=0.125),
    # the KL as beta times the sequence KL (md eq. (19); Shao et al. 2024, eq. (3))
    "grpo_sequence_kl": dataclasses.replace(GRPO, eps_low=0.25, eps_high=0.25, kl_coef=0.0625,
                                            kl_scale="sequence"),
    "dr_grpo_sequence_kl": dataclasses.replace(DR_GRPO, eps_low=0.25, eps_high=0.25, max_length=5,
                                               kl_coef=0.25, kl_estimator="k1", kl_scale="sequence"),
    "dapo_sequence_kl": dataclasses.replace(DAPO, eps_low=0.1875, eps_high=0.28125, kl_coef=0.125,
                                            kl_estimator="k2", kl_scale="sequence"),
    "gspo_sequence_kl": dataclasses.replace(GSPO, eps_low=2.0**-12, eps_high=2.0**-11, kl_coef=0.125,
                                            kl_scale="sequence", aggregation="token_mean"),
    # each sequence's token sum averaged over the sequences (md eqs. (10)-(11)): Dr. GRPO's ratio,
    # and GSPO's sequence ratio counted once per token (TRL's luspo) with the sequence KL
    "dr_grpo_token_sum": dataclasses.replace(DR_GRPO, eps_low=0.25, eps_high=0.25, kl_coef=0.125,
                                             kl_estimator="k1", aggregation="seq_mean_token_sum"),
    "gspo_token_sum_sequence_kl": dataclasses.replace(GSPO, eps_low=2.0**-12, eps_high=2.0**-11,
                                                      aggregation="seq_mean_token_sum", kl_coef=0.25,
                                                      kl_scale="sequence"),
    # "larger G, divide by sqrt(G)" (md eq. (10))
    "grpo_sqrt_g": dataclasses.replace(GRPO, eps_low=0.25, eps_high=0.25, aggregation="seq_sqrt_token_mean",
                                       group_size=3, kl_coef=0.0625),
    "gspo_sqrt_g_sequence_kl": dataclasses.replace(GSPO, eps_low=2.0**-12, eps_high=2.0**-11,
                                                   aggregation="seq_sqrt_token_mean", group_size=5,
                                                   kl_coef=0.25, kl_scale="sequence"),
}


def boundaries(v: PolicyLossVariant) -> list[float]:
    out = [1.0]
    if v.gate in ("clip", "cispo"):
        out += [1 - v.eps_low] if v.eps_low is not None else []
        out += [1 + v.eps_high] if v.eps_high is not None else []
    if v.dual_clip is not None:
        out.append(v.dual_clip)
    for b in out:  # the premise of the exact-boundary cases
        assert math.exp(math.log(b)) == b and torch.exp(torch.tensor(math.log(b), dtype=torch.float64)) == b
    return out


def loss_batches(v: PolicyLossVariant, max_n: int = 4, max_t: int = 4):
    """tests/strategies.policy_loss_batches for v, as float64 tensors plus the exact log-probs
    (sympy: multiple * log(b)) of the entries that sit exactly on a boundary."""

    def convert(batch):
        exact = {key: multiple * exact_ratio_log(b) for key, (multiple, b) in batch["boundary"].items()}
        return (torch.from_numpy(batch["logp"]), torch.from_numpy(batch["old_logp"]),
                torch.from_numpy(batch["advantages"]), torch.from_numpy(batch["mask"]), exact)

    return policy_loss_batches(tuple(boundaries(v)), v.ratio, max_n, max_t).map(convert)


def _extras(v: PolicyLossVariant, logp: torch.Tensor, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    extras = {}
    if v.kl_coef > 0:
        noise = torch.randn(logp.shape, generator=g, dtype=torch.float64)
        extras["ref_logp"] = logp.nan_to_num(0.0) + 0.3 * noise
    if v.entropy_coef > 0:
        extras["entropy"] = torch.rand(logp.shape, generator=g, dtype=torch.float64)
    if v.behavior_correction != "none":
        # the sampler's log-probs: old_logp plus noise (weights exp(old - behavior) around the cap)
        noise = torch.randn(logp.shape, generator=g, dtype=torch.float64)
        extras["behavior_logp"] = -1.0 + 0.3 * noise
    return extras


def _run(v, logp, old, adv, mask, **extras):
    x = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(x, old, adv, mask, v, **extras)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad, metrics


# The spec comparison evaluates a sympy expression at 50 digits per example (~0.1-0.5 s with
# the build), so it runs fewer examples than the ci profile; the loop comparison below runs the
# full profile.
@pytest.mark.parametrize("name", sorted(BOUNDARY_SAFE))
@settings(max_examples=8)
@given(data=st.data())
def test_loss_and_gradient_equal_the_50_digit_spec(name, data):
    v = BOUNDARY_SAFE[name]
    logp, old, adv, mask, exact = data.draw(loss_batches(v, max_n=3, max_t=3))
    extras = _extras(v, logp, data.draw(st.integers(0, 2**16)))
    loss, grad, _ = _run(v, logp, old, adv, mask, **extras)
    spec_loss, spec_grad, scale = spec_loss_and_grad(v, logp, old, adv, mask, exact_logp=exact, **extras)
    assert_close(loss, spec_loss, scale, f"{name} loss")
    assert_close(grad, spec_grad, scale + float(spec_grad.abs().sum()), f"{name} gradient")


@pytest.mark.parametrize("name", sorted(BOUNDARY_SAFE))
@given(data=st.data())
def test_loss_and_gradient_equal_the_loop_reference(name, data):
    v = BOUNDARY_SAFE[name]
    logp, old, adv, mask, _ = data.draw(loss_batches(v))
    extras = _extras(v, logp, data.draw(st.integers(0, 2**16)))
    loss, grad, _ = _run(v, logp, old, adv, mask, **extras)
    x = logp.clone().requires_grad_(True)
    ref = loop_reference(x, old, adv, mask, v, **extras)
    ref_grad = torch.autograd.grad(ref, x, allow_unused=True)[0] if ref.requires_grad else None
    ref_grad = torch.zeros_like(logp) if ref_grad is None else ref_grad
    scale = float(ref.detach().abs()) + float(ref_grad.abs().sum()) + 1.0
    assert_close(loss, ref.detach(), scale, f"{name} loss vs loop")
    assert_close(grad, ref_grad, scale, f"{name} gradient vs loop")


def test_presets_use_their_documented_defaults():
    """Preset values as documented in policy_losses.md table 2 (issue 5)."""
    assert (PPO.gate, PPO.eps_low, PPO.eps_high, PPO.aggregation) == ("clip", 0.2, 0.2, "token_mean")
    assert (GRPO.ratio, GRPO.aggregation, GRPO.kl_estimator) == ("token", "seq_mean_token_mean", "k3")
    assert DR_GRPO.aggregation == "seq_sum" and DR_GRPO.max_length is None
    assert (DAPO.eps_low, DAPO.eps_high, DAPO.aggregation, DAPO.kl_coef) == (0.2, 0.28, "token_mean", 0.0)
    assert (BNPO.eps_low, BNPO.eps_high, BNPO.aggregation) == (0.2, 0.2, "token_mean")
    assert (GSPO.ratio, GSPO.aggregation) == ("sequence_mean", "seq_mean")
    assert (GSPO_TOKEN.ratio, GSPO_TOKEN.aggregation) == ("gspo_token", "seq_mean_token_mean")
    assert (SAPO.gate, SAPO.aggregation) == ("sapo", "seq_mean_token_mean") and SAPO.tau_neg > SAPO.tau_pos
    assert (CISPO.gate, CISPO.eps_low, CISPO.eps_high) == ("cispo", None, 0.28)
    assert CISPO.aggregation == "token_mean"


def test_get_preset_is_case_insensitive_and_rejects_unknown_names():
    for name, v in PRESETS.items():
        assert get_preset(name) is v and get_preset(name.upper()) is v
    assert get_preset("Dr-GRPO") is DR_GRPO
    with pytest.raises(ValueError, match="valid names: ppo, grpo, dr_grpo, dapo, bnpo, gspo, gspo_token"):
        get_preset("trpo")
    assert set(PRESETS) == {"ppo", "grpo", "dr_grpo", "dapo", "bnpo", "gspo", "gspo_token", "sapo", "cispo"}


# ---------------------------------------------------------------------------------------------
# PPO: derivative w.r.t. the ratio is A * g_hard (errata.md entry 13: not g_hard)


def g_hard(r: float, a: float, eps_low: float, eps_high: float, c: float | None) -> float:
    """policy_losses.md eq. (6): inclusive inequalities (plus r <= c under dual clip for A <= 0)."""
    if a > 0:
        return float(r <= 1 + eps_high)
    return float(r >= 1 - eps_low and (c is None or r <= c))


@pytest.mark.parametrize("dual_clip", [None, 2.5])
@pytest.mark.parametrize("a", [1.5, -1.5, 0.0])
@pytest.mark.parametrize("r", [0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.5, 4.0])
def test_ppo_derivative_wrt_ratio_is_advantage_times_inclusive_gate(r, a, dual_clip):
    v = dataclasses.replace(PPO, eps_low=0.25, eps_high=0.25, dual_clip=dual_clip)
    log_r = torch.tensor([[math.log(r)]], dtype=torch.float64, requires_grad=True)
    zero = torch.zeros(1, 1, dtype=torch.float64)
    adv = torch.tensor([a], dtype=torch.float64)
    loss, _ = policy_loss(log_r, zero, adv, torch.ones(1, 1, dtype=torch.bool), v)
    (d_logr,) = torch.autograd.grad(loss, log_r)
    # d loss / d r = (d loss / d log r) / r; the loss is minus the objective
    d_objective_d_r = -float(d_logr) / r
    assert d_objective_d_r == pytest.approx(a * g_hard(r, a, 0.25, 0.25, dual_clip), abs=1e-15)
    # the value is the literal min-clip (and dual-clip) term of Schulman et al. 2017, eq. (7)
    value = min(r * a, min(max(r, 0.75), 1.25) * a)
    if dual_clip is not None and a < 0:
        value = max(value, dual_clip * a)
    assert -float(loss.detach()) == pytest.approx(value, rel=1e-15, abs=1e-15)


def test_gspo_token_equals_gspo_in_value_and_gradient():
    """GSPO-token with per-sequence advantages is GSPO in value and gradient (md eq. (5))."""
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(4, 5, generator=g, dtype=torch.float64)
    old = logp + 0.02 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 5, generator=g) < 0.7
    adv = torch.randn(4, generator=g, dtype=torch.float64)
    for eps in (0.2, 1e-3):
        a = _run(dataclasses.replace(GSPO, eps_low=eps, eps_high=eps), logp, old, adv, mask)
        b = _run(dataclasses.replace(GSPO_TOKEN, eps_low=eps, eps_high=eps), logp, old, adv, mask)
        assert torch.allclose(a[0], b[0], rtol=1e-13, atol=0)
        assert torch.allclose(a[1], b[1], rtol=1e-12, atol=1e-15)


def test_gspo_gradient_is_shared_by_the_tokens_of_a_sequence():
    """Zheng et al. 2025, section 4.2: without clipping every token of sequence i gets s_i A_i / (|y_i| N)."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]], dtype=torch.float64)
    old = logp - torch.tensor([[0.1, -0.2, 0.05], [0.3, 0.1, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    adv = torch.tensor([0.7, -1.3], dtype=torch.float64)
    _, grad, _ = _run(dataclasses.replace(GSPO, gate="none"), logp, old, adv, mask)
    s = torch.exp(torch.tensor([(0.1 - 0.2 + 0.05) / 3, (0.3 + 0.1) / 2], dtype=torch.float64))
    expected = -(s * adv / torch.tensor([3.0, 2.0], dtype=torch.float64) / 2).unsqueeze(-1) * mask
    assert torch.allclose(grad, expected.to(torch.float64), rtol=1e-13, atol=0)


def test_cispo_gradient_is_the_detached_clipped_weight_times_advantage():
    """md eq. (9): d loss / d logp = -sg(clip(r, -, 1 + eps_high)) A / N_tok, no lower clip by default."""
    log_r = torch.tensor([[-2.0, 0.1, 0.5]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -0.5, -0.2]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    loss, grad, _ = _run(CISPO, old + log_r, old, adv, torch.ones(1, 3, dtype=torch.bool))
    w = torch.exp(log_r).clamp(max=1.28)
    assert torch.allclose(grad, -w * adv / 3, rtol=1e-14, atol=0)
    assert float(loss) == pytest.approx(float(-(w * adv * (old + log_r)).sum() / 3), rel=1e-14, abs=0.0)


@pytest.mark.parametrize("mode", ["mask", "truncate"])
def test_behaviour_weight_exactly_at_the_cap_is_kept(mode):
    """md eq. (13): the masked IS weight keeps w == cap (inclusive); truncation leaves it at cap."""
    v = dataclasses.replace(PPO, behavior_correction=mode, behavior_cap=1.25)
    old = torch.zeros(1, 3, dtype=torch.float64)
    behavior = torch.tensor([[-math.log(1.25), -0.5, 0.0]], dtype=torch.float64)  # w = 1.25, e^0.5, 1
    logp = torch.tensor([[0.05, -0.1, 0.02]], dtype=torch.float64)
    adv = torch.tensor([1.0], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    _, grad, _ = _run(v, logp, old, adv, mask, behavior_logp=behavior)
    w = torch.tensor([1.25, 1.25 if mode == "truncate" else 0.0, 1.0], dtype=torch.float64)
    assert torch.allclose(grad, -(w * torch.exp(logp) / 3), rtol=1e-14, atol=0)


def test_ppo_on_every_boundary_and_the_dual_clip_constant_equals_the_spec():
    """Deterministic: one token exactly on each of 1 - eps_low, 1, 1 + eps_high and c, for both
    advantage signs (and A = 0), plus tokens just inside / outside each, against the 50-digit spec."""
    v = BOUNDARY_SAFE["ppo_dual"]
    points = [0.75, 1.0, 1.25, 2.5]
    ratios = [b * f for b in points for f in (1.0, 1 - 2**-20, 1 + 2**-20)]
    for a in (1.5, -1.5, 0.0):
        n = len(ratios)
        logp = torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64)
        old = torch.zeros(1, n, dtype=torch.float64)
        adv = torch.tensor([a], dtype=torch.float64)
        mask = torch.ones(1, n, dtype=torch.bool)
        exact = {(0, 3 * k): exact_ratio_log(b) for k, b in enumerate(points)}
        loss, grad, _ = _run(v, logp, old, adv, mask)
        spec_loss, spec_grad, scale = spec_loss_and_grad(v, logp, old, adv, mask, exact_logp=exact)
        assert_close(loss, spec_loss, scale, f"loss, A={a}")
        assert_close(grad, spec_grad, scale + float(spec_grad.abs().sum()), f"gradient, A={a}")
        on_boundary = grad[0, ::3]
        # inclusive gates: every boundary is inside, except c for A > 0 (above 1 + eps_high)
        expected_open = [True, True, True, a <= 0]
        assert [bool(g != 0) for g in on_boundary] == [o and a != 0 for o in expected_open]


@pytest.mark.parametrize("ratio", ["sequence_mean", "token"])
def test_log_clip_on_and_around_its_bounds_equals_the_spec(ratio):
    """md eq. (18) (GMPO): tokens with log-ratios exactly on -eps_low and eps_high (binary fractions,
    so l is exact in float64 with old_logp = 0), just inside and just outside, for both advantage
    signs and A = 0, against the 50-digit spec (value and gradient, 1e-10)."""
    v = PolicyLossVariant(ratio=ratio, gate="log_clip", eps_low=0.25, eps_high=0.375,
                          aggregation="seq_mean" if ratio == "sequence_mean" else "token_mean")
    on_bounds, beyond, inside = [-0.25, 0.375, 0.1], [-0.25 - 2**-20, 0.375 + 2**-20, -0.5], [
        -0.25 + 2**-20, 0.375 - 2**-20, 0.8]
    # which tokens keep their gradient (inclusive gate): A > 0 clips above eps_high, A < 0 below -eps_low
    gate_open = {1.5: [[True] * 3, [True, False, True], [True, True, False]],
                 -1.5: [[True] * 3, [False, True, False], [True] * 3],
                 0.0: [[False] * 3] * 3}
    for a, open_ in gate_open.items():
        logp = torch.tensor([on_bounds, beyond, inside], dtype=torch.float64)
        old = torch.zeros_like(logp)
        adv = torch.full((3,), a, dtype=torch.float64)
        mask = torch.ones_like(logp, dtype=torch.bool)
        loss, grad, _ = _run(v, logp, old, adv, mask)
        spec_loss, spec_grad, scale = spec_loss_and_grad(v, logp, old, adv, mask)
        assert_close(loss, spec_loss, scale, f"loss, A={a}")
        assert_close(grad, spec_grad, scale + float(spec_grad.abs().sum()), f"gradient, A={a}")
        assert [[bool(g != 0) for g in row] for row in grad] == open_


def test_gmpo_value_is_the_geometric_mean_of_the_clipped_token_ratios():
    """md eq. (18) by hand: A > 0 clips l = 0.5 down to eps_high = 0.375, A < 0 clips l = -0.5 up to
    -eps_low = -0.25; the sequence ratio is exp(mean of the clipped log-ratios)."""
    v = dataclasses.replace(GSPO, gate="log_clip", eps_low=0.25, eps_high=0.375)
    log_r = torch.tensor([[0.5, 0.25, -0.5], [-0.5, 0.5, 0.0]], dtype=torch.float64)
    adv = torch.tensor([2.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    loss, grad, _ = _run(v, log_r, torch.zeros_like(log_r), adv, mask)
    s0, s1 = math.exp((0.375 + 0.25 - 0.5) / 3), math.exp((-0.25 + 0.5) / 2)
    assert float(loss) == pytest.approx(-(2.0 * s0 - 1.0 * s1) / 2, rel=1e-14, abs=0.0)
    expected = [[0.0, -2.0 * s0 / 3 / 2, -2.0 * s0 / 3 / 2], [0.0, 1.0 * s1 / 2 / 2, 0.0]]
    assert torch.allclose(grad, torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0)


def test_log_clip_rejects_the_gspo_token_ratio():
    with pytest.raises(ValueError, match="gate='log_clip'.*gspo_token"):
        dataclasses.replace(GSPO_TOKEN, gate="log_clip")

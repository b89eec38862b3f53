"""Value loss (plain and clipped), entropy bonus, the combined PPO objective (Schulman et al. 2017, eq. (9))
and the KL-penalty controllers (Schulman et al. 2017 doubling/halving; dual ascent, policy_losses.md eq. (21))
(spec: specs/policy_losses.md sections 9-10)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from refimpl.losses import (
    DAPO,
    PPO,
    AdaptiveKLController,
    DualAscentKLController,
    entropy_bonus_loss,
    ppo_combined_loss,
    value_loss,
)


def _batch(seed: int, n: int = 5, t: int = 4):
    g = torch.Generator().manual_seed(seed)
    f64 = {"generator": g, "dtype": torch.float64}
    mask = torch.rand(n, t, generator=g) < 0.7
    return {
        "values": torch.randn(n, t, **f64),
        "returns": torch.randn(n, t, **f64),
        "old_values": torch.randn(n, t, **f64),
        "logp": -torch.rand(n, t, **f64),
        "old_logp": -torch.rand(n, t, **f64),
        "adv": torch.randn(n, t, **f64),
        "entropy": torch.rand(n, t, **f64),
        "mask": mask,
    }


@given(seed=st.integers(0, 2**20), eps=st.sampled_from([0.05, 0.2, 1.0]))
def test_value_losses_equal_the_per_sample_formulas(seed, eps):
    """Schulman et al. 2017, eq. (9), and md eq. (23), sample by sample, with their gradients."""
    b = _batch(seed)
    m = [(i, j) for i in range(5) for j in range(4) if b["mask"][i, j]]
    v = b["values"].clone().requires_grad_(True)
    plain, _ = value_loss(v, b["returns"], b["mask"])
    clipped, metrics = value_loss(v, b["returns"], b["mask"], old_values=b["old_values"], clip_eps=eps)
    expected_plain, expected_clipped, grad_plain, grad_clipped, n_clip = 0.0, 0.0, {}, {}, 0
    for i, j in m:
        x, r, o = float(b["values"][i, j]), float(b["returns"][i, j]), float(b["old_values"][i, j])
        xc = o + min(max(x - o, -eps), eps)
        expected_plain += (x - r) ** 2
        grad_plain[(i, j)] = 2 * (x - r)
        if (xc - r) ** 2 > (x - r) ** 2:
            expected_clipped += (xc - r) ** 2
            grad_clipped[(i, j)] = 2 * (xc - r) if abs(x - o) < eps else 0.0
            n_clip += 1
        else:
            expected_clipped += (x - r) ** 2
            grad_clipped[(i, j)] = 2 * (x - r)
    count = max(len(m), 1)
    assert float(plain.detach()) == pytest.approx(expected_plain / count, rel=1e-12, abs=1e-14)
    assert float(clipped.detach()) == pytest.approx(expected_clipped / count, rel=1e-12, abs=1e-14)
    assert float(metrics["value_clip_fraction"]) == pytest.approx(n_clip / count, abs=1e-15)
    for loss, grads in ((plain, grad_plain), (clipped, grad_clipped)):
        (g,) = torch.autograd.grad(loss, v)
        expected = torch.zeros(5, 4, dtype=torch.float64)
        for key, val in grads.items():
            expected[key] = val / count
        assert torch.allclose(g, expected, rtol=1e-12, atol=1e-15)


def test_clipped_value_loss_is_at_least_the_plain_loss_and_equal_within_the_clip():
    b = _batch(11)
    plain, _ = value_loss(b["values"], b["returns"], b["mask"])
    clipped, _ = value_loss(b["values"], b["returns"], b["mask"], old_values=b["old_values"], clip_eps=0.1)
    assert float(clipped) >= float(plain)
    same, _ = value_loss(b["values"], b["returns"], b["mask"], old_values=b["values"] + 0.01, clip_eps=0.1)
    assert float(same) == pytest.approx(float(plain), rel=1e-14, abs=0.0)


@given(seed=st.integers(0, 2**20), c1=st.sampled_from([0.0, 0.5, 1.0]), c2=st.sampled_from([0.0, 0.01]))
def test_combined_loss_is_minus_the_ppo_objective_85(seed, c1, c2):
    """-L^{CLIP+VF+S} = -(1/m) sum_i (l_i^CLIP - c1 l_i^VF + c2 H_i) (Schulman et al. 2017, eq. (9)), computed
    sample by sample."""
    b = _batch(seed)
    m = [(i, j) for i in range(5) for j in range(4) if b["mask"][i, j]]
    loss, metrics = ppo_combined_loss(b["logp"], b["old_logp"], b["adv"], b["values"], b["returns"],
                                      b["entropy"], b["mask"], value_coef=c1, entropy_coef=c2)
    objective = 0.0
    for i, j in m:
        r = math.exp(float(b["logp"][i, j] - b["old_logp"][i, j]))
        a = float(b["adv"][i, j])
        clip_term = min(r * a, min(max(r, 0.8), 1.2) * a)
        vf = (float(b["values"][i, j]) - float(b["returns"][i, j])) ** 2
        objective += clip_term - c1 * vf + c2 * float(b["entropy"][i, j])
    assert float(loss) == pytest.approx(-objective / max(len(m), 1), rel=1e-12, abs=1e-14)
    assert set(metrics) >= {"policy_loss", "value_loss", "entropy_loss", "clip_fraction", "entropy"}


def test_entropy_bonus_loss_is_minus_the_masked_mean():
    b = _batch(5)
    h = b["entropy"].clone().requires_grad_(True)
    loss, metrics = entropy_bonus_loss(h, b["mask"])
    count = int(b["mask"].sum())
    assert float(loss) == pytest.approx(-float(b["entropy"][b["mask"]].sum()) / count, rel=1e-14, abs=0.0)
    (g,) = torch.autograd.grad(loss, h)
    assert torch.equal(g, -b["mask"].to(torch.float64) / count)
    assert float(metrics["entropy"]) == pytest.approx(-float(loss), rel=1e-15, abs=0.0)


def test_value_and_combined_losses_reject_bad_input():
    b = _batch(1)
    with pytest.raises(ValueError, match="old_values"):
        value_loss(b["values"], b["returns"], b["mask"], clip_eps=0.2)
    with pytest.raises(ValueError, match="returns"):
        value_loss(b["values"], b["returns"][:, :2], b["mask"])
    bad = b["returns"].clone()
    bad[b["mask"]] = float("nan")
    with pytest.raises(ValueError, match="returns contains NaN"):
        value_loss(b["values"], bad, b["mask"])
    with pytest.raises(ValueError, match="token_mean"):
        ppo_combined_loss(b["logp"], b["old_logp"], b["adv"], b["values"], b["returns"], b["entropy"],
                          b["mask"], value_coef=1.0, entropy_coef=0.0,
                          variant=dataclasses.replace(PPO, aggregation="seq_mean"))
    # DAPO is token-mean too: accepted, and differs from PPO only through its clip range
    ppo_combined_loss(b["logp"], b["old_logp"], b["adv"], b["values"], b["returns"], b["entropy"], b["mask"],
                      value_coef=1.0, entropy_coef=0.0, variant=DAPO)


# ---------------------------------------------------------------------------------------------
# controllers


@pytest.mark.parametrize(
    ("kl", "expected"),
    [(0.0, 0.5), (0.01 / 1.5 - 1e-12, 0.5), (0.01 / 1.5, 1.0), (0.01, 1.0), (0.015, 1.0),
     (0.015 + 1e-12, 2.0), (1.0, 2.0)],
)
def test_adaptive_beta_doubles_above_1_5_delta_and_halves_below_delta_over_1_5(kl, expected):
    """Schulman et al. 2017, section 4: d > 1.5 delta -> 2 beta; d < delta / 1.5 -> beta / 2; otherwise
    unchanged
    (both edges of the band count as 'good enough')."""
    controller = AdaptiveKLController(beta=1.0, target_kl=0.01)
    assert controller.update(kl) == expected
    assert controller.beta == expected


def test_adaptive_beta_sequence_and_tensor_input():
    controller = AdaptiveKLController(beta=0.1, target_kl=0.02)
    betas = [controller.update(torch.tensor(d)) for d in (0.1, 0.1, 0.02, 0.001, 0.0)]
    assert betas == pytest.approx([0.2, 0.4, 0.4, 0.2, 0.1], rel=1e-15, abs=0.0)


def test_dual_ascent_multiplier_rule_and_projection():
    """policy_losses.md eq. (21): lambda <- lambda + alpha (KL - eps), projected onto lambda >= 0."""
    controller = DualAscentKLController(coef=0.5, target_kl=0.1, lr=2.0)
    assert controller.update(0.3) == pytest.approx(0.5 + 2.0 * 0.2, rel=1e-15, abs=0.0)
    assert controller.update(0.05) == pytest.approx(0.9 - 2.0 * 0.05, rel=1e-15, abs=0.0)
    assert controller.update(0.0) == pytest.approx(0.8 - 0.2, rel=1e-15, abs=0.0)
    assert controller.update(0.0) == pytest.approx(0.4, rel=1e-15, abs=0.0)
    assert controller.update(0.0) == pytest.approx(0.2, rel=1e-14, abs=0.0)
    assert controller.update(0.0) == 0.0  # projected: would be -0.0 -> stays at 0, never negative
    assert controller.update(0.0) == 0.0


@pytest.mark.parametrize("g", [0.5, 1.0, 3.0])
def test_dual_ascent_reaches_the_kl_target_on_a_quadratic_toy(g):
    """Toy: maximise g x - beta KL(x) with KL(x) = x^2 / 2, so x*(beta) = g / beta and
    KL* = g^2 / (2 beta^2); dual ascent converges to beta* = g / sqrt(2 eps), where KL = eps."""
    eps = 0.05
    beta_star = g / math.sqrt(2 * eps)
    # step 0.5 g / (2 eps)^1.5 makes the linearised dual map contract by 1/2 per step
    dual = DualAscentKLController(coef=0.7 * beta_star, target_kl=eps, lr=0.5 * g / (2 * eps) ** 1.5)
    for _ in range(200):
        dual.update(g * g / (2 * dual.coef**2))
    assert dual.coef == pytest.approx(beta_star, rel=1e-10, abs=0.0)


@pytest.mark.parametrize("k", [1e-3, 0.2, 37.0])
def test_adaptive_rule_settles_in_its_band_when_kl_scales_like_one_over_beta(k):
    """With a response KL(beta) = k / beta one doubling / halving changes the KL by 2 < 2.25 (the
    band's width 1.5^2), so the rule enters [delta / 1.5, 1.5 delta] and stays. (With
    KL ~ 1 / beta^2, e.g. the quadratic toy, a step changes KL by 4 and the rule can cycle.)"""
    eps = 0.05
    adaptive = AdaptiveKLController(beta=1.0, target_kl=eps)
    history = [adaptive.update(k / adaptive.beta) for _ in range(80)]
    assert eps / 1.5 <= k / adaptive.beta <= 1.5 * eps
    assert history[-1] == history[-20]


def test_adaptive_rule_cycles_when_one_step_jumps_over_the_band():
    """KL = 1 / beta^2 with delta = 1: from beta = 1.5 (KL 0.44 < 0.67) it halves to 0.75
    (KL 1.78 > 1.5), doubles back, and so on: the rule's documented limitation."""
    adaptive = AdaptiveKLController(beta=1.5, target_kl=1.0)
    history = [adaptive.update(1 / adaptive.beta**2) for _ in range(6)]
    assert history == [0.75, 1.5, 0.75, 1.5, 0.75, 1.5]


def test_controllers_reject_bad_input():
    with pytest.raises(ValueError, match="beta"):
        AdaptiveKLController(beta=0.0, target_kl=0.1)
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(beta=1.0, target_kl=-1.0)
    with pytest.raises(ValueError, match="kl must be finite"):
        AdaptiveKLController(beta=1.0, target_kl=0.1).update(float("nan"))
    with pytest.raises(ValueError, match="kl must be >= 0"):
        DualAscentKLController(coef=1.0, target_kl=0.1, lr=0.1).update(-0.5)
    with pytest.raises(ValueError, match="coef"):
        DualAscentKLController(coef=-1.0, target_kl=0.1, lr=0.1)

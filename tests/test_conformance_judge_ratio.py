"""The ratio as a framework evaluates it (``refimpl.conformance.evaluated_ratio``; issue 31): float64
inputs exactly on a float32-rounded clip bound, where SkyRL's float32 ratio compared with float64
bounds (``ratio_dtype="float32"``) and Liger's float32 ratio and bounds (``"float32_gate"``) part.

Bounds of PPO's gate (eps 0.2; policy_losses.md eqs. (6)-(7)): float32(1.2) = 1.2000000476837158 lies
above 1.2 and float32(0.8) = 0.800000011920929 above 0.8, so a float32 ratio equal to float32(1.2)
is past the float64 upper bound (clipped under "float32") but on the float32 one (a tie, inside the
inclusive gate, under "float32_gate"); float32 ratios of exactly 3.0 sit on the dual clip c = 3.
Each tie is searched at run time with this machine's float32 ``exp`` (CPUs may differ by an ulp).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from refimpl.conformance.case_types import PolicyLossCase
from refimpl.conformance.conventions import Convention
from refimpl.conformance.evaluated_ratio import evaluated_ratio_logp, evaluated_weight_old
from refimpl.conformance.expected import expected_policy_loss
from refimpl.losses import get_preset

PPO = get_preset("ppo")  # eps_low = eps_high = 0.2, token_mean
DUAL = dataclasses.replace(PPO, dual_clip=3.0)
SKYRL = Convention(ratio_dtype="float32")
LIGER = Convention(ratio_dtype="float32_gate")
U64 = 2.0**-53
F32 = {b: float(np.float32(b)) for b in (1.2, 0.8, 3.0)}
F32_22 = float(np.float32(2.2))


def float32_tie(bound: float) -> float:
    """A float32-exact log-ratio x whose float32 ``exp`` is float32(bound) exactly."""
    target = torch.tensor(bound, dtype=torch.float32)
    x = torch.tensor(math.log(bound), dtype=torch.float32)
    candidates = [x]
    for direction in (math.inf, -math.inf):
        y = x
        for _ in range(8):
            y = torch.nextafter(y, torch.tensor(direction, dtype=torch.float32))
            candidates.append(y)
    hits = [float(c) for c in candidates if torch.exp(c.reshape(1).expand(4))[3] == target]
    assert hits, f"no float32 log-ratio maps onto float32({bound})"
    return hits[0]


def f32_exp(xs) -> list[float]:
    """This machine's float32 ``exp`` of the row ``xs`` (a tensor of the kit's shape), as floats."""
    return torch.exp(torch.tensor([xs], dtype=torch.float64).float())[0].double().tolist()


def batch(xs, adv, mask=None):
    """One row of log-ratios ``xs`` with old_logp = 0 (so logp - old is x exactly)."""
    logp = torch.tensor([xs], dtype=torch.float64)
    m = torch.ones_like(logp, dtype=torch.bool) if mask is None else torch.tensor([mask])
    a = torch.tensor(adv, dtype=torch.float64)
    return logp, torch.zeros_like(logp), a, m


def ratio_of(out, old):
    return torch.exp(out.detach() - old)


def evaluated_ratio(logp, old, adv, mask, variant, conv, dtype) -> list[float]:
    """The ratios of row 0 that ``evaluated_ratio_logp`` makes the reference see."""
    return ratio_of(evaluated_ratio_logp(logp, old, adv, mask, variant, conv, dtype), old)[0].tolist()


def within_ulps(got: float, want: float, ulps: int = 4) -> bool:
    return abs(got - want) <= ulps * U64 * abs(want)


def test_float64_inputs_on_the_float32_upper_bound_are_a_tie_for_liger_and_clipped_for_skyrl():
    """Kills (issue 31) ``ratio_dtype == "float32_gate"`` inverted in ``_float32_bounds``: Liger
    and SkyRL part exactly on float32(1.2)."""
    x = float32_tie(1.2)
    logp, old, adv, mask = batch([x, 0.05], [0.5])
    liger = ratio_of(evaluated_ratio_logp(logp, old, adv, mask, PPO, LIGER, torch.float64), old)[0]
    skyrl = ratio_of(evaluated_ratio_logp(logp, old, adv, mask, PPO, SKYRL, torch.float64), old)[0]
    float32_inputs = ratio_of(evaluated_ratio_logp(logp, old, adv, mask, PPO, Convention(), torch.float32),
                              old)[0]
    # Liger (and float32 inputs): on the float64 bound's inside, within a few ulps of 1.2
    for r in (liger, float32_inputs):
        assert float(r[0]) <= 1.2 and within_ulps(float(r[0]), 1.2)
    # SkyRL: the float32 ratio, past the float64 bound
    assert within_ulps(float(skyrl[0]), F32[1.2]) and float(skyrl[0]) > 1.2
    # the token inside the band: its float32 ratio in both
    want = f32_exp([x, 0.05])[1]
    assert within_ulps(float(liger[1]), want) and within_ulps(float(skyrl[1]), want)
    assert float(skyrl[1]) != math.exp(0.05)
    # the spec's loss: the tie gets the gradient of an inside ratio, the clipped token none
    case = PolicyLossCase("tie", 0, logp, old, adv, mask, adv, torch.tensor([0]))
    grads = {name: expected_policy_loss(case, PPO, conv)[1][0]
             for name, conv in (("liger", LIGER), ("skyrl", SKYRL))}
    assert within_ulps(float(grads["liger"][0]), -0.5 * 1.2 / 2, 16)
    assert float(grads["skyrl"][0]) == 0.0
    assert within_ulps(float(grads["liger"][1]), -0.5 * want / 2, 16)


def test_a_zero_advantage_meets_the_upper_bound_and_a_negative_one_the_lower():
    up, low = float32_tie(1.2), float32_tie(0.8)
    logp, old, adv, mask = batch([up, up, low, low], [[0.0, -1.0, -1.0, 1.0]])
    r = ratio_of(evaluated_ratio_logp(logp, old, adv, mask, PPO, LIGER, torch.float64), old)[0].tolist()
    assert r[0] <= 1.2 and within_ulps(r[0], 1.2)  # A = 0 counts with the positive side
    assert within_ulps(r[1], F32[1.2])  # A < 0: 1.2 is no bound of its side
    assert r[2] >= 0.8 and within_ulps(r[2], 0.8)  # A < 0: on the lower bound's inside
    assert within_ulps(r[3], F32[0.8])  # A > 0: 0.8 is no bound of its side
    skyrl = ratio_of(evaluated_ratio_logp(logp, old, adv, mask, PPO, SKYRL, torch.float64), old)[0].tolist()
    assert within_ulps(skyrl[0], F32[1.2]) and within_ulps(skyrl[2], F32[0.8])
    # per-sequence advantages: the same sides
    logp, old, adv, mask = batch([up, low], [-2.0])
    r = ratio_of(evaluated_ratio_logp(logp, old, adv, mask, PPO, LIGER, torch.float64), old)[0].tolist()
    assert within_ulps(r[0], F32[1.2]) and r[1] >= 0.8 and within_ulps(r[1], 0.8)


def test_a_dual_clip_tie_keeps_its_gradient_or_halves_it():
    x = float32_tie(3.0)
    logp, old, adv, mask = batch([x, x, 0.1], [[-1.0, 1.0, -1.0]])
    for conv, dtype, scale in ((SKYRL, torch.float64, 1.0),
                               (dataclasses.replace(SKYRL, dual_clip_tie="half"), torch.float64, 0.5),
                               (Convention(dual_clip_tie="half"), torch.float32, 0.5)):
        leaf = logp.clone().requires_grad_(True)
        out = evaluated_ratio_logp(leaf, old, adv, mask, DUAL, conv, dtype)
        r = ratio_of(out, old)[0].tolist()
        assert r[0] <= 3.0 and within_ulps(r[0], 3.0)
        (grad,) = torch.autograd.grad(out.sum(), leaf)
        # only the A < 0 token on c; float64 results of float32 ratios under "float32" (SkyRL)
        want = [scale, 1.0, 1.0]
        if conv.ratio_dtype == "float32":
            ratios = f32_exp([x, x, 0.1])
            assert ratios[:2] == [3.0, 3.0]
            want = [float(np.float32(np.float32(w / q) * np.float32(q)))
                    for w, q in zip(want, ratios, strict=True)]
        assert grad[0].tolist() == want, conv
    # float64 inputs without a float32 ratio: a dual clip with an inclusive tie changes nothing
    assert evaluated_ratio_logp(logp, old, adv, mask, DUAL, Convention(), torch.float64) is logp
    half = evaluated_ratio_logp(logp, old, adv, mask, DUAL, Convention(dual_clip_tie="half"), torch.float64)
    assert torch.equal(half, logp)  # no float64 log-ratio has exp exactly 3.0 here


def test_the_float32_ratio_gradient_is_rounded_to_float32_on_its_way_back():
    """SkyRL on float64 inputs: d out / d logp = float32(float32(g / r) r) for upstream g."""
    xs = [0.3, -0.7, 1.9]
    logp, old, adv, mask = batch(xs, [1.0])
    leaf = logp.clone().requires_grad_(True)
    out = evaluated_ratio_logp(leaf, old, adv, mask, PPO, SKYRL, torch.float64)
    g = torch.tensor([[1.0 / 3.0, 0.7, -5.0 / 7.0]], dtype=torch.float64)
    (grad,) = torch.autograd.grad((out * g).sum(), leaf)
    for k, r in enumerate(f32_exp(xs)):
        want = float(np.float32(np.float32(g[0, k].item() / r) * np.float32(r)))
        assert grad[0, k].item() == want
    assert grad[0, 0].item() != 1.0 / 3.0
    for k, r in enumerate(f32_exp(xs)):  # the value: the float32 ratio
        assert within_ulps(float(ratio_of(out, old)[0, k]), r)


def test_masked_overflowing_and_underflowing_ratios_are_left_as_they_are():
    """Only tokens that count, whose float32 ratio is finite and > 0, are moved; the gradient of a
    masked, overflowing or underflowing token passes unrounded (0.1 is not a float32 number: kills
    the placeholder ratio 0 of ``_Float32RatioGradient`` changed to 1, which would round it)."""
    x = float32_tie(1.2)
    logp, old, adv, mask = batch([x, 100.0, -120.0, x], [1.0], mask=[True, True, True, False])
    for conv in (SKYRL, LIGER):
        leaf = logp.clone().requires_grad_(True)
        out = evaluated_ratio_logp(leaf, old, adv, mask, PPO, conv, torch.float64)
        assert out[0, 1:].tolist() == logp[0, 1:].tolist()
        assert float(out[0, 0].detach()) != x
        (grad,) = torch.autograd.grad((0.1 * out).sum(), leaf)
        assert grad[0, 1:].tolist() == [0.1, 0.1, 0.1]


def test_the_ratio_is_left_alone_where_nothing_is_rounded_or_tied():
    logp, old, adv, mask = batch([float32_tie(1.2), 0.2], [1.0])
    cispo, sapo = get_preset("cispo"), get_preset("sapo")
    for variant in (get_preset("gspo"), get_preset("gspo_token"), cispo,
                    dataclasses.replace(PPO, gate="none")):
        for conv in (SKYRL, LIGER, Convention()):
            assert evaluated_ratio_logp(logp, old, adv, mask, variant, conv, torch.float32) is logp
    for variant in (PPO, sapo):
        assert evaluated_ratio_logp(logp, old, adv, mask, variant, Convention(), torch.float64) is logp
        moved = evaluated_ratio_logp(logp, old, adv, mask, variant, SKYRL, torch.float64)
        assert within_ulps(float(ratio_of(moved, old)[0, 1]), f32_exp(logp[0].tolist())[1])
    # SAPO has no hard bound: a float32 ratio on float32(1.2) stays the float32 ratio
    sapo_ratio = ratio_of(evaluated_ratio_logp(logp, old, adv, mask, sapo, LIGER, torch.float64), old)
    assert within_ulps(float(sapo_ratio[0, 0]), F32[1.2])


def test_one_sided_gates_have_no_tie_on_the_missing_side():
    logp, old, adv, mask = batch([float32_tie(1.2), float32_tie(0.8)], [[1.0, -1.0]])
    upper_only = dataclasses.replace(PPO, eps_low=None)
    lower_only = dataclasses.replace(PPO, eps_high=None)
    r_up = evaluated_ratio(logp, old, adv, mask, upper_only, LIGER, torch.float64)
    r_low = evaluated_ratio(logp, old, adv, mask, lower_only, LIGER, torch.float64)
    assert r_up[0] <= 1.2 and within_ulps(r_up[0], 1.2) and within_ulps(r_up[1], F32[0.8])
    assert within_ulps(r_low[0], F32[1.2]) and r_low[1] >= 0.8 and within_ulps(r_low[1], 0.8)


def test_cispo_weight_sees_the_float32_ratio():
    xs = [0.3, float32_tie(1.2), 100.0, -0.4, -0.3]
    logp, old, _, mask = batch(xs, [1.0], mask=[True, True, True, False, True])
    logp.requires_grad_(True)
    assert evaluated_weight_old(logp, old, mask, Convention(), torch.float64) is old
    ratios = f32_exp(xs)
    assert ratios[1] == F32[1.2]
    for conv, dtype in ((SKYRL, torch.float64), (LIGER, torch.float64), (Convention(), torch.float32)):
        new_old = evaluated_weight_old(logp, old, mask, conv, dtype)
        assert not new_old.requires_grad
        weight = torch.exp(logp.detach() - new_old)[0].tolist()
        for k in (0, 1, 4):
            assert within_ulps(weight[k], ratios[k])
        assert weight[0] != math.exp(0.3) and weight[4] != math.exp(-0.3)
        assert new_old[0, 2:4].tolist() == [0.0, 0.0]  # overflowing in float32, masked: unchanged


def test_the_float32_bounds_are_host_numbers_whatever_the_default_device():
    x = float32_tie(1.2)
    logp, old, adv, mask = batch([x], [1.0])
    with torch.device("meta"):
        r = evaluated_ratio(logp, old, adv, mask, PPO, LIGER, torch.float64)
    assert r[0] <= 1.2 and within_ulps(r[0], 1.2)


def test_a_tie_that_float64_can_hold_exactly_stays_exactly_on_the_bound():
    """c = 4: old + log(4) has exp exactly 4.0 on this CPU (checked first), so the tie needs no move;
    below the bound would also be inside, but it is not where the framework's ratio is."""
    x = float32_tie(4.0)
    logp, old, adv, mask = batch([x, 0.1], [-1.0])
    exact = float(torch.exp(torch.tensor([math.log(4.0), 0.1], dtype=torch.float64))[0]) == 4.0
    r = evaluated_ratio(logp, old, adv, mask, dataclasses.replace(PPO, dual_clip=4.0), SKYRL, torch.float64)
    assert r[0] == 4.0 if exact else (r[0] <= 4.0 and within_ulps(r[0], 4.0))


def test_the_float32_bounds_do_not_follow_the_default_dtype():
    x = float32_tie(1.2)
    logp, old, adv, mask = batch([x], [1.0])
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        r = evaluated_ratio(logp, old, adv, mask, PPO, LIGER, torch.float64)
    finally:
        torch.set_default_dtype(default)
    assert r[0] <= 1.2 and within_ulps(r[0], 1.2)


def test_ties_with_old_log_probs_that_are_not_zero():
    """old_logp = -5 (logp = old + x, exact): the tie is placed relative to old; an upper bound that
    float64 holds exactly (1 + 1.5 = 2.5 = exp(log 2.5) on this CPU, checked first) stays exactly on it."""
    x = float32_tie(1.2)
    old = torch.full((1, 2), -5.0, dtype=torch.float64)  # -5 + log(1.2) - -5 rounds above 1.2 (x86-64)
    logp = old + torch.tensor([[x, 0.0625]], dtype=torch.float64)
    assert torch.equal(logp - old, torch.tensor([[x, 0.0625]], dtype=torch.float64))
    adv, mask = torch.tensor([0.5], dtype=torch.float64), torch.ones((1, 2), dtype=torch.bool)
    r = evaluated_ratio(logp, old, adv, mask, PPO, LIGER, torch.float64)
    # the ratio moves in steps of ulp(logp) ~ 2^-50 (|logp| ~ 4.8): two steps, 16 u64
    assert r[0] <= 1.2 and within_ulps(r[0], 1.2, 16)
    wide = dataclasses.replace(PPO, eps_high=1.5)
    y = float32_tie(2.5)
    exact = float(torch.exp(torch.tensor([math.log(2.5), 0.05], dtype=torch.float64))[0]) == 2.5
    zero = torch.zeros((1, 2), dtype=torch.float64)
    y_logp = torch.tensor([[y, 0.05]], dtype=torch.float64)
    r = evaluated_ratio(y_logp, zero, adv, mask, wide, SKYRL, torch.float64)
    assert r[0] == 2.5 if exact else (r[0] <= 2.5 and within_ulps(r[0], 2.5))


def test_a_zero_per_sequence_advantage_counts_with_the_positive_side():
    """Per-sequence advantages (1-D): A = 0 meets the upper bound, as per-token ones do. Kills
    ``_ties_on_open_side``'s 1-D ``adv < 0`` changed to ``adv <= 0`` (a mutmut survivor)."""
    logp, old, adv, mask = batch([float32_tie(1.2), float32_tie(0.8)], [0.0])
    r = evaluated_ratio(logp, old, adv, mask, PPO, LIGER, torch.float64)
    assert r[0] <= 1.2 and within_ulps(r[0], 1.2)  # placed on the float64 upper bound's inside
    assert within_ulps(r[1], F32[0.8])  # 0.8 bounds only the negative side: the float32 ratio


def test_a_dual_clip_whose_float32_rounding_lies_above_it_is_placed_on_it():
    """Liger's float32 dual clip c = 2.2: float32(2.2) = 2.2000000477 > 2.2, so a float32 ratio on it
    is a tie, placed on c (float64) from above, not left at float32(c) (past the bound, a clipped
    token). Kills the dual tie's ``old + log(c)`` skipped (``isfinite(dual) and False``)."""
    assert F32_22 > 2.2
    logp, old, adv, mask = batch([float32_tie(2.2), 0.1], [-1.0])
    r = evaluated_ratio(logp, old, adv, mask, dataclasses.replace(PPO, dual_clip=2.2), LIGER, torch.float64)
    assert r[0] <= 2.2 and within_ulps(r[0], 2.2)


def test_a_lower_tie_that_float64_holds_exactly_is_not_moved_inside():
    """eps_low = 0.5: the lower bound 0.5 is exact in float32 and float64, and exp(log 0.5) is exactly
    0.5 on this CPU (checked first): the tie stays on it, not an ulp above. Kills the nudge's
    ``r < lower`` changed to ``r <= lower``."""
    logp, old, adv, mask = batch([float32_tie(0.5), 0.1], [-1.0])
    exact = float(torch.exp(torch.tensor([math.log(0.5), 0.1], dtype=torch.float64))[0]) == 0.5
    r = evaluated_ratio(logp, old, adv, mask, dataclasses.replace(PPO, eps_low=0.5), LIGER, torch.float64)
    assert r[0] == 0.5 if exact else (r[0] >= 0.5 and within_ulps(r[0], 0.5))


def test_cispo_weight_leaves_a_float32_ratio_that_underflows_to_zero_alone():
    """exp(float32(-120)) is 0 in float32: no log of it (old would become +inf); ``old`` stays. Kills
    ``evaluated_weight_old``'s ``ratio > 0`` changed to ``ratio >= 0``."""
    logp, old, _, mask = batch([-120.0, 0.3], [1.0])
    assert f32_exp([-120.0, 0.3])[0] == 0.0
    new_old = evaluated_weight_old(logp, old, mask, LIGER, torch.float64)
    assert float(new_old[0, 0]) == 0.0
    assert within_ulps(math.exp(float(logp[0, 1] - new_old[0, 1])), f32_exp([-120.0, 0.3])[1])


def test_three_quarters_on_a_float32_rounded_bound_for_float32_inputs():
    """``_on_clip_bound`` mutmut_18 / 20-24: with float32 inputs the ratio sits on float32(1.2) and
    float32(0.8) (float32(1.2) > 1.2 > float32(1.2) - ulp), so under ``clip_bound_tie="three_quarters"``
    those two tokens, and no other, get 3/4 of the gradient; the same under a float64 default dtype
    (the bounds rounded to float32 explicitly)."""
    xs = [float32_tie(1.2), 0.05, float32_tie(0.8)]
    conv = Convention(clip_bound_tie="three_quarters")
    for default in (torch.float32, torch.float64):
        logp, old, adv, mask = batch(xs, [0.5])
        logp.requires_grad_(True)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(default)
        try:
            evaluated_ratio_logp(logp, old, adv, mask, PPO, conv, torch.float32).sum().backward()
        finally:
            torch.set_default_dtype(previous)
        assert logp.grad[0].tolist() == [0.75, 1.0, 0.75]


def test_three_quarters_on_a_gspo_token_row_whose_sequence_ratio_is_on_a_bound():
    """``_gspo_token_bound_ties`` mutmut_8 (old_logp not 0: logp - old, not + old), 12 (the mean, not
    the sum times the length, of a row of two tokens), 32 (one flag per row: two rows of three
    tokens), 42 (a row off the bounds keeps its gradient): the upper bound is this machine's
    exp(0.25) (taken as the kit takes it, over the rows' mean log-ratios), so row 0's
    s = exp((0.25 + 0.25) / 2) sits on it exactly."""
    e = float(torch.exp(torch.tensor([0.25, (0.01 + 0.02 + 0.03) / 3], dtype=torch.float64))[0])
    variant = dataclasses.replace(PPO, ratio="gspo_token", eps_high=e - 1.0)  # 1 + (e - 1) == e exactly
    old = torch.tensor([[-0.25, -0.25, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    logp = torch.tensor([[0.0, 0.0, 0.0], [0.01, 0.02, 0.03]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([0.5, -0.5], dtype=torch.float64)
    conv = Convention(clip_bound_tie="three_quarters")
    evaluated_ratio_logp(logp, old, adv, mask, variant, conv, torch.float64).sum().backward()
    assert logp.grad.tolist() == [[0.75, 0.75, 1.0], [1.0, 1.0, 1.0]]


def test_float64_ties_on_the_dual_clip_and_on_a_bound_that_is_also_the_dual_clip():
    """``evaluated_ratio_logp`` mutmut_38 / 39 (a float64 ratio exactly on the dual clip c is halved
    under ``dual_clip_tie="half"``), 40 (a variant without a dual clip: logp as it is), 135 (c = 1 +
    eps_high: a token on both gets 3/4 of the halved gradient). Each bound is this machine's float64
    ``exp`` of the token's log-ratio, taken over the same row."""
    half = Convention(dual_clip_tie="half")
    logp, old, adv, mask = batch([1.1, 0.05], [-0.5])
    c = float(torch.exp(logp)[0, 0])
    assert evaluated_ratio_logp(logp, old, adv, mask, PPO, half, torch.float64) is logp
    logp.requires_grad_(True)
    dual = dataclasses.replace(PPO, dual_clip=c)
    evaluated_ratio_logp(logp, old, adv, mask, dual, half, torch.float64).sum().backward()
    assert logp.grad[0].tolist() == [0.5, 1.0]
    logp, old, adv, mask = batch([0.25, 0.05], [-0.5])
    e = float(torch.exp(logp)[0, 0])
    both = dataclasses.replace(PPO, eps_high=e - 1.0, dual_clip=e)  # 1 + (e - 1) == e exactly
    logp.requires_grad_(True)
    conv = Convention(dual_clip_tie="half", clip_bound_tie="three_quarters")
    evaluated_ratio_logp(logp, old, adv, mask, both, conv, torch.float64).sum().backward()
    assert logp.grad[0].tolist() == [0.375, 1.0]

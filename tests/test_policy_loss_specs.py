"""The sympy proofs of specs/policy_losses.md section 6 and errata.md entries 13 and 14."""

from __future__ import annotations

import dataclasses

import pytest
import sympy as sp

import specs.policy_losses as spec
from refimpl.losses import DR_GRPO, PRESETS
from tests.test_policy_loss_reference import to_spec


def test_min_clip_identity():
    """md eq. (14): min(r a, clip(r, 1-e, 1+e) a) = min(r a, (1 + sgn(a) e) a)."""
    assert spec.prove_min_clip_identity()


def test_inclusive_gate_piecewise_equals_the_literal_min_clip_and_dual_clip():
    assert spec.prove_piecewise_gate_equals_min_clip()
    assert spec.prove_piecewise_gate_equals_min_clip(eps_low=0.25, eps_high=0.5, dual_clip=2.5)


def test_sapo_gate_derivative_and_the_120_erratum():
    """md eq. (15): d f / d r = 4 sigma (1 - sigma) = sech^2(tau (r - 1) / 2); the printed (errata.md entry
    14)
    printed right-hand side 2 (tau / 2 (r - 1)) is not it (it is 0 at r = 1, the gate is 1)."""
    assert spec.prove_sapo_gate_derivative()
    r, tau = sp.symbols("r tau", positive=True)
    derivative = sp.diff(4 / tau / (1 + sp.exp(-tau * (r - 1))), r)
    garbled = 2 * (tau / 2 * (r - 1))
    assert garbled.subs(r, 1) == 0 and sp.simplify(derivative.subs(r, 1)) == 1


def test_gspo_gradient_110_111():
    assert spec.prove_gspo_gradient(1) and spec.prove_gspo_gradient(4)


def test_erratum_116_derivative_of_the_clipped_term_is_a_times_the_gate():
    """The derivative of the clipped term is A g_hard, not g_hard (errata.md entry 13). The spec's term (md
    eq. (6))
    differentiates to A g_hard, with the inclusive gate exactly on each boundary."""
    r = sp.Symbol("r", positive=True)
    e = sp.Rational(1, 5)
    for a in (sp.Integer(3), sp.Integer(-3)):
        d = sp.diff(spec.hard_clip_term(r, a, e, e, None), r)
        for point in (sp.Rational(1, 2), 1 - e, sp.Integer(1), 1 + e, sp.Integer(2)):
            g_hard = int(bool(a > 0 and point <= 1 + e) or bool(a <= 0 and point >= 1 - e))
            assert d.subs(r, point) == a * g_hard, (a, point)
            if g_hard:
                assert d.subs(r, point) != g_hard  # the printed form (errata.md entry 13) is off by the
                # factor A


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_surrogate_gradient_at_ratio_one_is_the_policy_gradient_term(name):
    v = PRESETS[name] if name != "dr_grpo" else dataclasses.replace(DR_GRPO, max_length=5)
    assert spec.prove_gradient_at_ratio_one(to_spec(v), (2, 1, 0, 3))


def test_gradient_at_ratio_one_check_can_fail():
    """The check is not vacuous: r = 1 on a zero-width band still passes (inclusive gate), but a
    SAPO shaping function scaled by 2 (gate 2 at r = 1) fails it."""
    assert spec.prove_gradient_at_ratio_one(spec.LossSpec(eps_low=0.0, eps_high=0.0))
    original = spec.sapo_term
    try:
        spec.sapo_term = lambda r, a, tp, tn: 2 * original(r, a, tp, tn)
        spec.build_policy_loss.cache_clear()
        with pytest.raises(AssertionError):
            spec.prove_gradient_at_ratio_one(spec.LossSpec(gate="sapo"), (1, 2))
    finally:
        spec.sapo_term = original
        spec.build_policy_loss.cache_clear()


def test_spec_grpo_matches_a_hand_written_two_sequence_case():
    """Shao et al. 2024, eq. (3), by hand: 1/G sum_i 1/T_i sum_t min(r A, clip(r) A), G = 2, T = (2, 1)."""
    grpo = spec.LossSpec(eps_low=0.25, eps_high=0.25, aggregation="seq_mean_token_mean")
    built = spec.build_policy_loss(grpo, (2, 1))
    values = {"logp": [[sp.log(sp.Rational(3, 2)), sp.Integer(0)], [sp.log(sp.Rational(1, 2))]],
              "old_logp": [[0, 0], [0]], "advantages": [sp.Integer(2), sp.Integer(-1)]}
    loss, grad, _ = spec.evaluate(built, values)
    # seq 0: r = (3/2, 1), A = 2 -> (min(3, 2.5) + 2) / 2 = 2.25; seq 1: r = 1/2, A = -1 -> -0.75
    assert abs(loss - (-(sp.Rational(9, 4) + sp.Rational(-3, 4)) / 2)) < sp.Float("1e-45")
    # gradients: token (0,0) clipped -> 0; (0,1): -A r / (T G) = -2 / 4; (1,0) clipped -> 0
    assert grad[0][0] == 0 and abs(grad[0][1] + sp.Rational(1, 2)) < 1e-45 and grad[1][0] == 0

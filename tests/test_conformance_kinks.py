"""The judge's subdifferential at the objective's kinks (specs/policy_losses.md section 3,
``refimpl.conformance.kinks``): at a ratio exactly on a kink (a clip bound on the side that closes the
gate, the dual clip, GMPO's log-space bound) a gradient between the two one-sided derivatives passes
with a note naming the kink; one just outside fails; a tie that is no kink (the other sign's bound) and
a case with no kink (CISPO's clip inside its stop-gradient, an ordinary case) never get the note."""

from __future__ import annotations

import dataclasses

import torch

from refimpl.conformance.conventions import Convention
from refimpl.conformance.expected import expected_policy_loss
from refimpl.conformance.kinks import KINKS, TIE_NOTE, kink_entries
from refimpl.conformance.policy_cases import policy_loss_cases
from refimpl.conformance.policy_check import judge_policy
from refimpl.losses import get_preset

REF = Convention()
DAPO = get_preset("dapo")
PPO_DUAL = dataclasses.replace(get_preset("ppo"), dual_clip=3.0)
UPPER = "a subgradient at the upper clip bound 1 + eps_high (policy_losses.md eq. (6))"
LOWER = "a subgradient at the lower clip bound 1 - eps_low (policy_losses.md eq. (6))"


def _case(variant, case_class="on_boundary", index=0):
    return next(c for c in policy_loss_cases(variant, REF, classes=(case_class,)) if c.index == index)


def _judged(case, variant, got_grad, conv=REF):
    loss, grad = expected_policy_loss(case, variant, conv)
    return judge_policy(case, loss, got_grad, loss, grad, variant, conv, 1e-8)[2:]


def _scaled_at(case, variant, entries, scale):
    """The spec's gradient with the policy term of ``entries`` scaled (its KL part kept)."""
    _, grad = expected_policy_loss(case, variant, REF)
    adv = case.advantages.clone()
    adv[entries.any(dim=-1)] = 0.0
    _, closed = expected_policy_loss(dataclasses.replace(case, advantages=adv), variant, REF)
    return torch.where(entries, closed + scale * (grad - closed), grad)


def test_clip_bounds_on_the_closing_side_are_kinks_the_other_side_is_not():
    positive, negative = _case(DAPO, index=0), _case(DAPO, index=1)  # A > 0 / A < 0 on every row
    up = kink_entries(positive, DAPO, torch.float64)
    low = kink_entries(negative, DAPO, torch.float64)
    assert set(up) == {"upper"} and set(low) == {"lower"}
    assert int(up["upper"].sum()) == 2 and int(low["lower"].sum()) == 2  # one token per row on it
    # both cases hold a token on each bound: the lower one with A > 0, the upper one with A < 0 too
    x = torch.where(positive.mask, positive.logp - positive.old_logp, 0.0).exp()
    assert int((x == 1.0 - DAPO.eps_low).sum()) == 2


def test_a_gradient_inside_the_clip_bounds_subdifferential_passes_with_the_note_outside_fails():
    for index, note in ((0, UPPER), (1, LOWER)):
        case = _case(DAPO, index=index)
        (kink,) = kink_entries(case, DAPO, torch.float64).values()
        for scale in (0.75, 0.0, 0.5):  # jnp.clip + jnp.maximum's 3/4, the closed side, torch.min's half
            assert _judged(case, DAPO, _scaled_at(case, DAPO, kink, scale)) == (True, True, note)
        assert _judged(case, DAPO, _scaled_at(case, DAPO, kink, 1.0)) == (True, True, None)  # the spec's
        for scale in (1.0 + 1e-6, -1e-6):  # just outside [0, 1] of the term's gradient
            assert _judged(case, DAPO, _scaled_at(case, DAPO, kink, scale))[1] is False


def test_a_tie_that_is_no_kink_keeps_its_unique_derivative():
    """A > 0 at r = 1 - eps_low: min(r A, clip(r) A) = r A on both sides, derivative A r only."""
    case = _case(DAPO, index=0)
    x = torch.where(case.mask, case.logp - case.old_logp, 0.0).exp()
    no_kink = case.mask & (x == 1.0 - DAPO.eps_low)
    assert bool(no_kink.any())
    assert _judged(case, DAPO, _scaled_at(case, DAPO, no_kink, 0.75))[1] is False


def test_the_dual_clip_and_a_sequence_unit_are_kinks_too():
    case = _case(PPO_DUAL, "dual_clip_tie")
    (dual,) = kink_entries(case, PPO_DUAL, torch.float32).values()
    assert _judged(case, PPO_DUAL, _scaled_at(case, PPO_DUAL, dual, 0.5)) == (True, True, TIE_NOTE)
    assert TIE_NOTE == "a subgradient at the dual-clip tie (policy_losses.md eq. (7))"
    gspo = get_preset("gspo")
    case = _case(gspo, index=0)
    kinks = kink_entries(case, gspo, torch.float64)
    assert set(kinks) == {"upper"}  # the length-1 row on 1 + eps_high (A > 0): every token of its unit
    assert _judged(case, gspo, _scaled_at(case, gspo, kinks["upper"], 0.25)) == (True, True, UPPER)
    assert _judged(case, gspo, _scaled_at(case, gspo, kinks["upper"], 1.5))[1] is False


def test_gmpo_log_space_bound_is_a_kink():
    gmpo = dataclasses.replace(get_preset("gspo"), gate="log_clip", eps_low=0.2, eps_high=0.3)
    case = _case(gmpo, "inside_clip")
    assert bool(case.mask[0, 0])
    logp, old = case.logp.clone(), case.old_logp.clone()
    old[0, 0], logp[0, 0] = 0.0, (0.3 if float(case.advantages[0]) > 0 else -0.2)  # l exactly on its bound
    case = dataclasses.replace(case, logp=logp, old_logp=old)
    kinks = kink_entries(case, gmpo, torch.float64)
    (name,) = kinks
    assert name in ("log_upper", "log_lower") and int(kinks[name].sum()) == 1  # the token, not its row
    (_, _, note) = _judged(case, gmpo, _scaled_at(case, gmpo, kinks[name], 0.5))
    assert note == f"a subgradient at {KINKS[name][0]} (policy_losses.md eq. (18))"
    assert _judged(case, gmpo, _scaled_at(case, gmpo, kinks[name], -0.01))[1] is False


def test_no_kink_no_note():
    cispo = get_preset("cispo")
    case = _case(cispo, index=0)  # ratios on CISPO's bounds: inside the stop-gradient, no kink
    assert kink_entries(case, cispo, torch.float64) == {}
    _, grad = expected_policy_loss(case, cispo, REF)
    assert _judged(case, cispo, 0.75 * grad)[1:] == (False, None)
    case = _case(DAPO, "inside_clip")
    assert kink_entries(case, DAPO, torch.float32) == {}
    _, grad = expected_policy_loss(case, DAPO, REF)
    assert _judged(case, DAPO, 0.75 * grad)[1:] == (False, None)

"""The token-level group-advantage flags (``token_groups.expected_advantages``) against exact forms:
token weighting is the spec (specs/advantages.py, advantages.md eq. (1)-(5)) with each response
counted once per token, the leave-one-out units and the trailing partial group are their closed forms
in rationals."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest
import torch

from refimpl.conformance.case_types import AdvantageCase
from refimpl.conformance.conventions import Convention
from refimpl.conformance.token_groups import expected_advantages, trailing_partial_block
from specs.advantages import group_advantages_float64

REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 1.0, 0.0, 0.25]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1]
LENGTHS = [3, 1, 2, 5, 4, 1, 2, 6]
CASE = AdvantageCase("ragged_lengths", 0, torch.tensor(REWARDS, dtype=torch.float64), torch.tensor(GROUPS),
                     torch.tensor(LENGTHS))
TOL = 1e-12  # float64 sums of 8-20 terms of magnitude <= 2 (a few units of 2^-52, relative)


def test_token_weighting_is_the_spec_with_each_response_counted_once_per_token():
    conv = Convention(adv_weighting="token", adv_std="sample", adv_eps=1e-5, adv_eps_inside_sqrt=False)
    got = expected_advantages(CASE, conv)
    tokens = [r for r, t in zip(REWARDS, LENGTHS, strict=True) for _ in range(t)]
    ids = [g for g, t in zip(GROUPS, LENGTHS, strict=True) for _ in range(t)]
    spec = group_advantages_float64(tokens, ids, scale="group", singleton="zero", std="sample", eps=1e-5,
                                    eps_inside_sqrt=False, zero_variance="zero")
    first = [sum(LENGTHS[:i]) for i in range(len(LENGTHS))]
    assert torch.allclose(got, torch.tensor([spec[i] for i in first], dtype=torch.float64), rtol=0, atol=TOL)
    response = expected_advantages(CASE, dataclasses.replace(conv, adv_weighting="response"))
    assert (got - response).abs().max() > 0.1  # unequal lengths: the weighting matters


@pytest.mark.parametrize("unit", ["token", "response"])
def test_leave_one_out_under_token_weighting_leaves_out_its_unit(unit):
    conv = Convention(adv_scale="none", adv_leave_one_out=True, adv_weighting="token",
                      adv_leave_one_out_unit=unit)
    got = expected_advantages(CASE, conv)
    exact = []
    for i, (r, g, t) in enumerate(zip(REWARDS, GROUPS, LENGTHS, strict=True)):
        members = [j for j in range(len(GROUPS)) if GROUPS[j] == g]
        total = sum(Fraction(LENGTHS[j]) * Fraction(REWARDS[j]) for j in members)
        count = sum(LENGTHS[j] for j in members)
        left = 1 if unit == "token" else t  # one token, or the whole response
        exact.append(float(Fraction(r) - (total - left * Fraction(r)) / (count - left)))
        del i
    assert torch.allclose(got, torch.tensor(exact, dtype=torch.float64), rtol=0, atol=TOL)
    # with one token per response both units are RLOO (advantages.md eq. (2))
    ones = dataclasses.replace(CASE, lengths=None)
    spec = group_advantages_float64(REWARDS, GROUPS, scale="none", singleton="zero", leave_one_out=True)
    assert torch.allclose(expected_advantages(ones, conv), torch.tensor(spec, dtype=torch.float64), rtol=0,
                          atol=TOL)


def test_a_trailing_partial_group_left_unnormalised_is_divided_by_eps():
    rewards = torch.tensor([1.0, 0.0, 0.25, 0.5, 0.75, -0.5], dtype=torch.float64)
    ids = torch.tensor([0, 0, 0, 1, 1, 1])
    assert trailing_partial_block(ids) is None

    assert trailing_partial_block(torch.tensor([4, 4, 4, 2, 2, 2, 9])) == 6
    assert trailing_partial_block(torch.tensor([4, 4, 2, 2, 4])) is None  # not contiguous
    case = AdvantageCase("partial_group", 0, torch.cat([rewards, torch.tensor([2.0], dtype=torch.float64)]),
                         torch.tensor([4, 4, 4, 2, 2, 2, 9]))
    conv = Convention(adv_std="sample", adv_eps=1e-5, adv_eps_inside_sqrt=False,
                      adv_trailing_partial="unnormalised")
    got = expected_advantages(case, conv)
    spec = group_advantages_float64(rewards.tolist(), [4, 4, 4, 2, 2, 2], scale="group", singleton="zero",
                                    std="sample", eps=1e-5, eps_inside_sqrt=False, zero_variance="zero")
    assert torch.allclose(got[:6], torch.tensor(spec, dtype=torch.float64), rtol=0, atol=TOL)
    assert got[6].item() == 2.0 / 1e-5
    centred = expected_advantages(case, dataclasses.replace(conv, adv_scale="none"))
    assert centred[6].item() == 2.0  # mean 0 and no scale: R
    assert expected_advantages(case, dataclasses.replace(conv, adv_trailing_partial="group"))[6].item() == 0.0


def test_output_float32_rounds_the_float64_advantages():
    conv = Convention(adv_weighting="token")
    rounded = expected_advantages(CASE, dataclasses.replace(conv, adv_output_float32=True))
    assert torch.equal(rounded, expected_advantages(CASE, conv).to(torch.float32).double())


def test_flags_refuse_unknown_values_in_one_line():
    for flag in ("adv_weighting", "adv_leave_one_out_unit", "adv_trailing_partial"):
        with pytest.raises(ValueError, match=f"convention.{flag} must be one of"):
            Convention(**{flag: "sideways"})

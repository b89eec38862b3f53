"""The policy-loss case classes are what their names and docstrings say (issue 31):
``refimpl.conformance.policy_cases``, for a token-level, a sequence-level and an ungated variant.
Each property is the class's promise (inside / outside the band, ragged lengths, empty rows, groups,
micro-batch partitions, NaN / inf at every masked position), so a changed generator that breaks the
promise fails here."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from refimpl.conformance.case_types import POLICY_CASE_CLASSES, clip_bounds
from refimpl.conformance.conventions import Convention
from refimpl.conformance.policy_cases import policy_loss_cases
from refimpl.losses import PolicyLossVariant, get_preset

VARIANTS = {
    "dapo": get_preset("dapo"),
    "gspo": get_preset("gspo"),
    "none": PolicyLossVariant(gate="none", eps_low=None, eps_high=None),
    "upper": dataclasses.replace(get_preset("dapo"), eps_low=None),
    "lower": dataclasses.replace(get_preset("dapo"), eps_high=None),
    "gspo_narrow": dataclasses.replace(get_preset("gspo"), eps_low=0.05, eps_high=0.05),
}


def cases_of(name, *classes, kl=0.0, seed=0):
    v = dataclasses.replace(VARIANTS[name], kl_coef=kl)
    return policy_loss_cases(v, Convention(), seed=seed, classes=classes)


def band(name):
    lower, upper, _ = clip_bounds(VARIANTS[name])
    return (math.log(lower) if lower else -0.5), (math.log(upper) if upper else 0.5)


def units(case, sequence: bool) -> list[float]:
    """The log-ratios that count: per token, or each non-empty row's mean (sequence level)."""
    x = torch.where(case.mask, case.logp.double() - case.old_logp.double(), 0.0)
    if sequence:
        lengths = case.mask.sum(-1)
        return (x.sum(-1)[lengths > 0] / lengths[lengths > 0]).tolist()
    return x[case.mask].tolist()


def lengths(case):
    return case.mask.sum(-1).tolist()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_inside_clip_is_inside_the_band_with_a_margin(name):
    (case,) = cases_of(name, "inside_clip")
    lo, hi = band(name)
    margin = 0.15 * (hi - lo)
    sequence = VARIANTS[name].sequence_level
    assert all(lo + margin - 1e-12 <= x <= hi - margin + 1e-12 for x in units(case, sequence))
    assert lengths(case) == [4, 3, 5, 2] and case.case_id == "inside_clip/0"
    assert {math.copysign(1, a) for a in case.advantages.tolist()} == {1.0, -1.0}
    if sequence:  # the tokens of a row spread around its mean, by at most 0.2 of the band
        x = (case.logp - case.old_logp)[0, :4]
        assert 0.01 * (hi - lo) < float(x.max() - x.min()) <= 0.4 * (hi - lo) + 1e-12


@pytest.mark.parametrize("name", list(VARIANTS))
def test_outside_clip_is_beyond_the_bounds_on_both_sides(name):
    cases = cases_of(name, "outside_clip")
    assert [c.case_id for c in cases] == ["outside_clip/0", "outside_clip/1"]
    lo, hi = band(name)
    sequence = VARIANTS[name].sequence_level
    for case in cases:
        xs = units(case, sequence)
        assert all(x > hi or x < lo for x in xs)
        assert any(x > hi + 0.04 for x in xs) and any(x < lo - 0.04 for x in xs)
        assert all(x < hi + 0.81 and x > lo - 0.81 for x in xs)
        assert {math.copysign(1, a) for a in case.advantages.tolist()} == {1.0, -1.0}
        assert lengths(case) == [3, 4, 2, 3]
    assert cases[0].advantages.tolist() != cases[1].advantages.tolist()


def test_extreme_log_ratios_reach_50_in_both_directions():
    for name in ("dapo", "gspo"):
        cases = cases_of(name, "extreme_log_ratio")
        assert [c.case_id for c in cases] == ["extreme_log_ratio/0", "extreme_log_ratio/1"]
        for case in cases:
            xs = units(case, False)
            assert max(xs) == 50.0 and min(xs) in (-50.0,) and lengths(case) == [3, 2, 4, 1]
            assert {math.copysign(1, a) for a in case.advantages.tolist()} == {1.0, -1.0}


def test_ragged_and_empty_rows():
    ragged = cases_of("dapo", "ragged")
    assert [lengths(c) for c in ragged] == [[1, 6, 3, 2, 5, 4], [7, 1, 1, 4]]
    empty = cases_of("dapo", "empty_rows")
    assert [lengths(c) for c in empty] == [[3, 0, 5, 2], [0, 4, 0, 1, 2, 0]]
    lo, hi = band("dapo")
    for case in ragged + empty:  # mixed: inside and outside the band, within 0.3 of it
        xs = units(case, False)
        assert all(lo - 0.3 <= x <= hi + 0.3 for x in xs)
        assert all(abs(a) <= 1.5 for a in case.advantages.tolist())
    assert [c.index for c in empty] == [0, 1]


def test_group_cases_carry_their_groups_and_the_advantages_of_them():
    zero = cases_of("dapo", "zero_variance_group")
    assert [c.group_ids.tolist() for c in zero] == [[0, 0, 0, 1, 1, 1], [5, 5, 7, 7]]
    assert zero[0].advantages[:3].tolist() == [0.0, 0.0, 0.0] and zero[1].advantages.tolist() == [0.0] * 4
    assert zero[0].rewards.tolist() == [1.0, 1.0, 1.0, 0.0, 1.0, 0.5]
    # group 1 of case 0: rewards 0, 1, 0.5: mean 0.5, population std sqrt(1/6)
    std = math.sqrt(1 / 6 + 1e-6)
    want = [-0.5 / std, 0.5 / std, 0.0]
    assert zero[0].advantages[3:].tolist() == pytest.approx(want, rel=1e-12, abs=1e-15)
    single = cases_of("dapo", "singleton_group")
    assert [c.group_ids.tolist() for c in single] == [[0, 1, 1, 2, 2], [3, 1, 2]]
    assert single[1].advantages.tolist() == [0.0, 0.0, 0.0] and single[0].advantages[0] == 0.0
    assert [lengths(c) for c in single] == [[2, 5, 4, 3, 2], [2, 5, 4]]
    sample = policy_loss_cases(VARIANTS["dapo"], Convention(adv_std="sample"),
                               classes=("zero_variance_group",))
    std = math.sqrt(1 / 4 + 1e-6)
    assert sample[0].advantages[3:].tolist() == pytest.approx([-0.5 / std, 0.5 / std, 0.0], rel=1e-12,
                                                              abs=1e-15)


@pytest.mark.parametrize("name", ["dapo", "gspo", "gspo_narrow"])
def test_half_cases_keep_away_from_the_bounds(name):
    """Also for bounds inside the drawn range (GSPO with eps 0.05: sequence means of draws in
    [-0.6, 0.6] often fall within 0.01 of log(1 +- 0.05)), where draws are rejected."""
    lower, upper, _ = clip_bounds(VARIANTS[name])
    bounds = [math.log(b) for b in (lower, upper)]
    for cls, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        (case,) = cases_of(name, cls)
        assert case.logp.dtype == case.old_logp.dtype == case.advantages.dtype == dtype
        assert case.note == f"inputs rounded to {dtype}" and lengths(case) == [5, 3, 6, 2]
        xs = units(case, VARIANTS[name].sequence_level)
        assert all(abs(x - b) > 0.01 for x in xs for b in bounds)
        assert all(abs(x) <= 0.7 for x in units(case, False))


def test_micro_batches_partition_the_rows():
    micro = cases_of("dapo", "micro_batch")
    assert [c.micro_batches for c in micro] == [((0, 1), (2, 3), (4, 5)), ((0, 1), (2, 3))]
    assert [lengths(c) for c in micro] == [[3, 5, 0, 2, 4, 1], [6, 1, 2, 2]]
    padding = cases_of("dapo", "padding_micro_batch")
    assert [c.micro_batches for c in padding] == [((0, 1), (2, 3), (4, 5)), ((0, 1), (2,))]
    assert [lengths(c) for c in padding] == [[3, 2, 0, 0, 4, 1], [2, 5, 0]]


def test_the_kl_case_has_reference_log_ratios_up_to_24():
    assert cases_of("dapo", "kl_penalty") == []  # only with a KL term
    (case,) = cases_of("dapo", "kl_penalty", kl=0.1)
    log_r = torch.where(case.mask, case.ref_logp - case.logp, 0.0)
    assert float(log_r[0, 0]) == pytest.approx(24.0, abs=1e-12) and float(log_r[2, 1]) == pytest.approx(
        -22.0, abs=1e-12)
    others = log_r.clone()
    others[0, 0] = others[2, 1] = 0.0
    assert float(others.abs().max()) < 2.0 and lengths(case) == [3, 2, 4, 1]


@pytest.mark.parametrize("kl", [0.0, 0.1])
def test_masked_nonfinite_holds_nan_and_inf_at_every_masked_position(kl):
    cases = cases_of("dapo", "masked_nonfinite", kl=kl)
    assert len(cases) == (4 if kl else 3)
    fills = []
    for case in cases[:3]:
        pad = ~case.mask
        for x in (case.logp, case.old_logp) + ((case.ref_logp,) if kl else ()):
            assert bool((~torch.isfinite(x[pad])).all()) and bool(torch.isfinite(x[case.mask]).all())
        fills.append(float(case.logp[pad][0]))
    assert math.isnan(fills[0]) and fills[1:] == [math.inf, -math.inf]
    assert lengths(cases[0]) == [3, 0, 4, 2]
    if kl:
        last = cases[3]
        assert bool(torch.isnan(last.ref_logp[~last.mask]).all()) and bool(torch.isfinite(last.logp).all())
        assert bool(torch.isfinite(last.old_logp).all())
    else:
        assert all(c.ref_logp is None for c in cases)


def test_every_case_with_a_kl_term_has_reference_log_probs_and_ids_are_unique():
    cases = policy_loss_cases(dataclasses.replace(VARIANTS["dapo"], kl_coef=0.1), Convention())
    assert all(c.ref_logp is not None for c in cases)
    ids = [c.case_id for c in cases]
    assert len(ids) == len(set(ids))
    classes = {c.case_class for c in cases}
    assert classes == set(POLICY_CASE_CLASSES) - {"golden_vectors", "dual_clip_tie"}
    for case in cases:  # a drawn reference: within 0.6 of old_logp where it counts, junk -3 elsewhere
        if case.case_class in ("kl_penalty", "masked_nonfinite", "zero_rows"):
            continue
        if case.case_class == "ratio_overflow":  # the reference is the policy there: k3 = 0
            assert torch.equal(torch.where(case.mask, case.ref_logp, 0), torch.where(case.mask, case.logp, 0))
            continue
        gap = torch.where(case.mask, (case.ref_logp.double() - case.old_logp.double()).abs(), 0.0)
        assert float(gap.max()) <= 0.6 + 1e-2, case.case_id
        assert bool((case.ref_logp[~case.mask] == -3.0).all()), case.case_id


def test_the_seed_draws_other_cases_and_unknown_classes_are_refused():
    a, b = cases_of("dapo", "ragged", seed=0), cases_of("dapo", "ragged", seed=1)
    assert not torch.equal(a[0].logp, b[0].logp)
    assert [c.case_class for c in policy_loss_cases(VARIANTS["dapo"], Convention())][:2] == ["inside_clip",
                                                                                             "outside_clip"]
    with pytest.raises(ValueError, match=r"^unknown case classes \['nope'\]; valid: \('inside_clip', "):
        policy_loss_cases(VARIANTS["dapo"], Convention(), classes=("nope", "ragged"))


@pytest.mark.parametrize("name", ["dapo", "gspo"])
def test_case_ids_count_from_zero_in_each_class_and_notes_say_what_is_special(name):
    v = dataclasses.replace(VARIANTS[name], kl_coef=0.1)
    by_class = {}
    for case in policy_loss_cases(v, Convention()):
        by_class.setdefault(case.case_class, []).append(case)
    for cls, cases in by_class.items():
        assert [c.index for c in cases] == list(range(len(cases))), cls
    notes = {cls: [c.note for c in cases] for cls, cases in by_class.items()}
    assert notes["micro_batch"] == ["3 micro-batches of 2 rows; global normaliser",
                                    "2 micro-batches, very different token counts"]
    assert notes["padding_micro_batch"] == ["3 micro-batches; the second is all padding",
                                            "2 micro-batches; the last is one empty row"]
    assert notes["kl_penalty"] == ["ref log-ratios up to |24|"]
    assert notes["masked_nonfinite"] == [f"{label} at every masked position of logp, old_logp, ref_logp"
                                         for label in ("NaN", "+inf", "-inf")] + [
        "NaN at the masked positions of ref_logp only"]
    assert notes["inside_clip"] == [""] and notes["ragged"] == ["", ""]


@pytest.mark.parametrize("name", ["dapo", "gspo"])
def test_the_boundary_cases_are_one_batch_with_both_advantage_signs(name):
    first, second = cases_of(name, "on_boundary")
    assert second.advantages.tolist() == [-a for a in first.advantages.tolist()]
    assert torch.equal(first.mask, second.mask)
    signs = {math.copysign(1, a) for a in first.advantages.tolist()}
    assert signs == ({1.0, -1.0} if VARIANTS[name].sequence_level else {1.0})  # GSPO: a filler row of -A


def test_a_case_id_always_denotes_the_same_tensors():
    """``policy_cases._micro`` mutmut_49 / 81 / 97, ``policy_loss_cases`` mutmut_105 / 133 / 265 (and
    the like): every row of every class is drawn from the case's own seeded generator, never from
    torch's global one (case_types.py: a case id always denotes the same data)."""
    conv = Convention()
    variant = dataclasses.replace(get_preset("dapo"), kl_coef=0.1)
    first = policy_loss_cases(variant, conv)
    torch.manual_seed(12345)
    torch.rand(7)
    second = policy_loss_cases(variant, conv)
    for a, b in zip(first, second, strict=True):
        assert a.case_id == b.case_id and torch.equal(a.mask, b.mask)
        for x, y in ((a.logp, b.logp), (a.old_logp, b.old_logp), (a.advantages, b.advantages)):
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)  # bitwise, NaN padding too


def test_half_precision_draws_give_up_with_a_one_line_error(monkeypatch):
    """``policy_cases._half`` mutmut_27 (101 tries), 102-104 (the message): when every draw puts the
    log-ratios on a clip bound (here each row drawn as log 0.8, DAPO's lower bound, within fp16's
    rounding of 0.002 after the cast), the class gives up after 100 draws of its 4 rows with a
    one-line error instead of returning a case on the boundary."""
    import refimpl.conformance.policy_cases as pc

    draws = []

    def on_the_bound(g, shape, low, high):
        draws.append(shape)
        return torch.full(shape, math.log(0.8), dtype=torch.float64)

    monkeypatch.setattr(pc, "_uniform", on_the_bound)
    message = r"^could not draw half-precision ratios away from the clip boundaries$"
    with pytest.raises(RuntimeError, match=message):
        cases_of("dapo", "fp16")
    assert len(draws) == 100 * 4

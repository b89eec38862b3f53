"""The overlong reward-shaping kind (refimpl/conformance/kinds/overlong.py): its expected values are
DAPO's soft overlong punishment (advantages.md eq. (8), Yu et al. 2025, section 3.4) written here in
rationals, the spec passes its own check, a ramp without its floor fails exactly the classes past
``max_len`` and is attributed to ``overlong_floor``."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from refimpl.advantages import overlong_penalty
from refimpl.conformance.kinds import attribute, get_kind, run_kind_check
from refimpl.conformance.kinds.overlong import OverlongFlags, expected_overlong

KIND = get_kind("overlong")


def _eq8(length: int, max_len: int, cache_len: int, floor: bool) -> Fraction:
    """eq. (8): 0, then (L_max - L_cache - L) / L_cache, then -1 (or the ramp, without the floor)."""
    ramp = Fraction(max_len - cache_len - length, cache_len)
    if length <= max_len - cache_len:
        return Fraction(0)
    return Fraction(-1) if floor and length > max_len else ramp


@pytest.mark.parametrize("floor", ["minus_one", "none"])
def test_expected_values_are_eq_8_exactly(floor):
    for case in KIND.cases(0):
        p = case.params
        got = expected_overlong(case, OverlongFlags(overlong_floor=floor))["penalties"].values
        want = [float(_eq8(int(n), p["max_len"], p["cache_len"], floor == "minus_one"))
                for n in case.inputs["lengths"]]
        # one float64 division of small integers: correctly rounded
        assert got.tolist() == want, case.case_id
        if floor == "minus_one":  # refimpl's overlong_penalty: the same values, rounded to float32
            spec = overlong_penalty(case.inputs["lengths"], p["max_len"], p["cache_len"])
            assert torch.equal(spec, got.float()), case.case_id


def test_the_spec_passes_and_a_ramp_without_floor_is_named():
    assert run_kind_check(KIND, overlong_penalty).ok

    def no_floor(lengths, *, max_len, cache_len):
        return (((max_len - cache_len) - lengths.double()) / cache_len).clamp(max=0.0)

    report = run_kind_check(KIND, no_floor)
    assert report.failing_classes() == ["beyond_max_len", "cache_is_max_len"]
    named = attribute(report, {"overlong_floor": "none"},
                      lambda flags: run_kind_check(KIND, no_floor, flags))
    assert {r.explanation for r in named.results if not r.ok} == {"flag overlong_floor='none'"}


def test_unknown_floor_is_refused_in_one_line():
    with pytest.raises(ValueError, match="overlong_floor must be one of"):
        OverlongFlags(overlong_floor="minus_two")

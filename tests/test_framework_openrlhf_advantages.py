"""OpenRLHF's group advantages (driver modes group_norm, dr_grpo, rloo: compute_advantages_and_returns run
from the installed file) against the kit's expected values: every case class passes under each mode's
profile, each flag is needed, a group of one is refused in one line, and the reward clip and the float32
constant group of findings reward_clip_range and constant_group_rounding show through the driver's own
call. Expected values come from the reference (``expected_advantages``), never from OpenRLHF. Skipped when
OpenRLHF is not installed.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from refimpl.conformance.case_types import AdvantageCase
from refimpl.conformance.cases import advantage_cases
from refimpl.conformance.checks import check_framework_mode
from refimpl.conformance.conventions import convention_from_flags
from refimpl.conformance.frameworks import load_driver
from refimpl.conformance.simple_checks import run_advantage_check
from refimpl.conformance.token_groups import expected_advantages

pytestmark = pytest.mark.framework

driver = load_driver("openrlhf")
_WHY = driver.availability()
if _WHY is not None:
    pytest.skip(f"OpenRLHF driver unavailable: {_WHY}", allow_module_level=True)

_MODES = driver.modes("group_advantages")


def _run(name: str, rewards, ids) -> torch.Tensor:
    fn, adapter = driver.target("group_advantages", _MODES[name])
    return adapter(fn, torch.as_tensor(rewards), torch.as_tensor(ids))


def _failing(name: str, **flags) -> set[str]:
    """The case classes that fail when the mode's profile has ``flags`` changed."""
    mode = _MODES[name]
    conv = dataclasses.replace(convention_from_flags("openrlhf", dict(mode.convention)), **flags)
    fn, adapter = driver.target("group_advantages", mode)
    report = run_advantage_check(fn, conv, adapter=adapter, rtol=1e-8)
    return {r.case_class for r in report.results if not r.ok}


def test_the_modes_are_openrlhfs_group_estimators():
    assert sorted(_MODES) == ["dr_grpo", "group_norm", "rloo"]
    assert "reinforce_baseline" in driver.unsupported_modes("group_advantages")


@pytest.mark.parametrize("name", ["group_norm", "dr_grpo", "rloo"])
def test_every_case_class_passes_under_the_modes_profile(name):
    report = check_framework_mode(driver, _MODES[name], reference=False)
    assert report.ok, [r.case_class for r in report.results if not r.ok]
    assert len(report.results) == len(advantage_cases())


@pytest.mark.parametrize("name, flags, failing", [
    ("group_norm", {"adv_std": "population"}, "equal_groups"),
    ("group_norm", {"adv_eps": 1e-6}, "equal_groups"),  # std + 1e-6: a relative change of ~1e-6
    ("rloo", {"adv_leave_one_out": False}, "equal_groups"),
    ("dr_grpo", {"adv_singleton": "zero"}, "singleton_group"),  # the driver refuses, the spec gives 0
])
def test_every_flag_is_needed(name, flags, failing):
    assert failing in _failing(name, **flags)


@pytest.mark.parametrize("name", ["group_norm", "dr_grpo", "rloo"])
def test_a_group_of_one_is_refused_in_one_line(name):
    with pytest.raises(ValueError, match=r"requires n_samples_per_prompt > 1") as info:
        _run(name, [1.0, 0.0, 1.0], [0, 0, 1])
    assert "\n" not in str(info.value)


def test_interleaved_groups_of_unequal_sizes_are_one_call_per_group():
    rewards, ids = [0.0, 4.0, 1.0, 2.0, 6.0], [5, 2, 5, 5, 2]  # group 5: 0, 1, 2; group 2: 4, 6
    got = _run("dr_grpo", rewards, ids)
    assert got.tolist() == [-1.0, -1.0, 0.0, 1.0, 1.0]


def test_the_default_reward_clip_clips_the_advantage():
    # finding reward_clip_range: dr_grpo's centred rewards -15, 15 leave compute_reward as -10, 10
    assert _run("dr_grpo", [0.0, 30.0], [0, 0]).tolist() == [-10.0, 10.0]
    case = AdvantageCase("clip", 0, torch.tensor([0.0, 30.0], dtype=torch.float64), torch.tensor([0, 0]))
    conv = convention_from_flags("openrlhf", dict(_MODES["dr_grpo"].convention))
    assert expected_advantages(case, conv).tolist() == [-15.0, 15.0]


def test_a_float32_constant_group_gets_advantages_and_a_float64_one_none():
    # finding constant_group_rounding: eight rewards 0.1 in float32 (the trainer's dtype)
    one32 = _run("group_norm", torch.full((8,), 0.1, dtype=torch.float32), [0] * 8)
    one64 = _run("group_norm", torch.full((8,), 0.1, dtype=torch.float64), [0] * 8)
    assert bool((one32.abs() > 0.8).all()) and len(set(one32.tolist())) == 1
    assert float(one64.abs().max()) < 1e-6  # the float64 mean's rounding / 1e-9: ~1e-8


def test_the_overlong_penalty_is_dapos_with_max_new_tokens_set():
    from refimpl.conformance.frameworks.openrlhf.kinds import KIND_MODES, kind_target

    mode = next(m for m in KIND_MODES if m.kind == "overlong")
    assert check_framework_mode(driver, mode, reference=True).ok
    fn, adapter = kind_target(mode)
    got = adapter(fn, torch.tensor([15, 16, 20, 45]), max_len=20, cache_len=5)
    # -1 beyond max_len (exceed_len capped at the buffer); -1 / 5 added to a float32 reward of 0
    assert torch.equal(got, torch.tensor([0.0, -0.2, -1.0, -1.0], dtype=torch.float32))

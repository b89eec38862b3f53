"""The AReaL driver against the installed AReaL (1.0.4): every actor-loss mode passes every case
class under its own profile at float64's agreement except micro_batch, where the FSDP engine's float32
micro-batch weight (a departure no flag states yet) is reproduced exactly; each flag is needed; the
import leaves no stand-in behind.

Expected values come from our reference with the profile's flags, never from running AReaL.
Skipped with a message when AReaL is not installed.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from refimpl.conformance import (
    POLICY_CASE_CLASSES,
    check_group_advantages,
    check_policy_loss,
    policy_loss_cases,
)
from refimpl.conformance.checks import PolicyLossCall
from refimpl.conformance.conventions import convention_from_flags
from refimpl.conformance.expected import expected_policy_loss
from refimpl.conformance.frameworks import load_driver

pytestmark = pytest.mark.framework

driver = load_driver("areal")
_WHY = driver.availability()
if _WHY is not None:
    pytest.skip(f"AReaL driver unavailable: {_WHY}", allow_module_level=True)

_MODES = sorted(driver.modes())
_CLASSES = tuple(c for c in POLICY_CASE_CLASSES if c not in ("golden_vectors", "kl_penalty"))
F64_RTOL = 1e-12  # as tests/test_framework_openrlhf.py


def _conv(name, **flags):
    return dataclasses.replace(convention_from_flags("areal", driver.modes()[name].convention), **flags)


def _check(name, *, classes=_CLASSES, **flags):
    fn, adapter = driver.target("policy_loss", name)
    return check_policy_loss(fn, driver.mode_variant(name), convention=_conv(name, **flags), adapter=adapter,
                             classes=classes, rtol=F64_RTOL)


def test_driver_loads_functional_py_without_areals_package_or_stand_ins():
    files = driver.source_files()
    assert [f.name for f in files] == ["functional.py", "actor.py", "fsdp_engine.py", "critic.py"]
    fn, _ = driver.target("policy_loss", "ppo")
    assert fn.__name__ == "ppo_actor_loss_fn" and sys.modules[fn.__module__].__file__ == str(files[0])
    assert "areal" not in sys.modules and "areal.api.cli_args" not in sys.modules


@pytest.mark.parametrize("name", _MODES)
def test_mode_passes_every_case_class_but_micro_batch_under_its_profile(name):
    report = _check(name)
    assert set(report.failing_classes()) <= {"micro_batch"}, report.render()


@pytest.mark.parametrize("name", _MODES)
def test_micro_batches_are_token_means_weighted_in_float32(name):
    # the engine: loss_mb * (count_nonzero(mask_mb) / float32(N)) (fsdp_engine.py:2120); the expected
    # value is the reference's local token means with those float32 weights, to float64 agreement
    fn, adapter = driver.target("policy_loss", name)
    variant, conv = driver.mode_variant(name), _conv(name)
    if conv.fixed_aggregation:  # gspo, sapo: the token mean whatever the preset's aggregation
        variant = dataclasses.replace(variant, aggregation=conv.fixed_aggregation)
    for case in policy_loss_cases(variant, conv, classes=("micro_batch",)):
        total_tokens = int(case.mask.sum())
        logp = case.logp.clone().requires_grad_(True)
        got = exact = 0.0
        for k, rows in enumerate(case.micro_batches):
            i = torch.tensor(rows)
            part = dataclasses.replace(case, logp=case.logp[i], old_logp=case.old_logp[i],
                                       advantages=case.advantages[i], mask=case.mask[i],
                                       rewards=case.rewards[i], group_ids=case.group_ids[i],
                                       micro_batches=None)
            local, _ = expected_policy_loss(part, variant, conv)
            weight = torch.tensor(int(part.mask.sum()), dtype=torch.int64) / torch.tensor(
                float(total_tokens), dtype=torch.float32)
            exact = exact + float(local) * float(weight)
            call = PolicyLossCall(logp[i], part.old_logp, part.advantages, part.mask, None, part.rewards,
                                  part.group_ids, None, {}, micro_batch_index=k,
                                  micro_batch_count=len(case.micro_batches), global_tokens=total_tokens)
            got = got + adapter(fn, call)
        got = float(got.detach())
        assert abs(got - exact) <= 1e-13 * (abs(exact) + 1e-3), (case.case_id, got, exact)


@pytest.mark.parametrize(("name", "flag", "failing"), [
    ("ppo", {"masked_nonfinite": "ignore"}, {"masked_nonfinite"}),
    ("ppo", {"compute_dtype": "float32_min"}, {"bf16"}),
    ("ppo", {"log_ratio_clamp": 20.0}, {"extreme_log_ratio"}),
    ("ppo", {"micro_batch": "local_mean"}, {"micro_batch"}),
])
def test_each_flag_is_needed(name, flag, failing):
    classes = ("inside_clip", *sorted(failing))
    assert set(_check(name, classes=classes, **flag).failing_classes()) == failing


def test_variants_areal_cannot_express_are_refused_in_one_line():
    with pytest.raises(ValueError, match="variant.ratio"):
        driver.loss_kwargs("ppo", driver.mode_variant("gspo"))
    with pytest.raises(ValueError, match="kl_coef"):
        driver.loss_kwargs("ppo", dataclasses.replace(driver.mode_variant("ppo"), kl_coef=0.1))
    kwargs = driver.loss_kwargs("ppo/clip-higher", driver.mode_variant("ppo/clip-higher"))
    assert kwargs["eps_clip"] == 0.2 and kwargs["eps_clip_higher"] == 0.28
    assert driver.unsupported_modes("group_advantages")


@pytest.mark.parametrize(("name", "flag", "failing"), [
    ("adv_norm/group", {"adv_weighting": "response"}, {"ragged_lengths"}),
    ("adv_norm/group", {"adv_trailing_partial": "group"}, {"partial_group"}),
    ("reward_norm/group", {"adv_output_float32": False}, {"equal_groups", "ragged_lengths", "partial_group"}),
    ("adv_norm/group_mean_leave1out", {"adv_leave_one_out_unit": "response"}, {"ragged_lengths"}),
])
def test_each_group_advantage_flag_is_needed(name, flag, failing):
    """AReaL's Normalization (utils/data.py, run from source) passes under its profile and fails the class
    each of its flags is about without it: token weighting (A = R minus the group's token mean), one token
    left out, a trailing partial group divided by eps, the float32 output."""
    mode = driver.modes("group_advantages")[name]
    fn, adapter = driver.target(mode)
    classes = ("equal_groups", "ragged_lengths", "partial_group")
    conv = convention_from_flags("areal", mode.convention)
    assert check_group_advantages(fn, convention=conv, adapter=adapter, classes=classes).ok
    report = check_group_advantages(fn, convention=dataclasses.replace(conv, **flag), adapter=adapter,
                                    classes=classes)
    assert set(report.failing_classes()) == failing


def test_masked_normalization_is_the_float64_one_pass_flag_where_the_two_pass_form_differs():
    """The whitening mode's cases are exact in float32, where the one-pass form is exact too: on float64
    1e8 +- 1 AReaL's masked_normalization (run as installed) gives the flag's +-1e5, not +-1."""
    from refimpl.conformance.kinds.base import KindCase
    from refimpl.conformance.kinds.whitening import WhiteningFlags, expected_whitening

    mode = driver.modes("whitening")["masked_normalization"]
    fn, adapter = driver.target(mode)
    x = torch.tensor([[1e8 + 1.0, 1e8 - 1.0, 1e8 + 1.0, 1e8 - 1.0]], dtype=torch.float64)
    mask = torch.ones_like(x, dtype=torch.bool)
    got = adapter(fn, x, mask)
    expected = expected_whitening(KindCase("float64_offset", 0, {"advantages": x, "mask": mask}),
                                  WhiteningFlags(**mode.convention))["advantages"].values
    assert torch.equal(got, expected.float()) and got.abs().min().item() == 1e5


@pytest.mark.parametrize(("name", "flag", "failing"), [
    ("KLEstimator/k1", {"kl_reward_value_clamp": 0.0}, {"large_log_ratio", "extreme_log_ratio"}),
    ("KLEstimator/k3", {"kl_reward_estimator": "k1"}, {"small_log_ratio", "large_log_ratio",
                                                       "extreme_log_ratio", "empty_row", "masked_nonfinite"}),
])
def test_each_kl_reward_flag_is_needed(name, flag, failing):
    """KLEstimator (utils/data.py, run from source) clamps k1 too: without the flag the large classes fail."""
    from refimpl.conformance.kinds import get_kind, run_kind_check

    mode = driver.modes("kl_reward")[name]
    fn, adapter = driver.target(mode)
    kind = get_kind("kl_reward")
    assert run_kind_check(kind, fn, dict(mode.convention), adapter=adapter).ok
    report = run_kind_check(kind, fn, {**mode.convention, **flag}, adapter=adapter)
    assert set(report.failing_classes()) == failing


def test_reward_overlong_penalty_has_no_floor():
    """AReaL's reward_overlong_penalty (run as installed) is eq. (8)'s ramp continued past max_len."""
    from refimpl.conformance.kinds import get_kind, run_kind_check

    mode = driver.modes("overlong")["reward_overlong_penalty"]
    fn, adapter = driver.target(mode)
    kind = get_kind("overlong")
    assert run_kind_check(kind, fn, dict(mode.convention), adapter=adapter).ok
    failing = run_kind_check(kind, fn, adapter=adapter).failing_classes()
    assert failing == ["beyond_max_len", "cache_is_max_len"]


def test_audit_findings_no_mode_drives_are_named_by_an_unsupported_mode():
    """Issue 27's audit of AReaL's trainer (areal_findings.AUDIT_FINDINGS): the bugs and value-only
    departures no mode drives (the reward's position, rejection sampling's KL metric, Normalization's
    leave-one-out std, the distillation term, ...) are each named, ``finding KEY``, by the unsupported
    mode that says why no mode runs them, as the real matrix requires (tests/test_framework_matrix.py)."""
    from refimpl.conformance.frameworks import areal, areal_kinds
    from refimpl.conformance.frameworks.areal_findings import AUDIT_FINDINGS

    reasons = " ".join(r for table in (areal.UNSUPPORTED, areal_kinds.KIND_UNSUPPORTED)
                       for kind in table.values() for r in kind.values())
    shown = {f.key for f in AUDIT_FINDINGS if f.kind in ("bug", "value_only")}
    assert shown and {k for k in shown if f"finding {k}" not in reasons} == set()
    assert {f.key for f in AUDIT_FINDINGS} <= {f.key for f in driver.findings()}


def test_second_audit_findings_are_classified_and_named_by_an_unsupported_mode():
    """A second audit of AReaL's trainer (source first, kit second): mask_no_eos_with_zero replacing only
    the reward, the overlong budget's own field, M2PO and the critic's setting without effect, the
    log-linear proximal policy. Each is a finding of its class, and since no mode drives it, an
    unsupported mode names it ``finding KEY``."""
    from refimpl.conformance.frameworks import areal, areal_kinds
    from refimpl.conformance.frameworks.areal_findings import AUDIT_FINDINGS

    want = {"mask_no_eos_reward_only": "bug", "config:max_new_tokens": "validation",
            "config:m2_threshold_coupled": "validation", "config:critic_mask_no_eos": "validation",
            "prox_logp_loglinear": "documented_default"}
    assert {f.key: f.kind for f in AUDIT_FINDINGS if f.key in want} == want
    reasons = " ".join(r for table in (areal.UNSUPPORTED, areal_kinds.KIND_UNSUPPORTED)
                       for kind in table.values() for r in kind.values())
    assert [k for k in want if f"finding {k}" not in reasons] == []

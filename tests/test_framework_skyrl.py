"""The SkyRL driver against the installed SkyRL-train (0.3.1): gspo, sapo and the advantage
estimators pass every case class under their profiles; regular / dual_clip / cispo evaluate the
ratio in float32 (ratio_dtype="float32"), whose ties with the dual clip halve the gradient
(dual_clip_tie="half"); the KL loss has a value and no gradient (kl_gradient="none"); each flag is
needed; the import leaves no stand-in behind.

Expected values come from our reference with the profile's flags, never from running SkyRL.
Skipped with a message when SkyRL-train is not installed.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest
import torch

from refimpl.conformance import (
    POLICY_CASE_CLASSES,
    Convention,
    check_group_advantages,
    check_policy_loss,
)
from refimpl.conformance.cases import kl_cases
from refimpl.conformance.checks import DEFAULT_RTOL, resolve_preset
from refimpl.conformance.conventions import convention_from_flags
from refimpl.conformance.expected import expected_kl
from refimpl.conformance.frameworks import load_driver
from refimpl.conformance.policy_check import TIE_NOTE

pytestmark = pytest.mark.framework

driver = load_driver("skyrl")
_WHY = driver.availability()
if _WHY is not None:
    pytest.skip(f"SkyRL driver unavailable: {_WHY}", allow_module_level=True)

_CLASSES = tuple(c for c in POLICY_CASE_CLASSES if c != "golden_vectors")
_FLOAT32_RATIO = sorted(m for m in driver.modes() if m.split("/")[0] in ("regular", "dual_clip", "cispo"))
_FLOAT64 = sorted(set(driver.modes()) - set(_FLOAT32_RATIO))
F64_RTOL = 1e-12  # as tests/test_framework_openrlhf.py


def _check(name, *, classes=_CLASSES, rtol=DEFAULT_RTOL, **flags):
    mode = driver.modes()[name]
    fn, adapter = driver.target("policy_loss", name)
    conv = dataclasses.replace(convention_from_flags("skyrl", mode.convention), **flags)
    variant = resolve_preset(driver.mode_variant(mode))[1]
    return check_policy_loss(fn, variant, convention=conv, adapter=adapter, classes=classes, rtol=rtol)


def test_driver_loads_ppo_utils_from_the_installed_file_without_leaving_a_ray_stand_in():
    files = driver.source_files()
    assert [f.name for f in files] == ["ppo_utils.py", "ppo_base_config.yaml", "worker.py", "trainer.py"]
    fn, _ = driver.target("policy_loss", "sapo")
    assert fn.__module__ == "_refimpl_skyrl.ppo_utils"
    assert sys.modules[fn.__module__].__file__ == str(files[0])
    assert "skyrl_train.utils" not in sys.modules  # its __init__ (ray placement groups, s3fs) never ran
    if "ray" in driver.STUBBED:
        assert "ray" not in sys.modules


@pytest.mark.parametrize("name", _FLOAT64)
def test_float64_mode_passes_every_case_class_under_its_profile(name):
    report = _check(name)
    assert report.ok, report.render()


@pytest.mark.parametrize("name", _FLOAT32_RATIO)
def test_float32_ratio_mode_passes_every_class_under_its_profile(name):
    report = _check(name)
    assert report.ok, report.render()
    # ... and the departure is real: the exact ratio fails on ordinary cases
    assert "inside_clip" in _check(name, classes=("inside_clip",), ratio_dtype="input").failing_classes()


def test_float32_ratio_moves_the_clip_bounds_and_hits_the_dual_clip_tie():
    # _safe_exp_delta: exp(clamp(delta.float(), -20, 20)).to(float64). A ratio the case puts on the bound
    # 1 - 0.2 becomes float32(0.8) = 0.800000011..., inside the clip; one on c = 3 becomes exactly 3.0,
    # where dual_clip's torch.min(pg_losses3, loss) splits the gradient in half (ppo_utils.py:584)
    utils = sys.modules["_refimpl_skyrl.ppo_utils"]
    r = utils._safe_exp_delta(torch.tensor([math.log(0.8), math.log(3.0)], dtype=torch.float64))
    assert r.dtype == torch.float64 and r[0].item() > 0.8 and r[1].item() == 3.0
    assert _check("dual_clip/token_mean", classes=("on_boundary", "dual_clip_tie")).ok
    tie_classes = ("on_boundary", "dual_clip_tie")
    # under the spec's inclusive gate the halved gradient is a subgradient of the kink at r = c
    # (policy_losses.md, after eq. (7)): the cases pass, noted, and are not exact
    report = _check("dual_clip/token_mean", classes=tie_classes, dual_clip_tie="inclusive")
    noted = [x for x in report.results if x.departure == TIE_NOTE]
    assert report.ok and {x.case_class for x in noted} == {"on_boundary", "dual_clip_tie"}
    assert all(x.value_ok and x.grad_error > 0.1 for x in noted)


@pytest.mark.parametrize(("name", "flag", "failing"), [
    ("sapo", {"empty_rows": "drop"}, {"empty_rows"}),
    ("gspo", {"sequence_log_ratio_cap": None}, {"extreme_log_ratio"}),
    ("regular/token_mean", {"micro_batch": "global"}, {"micro_batch"}),
    ("gspo", {"masked_nonfinite": "ignore"}, {"masked_nonfinite"}),
])
def test_each_flag_is_needed(name, flag, failing):
    classes = ("inside_clip", *sorted(failing))
    assert set(_check(name, classes=classes, **flag).failing_classes()) == failing


def test_sapos_log_ratio_clamp_is_needed_but_small():
    # SkyRL clamps SAPO's log-ratio to +-20; beyond |log r| = 20 the gate has nearly saturated, so
    # dropping the flag moves the extreme cases by less than float32's tolerance but more than float64's
    assert _check("sapo", classes=("extreme_log_ratio",)).ok
    assert not _check("sapo", classes=("extreme_log_ratio",), log_ratio_clamp=None).ok
    assert _check("sapo", classes=("extreme_log_ratio",), rtol=1e-6, log_ratio_clamp=None).ok


def test_cispo_default_lower_bound_raises_ratios_below_one():
    # cispo_eps_clip_low defaults to 0: the lower bound 1 - 0 clamps every ratio < 1 up to 1; the
    # one-sided CISPO of the spec (eps_low None, flag cispo_clip_low=None) fails the classes with
    # ratios below 1
    assert driver.mode_variant("cispo").eps_low is None
    assert _check("cispo", classes=("outside_clip",)).ok
    assert not _check("cispo", classes=("outside_clip",), cispo_clip_low=None).ok


def test_the_kl_loss_has_a_value_and_no_gradient():
    # compute_approx_kl is @torch.no_grad() (ppo_utils.py:91): forward_backward's KL term
    # kl_loss_coef * masked_mean(kl, mask, dim=-1).mean() adds to the loss value only
    utils = sys.modules["_refimpl_skyrl.ppo_utils"]
    conv = Convention(kl_log_ratio_clamp=20.0, kl_value_clamp=10.0, kl_k3_form="naive")
    for case in kl_cases():
        logp = case.logp.clone().requires_grad_(True)
        kl = utils.compute_approx_kl(logp, case.ref_logp, kl_estimator_type="k3")
        assert not kl.requires_grad
        value, grad = expected_kl(case, "k3", conv)
        assert torch.allclose(kl, value, rtol=1e-12, atol=1e-15), case.case_class
        if case.case_class != "zero_log_ratio":  # k3's derivative is 0 at log r = 0
            assert grad.abs().sum() > 0  # the spec's KL term has a gradient; SkyRL's has none
    # the KL loss mode passes under kl_gradient="none" and fails without it
    assert _check("regular/sequence_mean+kl/k3", classes=("kl_penalty",)).ok
    assert not _check("regular/sequence_mean+kl/k3", classes=("kl_penalty",), kl_gradient="estimator").ok


def test_the_kl_loss_is_a_row_mean_over_every_row_whatever_the_reduction():
    # worker.py:686: kl_loss_coef * masked_mean(kl, mask, dim=-1).mean() beside the token_mean policy term,
    # not the policy's own aggregation (a token mean; kl_aggregation="row_mean_all_rows"). Every class has
    # a KL term; empty_rows has rows of unequal lengths and an empty one
    failing = _check("regular/token_mean+kl/k3", classes=("empty_rows",), kl_aggregation="policy")
    assert failing.failing_classes() == ["empty_rows"]
    # the term has no gradient in this release: its aggregation changes the logged loss only
    assert {f.key: f.kind for f in driver.findings()}["kl_aggregation"] == "value_only"


@pytest.mark.parametrize("name", sorted(driver.modes("group_advantages")))
def test_advantage_estimator_passes_under_its_profile(name):
    mode = driver.modes("group_advantages")[name]
    fn, adapter = driver.target("group_advantages", name)
    conv = convention_from_flags("skyrl", mode.convention)
    assert check_group_advantages(fn, convention=conv, adapter=adapter, rtol=F64_RTOL).ok
    if name == "grpo":  # the singleton's float32 std 1 is needed
        looser = dataclasses.replace(conv, adv_singleton_float32=False)
        report = check_group_advantages(fn, convention=looser, adapter=adapter, rtol=F64_RTOL)
        assert report.failing_classes() == ["singleton_group"]


def test_algorithm_config_parses_the_yaml_once_and_returns_a_config_of_its_own_each_call():
    from omegaconf import OmegaConf

    skyrl = driver.module
    path = driver.source_files()[1]
    shipped = OmegaConf.to_container(OmegaConf.load(path).trainer.algorithm)
    first = skyrl.algorithm_config({"eps_clip_low": 0.1, "cispo.cispo_eps_clip_low": 0.5})
    assert first.eps_clip_low == 0.1 and first.cispo.cispo_eps_clip_low == 0.5
    first.value_clip, first.sapo.tau_pos = 123.0, 7.0  # a caller changes its config
    again = skyrl.algorithm_config({})
    assert OmegaConf.to_container(again) == {**shipped, "max_seq_len": None}  # the file's, untouched
    assert again.sapo is not first.sapo
    assert skyrl._shipped_config.cache_info().currsize == 1  # parsed once for the installed file

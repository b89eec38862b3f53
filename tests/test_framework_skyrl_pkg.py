"""The driver of ``skyrl`` (0.4.0), SkyRL-train's maintained successor, against the installed package:
every mode passes its profile (tests/test_framework_matrix.py runs them all); here, what changed from
SkyRL-train 0.3.1 and that each change is needed: the reduction folded into the advantages over the
mini-batch (micro_batch="global", SkyRL-train: "local_mean"), the KL loss with its gradient (SkyRL-train:
none) and CISPO's lower bound 0 by default (SkyRL-train and skyrl 0.3.0: 1). The import leaves no
stand-in behind.

Expected values come from our reference with the profile's flags, never from running skyrl. Skipped
with a message when skyrl is not installed, or when the installed release is not the pinned one (the
drift run, ``refimpl frameworks drift``, checks the other releases).
"""

from __future__ import annotations

import dataclasses
import sys

import pytest

from refimpl.conformance import POLICY_CASE_CLASSES, check_policy_loss
from refimpl.conformance.cases import kl_cases
from refimpl.conformance.checks import resolve_preset
from refimpl.conformance.conventions import convention_from_flags
from refimpl.conformance.frameworks import load_driver

pytestmark = pytest.mark.framework

driver = load_driver("skyrl_pkg")
_WHY = driver.availability()
if _WHY is not None:
    pytest.skip(f"skyrl driver unavailable: {_WHY}", allow_module_level=True)
if driver.installed_version() != driver.pinned_version:
    pytest.skip(f"skyrl {driver.installed_version()} is installed, these tests describe "
                f"{driver.pinned_version}", allow_module_level=True)

_CLASSES = tuple(c for c in POLICY_CASE_CLASSES if c != "golden_vectors")


def _check(name, *, classes=_CLASSES, **flags):
    mode = driver.modes()[name]
    fn, adapter = driver.target("policy_loss", name)
    conv = dataclasses.replace(convention_from_flags("skyrl_pkg", mode.convention), **flags)
    variant = resolve_preset(driver.mode_variant(mode))[1]
    return check_policy_loss(fn, variant, convention=conv, adapter=adapter, classes=classes)


def test_driver_loads_the_installed_files_without_leaving_a_stand_in():
    files = driver.source_files()
    assert [f.name for f in files] == ["ppo_utils.py", "torch_utils.py", "off_policy_correction_utils.py",
                                       "config.py", "worker.py", "trainer.py"]
    fn, _ = driver.target("policy_loss", "sapo")
    assert fn.__module__ == "_refimpl_skyrl_pkg.ppo_utils"
    assert sys.modules[fn.__module__].__file__ == str(files[0])
    for name in ("ray", "skyrl_gym", "skyrl.train.config", "skyrl.backends.skyrl_train.utils.torch_utils"):
        assert name not in sys.modules or name not in driver.STUBBED


def test_the_reduction_over_the_mini_batch_is_global():
    # RayPPOTrainer._normalize_advantages divides by the mini-batch's tokens: the micro-batches' local means
    # of SkyRL-train (micro_batch="local_mean") fail here
    classes = ("inside_clip", "micro_batch")
    assert _check("regular/token_mean", classes=classes).ok
    assert _check("regular/token_mean", classes=classes, micro_batch="local_mean").failing_classes() == [
        "micro_batch"]


def test_the_kl_loss_has_its_gradient():
    # skyrl-train 0.3.1's compute_approx_kl ran under @torch.no_grad(); skyrl's does not
    utils = sys.modules["_refimpl_skyrl_pkg.ppo_utils"]
    case = next(c for c in kl_cases() if c.case_class != "zero_log_ratio")
    logp = case.logp.clone().requires_grad_(True)
    assert utils.compute_approx_kl(logp, case.ref_logp, kl_estimator_type="k3").requires_grad
    assert _check("regular/sequence_mean+kl/k3", classes=("kl_penalty",)).ok
    assert not _check("regular/sequence_mean+kl/k3", classes=("kl_penalty",), kl_gradient="none").ok


def test_the_kl_loss_is_a_row_mean_over_every_row_of_the_mini_batch():
    # worker.py:1232: masked_mean(kl, mask, dim=-1).mean() weighed by the micro-batch's share of the rows
    # (microbatch_weight): under token_mean it is neither the policy's aggregation nor a token mean
    classes = ("empty_rows",)  # a KL term and rows of unequal lengths, one empty
    assert _check("regular/token_mean+kl/k3", classes=classes).ok
    assert _check("regular/token_mean+kl/k3", classes=classes, kl_aggregation="policy").failing_classes() == [
        "empty_rows"]


def test_cispo_defaults_to_the_one_sided_cap():
    # CISPOConfig.cispo_eps_clip_low = 1.0 in 0.4.0: the lower bound 1 - 1 = 0 leaves ratios below 1;
    # 0.3.0's default 0.0 (flag cispo_clip_low=0.0, RELEASE_FLAGS) fails here
    assert driver.algorithm_config({}).cispo.cispo_eps_clip_low == 1.0
    assert "cispo_clip_low" not in driver.modes()["cispo"].convention
    assert _check("cispo", classes=("outside_clip",)).ok
    assert not _check("cispo", classes=("outside_clip",), cispo_clip_low=0.0).ok
    assert not [f for f in driver.findings() if f.key == "cispo_clip_low"]


def test_cispo_raises_on_a_batch_without_rows_in_its_logged_max():
    # ppo_utils.py:804: ratio.max() of an empty tensor; the profile's zero_rows="raise" names it
    assert _check("cispo", classes=("zero_rows",)).ok
    assert not _check("cispo", classes=("zero_rows",), zero_rows="zero").ok


def test_kl_covs_penalty_is_summed_beside_the_scaled_advantages():
    # finding kl_cov_scaled_penalty (ppo_utils.py:1024): the trainer divides A by the token count, not
    # ppo_kl_coef * |log r|, and the loss returns the masked sum: four tokens at |log r| = 0.5, A = 0
    import torch

    utils = sys.modules["_refimpl_skyrl_pkg.ppo_utils"]
    config = driver.algorithm_config({"policy_loss_type": "kl_cov", "kl_cov.kl_cov_frac": 1.0})
    mask = torch.ones(1, 4, dtype=torch.float64)
    scaled = utils.apply_loss_reduction_to_advantages_minibatch(torch.zeros_like(mask), mask, "token_mean",
                                                                1, None)
    loss, _ = utils.compute_policy_loss_kl_cov(torch.full_like(mask, 0.5), torch.zeros_like(mask), scaled,
                                               config, loss_mask=mask)
    assert loss.item() == 2.0  # the token mean of the penalty is 0.5
    found = {f.key: f.kind for f in driver.findings()}
    assert found["kl_cov_scaled_penalty"] == "bug" and found["token_mean_legacy"] == "documented_default"
    assert found["kl_aggregation"] == "documented_default"  # the KL term has its gradient here

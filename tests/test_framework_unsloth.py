"""The Unsloth driver against the installed unsloth-zoo (2026.10.9): its ``grpo_compute_loss`` loads
and runs on the CPU without the package's GPU check; every mode passes its profile
(tests/test_framework_matrix.py runs them all); here each of Unsloth's own flags is needed, and the
trainer's path ``UnslothEfficientGRPO`` gives ``grpo_compute_loss``'s gradient and its value rounded to
float32 on every float64 case of every mode (finding ``efficient_value_float32``).

Expected values come from our reference with the profile's flags, never from running Unsloth.
Skipped with a message when unsloth-zoo is not installed.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from refimpl.conformance import POLICY_CASE_CLASSES, check_policy_loss
from refimpl.conformance.checks import resolve_preset
from refimpl.conformance.contract import PolicyLossCall
from refimpl.conformance.conventions import convention_from_flags
from refimpl.conformance.frameworks import load_driver
from refimpl.conformance.policy_cases import policy_loss_cases

pytestmark = pytest.mark.framework

driver = load_driver("unsloth")
_WHY = driver.availability()
if _WHY is not None:
    pytest.skip(f"Unsloth driver unavailable: {_WHY}", allow_module_level=True)

_CLASSES = tuple(c for c in POLICY_CASE_CLASSES if c != "golden_vectors")


def _variant(name):
    return resolve_preset(driver.mode_variant(driver.modes()[name]))[1]


def _check(name, *, classes=_CLASSES, **flags):
    mode = driver.modes()[name]
    fn, adapter = driver.target("policy_loss", name)
    conv = dataclasses.replace(convention_from_flags("unsloth", mode.convention), **flags)
    return check_policy_loss(fn, _variant(name), convention=conv, adapter=adapter, classes=classes)


def test_loss_code_loads_on_the_cpu_without_the_package_or_a_stand_in_left_behind():
    fn, _ = driver.target("policy_loss", "grpo")
    assert fn.__module__ == "_refimpl_unsloth.rl_replacements"
    assert sys.modules[fn.__module__].__file__ == str(driver.source_files()[0])
    # the package __init__ (its GPU check) never ran, and no stand-in outlived the load
    assert not [m for m in sys.modules if m == "unsloth_zoo" or m.startswith("unsloth_zoo.")]
    assert set(driver.STUBBED) == {"_refimpl_unsloth.device_type", "_refimpl_unsloth.dataset_utils"}
    assert not [m for m in driver.STUBBED if m in sys.modules]


@pytest.mark.parametrize(("name", "flags", "failing"), [
    # bnpo: the micro-batch's own token count
    ("bnpo", {"micro_batch": "global"}, {"micro_batch"}),
    # k3 clamped to [-10, 10] after the ratio weight, not before
    ("grpo+kl/k3", {"kl_value_clamp_scope": "k3"}, {"extreme_log_ratio"}),
    # SAPO's float32 temperatures
    ("sapo", {"sapo_tau_float32": False}, {"inside_clip"}),
    # the rollout's log-probs as old: the log-ratio clamped to +-20 before exp
    ("grpo/rollout-logps-as-old", {"log_ratio_clamp": None}, {"extreme_log_ratio"}),
])
def test_each_flag_is_needed(name, flags, failing):
    classes = ("inside_clip", *sorted(failing))
    assert _check(name, classes=classes).ok
    assert set(_check(name, classes=classes, **flags).failing_classes()) == failing


def test_delta_is_driven_only_where_it_is_the_dual_clip():
    """delta >= 1 + epsilon_high is the dual clip (mode dapo/delta); below, it caps A > 0 ratios inside
    the clip band, no variant of the spec (the variant refuses it)."""
    mode, variant = driver.modes()["dapo/delta"], _variant("dapo/delta")
    assert driver.loss_kwargs(mode, variant)["delta"] == 3.0
    assert "delta" not in driver.loss_kwargs(driver.modes()["dapo"], _variant("dapo"))
    with pytest.raises(ValueError, match=r"dual_clip must be >= 1 \+ eps_high"):
        driver.loss_kwargs(mode, dataclasses.replace(variant, dual_clip=1.1))


def _call(case, variant):
    logp = case.logp.clone().requires_grad_(True)
    call = PolicyLossCall(logp=logp, old_logp=case.old_logp, advantages=case.advantages, mask=case.mask,
                          ref_logp=case.ref_logp, rewards=case.rewards, group_ids=case.group_ids,
                          normalizer=None, config={}, global_tokens=int(case.mask.sum()),
                          global_sequences=int(case.mask.any(-1).sum()), global_rows=case.mask.shape[0])
    return call, logp


@pytest.mark.parametrize("name", sorted(driver.modes()))
def test_the_trainers_efficient_path_has_the_same_gradient_and_a_float32_value(name):
    mode, variant = driver.modes()[name], _variant(name)
    fn, adapter = driver.target("policy_loss", name)
    cases = [c for c in policy_loss_cases(variant, None, classes=("inside_clip", "outside_clip", "ragged",
                                                                   "empty_rows", "kl_penalty"))
             if c.logp.dtype == torch.float64]
    assert cases
    for case in cases:
        call, leaf = _call(case, variant)
        direct = adapter(fn, call)
        (direct_grad,) = torch.autograd.grad(direct, leaf)
        call, leaf = _call(case, variant)
        efficient = driver.efficient_loss(mode, variant, call)
        (efficient_grad,) = torch.autograd.grad(efficient, leaf)
        assert efficient.dtype == torch.float32 and direct.dtype == torch.float64, case.case_id
        assert efficient.item() == direct.float().item(), case.case_id
        assert torch.equal(efficient_grad, direct_grad), case.case_id


def test_the_audits_findings_are_those_of_the_code_a_user_trains_with():
    """Issue 27's source-first audit: each finding keyed, classed, located (the line check and the
    scripts are tests/test_framework_findings.py's); the ones no mode shows are named by the unsupported
    mode that says why."""
    found = {f.key: f.kind for f in driver.findings()}
    assert {k: found.get(k) for k in ("config:delta", "completion_mask_pad_eos", "vllm_is_sequence_weight",
                                      "entropy_token_mean", "efficient_grad_output")} == {
        "config:delta": "validation", "completion_mask_pad_eos": "bug",
        "vllm_is_sequence_weight": "documented_default", "entropy_token_mean": "documented_default",
        "efficient_grad_output": "documented_default"}
    reasons = " ".join(r for kind in driver.module.UNSUPPORTED.values() for r in kind.values())
    for key in ("config:delta", "completion_mask_pad_eos", "vllm_is_sequence_weight", "entropy_token_mean",
                "efficient_grad_output"):
        assert f"finding {key}" in reasons, key


def test_dr_grpo_accepts_completions_longer_than_max_completion_length():
    """The second audit's finding: dr_grpo's L_max is never checked against the mask's responses (the
    script shows it; here its class, line and the unsupported mode that names it)."""
    found = {f.key: f for f in driver.findings()}
    finding = found["config:max_completion_length"]
    assert finding.kind == "validation" and finding.where == "rl_replacements.py:1231"
    reasons = " ".join(r for kind in driver.module.UNSUPPORTED.values() for r in kind.values())
    assert "finding config:max_completion_length" in reasons

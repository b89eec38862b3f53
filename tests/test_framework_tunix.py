"""The Tunix driver against the installed google-tunix (0.1.7, JAX on the CPU): Tunix's own loss code
runs (its code object, the forward pass replaced by the kit's log-probs) without ``tunix/__init__.py``;
each of its profile's flags is needed; at a ratio exactly on a clip bound the gradient is 3/4 of the
spec's (``jnp.clip`` and ``jnp.maximum`` split a tie in halves: flag ``clip_bound_tie``, a subgradient
where the bound closes the gate, a departure on the other side), and a batch without rows raises in a
logged diagnostic (``zero_rows="raise"``). The matrix (docs/conformance-matrix-extra.md,
``make check-frameworks-extra``) runs every mode on every case class.

Expected values come from our reference with the profile's flags, never from running Tunix.
Skipped with a message when JAX or google-tunix is not installed (``refimpl frameworks install tunix``).
Not marked ``framework``: CI's frameworks venv has no JAX (docs/ci.md), so RL_ORACLE_REQUIRE_FRAMEWORKS
must not turn this skip into a failure there; ``make check-frameworks-extra`` installs Tunix, checks its
matrix (which fails if the driver cannot run) and then runs this module.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest
import torch

from refimpl.conformance.checks import check_framework_mode, resolve_preset
from refimpl.conformance.contract import PolicyLossCall
from refimpl.conformance.conventions import convention_from_flags
from refimpl.conformance.expected import expected_policy_loss
from refimpl.conformance.frameworks import load_driver
from refimpl.conformance.kinks import TIE_NOTE
from refimpl.conformance.policy_cases import policy_loss_cases

driver = load_driver("tunix")
_WHY = driver.availability()
if _WHY is not None:
    pytest.skip(f"Tunix driver unavailable: {_WHY}", allow_module_level=True)


def _mode(name, kind="policy_loss"):
    return driver.mode(kind, name)


def _failing(name, classes, kind="policy_loss", **flags):
    report = check_framework_mode(driver, _mode(name, kind), reference=False, flag_overrides=flags or None,
                                  classes=classes)
    return set(report.failing_classes())


def _call(case):
    logp = case.logp.clone().requires_grad_(True)
    return PolicyLossCall(logp=logp, old_logp=case.old_logp, advantages=case.advantages, mask=case.mask,
                          ref_logp=case.ref_logp, rewards=case.rewards, group_ids=case.group_ids,
                          normalizer=None, config={}), logp


def test_the_loss_is_tunix_own_code_and_no_package_entry_is_left_behind():
    fn, _ = driver.target(_mode("grpo"), _mode("grpo").variant())
    assert fn.__code__.co_filename == str(driver.source_files()[0])
    assert driver._with_forward(fn).__code__ is fn.__code__  # only the name ``common`` is rebound
    assert not [m for m in sys.modules if m == "tunix" or m.startswith("tunix.")]


@pytest.mark.parametrize(("name", "flags", "failing"), [
    ("grpo", {"log_ratio_clamp": None}, {"extreme_log_ratio"}),  # jnp.clip(log ratio, -20, 20)
    ("grpo", {"compute_dtype": "input"}, {"inside_clip"}),  # float32 whatever the input
    ("grpo", {"masked_nonfinite": "ignore"}, {"masked_nonfinite"}),
    ("dapo", {"micro_batch": "global"}, {"micro_batch"}),  # optax.MultiSteps: a mean of micro-batch means
    ("drgrpo", {"seq_sum_width": "max_length"}, {"inside_clip"}),  # norm = the padded width
    ("ppo", {"ratio_overflow": "exact"}, {"ratio_overflow"}),  # exp of the raw log-ratio
    ("grpo", {"clip_bound_tie": "inclusive"}, {"on_boundary"}),  # jnp.clip + jnp.maximum: 3/4 at a bound
    ("ppo", {"clip_bound_tie": "inclusive"}, {"on_boundary"}),
    ("grpo", {"zero_rows": "zero"}, {"zero_rows"}),  # jnp.max over a zero-size array
    ("gspo-token", {"log_ratio_clamp": None}, {"extreme_log_ratio"}),  # the clamp inside sg(log s) only
])
def test_each_flag_is_needed(name, flags, failing):
    classes = ("inside_clip", *sorted(failing - {"inside_clip"}))
    assert not _failing(name, classes)
    assert _failing(name, classes, **flags) == failing


@pytest.mark.parametrize(("kind", "name", "flags", "failing"), [
    ("gae", "gae", {"gae_truncation": "bootstrap"}, {"truncated"}),  # no bootstrap value
    ("gae", "gae", {"gae_whiten": "none"}, {"full_length", "ragged"}),  # whitened inside
    ("gae", "gae", {"gae_padding_nonfinite": "ignored"}, {"padding_nonfinite"}),  # values * mask
    ("whitening", "masked_whiten", {"whiten_masked_nonfinite": "ignored"}, {"masked_nonfinite"}),
    ("whitening", "masked_whiten", {"whiten_std": "population"}, {"ragged"}),  # Bessel's n / (n - 1)
    ("whitening", "masked_whiten", {"whiten_sample_single": "raise"}, {"single_token"}),  # 1 / 0 * 0
    ("value_loss", "value_loss", {"value_scale": 1.0}, {"inside_clip"}),  # 0.5 * masked_mean
    ("value_loss", "value_loss", {"value_masked_nonfinite": "ignored"}, {"masked_nonfinite"}),
])
def test_each_kind_flag_is_needed(kind, name, flags, failing):
    classes = tuple(sorted(failing | {"ragged" if kind != "value_loss" else "inside_clip"}))
    assert not _failing(name, classes, kind=kind)
    assert _failing(name, classes, kind=kind, **flags) == failing


def test_overlong_shaping_has_no_floor_and_counts_characters():
    """DAPOLearner's reward_shaping (kind overlong, executed from grpo/dapo_learner.py): past max_len the
    ramp continues below -1 (the profile's overlong_floor='none' is needed), and it measures
    len(completion): five tokens of four characters are penalised as 20 (finding overlong_characters)."""
    classes = ("soft_zone", "beyond_max_len")
    assert not _failing("reward_shaping", classes, kind="overlong")
    floored = _failing("reward_shaping", classes, kind="overlong", overlong_floor="minus_one")
    assert floored == {"beyond_max_len"}
    fn, _ = driver.kind_target(_mode("reward_shaping", "overlong"))
    assert fn.__code__.co_filename.endswith("rl/grpo/dapo_learner.py")  # Tunix's own def
    budget = {"overlong_buffer_length": 5, "overlong_buffer_penalty": 1.0, "max_response_length": 20}
    assert fn([""], ["abcd" * 5], None, overlong_buffer=budget) == [-1.0]  # 5 tokens: 0 by DAPO's eq.
    assert fn([""], ["x" * 5], None, overlong_buffer=budget) == [0]


def test_low_var_kl_is_a_float32_evaluation_of_the_naive_form():
    """compute_kl_divergence casts to float32 (large log-ratios fail without the flag); its naive k3 under
    XLA is within float32's rounding of torch's evaluation and -inf at an infinite log-ratio, the naive
    form's indeterminate inf - inf (NOTES, finding infinite_log_ratio): the profile passes every class."""
    assert not _failing("low_var_kl", None, kind="kl")
    assert _failing("low_var_kl", ("large_log_ratio",), kind="kl", kl_compute_dtype="input") == {
        "large_log_ratio"}
    assert _failing("low_var_kl", ("infinite_log_ratio",), kind="kl", kl_k3_form="accurate") == {
        "infinite_log_ratio"}
    fn, adapter = driver.target(_mode("low_var_kl", "kl"), None)
    logp = torch.tensor([[-math.inf, -1.0]], dtype=torch.float64, requires_grad=True)
    value = adapter(fn, logp, torch.tensor([[-2.0, -1.5]], dtype=torch.float64))
    assert value[0, 0].item() == -math.inf  # the spec's k3 is +inf; op by op JAX gives NaN
    assert value[0, 1].item() == pytest.approx(math.exp(-0.5) + 0.5 - 1, rel=1e-6, abs=0)


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_on_a_clip_bound_the_gradient_is_three_quarters_of_the_spec(name):
    """jnp.clip's derivative at a bound is 1/2 and jnp.maximum gives each side of a tie 1/2: 1/2 + 1/4 of
    the spec's (inclusive) derivative, between the two one-sided derivatives 0 and -A r."""
    mode = _mode(name)
    variant = resolve_preset(mode.variant())[1]
    conv = convention_from_flags("tunix", mode.convention)
    fn, adapter = driver.target(mode, mode.variant())
    case = next(c for c in policy_loss_cases(variant, conv) if c.case_class == "on_boundary")
    call, logp = _call(case)
    adapter(fn, call).backward()
    _, spec = expected_policy_loss(case, variant, dataclasses.replace(conv, clip_bound_tie="inclusive"))
    ratio = torch.exp((case.logp - case.old_logp).float())
    bound = case.mask & ((ratio == torch.tensor(0.8)) | (ratio == torch.tensor(1.2)))
    assert bound.sum() >= 2
    torch.testing.assert_close(logp.grad[bound], 0.75 * spec[bound], rtol=2e-6, atol=0)
    torch.testing.assert_close(logp.grad[~bound], spec[~bound], rtol=2e-6, atol=1e-9)


def test_a_batch_without_rows_raises_in_the_logged_max():
    mode = _mode("grpo")
    variant = resolve_preset(mode.variant())[1]
    conv = convention_from_flags("tunix", mode.convention)
    case = next(c for c in policy_loss_cases(variant, conv) if c.case_class == "zero_rows")
    fn, adapter = driver.target(mode, mode.variant())
    with pytest.raises(ValueError, match="zero-size array"):  # algo_core.py:477
        adapter(fn, _call(case)[0])
    assert not _failing("grpo", ("zero_rows",))  # the raise is the profile's zero_rows="raise"
    assert not _failing("ppo", ("zero_rows",), zero_rows="zero")  # PPO's masked_mean has no max


def test_on_boundary_under_the_reference_is_named_by_the_flags_and_the_dual_tie_is_a_subgradient():
    for name, flags in (("grpo", "compute_dtype='float32', clip_bound_tie='three_quarters'"),
                        ("gspo-token", "compute_dtype='float32', clip_bound_tie='three_quarters', "
                                       "sequence_ratio_gradient='token'")):
        report = check_framework_mode(driver, _mode(name), reference=True, classes=("on_boundary",))
        assert {r.explanation for r in report.results if not r.ok} - {None} == {f"matches flags {flags}"}
    report = check_framework_mode(driver, _mode("grpo/dual-clip"), reference=True, classes=("dual_clip_tie",))
    assert report.ok and {r.departure for r in report.results} == {TIE_NOTE}


def test_a_group_of_one_is_refused_as_grpo_config_refuses_it():
    fn, adapter = driver.target(_mode("grpo", "group_advantages"), None)
    with pytest.raises(ValueError, match="num_generations must be greater than 1"):
        adapter(fn, torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64), torch.tensor([0, 0, 1]))
    rewards = torch.tensor([1.0, 0.0, 2.0, 5.0, 5.0], dtype=torch.float64)
    got = adapter(fn, rewards, torch.tensor([0, 1, 0, 1, 1]))
    # unequal groups, one call per group size: (R - mean) / (std with ddof=1 + 1e-6) (algo_core.py:559-566)
    pair, triple = 0.5**0.5 + 1e-6, (75 / 9) ** 0.5 + 1e-6  # stds of {1, 2} and {0, 5, 5}
    expected = [-0.5 / pair, (-10 / 3) / triple, 0.5 / pair, (5 / 3) / triple, (5 / 3) / triple]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0)


def test_the_audits_findings_are_classed_and_the_clip_bound_tie_is_no_bug():
    """Issue 27's source-first audit: the new findings with their classes; the 3/4 on the non-closing
    bound is jnp.clip's choice on an exact float tie (subgradient class, not a bug); the dual-clip tie is
    jnp.minimum's (JAX), not PyTorch's."""
    found = {f.key: f for f in driver.findings()}
    assert {k: found[k].kind for k in ("packed_rows", "completion_mask_pad_eos", "stale_old_logps",
                                       "config:epsilon_low", "kl_loss_mode_k1", "ppo_kl_reward_k3",
                                       "clip_bound_tie")} == {
        "packed_rows": "bug", "completion_mask_pad_eos": "bug", "stale_old_logps": "bug",
        "config:epsilon_low": "validation", "kl_loss_mode_k1": "documented_default",
        "ppo_kl_reward_k3": "documented_default", "clip_bound_tie": "autodiff_tie"}
    assert "jnp.minimum" in found["dual_clip_tie"].text and "PyTorch" not in found["dual_clip_tie"].text
    assert "finding packed_rows" in found["seq_sum_width='padded_width'"].text


def test_dapo_config_skips_grpo_configs_checks():
    """The second audit's finding: DAPOConfig.__post_init__ does not call GRPOConfig's, so a group of one
    is accepted (NaN advantages; the script shows it); the modes' singleton rule says which config."""
    found = {f.key: f for f in driver.findings()}
    finding = found["config:num_generations"]
    assert finding.kind == "validation" and finding.where == "rl/grpo/dapo_learner.py:75"
    reasons = " ".join(r for kind in driver.module.UNSUPPORTED.values() for r in kind.values())
    assert "finding config:num_generations" in reasons

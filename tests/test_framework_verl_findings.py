"""The verl driver's findings about code outside the driven calls (refimpl/conformance/frameworks/verl/
findings.py): each departure of the source-first audit that no flag reproduces is a finding of its class
(the lines and the scripts are checked in tests/test_framework_findings.py), and the claims the kit makes
about verl's trainer hold against verl's own functions."""

from __future__ import annotations

import math

import pytest
import torch

from refimpl.conformance.frameworks import load_driver

driver = load_driver("verl")

#: the audit's departures outside the driven calls, with their class
EXPECTED = {
    "kl_value_clamp": "bug",
    "rejection_sampling_returns": "bug",
    "rejection_sampling_sessions": "bug",
    "rs_k1_bounds": "bug",
    "geo_mean_is_weights": "bug",
    "gpg_alpha": "bug",
    "dapo_filter": "bug",
    "config:clip_ratio_c": "validation",
    "rollout_is_sequence": "documented_default",
    "gspo_aggregation": "documented_default",
    "seq_sum_width": "bug",
    "gae_padding_output": "value_only",
    "zero_rows": "value_only",
    # the audit of issue 27 (source first): departures the kit had only in prose or not at all
    "micro_batch": "bug",
    "dppo_truncation_cap": "bug",
    "config:clip_ratio_low": "validation",
    "config:loss_scale_factor": "validation",
    "rs_normalizer": "documented_default",
    "value_clip": "documented_default",
}


def test_each_departure_outside_the_driven_calls_is_a_finding_of_its_class():
    kinds = {f.key: f.kind for f in driver.findings()}
    assert {key: kinds.get(key) for key in EXPECTED} == EXPECTED
    # the unsupported estimator's reason says what verl computes, naming the finding
    assert "gpg_alpha" in driver.unsupported_modes("group_advantages")["gpg"]
    zero_rows = next(f for f in driver.findings() if f.key == "zero_rows")
    assert "uneven split" not in zero_rows.text  # verl's trainer passes global counts: no NaN there


@pytest.mark.framework
def test_an_empty_micro_batch_is_nan_only_without_the_trainers_global_counts():
    """finding zero_rows: agg_loss over 0 rows is 0 / 0 without global info; with the mini-batch's counts,
    as ppo_loss passes them (workers/utils/losses.py:65-68), it is 0."""
    if driver.availability() is not None:
        pytest.skip(f"verl driver unavailable: {driver.availability()}")
    core = driver.module._core_algos()
    loss_mat, mask = torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.bool)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        with_info = core.agg_loss(loss_mat, mask, mode, dp_size=1, batch_num_tokens=10, global_batch_size=4)
        assert with_info.item() == 0.0, mode
        assert math.isnan(core.agg_loss(loss_mat, mask, mode).item()), mode


def test_the_findings_no_mode_shows_are_named_by_the_unsupported_modes():
    """test-matrix's rule: a finding without a mode is named "finding KEY" in an unsupported reason."""
    policy = " ".join(driver.unsupported_modes("policy_loss").values())
    for key in ("dppo_truncation_cap", "rs_normalizer", "seq_sum_width", "config:loss_scale_factor"):
        assert f"finding {key}" in policy, key
    assert "finding value_clip" in " ".join(driver.unsupported_modes("value_loss").values())


@pytest.mark.framework
def test_rejection_sampling_normalises_differently_in_decoupled_and_bypass_mode():
    """finding rs_normalizer: the legacy trainer's decoupled mode writes the rejection into the mask the
    engine counts (token-mean's denominator loses the rejected token); bypass mode rejects inside the
    loss, after the count (the denominator keeps it, as policy_losses.md eq. (13) 'mask' does)."""
    if driver.availability() is not None:
        pytest.skip(f"verl driver unavailable: {driver.availability()}")
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.workers.config import ActorConfig, PolicyLossConfig

    core = driver.module._core_algos()
    helper = __import__("verl.trainer.ppo.rollout_corr_helper", fromlist=["x"])
    rollout = torch.tensor([[0.0, 0.0, 0.0, -3.0]], dtype=torch.float64)  # the last token is rejected
    old, full = torch.zeros(1, 4, dtype=torch.float64), torch.ones(1, 4, dtype=torch.float64)
    _, kept, _ = helper.compute_rollout_correction_and_rejection_mask(
        old, rollout, full, rollout_rs="token_k2", rollout_rs_threshold=1.0)
    assert kept.tolist() == [[1.0, 1.0, 1.0, 0.0]]
    decoupled = core.agg_loss(-torch.ones(1, 4), kept, "token-mean", dp_size=1,
                              batch_num_tokens=int(kept.sum()))
    rs = RolloutCorrectionConfig(rollout_is=None, rollout_rs="token_k2", rollout_rs_threshold=1.0,
                                 bypass_mode=True)
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                         use_torch_compile=False,
                         policy_loss=PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=rs))
    config.global_batch_info.update(dp_size=1, batch_num_tokens=4, global_batch_size=1)  # the engine's count
    bypass, _ = core.compute_policy_loss_bypass_mode(rollout, old, torch.ones(1, 4, dtype=torch.float64),
                                                     full.bool(), loss_agg_mode="token-mean", config=config)
    assert decoupled.item() == -1.0 and bypass.item() == pytest.approx(-0.75, abs=1e-12)  # float64


@pytest.mark.framework
def test_which_trainer_recounts_the_rejected_tokens_in_the_engines_denominator():
    """finding rs_normalizer, read from the installed trainers: the engine's token count is
    loss_mask.sum(); the legacy trainer re-derives loss_mask from the rewritten response_mask, the v1
    trainer stores it in the agent loop and writes back only response_mask after the correction."""
    if driver.availability() is not None:
        pytest.skip(f"verl driver unavailable: {driver.availability()}")
    root = driver.module.adapters._package_dir()

    def lines(path):
        return (root / path).read_text().splitlines()

    assert 'batch_num_tokens = data["loss_mask"].sum().to(get_device_id())' in lines(
        "workers/engine/fsdp/transformer_impl.py")[729]
    assert lines("workers/utils/padding.py")[70].strip() == 'data["loss_mask"] = data["response_mask"]'
    assert "left_right_2_no_padding(batch_td)" in lines("trainer/ppo/ray_trainer.py")[1334]
    agent_loop = lines("trainer/ppo/v1/agent_loop_tq.py")
    assert agent_loop[198].strip() == 'field["loss_mask"] = field["response_mask"]'
    v1 = lines("trainer/ppo/v1/trainer_base.py")
    assert v1[1789:1791] == ["        if rollout_correction:", '            fields.append("response_mask")']
    written = [line for line in "\n".join(v1[1786:1800]).splitlines() if "fields" in line]
    assert not any("loss_mask" in line for line in written)
    # nothing in the v1 trainer or the engine workers rewrites loss_mask
    for path in ("trainer/ppo/v1/trainer_base.py", "trainer/ppo/v1/utils.py", "workers/engine_workers.py",
                 "workers/utils/losses.py"):
        assert not any('["loss_mask"] =' in line for line in lines(path)), path

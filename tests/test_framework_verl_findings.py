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
    "seq_sum_width": "documented_default",
    "gae_padding_output": "value_only",
    "zero_rows": "value_only",
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

"""The registry kinds on the installed frameworks: the departures a source-first reading of each
function finds are named by the smallest set of the mode's flags (checks.check_kind_mode under the
reference), one per audited function. Every mode passing its own profile is checked for all modes by
tests/test_framework_matrix.py. Skipped for a framework that is not installed."""

from __future__ import annotations

import pytest

from refimpl.conformance.checks import check_framework_mode
from refimpl.conformance.frameworks import load_driver

pytestmark = pytest.mark.framework

#: (framework, kind, mode, case class, the explanation the kit must print)
NAMED = [
    ("skyrl", "whitening", "normalize_advantages_dict", "ragged", "flag whiten_mean='unmasked'"),
    ("skyrl", "gae", "gae", "padding_values", "flags gae_padding='used', gae_whiten='masked_sample'"),
    ("skyrl", "value_loss", "value_loss", "empty_rows",
     "flags value_scale=0.5, value_aggregation='seq_mean_token_mean', value_empty_rows='keep'"),
    ("verl", "gae", "gae", "truncated", "flags gae_truncation='terminate', gae_whiten='masked_sample'"),
    ("verl", "value_loss", "value_loss/token-mean", "empty_step", "flag value_empty_step='nan'"),
    ("verl", "whitening", "masked_whiten", "equal_lengths", "flag whiten_std='sample'"),
    ("openrlhf", "gae", "gae", "truncated", "flag gae_truncation='terminate'"),
    ("openrlhf", "value_loss", "value_loss/token", "empty_step", "flag value_empty_step='nan_gradient'"),
    ("openrlhf", "kl_reward", "compute_reward/k1", "large_log_ratio", "flag kl_reward_value_clamp=10.0"),
    ("areal", "behavior_correction", "decoupled/rejection_sampling=None", "stale",
     "flag behavior_weight='dropped'"),
    ("areal", "value_loss", "ppo_critic_loss_fn", "empty_step", "flag value_empty_step='nan'"),
]


@pytest.mark.parametrize(("framework", "kind", "mode", "case_class", "explanation"), NAMED,
                         ids=[f"{n[0]}-{n[2]}-{n[3]}" for n in NAMED])
def test_an_audited_departure_is_named(framework, kind, mode, case_class, explanation):
    driver = load_driver(framework)
    reason = driver.availability()
    if reason is not None:
        pytest.skip(f"{framework} is not drivable here: {reason}")
    report = check_framework_mode(driver, driver.mode(kind, mode), reference=True, classes=(case_class,))
    assert {r.explanation for r in report.results if not r.ok} == {explanation}

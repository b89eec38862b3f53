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
    ("skyrl_pkg", "gae", "gae", "padding_values", "flags gae_padding='used', gae_whiten='masked_sample'"),
    ("liger", "fused_linear", "fused_linear/ppo", "bf16_row_chunks", "flag fused_weight_grad='accumulated'"),
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


#: every installed line the registry kinds' driver sections and docs cite: (package, file, line, text on it)
CITED = [
    ("verl", "trainer/ppo/core_algos.py", 216, "def compute_gae_advantage_return("),
    ("verl", "trainer/ppo/core_algos.py", 262, "verl_F.masked_whiten(advantages, response_mask)"),
    ("verl", "trainer/ppo/core_algos.py", 1286, "def compute_policy_loss_vanilla("),
    ("verl", "trainer/ppo/core_algos.py", 1364, "if rollout_is_weights is not None:"),
    ("verl", "trainer/ppo/core_algos.py", 2125, "def compute_value_loss("),
    ("verl", "trainer/ppo/core_algos.py", 2175, "vf_loss = 0.5 * agg_loss("),
    ("verl", "trainer/ppo/core_algos.py", 2239, 'if kl_penalty in ("low_var_kl", "k3"):'),
    ("verl", "trainer/ppo/core_algos.py", 2245, "return torch.clamp(kld, min=-10, max=10)"),
    ("verl", "utils/torch_functional.py", 308, "return s / (mask.sum(axis=axis) + 1e-8)"),
    ("verl", "utils/torch_functional.py", 324, "bessel_correction = mask_sum / (mask_sum - 1)"),
    ("verl", "utils/torch_functional.py", 329, "def masked_whiten("),
    ("verl", "utils/torch_functional.py", 343, "torch.rsqrt(var + 1e-8)"),
    ("verl", "trainer/ppo/ray_trainer.py", 78, "def apply_kl_penalty("),
    ("verl", "trainer/ppo/rollout_corr_helper.py", 522, "def compute_rollout_correction_weights("),
    ("verl", "trainer/ppo/rollout_corr_helper.py", 964, "log_ratio = old_log_prob - rollout_log_prob"),
    ("openrlhf", "trainer/ppo_utils/experience_maker.py", 206, "kl = compute_approx_kl("),
    ("openrlhf", "trainer/ppo_utils/experience_maker.py", 284, "reward = compute_reward("),
    ("openrlhf", "trainer/ppo_utils/experience_maker.py", 324, "Normalize advantages across all experiences"),
    ("openrlhf", "trainer/ppo_utils/experience_maker.py", 326, ".float()"),
    ("openrlhf", "trainer/ppo_utils/experience_maker.py", 338,
     "exp.advantages = (exp.advantages - mean) * rstd"),
    ("openrlhf", "trainer/ppo_utils/experience_maker.py", 343, "def get_advantages_and_returns("),
    ("openrlhf", "trainer/ppo_utils/experience_maker.py", 376, "if action_mask is not None:"),
    ("openrlhf", "models/loss.py", 215, "vllm_kl = is_filter_ratio = None"),
    ("openrlhf", "models/loss.py", 241, "loss = coef * loss"),
    ("openrlhf", "models/loss.py", 262, "class ValueLoss("),
    ("openrlhf", "models/utils.py", 69, "def compute_approx_kl("),
    ("openrlhf", "models/utils.py", 113, "value = value.clamp(min=-10, max=10)"),
    ("openrlhf", "models/utils.py", 131, "def compute_reward("),
    ("skyrl_train", "utils/ppo_utils.py", 88, "mask.sum(axis=dim).clamp(min=1.0)"),
    ("skyrl_train", "utils/ppo_utils.py", 131, "def normalize_advantages_dict("),
    ("skyrl_train", "utils/ppo_utils.py", 169, "def masked_whiten("),
    ("skyrl_train", "utils/ppo_utils.py", 175, "return whitened"),
    ("skyrl_train", "utils/ppo_utils.py", 178, "def ppo_critic_loss("),
    ("skyrl_train", "utils/ppo_utils.py", 999, "def compute_gae_advantage_return("),
    ("skyrl_train", "trainer.py", 265, "normalize_advantages_dict(training_input)"),
    ("skyrl_train", "trainer.py", 721, "def compute_advantages_and_returns("),
    ("skyrl_train", "trainer.py", 1000, "def apply_reward_kl_penalty("),
    ("areal", "utils/functional/functional.py", 231, "log_ratio = proximal_logprobs.detach().float()"),
    ("areal", "utils/functional/functional.py", 252, "behave_imp_weight = torch.exp(log_ratio)"),
    ("areal", "utils/functional/functional.py", 483, "loss_mask_count = loss_mask.count_nonzero() or 1"),
    ("areal", "utils/functional/functional.py", 535, "if rejection_sampling is not None:"),
    ("areal", "utils/functional/functional.py", 539, "pg_loss = pg_loss * behave_imp_weight"),
    ("areal", "utils/functional/functional.py", 714, "def ppo_critic_loss_fn("),
    ("areal", "trainer/ppo/critic.py", 105, "def ppo_loss_fn("),
    ("areal", "api/cli_args.py", 1559, "equivalent to old behave_imp_weight_mode='disabled'"),
    ("skyrl", "backends/skyrl_train/utils/ppo_utils.py", 1313, "def compute_gae_advantage_return("),
    ("skyrl", "train/trainer.py", 1509, "mean = advantages.mean()"),
    ("openrlhf", "trainer/ray/ppo_actor.py", 319, "if self.args.algo.kl.init_coef > 0:"),
    ("liger_kernel", "chunked_loss/fused_linear_ppo.py", 255, "grad_weight = torch.zeros_like(weight)"),
    ("liger_kernel", "chunked_loss/fused_linear_ppo.py", 360, "grad_weight.add_(chunk_grad_params.pop(0))"),
    ("liger_kernel", "chunked_loss/fused_linear_ppo.py", 381, "max(1, _input.shape[0] // chunk_size)"),
]


@pytest.mark.parametrize(("package", "path", "line", "text"), CITED,
                         ids=[f"{c[0]}-{c[1]}:{c[2]}" for c in CITED])
def test_every_cited_line_is_the_installed_line(package, path, line, text):
    from refimpl.conformance.frameworks.sources import package_dir

    root = package_dir(package)
    if root is None:
        pytest.skip(f"{package} is not installed")
    assert text in (root / path).read_text().splitlines()[line - 1]

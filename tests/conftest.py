"""Hypothesis profiles (docs/architecture.md): ``ci`` (default) and ``thorough``, chosen by the
environment variable HYPOTHESIS_PROFILE. CI runs derandomised so failures reproduce from the log.
No test depends on whether CUDA is present unless it says so (``_device_is_named``)."""

import functools
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=25,
    derandomize=True,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=500,
    derandomize=False,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", max_examples=10, derandomize=True, print_blob=True, deadline=None
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Tests build float64 tensors explicitly (docs/architecture.md); the global default dtype is left
# alone so LM code is tested as it runs. Few threads keep CI on 2 cores predictable.
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With RL_ORACLE_REQUIRE_FRAMEWORKS=1 (set by .ci/run after ``make frameworks``), a test marked
    ``framework`` that skips (its framework not importable) fails instead: in CI a skip would hide
    that the real TRL / verl / OpenRLHF code never ran."""
    outcome = yield
    report = outcome.get_result()
    required = os.environ.get("RL_ORACLE_REQUIRE_FRAMEWORKS") == "1"
    if required and report.skipped and item.get_closest_marker("framework") is not None:
        report.outcome = "failed"
        report.longrepr = f"framework test skipped although RL_ORACLE_REQUIRE_FRAMEWORKS=1: {report.longrepr}"
    # likewise RL_ORACLE_REQUIRE_NODE=1 (CI): the JavaScript consumer of the golden vectors must run
    if os.environ.get("RL_ORACLE_REQUIRE_NODE") == "1" and report.skipped and item.get_closest_marker("node"):
        report.outcome = "failed"
        report.longrepr = f"node test skipped although RL_ORACLE_REQUIRE_NODE=1: {report.longrepr}"


@pytest.fixture(scope="session")
def real_matrix():
    """``refimpl.conformance.matrix.build_matrix`` of the installed frameworks, built at most once per
    session for each framework selection (about 15 s of CPU with TRL, verl and OpenRLHF installed)."""
    from refimpl.conformance import matrix

    return functools.cache(matrix.build_matrix)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "auto_device: resolves the trainer's device='auto' (CUDA when present) on purpose"
    )
    config.addinivalue_line(
        "markers", "threads: may compute differently at two intra-op threads (make test-threads runs these)"
    )
    config.addinivalue_line(
        "markers", "real_matrix: builds the installed frameworks' whole matrix (make test-matrix runs these)"
    )


# Test modules, and test functions (every parametrisation) in other modules, whose every torch result
# was found bit for bit the same at one and at two intra-op threads (tests/thread_survey.py; docs/ci.md:
# the method; numpy's BLAS runs at one thread in both of CI's passes). Every other test is marked
# ``threads`` and runs again in CI's two-thread pass.
THREAD_INSENSITIVE_MODULES = frozenset({
    "test_default_device.py", "test_losses_parts.py", "test_mutation_kills_advantages.py",
    "test_mutation_kills_kl.py", "test_mutation_kills_lossopts.py", "test_mutation_kills_policy.py",
    "test_policy_loss_nonfinite.py", "test_policy_loss_parts.py", "test_policy_loss_specs.py",
    "test_policy_loss_value_kl.py", "test_spec_exactness.py",
    # surveyed 2026-11-28 (1,701 tests of 17 modules)
    "test_conformance_classes.py", "test_conformance_diagnosis.py", "test_conformance_golden.py",
    "test_conformance_zoo.py", "test_group_expectations.py", "test_mdp_spec.py", "test_tabular_gradients.py",
    "test_tabular_improvement.py", "test_tolerances_stated.py", "test_thread_survey.py",
    "test_trajectories.py",
    "test_trust_region.py", "test_trust_region_near_deterministic.py",
    "test_conformance_judge.py", "test_conformance_judge_cases.py", "test_conformance_judge_diagnosis.py",
    "test_conformance_judge_expected.py", "test_conformance_judge_ratio.py",
    "test_conformance_judge_report.py",
    # the generated cases' pins: equal at 1, 2 and 4 threads (session 13's survey: 0 of 7 differ)
    "test_conformance_judge_cases_pin.py",
    # surveyed 2026-11-29 (463 tests of 9 modules, make thread-survey; test_advantages.py and
    # test_lm_train.py agree function by function below)
    "test_cpi.py", "test_estimators.py", "test_kl.py", "test_policy_loss.py",
    "test_policy_loss_invariance.py", "test_tabular_agents.py", "test_tabular_evaluation.py",
    # and 708 tests of 13 more modules (the compiled path's tests left out: the survey cannot see inside a
    # compiled kernel)
    "test_conformance_device.py", "test_docs_references.py", "test_matrix_check.py",
})
THREAD_INSENSITIVE_TESTS = frozenset({
    *(f"test_conformance.py::{name}" for name in (
        "test_a_case_line_is_python_that_rebuilds_the_case_and_its_numbers",
        "test_a_function_that_raises_is_reported_not_crashed", "test_case_classes_cover_their_edges",
        "test_cases_are_deterministic", "test_every_flag_is_documented_with_a_reason",
        "test_grpo_with_kl_passes_under_every_convention_including_the_kl_class", "test_kl_estimators_pass",
        "test_on_boundary_cases_sit_exactly_on_each_bound_with_both_advantage_signs",
        "test_our_presets_pass_every_case_class_under_every_shipped_convention",
        "test_profiles_that_do_not_exist_are_refused", "test_report_table_and_smallest_failing_case_in_full",
        "test_sequence_level_boundary_cases_put_the_sequence_ratio_on_the_bound",
        "test_token_logprobs_checker",
        "test_trl_differences_are_the_documented_ones", "test_verl_differences_are_the_documented_ones")),
    *(f"test_advantages.py::{name}" for name in (
        "test_advantages_that_overflow_the_dtype_raise", "test_arguments_are_explicit",
        "test_atypical_selection_factor_closed_forms",
        "test_binary_factor_against_brute_force_reward_vectors",
        "test_binary_gradient_factors_match_the_closed_forms_of_the_spec", "test_dynamic_sampling_mask",
        "test_empty_batches_give_empty_results", "test_erratum_000_std_without_square_is_zero",
        "test_error_messages_name_the_argument_exactly",
        "test_every_convention_at_extreme_magnitudes_equals_the_exact_spec",
        "test_every_convention_matches_spec_and_loop", "test_float32_rewards_of_1e20_give_plus_minus_one",
        "test_group_units_are_exact_powers_of_two", "test_half_precision_rewards",
        "test_magistral_divides_group_centred_values_by_the_minibatch_std", "test_overlong_filter_mask",
        "test_overlong_filter_mask_keeps_the_mask_dtype",
        "test_overlong_penalty_at_the_edges_of_the_soft_zone", "test_overlong_penalty_piecewise_linear",
        "test_overlong_penalty_with_a_one_token_limit", "test_permutation_and_relabelling_equivariance",
        "test_selecting_the_most_atypical_rewards_is_along_grad_j_exactly_when_rewards_are_binary",
        "test_singleton_groups", "test_subnormal_rewards_with_a_large_eps_keep_their_exact_advantage",
        "test_trl_and_verl_formulas_on_contiguous_groups", "test_zero_variance_groups")),
    *(f"test_lm_train.py::{name}" for name in (
        "test_auto_device_is_cuda_where_present_else_the_cpu", "test_bad_config_is_rejected_at_construction",
        "test_dynamic_sampling_keeps_only_groups_with_signal",
        "test_every_config_field_has_a_validation_rule",
        "test_magistral_minibatch_normalisation_equals_batch_scale_on_the_whole_batch",
        "test_overlong_filter_masks_truncated_responses_and_penalty_shapes_rewards",
        "test_ppo_rlhf_returns_fold_the_kl_into_the_per_token_reward",
        "test_reported_reward_and_accuracy_cover_every_drawn_sample",
        "test_the_model_takes_an_empty_batch_where_attention_returns_none")),
    *(f"test_conformance_cli.py::{name}" for name in (
        "test_conventions_and_differences_in_process",
        "test_each_subcommand_refuses_the_options_that_do_not_fit_it",
        "test_variant_parses_the_integer_fields_that_default_to_none")),
    *(f"test_conformance_kinds.py::{name}" for name in (
        "test_a_halved_value_loss_and_an_ignored_truncation_are_named",
        "test_a_one_pass_float32_variance_fails_the_large_offset_and_constant_classes",
        "test_a_wrong_output_is_one_failing_case_not_a_crash",
        "test_an_unmasked_mean_is_named_and_only_that_flag",
        "test_every_kind_is_registered_with_distinct_prefixed_flags",
        "test_the_behavior_correction_kind_is_the_loop", "test_the_gae_kind_is_the_spec_row_by_row",
        "test_the_kl_reward_kind_is_the_spec", "test_the_reference_functions_pass_their_kinds",
        "test_the_value_loss_kind_is_the_spec", "test_the_whitening_reference_edges",
        "test_the_whitening_reference_is_the_spec")),
    *(f"test_cuda.py::{name}" for name in (
        "test_a_custom_autograd_function_gets_its_inputs_on_the_device", "test_on_device_is_transparent",
        "test_the_comparison_fails_on_a_wrong_result",
        "test_the_module_covers_every_case_of_the_default_device_test")),
    *(f"test_lm_core.py::{name}" for name in (
        "test_addition_targets_are_reversed_sums_with_eos", "test_bad_task_inputs",
        "test_checkpoint_roundtrip_and_shape_check",
        "test_first_token_frequencies_match_the_tempered_softmax", "test_generate_rejects_bad_arguments",
        "test_greedy_generation_with_and_without_cache_agree",
        "test_held_out_set_is_fixed_and_disjoint_from_training_problems",
        "test_kv_cache_logits_equal_uncached", "test_model_config_errors", "test_model_is_causal_and_tied",
        "test_rewards_exact_and_partial", "test_rope_rotation_preserves_norms",
        "test_sort_targets_are_sorted_digits_with_eos", "test_top_k_restricts_samples_and_renormalises",
        "test_trainer_logprobs_equal_sampler_logprobs")),
    *(f"test_lm_dapo_ablation.py::{name}" for name in (
        "test_the_ladder_adds_one_part_at_a_time_and_ends_at_dapo",
        "test_truncation_rate_counts_every_sample_drawn")),
    *(f"test_lm_recipes.py::{name}" for name in (
        "test_an_override_that_makes_the_variant_invalid_is_refused",
        "test_eps_high_and_aggregation_override_the_variant",
        "test_every_loss_name_is_a_recipe_over_a_policy_loss_preset", "test_help_notes_come_from_the_recipes",
        "test_overridable_fields_default_to_none",
        "test_prorl_and_magistral_are_replacements_of_the_dapo_preset",
        "test_resolve_recipe_defaults_and_explicit_settings", "test_update_metrics_by_hand",
        "test_zero_signal_modes_resolve_and_refuse_contradictions")),
    *(f"test_numpy_consumer.py::{name}" for name in (
        "test_a_stub_that_raises_not_implemented_error_passes_no_vector",
        "test_a_stub_that_raises_value_error_passes_exactly_the_invalid_vectors",
        "test_a_value_error_subclass_rejects", "test_a_version_1_file_is_refused_with_a_clear_error",
        "test_float32_tolerance_and_unknown_dtype",
        "test_messages_print_plain_numbers_with_position_and_tolerance",
        "test_only_selects_families_presets_and_ids", "test_only_value_error_rejects_an_invalid_vector",
        "test_planted_bug_accepting_nan_is_caught_by_invalid_vectors",
        "test_planted_bug_advantages_population_std_for_sample",
        "test_planted_bug_convention_drops_empty_rows", "test_planted_bug_kl_k3_without_expm1",
        "test_planted_bug_logprobs_without_max_shift",
        "test_planted_bug_per_decision_is_uses_the_trajectory_weight",
        "test_planted_bug_policy_loss_upper_clip_uses_eps_low",
        "test_planted_bug_returns_truncation_as_termination",
        "test_planted_bug_tabular_advantages_against_the_best_action",
        "test_planted_bug_tabular_occupancy_normalised", "test_planted_bug_tabular_unchecked_solve",
        "test_refimpl_passes_every_vector", "test_tabular_tolerance_is_not_vacuous",
        "test_the_checkout_launcher_re_exports_the_consumer",
        "test_the_consumer_imports_only_numpy_and_the_standard_library",
        "test_the_refimpl_vectors_subcommand_is_the_same_command")),
    *(f"test_policy_loss_fast.py::{name}" for name in (
        "test_a_seq_sum_max_length_below_a_sequence_length_raises",
        "test_an_empty_batch_gives_what_the_reference_gives",
        "test_fast_path_equals_the_reference_on_every_case_class",
        "test_fast_path_equals_the_reference_on_every_part_of_the_family",
        "test_fast_path_passes_the_conformance_kit", "test_fast_path_raises_what_the_reference_raises")),
    *(f"test_conformance_frameworks.py::{name}" for name in (
        "test_a_driver_that_cannot_load_its_framework_is_one_line", "test_framework_usage_errors",
        "test_matrix_with_a_fake_driver", "test_missing_framework_is_one_line_and_a_failure_when_required")),
    *(f"test_policy_loss_closed_form.py::{name}" for name in (
        "test_blocks_of_rows_equal_the_reference",
        "test_policy_loss_equals_the_reference_on_every_case_class",
        "test_policy_loss_equals_the_reference_on_every_part_of_the_family",
        "test_the_module_imports_no_policy_module", "test_the_reference_passes_the_conformance_kit",
        "test_what_the_closed_form_leaves_to_the_reference")),
    *(f"test_policy_loss_options.py::{name}" for name in (
        "test_dynamic_sampling_forms_agree_when_a_row_is_empty",
        "test_dynamic_sampling_weights_equal_the_upweighted_normalizer_on_every_mask",
        "test_dynamic_sampling_weights_reject_a_bad_mask_by_name", "test_seq_mean_token_sum_by_hand",
        "test_sequence_scale_is_beta_times_the_mean_sequence_kl_whatever_the_aggregation",
        "test_sequence_scale_penalises_beta_times_the_sequence_kl_under_every_aggregation",
        "test_sequence_scale_with_a_global_normalizer_matches_the_spec_and_micro_batches_sum",
        "test_sqrt_g_aggregation_needs_group_size_counts_sequences_and_multiplies_by_sqrt_g",
        "test_sqrt_g_gradient_at_ratio_one_is_sqrt_g_times_grpo_s",
        "test_the_two_kl_scales_coincide_under_seq_mean_and_differ_elsewhere",
        "test_token_mean_with_a_global_normalizer_and_a_sequence_kl_is_an_error",
        "test_token_scale_divides_the_kl_by_each_length_l_max_or_the_token_count",
        "test_token_scale_gradient_under_grpo_weights_each_response_by_one_over_its_length",
        "test_upweighted_dynamic_sampling_loss_matches_the_spec",
        "test_upweighted_normalizer_is_1_minus_f_times_the_whole_batch_s",
        "test_upweighted_normalizer_rejects_bad_input", "test_variant_rejects_bad_kl_scale_and_group_size")),
    *(f"test_value_learning.py::{name}" for name in (
        "test_a2c_critic_is_the_exact_value_of_its_final_policy",
        "test_a2c_first_two_updates_equal_an_independent_replay", "test_learners_reject_bad_arguments",
        "test_mc_evaluation_within_four_exact_standard_errors", "test_q_learning_and_sarsa_reach_q_star",
        "test_schedules_and_epsilon_greedy", "test_td0_bootstraps_through_truncation",
        "test_td0_within_005_of_v",
        "test_terminated_stops_bootstrapping_in_q_learning")),
    *(f"test_vector_files_and_scalars.py::{name}" for name in (
        "test_a_bool_or_a_non_scalar_is_refused_naming_the_argument",
        "test_a_corrupted_file_is_named_in_one_line_and_never_passes",
        "test_a_discount_of_any_real_type_is_accepted",
        "test_a_truncated_file_is_named",
        "test_integer_arguments_take_numpy_and_tensor_integers_but_not_floats_or_bools")),
})


def _thread_insensitive(item) -> bool:
    return item.path.name in THREAD_INSENSITIVE_MODULES or \
        f"{item.path.name}::{item.originalname}" in THREAD_INSENSITIVE_TESTS


def pytest_collection_modifyitems(config, items):
    for item in items:
        # a real-framework test runs in the two-thread pass whatever its module: the frameworks are
        # installed there only (CI's one-thread pass is a newcomer's checkout without them)
        if not _thread_insensitive(item) or item.get_closest_marker("framework"):
            item.add_marker("threads")
        # the tests that build the whole matrix of the installed frameworks (one build per process, the
        # ``real_matrix`` fixture): CI runs them apart from the two-thread pass (make test-matrix)
        if "real_matrix" in getattr(item, "fixturenames", ()):
            item.add_marker("real_matrix")


@pytest.fixture(autouse=True)
def _device_is_named(request, monkeypatch):
    """A test that builds a trainer names its device: ``device="auto"`` picks CUDA where it is present,
    and a test written on a CPU-only machine then mixes devices (or runs other kernels) on a GPU one.
    Resolving "auto" fails the test unless it is marked ``auto_device``."""
    if request.node.get_closest_marker("auto_device") is not None:
        return

    def refuse() -> str:
        pytest.fail("device='auto' resolved in a test: name the device (e.g. device='cpu', --device cpu), "
                    "or mark the test auto_device", pytrace=False)

    monkeypatch.setattr("refimpl.lm.train.auto_device", refuse)

"""The vocabulary of golden-vector flags (schema version 2, specs/vectors/SCHEMA.md).

Every vector names the edges it exercises with flags from ``FLAGS`` (name -> what the vector
holds), so that a failing vector tells the reader what is wrong, as Wycheproof's flags do. A test
checks that every flag used is defined here, that every flag here is used by at least one vector
and that SCHEMA.md documents each of them. Imports nothing from the project.
"""

from __future__ import annotations

__all__ = ["FLAGS", "RESULTS"]

#: A vector's ``result``: ``valid`` (compare with ``expected``), ``invalid`` (the input must be
#: rejected: ``reason`` says why; ``expected`` is null), ``acceptable`` (valid input whose result may
#: legitimately take one of two values: ``reason`` says which part and ``expected`` gives both).
RESULTS = ("valid", "invalid", "acceptable")

FLAGS: dict[str, str] = {
    # --- shapes and rows
    "ragged_lengths": "rows of different lengths (padded and masked by the consumer)",
    "empty_row": (
        "a row with no tokens (all masked): it contributes nothing; whether it counts in a sequence mean "
        "is the convention's"
    ),
    "all_rows_empty": "every row is empty: the loss is 0 with a zero gradient",
    "single_token": "one row of one token",
    "global_normalizer": "a micro-batch with the global denominator D given (inputs.normalizer)",
    "bf16_exact_inputs": "every input is exactly representable in bfloat16 (inputs.dtype = bfloat16)",
    "nonfinite_padding": (
        "the consumer must pad with inputs.padding_value (NaN or -inf): masked positions must never reach"
        " the result"
    ),
    # --- ratios and gates of the policy loss
    "ratio_one": "logp == old_logp: every ratio is exactly 1 (policy_losses.md eq. (17))",
    "ratio_above_upper_clip": (
        "a unit with A > 0 and ratio > 1 + eps_high: its hard-clip gate is closed (CISPO: its weight is "
        "clipped)"
    ),
    "ratio_below_lower_clip": (
        "a unit with A < 0 and ratio < 1 - eps_low: its hard-clip gate is closed (CISPO: its weight is "
        "clipped)"
    ),
    "ratio_on_upper_clip": (
        "a unit within one float64 rounding of 1 + eps_high (A > 0): a hard gate's gradient is acceptable"
        " either side"
    ),
    "ratio_on_lower_clip": (
        "a unit within one float64 rounding of 1 - eps_low (A < 0): a hard gate's gradient is acceptable "
        "either side"
    ),
    "dual_clip_active": "a unit with A < 0 and ratio > the dual-clip constant c",
    "ratio_on_dual_clip": (
        "a unit within one float64 rounding of the dual-clip constant c (A < 0): a hard gate's gradient is "
        "acceptable either side"
    ),
    "log_ratio_20": "|logp - old_logp| (or |log r|) above 20: beyond verl's / OpenRLHF's clamps",
    "log_ratio_50": (
        "|logp - old_logp| (or |log r|) of 50 or more: exp over- and underflows float16 / float32 ranges"
    ),
    "zero_advantage": "an advantage exactly 0",
    "subnormal_input": "an input below 2^-1022 (a float64 subnormal)",
    "subnormal_result": "an expected value below 2^-1022: a flush-to-zero or float32 path fails",
    "kl_k1": "a KL penalty with estimator k1 (kl.md eq. (2))",
    "kl_k2": "a KL penalty with estimator k2 (kl.md eq. (3))",
    "kl_k3": "a KL penalty with estimator k3 (kl.md eq. (4))",
    "convention_clamp_active": (
        "a framework clamp of the convention (log-ratio, KL log-ratio, KL value or sequence log-ratio cap) "
        "changes the result"
    ),
    "log_ratio_on_cap": (
        "a row's sequence log-ratio log s_i exactly on the convention's cap (verl GSPO: 10; exact in float64 "
        "too): the clamp passes the gradient on its bound"
    ),
    # --- KL estimators
    "log_ratio_zero": "log r = 0: every estimator and its derivative are 0 (k1's derivative is 1)",
    "log_ratio_tiny": (
        "0 < |log r| <= 2^-20: k3 = exp(x) - 1 - x cancels catastrophically unless computed with expm1"
    ),
    "large_ratio": "r = exp(log r) >= 2^40: k3's value is dominated by r",
    # --- group advantages
    "singleton_group": "a group with one sample (no baseline): the convention's singleton rule applies",
    "zero_variance_group": "a group of >= 2 equal rewards: the convention's zero-variance rule applies",
    "unequal_groups": "groups of different sizes",
    "non_contiguous_groups": "the members of a group are not adjacent in the batch",
    "single_group": "the whole batch is one group",
    "binary_rewards": "0/1 rewards (verifiable rewards)",
    "tiny_variance": "a group whose rewards differ by about 2^-20: eps dominates the std",
    "large_rewards": "rewards of magnitude 2^20 or more",
    "leave_one_out": "RLOO's leave-one-out baseline",
    # --- log-probabilities from logits
    "uniform_logits": "all logits of a row are equal: log p = -log V",
    "large_logits": "logits of magnitude 1000 or more: exp overflows without the max shift",
    "dominant_logit": "one logit exceeds the others by 100 or more: log p of it is about -exp(-100)",
    "neg_inf_logit": "a logit of -inf (a zero-probability token) that is not the chosen token",
    "vocab_one": "a vocabulary of one token: log p = 0",
    # --- returns, GAE
    "terminated_step": "a step that reaches a terminal state mid-row: nothing is bootstrapped after it",
    "truncated_step": (
        "a step cut by a time limit (mid-row or last): its next value is bootstrapped and the trace stops"
    ),
    "ends_mid_episode": (
        "the row's last step is neither terminated nor truncated: bootstrapped from next_values"
    ),
    "multiple_episodes": "a row holds two or more episodes back to back",
    "single_step_row": "rows of one step (T = 1)",
    "gamma_zero": "gamma = 0: returns are the rewards",
    "gamma_one_episodic": "gamma = 1 (undiscounted, valid because every segment ends)",
    "lambda_zero": "lambda = 0: GAE is the TD error",
    "lambda_one": "lambda = 1: GAE is the Monte-Carlo advantage G - V",
    "n_beyond_segment": "n-step with n larger than the steps left in the segment",
    "next_values_inconsistent": (
        "next_values[t] != values[t + 1] inside a segment (a stale critic): only the definition, not a "
        "telescoped form, gives the result"
    ),
    # --- importance sampling
    "equal_policies": "target == behaviour log-probs: every weight is 1",
    "masked_steps": "mask has zeros: masked steps contribute no ratio and no reward",
    "single_sample": "one sample: SNIS returns f itself",
    # --- invalid input
    "nan_input": "an input holds NaN at a position that counts (must be rejected)",
    "inf_input": "an input holds +-inf at a position that counts (must be rejected)",
    "shape_mismatch": "two inputs whose shapes disagree (no silent broadcasting; must be rejected)",
    "bad_argument": (
        "an argument outside its domain (gamma outside [0, 1], normalizer <= 0, a token id out of "
        "range...)"
    ),
    "conflicting_flags": "a step flagged both terminated and truncated (must be rejected)",
    "missing_bootstrap": "a segment ends without termination and next_values is absent (must be rejected)",
    "rejected_by_convention": "a degenerate input that the convention rejects (e.g. TRL's singleton groups)",
    "negative_weight": "an importance weight below 0 (must be rejected)",
    "zero_weight_sum": "importance weights that sum to 0 (SNIS undefined; must be rejected)",
    "all_neg_inf_row": "a row of logits that are all -inf (no distribution; must be rejected)",
}

"""Driver for Unsloth's GRPO loss: ``grpo_compute_loss`` and the autograd function
``UnslothEfficientGRPO`` of the installed unsloth-zoo (2026.10.9, unsloth_zoo/rl_replacements.py),
which Unsloth's patched GRPO trainer calls in place of TRL's ``_compute_loss``.

How unsloth-zoo is imported. Its package ``__init__`` looks for a GPU and raises without one
(device_type.py: "Unsloth cannot find any torch accelerator? You need a GPU."), so the driver executes
the installed files it runs, unchanged, as private modules (``sources.load_source``): ``log.py``,
``temporary_patches/common.py`` (the compile options and ``_maybe_compile``) and
``rl_replacements.py``, with ``UNSLOTH_COMPILE_DISABLE=1``, Unsloth's own switch that turns every
``torch.compile`` of these files off (common.py:423, temporary_patches/utils.py:2356): the losses run
eagerly, as on a machine without a compiler. Import-only stand-ins, removed afterwards: ``device_type``
(``DEVICE_TYPE`` and ``device_synchronize``, used only by the trainer-side ``grpo_accumulated_loss``),
``dataset_utils`` (``sft_prepare_dataset``, re-exported for the SFT trainer) and
``temporary_patches.utils``, whose one name ``UnslothEfficientGRPO.forward`` imports while it runs,
``torch_compile_with_fallback``, returns the function unchanged as the real one does under
``UNSLOTH_COMPILE_DISABLE`` (utils.py:2356-2357).

What a call does (``grpo_accumulated_loss``, rl_replacements.py:2624-3870, one process): the keyword
arguments the trainer forwards from TRL's ``GRPOConfig`` (``loss_type``, ``epsilon_low`` /
``epsilon_high``, ``max_completion_length``, ``importance_sampling_level``, ``beta``,
``use_bias_correction_kl`` = TRL's default True, the SAPO temperatures) and the accumulation counts
(``current_gradient_accumulation_steps`` = ``steps_per_generation`` = the call's micro-batches,
``num_items_in_batch`` = its ``global_tokens``), as TRL's driver sets them. Every mode calls
``grpo_compute_loss``; ``efficient_loss`` calls the trainer's path to it,
``UnslothEfficientGRPO.apply(..., n_chunks=1)`` (the trainer's only value: ``_warn_deprecated_n_chunks``),
whose gradient is ``torch.func.grad_and_value`` of the same function and whose value is accumulated
in a float32 tensor (rl_replacements.py:1314): the same gradient, the value rounded to float32 for
float64 inputs (finding ``efficient_value_float32``; tests/test_framework_unsloth.py compares the two
paths on every case of every mode, as the kit has no flag for a value rounded without its gradient).

Not driven: ``grpo_accumulated_loss`` itself (it needs a model: the log-probabilities come from the
hidden states through the LM head, in row mini-batches); nothing driven here needs a GPU.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from . import Mode
from .driver import distribution_version, find_mode
from .findings import Finding, ratio_overflow_finding, zero_rows_finding
from .releases import release_modes
from .sources import (
    installed_files,
    load_failure,
    load_source,
    package_dir,
    private_package,
    stand_in,
    temporary_modules,
)

__all__ = ["NAME", "PINNED_VERSION", "DISTRIBUTION", "MODES", "UNSUPPORTED", "PROFILE", "NOTES", "FINDINGS",
           "STUBBED", "availability", "source_files", "loss_kwargs", "target", "efficient_loss"]

NAME = "unsloth"
PINNED_VERSION = "2026.10.9"
DISTRIBUTION = "unsloth-zoo"
_PRIVATE = "_refimpl_unsloth"
_SOURCES = ("rl_replacements.py", "temporary_patches/common.py", "log.py", "fused_losses/chunked_logprob.py",
            "fused_losses/stable_softmax.py")
_INSTALL = "refimpl frameworks install unsloth"
STUBBED: list[str] = []

# The profile: TRL's GRPO (the loss Unsloth replaces), with Unsloth's own differences:
# * masked_nonfinite "ignore": new / old / ref are set to 0 on masked tokens before any ratio
#   (torch.where(_keep, new, 0.0)), so a NaN or inf there never reaches the loss;
# * the k3 term: log(ref / new) clamped to +-20 and the term to +-10 (TRL does not clamp), written
#   expm1(x) - x, times the ratio (use_bias_correction_kl, TRL's default) before the value clamp
#   (kl_value_clamp_scope "weighted": "Clamp after correction so a saturated KL also stops the ratio's
#   gradient");
# * sapo: the temperatures of torch.where(advantages > 0, tau_pos, tau_neg) are float32, as TRL's.
_COMMON = {"empty_rows": "keep", "token_sum_rows": "all", "compute_dtype": "input",
           "masked_nonfinite": "ignore"}
_KL = {"kl_importance_weight": True, "kl_log_ratio_clamp": 20.0, "kl_value_clamp": 10.0,
       "kl_value_clamp_scope": "weighted"}
_LOCAL = {"micro_batch": "local_mean"}
# * ratio_overflow "nan": coef_1 = torch.exp(log_importance_weights) of the raw log-ratio (every loss type
#   but cispo, whose weight is detached and capped): inf above 88.72 in float32, NaN through a closed gate;
# * zero_rows "nan": grpo / sapo take .mean() over the rows, luspo too, dr_grpo divides by rows x L: a
#   batch without rows gives 0 / 0.
_EXP = {"ratio_overflow": "nan"}
_ROWS = {"zero_rows": "nan"}
_LE = {**_LOCAL, **_EXP}
_LER = {**_LE, **_ROWS}


def _mode(name: str, preset: str, loss_type: str, convention: dict, description: str, *, level="token",
          config: dict | None = None, **overrides) -> Mode:
    return Mode(name, preset=preset, variant_overrides=overrides,
                framework_config={"loss_type": loss_type, "importance_sampling_level": level,
                                  **(config or {})},
                convention={**_COMMON, **convention}, description=description)


_LOSSES = (
    _mode("grpo", "grpo", "grpo", _LER, "mean of each row's token mean, / accumulation steps"),
    _mode("bnpo", "bnpo", "bnpo", _LE, "token mean of the micro-batch (the local count, also when TRL "
          "has a global one), / accumulation steps"),
    _mode("dr_grpo", "dr_grpo", "dr_grpo", _LER, "token sum / (rows x max_completion_length), "
          "/ accumulation steps", max_length=16),
    _mode("dapo", "dapo", "dapo", _EXP, "token sum / num_items_in_batch (the global tokens)"),
    # delta (INTELLECT-2's two-sided clipping, -min(min(r, delta) A, clip(r) A), rl_replacements.py:1159;
    # grpo_compute_loss reads it from its keyword arguments, :953)
    # at delta >= 1 + epsilon_high is the dual clip with c = delta: for A > 0 the clip caps r first, for
    # A < 0 it is the median form of the dual clip; clamp passes the gradient at r == delta, the spec's
    # inclusive gate (TRL's grpo_trainer.py:3115-3119 and Liger's dapo/delta run the same formula)
    _mode("dapo/delta", "dapo", "dapo", _EXP, "dapo with delta=3.0 (INTELLECT-2's cap on the ratio: the "
          "dual clip for A < 0)", config={"delta": 3.0}, dual_clip=3.0),
    _mode("cispo", "cispo", "cispo", {}, "sg(min(r, epsilon_high)) A logp, / num_items_in_batch"),
    _mode("sapo", "sapo", "sapo", {**_LER, "sapo_tau_float32": True}, "SAPO's sigmoid gate (float32 "
          "temperatures), GRPO's aggregation"),
    _mode("gspo", "gspo", "grpo", _LER, "importance_sampling_level='sequence' with loss_type='grpo'",
          level="sequence", aggregation="seq_mean_token_mean"),
    _mode("luspo", "gspo", "luspo", _LER, "GSPO's sequence ratio, each row's sum, mean over rows",
          level="sequence", aggregation="seq_mean_token_sum"),
    _mode("grpo+kl/k3", "grpo", "grpo", {**_LER, **_KL}, "grpo with beta 0.04: the clamped k3 term "
          "times the ratio", kl_coef=0.04, kl_estimator="k3"),
    # UNSLOTH_GRPO_ROLLOUT_LOGPROBS_AS_OLD=1 (verl's bypass mode: the rollout's log-probs are pi_old):
    # grpo_accumulated_loss sets rollout_logps_as_old (rl_replacements.py:3768) and grpo_compute_loss
    # clamps the log-ratio to [-20, 20] before exp (:1117-1120), verl's stability clamp
    _mode("grpo/rollout-logps-as-old", "grpo", "grpo", {**_LER, "log_ratio_clamp": 20.0},
          "grpo with the rollout's log-probs as old (UNSLOTH_GRPO_ROLLOUT_LOGPROBS_AS_OLD=1): the "
          "log-ratio clamped to +-20 before exp", config={"rollout_logps_as_old": True}),
)
#: what a release computes differently from the pinned one (releases.py): before 2026.10.9 the k3 term
#: is clamped to [-10, 10] before the importance weight, and bnpo divides by TRL's global token count
#: (num_items_in_batch) when it has one
_BEFORE_2026_10_9 = {"bnpo": {"micro_batch": "global"}, "grpo+kl/k3": {"kl_value_clamp_scope": "k3"}}
RELEASE_FLAGS = {"2026.9.9": _BEFORE_2026_10_9, "2026.10.8": _BEFORE_2026_10_9}
_RELEASE = distribution_version(DISTRIBUTION)
#: modes and findings checked against 2026.10.9 only (the audit of issue 27 read that release)
_PINNED_ONLY = ("grpo/rollout-logps-as-old",)
_RELEASE_LOSSES = tuple(m for m in _LOSSES if _RELEASE not in RELEASE_FLAGS or m.name not in _PINNED_ONLY)
MODES = release_modes(_RELEASE_LOSSES, RELEASE_FLAGS, DISTRIBUTION)
UNSUPPORTED = {
    "policy_loss": {
        "vespo": "VESPO's Gamma weights come from TRL's GRPOTrainer.get_gamma_weights (the TRL driver "
        "does not drive it either); no gate in refimpl's policy-loss family.",
        "delta < 1 + epsilon_high": "delta (two-sided clipping) at or above 1 + epsilon_high is the dual "
        "clip (mode dapo/delta); below it, delta caps the ratio of A > 0 tokens inside the clip band, a "
        "setting TRL's GRPOConfig accepts silently (TRL finding config:delta) and Unsloth's "
        "grpo_compute_loss too (finding config:delta), not a spec variant.",
        "vllm_importance_sampling_correction / off_policy_mask_threshold / rollout_rs": "need vLLM's "
        "sampling log-probs, which the kit's calls do not carry; TRL's default mode weighs token ratios "
        "by one sequence-level weight (finding vllm_is_sequence_weight).",
        "sample_weight / entropy_mask / entropy bonus": "need Unsloth's generation step or the model's "
        "entropies; the bonus is a token mean over the batch whatever the loss type (finding "
        "entropy_token_mean).",
        "grpo_accumulated_loss": "needs a model: the log-probabilities come from its hidden states "
        "through the LM head; it rebuilds the loss mask from the pad id, which drops the EOS token "
        "where pad == eos (finding completion_mask_pad_eos, shown by its script).",
        "UnslothEfficientGRPO": "the trainer's path to grpo_compute_loss: its gradient is the same and its "
        "value float32 (finding efficient_value_float32), checked against the modes in the tests, not a "
        "mode of the matrix (the kit's flags round a loss's value and gradient together); its backward "
        "ignores grad_output (finding efficient_grad_output).",
        "n_chunks > 1": "the trainer always calls UnslothEfficientGRPO with one chunk "
        "(_warn_deprecated_n_chunks). A direct call with n_chunks > 1 normalises each torch.chunk on its "
        "own and divides the sum by n_chunks (rl_replacements.py:1354-1405): dapo's and cispo's global "
        "normaliser comes out / n_chunks, and torch.chunk may return fewer chunks than asked.",
        "dr_grpo with completions longer than max_completion_length": "Dr. GRPO's L_max bounds every "
        "response (policy_losses.md eq. (11)); grpo_compute_loss divides by it without checking, and by "
        "8192 when the key is missing (finding config:max_completion_length, shown by its script).",
    },
    "kl": {"k3": "Unsloth has no standalone KL function: its k3 term is inline in grpo_compute_loss "
                 "(mode grpo+kl/k3)."},
    "group_advantages": {"group": "Unsloth keeps TRL's advantages (computed in TRL's trainer), "
                                  "driven by the TRL profile."},
}

PROFILE = {p: (p,) for p in ("grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo")} | {"ppo": ("bnpo",)}

#: the line of the float32 accumulator in each release's rl_replacements.py
_ACCUMULATOR_LINE = {"2026.9.9": 743, "2026.10.8": 1202}.get(_RELEASE or "", 1314)
_BNPO = (
    Finding(
        "bnpo_local_count", "documented_default",
        "bnpo divides by the micro-batch's own token count even when TRL supplies the global one (the "
        "code says so): with gradient accumulation the loss is a mean of micro-batch token means, as "
        "in TRL's bnpo.",
        where="rl_replacements.py:1228", quote="loss = (loss_i * mask).sum() / mask.sum().clamp(min=1.0)",
        affected="unsloth-zoo 2026.10.9",
    ),
)
_AFFECTED = "unsloth-zoo 2026.10.9"
#: found by the source-first audit of issue 27 (lines verified in 2026.10.9)
_FINDINGS_2026_10_9 = (
    Finding(
        "config:delta", "validation",
        "delta (TRL's two-sided clipping, -min(min(r, delta) A, clip(r) A)) below 1 + epsilon_high is "
        "accepted without an error or a warning: an A > 0 token whose ratio lies between delta and "
        "1 + epsilon_high, inside the clip band, gets gradient 0 instead of -A r (delta 1.1, epsilon_high "
        "0.2, ratio 1.15); cispo and sapo ignore delta, also silently.",
        where="rl_replacements.py:1159", quote="loss_1 = torch.clamp(coef_1, max=delta) * advantages",
        affected=_AFFECTED,
    ),
    Finding(
        "completion_mask_pad_eos", "bug",
        "grpo_accumulated_loss rebuilds the loss mask from the token ids (rl_replacements.py:2972-2975: "
        "left_pack_padding, then create_completion_attention_mask's ids != pad_token_id): where the pad id "
        "is the EOS id (TRL sets pad = eos when a tokenizer has no pad token; Qwen2.5's base tokenizers "
        "ship it so) the completion's EOS token leaves the loss, where TRL's completion_mask keeps it, and "
        "TRL's num_items_in_batch still counts it: the policy is never taught to stop.",
        where="rl_replacements.py:719", quote="non_padding_mask = (completion_input_ids != pad_token_id)",
        affected=_AFFECTED,
    ),
    Finding(
        "vllm_is_sequence_weight", "documented_default",
        "with use_vllm and vllm_importance_sampling_correction, TRL's default "
        "vllm_importance_sampling_mode 'sequence_mask' (and sequence_truncate) weighs every token ratio by "
        "one sequence weight exp(sum_t (old - sampling)) (the geometric modes: its mean), where "
        "policy_losses.md eq. (13) takes the behaviour weight at the ratio's level (per token for token "
        "ratios); TRL documents the modes.",
        where="rl_replacements.py:1031",
        quote="importance_sampling_ratio = importance_sampling_ratio.sum(dim=-1, keepdim=True)",
        affected=_AFFECTED,
    ),
    Finding(
        "entropy_token_mean", "documented_default",
        "the entropy bonus (entropy_coef != 0) is the entropy's token mean over the batch (divided by the "
        "accumulation steps) for every loss_type, TRL >= 1.10's rule (grpo_entropy_bonus_weights' "
        "docstring), not aggregated like the policy term (policy_losses.md eq. (12)): under grpo, sapo, "
        "dr_grpo and luspo a long response's tokens weigh more than a short one's.",
        where="rl_replacements.py:1500",
        quote="return weights * (-entropy_coef / weights.sum().clamp(min = 1.0) / accumulation_steps)",
        affected=_AFFECTED,
    ),
    Finding(
        "efficient_grad_output", "documented_default",
        "UnslothEfficientGRPO.backward returns the gradient computed in the forward and ignores the "
        "incoming grad_output unless DeepSpeed's upstream_scale is set (UnslothGRPOEntropyBonus' docstring "
        "says why: the mixed-precision scale is applied inside): loss * c backpropagates the gradient of "
        "loss, so a caller that weights or rescales the returned loss changes its value only.",
        where="rl_replacements.py:1427",
        quote="def backward(ctx, grad_output, dcompletion_length, dmean_kl,",
        affected=_AFFECTED,
    ),
    Finding(
        "config:max_completion_length", "validation",
        "dr_grpo divides the token sum by rows x max_completion_length and never checks that a "
        "completion fits in it: a mask wider than max_completion_length (policy_losses.md eq. (11): T_i <= "
        "L_max, a longer response is an error) is accepted without an error or a warning, and a call "
        "without the key divides by 8192 (grpo_compute_loss's default, rl_replacements.py:952). TRL's "
        "generation (tool results included) keeps completions within max_completion_length, so this "
        "reaches a direct caller of grpo_compute_loss, not the trainer.",
        where="rl_replacements.py:1231",
        quote="loss = (loss_i * mask).sum() / (loss_i.size(0) * max_completion_length)",
        affected=_AFFECTED,
    ),
)
FINDINGS = (
    *(() if _RELEASE in RELEASE_FLAGS else _BNPO),  # before 2026.10.9 bnpo took TRL's global count
    ratio_overflow_finding("rl_replacements.py:1133", "coef_1 =  torch.exp(log_importance_weights)",
                           "unsloth-zoo 2026.10.9 (every loss type but cispo)"),
    zero_rows_finding("rl_replacements.py:1224",
                      "loss = ((loss_i * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()",
                      "unsloth-zoo 2026.10.9 (grpo, sapo; dr_grpo and luspo likewise)"),
    Finding(
        "config:epsilon_high", "validation",
        "cispo caps the detached weight at epsilon_high itself (TRL's convention, ScaleRL's eps_max), and "
        "a cap below 1 is accepted without an error or a warning: the value TRL's GRPOConfig forwards when "
        "epsilon_high is unset (epsilon, 0.2) and grpo_compute_loss's own default (0.2, "
        "rl_replacements.py:951) cap every token's weight at 0.2, so an on-policy token's gradient is "
        "0.2 A instead of A.",
        where="rl_replacements.py:1153",
        quote="clamped_ratios = torch.clamp(coef_1, max=epsilon_high).detach()",
        affected="unsloth-zoo 2026.10.9",
    ),
    Finding(
        "efficient_value_float32", "value_only",
        "UnslothEfficientGRPO, through which the trainer calls grpo_compute_loss, accumulates the loss "
        "in a float32 tensor: with float64 log-probabilities the returned value is rounded to float32 "
        "(a relative error up to 6e-8); the gradient is grpo_compute_loss's, unrounded.",
        where=f"rl_replacements.py:{_ACCUMULATOR_LINE}",
        quote="accumulated_loss              = torch.zeros(1, device = device)[0]",
        affected="unsloth-zoo 2026.9.9, 2026.10.8, 2026.10.9",
    ),
    *(() if _RELEASE in RELEASE_FLAGS else _FINDINGS_2026_10_9),
)

NOTES = {
    "masked tokens": "Unsloth zeroes new, old and ref log-probabilities on masked tokens before any "
    "ratio, so a NaN or inf there does not reach the loss (masked_nonfinite='ignore'), where TRL's "
    "loss propagates it.",
    "gradient": "UnslothEfficientGRPO.backward returns the gradient computed in the forward and ignores "
    "the incoming grad_output unless DeepSpeed's upstream_scale is set: loss * c backpropagates the "
    "gradient of loss (the trainer never scales it).",
}


# ----------------------------------------------------------------------------------------------
# Import


def source_files() -> list:
    """The installed files whose code the driver runs (those of the release: 2026.10.8 and earlier
    have no fused_losses/chunked_logprob.py); [] when absent."""
    return [f for f in installed_files("unsloth_zoo", _SOURCES) if f.is_file()]


def _compile_stand_in():
    def torch_compile_with_fallback(fullgraph=False, **_kwargs):
        return lambda func: func  # the real one under UNSLOTH_COMPILE_DISABLE (utils.py:2356)

    return stand_in("unsloth_zoo.temporary_patches.utils",
                    torch_compile_with_fallback=torch_compile_with_fallback)


@functools.cache
def _rl_replacements():
    """``rl_replacements.py`` executed from the installed file (see the module docstring)."""
    root = package_dir("unsloth_zoo")
    if root is None:
        raise ModuleNotFoundError(f"unsloth-zoo is not installed ({_INSTALL})")
    previous = os.environ.get("UNSLOTH_COMPILE_DISABLE")
    os.environ["UNSLOTH_COMPILE_DISABLE"] = "1"
    try:
        private_package(_PRIVATE)
        sys_package = __import__("sys").modules[_PRIVATE]
        sys_package.__path__ = []
        log = load_source(f"{_PRIVATE}.log", root / _SOURCES[2])
        with temporary_modules({"unsloth_zoo.log": log}, only_if_missing=False):
            common = load_source(f"{_PRIVATE}.common", root / _SOURCES[1])
        served = {"unsloth_zoo.log": log, "unsloth_zoo.temporary_patches.common": common}
        if (root / _SOURCES[3]).is_file():  # 2026.10.9: the chunked log-prob module (2026.10.8 has none)
            with temporary_modules(served, only_if_missing=False):
                softmax = load_source(f"{_PRIVATE}.stable_softmax", root / _SOURCES[4])
                served_softmax = {"unsloth_zoo.fused_losses.stable_softmax": softmax}
                with temporary_modules(served_softmax, only_if_missing=False):
                    chunked = load_source(f"{_PRIVATE}.chunked_logprob", root / _SOURCES[3])
            # rl_replacements.py:615 builds the log-prob recompute function at import time, which
            # imports ``from unsloth_zoo.fused_losses import chunked_logprob`` (the real file, loaded
            # privately; the package __init__ would import the model patches)
            served["unsloth_zoo.fused_losses"] = stand_in("unsloth_zoo.fused_losses", chunked_logprob=chunked)
        stand_ins = {
            **served,
            f"{_PRIVATE}.device_type": stand_in(f"{_PRIVATE}.device_type", DEVICE_TYPE="cpu",
                                                device_synchronize=lambda: None),
            f"{_PRIVATE}.dataset_utils": stand_in(f"{_PRIVATE}.dataset_utils", sft_prepare_dataset=None),
        }
        with temporary_modules(stand_ins, only_if_missing=False) as placed:
            module = load_source(f"{_PRIVATE}.rl_replacements", root / _SOURCES[0])
    finally:
        if previous is None:
            os.environ.pop("UNSLOTH_COMPILE_DISABLE", None)
        else:
            os.environ["UNSLOTH_COMPILE_DISABLE"] = previous
    STUBBED[:] = [n for n in placed if n.endswith(("device_type", "dataset_utils"))]
    return module


def availability() -> str | None:
    return load_failure("unsloth_zoo", _INSTALL, _rl_replacements)


# ----------------------------------------------------------------------------------------------
# Modes


def loss_kwargs(mode: str | Mode, variant) -> dict[str, object]:
    """The keyword arguments ``grpo_accumulated_loss`` forwards to ``grpo_compute_loss`` for
    ``variant`` in ``mode`` (ValueError for a variant Unsloth cannot express there); the accumulation
    counts are the call's."""
    m = find_mode(MODES, mode, "Unsloth")
    m.check_shape(variant, "Unsloth")
    v = variant
    if v.kl_coef > 0 and v.kl_estimator != "k3":
        raise ValueError(f"variant.kl_estimator must be 'k3' for Unsloth (its only KL), "
                         f"got {v.kl_estimator!r}")
    if v.entropy_coef or v.behavior_correction != "none":
        raise ValueError("variant.entropy_coef / behavior_correction: not driven for Unsloth")
    loss_type = m.framework_config["loss_type"]
    level = m.framework_config["importance_sampling_level"]
    keys = {"loss_type": loss_type, "importance_sampling_level": level, "use_bias_correction_kl": True,
            "num_processes": 1, "use_vllm": False}
    if loss_type == "cispo":
        if v.eps_low is not None or v.eps_high is None:
            raise ValueError("Unsloth's cispo clamps only above: variant.eps_low must be None and "
                             "eps_high set")
        keys["epsilon_high"] = 1.0 + v.eps_high
    elif loss_type == "sapo":
        keys.update(sapo_temperature_pos=v.tau_pos, sapo_temperature_neg=v.tau_neg)
    else:
        if v.eps_low is None or v.eps_high is None:
            raise ValueError(f"Unsloth's {loss_type} clips on both sides: variant.eps_low and eps_high "
                             "must be set")
        keys.update(epsilon_low=v.eps_low, epsilon_high=v.eps_high)
        if v.dual_clip is not None:  # a clip gate's dual clip, >= 1 + eps_high (the variant holds it)
            keys["delta"] = v.dual_clip
    if m.framework_config.get("rollout_logps_as_old"):
        keys["rollout_logps_as_old"] = True
    if loss_type == "dr_grpo":
        if v.max_length is None:
            raise ValueError("variant.max_length (max_completion_length) is required by dr_grpo")
        keys["max_completion_length"] = int(v.max_length)
    return keys


# ----------------------------------------------------------------------------------------------
# Targets


def _call(fn, call, keys: dict, beta: float, efficient: bool):
    import torch

    count = int(getattr(call, "micro_batch_count", 1) or 1)
    tokens = getattr(call, "global_tokens", 0) or int(call.mask.sum())
    kwargs = {**keys, "current_gradient_accumulation_steps": count, "steps_per_generation": count,
              "num_items_in_batch": torch.tensor(float(tokens))}
    mask = call.mask.to(torch.long)  # TRL's completion_mask
    input_ids = torch.zeros_like(mask)
    ref = call.ref_logp if beta > 0 else None
    compile_utils = {"unsloth_zoo.temporary_patches.utils": _compile_stand_in()}
    with temporary_modules(compile_utils, only_if_missing=False):
        if efficient:
            return fn(call.logp, call.old_logp, ref, None, None, input_ids, mask, call.advantages, beta,
                      None, 1, kwargs, None)[0]
        return fn(ref, call.logp, call.old_logp, None, input_ids, mask, beta, call.advantages, **kwargs)[0]


def target(mode: Mode, variant) -> tuple[Callable, Callable]:
    """``(fn, adapter)``: ``fn`` is ``grpo_compute_loss``; ``adapter(fn, call)`` its loss of the
    (micro-)batch, already divided for accumulation as Unsloth divides it (the kit sums the
    micro-batches' losses)."""
    keys = loss_kwargs(mode, variant)
    beta = float(variant.kl_coef)

    def adapter(fn, call):
        return _call(fn, call, keys, beta, efficient=False)

    adapter.scaled_for_accumulation = True
    return _rl_replacements().grpo_compute_loss, adapter


def efficient_loss(mode: Mode, variant, call):
    """The loss of ``UnslothEfficientGRPO.apply`` (the trainer's path to ``grpo_compute_loss``,
    ``n_chunks`` 1) on the kit's ``call`` in ``mode``."""
    fn = _rl_replacements().UnslothEfficientGRPO.apply
    return _call(fn, call, loss_kwargs(mode, variant), float(variant.kl_coef), efficient=True)

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
)
#: what a release computes differently from the pinned one (releases.py): before 2026.10.9 the k3 term
#: is clamped to [-10, 10] before the importance weight, and bnpo divides by TRL's global token count
#: (num_items_in_batch) when it has one
_BEFORE_2026_10_9 = {"bnpo": {"micro_batch": "global"}, "grpo+kl/k3": {"kl_value_clamp_scope": "k3"}}
RELEASE_FLAGS = {"2026.9.9": _BEFORE_2026_10_9, "2026.10.8": _BEFORE_2026_10_9}
MODES = release_modes(_LOSSES, RELEASE_FLAGS, DISTRIBUTION)
UNSUPPORTED = {
    "policy_loss": {
        "vespo": "VESPO's Gamma weights come from TRL's GRPOTrainer.get_gamma_weights (the TRL driver "
        "does not drive it either); no gate in refimpl's policy-loss family.",
        "delta < 1 + epsilon_high": "delta (two-sided clipping) at or above 1 + epsilon_high is the dual "
        "clip (mode dapo/delta); below it, delta caps the ratio of A > 0 tokens inside the clip band, a "
        "setting TRL's GRPOConfig accepts silently (TRL finding config:delta), not a spec variant.",
        "vllm_importance_sampling_correction / off_policy_mask_threshold / rollout_rs": "need vLLM's "
        "sampling log-probs, which the kit's calls do not carry.",
        "sample_weight / entropy_mask / entropy bonus": "need Unsloth's generation step or the model's "
        "entropies.",
        "grpo_accumulated_loss": "needs a model: the log-probabilities come from its hidden states "
        "through the LM head.",
        "UnslothEfficientGRPO": "the trainer's path to grpo_compute_loss: its gradient is the same and its "
        "value float32 (finding efficient_value_float32), checked against the modes in the tests, not a "
        "mode of the matrix (the kit's flags round a loss's value and gradient together).",
        "n_chunks > 1": "the trainer always calls UnslothEfficientGRPO with one chunk "
        "(_warn_deprecated_n_chunks).",
    },
    "kl": {"k3": "Unsloth has no standalone KL function: its k3 term is inline in grpo_compute_loss "
                 "(mode grpo+kl/k3)."},
    "group_advantages": {"group": "Unsloth keeps TRL's advantages (computed in TRL's trainer), "
                                  "driven by the TRL profile."},
}

PROFILE = {p: (p,) for p in ("grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo")} | {"ppo": ("bnpo",)}

_RELEASE = distribution_version(DISTRIBUTION)
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

"""Driver for TRL: ``GRPOTrainer._compute_loss`` of the installed TRL on a minimal stand-in trainer.

The kit's call becomes one call of TRL's own loss method (trl/trainer/grpo_trainer.py), with no
transcription of its arithmetic: the trainer object is ``object.__new__(GRPOTrainer)`` carrying the
attributes ``__init__`` would copy from a ``GRPOConfig`` (the installed dataclass's defaults with the
mode's keys), a single-process stand-in accelerator (``gather`` and ``reduce`` of one process are the
identity) and, in place of the model forward pass,
``_get_per_token_logps_and_entropies`` returning the kit's leaf ``logp``, so the gradient of TRL's
loss flows back to the kit's tensor.

Micro-batches use TRL's own gradient-accumulation arithmetic: ``current_gradient_accumulation_steps``
and ``args.steps_per_generation`` are the call's ``micro_batch_count`` and ``num_items_in_batch`` is
its ``global_tokens`` (TRL gathers ``loss_mask.sum()`` over the generation batch). TRL's returned
loss is already scaled for accumulation (``GRPOTrainer.loss_is_scaled_for_ga``), so the losses of a
batch's micro-batches are *summed*, as ``accelerator.backward`` sums their gradients.

Half precision (bf16 / fp16 log-probs): TRL computes the per-token terms in the input dtype; its final
division is by a float32 tensor (``mask.sum().clamp(min=1.0)``, ``num_items_in_batch``), so the
returned loss is float32 except for dr_grpo (divided by a Python int: the input dtype), and SAPO's
float32 temperatures promote its gate to float32 (profile flag ``compute_dtype="input"``).

TRL is imported lazily (``import refimpl`` never imports it). Its import chain needs ``pandas`` and
``datasets`` (requirements/frameworks-trl.txt); nothing is stubbed and site-packages is never edited.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import pathlib
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from types import SimpleNamespace

import torch

from . import Mode, distribution_version

__all__ = [
    "NAME",
    "PINNED_VERSION",
    "availability",
    "installed_version",
    "source_files",
    "modes",
    "unsupported_modes",
    "target",
    "grpo_config_kwargs",
    "trl_policy_loss",
    "loss_step",
    "time_loss",
    "mode_variant",
    "mode_of_variant",
]

NAME = "trl"
PINNED_VERSION = "1.16.0"

# -----------------------------------------------------------------------------------------------
# The profile (data): Convention overrides that reproduce TRL 1.16.0's numerics, shared by the modes.

#: Flags every TRL mode carries (see conventions.FLAG_REASONS), besides the row counting below:
#: - compute_dtype "input": TRL's loss runs in the dtype of the log-probs it is given;
#: - masked_nonfinite "propagate": TRL masks by multiplication, ``(per_token_loss * mask).sum()``, so a
#:   NaN / inf at a masked position reaches the loss (and every gradient);
#: - kl_importance_weight: ``use_bias_correction_kl=True`` (TRL's default) multiplies the k3 term by the
#:   differentiated importance ratio ``coef_1``;
#: - kl_k3_form "naive": the k3 term is ``exp(log r) - log r - 1`` evaluated directly (in float64 its
#:   absolute rounding u (e^|log r| + |log r| + 1) is all of the value when |log r| < 1e-8);
#: - the adv_* flags: TRL's inline advantage code (``_generate_and_score_completions``), read from the
#:   source (nanstd is Bessel-corrected, ``/ (std + 1e-4)``, no zero-variance special case, and
#:   ``num_generations >= 2`` is enforced by GRPOConfig). That code cannot run without a model, so these
#:   flags only shape the inputs of the group case classes.
_COMMON = {
    # TRL counts every row: an empty row is a 0 in grpo's / sapo's mean over rows and a row of
    # dr_grpo's / luspo's per_token_loss.size(0) (the flags change nothing in token-mean modes)
    "empty_rows": "keep",
    "seq_sum_rows": "all",
    "compute_dtype": "input",
    "masked_nonfinite": "propagate",
    "kl_importance_weight": True,
    "kl_k3_form": "naive",
    "adv_std": "sample",
    "adv_eps": 1e-4,
    "adv_eps_inside_sqrt": False,
    "adv_zero_variance": "formula",
    "adv_singleton": "error",
}
# Micro-batches. grpo / sapo / gspo (``(per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)``,
# mean over rows), bnpo (local token mean), dr_grpo (``/ (per_token_loss.size(0) * max_completion_length)``)
# and luspo (row sums, mean over rows) divide their local value by current_gradient_accumulation_steps:
# the mean of micro-batch means. dapo / cispo divide the sum by num_items_in_batch (the global token
# count): the reference.
_LOCAL_MEAN = {"micro_batch": "local_mean"}
_GLOBAL_TOKENS: dict = {}

_MODES = {
    "grpo": Mode(
        "grpo",
        preset="grpo",
        framework_config={"loss_type": "grpo", "importance_sampling_level": "token"},
        convention={**_COMMON, **_LOCAL_MEAN},
        description="GRPO: token ratio, hard clip, mean over each row, mean over rows (empty rows count)",
    ),
    "dr_grpo": Mode(
        "dr_grpo",
        preset="dr_grpo",
        framework_config={
            "loss_type": "dr_grpo", "importance_sampling_level": "token", "scale_rewards": "none"
        },
        convention={**_COMMON, **_LOCAL_MEAN, "adv_scale": "none"},
        description="Dr. GRPO: token sum / (all rows x max_completion_length)",
    ),
    "dapo": Mode(
        "dapo",
        preset="dapo",
        framework_config={"loss_type": "dapo", "importance_sampling_level": "token"},
        convention={**_COMMON, **_GLOBAL_TOKENS},
        description="DAPO: token mean over the global batch (num_items_in_batch)",
    ),
    "bnpo": Mode(
        "bnpo",
        preset="bnpo",
        framework_config={"loss_type": "bnpo", "importance_sampling_level": "token"},
        convention={**_COMMON, **_LOCAL_MEAN},
        description="BNPO: token mean over the local (micro-)batch",
    ),
    "sapo": Mode(
        "sapo",
        preset="sapo",
        framework_config={"loss_type": "sapo", "importance_sampling_level": "token"},
        convention={**_COMMON, **_LOCAL_MEAN, "sapo_tau_float32": True},
        description="SAPO: soft sigmoid gate (temperatures in float32), GRPO's aggregation",
    ),
    "cispo": Mode(
        "cispo",
        preset="cispo",
        framework_config={"loss_type": "cispo", "importance_sampling_level": "token"},
        convention={**_COMMON, **_GLOBAL_TOKENS},
        description="CISPO: sg(min(r, epsilon_high)) A logp, token mean over the global batch",
    ),
    "gspo": Mode(
        "gspo",
        preset="gspo",
        # TRL's grpo aggregation is a token mean per row: with a sequence ratio the policy term is the
        # same as GSPO's per-sequence mean, and the KL term (per token) is averaged per row.
        variant_overrides={"aggregation": "seq_mean_token_mean"},
        framework_config={"loss_type": "grpo", "importance_sampling_level": "sequence"},
        convention={**_COMMON, **_LOCAL_MEAN},
        description="GSPO: importance_sampling_level='sequence' with loss_type='grpo'",
    ),
    "luspo": Mode(
        "luspo",
        preset="gspo",
        # ``(per_token_loss * mask).sum(-1).mean()``: each row's token sum (a sequence ratio counted once per
        # token, i.e. scaled by the length), mean over all rows: Dr. GRPO's seq_sum with L_max = 1.
        variant_overrides={"aggregation": "seq_sum", "max_length": 1},
        framework_config={"loss_type": "luspo", "importance_sampling_level": "sequence"},
        convention={**_COMMON, **_LOCAL_MEAN},
        description="LUSPO: GSPO's sequence ratio, each row's loss scaled by its length, mean over rows",
    ),
}

#: preset -> the modes whose flags are ``--convention trl --preset P`` (ppo's variant equals bnpo's)
PROFILE = {p: (p,) for p in ("grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo")} | {"ppo": ("bnpo",)}
#: TRL GRPOConfig.scale_rewards -> the profile's adv_scale (advantages.md eq. (5), (14))
SCALE_REWARDS = {"group": "group", "batch": "batch_rewards", "none": "none"}

_UNSUPPORTED = {
    "vespo": "VESPO (loss_type='vespo'): its Gamma weighting of the sequence ratio (get_gamma_weights) has "
    "no gate in refimpl's policy-loss family.",
    "importance_sampling_level='sequence' with loss_type other than grpo / luspo": "TRL warns against it "
    "(length-weighted sequence ratios); not a mode of the matrix.",
    "use_bias_correction_kl=False": "the profiles use TRL's default (True); False is the reference KL term "
    "(kl_importance_weight=False).",
    "top_entropy_quantile < 1": "the entropy mask needs the model's per-token entropies, which the kit "
    "does not provide.",
    "entropy_coef / use_adaptive_entropy": "the entropy bonus needs the model's per-token entropies.",
    "off_policy_mask_threshold": "off-policy sequence masking (DeepSeek-V3.2) has no refimpl equivalent.",
    "use_vllm with vllm_importance_sampling_correction": "the behaviour importance ratio is computed "
    "outside the loss (_generate_and_score_completions) from vLLM's log-probs; the kit's call has none.",
    "router_aux_loss_coef": "the MoE auxiliary loss comes from the model's router logits.",
    "tool_mask": "multi-turn tool masks only change the mask, which the kit supplies directly.",
    "eval mode": "model.training=False drops the gradient-accumulation scaling; not a training loss.",
    "num_processes > 1": "the driver runs TRL on one process; ranks are micro-batches of the global batch.",
}


def _trl_path() -> pathlib.Path | None:
    spec = importlib.util.find_spec("trl")
    return None if spec is None or spec.origin is None else pathlib.Path(spec.origin).parent


def installed_version() -> str | None:
    """The installed TRL version, None when TRL is not installed."""
    return distribution_version("trl")


def source_files() -> list[pathlib.Path]:
    """The TRL files whose code the driver runs: the loss, its config (defaults) and the NaN helpers
    used by its metrics."""
    root = _trl_path()
    if root is None:
        return []
    return [root / "trainer" / name for name in ("grpo_trainer.py", "grpo_config.py", "utils.py")]


@functools.cache
def _trl():
    """(GRPOTrainer, GRPOConfig) of the installed TRL (imported once)."""
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    return GRPOTrainer, GRPOConfig


def availability() -> str | None:
    """None when TRL's GRPOTrainer can be imported, else a one-line reason."""
    if installed_version() is None:
        return "TRL is not installed (install requirements/frameworks-trl.txt with --no-deps)"
    try:
        _trl()
    except Exception as exc:  # an absent import-time dependency: say which
        first_line = (str(exc).splitlines() or [""])[0]
        return (f"TRL {installed_version()} cannot be imported ({type(exc).__name__}: {first_line}); "
                "install requirements/frameworks-trl.txt with --no-deps")
    return None


@functools.cache
def _warn_version() -> None:
    version = installed_version()
    if version != PINNED_VERSION:
        warnings.warn(
            f"the TRL profiles describe TRL {PINNED_VERSION}; TRL {version} is installed", stacklevel=3
        )


def modes(kind: str = "policy_loss") -> dict[str, Mode]:
    """TRL's loss modes in scope for ``kind`` (only ``"policy_loss"`` has any)."""
    _check_kind(kind)
    return dict(_MODES) if kind == "policy_loss" else {}


def unsupported_modes(kind: str = "policy_loss") -> dict[str, str]:
    """TRL 1.16.0's modes and options outside the driver, with the reason."""
    _check_kind(kind)
    if kind == "kl":
        return {"k3": "TRL has no standalone KL function: its k3 term is inline in _compute_loss "
                      "(checked as policy_loss with beta > 0)."}
    if kind == "group_advantages":
        return {"group": "TRL's advantages are inline in _generate_and_score_completions (they need a "
                         "model, generation and reward functions) and assume contiguous equal-size groups "
                         "(rewards.view(-1, num_generations)); they cannot be called on their own."}
    return dict(_UNSUPPORTED)


def _check_kind(kind: str) -> None:
    from . import KINDS

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def grpo_config_kwargs(mode: str | Mode, variant) -> dict[str, object]:
    """The ``GRPOConfig`` keys that make TRL run ``variant`` (a PolicyLossVariant) in ``mode``.

    TRL's clip bounds are ``[1 - epsilon, 1 + epsilon_high]``, but its cispo clamps the ratio at
    ``epsilon_high`` itself; ``delta`` caps the ratio (refimpl's dual clip for A < 0); ``beta`` is the
    k3 KL weight; ``max_completion_length`` is Dr. GRPO's L_max.
    Raises ValueError for a variant TRL cannot express in that mode.
    """
    m = _mode(mode)
    _check_shape(m, variant)
    loss_type = m.framework_config["loss_type"]
    if variant.kl_coef > 0 and variant.kl_estimator != "k3":
        raise ValueError(f"variant.kl_estimator must be 'k3' for TRL (its only KL), "
                         f"got {variant.kl_estimator!r}")
    if variant.entropy_coef or variant.behavior_correction != "none":
        raise ValueError("variant.entropy_coef / behavior_correction are not driven for TRL "
                         "(see unsupported_modes)")
    keys = dict(m.framework_config)
    if loss_type == "cispo":
        if variant.eps_low is not None or variant.eps_high is None:
            raise ValueError("TRL's cispo clamps only above: variant.eps_low must be None and eps_high set")
        keys.update(epsilon_high=1.0 + variant.eps_high)
    elif loss_type != "sapo":
        if variant.eps_low is None or variant.eps_high is None:
            raise ValueError(f"TRL's {loss_type} clips on both sides: variant.eps_low and eps_high "
                             "must be set")
        keys.update(epsilon=variant.eps_low, epsilon_high=variant.eps_high, delta=variant.dual_clip)
    else:
        keys.update(sapo_temperature_pos=variant.tau_pos, sapo_temperature_neg=variant.tau_neg)
    keys.update(beta=variant.kl_coef, use_bias_correction_kl=True)
    if loss_type == "luspo" and variant.max_length != 1:
        raise ValueError(f"TRL's luspo is seq_sum with L_max = 1: variant.max_length must be 1, "
                         f"got {variant.max_length!r}")
    if loss_type == "dr_grpo":
        if variant.max_length is None:
            raise ValueError("variant.max_length (TRL's max_completion_length) is required by dr_grpo")
        keys["max_completion_length"] = variant.max_length
    return keys


_SHAPE_FIELDS = ("ratio", "gate", "aggregation")


def _shape(variant) -> tuple:
    return tuple(getattr(variant, f) for f in _SHAPE_FIELDS)


def _check_shape(m: Mode, variant) -> None:
    """The variant must have the mode's ratio level, gate and aggregation (GSPO's per-sequence mean
    ``seq_mean`` equals TRL's per-row token mean when there is no per-token KL term)."""
    want, got = _shape(mode_variant(m)), _shape(variant)
    gspo_alias = (m.name == "gspo" and variant.kl_coef == 0 and got == (want[0], want[1], "seq_mean"))
    if got != want and not gspo_alias:
        shown = ", ".join(f"{f}={v!r}" for f, v in zip(_SHAPE_FIELDS, want, strict=True))
        raise ValueError(f"TRL mode {m.name!r} runs {shown}; the variant has "
                         + ", ".join(f"{f}={v!r}" for f, v in zip(_SHAPE_FIELDS, got, strict=True)))


def mode_of_variant(variant) -> Mode:
    """The TRL mode whose ratio level, gate and aggregation are the variant's (ValueError if none)."""
    for m in _MODES.values():
        try:
            _check_shape(m, variant)
        except ValueError:
            continue
        return m
    raise ValueError(f"no TRL mode runs ratio={variant.ratio!r}, gate={variant.gate!r}, "
                     f"aggregation={variant.aggregation!r}")


def _mode(mode: str | Mode) -> Mode:
    if isinstance(mode, Mode):
        return mode
    if mode not in _MODES:
        raise ValueError(f"TRL mode must be one of {sorted(_MODES)}, got {mode!r}")
    return _MODES[mode]


@functools.cache
def _grpo_config(frozen_keys: tuple, accumulation_steps: int) -> SimpleNamespace:
    """TRL's ``GRPOConfig`` as ``_compute_loss`` reads it: every field's default from the installed
    dataclass, the mode's keys (which must be GRPOConfig fields) and the accumulation steps, with
    ``steps_per_generation`` = ``gradient_accumulation_steps`` as ``GRPOConfig.__post_init__`` sets it.
    A namespace rather than an instance: constructing a GRPOConfig initialises accelerate's process
    state (``PartialState``) as a side effect, which would outlive the check in the caller's process."""
    _, config_class = _trl()
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    keys = dict(frozen_keys)
    unknown = sorted(set(keys) - set(fields))
    if unknown:
        raise ValueError(f"not GRPOConfig fields in TRL {installed_version()}: {unknown}")
    values = {}
    for name, f in fields.items():
        if f.default is not dataclasses.MISSING:
            values[name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[name] = f.default_factory()
    values.update(keys)
    values.update(gradient_accumulation_steps=accumulation_steps, steps_per_generation=accumulation_steps)
    return SimpleNamespace(**values)


class _SingleProcess:
    """accelerate's collectives on one process (gather and reduce are the identity)."""

    num_processes = 1
    process_index = 0
    sync_gradients = True
    is_main_process = True

    @staticmethod
    def gather(tensor):
        return tensor

    gather_for_metrics = gather

    @staticmethod
    def reduce(tensor, reduction="sum"):
        return tensor


def _stand_in_trainer(args, logp: torch.Tensor, accumulation_steps: int):
    """``object.__new__(GRPOTrainer)`` with the attributes ``_compute_loss`` reads, set as
    ``GRPOTrainer.__init__`` sets them from ``args``; the model's forward pass returns ``logp``."""
    trainer_class, _ = _trl()
    trainer = object.__new__(trainer_class)
    trainer.args = args
    trainer.loss_type = args.loss_type
    trainer.importance_sampling_level = args.importance_sampling_level
    trainer.epsilon_low = args.epsilon
    trainer.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    trainer.beta = args.beta
    trainer.max_completion_length = args.max_completion_length
    trainer.top_entropy_quantile = args.top_entropy_quantile
    trainer.off_policy_mask_threshold = args.off_policy_mask_threshold
    trainer.use_vllm = args.use_vllm
    trainer.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
    trainer.entropy_coef = args.entropy_coef
    trainer.use_adaptive_entropy = args.use_adaptive_entropy
    trainer._entropy_bonus_enabled = trainer.entropy_coef != 0.0 or trainer.use_adaptive_entropy
    trainer.aux_loss_enabled = False  # no MoE router: the stand-in model has no router logits
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer.accelerator = _SingleProcess()
    trainer.model = SimpleNamespace(training=True)
    trainer.current_gradient_accumulation_steps = accumulation_steps

    def per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        if logits_to_keep != logp.shape[1]:
            raise RuntimeError(f"TRL asked for {logits_to_keep} completion positions, "
                               f"the call has {logp.shape[1]}")
        return logp, torch.zeros_like(logp).detach(), None

    trainer._get_per_token_logps_and_entropies = per_token_logps_and_entropies
    return trainer


def trl_policy_loss(call, *, mode: str | Mode, variant) -> torch.Tensor:
    """TRL's ``GRPOTrainer._compute_loss`` on one kit call (a ``PolicyLossCall``) in ``mode``.

    The call's ``micro_batch_count`` (default 1) is TRL's ``gradient_accumulation_steps`` (and
    ``steps_per_generation``, TRL's default); ``global_tokens`` (default: the call's ``normalizer`` when
    given, else its own token count) is ``num_items_in_batch``. The mask is passed as TRL builds it
    (``torch.long``); advantages are ``[N]``.
    """
    trainer_class, _ = _trl()
    count = int(getattr(call, "micro_batch_count", 1) or 1)
    keys = grpo_config_kwargs(mode, variant)
    args = _grpo_config(tuple(sorted(keys.items())), count)
    global_tokens = getattr(call, "global_tokens", None)
    if global_tokens is None:
        global_tokens = call.normalizer if call.normalizer is not None else int(call.mask.sum())
    mask = call.mask.to(torch.long)
    n, width = mask.shape
    device = call.logp.device
    inputs = {
        "prompt_ids": torch.zeros((n, 0), dtype=torch.long, device=device),
        "prompt_mask": torch.zeros((n, 0), dtype=torch.long, device=device),
        "completion_ids": torch.zeros((n, width), dtype=torch.long, device=device),
        "completion_mask": mask,
        "advantages": call.advantages,
        "old_per_token_logps": call.old_logp,
        "num_items_in_batch": torch.tensor(int(round(float(global_tokens))), device=device),
    }
    if variant.kl_coef > 0:
        inputs["ref_per_token_logps"] = call.ref_logp
    trainer = _stand_in_trainer(args, call.logp, count)
    return trainer_class._compute_loss(trainer, trainer.model, inputs)


def target(kind: str, mode: str, variant) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` for the kit: ``fn`` is TRL's own ``GRPOTrainer._compute_loss`` and
    ``adapter(fn, call)`` runs it on a stand-in trainer for ``mode`` and ``variant`` (None: the mode's
    own variant). The adapter returns TRL's loss of that (micro-)batch, already scaled for gradient
    accumulation: the kit sums the losses of a batch's micro-batches."""
    if kind != "policy_loss":
        reason = unsupported_modes(kind)
        raise ValueError(f"TRL has no driver for kind {kind!r}: {next(iter(reason.values()))}")
    reason = availability()
    if reason is not None:
        raise RuntimeError(reason)
    _warn_version()
    m = _mode(mode)
    if variant is None:
        from refimpl.conformance.presets import resolve_preset

        variant = resolve_preset(mode_variant(m))[1]
    grpo_config_kwargs(m, variant)  # reject a variant TRL cannot express before any case runs
    trainer_class, _ = _trl()

    def adapter(fn, call):
        if fn is not trainer_class._compute_loss:
            raise TypeError("the TRL adapter drives GRPOTrainer._compute_loss only")
        return trl_policy_loss(call, mode=m, variant=variant)

    adapter.scaled_for_accumulation = True  # TRL divides each micro-batch loss itself
    return trainer_class._compute_loss, adapter


def loss_step(mode: str, variant, logp, old_logp, advantages, mask, *, ref_logp=None) -> Callable:
    """A closure running one forward + backward of TRL's loss in ``mode`` on the given tensors (one
    batch, no micro-batches; a fresh leaf each time) and returning the loss, for benchmarks."""
    _warn_version()
    grpo_config_kwargs(mode, variant)

    def step() -> torch.Tensor:
        leaf = logp.detach().requires_grad_(True)
        call = SimpleNamespace(logp=leaf, old_logp=old_logp, advantages=advantages, mask=mask,
                               ref_logp=ref_logp, normalizer=None)
        loss = trl_policy_loss(call, mode=mode, variant=variant)
        loss.backward()
        return loss.detach()

    return step


def time_loss(
    mode: str, variant, logp, old_logp, advantages, mask, *, ref_logp=None, repeats: int = 20, warmup: int = 2
) -> float:
    """Median seconds of ``loss_step`` (benchmarks/losses.py's clocks: synchronised wall time on CUDA,
    the calling thread's CPU time on the CPU)."""
    step = loss_step(mode, variant, logp, old_logp, advantages, mask, ref_logp=ref_logp)
    cuda = logp.is_cuda
    clock = time.perf_counter if cuda else time.thread_time
    times = []
    for k in range(max(int(warmup), 0) + max(int(repeats), 1)):
        if cuda:
            torch.cuda.synchronize(logp.device)
        start = clock()
        step()
        if cuda:
            torch.cuda.synchronize(logp.device)
        if k >= warmup:
            times.append(clock() - start)
    return sorted(times)[len(times) // 2]


def framework_config(mode: str | Mode, variant) -> dict[str, object]:
    """TRL's own ``GRPOConfig`` keys that run ``variant`` in ``mode`` (with the mode's scale_rewards)."""
    from refimpl.conformance.presets import resolve_preset

    m = _mode(mode)
    variant = resolve_preset(variant)[1]  # a seq_sum variant without L_max gets the kit's L_max
    adv_scale = m.convention.get("adv_scale", "group")
    scale_rewards = {ours: theirs for theirs, ours in SCALE_REWARDS.items()}[adv_scale]
    return {**grpo_config_kwargs(m, variant), "scale_rewards": scale_rewards}


def mode_variant(mode: str | Mode):
    """The PolicyLossVariant of ``mode``: its preset with ``variant_overrides``."""
    from refimpl.losses import get_preset

    m = _mode(mode)
    return dataclasses.replace(get_preset(m.preset), **m.variant_overrides)

"""TRL: how the driver runs GRPOTrainer._compute_loss on a stand-in trainer (see the package docstring)."""

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

from .. import Mode, distribution_version
from .modes import (
    _mode,
    grpo_config_kwargs,
    mode_variant,
    unsupported_modes,
)

NAME = 'trl'
PINNED_VERSION = '1.16.0'


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
        return "TRL is not installed (refimpl frameworks install trl)"
    try:
        _trl()
    except Exception as exc:  # an absent import-time dependency: say which
        first_line = (str(exc).splitlines() or [""])[0]
        return (f"TRL {installed_version()} cannot be imported ({type(exc).__name__}: {first_line}); "
                "refimpl frameworks install trl")
    return None


@functools.cache
def _warn_version() -> None:
    version = installed_version()
    if version != PINNED_VERSION:
        warnings.warn(
            f"the TRL profiles describe TRL {PINNED_VERSION}; TRL {version} is installed", stacklevel=3
        )


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

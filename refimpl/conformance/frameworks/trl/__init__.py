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
``datasets`` (``REQUIREMENTS``); nothing is stubbed and site-packages is never edited.
"""

from __future__ import annotations

from .adapters import (
    _grpo_config,
    _trl,
    availability,
    installed_version,
    loss_step,
    source_files,
    target,
    time_loss,
    trl_policy_loss,
)
from .modes import (
    FINDINGS,
    NOTES,
    PROFILE,
    SCALE_REWARDS,
    framework_config,
    grpo_config_kwargs,
    mode_of_variant,
    mode_variant,
    modes,
    unsupported_modes,
)

__all__ = [
    "NAME",
    "PINNED_VERSION",
    "availability",
    "installed_version",
    "loss_step",
    "source_files",
    "target",
    "time_loss",
    "trl_policy_loss",
    "FINDINGS",
    "NOTES",
    "PROFILE",
    "SCALE_REWARDS",
    "framework_config",
    "grpo_config_kwargs",
    "mode_of_variant",
    "mode_variant",
    "modes",
    "unsupported_modes",
    "_grpo_config",
    "_trl",
]

NAME = "trl"
PINNED_VERSION = "1.16.0"
#: trl imports pandas and datasets at module level (trl/trainer/grpo_trainer.py); datasets imports
#: pyarrow, dill, multiprocess and xxhash, pandas python-dateutil and tzdata. None is called by the loss.
REQUIREMENTS = ("pandas==3.1.1", "datasets==5.2.0", "pyarrow==26.0.1", "dill==0.4.1", "multiprocess==0.70.19",
                "xxhash==4.1.0", "python-dateutil==4.0.0", "tzdata==2026.6")

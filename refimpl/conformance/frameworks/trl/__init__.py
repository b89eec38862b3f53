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

from .adapters import (
    _grpo_config as _grpo_config,
)
from .adapters import (
    _SingleProcess as _SingleProcess,
)
from .adapters import (
    _stand_in_trainer as _stand_in_trainer,
)
from .adapters import (
    _trl as _trl,
)
from .adapters import (
    _trl_path as _trl_path,
)
from .adapters import (
    _warn_version as _warn_version,
)
from .adapters import (
    availability as availability,
)
from .adapters import (
    installed_version as installed_version,
)
from .adapters import (
    loss_step as loss_step,
)
from .adapters import (
    source_files as source_files,
)
from .adapters import (
    target as target,
)
from .adapters import (
    time_loss as time_loss,
)
from .adapters import (
    trl_policy_loss as trl_policy_loss,
)
from .modes import (
    _COMMON as _COMMON,
)
from .modes import (
    _GLOBAL_TOKENS as _GLOBAL_TOKENS,
)
from .modes import (
    _LOCAL_MEAN as _LOCAL_MEAN,
)
from .modes import (
    _MODES as _MODES,
)
from .modes import (
    _SHAPE_FIELDS as _SHAPE_FIELDS,
)
from .modes import (
    _UNSUPPORTED as _UNSUPPORTED,
)
from .modes import (
    PROFILE as PROFILE,
)
from .modes import (
    SCALE_REWARDS as SCALE_REWARDS,
)
from .modes import (
    _check_kind as _check_kind,
)
from .modes import (
    _check_shape as _check_shape,
)
from .modes import (
    _mode as _mode,
)
from .modes import (
    _shape as _shape,
)
from .modes import (
    framework_config as framework_config,
)
from .modes import (
    grpo_config_kwargs as grpo_config_kwargs,
)
from .modes import (
    mode_of_variant as mode_of_variant,
)
from .modes import (
    mode_variant as mode_variant,
)
from .modes import (
    modes as modes,
)
from .modes import (
    unsupported_modes as unsupported_modes,
)

NAME = 'trl'
PINNED_VERSION = '1.16.0'

"""Driver for the installed verl (0.9.1): its own policy losses, ``agg_loss``, ``kl_penalty`` and
outcome-advantage estimators from ``verl/trainer/ppo/core_algos.py``, called with verl's own config
objects. Nothing of verl's math is transcribed here.

How verl is driven (the glue of ``verl.workers.utils.losses.ppo_loss`` and the FSDP engine, which
this driver mirrors rather than imports, since they need tensordict and a model):

* one ``ActorConfig`` per target (``clip_ratio_low/high``, ``clip_ratio_c``, ``loss_agg_mode``,
  ``loss_scale_factor``, ``tau_pos/neg``, ``policy_loss.loss_mode``, ``kl_loss_type/coef``);
* per micro-batch, ``config.global_batch_info`` is filled as ``ppo_loss`` fills it from the
  engine's data: ``dp_size=1``, ``batch_num_tokens`` = tokens of the whole (mini-)batch,
  ``global_batch_size`` = *all* rows of the whole batch (the trainer's ``ppo_mini_batch_size x n``,
  empty rows included) and ``loss_scale_factor`` from the config;
* advantages are per token, ``A_i`` on the row's tokens and 0 elsewhere (as verl's estimators
  return them), the mask is bool;
* the loss is the registered ``get_policy_loss_fn(loss_mode)`` plus, when ``kl_coef > 0``,
  ``agg_loss(kl_penalty(logp, ref, kl_loss_type), mask, loss_agg_mode, **global_batch_info) *
  kl_loss_coef``; the engine sums the micro-batch losses (``loss.backward()`` per micro-batch,
  no rescaling), as the kit does.

Import-only dependencies that verl's package ``__init__`` files pull in but the loss code never calls
(``ray``, ``tensordict``, ``orjson``) are replaced by inert stubs, only when they are not installed
and only while verl is being imported (they are removed from ``sys.modules`` afterwards). The
loss code really needs ``omegaconf`` (configs) and ``codetiming`` (imported by
``verl.utils.profiler``): its ``REQUIREMENTS``.
"""

from __future__ import annotations

from .adapters import (
    _actor_config,
    _core_algos,
    availability,
    installed_version,
    mode_variant,
    source_files,
    target,
)
from .findings import FINDINGS
from .kinds import KIND_MODES, KIND_UNSUPPORTED, kind_target
from .modes import NOTES, PROFILE, framework_config, modes, unsupported_modes

__all__ = [
    "NAME",
    "PINNED_VERSION",
    "PROFILE",
    "NOTES",
    "FINDINGS",
    "availability",
    "installed_version",
    "source_files",
    "modes",
    "unsupported_modes",
    "framework_config",
    "target",
    "mode_variant",
    "_actor_config",
    "_core_algos",
    "KIND_MODES",
    "KIND_UNSUPPORTED",
    "kind_target",
]

NAME = "verl"
PINNED_VERSION = "0.9.1"
#: verl's import chain needs omegaconf and codetiming (ray, tensordict and orjson are stubbed)
REQUIREMENTS = ("omegaconf==2.4.0", "codetiming==1.4.0")

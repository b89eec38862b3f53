"""Driver for the installed OpenRLHF (0.11.2): its own ``PolicyLoss``, ``aggregate_loss``,
``compute_approx_kl`` and optimizer-step loss normalisers, called by the conformance kit.

How OpenRLHF is imported. OpenRLHF pins ``deepspeed`` and ``flash-attn`` (CUDA source builds) and
a ``transformers`` the other frameworks exclude, so it is installed with ``--no-deps``. Its package
``__init__`` chain (``openrlhf.models`` imports ``actor``/``model``: peft, flash_attn, deepspeed,
transformers' DeepSpeed integration) cannot be imported without them. The driver therefore does
NOT import ``openrlhf.models``: it loads the three installed source files it runs,
``openrlhf/models/utils.py``, ``openrlhf/models/loss.py`` and ``openrlhf/utils/loss_utils.py``,
unchanged, as submodules of two private packages (``_refimpl_openrlhf_models`` and
``_refimpl_openrlhf_utils``, whose ``__path__`` is the installed folder, so ``loss.py``'s
``from .utils import masked_mean`` resolves to the installed ``utils.py``). The one import-only
dependency on that path is ``import deepspeed`` at the top of ``models/utils.py`` (used only by
``set_z3_leaf_modules``, which the losses never call): when the real ``deepspeed`` is absent a
stub module stands in for it *while those files execute* and is removed from ``sys.modules``
afterwards, so nothing else in the process sees a fake ``deepspeed``. While they load,
``torch.compile`` is also the identity (``compute_entropy``'s decorator; it is never called and
would import ``torch._dynamo``, ~8 s). Nothing in site-packages is edited and no other stub is
needed (``torch.distributed`` is only queried, never initialised).

What a call does (``training_step`` of ``trainer/ray/ppo_actor.py``, single data-parallel rank):
``PolicyLoss(clip_eps_low, clip_eps_high, dual_clip, token_level_loss, policy_loss_type)`` is
called with per-token advantages (the kit's one advantage per sequence repeated on every token: what
OpenRLHF's group estimators give without KL in the reward; with the default KL in the reward they vary
along the response, ``NOTES["per-token advantages"]``), the
integer ``action_mask`` of its sample generator, ``dp_size=1`` and the optimizer step's
``batch_num_tokens`` / ``global_batch_size`` from OpenRLHF's own ``_optimizer_step_loss_norm``
(``iter_grad_accum_global_norm``: global counts divided by the gradient-accumulation steps
``gas``). DeepSpeed (not installed) then scales every micro-batch loss by ``1 / gas`` before
backward; the adapter applies that division, the only arithmetic here that is not OpenRLHF's.
With a KL loss (``algo.kl.use_loss``, fixed controller ``kl_ctl = init_coef``) the adapter adds
``aggregate_loss(compute_approx_kl(logp, ref_logp, log_probs_old=old_logp, kl_estimator=...),
action_mask, **loss_batch_info) * kl_coef`` as ``training_step`` does. The KL estimators are also
driven alone (kind "kl"); the group advantages of ``compute_advantages_and_returns`` (kind
"group_advantages", advantages.py) and the registry's kinds (GAE, value loss, whitening, KL reward,
behaviour correction, overlong penalty) run from kinds.py; the findings are in findings.py.
"""

from __future__ import annotations

from .adapters import (
    STUBBED,
    _modules,
    availability,
    installed_version,
    source_files,
)
from .findings import FINDINGS
from .kinds import KIND_MODES, KIND_UNSUPPORTED, kind_target, target
from .modes import (
    NOTES,
    PROFILE,
    RELEASE_FINDINGS,
    config_for_variant,
    framework_config,
    mode_for_preset,
    modes,
    policy_loss_kwargs,
    unsupported_modes,
)

__all__ = [
    "NAME",
    "PINNED_VERSION",
    "STUBBED",
    "availability",
    "installed_version",
    "source_files",
    "target",
    "NOTES",
    "FINDINGS",
    "RELEASE_FINDINGS",
    "PROFILE",
    "config_for_variant",
    "framework_config",
    "mode_for_preset",
    "modes",
    "policy_loss_kwargs",
    "unsupported_modes",
    "_modules",
    "KIND_MODES",
    "KIND_UNSUPPORTED",
    "kind_target",
]

NAME = "openrlhf"
PINNED_VERSION = "0.11.2"

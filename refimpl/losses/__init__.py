"""Losses (spec: specs/policy_losses.md): the composable ``policy_loss`` family with its presets and
its fast path ``fused_policy_loss`` (``fused_policy``), value loss, entropy bonus and the combined
PPO objective, KL-penalty controllers, memory-lean
per-token log-probabilities / entropies (``logprobs``) and the same through the output layer
without the ``[N, V]`` logits (``lm_head``), followed by the policy loss with the logits formed once
(``lm_head_loss``), and DPO / Bradley-Terry (``dpo``)."""

from refimpl.losses.dpo import *  # noqa: F403
from refimpl.losses.dpo import __all__ as _dpo_all
from refimpl.losses.fused_policy import *  # noqa: F403
from refimpl.losses.fused_policy import __all__ as _fused_policy_all
from refimpl.losses.kl_control import *  # noqa: F403
from refimpl.losses.kl_control import __all__ as _kl_control_all
from refimpl.losses.lm_head import *  # noqa: F403
from refimpl.losses.lm_head import __all__ as _lm_head_all
from refimpl.losses.lm_head_loss import *  # noqa: F403
from refimpl.losses.lm_head_loss import __all__ as _lm_head_loss_all
from refimpl.losses.logprobs import *  # noqa: F403
from refimpl.losses.logprobs import __all__ as _logprobs_all
from refimpl.losses.policy import *  # noqa: F403
from refimpl.losses.policy import __all__ as _policy_all
from refimpl.losses.value import *  # noqa: F403
from refimpl.losses.value import __all__ as _value_all

__all__ = [*_policy_all, *_fused_policy_all, *_value_all, *_kl_control_all, *_logprobs_all, *_lm_head_all,
           *_lm_head_loss_all, *_dpo_all]

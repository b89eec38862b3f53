"""Policy losses (spec: specs/policy_losses.md): the composable ``policy_loss`` family with its
presets, value loss and the combined PPO objective, and KL-penalty controllers."""

from refimpl.losses.policy import *  # noqa: F403
from refimpl.losses.policy import __all__ as _policy_all

__all__ = [*_policy_all]

"""The Tunix driver's modes of the registry's kinds (refimpl/conformance/kinds/): PPO's GAE, its
masked whitening and its clipped value loss, each ``tunix/rl/algo_core.py``'s own function called as
``ppo_learner.py`` calls it, compiled with ``jax.jit`` and in float32 (JAX's default: the kinds judge a
float32 output to float32's tolerance). Kept apart from tunix.py, which passes its loaded modules.

* gae: ``compute_gae_advantages(rewards, values, completion_mask, gamma, gae_lambda)``
  (algo_core.py:34), the completion mask as int32 0/1 (PPOLearner passes np.not_equal's bool: the same
  arithmetic); it whitens the advantages inside
  (``masked_whiten``, algo_core.py:111) and has no input for a truncated response.
* whitening: ``masked_whiten(x, completion_mask)`` (algo_core.py:116).
* value_loss: ``ppo_value_loss_fn(model, train_example, clip_range_value, pad_id, eos_id)``
  (algo_core.py:272), whose critic forward pass ``common.compute_score`` returns the kit's values (the
  stand-in of tunix.py); ``0.5 * masked_mean`` of the clipped squared error (algo_core.py:322).
* overlong: DAPOLearner's ``reward_shaping(prompts, completions, mode, overlong_buffer)``
  (grpo/dapo_learner.py:105, executed from the installed file: its module imports the RL cluster), on
  completions of one character per token: it measures ``len(completion)``, the decoded text's characters
  (finding ``overlong_characters``), which equal the kit's token lengths only so.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable

from .driver import Mode
from .jax_bridge import compiled_value, float32, from_jax
from .sources import function_from_source, package_dir

__all__ = ["KIND_MODES", "KIND_UNSUPPORTED", "kind_target"]

# masked_mean divides by mask.sum() + 1e-8 (algo_core.py:137), which in float32 is mask.sum() for any
# count >= 1 (whiten_count_eps 0); masked_var is Bessel-corrected (line 156), masked_whiten multiplies
# by rsqrt(var + 1e-8) (line 127), and sum(x * mask) lets a NaN / inf at padding through
_WHITEN = {"whiten_std": "sample", "whiten_eps": 1e-8, "whiten_eps_placement": "variance",
           "whiten_masked_nonfinite": "propagate", "whiten_sample_single": "nan"}
KIND_MODES = (
    Mode("gae", kind="gae", framework_config={"advantage_estimator": "gae"},
         convention={"gae_truncation": "terminate", "gae_padding_nonfinite": "propagate",
                     "gae_whiten": "masked_sample"},
         description="compute_gae_advantages: a reverse jax.lax.scan that carries the next value and "
         "advantage over padding (values * mask + (1 - mask) * next: 0 * inf = NaN), no bootstrap after "
         "the last token, advantages whitened inside"),
    Mode("masked_whiten", kind="whitening", convention=dict(_WHITEN),
         description="masked_whiten: masked mean, Bessel-corrected variance (one counted entry: "
         "1 / 0 * 0 = NaN), rsqrt(var + 1e-8)"),
    Mode("value_loss", kind="value_loss", framework_config={"value_loss_fn": "ppo"},
         convention={"value_scale": 0.5, "value_masked_nonfinite": "propagate"},
         description="ppo_value_loss_fn: 0.5 * masked_mean(max((v - R)^2, (v_clip - R)^2)), the token "
         "mean over mask.sum() + 1e-8"),
    Mode("reward_shaping", kind="overlong",
         framework_config={"overlong_buffer": {"enable": True, "overlong_buffer_penalty": 1.0}},
         convention={"overlong_floor": "none"},
         description="DAPOLearner's reward_shaping (grpo/dapo_learner.py:105-130; DAPOConfig enables it by "
         "default): min(-(len(completion) - (max_response_length - overlong_buffer_length)) / "
         "overlong_buffer_length * penalty, 0), no floor at -1; driven on completions of one character per "
         "token (it counts characters: finding overlong_characters)"),
)
KIND_UNSUPPORTED = {
    "gae": {"truncated responses": "compute_gae_advantages has no input for a bootstrap value: a "
            "truncated response is treated as terminated (gae_truncation='terminate')"},
    "kl_reward": {"ppo kl in the reward": "computed inline in PPOLearner's rollout step "
                  "(ppo_learner.py:357-367), which needs the RL cluster; its default estimator is k3 "
                  "(finding ppo_kl_reward_k3)"},
}


def kind_target(mode: Mode, algo_core, with_forward: Callable, policy_class: Callable
                ) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` running algo_core.py's own function for a registry-kind mode;
    ``with_forward(fn)`` is ``fn`` with the stand-in forward passes, ``policy_class`` the one-parameter
    model that holds the values."""
    if mode.kind == "gae":

        def gae(fn, rewards, values, mask, *, gamma, lam, truncated, final_values):
            return compiled_value(fn, float32(rewards), float32(values), mask.int().numpy(), gamma, lam)

        return algo_core.compute_gae_advantages, gae
    if mode.kind == "whitening":
        def whiten(fn, x, mask):
            return compiled_value(fn, float32(x), mask.int().numpy())[0]

        return algo_core.masked_whiten, whiten
    if mode.kind == "overlong":
        def penalty(fn, lengths, *, max_len, cache_len):
            import torch

            completions = ["x" * int(n) for n in lengths]  # one character per token
            buffer = {"overlong_buffer_length": cache_len, "overlong_buffer_penalty": 1.0,
                      "max_response_length": max_len}
            scores = fn([""] * len(completions), completions, None, overlong_buffer=buffer)
            return torch.tensor(scores, dtype=torch.float64)

        return _reward_shaping(), penalty

    def value(fn, values, old_values, returns, mask, *, clip):
        loss = _value_loss(with_forward(fn), policy_class, float(clip))
        return from_jax(values, loss, float32(old_values), float32(returns), mask.int().numpy())

    return algo_core.ppo_value_loss_fn, value


@functools.cache
def _value_loss(rebound: Callable, policy_class: Callable, clip: float) -> Callable:
    """``loss(values, old_values, returns, mask)``: ``ppo_value_loss_fn`` on a train example of those
    arrays (one prompt token, so that its slice of the critic's scores is the completion's values)."""
    import jax.numpy as jnp

    def loss(values, old_values, returns, mask):
        n, width = mask.shape
        example = types.SimpleNamespace(prompt_ids=jnp.ones((n, 1), jnp.int32),
                                        completion_ids=jnp.ones((n, width), jnp.int32), completion_mask=mask,
                                        old_values=old_values, returns=returns)
        return rebound(policy_class()(values), example, clip, 0, 1)[0]

    return loss


@functools.cache
def _reward_shaping() -> Callable:
    """grpo/dapo_learner.py's ``reward_shaping``, its ``def`` executed from the installed file (the module
    imports the RL cluster); its annotations name ``rl_cluster_lib.Mode``, a stand-in here."""
    namespace = {"Any": typing.Any, "Dict": dict, "List": list,
                 "rl_cluster_lib": types.SimpleNamespace(Mode=object)}
    return function_from_source(package_dir("tunix") / "rl" / "grpo" / "dapo_learner.py", "reward_shaping",
                                namespace)

"""The verl driver's modes of the registry's kinds (refimpl/conformance/kinds/): GAE, the clipped
value loss and masked whitening, each verl's own function called as its trainer calls it.

* gae: ``core_algos.compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma,
  lam)`` (core_algos.py:216), the float response mask; it whitens the advantages inside
  (``verl_F.masked_whiten``, core_algos.py:262) and has no input for a truncated response.
* value_loss: ``core_algos.compute_value_loss(vpreds, returns, values, response_mask,
  cliprange_value, loss_agg_mode)`` (core_algos.py:2125; ``0.5 * agg_loss``, line 2175), one
  micro-batch, no global batch info.
* whitening: ``verl.utils.torch_functional.masked_whiten(values, mask)`` (torch_functional.py:329),
  what GAE and the REINFORCE++ estimators call.
* kl_reward: ``ray_trainer.apply_kl_penalty(data, kl_ctrl, kl_penalty)`` (ray_trainer.py:78), with
  ``algorithm.use_kl_in_reward``.
* behavior_correction: the rollout correction's truncated importance weights
  (``rollout_corr_helper.compute_rollout_correction_weights``) on the vanilla policy loss.
"""

from __future__ import annotations

from .. import Mode
from .adapters import _core_algos

__all__ = ["KIND_MODES", "KIND_UNSUPPORTED", "kind_target"]

# masked_mean divides by mask.sum() + 1e-8 (torch_functional.py:308), masked_var is Bessel-corrected
# (line 324) and masked_whiten multiplies by rsqrt(var + 1e-8) (line 343)
_WHITEN = {"whiten_std": "sample", "whiten_eps": 1e-8, "whiten_eps_placement": "variance",
           "whiten_count_eps": 1e-8}

KIND_MODES = (
    Mode("gae", kind="gae", framework_config={"adv_estimator": "gae"},
         convention={"gae_truncation": "terminate", "gae_padding_nonfinite": "propagate",
                     "gae_whiten": "masked_sample"},
         description="compute_gae_advantage_return: values * mask carries the next value over padding "
         "(0 * inf = NaN), no bootstrap after the last token, advantages whitened inside"),
    Mode("value_loss/token-mean", kind="value_loss", framework_config={"loss_agg_mode": "token-mean"},
         convention={"value_scale": 0.5, "value_empty_step": "nan", "value_masked_nonfinite": "nan_gradient"},
         description="compute_value_loss: 0.5 * agg_loss(max((v - R)^2, (v_clip - R)^2)), token-mean"),
    Mode("value_loss/seq-mean-token-mean", kind="value_loss",
         framework_config={"loss_agg_mode": "seq-mean-token-mean"},
         convention={"value_scale": 0.5, "value_aggregation": "seq_mean_token_mean",
                     "value_empty_step": "nan",
                     "value_masked_nonfinite": "propagate"},
         description="compute_value_loss with loss_agg_mode='seq-mean-token-mean'"),
    Mode("apply_kl_penalty/kl", kind="kl_reward", framework_config={"kl_penalty": "kl"}, convention={},
         description="ray_trainer.apply_kl_penalty with algorithm.kl_penalty='kl' (the default): "
         "scores - beta * (old_log_probs - ref_log_prob) * response_mask"),
    Mode("apply_kl_penalty/low_var_kl", kind="kl_reward", framework_config={"kl_penalty": "low_var_kl"},
         convention={"kl_reward_estimator": "k3", "kl_reward_value_clamp": 10.0},
         description="kl_penalty='low_var_kl': k3 of the log-ratio clamped to +-20, the value to +-10 "
         "(core_algos.py:2239-2245)"),
    Mode("rollout_is/token", kind="behavior_correction",
         framework_config={"rollout_is": "token", "rollout_is_threshold": 5.0},
         convention={"behavior_cap": "truncate", "behavior_cap_value": 5.0},
         description="algorithm.rollout_correction rollout_is='token', threshold 5 (TIS): the weight "
         "min(exp(clamp(log w, +-20)), 5) on compute_policy_loss_vanilla's token losses"),
    Mode("masked_whiten", kind="whitening", convention=_WHITEN,
         description="verl_F.masked_whiten: masked mean, Bessel-corrected variance, rsqrt(var + 1e-8)"),
)

KIND_UNSUPPORTED = {
    "gae": {"multi-turn masks (observation tokens inside a response)": "the kit's GAE cases have one "
            "episode per row with a prefix mask",
            "advantages at padding positions": "the kind judges the counted tokens; masked_whiten leaves "
            "non-zero values at padding (finding gae_padding_output, value only)"},
    "value_loss": {"the unclipped value loss (policy_losses.md eq. (22))": "compute_value_loss always "
                   "clips, with critic.cliprange_value = 0.5 by default (finding value_clip)"},
}


def _functional():
    import importlib

    _core_algos()
    return importlib.import_module("verl.utils.torch_functional")


def kind_target(mode: Mode):
    """``(fn, adapter)`` running verl's own function for a registry-kind mode."""
    if mode.kind == "gae":

        def gae(fn, rewards, values, mask, *, gamma, lam, truncated, final_values):
            return fn(token_level_rewards=rewards, values=values, response_mask=mask.to(values.dtype),
                      gamma=gamma, lam=lam)

        return _core_algos().compute_gae_advantage_return, gae
    if mode.kind == "kl_reward":
        return _kl_reward_target(mode)
    if mode.kind == "behavior_correction":
        return _behavior_target(mode)
    if mode.kind == "value_loss":
        agg = mode.framework_config["loss_agg_mode"]

        def value(fn, values, old_values, returns, mask, *, clip):
            return fn(vpreds=values, returns=returns, values=old_values, response_mask=mask.to(values.dtype),
                      cliprange_value=clip, loss_agg_mode=agg)[0]

        return _core_algos().compute_value_loss, value
    return _functional().masked_whiten, lambda fn, x, mask: fn(x, mask.to(x.dtype))


def _kl_reward_target(mode: Mode):
    """``ray_trainer.apply_kl_penalty`` (ray_trainer.py:78): the module imports ray's worker groups
    and the dataloaders, so its ``def`` is executed from the installed file with the names it uses
    (``core_algos``, ``masked_mean``); ``data`` carries the batch keys it reads. The score sits on the
    last response token, where verl's reward managers put it."""
    import types

    import torch

    from ..sources import function_from_source
    from .adapters import _package_dir

    core = _core_algos()
    fn = function_from_source(_package_dir() / "trainer/ppo/ray_trainer.py", "apply_kl_penalty",
                              {"core_algos": core, "torch": torch, "masked_mean": _functional().masked_mean,
                               "DataProto": object})
    penalty = mode.framework_config["kl_penalty"]

    class _Batch(dict):
        pass

    def adapter(fn, scores, logp, ref_logp, mask, *, kl_coef):
        lengths = mask.sum(dim=-1)
        last = torch.arange(mask.shape[1], device=mask.device)[None, :] == (lengths[:, None] - 1)
        batch = _Batch(response_mask=mask.to(logp.dtype), token_level_scores=scores[:, None] * last,
                       old_log_probs=logp, ref_log_prob=ref_logp)
        batch.batch_size = [mask.shape[0]]
        data = types.SimpleNamespace(batch=batch)
        fn(data, core.FixedKLController(kl_coef), kl_penalty=penalty)
        return batch["token_level_rewards"]

    return fn, adapter


def _behavior_target(mode: Mode):
    """``rollout_corr_helper.compute_rollout_correction_weights`` (rollout_corr_helper.py:522) on
    ``old_log_prob - rollout_log_probs`` (pi_prox / pi_behave), then ``compute_policy_loss_vanilla``
    (core_algos.py:1286) with those ``rollout_is_weights`` (line 1364), token-mean over the batch."""
    import importlib

    import torch

    from ..stubs import stubbed_imports
    from .adapters import _STUBBED, _actor_config

    core = _core_algos()
    with stubbed_imports(_STUBBED):
        helper = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
    from refimpl.losses.policy import PPO

    threshold = mode.framework_config["rollout_is_threshold"]

    def adapter(fn, logp, prox_logp, behave_logp, advantages, mask, *, eps):
        import dataclasses

        config = _actor_config("vanilla/token-mean", dataclasses.replace(PPO, eps_low=eps, eps_high=eps))
        config.global_batch_info.clear()
        config.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()),
                                        global_batch_size=mask.shape[0], loss_scale_factor=None)
        log_ratio = (prox_logp - behave_logp).detach()  # rollout_corr_helper.py:964
        weights, _metrics = helper.compute_rollout_correction_weights(
            log_ratio, mask.to(logp.dtype), rollout_is="token", rollout_is_threshold=threshold)
        per_token = torch.where(mask, advantages.unsqueeze(-1), 0.0)
        return fn(old_log_prob=prox_logp, log_prob=logp, advantages=per_token, response_mask=mask,
                  loss_agg_mode="token-mean", config=config, rollout_is_weights=weights)[0]

    return core.compute_policy_loss_vanilla, adapter

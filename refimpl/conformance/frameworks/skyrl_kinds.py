"""The SkyRL-train driver's modes of the registry's kinds (refimpl/conformance/kinds/): GAE, the
value loss, advantage whitening and the KL in the reward, each ``utils/ppo_utils.py``'s (or the
trainer's) own function called as the trainer calls it (trainer.py:721-790, 265, 1000). Kept apart
from skyrl.py, which calls ``kind_target`` with its loaded ppo_utils.py."""

from __future__ import annotations

from collections.abc import Callable

from .driver import Mode
from .sources import function_from_source, package_dir

__all__ = ["KIND_MODES", "KIND_UNSUPPORTED", "kind_target"]

# masked_whiten (ppo_utils.py:169-175): masked_mean / max(count, 1) (ppo_utils.py:88, multiplying by the
# mask), Bessel's variance, rsqrt(var + 1e-8)
_SKYRL_WHITEN = {"whiten_std": "sample", "whiten_eps": 1e-8, "whiten_eps_placement": "variance",
                 "whiten_masked_nonfinite": "propagate"}
KIND_MODES = (
    Mode("gae", kind="gae", framework_config={"advantage_estimator": "gae"},
         convention={"gae_truncation": "terminate", "gae_padding": "used", "gae_whiten": "masked_sample"},
         description="compute_gae_advantage_return (ppo_utils.py:999): the recursion runs over the padded "
         "row unmasked (values[:, t + 1] of the first padding position is bootstrapped), no bootstrap "
         "after the last position, advantages whitened inside"),
    Mode("value_loss", kind="value_loss", framework_config={"value_clip": 0.2},
         convention={"value_scale": 0.5, "value_aggregation": "seq_mean_token_mean",
                     "value_empty_rows": "keep",
                     "value_masked_nonfinite": "propagate"},
         description="ppo_critic_loss (ppo_utils.py:178): 0.5 * masked_mean(max(...), dim=-1).mean(), "
         "every row counted"),
    Mode("normalize_advantages_dict", kind="whitening", framework_config={"advantage_batch_normalize": True},
         convention={"whiten_mean": "unmasked", "whiten_eps": 1e-8, "whiten_eps_placement": "floor"},
         description="normalize_advantages_dict (ppo_utils.py:131): advantages.mean() over every position "
         "of the padded batch, padding included; the variance over the response tokens"),
    Mode("masked_whiten", kind="whitening", convention=_SKYRL_WHITEN,
         description="masked_whiten (ppo_utils.py:169), what the GAE estimator calls"),
    *(Mode(f"apply_reward_kl_penalty/{k}", kind="kl_reward", framework_config={"kl_estimator_type": k},
           convention={"kl_reward_estimator": k, "kl_reward_value_clamp": 10.0} if k == "k3" else {},
           description=f"RayPPOTrainer.apply_reward_kl_penalty (trainer.py:1000), kl_estimator_type={k!r}: "
           "rewards - compute_approx_kl(...) * max(0, kl_loss_coef) (the loss's coefficient without a "
           "controller)" + (" (the default)" if k == "k3" else "")) for k in ("k3", "k1")),
)
KIND_UNSUPPORTED: dict[str, dict[str, str]] = {}


def kind_target(mode: Mode, module, algorithm_config) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` running ppo_utils.py's own function for a registry-kind mode; ``module`` is the
    driver's ppo_utils.py, ``algorithm_config(keys)`` its trainer.algorithm config."""
    if mode.kind == "gae":

        def gae(fn, rewards, values, mask, *, gamma, lam, truncated, final_values):
            return fn(token_level_rewards=rewards, values=values, response_mask=mask.to(values.dtype),
                      gamma=gamma, lambd=lam)

        return module.AdvantageEstimatorRegistry.get("gae"), gae
    if mode.kind == "value_loss":

        def value(fn, values, old_values, returns, mask, *, clip):
            config = algorithm_config({"value_clip": clip})
            return fn(values, old_values, returns, config=config, loss_mask=mask.to(values.dtype))[0]

        return module.ppo_critic_loss, value
    if mode.kind == "kl_reward":
        return _kl_reward_target(mode, module)
    if mode.name == "masked_whiten":
        return module.masked_whiten, lambda fn, x, mask: fn(x, mask.to(x.dtype))

    def normalize(fn, x, mask):
        return fn({"advantages": x, "response_mask": mask.to(x.dtype)})["advantages"]

    return module.normalize_advantages_dict, normalize


def _kl_reward_target(mode: Mode, module) -> tuple[Callable, Callable]:
    """``RayPPOTrainer.apply_reward_kl_penalty`` (trainer.py:1000): trainer.py imports ray and the
    workers, so the method's ``def`` is executed from the installed file with the names it uses; the
    score sits on the last response token (SkyRL's token-level rewards)."""
    import types

    import torch

    fn = function_from_source(package_dir("skyrl_train") / "trainer.py",
                              "RayPPOTrainer.apply_reward_kl_penalty",
                              {"torch": torch, "compute_approx_kl": module.compute_approx_kl,
                               "masked_mean": module.masked_mean, "TrainingInputBatch": dict})

    class _Batch(dict):
        metadata: dict

    def adapter(fn, scores, logp, ref_logp, mask, *, kl_coef):
        last = torch.arange(mask.shape[1], device=mask.device)[None, :] == (mask.sum(dim=-1)[:, None] - 1)
        data = _Batch(loss_mask=mask.to(logp.dtype), rewards=scores[:, None] * last,
                      base_action_log_probs=ref_logp, action_log_probs=logp)
        data.metadata = {}
        algorithm = types.SimpleNamespace(kl_estimator_type=mode.framework_config["kl_estimator_type"],
                                          kl_loss_coef=kl_coef)
        cfg = types.SimpleNamespace(trainer=types.SimpleNamespace(algorithm=algorithm))
        trainer = types.SimpleNamespace(cfg=cfg, reward_kl_controller=None, all_metrics={})
        return fn(trainer, data)["rewards"]

    return fn, adapter

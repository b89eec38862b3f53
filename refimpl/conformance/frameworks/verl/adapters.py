"""How the verl driver imports verl 0.9.1 and calls its own functions (see the package docstring):
``availability``, ``source_files``, ``target`` and verl's ``ActorConfig`` for a mode."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pathlib
import warnings

import torch

from .. import distribution_version
from ..stubs import stubbed_imports
from .modes import _ADV_MODES, modes, unsupported_modes

__all__ = ["availability", "installed_version", "source_files", "target", "mode_variant"]

PINNED_VERSION = "0.9.1"
_STUBBED = ("ray", "tensordict", "orjson")  # imported by verl's package __init__s, never called by losses
_SOURCES = (
    "trainer/ppo/core_algos.py",
    "utils/torch_functional.py",
    "workers/config/actor.py",
    "workers/utils/losses.py",
    "trainer/ppo/ray_trainer.py",  # apply_kl_penalty (kinds.py)
    "trainer/ppo/rollout_corr_helper.py",  # the rollout correction's weights (kinds.py)
    "trainer/ppo/v1/replay_buffer.py",  # DAPO's group filter (finding dapo_filter)
    "trainer/ppo/v1/utils.py",  # GRPO over agent sessions (finding rejection_sampling_sessions)
)

# ------------------------------------------------------------------------------------------------
# installation facts


def installed_version() -> str | None:
    """The installed verl version, or None."""
    return distribution_version("verl")


def _package_dir() -> pathlib.Path | None:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def source_files() -> list[pathlib.Path]:
    """verl's files whose code the driver runs or mirrors (for ``source_hash``)."""
    root = _package_dir()
    return [] if root is None else [root / name for name in _SOURCES if (root / name).exists()]


def _core_algos():
    """``verl.trainer.ppo.core_algos``, imported with the stubs in place (another installed version
    is warned about once, by the driver layer: ``Driver.target``)."""
    with stubbed_imports(_STUBBED):
        module = importlib.import_module("verl.trainer.ppo.core_algos")
        importlib.import_module("verl.workers.config")
    return module


def availability() -> str | None:
    """None when verl's loss code can be imported and driven, else a one-line reason."""
    if _package_dir() is None:
        return "verl is not installed (refimpl frameworks install verl)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _core_algos()
    except Exception as exc:  # any import failure makes the framework unavailable, with the reason
        return f"verl is installed but its loss code cannot be imported: {type(exc).__name__}: {exc}"
    return None


# ------------------------------------------------------------------------------------------------
# targets


def _actor_config(mode: str, variant) -> object:
    """verl's own ``ActorConfig`` for ``mode`` with the variant's parameters."""
    from verl.workers.config import ActorConfig, PolicyLossConfig

    loss_mode, _, agg = mode.partition("/")
    agg = agg or ("seq-mean-token-mean" if loss_mode in ("gspo", "sapo") else "token-mean")
    # a side without a clip: 1 - 1 = 0 (a ratio is >= 0) and 1 + inf; geo_mean clips the log-ratio
    # itself to [-low, high], so there a missing side is inf
    low = (float("inf") if loss_mode == "geo_mean" else 1.0) if variant.eps_low is None else variant.eps_low
    if loss_mode == "cispo" and variant.eps_low is None:  # verl's default lower clip (flag cispo_clip_low)
        low = modes("policy_loss")["cispo"].convention["cispo_clip_low"]
    high = float("inf") if variant.eps_high is None else variant.eps_high
    table = modes("policy_loss")
    # the mode's own PolicyLossConfig keys (clip_cov's covariance band)
    policy_keys = {k.removeprefix("actor.policy_loss."): v for k, v in
                   (table[mode].framework_config.items() if mode in table else ())
                   if k.startswith("actor.policy_loss.") and k != "actor.policy_loss.loss_mode"}
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        use_torch_compile=False,
        clip_ratio=low,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=3.0 if variant.dual_clip is None else variant.dual_clip,
        loss_agg_mode=agg,
        loss_scale_factor=variant.max_length if agg == "seq-mean-token-sum-norm" else None,
        tau_pos=variant.tau_pos,
        tau_neg=variant.tau_neg,
        use_kl_loss=variant.kl_coef > 0,
        kl_loss_coef=variant.kl_coef,
        kl_loss_type={"k1": "kl", "k2": "mse", "k3": "low_var_kl"}[variant.kl_estimator],
        policy_loss=PolicyLossConfig(loss_mode=loss_mode, **policy_keys),
    )


def _global_batch_info(call, config) -> dict:
    """``ppo_loss``'s global batch info for one micro-batch: global tokens and all global rows (the
    kit's PolicyLossCall fields; a call without them, or with 0 rows, is a whole batch)."""
    mask = call.mask
    tokens = getattr(call, "global_tokens", None)
    rows = getattr(call, "global_rows", None)
    if not rows:  # not given: this call is the whole batch
        tokens, rows = int(mask.sum()), int(mask.shape[0])
    return {
        "dp_size": 1,
        "batch_num_tokens": int(tokens),
        "global_batch_size": int(rows),
        "loss_scale_factor": config.loss_scale_factor,
    }


def _policy_adapter(core, config):
    def adapter(fn, call):
        mask = call.mask.bool()
        adv = call.advantages
        if adv.ndim == 1:  # verl's estimators return A_i on the row's tokens, 0 elsewhere
            adv = torch.where(mask, adv.unsqueeze(-1), torch.zeros((), dtype=adv.dtype, device=adv.device))
        config.global_batch_info.clear()
        config.global_batch_info.update(_global_batch_info(call, config))
        loss, _ = fn(
            old_log_prob=call.old_logp,
            log_prob=call.logp,
            advantages=adv,
            response_mask=mask,
            loss_agg_mode=config.loss_agg_mode,
            config=config,
            rollout_is_weights=None,
        )
        if config.use_kl_loss:
            kld = core.kl_penalty(call.logp, call.ref_logp, config.kl_loss_type)
            kl_loss = core.agg_loss(
                loss_mat=kld, loss_mask=mask, loss_agg_mode=config.loss_agg_mode, **config.global_batch_info
            )
            loss = loss + kl_loss * config.kl_loss_coef
        return loss

    return adapter


def _kl_adapter(name: str):
    def adapter(fn, logp, ref_logp):
        return fn(logp, ref_logp, name)

    return adapter


def _advantage_adapter(kwargs: dict):
    def adapter(fn, rewards, group_ids):
        import numpy as np

        token_rewards = rewards.reshape(-1, 1)  # one token carries the outcome reward
        mask = torch.ones_like(token_rewards)
        index = np.asarray(group_ids.cpu().numpy())
        advantages, _ = fn(token_level_rewards=token_rewards, response_mask=mask, index=index, **kwargs)
        return advantages.reshape(-1)

    return adapter


def target(kind: str, mode, variant=None):
    """``(fn, adapter)`` for verl's ``mode`` (its name or its ``Mode``) of ``kind``: ``fn`` is verl's
    own function.

    policy_loss: ``variant`` (a PolicyLossVariant; default the mode's preset with its overrides)
    fills the ActorConfig; ``adapter(fn, call)`` returns the scalar loss of one micro-batch.
    kl: ``adapter(fn, logp, ref_logp)`` returns verl's per-token ``kl_penalty``.
    group_advantages: ``adapter(fn, rewards, group_ids)`` returns the advantages ``[N]``.
    """
    table = modes(kind)
    mode = getattr(mode, "name", mode)
    if mode not in table:
        raise ValueError(
            f"verl has no {kind} mode {mode!r} in scope; modes: {', '.join(table)}"
            + (f"; unsupported: {', '.join(unsupported_modes(kind))}" if unsupported_modes(kind) else "")
        )
    core = _core_algos()
    if kind == "policy_loss":
        if variant is None:
            variant = mode_variant(mode)
        fn = core.get_policy_loss_fn(mode.partition("/")[0])
        return fn, _policy_adapter(core, _actor_config(mode, variant))
    if kind == "kl":
        return core.kl_penalty, _kl_adapter(mode)
    function, kwargs, _ = _ADV_MODES[mode]
    return getattr(core, function), _advantage_adapter(kwargs)


def mode_variant(mode: str):
    """The PolicyLossVariant a policy-loss mode corresponds to (its preset with its overrides)."""
    from refimpl.losses import get_preset

    m = modes("policy_loss")[mode]
    return dataclasses.replace(get_preset(m.preset), **m.variant_overrides)

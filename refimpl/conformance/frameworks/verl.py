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
``verl.utils.profiler``): requirements/frameworks-verl.txt.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import importlib.util
import pathlib
import warnings

import torch

from . import Mode, distribution_version
from .stubs import stubbed_imports

__all__ = [
    "NAME",
    "PINNED_VERSION",
    "availability",
    "installed_version",
    "source_files",
    "modes",
    "unsupported_modes",
    "target",
]

NAME = "verl"
PINNED_VERSION = "0.9.1"

_STUBBED = ("ray", "tensordict", "orjson")  # imported by verl's package __init__s, never called by losses
_SOURCES = (
    "trainer/ppo/core_algos.py",
    "utils/torch_functional.py",
    "workers/config/actor.py",
    "workers/utils/losses.py",
)

# ------------------------------------------------------------------------------------------------
# modes: data (which refimpl variant each verl mode is, and the convention flags of its profile)

# Flags every vanilla mode shares (each explained in conventions.FLAG_REASONS; evidence in
# tests/test_framework_verl.py and the report of this driver's introduction):
# - the log-ratio is clamped to [-20, 20] before exp; clip_ratio_c (3.0) dual-clips A < 0 always;
# - the engine sums micro-batch losses that agg_loss divides by the global counts it is given; the
#   row count is the trainer's global_batch_size, every row of the mini-batch, empty ones included;
# - the loss is computed in the input dtype (bf16 / fp16 log-probs are not upcast).
# the actor's KL loss (use_kl_loss): kl_penalty's low_var_kl clamps log r to +-20 and k3 to +-10, and
# evaluates k3 as exp(log r) - log r - 1 (the "naive" form: in float64 its absolute rounding
# u (e^|log r| + |log r| + 1) is all of the value when |log r| < 1e-8)
_K3 = {"kl_log_ratio_clamp": 20.0, "kl_value_clamp": 10.0, "kl_k3_form": "naive"}
_KL_LOSS = dict(_K3)
_VANILLA = {
    **_KL_LOSS,
    "log_ratio_clamp": 20.0,
    "dual_clip": 3.0,
    "seq_sum_rows": "all",  # the trainer's global_batch_size: every row of the mini-batch
    "micro_batch": "global",
    "compute_dtype": "input",
}
# NaN / inf at masked positions (measured, see tests/test_framework_verl.py): agg_loss's token modes
# mask the value with torch.where, but its sequence modes sum loss_mat * loss_mask, and NaN * 0 is
# NaN (the +-20 log-ratio clamp turns +-inf into finite values first); with an mse (k2) KL loss on,
# every mode's gradient is NaN there (where's zero cotangent times mse's NaN derivative; the clamps
# of low_var_kl zero it).
_PROPAGATES = {"masked_nonfinite": "propagate"}
# agg_loss's "seq-mean-token-mean" divides by the trainer's global_batch_size (every row). Its
# "/ (tokens + 1e-8)" is exact: the bool mask's int64 count plus 1e-8 is a float32, where the 1e-8
# vanishes for any count >= 1.
_ROW_MEAN = {"empty_rows": "keep"}
_AGG_MODES = {
    # loss_agg_mode: (our aggregation, variant overrides, convention flags)
    "token-mean": ("token_mean", {}, _PROPAGATES),  # through an mse KL loss's gradient only
    "seq-mean-token-mean": ("seq_mean_token_mean", {}, {**_ROW_MEAN, **_PROPAGATES}),
    # sum over the row's tokens, mean over all rows of the batch: Dr. GRPO's form with L_max = 1
    "seq-mean-token-sum": ("seq_sum", {"max_length": 1}, {"seq_sum_rows": "all", **_PROPAGATES}),
    # Dr. GRPO: / (all rows x loss_scale_factor); the driver sets loss_scale_factor = L_max
    "seq-mean-token-sum-norm": ("seq_sum", {"max_length": 16}, {"seq_sum_rows": "all", **_PROPAGATES}),
    # plain sum over the tokens, no denominator at all
    "token-sum": (
        "seq_sum",
        {"max_length": 1},
        {"seq_sum_rows": "none", "micro_batch": "local_sum", **_PROPAGATES},  # through an mse KL only
    ),
}
_SEQ_MEAN = "seq-mean-token-mean"
_VANILLA_PRESET = {
    "token-mean": "ppo",
    "seq-mean-token-mean": "grpo",
    "seq-mean-token-sum": "dr_grpo",
    "seq-mean-token-sum-norm": "dr_grpo",
    "token-sum": "dr_grpo",
}


def _policy_modes() -> dict[str, Mode]:
    out = {}
    for agg, (aggregation, overrides, flags) in _AGG_MODES.items():
        preset = _VANILLA_PRESET[agg]
        out[f"vanilla/{agg}"] = Mode(
            name=f"vanilla/{agg}",
            preset=preset,
            variant_overrides={**overrides, "aggregation": aggregation} if preset == "dr_grpo" else overrides,
            framework_config={
                "actor.policy_loss.loss_mode": "vanilla",
                "actor.loss_agg_mode": agg,
                # Dr. GRPO's constant: L_max (verl's default None would be the padded width)
                **({"actor.loss_scale_factor": 16} if agg == "seq-mean-token-sum-norm" else {}),
            },
            convention={**_VANILLA, **flags},
            description=f"compute_policy_loss_vanilla + agg_loss({agg!r}), dual clip clip_ratio_c",
        )
    out["gspo"] = Mode(
        name="gspo",
        preset="gspo",
        framework_config={"actor.policy_loss.loss_mode": "gspo", "actor.loss_agg_mode": _SEQ_MEAN},
        convention={
            **_KL_LOSS,
            "sequence_ratio_gradient": "token",
            "sequence_log_ratio_cap": 10.0,
            "micro_batch": "global",
            "compute_dtype": "input",
            **_ROW_MEAN,
            **_PROPAGATES,  # NaN and +-inf: GSPO's log-ratio is not clamped, inf * 0 is NaN
        },
        description="compute_policy_loss_gspo (GSPO-token ratio, log s capped at 10), seq-mean-token-mean",
    )
    out["sapo"] = Mode(
        name="sapo",
        preset="sapo",
        framework_config={"actor.policy_loss.loss_mode": "sapo", "actor.loss_agg_mode": _SEQ_MEAN},
        convention={
            **_KL_LOSS,
            "log_ratio_clamp": 20.0,
            "micro_batch": "global",
            "compute_dtype": "input",
            **_ROW_MEAN,
            **_PROPAGATES,
        },
        description="compute_policy_loss_sapo (always seq-mean-token-mean)",
    )
    out["cispo"] = Mode(
        name="cispo",
        preset="cispo",
        # verl's default config clips the weight below too (clip_ratio_low 0.2); our preset does not
        variant_overrides={"eps_low": 0.2},
        framework_config={
            "actor.policy_loss.loss_mode": "cispo",
            "actor.loss_agg_mode": "token-mean",
            "actor.clip_ratio_low": 0.2,
        },
        convention={
            **_KL_LOSS,
            # log_prob - old_log_prob clamped to +-20 before exp, inside the detached weight only
            "log_ratio_clamp": 20.0,
            "micro_batch": "global",
            "compute_dtype": "input",
            **_PROPAGATES,  # NaN at a masked position: the value is masked, its gradient -sg(NaN) A is NaN
        },
        description="compute_policy_loss_cispo: sg(clip(exp(clamp(x, +-20)), 1 - low, 1 + high)) A logp, "
        "token-mean",
    )
    out["geo_mean"] = Mode(
        name="geo_mean",
        preset="gspo",
        # GMPO = GSPO's geometric-mean ratio with each token clipped in log space (md eq. (18)), at
        # verl's default clip_ratio 0.2
        variant_overrides={"gate": "log_clip", "eps_low": 0.2, "eps_high": 0.2},
        framework_config={"actor.policy_loss.loss_mode": "geo_mean", "actor.loss_agg_mode": "token-mean"},
        convention={
            **_KL_LOSS,
            # the policy term ignores loss_agg_mode; ppo_loss's KL loss uses it: a global token mean
            "kl_aggregation": "token_mean",
            "empty_rows": "keep",
            "micro_batch": "local_sum",
            "compute_dtype": "input",
            **_PROPAGATES,  # (x * mask).sum(-1) for the ratio and the advantage: NaN and +-inf
        },
        description="compute_policy_loss_geo_mean (GMPO): torch.mean over the micro-batch's rows",
    )
    return out


_KL_MODES = {
    # kl_penalty name: (our estimator, convention flags)
    "kl": ("k1", {}),
    "k1": ("k1", {}),
    "mse": ("k2", {}),
    "k2": ("k2", {}),
    "low_var_kl": ("k3", dict(_K3)),
    "k3": ("k3", dict(_K3)),
    "kl+": ("k1", {"kl_gradient": "k2"}),
    "k1+": ("k1", {"kl_gradient": "k2"}),
    "mse+": ("k2", {}),
    "k2+": ("k2", {}),
    "low_var_kl+": ("k3", {**_K3, "kl_gradient": "k2"}),
    "k3+": ("k3", {**_K3, "kl_gradient": "k2"}),
}

# verl's GRPO: sample std, std + eps, (R - mean) / eps for a constant group, a singleton's mean 0 /
# std 1 held in float32 tensors, so its divisor is float32(1 + eps).
_GRPO_ADV = {
    "adv_std": "sample",
    "adv_eps": 1e-6,
    "adv_eps_inside_sqrt": False,
    "adv_zero_variance": "formula",
    "adv_singleton": "raw",
    "adv_singleton_float32": True,
}
_ADV_MODES = {
    "grpo": ("compute_grpo_outcome_advantage", {"norm_adv_by_std_in_grpo": True}, {**_GRPO_ADV}),
    "grpo/no_std": (
        "compute_grpo_outcome_advantage",
        {"norm_adv_by_std_in_grpo": False},
        {"adv_scale": "none", "adv_singleton": "raw"},
    ),
    "rloo": (
        "compute_rloo_outcome_advantage",
        {},
        {"adv_scale": "none", "adv_leave_one_out": True, "adv_singleton": "raw"},
    ),
    "rloo_vectorized": (
        "compute_rloo_vectorized_outcome_advantage",
        {},
        {"adv_scale": "none", "adv_leave_one_out": True, "adv_singleton": "zero"},
    ),
}


#: preset -> the modes whose flags are ``--convention verl --preset P``: verl's GRPO advantages
#: (norm_adv_by_std_in_grpo=False for dr_grpo) plus the policy-loss mode
_PRESET_POLICY_MODE = {
    "ppo": "vanilla/token-mean",
    "grpo": "vanilla/seq-mean-token-mean",
    "bnpo": "vanilla/token-mean",
    "dapo": "vanilla/token-mean",
    "dr_grpo": "vanilla/seq-mean-token-sum-norm",
    "gspo": "gspo",
    "gspo_token": "gspo",
    "sapo": "sapo",
    "cispo": "cispo",
}
PROFILE = {
    p: ("grpo",) + (("grpo/no_std",) if p == "dr_grpo" else ()) + (m,) for p, m in _PRESET_POLICY_MODE.items()
}
#: behaviours of verl 0.9.1 the profiles do not reproduce (stated, not silently approximated)
NOTES = {
    "dual-clip tie": "at a ratio exactly equal to clip_ratio_c verl's torch.min splits the "
    "gradient in half; the kit follows the inclusive gate of policy_losses.md eq. (6) (no float64 "
    "log-ratio has exp exactly 3.0, so no case reaches the tie).",
    "loss_scale_factor=None": "verl's default Dr. GRPO constant is the micro-batch's padded "
    "width (flag seq_sum_width='padded_width'); the profile sets loss_scale_factor = L_max.",
    "standalone agg_loss": "called without global batch info, verl's sequence modes drop "
    "empty rows from the row count; the profile describes the trainer, whose "
    "global_batch_size counts every row (empty_rows='keep').",
}


def framework_config(mode: Mode, variant) -> dict[str, object]:
    """verl's own ``actor_rollout_ref.actor`` / ``algorithm`` keys that run ``variant`` in a
    policy-loss ``mode`` (other kinds: the mode's keys)."""
    if mode.kind != "policy_loss":
        return dict(mode.framework_config)
    v = variant
    loss_mode, _, agg = mode.name.partition("/")
    agg = agg or ("token-mean" if loss_mode == "cispo" else "seq-mean-token-mean")
    dual_clip = mode.convention.get("dual_clip")
    return {
        "actor.policy_loss.loss_mode": loss_mode,
        # a side without a clip: 1 - 1 = 0 and 1 + inf (what the verl driver passes)
        "actor.clip_ratio_low": 1.0 if v.eps_low is None else v.eps_low,
        "actor.clip_ratio_high": float("inf") if v.eps_high is None else v.eps_high,
        "actor.clip_ratio_c": dual_clip if dual_clip is not None else (v.dual_clip or 3.0),
        "actor.loss_agg_mode": agg,
        "actor.loss_scale_factor": v.max_length if agg == "seq-mean-token-sum-norm" else None,
        "actor.use_kl_loss": v.kl_coef > 0,
        "actor.kl_loss_coef": v.kl_coef,
        "actor.kl_loss_type": {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}[v.kl_estimator],
        "algorithm.norm_adv_by_std_in_grpo": mode.preset != "dr_grpo",
        "actor.tau_pos": v.tau_pos,
        "actor.tau_neg": v.tau_neg,
    }


def modes(kind: str = "policy_loss") -> dict[str, Mode]:
    """verl's modes in scope for ``kind`` ("policy_loss", "kl" or "group_advantages")."""
    if kind == "policy_loss":
        return _policy_modes()
    if kind == "kl":
        return {
            name: Mode(
                name=name,
                kind="kl",
                variant_overrides={"kl_estimator": estimator},
                framework_config={"actor.kl_loss_type": name},
                convention=flags,
                description=f"kl_penalty(logp, ref_logp, {name!r}): {estimator}"
                + (" value, k2 gradient (straight-through)" if "kl_gradient" in flags else ""),
            )
            for name, (estimator, flags) in _KL_MODES.items()
        }
    if kind == "group_advantages":
        return {
            name: Mode(
                name=name,
                kind="group_advantages",
                framework_config={"algorithm.adv_estimator": name.split("/")[0], **kwargs},
                convention=flags,
                description=f"{function}({', '.join(f'{k}={v}' for k, v in kwargs.items())})",
            )
            for name, (function, kwargs, flags) in _ADV_MODES.items()
        }
    raise ValueError(f"kind must be one of ('policy_loss', 'kl', 'group_advantages'), got {kind!r}")


def unsupported_modes(kind: str = "policy_loss") -> dict[str, str]:
    """verl 0.9.1 modes of ``kind`` that the kit does not check, with the reason."""
    if kind == "policy_loss":
        return {
            "dppo_tv": "DPPO total-variation trust region: a mask from the probability difference "
            "|pi - pi_old| needs the token probabilities' own trust-region family, not in the spec",
            "dppo_kl": "DPPO KL trust region: a binary-KL mask, not in the spec's policy-loss family",
            "gpg": "GPG: -logp * A without a ratio (a REINFORCE loss); not a member of the family",
            "clip_cov": "Clip-Cov: clips a random subset of high-covariance tokens (torch.randperm "
            "without a seed): no deterministic expected value",
            "kl_cov": "KL-Cov: a KL penalty on the top-k covariance tokens; not in the spec",
            "dro": "DRO: logp * A - beta / 2 (log r)^2, a quadratic penalty the spec does not define",
            "bypass_mode": "rollout-correction bypass (reinforce / ppo_clip over rollout log-probs, "
            "with rejection-sampling masks): needs rollout_log_probs and RolloutCorrectionConfig",
            "rollout_is_weights": "rollout importance weights (any loss mode) need "
            "rollout_log_probs; the kit's behaviour correction is a separate variant field",
        }
    if kind == "kl":
        return {
            "abs": "|logp - ref_logp| is not a KL estimator of kl.md (no k-form, biased)",
            "full": "raises NotImplementedError in verl 0.9.1",
        }
    if kind == "group_advantages":
        why_token = "token-level returns over a trajectory, not an outcome advantage of a group"
        return {
            "gae": why_token + " (needs values and a discount)",
            "reinforce_plus_plus": why_token + " (discounted returns, then whitened over the batch)",
            "reinforce_plus_plus_baseline": "group-mean baseline, then whitened over the whole batch "
            "with masked_whiten: a batch-std scale of centred values that masks tokens",
            "remax": "needs the greedy rollout's reward as baseline",
            "opo": "length-weighted group mean baseline: needs response lengths",
            "grpo_passk": "pass@k advantage: only the best response of a group gets a non-zero value",
            "gpg": "GPG's rescaling by the batch's fraction of valid groups",
            "grpo_vectorized": "the same estimator as grpo via group_mean_std; not separately driven",
            "gdpo": "multi-reward decoupled normalisation: needs several reward channels",
            "optimal_token_baseline": "token-level baseline from sum pi^2 statistics of the model",
            "tir_optimal_token_baseline": "token-level baseline from sum pi^2 statistics of the model",
        }
    raise ValueError(f"kind must be one of ('policy_loss', 'kl', 'group_advantages'), got {kind!r}")


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
    """``verl.trainer.ppo.core_algos``, imported with the stubs in place (warns on another version)."""
    with stubbed_imports(_STUBBED):
        module = importlib.import_module("verl.trainer.ppo.core_algos")
        importlib.import_module("verl.workers.config")
    version = installed_version()
    if version != PINNED_VERSION:
        warnings.warn(
            f"verl {version} is installed; the verl profiles describe verl {PINNED_VERSION}",
            stacklevel=3,
        )
    return module


def availability() -> str | None:
    """None when verl's loss code can be imported and driven, else a one-line reason."""
    if _package_dir() is None:
        return "verl is not installed (pip install --no-deps verl==0.9.1; requirements/frameworks-verl.txt)"
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
    high = float("inf") if variant.eps_high is None else variant.eps_high
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
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
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

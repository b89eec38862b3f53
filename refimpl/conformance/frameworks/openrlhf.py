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
called with per-token advantages (OpenRLHF broadcasts the sequence advantage to every token), the
integer ``action_mask`` of its sample generator, ``dp_size=1`` and the optimizer step's
``batch_num_tokens`` / ``global_batch_size`` from OpenRLHF's own ``_optimizer_step_loss_norm``
(``iter_grad_accum_global_norm``: global counts divided by the gradient-accumulation steps
``gas``). DeepSpeed (not installed) then scales every micro-batch loss by ``1 / gas`` before
backward; the adapter applies that division, the only arithmetic here that is not OpenRLHF's.
With a KL loss (``algo.kl.use_loss``, fixed controller ``kl_ctl = init_coef``) the adapter adds
``aggregate_loss(compute_approx_kl(logp, ref_logp, log_probs_old=old_logp, kl_estimator=...),
action_mask, **loss_batch_info) * kl_coef`` as ``training_step`` does. The KL estimators are also
driven alone (kind "kl").
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pathlib
import sys
import types
import warnings
from collections.abc import Callable

from . import Mode, distribution_version
from .stubs import plain_torch_compile, stubbed_imports

__all__ = [
    "NAME",
    "PINNED_VERSION",
    "availability",
    "installed_version",
    "source_files",
    "modes",
    "unsupported_modes",
    "mode_for_preset",
    "policy_loss_kwargs",
    "config_for_variant",
    "target",
    "STUBBED",
]

NAME = "openrlhf"
PINNED_VERSION = "0.11.2"

_MODELS_PKG = "_refimpl_openrlhf_models"
_UTILS_PKG = "_refimpl_openrlhf_utils"
_SOURCES = ("models/loss.py", "models/utils.py", "utils/loss_utils.py")

# The profile (flags of conventions.Convention, as data). Every mode carries the KL flags, since
# OpenRLHF computes every KL (reward penalty or loss) with compute_approx_kl (models/utils.py):
# * kl_compute_dtype "float32": log_ratio = log_probs.float() - log_probs_base.float();
# * kl_k3_form "naive": k3 = exp(-x) - 1 + x evaluated directly;
# * kl_log_ratio_max 10: k3 clamps x = logp - ref below at -10 (log r = -x above at 10);
# * kl_value_clamp 10 with scope "all": every estimator's value is clamped to [-10, 10].
_KL_PROFILE = {
    "name": NAME,
    "kl_compute_dtype": "float32",
    "kl_k3_form": "naive",
    "kl_log_ratio_max": 10.0,
    "kl_value_clamp": 10.0,
    "kl_value_clamp_scope": "all",
}
# PolicyLoss modes add:
# * compute_dtype "input" (kit flag): bf16/fp16 log-probs are never upcast (the surrogate is formed
#   in the input dtype; aggregate_loss divides by OpenRLHF's float32 normalisers);
# * masked_nonfinite "propagate" (kit flag): aggregate_loss and masked_mean reduce with
#   (loss * mask).sum(), so a NaN at a masked position reaches the loss;
# * normalizer_rounding "float32_per_micro_batch": _optimizer_step_loss_norm's float32 count / gas;
# * kl_aggregation "token_mean": with algo.kl.use_loss the KL term is aggregate_loss(kl, mask,
#   **loss_batch_info), a global token mean whatever actor.loss_agg_mode says;
# * log_ratio_clamp 20 (ppo only): log_probs - old_log_probs is clamped to [-20, 20] before exp.
_POLICY_PROFILE = {
    **_KL_PROFILE,
    "compute_dtype": "input",
    "masked_nonfinite": "propagate",
    "normalizer_rounding": "float32_per_micro_batch",
    "kl_aggregation": "token_mean",
}
_PPO_PROFILE = {**_POLICY_PROFILE, "log_ratio_clamp": 20.0}
# GSPO (policy_loss_type "gspo") exponentiates the masked mean log-ratio without a clamp.
_GSPO_PROFILE = dict(_POLICY_PROFILE)


def _ppo_config(eps_low: float, eps_high: float, agg: str, dual_clip: float | None = None) -> dict:
    return {
        "actor.policy_loss_type": "ppo",
        "actor.eps_clip_low_high": (eps_low, eps_high),
        "actor.dual_clip": dual_clip,
        "actor.loss_agg_mode": agg,
        "algo.advantage.is_correction_level": "off",
        "algo.kl.use_loss": False,
    }


def _kl_loss_config(config: dict, estimator: str, coef: float) -> dict:
    return {**config, "algo.kl.use_loss": True, "algo.kl.init_coef": coef, "algo.kl.estimator": estimator,
            "algo.kl.unbiased_gradient": False, "algo.kl.target": None}


_POLICY_MODES = (
    Mode(
        "ppo/token-mean",
        preset="ppo",
        framework_config=_ppo_config(0.2, 0.2, "token-mean"),
        convention=_PPO_PROFILE,
        description="PolicyLoss(policy_loss_type='ppo', token_level_loss=True): clipped surrogate, "
        "global token mean",
    ),
    Mode(
        "ppo/token-mean/clip-higher",
        preset="dapo",
        framework_config=_ppo_config(0.2, 0.28, "token-mean"),
        convention=_PPO_PROFILE,
        description="asymmetric clip [1 - 0.2, 1 + 0.28] (DAPO's clip-higher), global token mean",
    ),
    Mode(
        "ppo/token-mean/dual-clip",
        preset="ppo",
        variant_overrides={"dual_clip": 3.0},
        framework_config=_ppo_config(0.2, 0.2, "token-mean", 3.0),
        convention=_PPO_PROFILE,
        description="dual-clip PPO (dual_clip=3.0), global token mean",
    ),
    Mode(
        "ppo/seq-mean-token-mean",
        preset="grpo",
        framework_config=_ppo_config(0.2, 0.2, "seq-mean-token-mean"),
        convention=_PPO_PROFILE,
        description="PolicyLoss(token_level_loss=False): mean over non-empty sequences of token means",
    ),
    Mode(
        "ppo/seq-mean-token-mean/dual-clip",
        preset="grpo",
        variant_overrides={"dual_clip": 3.0},
        framework_config=_ppo_config(0.2, 0.2, "seq-mean-token-mean", 3.0),
        convention=_PPO_PROFILE,
        description="dual-clip PPO (dual_clip=3.0), sequence mean of token means",
    ),
    Mode(
        "ppo/token-mean+kl-loss/k3",
        preset="bnpo",
        variant_overrides={"kl_coef": 0.01, "kl_estimator": "k3"},
        framework_config=_kl_loss_config(_ppo_config(0.2, 0.2, "token-mean"), "k3", 0.01),
        convention=_PPO_PROFILE,
        description="clipped surrogate + 0.01 * k3 KL loss (fixed KL controller), global token means",
    ),
    Mode(
        "ppo/seq-mean-token-mean+kl-loss/k3",
        preset="grpo",
        variant_overrides={"kl_coef": 0.01, "kl_estimator": "k3"},
        framework_config=_kl_loss_config(_ppo_config(0.2, 0.2, "seq-mean-token-mean"), "k3", 0.01),
        convention=_PPO_PROFILE,
        description="OpenRLHF's GRPO recipe: sequence-mean surrogate + 0.01 * k3 KL loss (token mean)",
    ),
    Mode(
        "ppo/seq-mean-token-mean+kl-loss/k2",
        preset="grpo",
        variant_overrides={"kl_coef": 0.01, "kl_estimator": "k2"},
        framework_config=_kl_loss_config(_ppo_config(0.2, 0.2, "seq-mean-token-mean"), "k2", 0.01),
        convention=_PPO_PROFILE,
        description="sequence-mean surrogate + 0.01 * k2 KL loss (token mean)",
    ),
    Mode(
        "gspo",
        preset="gspo",
        framework_config={
            "actor.policy_loss_type": "gspo",
            "actor.eps_clip_low_high": (3e-4, 4e-4),
            "actor.dual_clip": None,
            "actor.loss_agg_mode": "seq-mean-token-mean",
            "algo.advantage.is_correction_level": "off",
            "algo.kl.use_loss": False,
        },
        convention=_GSPO_PROFILE,
        description="PolicyLoss(policy_loss_type='gspo'): sequence ratio exp(mean log-ratio) with its "
        "exact gradient, sequence mean (forced)",
    ),
)

_KL_MODES = tuple(
    Mode(
        f"kl/{k}",
        kind="kl",
        variant_overrides={"kl_estimator": k},
        framework_config={"algo.kl.estimator": k, "algo.kl.unbiased_gradient": False},
        convention=_KL_PROFILE,
        description=f"compute_approx_kl(log_probs, log_probs_base, kl_estimator='{k}')",
    )
    for k in ("k1", "k2", "k3")
)

#: preset -> the mode whose flags are ``--convention openrlhf --preset P`` (bnpo's loss is PPO's token mean)
PROFILE = {
    "ppo": ("ppo/token-mean",),
    "bnpo": ("ppo/token-mean",),
    "dapo": ("ppo/token-mean/clip-higher",),
    "grpo": ("ppo/seq-mean-token-mean",),
    "gspo": ("gspo",),
}

_UNSUPPORTED = {
    "policy_loss": {
        "is_correction token clip / mask (TIS / ICEPOP)": "equal to the spec's behavior_correction "
        "'truncate' / 'mask' with is_correction_threshold (0, cap) (tests/test_framework_openrlhf.py, "
        "direct inputs), but PolicyLossCall and the kit's cases carry no rollout (behaviour) log-probs",
        "is_correction seq level, binary_kl / tv gating, lower threshold > 0": "no spec variant: a "
        "per-sequence geometric-mean or divergence gate that keeps per-token weights, or a lower cut",
        "gspo + is_correction": "GSPO then takes its ratio against rollout_log_probs (not in the cases)",
        "gspo/dual-clip": "GSPO's sequence ratio with dual_clip has no spec variant (dual_clip needs the "
        "token-level clip gate)",
        "dr_grpo (seq_sum)": "aggregate_loss has only token-mean and seq-mean-token-mean; no "
        "sum / (sequences x L_max) aggregation (--algo.advantage.estimator dr_grpo changes only the "
        "advantages: mean-centred, not divided by the std)",
        "gspo_token": "OpenRLHF has no GSPO-token form (its gspo back-propagates the sequence ratio "
        "exactly; the two agree for per-sequence advantages)",
        "sapo": "no SAPO gate in OpenRLHF 0.11.2",
        "cispo": "no CISPO gate in OpenRLHF 0.11.2",
        "KL loss with algo.kl.target (adaptive KL controller)": "kl_ctl changes between steps; "
        "the kit checks one step with a fixed coefficient (the fixed controller is in scope)",
        "entropy bonus": "actor.entropy_coef needs the model's logits (entropy computed by the Actor); "
        "the kit's cases carry no entropy",
    },
    "kl": {
        "kl/*+unbiased_gradient": "algo.kl.unbiased_gradient=True returns the estimator's value with a "
        "straight-through k2 gradient (w * (logp - ref)); the kit's KL check differentiates the value",
    },
    "group_advantages": {
        "group_norm / dr_grpo / rloo / reinforce_baseline": "computed inline in "
        "RemoteExperienceMaker.compute_advantages_and_returns (a method needing strategy args, "
        "Experience objects and kl_ctl, in a module that imports ray), on rewards reshaped to "
        "(-1, n_samples_per_prompt): equal, contiguous groups only; not a callable function",
    },
}


# ----------------------------------------------------------------------------------------------
# Import


def _package_dir() -> pathlib.Path | None:
    spec = importlib.util.find_spec("openrlhf")  # finds the package without executing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def installed_version() -> str | None:
    """The installed OpenRLHF version, or None."""
    return distribution_version("openrlhf")


def source_files() -> list[pathlib.Path]:
    """The installed files whose code the driver runs (for ``source_hash``); [] when absent."""
    root = _package_dir()
    return [] if root is None else [root / rel for rel in _SOURCES]


class _HostTorch:
    """``torch`` as the driver's copy of ``utils/loss_utils.py`` sees it: ``torch.cuda.is_available()``
    is False (``NOTES["device"]``); every other attribute is torch's own."""

    def __init__(self, torch_module) -> None:
        self._torch = torch_module
        self.cuda = types.SimpleNamespace(is_available=lambda: False)

    def __getattr__(self, name: str):
        return getattr(self._torch, name)


#: what the driver fixes (printed in the matrix): the device of the step normalisers
NOTES = {
    "device": "OpenRLHF's _optimizer_step_loss_norm (utils/loss_utils.py) builds the step's float32 token / "
    "sequence counts on torch.cuda.current_device() whenever CUDA is available, and divides them by the "
    "accumulation steps there (on a GPU a division by a scalar may round differently from the CPU's, "
    "~1e-7 relative): its numerics depend on the machine. The driver runs that function on the CPU, "
    "as on a machine without CUDA (its copy of loss_utils sees torch.cuda.is_available() False), so the "
    "profile (normalizer_rounding='float32_per_micro_batch') and the matrix describe that arithmetic "
    "on every machine; OpenRLHF's GPU arithmetic is not checked.",
}

_LOADED: dict[str, types.ModuleType] = {}
STUBBED: list[str] = []  # which import-only dependencies were stubbed when the sources were loaded


def _private_package(name: str, folder: pathlib.Path) -> None:
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(folder)]
        sys.modules[name] = pkg


def _modules() -> dict[str, types.ModuleType]:
    """``{"loss", "utils", "loss_utils"}`` loaded from the installed files (see module docstring)."""
    if _LOADED:
        return _LOADED
    root = _package_dir()
    if root is None:
        raise ModuleNotFoundError("OpenRLHF is not installed (pip install --no-deps openrlhf==0.11.2)")
    _private_package(_MODELS_PKG, root / "models")
    _private_package(_UTILS_PKG, root / "utils")
    with stubbed_imports(("deepspeed",)) as stubbed, plain_torch_compile():
        utils = importlib.import_module(f"{_MODELS_PKG}.utils")
        loss = importlib.import_module(f"{_MODELS_PKG}.loss")
    loss_utils = importlib.import_module(f"{_UTILS_PKG}.loss_utils")
    loss_utils.torch = _HostTorch(loss_utils.torch)  # NOTES["device"]: the normalisers on the CPU
    STUBBED[:] = stubbed
    _LOADED.update(loss=loss, utils=utils, loss_utils=loss_utils)
    return _LOADED


def availability() -> str | None:
    """None when the installed OpenRLHF loss code can be driven, else a one-line reason."""
    if _package_dir() is None:
        return "OpenRLHF is not installed (pip install --no-deps openrlhf==0.11.2)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _modules()
    except Exception as exc:  # any import failure is reported, not raised
        return f"OpenRLHF's loss code cannot be imported: {type(exc).__name__}: {exc}"
    return None


# ----------------------------------------------------------------------------------------------
# Modes


def modes(kind: str = "policy_loss") -> dict[str, Mode]:
    """The OpenRLHF modes in scope for ``kind`` ("policy_loss", "kl" or "group_advantages")."""
    _check_kind(kind)
    chosen = {"policy_loss": _POLICY_MODES, "kl": _KL_MODES, "group_advantages": ()}[kind]
    return {m.name: m for m in chosen}


def unsupported_modes(kind: str = "policy_loss") -> dict[str, str]:
    """OpenRLHF 0.11.2 modes (and spec presets) out of scope for ``kind``, with the reason."""
    _check_kind(kind)
    return dict(_UNSUPPORTED[kind])


def mode_for_preset(preset: str) -> Mode:
    """The mode that reproduces refimpl preset ``preset`` without variant overrides (``PROFILE``,
    from which ``profile("openrlhf", preset)`` is built)."""
    from refimpl.conformance.presets import preset_key

    key = preset_key(preset)
    if key not in PROFILE:
        raise ValueError(f"preset {preset!r} has no OpenRLHF PolicyLoss equivalent; openrlhf profile "
                         f"supports {sorted(PROFILE)}")
    return modes("policy_loss")[PROFILE[key][0]]


def _check_kind(kind: str) -> None:
    if kind not in ("policy_loss", "kl", "group_advantages"):
        raise ValueError(f"kind must be 'policy_loss', 'kl' or 'group_advantages', got {kind!r}")


def _mode(kind: str, mode: str | Mode) -> Mode:
    if isinstance(mode, Mode):
        return mode
    table = modes(kind)
    if mode not in table:
        why = unsupported_modes(kind).get(mode)
        raise ValueError(
            f"mode {mode!r} is not an OpenRLHF {kind} mode in scope"
            + (f" ({why})" if why else f"; modes: {sorted(table)}")
        )
    return table[mode]


def _mode_variant(mode: Mode):
    from refimpl.losses import get_preset

    return dataclasses.replace(get_preset(mode.preset), **mode.variant_overrides)


def policy_loss_kwargs(variant) -> dict[str, object]:
    """``PolicyLoss(...)`` constructor arguments for a ``PolicyLossVariant`` (raises ValueError
    for a variant OpenRLHF cannot express)."""
    v = variant
    if v.gate != "clip" or v.eps_low is None or v.eps_high is None:
        raise ValueError(f"variant: OpenRLHF PolicyLoss has only the two-sided clip gate, got "
                         f"gate={v.gate!r} eps_low={v.eps_low} eps_high={v.eps_high}")
    if v.behavior_correction != "none" or v.entropy_coef != 0:
        raise ValueError("variant: behavior_correction / entropy_coef are not expressible through the kit's "
                         "OpenRLHF driver (no rollout log-probs or entropy in the cases)")
    if v.ratio == "token":
        if v.aggregation not in ("token_mean", "seq_mean_token_mean"):
            raise ValueError(f"variant.aggregation: OpenRLHF has token-mean and seq-mean-token-mean, "
                             f"got {v.aggregation!r}")
        return dict(
            clip_eps_low=v.eps_low,
            clip_eps_high=v.eps_high,
            dual_clip=v.dual_clip,
            token_level_loss=v.aggregation == "token_mean",
            policy_loss_type="ppo",
        )
    if v.ratio == "sequence_mean":
        if v.dual_clip is not None:
            raise ValueError("variant.dual_clip: not expressible for OpenRLHF's gspo (no spec variant)")
        if v.aggregation not in ("seq_mean", "seq_mean_token_mean"):
            raise ValueError(
                f"variant.aggregation: OpenRLHF's gspo forces the sequence mean, got {v.aggregation!r}"
            )
        return dict(clip_eps_low=v.eps_low, clip_eps_high=v.eps_high, policy_loss_type="gspo")
    raise ValueError(f"variant.ratio: OpenRLHF has 'token' (ppo) and 'sequence_mean' (gspo), got {v.ratio!r}")


# ----------------------------------------------------------------------------------------------
# Targets


def config_for_variant(variant) -> dict[str, object]:
    """OpenRLHF's own options (``train_ppo_ray.py``) that run ``variant`` (a ``PolicyLossVariant``;
    raises ValueError where ``policy_loss_kwargs`` does)."""
    kwargs = policy_loss_kwargs(variant)
    config = {
        "actor.policy_loss_type": kwargs["policy_loss_type"],
        "actor.eps_clip_low_high": (kwargs["clip_eps_low"], kwargs["clip_eps_high"]),
        "actor.dual_clip": kwargs.get("dual_clip"),
        "actor.loss_agg_mode": "token-mean" if kwargs.get("token_level_loss") else "seq-mean-token-mean",
        "algo.advantage.is_correction_level": "off",
        "algo.kl.use_loss": variant.kl_coef > 0,
    }
    if variant.kl_coef > 0:
        config = _kl_loss_config(config, variant.kl_estimator, variant.kl_coef)
    return config


def framework_config(mode: Mode, variant) -> dict[str, object]:
    """OpenRLHF's own options that run ``variant`` (``config_for_variant``)."""
    return config_for_variant(variant) if mode.kind == "policy_loss" else dict(mode.framework_config)


def _step_counts(call, token_level: bool) -> tuple[int, int]:
    """(tokens, sequences) of the optimizer step the call's micro-batch belongs to.

    The count of the loss's own aggregation is the call's ``normalizer`` when given (the kit's
    global denominator, or one imposed as in the golden vectors); otherwise, and for the other
    count (the KL loss is always a token mean), the kit's ``global_tokens`` / ``global_sequences``,
    else the call's own counts.
    """
    mask = call.mask
    tokens = getattr(call, "global_tokens", None)
    sequences = getattr(call, "global_sequences", None)
    tokens = int(mask.sum()) if tokens is None else tokens
    sequences = int(mask.any(dim=-1).sum()) if sequences is None else sequences
    if call.normalizer is not None:
        if call.normalizer != round(call.normalizer):
            raise ValueError(
                f"call.normalizer: OpenRLHF counts whole tokens / sequences, got {call.normalizer}"
            )
        if token_level:
            tokens = int(round(call.normalizer))
        else:
            sequences = int(round(call.normalizer))
    return int(tokens), int(sequences)


def _loss_batch_info(call, loss_utils, token_level: bool) -> tuple[dict, int]:
    """(``loss_batch_info``, gas) for one micro-batch from OpenRLHF's ``_optimizer_step_loss_norm``
    (``iter_grad_accum_global_norm``'s normalisers: the step's token and non-empty-sequence counts
    summed over its micro-batch masks and divided by ``gas``, the kit's ``micro_batch_count``, in
    float32). It is given masks that carry the step's counts (``_step_counts``): one row of
    ``tokens`` ones for ``batch_num_tokens``, ``sequences`` one-token rows for ``global_batch_size``.
    """
    import torch

    gas = int(getattr(call, "micro_batch_count", 1) or 1)
    tokens, sequences = _step_counts(call, token_level)

    def norm(rows: int, cols: int, key: str):
        carrier = torch.ones((rows, cols), dtype=torch.long) if rows and cols else torch.zeros((1, 1))
        return loss_utils._optimizer_step_loss_norm([carrier], None, 1, gas)[key].to(call.logp.device)

    info = {
        "dp_size": 1,
        "batch_num_tokens": norm(1, tokens, "batch_num_tokens"),
        "global_batch_size": norm(sequences, 1, "global_batch_size"),
    }
    return info, gas


def _policy_target(variant) -> tuple[Callable, Callable]:
    mods = _modules()
    kwargs = policy_loss_kwargs(variant)
    loss_fn = mods["loss"].PolicyLoss(**kwargs)
    kl_coef, estimator = float(variant.kl_coef), variant.kl_estimator

    def adapter(fn, call):
        import torch

        action_mask = call.mask.to(torch.long)  # the sample generator's integer action_mask
        advantages = call.advantages
        if advantages.ndim == 1:  # OpenRLHF's advantages are per token
            advantages = advantages.unsqueeze(-1).expand_as(call.logp)
        info, gas = _loss_batch_info(call, mods["loss_utils"], kwargs.get("token_level_loss", False))
        loss = fn(call.logp, call.old_logp, advantages, action_mask=action_mask, **info)[0]
        if kl_coef > 0:  # training_step with algo.kl.use_loss: loss = actor_loss + kl_loss * kl_ctl
            if call.ref_logp is None:
                raise ValueError("call.ref_logp is required when variant.kl_coef > 0")
            kl = mods["utils"].compute_approx_kl(
                call.logp, call.ref_logp, log_probs_old=call.old_logp, kl_estimator=estimator
            )
            loss = loss + mods["loss"].aggregate_loss(kl, action_mask, **info) * kl_coef
        # DeepSpeed engine.backward -> _scale_loss_by_gas: loss / gradient_accumulation_steps()
        return loss / gas

    return loss_fn, adapter


def _kl_target(mode: Mode) -> tuple[Callable, Callable]:
    mods = _modules()
    estimator = mode.variant_overrides["kl_estimator"]

    def adapter(fn, logp, ref_logp):
        return fn(logp, ref_logp, kl_estimator=estimator)

    return mods["utils"].compute_approx_kl, adapter


def target(kind: str, mode: str | Mode, variant=None) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` driving OpenRLHF's own code for ``mode`` of ``kind``.

    policy_loss: ``fn`` is a constructed ``PolicyLoss`` module (for ``variant``, default the mode's
    preset with its overrides) and ``adapter(fn, call)`` returns the micro-batch's share of the
    loss. kl: ``fn`` is ``compute_approx_kl`` and ``adapter(fn, logp, ref_logp)`` the per-token value.
    """
    _check_kind(kind)
    m = _mode(kind, mode)
    version = installed_version()
    if version != PINNED_VERSION:
        warnings.warn(
            f"OpenRLHF {version} is installed; the openrlhf profiles describe {PINNED_VERSION}", stacklevel=2
        )
    if kind == "policy_loss":
        return _policy_target(_mode_variant(m) if variant is None else variant)
    if kind == "kl":
        return _kl_target(m)
    raise ValueError(f"kind {kind!r}: {unsupported_modes(kind)}")

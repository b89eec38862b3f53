"""Driver for the installed AReaL (1.0.4): its actor losses ``ppo_actor_loss_fn`` and ``sapo_loss_fn``
(areal/utils/functional/functional.py), called by the conformance kit as ``PPOActor``'s
``grpo_loss_fn`` and the FSDP engine call them.

How AReaL is imported. AReaL pins torch < 2.11 and transformers <= 5.3 and its package ``__init__``
imports its whole infrastructure (aiohttp, uvloop, hydra, ...), so it is installed with
``--no-deps`` and the driver executes the one installed file it runs, ``utils/functional/functional.py``,
unchanged, as the private module ``_refimpl_areal.functional`` (``sources.load_source``). That file
imports ``RejectionSamplingConfig`` from ``areal.api.cli_args`` and ``KLEstimator`` from
``areal.utils.data`` (each pulling in the infrastructure); both are used only by
``apply_rejection_sampling``, which the driven modes never reach (``rejection_sampling=None``), so
stand-ins serve those two names while the file executes and are removed from ``sys.modules``
afterwards. Nothing in site-packages is edited.

What a call does. ``grpo_loss_fn`` (trainer/ppo/actor.py:408-480) calls
``ppo_actor_loss_fn(logprobs, proximal_logprobs, old_logprobs, advantages, eps_clip, loss_mask,
eps_clip_higher, c_clip, rejection_sampling=None, importance_sampling_level)`` or, with
``use_sapo_loss``, ``sapo_loss_fn(...)``, with per-token advantages and the bool loss mask; without
the decoupled loss the proximal log-probs are the old ones. Each returns the micro-batch's token mean
(``/ loss_mask.count_nonzero()``). The FSDP engine then scales it by ``local_weight /
total_loss_weight`` (engine/fsdp_engine.py:2062, 2120), the micro-batch's token count over the step's
count summed in float32 (engine/core/train_engine.py:54-60); the adapter applies that scaling, the only
arithmetic here that is not AReaL's own. The result is the step's global token mean (``micro_batch
"global"``), up to the float32 rounding of the weight ``n_mb / N`` (2^-24 relative), which no flag
expresses yet (``FLOAT32_WEIGHT``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from . import Mode
from .driver import find_mode
from .findings import Finding, dual_clip_tie_finding, ratio_overflow_finding
from .sources import (
    installed_files,
    load_failure,
    load_source,
    package_dir,
    private_package,
    stand_in,
    temporary_modules,
)

__all__ = [
    "NAME",
    "PINNED_VERSION",
    "DISTRIBUTION",
    "MODES",
    "UNSUPPORTED",
    "PROFILE",
    "NOTES",
    "FINDINGS",
    "availability",
    "source_files",
    "loss_kwargs",
    "target",
    "KIND_MODES",
    "KIND_UNSUPPORTED",
    "kind_target",
]

NAME = "areal"
PINNED_VERSION = "1.0.4"
DISTRIBUTION = "areal"
_PRIVATE = "_refimpl_areal"
_SOURCES = ("utils/functional/functional.py", "trainer/ppo/actor.py", "engine/fsdp_engine.py",
            "trainer/ppo/critic.py")
_INSTALL = "refimpl frameworks install areal"

# The profile (flags of conventions.Convention, as data):
# * compute_dtype "input": nothing is upcast (bf16 / fp16 log-probs give a bf16 / fp16 loss);
# * masked_nonfinite "propagate": ppo_actor_loss_fn masks the ratio with torch.where *after* exp, so
#   a NaN / inf log-prob at a masked position makes exp's gradient NaN (0 * NaN) there, and
#   sapo_loss_fn exponentiates every position;
# * no log-ratio clamp anywhere (exp(logp - proximal_logp) as is);
# * normalizer_rounding "float32_weight": each micro-batch's token mean is weighted by
#   count_nonzero(mask_mb) / float32(sum of counts), a float32 quotient (train_engine.py:54-60,
#   fsdp_engine.py:2120): up to 2^-24 relative off the exact global token mean with micro-batches.
_COMMON = {"compute_dtype": "input", "masked_nonfinite": "propagate", "normalizer_rounding": "float32_weight",
           "ratio_overflow": "nan"}  # exp of the raw log-ratio (functional.py:509): 0 * inf = NaN

MODES = (
    Mode("ppo", preset="ppo", framework_config={"actor.eps_clip": 0.2}, convention=_COMMON,
         description="ppo_actor_loss_fn: clipped surrogate, token mean (engine: global token mean)"),
    Mode("ppo/clip-higher", preset="dapo",
         framework_config={"actor.eps_clip": 0.2, "actor.eps_clip_higher": 0.28},
         convention=_COMMON, description="eps_clip 0.2, eps_clip_higher 0.28 (DAPO's decoupled clip)"),
    Mode("ppo/dual-clip", preset="ppo", variant_overrides={"dual_clip": 3.0},
         framework_config={"actor.eps_clip": 0.2, "actor.c_clip": 3.0},
         convention={**_COMMON, "dual_clip_tie": "half"},
         description="dual clip c_clip 3.0: min(loss, sign(A) c A) = c |A| for A < 0"),
    Mode("gspo", preset="gspo", variant_overrides={"aggregation": "token_mean"},
         framework_config={"actor.eps_clip": 3e-4, "actor.eps_clip_higher": 4e-4,
                           "actor.importance_sampling_level": "sequence"},
         convention=_COMMON,
         description="importance_sampling_level='sequence': exp(mean log-ratio) with its exact gradient, "
         "advantages averaged per row, token mean over the step (rows weighted by their length)"),
    Mode("sapo", preset="sapo", variant_overrides={"aggregation": "token_mean"},
         framework_config={"actor.use_sapo_loss": True, "actor.sapo_tau_pos": 1.0,
                           "actor.sapo_tau_neg": 1.05},
         convention=_COMMON,
         description="sapo_loss_fn: sigmoid gates 4/tau sigmoid(tau (r - 1)), token mean"),
)

UNSUPPORTED = {
    "policy_loss": {
        "use_decoupled_loss / prox_logp_method": "needs the behaviour log-probs, which the policy-loss cases "
        "do not carry: driven as the behavior_correction kind (modes decoupled/...). With the shipped "
        "rejection_sampling=None the decoupled loss applies no pi_prox / pi_behave weight at all "
        "(functional.py:535-539 weighs only under rejection sampling): mode "
        "decoupled/rejection_sampling=None, "
        "flag behavior_weight='dropped'.",
        "rejection_sampling (mask / clamp, token / sequence)": "token-level mask and clamp on the ratio are "
        "driven as the behavior_correction kind; sequence level and the KL metrics are not.",
        "m2_threshold (M2PO)": "masks tokens by a second-moment rule over behaviour log-probs; no spec "
        "variant.",
        "sapo with importance_sampling_level='sequence'": "a sequence ratio under the sigmoid gate is not a "
        "preset.",
        "teacher_logp (KDRL)": "a distillation term against a teacher's log-probs; no spec variant.",
        "KL": "AReaL puts its KL into the rewards (kl_ctl * KLEstimator in compute_advantages), never into "
        "the actor loss.",
    },
    "kl": {
        "KLEstimator": "areal/utils/data.py imports AReaL's infrastructure (einops, torchdata, areal.infra, "
        "hydra through cli_args); its estimators shape rewards, not a differentiated loss term.",
    },
    "group_advantages": {
        "reward_norm / adv_norm (Normalization)": "Normalization lives in areal/utils/data.py (see kl), and "
        "normalises fixed-size contiguous groups (bs // group_size) only; the kit's unequal groups cannot "
        "be expressed.",
    },
}


# preset -> the mode whose flags are ``--convention areal --preset P``
PROFILE = {"ppo": ("ppo",), "bnpo": ("ppo",), "dapo": ("ppo/clip-higher",), "gspo": ("gspo",),
           "sapo": ("sapo",)}


#: Departures AReaL would likely want to change (the matrix lists them with the modes that show them).
FINDINGS = (
    dual_clip_tie_finding("utils/functional/functional.py:530", "pg_loss = torch.min(pg_loss, pg_loss3)",
                          "areal 1.0.4"),
    ratio_overflow_finding("utils/functional/functional.py:509",
                           "ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0)",
                           "areal 1.0.4"),
    Finding(
        "behavior_weight", "documented_default",
        "with use_decoupled_loss=True and the shipped rejection_sampling=None, ppo_actor_loss_fn takes the "
        "ratio against pi_prox but applies no pi_prox / pi_behave weight (the weight is multiplied in only "
        "under rejection sampling): the decoupled objective without its behaviour correction. Documented: "
        "None is 'equivalent to old behave_imp_weight_mode=disabled' (skip the importance weight "
        "correction, cli_args.py:1559), and the config warns that filtering is disabled.",
        where="utils/functional/functional.py:535", quote="if rejection_sampling is not None:",
        affected="areal 1.0.4",
    ),
    Finding(
        "config:c_clip", "validation",
        "ppo_actor_loss_fn asserts only c_clip > 1: a dual clip inside the clip band (c_clip <= 1 + "
        "eps_clip_higher, e.g. 1.1 with eps_clip 0.2) is accepted and clips A < 0 tokens that PPO's own "
        "clip leaves alone (the dual clip needs c >= 1 + eps_high, policy_losses.md eq. (7)).",
        where="utils/functional/functional.py:527", quote="assert c_clip > 1.0, c_clip",
        affected="areal 1.0.4",
    ),
)


NOTES: dict[str, str] = {}


# ----------------------------------------------------------------------------------------------
# Import


def source_files() -> list:
    """The installed files whose code the driver runs or follows; [] when absent."""
    return installed_files("areal", _SOURCES)


@functools.cache
def _functional():
    """``utils/functional/functional.py`` executed from the installed file (module docstring)."""
    root = package_dir("areal")
    if root is None:
        raise ModuleNotFoundError(f"AReaL is not installed ({_INSTALL})")
    private_package(_PRIVATE)

    class _Unused:
        """Stands in for a name the driven losses never use (rejection sampling only)."""

        def __init__(self, *args, **kwargs):
            raise RuntimeError("rejection sampling is not driven by refimpl's AReaL driver")

    stand_ins = {
        "areal.api.cli_args": stand_in("areal.api.cli_args", RejectionSamplingConfig=_Unused),
        "areal.utils.data": stand_in("areal.utils.data", KLEstimator=_Unused),
    }
    with temporary_modules(stand_ins, only_if_missing=False):
        return load_source(f"{_PRIVATE}.functional", root / _SOURCES[0])


def availability() -> str | None:
    """None when AReaL's actor loss can be driven, else a one-line reason."""
    return load_failure("areal", _INSTALL, _functional)


# ----------------------------------------------------------------------------------------------
# Modes


def loss_kwargs(mode: str | Mode, variant) -> dict[str, object]:
    """Keyword arguments of ``ppo_actor_loss_fn`` / ``sapo_loss_fn`` that run ``variant`` in ``mode``
    (ValueError for a variant AReaL cannot express there)."""
    m = find_mode(MODES, mode, "AReaL")
    v = variant
    m.check_shape(v, "AReaL")
    if v.kl_coef > 0 or v.entropy_coef or v.behavior_correction != "none":
        raise ValueError("variant.kl_coef / entropy_coef / behavior_correction: not in AReaL's actor loss")
    if v.gate == "sapo":
        return {"tau_pos": v.tau_pos, "tau_neg": v.tau_neg, "importance_sampling_level": "token"}
    if v.eps_low is None or v.eps_high is None:
        raise ValueError("variant.eps_low / eps_high: AReaL's ppo_actor_loss_fn clips on both sides")
    return {
        "eps_clip": v.eps_low,
        "eps_clip_higher": None if v.eps_high == v.eps_low else v.eps_high,
        "c_clip": v.dual_clip,
        "importance_sampling_level": "sequence" if v.ratio == "sequence_mean" else "token",
    }


# ----------------------------------------------------------------------------------------------
# Target


def _engine_scale(call):
    """``local_weight / total_loss_weight`` of the FSDP engine for the call's micro-batch: its token
    count (int64) over the step's count as a float32 tensor (a quotient in float32)."""
    import torch

    local = call.mask.count_nonzero()
    total = getattr(call, "global_tokens", 0) or int(call.mask.sum())
    if call.normalizer is not None:
        total = call.normalizer
    return local, local / torch.tensor(float(total), dtype=torch.float32, device=call.mask.device)


def _policy_target(m: Mode, variant) -> tuple[Callable, Callable]:
    module = _functional()
    kwargs = loss_kwargs(m, variant)
    sapo = variant.gate == "sapo"
    fn = module.sapo_loss_fn if sapo else module.ppo_actor_loss_fn

    def adapter(fn, call):
        advantages = call.advantages
        if advantages.ndim == 1:  # AReaL's advantages are per token
            advantages = advantages.unsqueeze(-1).expand_as(call.logp)
        mask = call.mask.bool()
        if sapo:
            loss, _stat = fn(logprobs=call.logp, old_logprobs=call.old_logp, advantages=advantages,
                             loss_mask=mask, **kwargs)
        else:  # without the decoupled loss the proximal log-probs are the old ones (actor.py:169-190)
            loss, _stat = fn(logprobs=call.logp, proximal_logprobs=call.old_logp, old_logprobs=call.old_logp,
                             advantages=advantages, loss_mask=mask, rejection_sampling=None, **kwargs)
        local, scale = _engine_scale(call)
        if local == 0:  # _compute_logprobs_and_loss: a micro-batch without tokens contributes 0 * logits
            return call.logp.sum() * 0.0
        return loss * scale

    adapter.scaled_for_accumulation = True
    return fn, adapter


def target(mode: Mode, variant) -> tuple[Callable, Callable]:
    """``(fn, adapter)``: ``fn`` is AReaL's ``ppo_actor_loss_fn`` (``sapo_loss_fn`` for sapo) and
    ``adapter(fn, call)`` its micro-batch loss scaled as the FSDP engine scales it."""
    if mode.kind != "policy_loss":
        raise ValueError(f"AReaL has no {mode.kind} mode in scope: {UNSUPPORTED[mode.kind]}")
    return _policy_target(mode, variant)


# ----------------------------------------------------------------------------------------------
# Kinds of the registry (refimpl/conformance/kinds/): the critic's value loss.

def _rejection(action: str | None) -> dict:
    keys = {"actor.use_decoupled_loss": True, "actor.rejection_sampling": None}
    if action is not None:
        keys["actor.rejection_sampling"] = {"level": "token", "action": action, "metric": "ratio",
                                            "upper": 5.0}
    return keys


KIND_MODES = (
    Mode("decoupled/rejection_sampling=None", kind="behavior_correction", framework_config=_rejection(None),
         convention={"behavior_weight": "dropped"},
         description="ppo_actor_loss_fn, use_decoupled_loss=True and the shipped rejection_sampling=None: "
         "the ratio is against pi_prox and no pi_prox / pi_behave weight is applied "
         "(functional.py:535-539)"),
    Mode("decoupled/clamp", kind="behavior_correction", framework_config=_rejection("clamp"),
         convention={"behavior_cap": "truncate", "behavior_cap_value": 5.0, "behavior_weight_float32": True},
         description="rejection_sampling level='token', action='clamp', metric='ratio', upper=5: "
         "w = min(pi_prox / pi_behave, 5), the weight in float32 (functional.py:231, 252)"),
    Mode("decoupled/mask", kind="behavior_correction", framework_config=_rejection("mask"),
         convention={"behavior_cap": "mask", "behavior_cap_value": 5.0, "behavior_weight_float32": True},
         description="rejection_sampling level='token', action='mask', metric='ratio', upper=5: tokens with "
         "w > 5 leave the loss mask, the token count stays (functional.py:483)"),
    Mode("ppo_critic_loss_fn", kind="value_loss", framework_config={"loss_fn_type": "mse"},
         convention={"value_scale": 0.5, "value_empty_step": "nan", "value_masked_nonfinite": "nan_gradient"},
         description="ppo_critic_loss_fn (functional.py:714) as trainer/ppo/critic.py:105 calls it: float32 "
         "values (asserted), _mse_loss = 0.5 (x - y)^2, torch.where(loss_mask, ...) / count_nonzero"),
)
KIND_UNSUPPORTED = {
    "gae": {"PPOActor._compute_advantages": "GAE runs inside the actor on the whole prompt + response "
            "sequence (loss mask rolled by one, the KL reward and the sequence reward placed by it, the last "
            "position's advantage fixed to 0, values[:, -1] bootstrapped for rows without an EOS); its "
            "inputs are not per-token rewards, so the kit's GAE cases cannot be expressed."},
    "whitening": {"adv_norm (Normalization)": "lives in areal/utils/data.py, which imports AReaL's "
                  "infrastructure (see kl)."},
    "kl_reward": {"PPOActor._compute_advantages": "the KL reward is built inside the actor's advantage "
                  "computation with KLEstimator (areal/utils/data.py, see kl), on the rolled loss mask."},
}


def kind_target(mode: Mode) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` running functional.py's ``ppo_critic_loss_fn`` (float32, as AReaL asserts) or
    ``ppo_actor_loss_fn`` with the decoupled loss (one micro-batch: the engine's weight is 1)."""
    import types

    import torch

    if mode.kind == "behavior_correction":
        rs = mode.framework_config["actor.rejection_sampling"]
        config = None if rs is None else types.SimpleNamespace(lower=None, agg="mean", **rs)

        def decoupled(fn, logp, prox_logp, behave_logp, advantages, mask, *, eps):
            per_token = advantages.unsqueeze(-1).expand_as(logp)  # AReaL's advantages are per token
            return fn(logprobs=logp, proximal_logprobs=prox_logp, old_logprobs=behave_logp,
                      advantages=per_token, eps_clip=eps, loss_mask=mask.bool(), rejection_sampling=config)[0]

        return _functional().ppo_actor_loss_fn, decoupled

    def value(fn, values, old_values, returns, mask, *, clip):
        loss, _stat = fn(value=values.to(torch.float32), old_value=old_values.to(torch.float32),
                         target_value=returns.to(torch.float32), value_eps_clip=clip, loss_mask=mask.bool(),
                         loss_fn_type=mode.framework_config["loss_fn_type"])
        return loss

    return _functional().ppo_critic_loss_fn, value

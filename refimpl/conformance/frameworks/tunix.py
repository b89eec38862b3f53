"""Driver for Tunix (google-tunix 0.1.7, JAX): the loss and advantage functions of its RL core,
``tunix/rl/algo_core.py``, and its KL estimator ``common.compute_kl_divergence``, driven from the kit's
torch tensors, value and gradient (``jax.vjp``, under ``jax.jit`` as Tunix's trainer compiles its step).

How Tunix is imported. Its package ``__init__`` imports the trainers, samplers, model loaders and
checkpointing (orbax, grain, tensorflow-datasets, ...); the RL core imports only jax, flax, numpy,
absl and three small modules of its own. The driver therefore imports ``tunix.rl.algo_core`` and
``tunix.rl.common`` (the installed files, unchanged) under an empty ``tunix`` package whose path is the
installed folder, so ``tunix/__init__.py`` does not run; the package entries leave ``sys.modules``
afterwards. ``humanize``, which ``tunix/sft/utils.py`` imports for its memory log lines, is stubbed
for the import when absent (``stubs.stubbed_imports``).

What a call does. Tunix's policy losses take the model, not log-probabilities:
``grpo_loss_fn(model, train_example, algo_config, pad_id, eos_id)`` (algo_core.py:342) and
``ppo_policy_loss_fn`` (algo_core.py:181) first call the forward pass
``common.compute_per_token_logps(graphdef, state, ...)`` (common.py:286). The driver runs Tunix's own
function (its code object unchanged) with that one name of ``common`` replaced by a stand-in returning
the kit's log-probabilities, held as the ``nnx.Param`` of a one-parameter ``nnx.Module``, so that
``jax.grad`` of Tunix's loss flows back to them (as the TRL driver replaces
``_get_per_token_logps_and_entropies``). Everything after the forward pass is Tunix's: the ratio,
clips, dual clip, GSPO-token ratio, ``common.aggregate_loss`` (common.py:533) and
``common.compute_kl_divergence`` (common.py:116). The logits the stand-in returns are those of a
one-token vocabulary (entropy 0): they feed only the logged entropy of ``grpo_loss_fn`` and the
entropy bonus of ``ppo_policy_loss_fn``, which the driver does not run (``entropy_coef`` refused).

Dtypes. The real forward pass returns float32 log-probabilities whatever the model's dtype
(``selective_log_softmax`` casts, common.py:182-185), and the old and reference log-probs come from
the same function; JAX computes in float32 unless ``jax_enable_x64`` is set, which Tunix never sets.
So the driver hands Tunix float32 arrays (the kit's float64, bf16 and fp16 inputs rounded to float32:
profile flag ``compute_dtype="float32"``) and returns the value as float32 and the gradient in the
kit's dtype. Advantage estimators get the rewards as Tunix's reward manager builds them, a float64
numpy array (reward_manager.py:127), and compute in numpy.

The registry's kinds (PPO's GAE, its whitening and value loss, DAPO's overlong shaping) are in
tunix_kinds.py, the findings and the matrix's notes in tunix_findings.py.

Micro-batches: Tunix's RL trainer accumulates ``mini_batch_size // train_micro_batch_size``
micro-batches (rl_cluster.py:140) with ``optax.MultiSteps`` (sft/peft_trainer.py:213), which averages
their gradients: the mean of micro-batch losses, each normalised by its own counts
(``micro_batch="local_mean"``).
"""

from __future__ import annotations

import functools
import importlib
import sys
import types
from collections.abc import Callable

from . import Mode
from .driver import find_mode
from .jax_bridge import float32, from_jax
from .sources import installed_files, load_failure, package_dir, stand_in
from .stubs import stubbed_imports
from .tunix_findings import FINDINGS, NOTES
from .tunix_kinds import KIND_MODES, KIND_UNSUPPORTED
from .tunix_kinds import kind_target as _kind_target

__all__ = ["NAME", "PINNED_VERSION", "DISTRIBUTION", "EXTRA", "REQUIREMENTS", "MODES", "UNSUPPORTED",
           "PROFILE", "NOTES", "FINDINGS", "KIND_MODES", "KIND_UNSUPPORTED",
           "availability", "source_files", "algo_config", "framework_config",
           "target", "kind_target", "tunix_loss"]

NAME = "tunix"
PINNED_VERSION = "0.1.7"
DISTRIBUTION = "google-tunix"
#: rl-oracle's extra installed (with its dependencies) before the --no-deps step: the CPU jax wheel
EXTRA = "tunix"
#: what the RL core imports beyond jax (flax.nnx and its import-time modules), installed --no-deps
REQUIREMENTS = ("flax==0.12.8", "optax==0.2.8", "msgpack==1.2.4", "absl-py==2.5.1", "rich==15.0.0",
                "PyYAML==6.0.4", "treescope==0.1.10")
_STUBBED = ("humanize",)
_SOURCES = ("rl/algo_core.py", "rl/common.py", "rl/grpo/dapo_learner.py")
_INSTALL = "refimpl frameworks install tunix"

# ----------------------------------------------------------------------------------------------
# The profile
#
# grpo_loss_fn (every GRPO-family mode):
# * compute_dtype "float32": the forward pass's float32 log-probs, and the explicit casts of
#   per_token_logps / old / advantages to float32 (algo_core.py:399-408);
# * log_ratio_clamp 20: jnp.clip(log ratio, -20, 20) before exp (algo_core.py:414), so no overflow;
# * masked_nonfinite "propagate": aggregate_loss sums per_token_loss * completion_mask (NaN * 0);
# * micro_batch "local_mean" (optax.MultiSteps, module docstring);
# * zero_rows "raise": the logged is_ratio/max, jnp.max over a zero-size array (algo_core.py:477).
_GRPO = {"compute_dtype": "float32", "log_ratio_clamp": 20.0, "masked_nonfinite": "propagate",
         "micro_batch": "local_mean", "zero_rows": "raise"}
# the clip (algo_core.py:436-438, GSPO-token's included; 218-223 in ppo_policy_loss_fn): jnp.clip passes
# half of its derivative at a bound and jnp.maximum(-A r, -A clip(r)) splits the tie that makes, 3/4 of
# the gradient at r == 1 - eps or 1 + eps_high whatever the sign of A (clip_bound_tie). jnp.minimum(-A c,
# loss) halves the dual clip's tie: a subgradient, which the judge accepts with a note (no flag).
_CLIP_TIE = {"clip_bound_tie": "three_quarters"}
# aggregate_loss (common.py:533): the row means divide by the non-empty rows, clip(rows, 1), and the
# token mean by clip(tokens, 1), as the spec does; "sequence-mean-token-scale" (Dr. GRPO) divides each
# row's sum by norm, whose default is per_token_loss.shape[-1], the padded width (common.py:568)
_AGGREGATIONS = {
    # loss_agg_mode: (aggregation, variant overrides, flags)
    "sequence-mean-token-mean": ("seq_mean_token_mean", {}, {}),
    "token-mean": ("token_mean", {}, {}),
    "sequence-mean-token-scale": ("seq_sum", {"max_length": 16}, {"seq_sum_width": "padded_width"}),
    "seq-mean-token-sum": ("seq_mean_token_sum", {}, {}),
    # the sum of every token's loss / the non-empty rows (norm's default): seq_mean_token_sum's value
    "sequence-mean-token-sum-norm": ("seq_mean_token_sum", {}, {}),
}
# compute_kl_divergence (common.py:116): float32, low_var_kl evaluated as exp(d) - d - 1 (no expm1),
# no clamp unless kl_clamp_value is set (None by default); aggregated like the policy term
_KL = {"kl_compute_dtype": "float32"}
_K3 = {**_KL, "kl_k3_form": "naive"}
_KL_MODES = {"kl": ("k1", _KL), "mse_kl": ("k2", _KL), "low_var_kl": ("k3", _K3)}
# ppo_policy_loss_fn (algo_core.py:181): exp of the raw log-ratio (line 214: no clamp, so a closed gate
# on an overflowing ratio is NaN), masked_mean = sum(x * mask) / (sum(mask) + 1e-8) (line 137: the
# 1e-8 vanishes in float32 for any count >= 1, and a step without tokens gives 0 / 1e-8 = 0)
_PPO = {"compute_dtype": "float32", "masked_nonfinite": "propagate", "micro_batch": "local_mean",
        "ratio_overflow": "nan", **_CLIP_TIE}


def _grpo_mode(name: str, preset: str, agg_mode: str, description: str, *, loss_algo: str = "grpo",
               flags: dict | None = None, **overrides) -> Mode:
    aggregation, agg_overrides, agg_flags = _AGGREGATIONS[agg_mode]
    if preset != "gspo":
        overrides = {"aggregation": aggregation, **agg_overrides, **overrides}
    return Mode(name, preset=preset, variant_overrides=overrides,
                framework_config={"policy_loss_fn": "grpo", "loss_algo": loss_algo,
                                  "loss_agg_mode": agg_mode},
                convention={**_GRPO, **agg_flags, **_CLIP_TIE, **(flags or {})}, description=description)


_LOSSES = (
    _grpo_mode("grpo", "grpo", "sequence-mean-token-mean", "GRPOConfig's loss_agg_mode: each row's token "
               "mean, mean over the non-empty rows"),
    _grpo_mode("dapo", "dapo", "token-mean", "DAPOConfig: token mean, epsilon_high 0.28"),
    _grpo_mode("drgrpo", "dr_grpo", "sequence-mean-token-scale", "DrGRPOConfig: each row's sum / the "
               "padded width (aggregate_loss's default norm), mean over the non-empty rows"),
    _grpo_mode("grpo/seq-mean-token-sum", "dr_grpo", "seq-mean-token-sum", "each row's sum, mean over "
               "the non-empty rows"),
    _grpo_mode("grpo/sequence-mean-token-sum-norm", "dr_grpo", "sequence-mean-token-sum-norm", "the sum "
               "of all tokens / the non-empty rows (norm's default)"),
    # loss_algo "gspo-token" (algo_core.py:417-426): the token log-ratios (clamped to +-20) averaged over
    # the row, the GSPO-token form logp - sg(logp) + sg(log s), capped above at 10
    _grpo_mode("gspo-token", "gspo", "sequence-mean-token-mean", "loss_algo='gspo-token': GSPO-token "
               "ratio, log s capped at 10", loss_algo="gspo-token",
               flags={"sequence_ratio_gradient": "token", "sequence_log_ratio_cap": 10.0}),
    _grpo_mode("grpo/dual-clip", "grpo", "sequence-mean-token-mean", "epsilon_c=3.0: the dual clip "
               "min(-A c, loss) for A < 0 (algo_core.py:445-461)", dual_clip=3.0),
    *(_grpo_mode(f"grpo+kl/{kl}", "grpo", "sequence-mean-token-mean", f"beta 0.04, kl_loss_mode={kl!r} "
                 "(GRPOConfig's default is 'kl'), aggregated like the policy term",
                 flags=flags, kl_coef=0.04, kl_estimator=estimator)
      for kl, (estimator, flags) in _KL_MODES.items()),
    Mode("ppo", preset="ppo", framework_config={"policy_loss_fn": "ppo"}, convention=dict(_PPO),
         description="ppo_policy_loss_fn: masked token mean of the clipped surrogate"),
    Mode("ppo/dual-clip", preset="ppo", variant_overrides={"dual_clip": 3.0},
         framework_config={"policy_loss_fn": "ppo", "epsilon_c": 3.0}, convention=dict(_PPO),
         description="PPOConfig.epsilon_c=3.0: the dual clip for A < 0"),
)
_KL_KIND = tuple(
    Mode(kl, kind="kl", variant_overrides={"kl_estimator": estimator}, framework_config={"kl_loss_mode": kl},
         convention=dict(flags), description=f"common.compute_kl_divergence(logp, ref_logp, {kl!r})")
    for kl, (estimator, flags) in _KL_MODES.items()
)
# the estimators of algo_core.py:548-617 (numpy on the reward manager's float64 rewards); GRPOConfig
# rejects num_generations <= 1 (grpo_learner.py:99), so a singleton group is an error; DAPOConfig does
# not (finding config:num_generations: its advantages are then NaN)
_ADVANTAGES = {
    # name: (function, flags)
    "grpo": ("compute_advantages", {"adv_std": "sample", "adv_eps": 1e-6, "adv_eps_inside_sqrt": False,
                                    "adv_zero_variance": "formula", "adv_singleton": "error"}),
    "drgrpo": ("compute_drgrpo_advantages", {"adv_scale": "none", "adv_singleton": "error"}),
    "rloo": ("compute_rloo_advantages", {"adv_scale": "none", "adv_leave_one_out": True,
                                         "adv_singleton": "error"}),
}
_ADV_KIND = tuple(
    Mode(name, kind="group_advantages", framework_config={"advantage_estimator": name},
         convention=dict(flags), description=f"algo_core.{function}(rewards, num_generations)")
    for name, (function, flags) in _ADVANTAGES.items()
)
MODES = _LOSSES + _KL_KIND + _ADV_KIND

UNSUPPORTED = {
    "policy_loss": {
        "entropy_coef (ppo)": "the entropy bonus needs the model's logits; the kit's calls carry log-probs. "
        "compute_entropy_from_logits is NaN for a -inf logit (0 * -inf; finding entropy_neg_inf, shown by "
        "its script).",
        "sampler_is_weights": "truncated importance weights computed upstream from the sampler's log-probs, "
        "which the kit's calls do not carry (the agentic learner's sampler_is='token', "
        "agentic_grpo_learner.py:659-674); sampler_is and sampler_is_threshold are not checked: another "
        "value, or 'token' with use_rollout_logps=False, applies no correction and a threshold <= 0 zeroes "
        "or negates every token's loss (findings config:sampler_is, config:sampler_is_threshold, each "
        "shown by its script); the vanilla sampler's log-probs they start from (also the old log-probs of "
        "use_rollout_logps) are of the untruncated softmax when top_k / top_p truncate the distribution "
        "sampled (finding rollout_logps_truncation, shown by its script).",
        "kl_clamp_value": "None by default (algorithm_config.py:39); a set clamp is not a mode here. A "
        "value <= 0 is accepted and makes the KL a constant without gradient (finding "
        "config:kl_clamp_value, shown by its script).",
        "ppo + KL": "ppo_policy_loss_fn reads getattr(algo_config, 'kl_coef', 0.0) (algo_core.py:256), a "
        "field PPOConfig does not have (its slots dataclass cannot take it): PPO's KL goes into the reward "
        "(ppo_learner.py:357-367), not the loss.",
        "sequence packing": "max_seq_token_per_tpu packs several sequences into one row (rl/utils.py:404) "
        "that grpo_loss_fn aggregates as one sequence (finding packed_rows, shown by its script) and drops a "
        "sequence longer than the budget with a warning (finding config:max_seq_token_per_tpu); the kit's "
        "calls are one sequence per row.",
        "the learners' masks and old log-probs": "built in the learners' rollout steps, which need the RL "
        "cluster: the loss mask is completion_ids != pad_id (finding completion_mask_pad_eos), the vanilla "
        "engine returns completions without their EOS (finding vanilla_drops_eos), with num_iterations=1 "
        "the old log-probs are the current policy's (finding stale_old_logps), with num_iterations > 1 the "
        "vanilla rollout's at temperature 1 (finding old_logps_temperature), PPO's policy log-probs ignore "
        "the rollout temperature its reference log-probs use (finding ppo_logps_temperature), and the "
        "reward manager sums the reward functions with np.nansum (finding reward_nan_as_zero), each shown "
        "by its script.",
    },
    "group_advantages": {
        "gae": "token-level (PPO's critic): the gae kind, not group advantages.",
        "a group of one (DAPOConfig)": "GRPOConfig refuses num_generations <= 1, the modes' singleton "
        "rule (adv_singleton='error'); DAPOConfig's __post_init__ skips that check: num_generations=1 is "
        "accepted and compute_advantages gives NaN, compute_rloo_advantages 0 (finding "
        "config:num_generations, shown by its script).",
    },
}

PROFILE = {"grpo": ("grpo",), "dapo": ("dapo",), "dr_grpo": ("drgrpo",), "gspo": ("gspo-token",),
           "ppo": ("ppo",)}

# ----------------------------------------------------------------------------------------------
# Import


def source_files() -> list:
    """The installed files whose code the driver runs ([] when Tunix is absent)."""
    return [f for f in installed_files("tunix", _SOURCES) if f.is_file()]


@functools.cache
def _tunix() -> tuple[types.ModuleType, types.ModuleType]:
    """``(tunix.rl.algo_core, tunix.rl.common)``, imported without ``tunix/__init__.py`` (docstring)."""
    root = package_dir("tunix")
    if root is None:
        raise ModuleNotFoundError(f"google-tunix is not installed ({_INSTALL})")
    importlib.import_module("jax")
    placed = "tunix" not in sys.modules
    if placed:
        package = types.ModuleType("tunix")
        package.__path__ = [str(root)]
        sys.modules["tunix"] = package
    try:
        with stubbed_imports(_STUBBED):
            algo_core = importlib.import_module("tunix.rl.algo_core")
            common = importlib.import_module("tunix.rl.common")
    finally:
        if placed:
            for name in [m for m in sys.modules if m == "tunix" or m.startswith("tunix.")]:
                del sys.modules[name]
    return algo_core, common


def availability() -> str | None:
    return load_failure("tunix", _INSTALL, _tunix)


# ----------------------------------------------------------------------------------------------
# The forward pass's stand-in and the JAX <-> torch bridge


@functools.cache
def _policy_class():
    from flax import nnx

    class KitPolicy(nnx.Module):
        """A policy whose forward pass returns its one parameter: the kit's log-probabilities."""

        def __init__(self, logp):
            self.logp = nnx.Param(logp)

    return KitPolicy


def _forward(graphdef, state, prompt_tokens, completion_tokens, pad_id, eos_id, images=None,
             stop_gradient=True, return_logits=False, segment_ids=None, segment_positions=None,
             temperature=1.0):
    """Stand-in for ``common.compute_per_token_logps`` (same signature): the policy's log-probs."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    logp = nnx.merge(graphdef, state).logp[...]
    if completion_tokens.shape[1] != logp.shape[1]:
        raise RuntimeError(f"Tunix asked for {completion_tokens.shape[1]} positions, "
                           f"the call has {logp.shape[1]}")
    if stop_gradient:
        logp = jax.lax.stop_gradient(logp)
    logits = jnp.zeros((*logp.shape, 1), logp.dtype)  # a one-token vocabulary: entropy 0
    return (logp, logits) if return_logits else logp


def _score(model, prompt_tokens, completion_tokens, pad_id, eos_id, stop_gradient=True, segment_ids=None,
           segment_positions=None):
    """Stand-in for ``common.compute_score`` (the critic's forward pass, same signature): scores over
    prompt + completion whose positions ``[-T - 1:-1]`` (those ppo_value_loss_fn reads, after a
    one-token prompt) are the values held by ``model``."""
    import jax
    import jax.numpy as jnp

    values = model.logp[...]
    if prompt_tokens.shape[1] != 1 or completion_tokens.shape[1] != values.shape[1]:
        raise RuntimeError("the value stand-in expects a one-token prompt and the call's completion width")
    scores = jnp.concatenate([values, jnp.zeros((values.shape[0], 1), values.dtype)], axis=1)
    return jax.lax.stop_gradient(scores) if stop_gradient else scores


@functools.cache
def _with_forward(fn: Callable) -> Callable:
    """Tunix's loss function ``fn`` (its code object unchanged) with ``common`` bound to
    ``tunix.rl.common`` whose forward passes ``compute_per_token_logps`` and ``compute_score`` are the
    stand-ins."""
    _, common = _tunix()
    names = {k: v for k, v in vars(common).items() if not k.startswith("__")}
    names.update(compute_per_token_logps=_forward, compute_score=_score)
    namespace = {**fn.__globals__, "common": stand_in("tunix.rl.common", **names)}
    out = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    return out


# ----------------------------------------------------------------------------------------------
# Modes


_KL_NAMES = {estimator: kl for kl, (estimator, _) in _KL_MODES.items()}


def algo_config(mode: str | Mode, variant) -> types.SimpleNamespace:
    """The attributes of Tunix's algorithm config its loss function reads, for ``variant`` in ``mode``
    (GRPOConfig / PPOConfig defaults for the rest); ValueError for a variant Tunix cannot express."""
    m = find_mode(MODES, mode, "Tunix")
    m.check_shape(variant, "Tunix")
    v = variant
    if v.entropy_coef or v.behavior_correction != "none":
        raise ValueError("variant.entropy_coef / behavior_correction: not driven for Tunix")
    if v.eps_low is None or v.eps_high is None:
        raise ValueError("Tunix clips on both sides: variant.eps_low and eps_high must be set")
    if m.framework_config["policy_loss_fn"] == "ppo":
        if v.kl_coef:
            raise ValueError("variant.kl_coef: Tunix's PPO loss has no KL term (its KL is in the reward)")
        return types.SimpleNamespace(epsilon=v.eps_low, epsilon_low=v.eps_low, epsilon_high=v.eps_high,
                                     epsilon_c=v.dual_clip, entropy_coef=None)
    return types.SimpleNamespace(
        beta=float(v.kl_coef), epsilon=v.eps_low, epsilon_high=v.eps_high, epsilon_c=v.dual_clip,
        loss_algo=m.framework_config["loss_algo"], loss_agg_mode=m.framework_config["loss_agg_mode"],
        kl_loss_mode=_KL_NAMES[v.kl_estimator], kl_clamp_value=None, temperature=1.0)


def framework_config(mode: Mode, variant) -> dict:
    """Tunix's own config keys for ``mode`` running ``variant``."""
    if mode.kind != "policy_loss":
        return dict(mode.framework_config)
    config = vars(algo_config(mode, variant))
    return {"policy_loss_fn": mode.framework_config["policy_loss_fn"],
            **{k: config[k] for k in sorted(config) if k not in ("temperature", "entropy_coef")}}


@functools.cache
def _loss_of_logp(fn: Callable, config_items: tuple) -> Callable:
    """``loss(logp, mask, advantages, old, ref)``: Tunix's loss ``fn`` with the config ``config_items``
    on a ``TrainExample`` of those arrays, the policy's forward pass returning ``logp``."""
    import jax.numpy as jnp

    _, common = _tunix()
    config = types.SimpleNamespace(**dict(config_items))
    policy = _policy_class()
    rebound = _with_forward(fn)

    def loss(logp, mask, advantages, old, ref):
        n, width = mask.shape
        example = common.TrainExample(
            prompt_ids=jnp.zeros((n, 0), jnp.int32), prompt_mask=jnp.zeros((n, 0), jnp.int32),
            completion_ids=jnp.zeros((n, width), jnp.int32), completion_mask=mask, advantages=advantages,
            old_per_token_logps=old, ref_per_token_logps=ref,
        )
        return rebound(policy(logp), example, config, 0, 1)[0]

    return loss


def tunix_loss(fn: Callable, call, config) -> object:
    """Tunix's loss ``fn`` on the kit's ``call`` (a ``PolicyLossCall``) with ``config``: a float32 torch
    scalar whose gradient reaches ``call.logp``."""
    import numpy as np

    # the learners' mask is np.not_equal(completion_ids, pad_id), a bool array (grpo_learner.py:256,
    # ppo_learner.py:280); int32 0/1 here gives the same products and sums
    mask = call.mask.to("cpu").int().numpy()
    kl = getattr(config, "beta", 0.0) != 0.0  # ref log-probs only then: grpo_learner.py:262
    loss = _loss_of_logp(fn, tuple(sorted(vars(config).items())))
    advantages = float32(call.advantages)
    if not hasattr(config, "beta"):  # PPO's advantages are per token (GAE's [B, T], algo_core.py:217)
        advantages = np.broadcast_to(advantages[:, None], mask.shape).copy()
    return from_jax(call.logp, loss, mask, advantages, float32(call.old_logp),
                     float32(call.ref_logp) if kl else None)


def target(mode: Mode, variant) -> tuple[Callable, Callable]:
    """``(fn, adapter)``: ``fn`` is Tunix's own function of the mode; the adapter calls it on the kit's
    tensors. policy_loss: ``adapter(fn, call)`` is the micro-batch's loss divided by the number of
    micro-batches (``optax.MultiSteps`` averages their gradients; the kit sums the micro-batches);
    kl: ``adapter(fn, logp, ref_logp)`` the per-token estimate; group_advantages: ``adapter(fn,
    rewards, group_ids)`` the advantages."""
    algo_core, common = _tunix()
    if mode.kind == "kl":
        method = mode.framework_config["kl_loss_mode"]

        estimate = _kl_of_logp(method)

        def kl_adapter(fn, logp, ref_logp):
            return from_jax(logp, estimate, float32(ref_logp))

        return common.compute_kl_divergence, kl_adapter
    if mode.kind == "group_advantages":
        return getattr(algo_core, _ADVANTAGES[mode.name][0]), _advantages
    config = algo_config(mode, variant)
    ppo = mode.framework_config["policy_loss_fn"] == "ppo"
    fn = algo_core.ppo_policy_loss_fn if ppo else algo_core.grpo_loss_fn

    def adapter(fn, call):  # optax.MultiSteps' mean: each micro-batch's loss / their number, summed
        return tunix_loss(fn, call, config) / int(getattr(call, "micro_batch_count", 1) or 1)

    adapter.scaled_for_accumulation = True
    return fn, adapter


@functools.cache
def _kl_of_logp(method: str) -> Callable:
    _, common = _tunix()
    return lambda logp, ref: common.compute_kl_divergence(logp, ref, method)


def _advantages(fn, rewards, group_ids):
    """``fn(rewards, num_generations)`` on the groups of each size, contiguous as Tunix's learner
    lays them out (each prompt repeated num_generations times), in the kit's order again."""
    import numpy as np
    import torch

    ids = group_ids.cpu().numpy()
    values = rewards.detach().cpu().double().numpy()  # the reward manager's float64 (reward_manager.py:127)
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(ids.tolist()):
        groups.setdefault(g, []).append(i)
    if any(len(rows) < 2 for rows in groups.values()):
        raise ValueError("num_generations must be greater than 1 (GRPOConfig rejects a group of one)")
    out = np.empty_like(values)
    for size in sorted({len(rows) for rows in groups.values()}):
        order = [i for rows in groups.values() if len(rows) == size for i in rows]
        out[order] = np.asarray(fn(values[order], size), dtype=np.float64)
    return torch.from_numpy(out)


def kind_target(mode: Mode) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` of a registry-kind mode (tunix_kinds.py)."""
    algo_core, _ = _tunix()
    return _kind_target(mode, algo_core, _with_forward, _policy_class)

"""The AReaL driver's modes outside the actor loss: group advantages (``Normalization``), the KL reward
(``KLEstimator``), both in areal/utils/data.py, and the registry's kinds (the decoupled loss's behaviour
correction and the critic's value loss, in utils/functional/functional.py).

How ``utils/data.py`` is run. The file imports AReaL's infrastructure (einops, torchdata, areal.infra,
hydra through cli_args), so the driver executes, unchanged, the methods of its two classes it needs
(``sources.function_from_source``: each ``def`` with its decorators, the file's line numbers) in a
namespace of torch, numpy and torch.distributed (never initialised here: AReaL's all-reduces are
skipped, as on one rank), and assembles the classes from them. ``Normalization`` takes a config object;
the driver passes the ``NormConfig`` fields it reads.

What a group-advantages call does. ``PPOActor`` normalises twice (trainer/ppo/actor.py): the sequence
rewards with ``reward_norm`` (``[bs]``, no mask, :172-173) and the per-token advantages with ``adv_norm``
(``[bs, T]`` with the loss mask, :238-239). Without values, KL and discount (GRPO with ``kl_ctl`` set to
0: the shipped 0.1 without a reference model adds a KL reward against zeros, finding
``kl_reward_no_reference``; ``discount`` = ``gae_lambda`` = 1) every response token's advantage is its
sequence reward, so the
``adv_norm`` adapter broadcasts each reward over its response's tokens (the case's ``lengths``) and
reads the first token's advantage back (every token of a response gets the same one). AReaL's groups
are contiguous blocks of ``group_size``: a batch of such blocks, the last one possibly shorter (the
trailing partial group of a batch whose size is not a multiple), is one call with the first block's
size; other batches (groups of unequal sizes, not contiguous) run one call per group with its own size,
as a trainer configured with that group size computes it.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable

from . import Mode
from .sources import function_from_source, package_dir

__all__ = ["ADV_MODES", "KIND_MODES", "KIND_UNSUPPORTED", "advantage_target", "kind_target", "data_classes"]

_DATA = "utils/data.py"


@functools.cache
def data_classes() -> types.SimpleNamespace:
    """``Normalization`` and ``KLEstimator`` of the installed ``utils/data.py`` (module docstring)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    root = package_dir("areal")
    if root is None:
        raise ModuleNotFoundError("AReaL is not installed (refimpl frameworks install areal)")
    path = root / _DATA
    namespace = {"torch": torch, "np": np, "dist": dist, "NormConfig": object}  # NormConfig: an annotation

    def build(name: str, methods: tuple[str, ...]) -> type:
        return type(name, (), {m: function_from_source(path, f"{name}.{m}", namespace) for m in methods})

    return types.SimpleNamespace(
        Normalization=build("Normalization", ("__init__", "__call__", "_compute_mean", "_compute_std")),
        KLEstimator=build("KLEstimator", ("__init__", "__call__", "_compute_approx_kl")),
    )


# ----------------------------------------------------------------------------------------------
# Group advantages (kind "group_advantages"): Normalization

def _norm(mean_level="group", std_level="group", leave_one_out=False) -> dict:
    return {"mean_level": mean_level, "mean_leave1out": leave_one_out, "std_level": std_level,
            "std_unbiased": True, "eps": 1e-5}


# NormConfig's defaults (api/cli_args.py): std_unbiased True (sample std), eps 1e-5 added to the std
# (data.py:1496)
_STD = {"adv_output_float32": True, "adv_std": "sample", "adv_eps": 1e-5, "adv_eps_inside_sqrt": False,
        "adv_trailing_partial": "unnormalised"}
_TOKENS = {"adv_weighting": "token"}
ADV_MODES = (
    Mode("reward_norm/group", kind="group_advantages", framework_config={"reward_norm": _norm()},
         convention=_STD,
         description="Normalization on the sequence rewards [bs] (actor.py:172-173), mean_level and "
         "std_level "
         "'group' (std_unbiased, eps 1e-5): (R - mean) / (std + eps) per contiguous group of group_size"),
    Mode("adv_norm/group", kind="group_advantages", framework_config={"adv_norm": _norm()},
         convention={**_STD, **_TOKENS},
         description="Normalization on the per-token advantages with the loss mask (actor.py:238-239), "
         "mean_level and std_level 'group': the group's token mean and std (each response weighs its "
         "length)"),
    Mode("adv_norm/group_mean", kind="group_advantages",
         framework_config={"adv_norm": _norm(std_level=None)},
         convention={"adv_scale": "none", "adv_trailing_partial": "unnormalised", "adv_output_float32": True,
                     **_TOKENS},
         description="adv_norm with std_level None (Dr. GRPO's centring): R minus the group's token mean"),
    Mode("adv_norm/group_mean_leave1out", kind="group_advantages",
         framework_config={"adv_norm": _norm(std_level=None, leave_one_out=True)},
         convention={"adv_scale": "none", "adv_leave_one_out": True, "adv_singleton": "raw",
                     "adv_trailing_partial": "unnormalised", "adv_leave_one_out_unit": "token",
                     "adv_output_float32": True, **_TOKENS},
         description="adv_norm with mean_leave1out (RLOO): (sum - x) / (count - 1) over the group's tokens; "
         "a group of one (group_size 1) gets mean 0, so A = R"),
)


def _block_size(group_ids) -> int | None:
    """The ``group_size`` of one call over the batch: contiguous groups of one size, the last possibly
    shorter; None for other batches (one call per group, module docstring)."""
    from ..token_groups import trailing_partial_block

    ids = group_ids.tolist()
    starts = [i for i in range(len(ids)) if i == 0 or ids[i] != ids[i - 1]]
    sizes = {b - a for a, b in zip(starts, starts[1:] + [len(ids)], strict=True)}
    if len(set(ids)) == len(starts) and (len(sizes) == 1 or trailing_partial_block(group_ids) is not None):
        return starts[1] if len(starts) > 1 else len(ids)
    return None


def advantage_target(mode: Mode) -> tuple[Callable, Callable]:
    """``(fn, adapter)``: ``fn`` is AReaL's ``Normalization`` class, ``adapter(fn, rewards, group_ids,
    lengths)`` its advantages ``[N]`` as the actor computes them (module docstring)."""
    import torch

    key = "adv_norm" if "adv_norm" in mode.framework_config else "reward_norm"
    config = mode.framework_config[key]
    per_token = key == "adv_norm"

    def normalise(fn, rewards, lengths, group_size):
        norm = fn(types.SimpleNamespace(**config, group_size=group_size))
        if not per_token:
            return norm(rewards.clone())
        width = int(lengths.max())
        mask = (torch.arange(width, device=rewards.device)[None, :] < lengths[:, None]).float()
        return norm(rewards[:, None] * mask, mask)[:, 0]  # every token of a response: the same value

    def adapter(fn, rewards, group_ids, lengths=None):
        lengths = torch.ones_like(group_ids) if lengths is None else lengths
        size = _block_size(group_ids)
        if size is not None:
            return normalise(fn, rewards, lengths, size)
        out = torch.empty(rewards.shape, dtype=torch.float32, device=rewards.device)
        for g in torch.unique(group_ids):  # groups of unequal sizes: one call per group
            rows = group_ids == g
            out[rows] = normalise(fn, rewards[rows], lengths[rows], int(rows.sum()))
        return out

    adapter.takes_lengths = True
    return data_classes().Normalization, adapter


# ----------------------------------------------------------------------------------------------
# Kinds of the registry (refimpl/conformance/kinds/)

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
    Mode("masked_normalization", kind="whitening", framework_config={"unbiased": False, "eps": 1e-5},
         convention={"whiten_one_pass": True, "whiten_one_pass_dtype": "float64", "whiten_eps": 1e-5,
                     "whiten_eps_placement": "std", "whiten_masked_nonfinite": "propagate"},
         description="masked_normalization (functional.py:15-53, exported; AReaL's trainer normalises with "
         "Normalization) with its defaults: x * mask, var = E[x^2] - E[x]^2 in float64, (x - mean) / "
         "(sqrt(var) + 1e-5), returned in float32"),
    Mode("reward_overlong_penalty", kind="overlong",
         framework_config={"actor.overlong_reward_penalty": True, "actor.overlong_penalty_factor": 1.0},
         convention={"overlong_floor": "none"},
         description="reward_overlong_penalty (functional.py:782-804, called at actor.py:153-164 with "
         "overlong_reward_penalty): min(-(L - (max_new_tokens - overlong_tokens)) / overlong_tokens * "
         "factor, 0) added to the reward, "
         "no floor at -factor"),
    *(Mode(f"KLEstimator/{k}", kind="kl_reward", framework_config={"actor.kl_estimator": k},
           convention={**({"kl_reward_estimator": k} if k != "k1" else {}), "kl_reward_value_clamp": 10.0},
           description=f"KLEstimator({k!r}) (data.py:1598-1655) as the actor's KL reward -kl_ctl * "
           "KLEstimator(old_logp, ref_logp) (actor.py:202): the estimate in float32, clamped to [-10, 10] "
           "(apply_clamp defaults to True); the sequence score on the row's last counted token")
      for k in ("k1", "k3")),
)
KIND_UNSUPPORTED = {
    "gae": {"PPOActor._compute_advantages": "GAE runs inside the actor on the whole prompt + response "
            "sequence (loss mask rolled by one, the KL reward and the sequence reward placed by it, the last "
            "position's advantage fixed to 0, values[:, -1] bootstrapped for rows as long as the padded "
            "batch, which it takes for rows without an EOS: finding eos_by_width; the task reward on "
            "position seqlens - 2 is lost when that position is not trainable, the GAE skipping masked "
            "positions: finding reward_last_trainable; mask_no_eos_with_zero replaces only the task reward "
            "by 0, after reward_norm, and the row stays in the loss: finding mask_no_eos_reward_only; "
            "discount and gae_lambda outside [0, 1], reward_clip <= 0 and reward_scaling <= 0 are "
            "accepted: findings config:discount, config:reward_clip, config:reward_scaling); its inputs are "
            "not per-token rewards, so the kit's GAE cases cannot be expressed."},
    "value_loss": {"PPOCritic's mask_no_eos_with_zero": "the critic's own setting is only logged "
                   "(critic.py:49-53): its targets are the actor's returns (finding "
                   "config:critic_mask_no_eos); a negative eps_clip is accepted and pins the clipped "
                   "value at old_value - |eps| (finding config:critic_eps_clip)."},
    "overlong": {"the actor's budget": "the mode passes max_response_length itself; the trainer passes "
                 "actor.max_new_tokens (actor.py:163), never compared with gconfig.max_new_tokens "
                 "(finding config:max_new_tokens); a negative overlong_penalty_factor inverts the "
                 "penalty (finding config:overlong_penalty_factor)."},
    "whitening": {"adv_norm with mean_level / std_level 'batch'": "the batch level of Normalization "
                  "(the group level is driven as group_advantages); the all-reduce over ranks. A mask "
                  "without a token returns the input unnormalised (finding adv_all_masked)."},
    "kl_reward": {"the actor's layout": "the actor rolls the loss mask by one position and puts the score at "
                  "seqlens - 2 (actor.py:175-212); the KL reward mode runs KLEstimator and lays the reward "
                  "out as the kind does. Without a reference model the actor takes the KL against zeros "
                  "(finding kl_reward_no_reference); a negative kl_ctl rewards divergence and drops the "
                  "reference model (finding config:kl_ctl)."},
}


def kind_target(mode: Mode, functional) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` running functional.py's ``ppo_critic_loss_fn`` (float32, as AReaL asserts),
    ``ppo_actor_loss_fn`` with the decoupled loss (one micro-batch: the engine's weight is 1),
    ``masked_normalization`` (one rank: no all-reduce) or data.py's ``KLEstimator``."""
    import torch

    if mode.kind == "kl_reward":
        estimator = data_classes().KLEstimator(mode.framework_config["actor.kl_estimator"])

        def kl_reward(fn, scores, logp, ref_logp, mask, *, kl_coef):
            rewards = -kl_coef * fn(logp, ref_logp) * mask  # actor.py:202 (kl_ctl), on the counted tokens
            last = mask.sum(-1).long() - 1
            rows = torch.nonzero(last >= 0).squeeze(-1)
            rewards[rows, last[rows]] += scores[rows].to(rewards.dtype)
            return rewards

        return estimator, kl_reward

    if mode.kind == "overlong":
        factor = mode.framework_config["actor.overlong_penalty_factor"]

        def penalty(fn, lengths, *, max_len, cache_len):
            n = lengths.shape[0]
            width = max(int(lengths.max()), 1) if n else 1
            mask = (torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]).float()
            data = {"rewards": mask.new_zeros(n), "loss_mask": mask,
                    "input_ids": lengths.new_zeros((n, width), dtype=torch.long)}
            return fn(data, overlong_tokens=cache_len, overlong_penalty_factor=factor,
                      max_response_length=max_len)["rewards"]

        return functional.reward_overlong_penalty, penalty

    if mode.kind == "whitening":
        def whiten(fn, advantages, mask):
            return fn(advantages, mask, all_reduce=False, **mode.framework_config)

        return functional.masked_normalization, whiten

    if mode.kind == "behavior_correction":
        rs = mode.framework_config["actor.rejection_sampling"]
        config = None if rs is None else types.SimpleNamespace(lower=None, agg="mean", **rs)

        def decoupled(fn, logp, prox_logp, behave_logp, advantages, mask, *, eps):
            per_token = advantages.unsqueeze(-1).expand_as(logp)  # AReaL's advantages are per token
            return fn(logprobs=logp, proximal_logprobs=prox_logp, old_logprobs=behave_logp,
                      advantages=per_token, eps_clip=eps, loss_mask=mask.bool(), rejection_sampling=config)[0]

        return functional.ppo_actor_loss_fn, decoupled

    def value(fn, values, old_values, returns, mask, *, clip):
        loss, _stat = fn(value=values.to(torch.float32), old_value=old_values.to(torch.float32),
                         target_value=returns.to(torch.float32), value_eps_clip=clip, loss_mask=mask.bool(),
                         loss_fn_type=mode.framework_config["loss_fn_type"])
        return loss

    return functional.ppo_critic_loss_fn, value

"""The OpenRLHF driver's modes of the registry's kinds (refimpl/conformance/kinds/): GAE, the value
loss and the batch whitening of advantages, each OpenRLHF's own code called as its trainer calls it.

* gae: ``RemoteExperienceMaker.get_advantages_and_returns(values, rewards, action_mask, gamma, lambd)``
  (trainer/ppo_utils/experience_maker.py:343). The module imports ray and the trainer's actors, so
  the method's own ``def`` is executed from the installed file (``sources.function_from_source``); it
  does not use ``self``.
* value_loss: ``models.loss.ValueLoss(clip_eps, token_level_loss)`` (loss.py:262), one micro-batch
  with the optimizer step's normalisers as the critic's ``training_step`` receives them
  (``iter_grad_accum_global_norm`` -> ``_optimizer_step_loss_norm``, one accumulation step; before
  0.10.4, ``get_loss_batch_info``). The trainer builds ``ValueLoss(value_clip)``, token level
  (trainer/ray/ppo_critic.py:60); ``token_level_loss=False`` is the class's other option.
* behavior_correction: ``PolicyLoss`` with ``is_correction_level='token'`` and ``rollout_log_probs``
  (loss.py:215-241): the train/rollout importance weight on the ppo loss.
* kl_reward: ``models.utils.compute_approx_kl`` then ``compute_reward`` (utils.py:69, 131), as
  ``make_experience`` and ``compute_advantages_and_returns`` call them (experience_maker.py:206, 284).
* overlong: ``apply_overlong_penalty(experiences, max_new_tokens, overlong_buffer_len,
  overlong_penalty_factor)`` (trainer/ppo_utils/length_penalty.py:16, its ``def`` executed from the
  installed file), DAPO's penalty added to each experience's reward, with the kit's ``max_len`` as
  ``max_new_tokens``: what ``apply_length_penalties`` passes when --rollout.max_new_tokens is set. When it
  is not (the default), line 127 passes --data.max_len, the prompt + response limit (finding
  overlong_max_len), which no case of the kind can show: the kind's ``max_len`` is the response limit.
* whitening: the batch normalisation of ``compute_advantages_and_returns``
  (experience_maker.py:324-338, inline), run through the method itself with estimator "gae",
  ``gamma = 0`` and zero rewards, so that the advantages it whitens are ``-values * mask``: the
  kit's advantages on the counted tokens, 0 on padding (experience_maker.py:376-378 masks them). The
  length penalties it calls first (off with these arguments) are not loaded.
"""

from __future__ import annotations

import functools
import types

from .. import Mode
from ..sources import function_from_source, package_dir
from . import adapters
from .adapters import _modules

__all__ = ["KIND_MODES", "KIND_UNSUPPORTED", "kind_target", "KIND_SOURCES", "advantage_target", "target"]

KIND_SOURCES = ("trainer/ppo_utils/experience_maker.py", "trainer/ppo_utils/length_penalty.py")

KIND_MODES = (
    Mode("gae", kind="gae", framework_config={"advantage_estimator": "gae"},
         convention={"gae_truncation": "terminate", "gae_padding_nonfinite": "propagate"},
         description="get_advantages_and_returns: values and rewards multiplied by the mask, "
         "values[:, t + 1] "
         "bootstrapped (0 after the last token)"),
    Mode("value_loss/token", kind="value_loss", framework_config={"token_level_loss": True},
         convention={"value_scale": 0.5, "value_empty_step": "nan_gradient",
                     "value_masked_nonfinite": "propagate"},
         description="ValueLoss(clip_eps, token_level_loss=True): 0.5 * token mean of max(...)"),
    Mode("value_loss/sequence", kind="value_loss", framework_config={"token_level_loss": False},
         convention={"value_scale": 0.5, "value_aggregation": "seq_mean_token_mean",
                     "value_empty_step": "nan_gradient",
                     "value_masked_nonfinite": "propagate"},
         description="ValueLoss(clip_eps, token_level_loss=False): 0.5 * mean of the rows' token means "
         "(the class's option; the critic's trainer builds ValueLoss(value_clip), token level)"),
    Mode("advantage_whitening", kind="whitening", framework_config={"advantage_estimator": "gae"},
         convention={"whiten_eps": 1e-8, "whiten_eps_placement": "floor",
                     "whiten_masked_nonfinite": "propagate"},
         description="compute_advantages_and_returns: masked mean and population variance in float32, "
         "var.clamp(min=1e-8).rsqrt()"),
)
KIND_MODES += tuple(
    Mode(f"compute_reward/{k}", kind="kl_reward", framework_config={"algo.kl.estimator": k},
         convention={**({"kl_reward_estimator": k} if k != "k1" else {}), "kl_reward_value_clamp": 10.0},
         description=f"compute_approx_kl(kl_estimator={k!r}) (utils.py:69, the value clamped to +-10 at line "
         "113) then compute_reward (utils.py:131): the score on the last action token"
         + (" (the default estimator)" if k == "k1" else ""))
    for k in ("k1", "k3")
)
KIND_MODES += tuple(
    Mode(f"is_correction/token/{action}", kind="behavior_correction",
         framework_config={"algo.advantage.is_correction_level": "token",
                           "algo.advantage.is_correction_mode": action,
                           "algo.advantage.is_correction_threshold": (0.5, 5.0)},
         convention={"behavior_cap": cap, "behavior_cap_value": 5.0, "behavior_cap_low": 0.5},
         description=f"PolicyLoss with is_correction_level='token', is_correction_mode={action!r} and the "
         "default threshold [0.5, 5] (loss.py:215-241): the weight pi_old / pi_rollout "
         + ("clamped into [0.5, 5]: a weight below 0.5 is raised to 0.5" if action == "clip"
            else "kept inside [0.5, 5], the token dropped outside"))
    for action, cap in (("clip", "truncate"), ("mask", "mask"))
)
KIND_MODES += (
    Mode("overlong_penalty", kind="overlong",
         framework_config={"reward.overlong_buffer_len": "the case's cache_len",
                           "reward.overlong_penalty_factor": 1.0,
                           "rollout.max_new_tokens": "the case's max_len"},
         description="apply_overlong_penalty (length_penalty.py:16-58): -min(L - (max_new_tokens - "
         "buffer), buffer) / buffer * factor added to the reward, with --rollout.max_new_tokens set "
         "(unset, line 127 takes --data.max_len: finding overlong_max_len)"),
)
KIND_UNSUPPORTED: dict[str, dict[str, str]] = {
    "gae": {
        "multi-turn masks (observation tokens inside a response)": "the kit's GAE cases have one episode "
        "per row with a prefix mask; OpenRLHF runs the recursion through masked tokens (finding "
        "gae_interior_mask).",
        "scores beyond --reward.clip_range": "compute_reward clamps the score to the default (-10, 10) "
        "before the returns (models/utils.py:142), a documented default (finding reward_clip_default); the "
        "kind's cases give the per-token rewards directly.",
        "gamma or lambd outside [0, 1]": "accepted unchecked and used as given (finding config:gamma); the "
        "spec's discount and trace parameters lie in [0, 1], so no case states the expected value.",
    },
    "value_loss": {
        "--critic.value_clip default": "the trainer's ValueLoss(value_clip) clips with the default 0.5, "
        "which no command-line value turns off (finding value_clip_default); the kind's cases give the clip "
        "explicitly, with and without it.",
        "--critic.value_clip <= 0": "accepted unchecked; 0 stops the critic's gradient once V is nearer "
        "the return than V_old (finding config:value_clip); the spec's clip is > 0.",
        "the critic's logged values": "ppo_train's log (ppo_critic.py:179), not the loss: a mean of the "
        "micro-batches' token means (finding critic_logged_values, value only).",
    },
    "overlong": {
        "--rollout.max_new_tokens unset": "apply_length_penalties then passes --data.max_len, the prompt + "
        "response limit (length_penalty.py:127), which the kind's cases (max_len: the response limit) cannot "
        "express: shown by a script (finding overlong_max_len).",
        "multi-turn responses": "response_length spans the observation tokens between the turns "
        "(samples_generator.py:273; finding multiturn_response_length), and the agent executor ignores "
        "--rollout.max_new_tokens, the penalty's L_max (utils/agent.py:94; finding config:max_new_tokens); "
        "the kind's cases give the length and the limit.",
        "buffer <= 0 or a negative penalty factor": "accepted unchecked: no penalty, or a bonus (findings "
        "config:overlong_buffer_len, config:overlong_penalty_factor); shown by scripts.",
        "--reward.stop_properly_penalty_coef": "ProRL's truncation penalty is no spec variant; its "
        "multiplicative form raises a negative reward (finding config:stop_properly_penalty_coef).",
    },
}


@functools.cache
def _maker_method(name: str):
    import itertools
    import typing

    import torch

    path = package_dir("openrlhf") / KIND_SOURCES[0]
    utils = _modules()["utils"]
    names = {"List": "List", "Tuple": "Tuple"}  # the typing names the installed code annotates with
    namespace = {"torch": torch, "itertools": itertools, **{k: getattr(typing, v) for k, v in names.items()},
                 "compute_reward": utils.compute_reward, "masked_mean": utils.masked_mean,
                 "apply_length_penalties": lambda experiences, args: None,
                 "logger": types.SimpleNamespace(warning=lambda *a, **k: None, info=lambda *a, **k: None)}
    return function_from_source(path, f"RemoteExperienceMaker.{name}", namespace)


def _whiten(fn, x, mask):
    import torch

    gae = _maker_method("get_advantages_and_returns")
    ns = types.SimpleNamespace
    args = ns(rollout=ns(n_samples_per_prompt=1), reward=ns(clip_range=None),
              algo=ns(advantage=ns(estimator="gae", gamma=0.0, lambd=0.0, no_std_norm=False)))
    maker = ns(strategy=ns(args=args), kl_ctl=ns(value=0.0), advantage_estimator="gae",
               get_advantages_and_returns=lambda *a: gae(None, *a))
    n = x.shape[0]
    experience = ns(rewards=x.new_zeros(n), index=list(range(n)), kl=torch.zeros_like(x),
                    action_mask=mask, values=-x, info={})
    fn(maker, [experience])
    # the statistics are float32 (experience_maker.py:326, .float()): the result has float32 precision
    return experience.advantages.to(torch.float32)


def _correction_kwargs(policy_loss, keys: dict) -> dict:
    """``PolicyLoss``'s arguments for the token-level correction of ``keys``: from 0.11 on
    ``is_correction_level`` / ``_mode`` / ``_threshold``; before, ``enable_vllm_is_correction`` with
    ``vllm_is_correction_type`` "tis" (the weight clamped into the threshold: mode clip) or "icepop"
    (the token dropped outside it: mode mask) and ``vllm_is_truncated_threshold`` (0.10.4 loss.py:128-130,
    198-218)."""
    import inspect

    action = keys["algo.advantage.is_correction_mode"]
    threshold = keys["algo.advantage.is_correction_threshold"]
    if "is_correction_level" in inspect.signature(policy_loss).parameters:
        return {"is_correction_level": "token", "is_correction_mode": action,
                "is_correction_threshold": threshold}
    return {"enable_vllm_is_correction": True, "vllm_is_truncated_threshold": list(threshold),
            "vllm_is_correction_type": {"clip": "tis", "mask": "icepop"}[action]}


def kind_target(mode: Mode):
    """``(fn, adapter)`` running OpenRLHF's own code for a registry-kind mode."""
    if mode.kind == "gae":

        def gae(fn, rewards, values, mask, *, gamma, lam, truncated, final_values):
            return fn(None, values, rewards, mask.to(values.dtype), gamma, lam)

        return _maker_method("get_advantages_and_returns"), gae
    if mode.kind == "kl_reward":
        utils, estimator = _modules()["utils"], mode.framework_config["algo.kl.estimator"]

        def reward(fn, scores, logp, ref_logp, mask, *, kl_coef):  # experience_maker.py:206-210, 284-290
            kl = utils.compute_approx_kl(logp, ref_logp, kl_estimator=estimator)
            return fn(scores, kl_coef, kl, action_mask=mask, reward_clip_range=None)

        return utils.compute_reward, reward
    if mode.kind == "behavior_correction":
        keys = mode.framework_config

        def corrected(fn, logp, prox_logp, behave_logp, advantages, mask, *, eps):
            loss_fn = fn(clip_eps_low=eps, clip_eps_high=eps, **_correction_kwargs(fn, keys))
            per_token = advantages.unsqueeze(-1).expand_as(logp)
            return loss_fn(logp, prox_logp, per_token, action_mask=mask.to(logp.dtype),
                           rollout_log_probs=behave_logp)[0]

        return _modules()["loss"].PolicyLoss, corrected
    if mode.kind == "value_loss":
        import torch

        token_level, loss_utils = mode.framework_config["token_level_loss"], _modules()["loss_utils"]

        def value(fn, values, old_values, returns, mask, *, clip):
            action_mask = mask.to(values.dtype)
            if hasattr(loss_utils, "_optimizer_step_loss_norm"):  # ppo_critic.py's ppo_train, gas = 1
                info = loss_utils._optimizer_step_loss_norm([mask], None, 1, 1)
            else:  # OpenRLHF < 0.10.4: training_step's own get_loss_batch_info
                info = loss_utils.get_loss_batch_info(None, mask.to(torch.long))
            info = {k: v.to(values.device) if hasattr(v, "to") else v for k, v in info.items()}
            return fn(clip_eps=clip, token_level_loss=token_level)(values, old_values, returns,
                                                                   action_mask=action_mask, **info)

        return _modules()["loss"].ValueLoss, value
    if mode.kind == "overlong":
        return _overlong_target(mode)
    return _maker_method("compute_advantages_and_returns"), _whiten


def _overlong_target(mode: Mode):
    import torch

    path = package_dir("openrlhf") / KIND_SOURCES[1]
    fn = function_from_source(path, "apply_overlong_penalty", {"List": list})
    factor = mode.framework_config["reward.overlong_penalty_factor"]

    def penalty(fn, lengths, *, max_len, cache_len):
        experience = types.SimpleNamespace(response_length=lengths,
                                           rewards=torch.zeros(lengths.shape, dtype=torch.float32,
                                                               device=lengths.device))
        fn([experience], max_new_tokens=max_len, overlong_buffer_len=cache_len,
           overlong_penalty_factor=factor)
        return experience.rewards

    return fn, penalty


# ----------------------------------------------------------------------------------------------
# Group advantages (kind "group_advantages"; the modes: advantages.py)


def _blocks(group_ids) -> int | None:
    """The group size when ``group_ids`` are contiguous groups of one size, else None."""
    ids = group_ids.tolist()
    starts = [i for i in range(len(ids)) if i == 0 or ids[i] != ids[i - 1]]
    sizes = {b - a for a, b in zip(starts, starts[1:] + [len(ids)], strict=True)}
    return sizes.pop() if len(sizes) == 1 and len(set(ids)) == len(starts) else None


def advantage_target(mode: Mode):
    """``(fn, adapter)``: ``fn`` is ``compute_advantages_and_returns`` (executed from the installed file)
    and ``adapter(fn, rewards, group_ids)`` the advantages ``[N]`` (advantages.py's docstring)."""
    import torch

    estimator = mode.framework_config["algo.advantage.estimator"]
    returns = _maker_method("get_cumulative_returns")
    ns = types.SimpleNamespace

    def run(fn, rewards, size: int):
        if size < 2:
            raise ValueError(f"{estimator} requires n_samples_per_prompt > 1 (cli/train_ppo_ray.py:659), "
                             "got a group of 1")
        args = ns(rollout=ns(n_samples_per_prompt=size), reward=ns(clip_range=(-10.0, 10.0)),
                  algo=ns(advantage=ns(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False)))
        maker = ns(strategy=ns(args=args), kl_ctl=ns(value=0.0), advantage_estimator=estimator,
                   get_cumulative_returns=lambda *a: returns(None, *a))
        n = rewards.shape[0]
        one = torch.ones((n, 1), dtype=rewards.dtype, device=rewards.device)  # one action token each
        experience = ns(rewards=rewards, index=list(range(n)), kl=torch.zeros_like(one),
                        action_mask=one, info={})
        fn(maker, [experience])
        return experience.advantages[:, 0]

    def adapter(fn, rewards, group_ids):
        size = _blocks(group_ids)
        if size is not None:
            return run(fn, rewards, size)
        out = torch.empty_like(rewards)
        for g in torch.unique(group_ids):  # groups one reshape cannot take: one call per group
            rows = group_ids == g
            out[rows] = run(fn, rewards[rows], int(rows.sum()))
        return out

    return _maker_method("compute_advantages_and_returns"), adapter


def target(kind: str, mode, variant=None):
    """``adapters.target`` (policy_loss, kl), and the group advantages: ``fn`` is
    ``compute_advantages_and_returns``, ``adapter(fn, rewards, group_ids)`` the advantages ``[N]``."""
    if kind == "group_advantages":
        from .modes import _mode

        return advantage_target(_mode(kind, mode))
    return adapters.target(kind, mode, variant)

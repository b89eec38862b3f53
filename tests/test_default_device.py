"""Results follow the inputs' device, never torch's default device (docs/architecture.md: ``refimpl`` is
device-agnostic).

Every public function of ``refimpl.estimators``, ``refimpl.advantages``, ``refimpl.kl``,
``refimpl.trust_region`` and ``refimpl.losses`` runs on small CPU inputs twice: normally, and inside
``with torch.device("meta")``, under which every allocation that names no device goes to the meta
device, as every such allocation goes to the GPU after ``torch.set_default_device("cuda")``. A
tensor allocated there and mixed with the CPU inputs raises ("... is not on the expected device"),
or comes back on meta. Both runs must give CPU results (and gradients, for the differentiable
functions) that are bitwise equal (``torch.equal``): the same computation on the same thread.

``test_every_public_computing_export_has_a_case`` fails when a function or class is exported
without a case here (constants, presets and result containers are exempt by kind; any other
exemption is listed with its reason).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

import refimpl.advantages
import refimpl.estimators
import refimpl.kl
import refimpl.losses
import refimpl.trust_region
from refimpl.advantages import (
    dynamic_sampling_mask,
    dynamic_sampling_weights,
    group_advantages,
    overlong_filter_mask,
    overlong_penalty,
    oversampled_advantages,
)
from refimpl.estimators import (
    discounted_returns,
    gae_advantages,
    importance_weights,
    is_estimate,
    lambda_returns,
    n_step_returns,
    per_decision_is,
    snis_estimate,
    td_errors,
    trajectory_importance_weights,
    trajectory_is,
)
from refimpl.kl import categorical_kl, kl_k1, kl_k2, kl_k3, kl_log_ratio
from refimpl.losses import (
    CISPO,
    DR_GRPO,
    GRPO,
    GSPO,
    GSPO_TOKEN,
    PPO,
    PRESETS,
    AdaptiveKLController,
    DualAscentKLController,
    bradley_terry_loss,
    dpo_loss,
    entropy_bonus_loss,
    fused_policy_loss,
    lm_head_logprobs,
    lm_head_policy_loss,
    loss_normalizer,
    policy_loss,
    ppo_combined_loss,
    reference_policy_loss,
    token_entropy,
    token_logprobs,
    upweighted_normalizer,
    value_loss,
)
from refimpl.trust_region import (
    conjugate_gradient,
    fisher_resolution,
    fisher_vector_product,
    fisher_vector_product_fn,
    mean_kl,
    natural_gradient_direction,
    natural_gradient_step,
    trpo_step,
    trust_region_step_scale,
)

MODULES = (refimpl.estimators, refimpl.advantages, refimpl.kl, refimpl.trust_region, refimpl.losses)
FLOATS = (torch.float32, torch.float64)
# Exports that compute something but take no tensor, so no default device can reach them.
EXEMPT = {
    "refimpl.losses.get_preset": "maps a name to a PolicyLossVariant (plain Python values, no tensors)",
}

# name -> (export it covers, dtypes, build). build(dtype) makes the CPU inputs and returns
# (call, grad_inputs): call() runs the function on them; grad_inputs are the leaves whose gradient
# (of the sum of every differentiable tensor result) is compared too.
Build = Callable[[torch.dtype], tuple[Callable[[], object], tuple[torch.Tensor, ...]]]
CASES: dict[str, tuple[str, tuple[torch.dtype, ...], Build]] = {}


def case(export: str, variant: str = "", *, dtypes: tuple[torch.dtype, ...] = FLOATS):
    """Register ``build`` as the case ``<function>[variant]`` covering ``export``."""
    def register(build: Build) -> Build:
        name = export.rsplit(".", 1)[1] + (f"[{variant}]" if variant else "")
        assert name not in CASES, name
        CASES[name] = (export, dtypes, build)
        return build
    return register


def _random(*shape: int, seed: int, dtype: torch.dtype, low: float = -1.0, high: float = 1.0,
            grad: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = (low + (high - low) * torch.rand(*shape, generator=g, dtype=torch.float64)).to(dtype)
    return x.requires_grad_(grad)


# ------------------------------------------------------------------------------------ estimators
N, T = 3, 5
# row 0 truncated at step 1 and ends mid-episode, row 1 terminated at step 2 and at its end, row 2
# runs to the end of the rollout without an episode end (bootstrapped there)
TERMINATED = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 1, 0, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
TRUNCATED = torch.tensor([[0, 1, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
STEPS = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)


def _returns_inputs(dtype, grad: bool = False):
    """rewards, values, next_values. (Returns computed by the backward recursion are not
    differentiable: its ``addcmul(out=...)`` refuses inputs that require grad.)"""
    return (_random(N, T, seed=1, dtype=dtype, grad=grad), _random(N, T, seed=2, dtype=dtype, grad=grad),
            _random(N, T, seed=3, dtype=dtype, grad=grad))


@case("refimpl.estimators.discounted_returns", "bootstrapped")
def _(dtype):
    rewards, _, next_values = _returns_inputs(dtype)
    return lambda: discounted_returns(rewards, TERMINATED, TRUNCATED, 0.9, next_values), ()


@case("refimpl.estimators.discounted_returns", "episodes, no next_values")
def _(dtype):
    rewards, _, _ = _returns_inputs(dtype)
    ended = torch.zeros(N, T, dtype=torch.bool)
    ended[:, -1] = True
    ended[0, 1] = True
    return lambda: discounted_returns(rewards, ended, torch.zeros_like(ended), 0.9), ()


@case("refimpl.estimators.n_step_returns")
def _(dtype):
    rewards, _, next_values = _returns_inputs(dtype, grad=True)
    # 0/1 integer flags go through their conversion to bool
    return (lambda: n_step_returns(rewards, next_values, TERMINATED.long(), TRUNCATED.long(), 0.9, 3),
            (rewards, next_values))


@case("refimpl.estimators.td_errors")
def _(dtype):
    rewards, values, next_values = _returns_inputs(dtype, grad=True)
    return lambda: td_errors(rewards, values, next_values, TERMINATED, 0.9), (rewards, values, next_values)


@case("refimpl.estimators.lambda_returns")
def _(dtype):
    rewards, _, next_values = _returns_inputs(dtype)
    return lambda: lambda_returns(rewards, next_values, TERMINATED, TRUNCATED, 0.9, 0.7), ()


@case("refimpl.estimators.gae_advantages")
def _(dtype):
    rewards, values, next_values = _returns_inputs(dtype)
    return lambda: gae_advantages(rewards, values, next_values, TERMINATED, TRUNCATED, 0.9, 0.7), ()


@case("refimpl.estimators.importance_weights")
def _(dtype):
    target, behavior = _random(N, T, seed=4, dtype=dtype, grad=True), _random(N, T, seed=5, dtype=dtype)
    return lambda: importance_weights(target, behavior), (target,)


def _samples(dtype):
    """f(x_i) and importance weights w_i > 0."""
    return (_random(N, T, seed=6, dtype=dtype, grad=True),
            _random(N, T, seed=7, dtype=dtype, low=0.1, high=2.0))


@case("refimpl.estimators.is_estimate")
def _(dtype):
    f, w = _samples(dtype)
    return lambda: is_estimate(f, w), (f,)


@case("refimpl.estimators.snis_estimate")
def _(dtype):
    f, w = _samples(dtype)
    return lambda: snis_estimate(f, w, dim=0), (f,)


def _episode_rows(dtype):
    return (_random(N, T, seed=8, dtype=dtype, grad=True), _random(N, T, seed=9, dtype=dtype, grad=True),
            _random(N, T, seed=10, dtype=dtype))


@case("refimpl.estimators.trajectory_importance_weights")
def _(dtype):
    _, target, behavior = _episode_rows(dtype)
    return lambda: trajectory_importance_weights(target, behavior, STEPS), (target,)


@case("refimpl.estimators.trajectory_is")
def _(dtype):
    rewards, target, behavior = _episode_rows(dtype)
    return lambda: trajectory_is(rewards, target, behavior, STEPS, 0.9), (rewards, target)


@case("refimpl.estimators.per_decision_is")
def _(dtype):
    rewards, target, behavior = _episode_rows(dtype)
    return lambda: per_decision_is(rewards, target, behavior, STEPS.double(), 0.9), (rewards, target)


# ------------------------------------------------------------------------------------ advantages
# groups of 3, 2 (constant rewards), 1 (a singleton) and 2, not contiguous
GROUP_IDS = torch.tensor([4, 7, 4, 9, 4, 7, 2, 9])
GROUP_REWARDS = [0.5, 1.0, -1.0, 2.0, 0.25, 1.0, 3.0, -0.5]
SCALINGS = {
    "none, leave-one-out": dict(scale="none", singleton="zero", leave_one_out=True),
    "none, raw singleton": dict(scale="none", singleton="raw"),
    "group": dict(scale="group", singleton="zero", std="sample", eps=1e-6, eps_inside_sqrt=False,
                  zero_variance="zero"),
    "group, raw singleton, formula": dict(scale="group", singleton="raw", std="population", eps=1e-4,
                                          eps_inside_sqrt=True, zero_variance="formula"),
    "batch": dict(scale="batch", singleton="zero", std="population", eps=1e-6, eps_inside_sqrt=True,
                  zero_variance="zero"),
    "batch_rewards": dict(scale="batch_rewards", singleton="zero", std="sample", eps=0.0,
                          eps_inside_sqrt=False, zero_variance="zero"),
}


def _group_advantages_case(convention):
    def build(dtype):
        rewards = torch.tensor(GROUP_REWARDS, dtype=dtype)
        return lambda: group_advantages(rewards, GROUP_IDS, **convention), ()
    return build


for _scaling, _convention in SCALINGS.items():
    case("refimpl.advantages.group_advantages", _scaling)(_group_advantages_case(_convention))


@case("refimpl.advantages.group_advantages", "empty")
def _(dtype):
    rewards = torch.zeros(0, dtype=dtype)
    return lambda: group_advantages(rewards, GROUP_IDS[:0], scale="none", singleton="zero"), ()


@case("refimpl.advantages.oversampled_advantages")
def _(dtype):
    rewards, selected = torch.tensor(GROUP_REWARDS, dtype=dtype), GROUP_IDS != 7
    return lambda: oversampled_advantages(rewards, GROUP_IDS, selected, **SCALINGS["group"]), ()


@case("refimpl.advantages.dynamic_sampling_mask")
def _(dtype):
    rewards = torch.tensor(GROUP_REWARDS, dtype=dtype)
    return lambda: (dynamic_sampling_mask(rewards, GROUP_IDS),
                    dynamic_sampling_mask(rewards[:0], GROUP_IDS[:0])), ()


@case("refimpl.advantages.dynamic_sampling_weights")
def _(dtype):
    rewards = torch.tensor(GROUP_REWARDS, dtype=dtype)
    constant = torch.ones(4, dtype=dtype)
    return lambda: (dynamic_sampling_weights(rewards, GROUP_IDS),
                    dynamic_sampling_weights(constant, GROUP_IDS[:4])), ()


@case("refimpl.advantages.overlong_penalty", dtypes=(torch.int64, torch.int32))
def _(dtype):
    lengths = torch.tensor([0, 3, 5, 6, 9], dtype=dtype)
    return lambda: overlong_penalty(lengths, 6, 2), ()


@case("refimpl.advantages.overlong_filter_mask")
def _(dtype):
    truncated = torch.tensor([True, False, True])
    return lambda: (overlong_filter_mask(STEPS.to(dtype), truncated),
                    overlong_filter_mask(STEPS, truncated)), ()


# ------------------------------------------------------------------------------------ kl
def _kl_inputs(dtype):
    # log r = ref - logp spans the Taylor branch of k3 (|log r| < 1e-2) and expm1's
    logp = _random(N, T, seed=11, dtype=dtype, grad=True)
    ref = (logp.detach() + _random(N, T, seed=12, dtype=dtype, low=-0.02, high=0.02)
           * torch.tensor([1.0, 10.0, 100.0], dtype=dtype)[:, None]).requires_grad_(True)
    return logp, ref


for _estimator in (kl_log_ratio, kl_k1, kl_k2, kl_k3):
    def _build(dtype, estimator=_estimator):
        logp, ref = _kl_inputs(dtype)
        return lambda: estimator(logp, ref), (logp, ref)
    case(f"refimpl.kl.{_estimator.__name__}")(_build)


@case("refimpl.kl.categorical_kl")
def _(dtype):
    logits_p = _random(N, T, seed=13, dtype=dtype, low=-2.0, high=2.0)
    logits_p[0, 1] = -math.inf  # a zero-probability entry of p (masked vocabulary)
    logits_q = _random(N, T, seed=14, dtype=dtype, low=-2.0, high=2.0, grad=True)
    logits_p.requires_grad_(True)
    return lambda: categorical_kl(logits_p, logits_q), (logits_p, logits_q)


# ------------------------------------------------------------------------------------ trust region
def _log_softmax(theta: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(theta, dim=-1)


def _tabular(dtype):
    """A softmax policy over 3 states x 2 actions, state weights and Q values centred in each state
    (so, as a gradient, in the range of the softmax Fisher matrix: CG converges)."""
    params = _random(3, 2, seed=15, dtype=dtype, low=-0.5, high=0.5)
    weights = torch.tensor([0.5, 0.3, 0.2], dtype=dtype)
    q = _random(3, 2, seed=16, dtype=dtype, low=-1.0, high=1.0)
    return params, weights, q - q.mean(dim=-1, keepdim=True)


@case("refimpl.trust_region.conjugate_gradient")
def _(dtype):
    a = _random(3, 3, seed=17, dtype=dtype)
    matrix = a @ a.T + torch.eye(3, dtype=dtype)
    b = _random(3, seed=18, dtype=dtype)
    return lambda: (conjugate_gradient(lambda v: matrix @ v, b, 10),
                    conjugate_gradient(lambda v: matrix @ v, torch.zeros_like(b), 10)), ()


@case("refimpl.trust_region.mean_kl")
def _(dtype):
    params, weights, _ = _tabular(dtype)
    # a shift per action (a constant one leaves the softmax unchanged: the exact KL 0, the result
    # rounding noise, which a device's tolerance cannot be relative to)
    old = _log_softmax(params + _random(3, 2, seed=20, dtype=dtype, low=-0.3, high=0.3))
    params.requires_grad_(True)
    return lambda: mean_kl(_log_softmax, old, params, weights), (params,)


@case("refimpl.trust_region.fisher_vector_product_fn")
def _(dtype):
    params, weights, q = _tabular(dtype)
    return lambda: fisher_vector_product_fn(_log_softmax, params, weights, damping=0.1)(q), ()


@case("refimpl.trust_region.fisher_vector_product")
def _(dtype):
    params, weights, q = _tabular(dtype)
    return lambda: fisher_vector_product(_log_softmax, params, q, weights), ()


@case("refimpl.trust_region.trust_region_step_scale")
def _(dtype):
    direction, fisher_direction = _random(3, 2, seed=19, dtype=dtype), _random(3, 2, seed=19, dtype=dtype)
    return lambda: trust_region_step_scale(direction, 2.0 * fisher_direction, 0.01), ()


@case("refimpl.trust_region.fisher_resolution")
def _(dtype):
    params, weights, _ = _tabular(dtype)
    return lambda: fisher_resolution(_log_softmax, params, weights, damping=1e-3), ()


@case("refimpl.trust_region.natural_gradient_direction")
def _(dtype):
    params, weights, q = _tabular(dtype)
    return lambda: natural_gradient_direction(_log_softmax, params, q, weights, cg_iters=10), ()


@case("refimpl.trust_region.natural_gradient_step")
def _(dtype):
    params, weights, q = _tabular(dtype)
    return lambda: natural_gradient_step(_log_softmax, params, q, weights, 0.5, cg_iters=10), ()


@case("refimpl.trust_region.trpo_step")
def _(dtype):
    params, weights, q = _tabular(dtype)
    old_probs = _log_softmax(params).exp()

    def surrogate(theta):  # sum_s w_s sum_a pi_theta(a|s) Q(s, a) (importance-weighted, Schulman et al. 2015,
    # section 5)
        return (weights[:, None] * old_probs * torch.exp(_log_softmax(theta) - old_probs.log()) * q).sum()

    # max_kl 1e-3 backtracks once, 2.0 accepts the full step; a constant surrogate has a zero gradient
    return lambda: (trpo_step(surrogate, _log_softmax, params, weights, 1e-3),
                    trpo_step(surrogate, _log_softmax, params, weights, 2.0),
                    trpo_step(lambda theta: 0.0 * theta.sum(), _log_softmax, params, weights, 1e-3)), ()


# ------------------------------------------------------------------------------------ policy loss
def _policy_batch(dtype, n: int = 4, t: int = 5):
    """Token log-probs with ratios in [e^-0.5, e^0.5] (so every clip range cuts some), advantages of
    both signs and a zero, a mask with a short row and an all-masked row."""
    logp = _random(n, t, seed=20, dtype=dtype, low=-3.0, high=-0.1, grad=True)
    old = (logp.detach() + _random(n, t, seed=21, dtype=dtype, low=-0.5, high=0.5)).clamp(max=-0.01)
    adv = torch.tensor([1.0, -0.5, 0.0, 2.0], dtype=dtype)[:n]
    mask = torch.ones(n, t, dtype=torch.bool)
    mask[1:2, 3:] = False
    mask[2:3] = False
    return logp, old, adv, mask


def _policy_case(variant, *, extras=(), token_advantages=False, float_mask=False, normalizer=None,
                 tensor_normalizer=None, n=4, loss=policy_loss):
    def build(dtype):
        logp, old, adv, mask = _policy_batch(dtype, n=n)
        if token_advantages:
            adv = _random(*logp.shape, seed=22, dtype=dtype)
        kwargs, grads = {}, [logp]
        for name in extras:
            if name == "ref_logp":
                kwargs[name] = old + _random(*logp.shape, seed=23, dtype=dtype, low=-0.3, high=0.3)
            elif name == "behavior_logp":  # weights exp(old - behavior) in [e^-1, e^1], some above cap 2
                kwargs[name] = old + _random(*logp.shape, seed=24, dtype=dtype)
            else:  # entropy, kl: differentiable inputs
                kwargs[name] = _random(*logp.shape, seed=25, dtype=dtype, low=0.0, high=2.0, grad=True)
                grads.append(kwargs[name])
        if normalizer is not None:
            kwargs["normalizer"] = normalizer
        if tensor_normalizer is not None:
            kwargs["normalizer"] = torch.tensor(tensor_normalizer, dtype=dtype)
        m = mask.to(dtype) if float_mask else mask
        return lambda: loss(logp, old, adv, m, variant, **kwargs), tuple(grads)
    return build


POLICY_CASES = {
    **{f"preset {name}": (replace(v, max_length=7) if v is DR_GRPO else v, {})
       for name, v in PRESETS.items()},
    "dual clip": (replace(PPO, dual_clip=1.5), {}),
    "clip without eps_high": (replace(PPO, eps_high=None), {}),
    "clip without eps_low": (replace(GRPO, eps_low=None), {}),
    "log_clip token": (replace(PPO, gate="log_clip"), {}),
    "log_clip token, one-sided": (replace(PPO, gate="log_clip", eps_low=None), {}),
    "log_clip sequence_mean": (replace(GSPO, gate="log_clip", eps_low=0.1, eps_high=0.1), {}),
    "log_clip sequence_product": (replace(GSPO, ratio="sequence_product", gate="log_clip"), {}),
    "gate none": (replace(PPO, gate="none"), {}),
    "gate none, sequence_product, token_mean": (
        replace(PPO, ratio="sequence_product", gate="none", aggregation="token_mean"), {}),
    "gspo seq_sum": (replace(GSPO, aggregation="seq_sum", max_length=6), {}),
    "cispo both bounds": (replace(CISPO, eps_low=0.2), {}),
    "sapo gspo_token": (replace(GSPO_TOKEN, gate="sapo"), {}),
    "seq_sqrt_token_mean": (replace(GRPO, aggregation="seq_sqrt_token_mean", group_size=3), {}),
    "behavior truncate": (replace(PPO, behavior_correction="truncate"), {"extras": ("behavior_logp",)}),
    "behavior mask, sequence_mean": (replace(GSPO, behavior_correction="mask"),
                                     {"extras": ("behavior_logp",)}),
    **{f"kl {k}, entropy": (replace(GRPO, kl_coef=0.1, kl_estimator=k, entropy_coef=0.01),
                            {"extras": ("ref_logp", "entropy")}) for k in ("k1", "k2", "k3")},
    "kl sequence, token_mean": (replace(PPO, kl_coef=0.1, kl_scale="sequence"), {"extras": ("ref_logp",)}),
    "kl sequence, seq_sum": (replace(DR_GRPO, max_length=7, kl_coef=0.1, kl_scale="sequence"),
                             {"extras": ("ref_logp",)}),
    "exact kl": (replace(DR_GRPO, max_length=7, kl_coef=0.1), {"extras": ("kl",)}),
    "token advantages": (PPO, {"token_advantages": True}),
    "float mask": (GRPO, {"float_mask": True}),
    "tensor normalizer": (GRPO, {"tensor_normalizer": 5.0}),
    "float normalizer": (PPO, {"normalizer": 11.0}),
    "empty batch": (PPO, {"n": 0}),
}
for _name, (_variant, _options) in POLICY_CASES.items():
    case("refimpl.losses.policy_loss", _name)(_policy_case(_variant, **_options))
    case("refimpl.losses.reference_policy_loss", _name)(
        _policy_case(_variant, loss=reference_policy_loss, **_options))
    # the fast path's formulas op by op on every case (compiled: tests/test_policy_loss_fast.py, and on
    # CUDA tests/test_cuda.py; each compiled graph costs seconds)
    case("refimpl.losses.fused_policy_loss", _name)(
        _policy_case(_variant, loss=functools.partial(fused_policy_loss, compile=False), **_options))


@case("refimpl.losses.loss_normalizer")
def _(dtype):
    mask = STEPS.to(dtype)
    variants = [PPO, GRPO, replace(DR_GRPO, max_length=7), GSPO,
                replace(GRPO, aggregation="seq_sqrt_token_mean", group_size=2)]
    return lambda: [loss_normalizer(mask, v) for v in variants], ()


@case("refimpl.losses.upweighted_normalizer")
def _(dtype):
    mask, keep, none = STEPS.to(dtype), torch.tensor([True, False, True]), torch.zeros(3, dtype=torch.bool)
    return lambda: (upweighted_normalizer(mask, PPO, keep), upweighted_normalizer(mask, GRPO, keep),
                    upweighted_normalizer(mask, PPO, none)), ()


# ------------------------------------------------------------------------------------ value, entropy
def _value_inputs(dtype):
    values = _random(N, T, seed=26, dtype=dtype, grad=True)
    returns = _random(N, T, seed=27, dtype=dtype)
    old_values = values.detach() + _random(N, T, seed=28, dtype=dtype, low=-0.4, high=0.4)
    return values, returns, old_values


@case("refimpl.losses.value_loss", "plain")
def _(dtype):
    values, returns, _ = _value_inputs(dtype)
    return lambda: value_loss(values, returns, STEPS), (values,)


@case("refimpl.losses.value_loss", "clipped, normalizer")
def _(dtype):
    values, returns, old_values = _value_inputs(dtype)
    normalizer = torch.tensor(20.0, dtype=dtype)
    return (lambda: value_loss(values, returns, STEPS.to(dtype), old_values=old_values, clip_eps=0.2,
                               normalizer=normalizer), (values,))


@case("refimpl.losses.entropy_bonus_loss")
def _(dtype):
    entropy = _random(N, T, seed=29, dtype=dtype, low=0.0, high=2.0, grad=True)
    return (lambda: (entropy_bonus_loss(entropy, STEPS), entropy_bonus_loss(entropy, STEPS, normalizer=20)),
            (entropy,))


@case("refimpl.losses.ppo_combined_loss")
def _(dtype):
    logp, old, adv, mask = _policy_batch(dtype)
    values = _random(*logp.shape, seed=30, dtype=dtype, grad=True)
    returns = _random(*logp.shape, seed=31, dtype=dtype)
    entropy = _random(*logp.shape, seed=32, dtype=dtype, low=0.0, high=2.0, grad=True)
    return (lambda: ppo_combined_loss(logp, old, adv, values, returns, entropy, mask, value_coef=0.5,
                                      entropy_coef=0.01, old_values=returns.flip(0), value_clip_eps=0.2),
            (logp, values, entropy))


# ------------------------------------------------------------------------------------ KL controllers
@case("refimpl.losses.AdaptiveKLController")
def _(dtype):
    measured = [torch.tensor(kl, dtype=dtype) for kl in (0.1, 0.001, 0.01, 0.02)]
    beta, target = torch.tensor(0.2, dtype=dtype), torch.tensor(0.01, dtype=dtype)

    def run():
        controller = AdaptiveKLController(beta, target)
        return [controller.update(kl) for kl in measured]
    return run, ()


@case("refimpl.losses.DualAscentKLController")
def _(dtype):
    measured = [torch.tensor(kl, dtype=dtype) for kl in (0.1, 0.001, 0.0, 0.02)]
    coef, lr = torch.tensor(0.1, dtype=dtype), torch.tensor(2.0, dtype=dtype)

    def run():
        controller = DualAscentKLController(coef, 0.01, lr)
        return [controller.update(kl) for kl in measured]
    return run, ()


# ------------------------------------------------------------------------------------ logprobs, dpo
def _logits(dtype):
    logits = _random(N, T, 6, seed=33, dtype=dtype, low=-3.0, high=3.0)
    logits[0, 0, 2] = -math.inf  # a zero-probability token
    return logits.requires_grad_(True)


@case("refimpl.losses.token_logprobs")
def _(dtype):
    logits = _logits(dtype)
    tokens = torch.randint(0, 6, (N, T), generator=torch.Generator().manual_seed(34))
    tokens[0, 0] = 1
    # chunks of two rows: several chunks and a short last one
    return lambda: token_logprobs(logits, tokens.int(), chunk_elements=12), (logits,)


@case("refimpl.losses.lm_head_logprobs")
def _(dtype):
    hidden = _random(N, T, 4, seed=39, dtype=dtype, grad=True)
    weight = _random(6, 4, seed=40, dtype=dtype, low=-2.0, high=2.0, grad=True)
    tokens = torch.randint(0, 6, (N, T), generator=torch.Generator().manual_seed(41))
    # chunks of three tokens: several chunks and a short last one
    return lambda: lm_head_logprobs(hidden, weight, tokens, chunk_rows=3), (hidden, weight)


def _lm_head_loss_case(variant, chunk_rows: int):
    def build(dtype):
        hidden = _random(N, T, 4, seed=42, dtype=dtype, grad=True)
        weight = _random(6, 4, seed=43, dtype=dtype, low=-2.0, high=2.0, grad=True)
        tokens = torch.randint(0, 6, (N, T), generator=torch.Generator().manual_seed(44))
        old = _random(N, T, seed=45, dtype=dtype, low=-3.0, high=-1.0)
        ref = _random(N, T, seed=46, dtype=dtype, low=-3.0, high=-1.0)
        adv = torch.tensor([1.0, -0.5, 0.0], dtype=dtype)
        mask = torch.ones(N, T, dtype=torch.bool)
        mask[1, 3:] = False
        return (lambda: lm_head_policy_loss(hidden, weight, tokens, old, adv, mask, variant, ref_logp=ref,
                                            chunk_rows=chunk_rows), (hidden, weight))
    return build


# the fused path: chunks of three tokens (cutting rows), and of two whole rows for a sequence ratio
case("refimpl.losses.lm_head_policy_loss", "grpo")(_lm_head_loss_case(replace(GRPO, kl_coef=0.1), 3))
case("refimpl.losses.lm_head_policy_loss", "gspo")(_lm_head_loss_case(replace(GSPO, kl_coef=0.1), 10))


@case("refimpl.losses.token_entropy")
def _(dtype):
    logits = _logits(dtype)
    return lambda: token_entropy(logits, chunk_elements=12), (logits,)


@case("refimpl.losses.dpo_loss")
def _(dtype):
    chosen = _random(4, seed=35, dtype=dtype, grad=True)
    rejected = _random(4, seed=36, dtype=dtype, grad=True)
    ref_chosen, ref_rejected = _random(4, seed=37, dtype=dtype), _random(4, seed=38, dtype=dtype)
    weights = torch.tensor([1.0, 0.5, 0.0, 2.0], dtype=dtype)
    return (lambda: (dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.1),
                     dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.1, weights=weights)),
            (chosen, rejected))


@case("refimpl.losses.bradley_terry_loss")
def _(dtype):
    chosen = _random(4, seed=39, dtype=dtype, grad=True)
    rejected = _random(4, seed=40, dtype=dtype, grad=True)
    empty, weights = torch.zeros(0, dtype=dtype), torch.ones(4, dtype=dtype)
    return (lambda: (bradley_terry_loss(chosen, rejected), bradley_terry_loss(empty, empty),
                     bradley_terry_loss(chosen, rejected, weights=weights)),
            (chosen, rejected))


# ------------------------------------------------------------------------------------ the checks
def _leaves(obj: object, path: str = "result"):
    """(path, leaf) of every tensor and Python scalar in a result: tuples (named or not), lists,
    dicts and dataclasses are walked."""
    if isinstance(obj, torch.Tensor) or obj is None or isinstance(obj, (bool, int, float, str)):
        yield path, obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        for name in obj._fields:
            yield from _leaves(getattr(obj, name), f"{path}.{name}")
    elif isinstance(obj, (tuple, list)):
        for i, x in enumerate(obj):
            yield from _leaves(x, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for key, x in obj.items():
            yield from _leaves(x, f"{path}[{key!r}]")
    else:
        raise TypeError(f"{path}: cannot compare a {type(obj).__name__}")


def _run(call: Callable[[], object], grad_inputs: tuple[torch.Tensor, ...]) -> dict[str, object]:
    """The result's leaves and, for grad_inputs, the gradient of the sum of its differentiable tensors."""
    result = dict(_leaves(call()))
    if grad_inputs:
        differentiable = [x for x in result.values() if isinstance(x, torch.Tensor) and x.requires_grad]
        assert differentiable, "a case with grad_inputs must return a differentiable tensor"
        total = sum(x.sum() for x in differentiable)
        grads = torch.autograd.grad(total, grad_inputs, allow_unused=True)
        result.update({f"grad[{i}]": g for i, g in enumerate(grads)})
    return result


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


PARAMS = [pytest.param(name, dtype, id=f"{name}-{str(dtype).removeprefix('torch.')}")
          for name, (_, dtypes, _) in CASES.items() for dtype in dtypes]


@pytest.mark.parametrize(("name", "dtype"), PARAMS)
def test_results_stay_on_the_inputs_device_under_another_default_device(name, dtype):
    _, _, build = CASES[name]
    call, grad_inputs = build(dtype)
    expected = _run(call, grad_inputs)
    with torch.device("meta"):
        got = _run(call, grad_inputs)
    assert got.keys() == expected.keys()
    for path, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert value.device.type == "cpu", path
            assert got[path].device.type == "cpu", f"{path} is on {got[path].device}"
        assert _equal(value, got[path]), f"{path}: {value!r} != {got[path]!r}"


def _computing_exports() -> set[str]:
    """Exported functions and classes, without constants, presets, result containers (NamedTuples,
    dataclasses: their fields are compared wherever a case returns them) and exceptions."""
    names = set()
    for module in MODULES:
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                if issubclass(obj, (tuple, BaseException)) or dataclasses.is_dataclass(obj):
                    continue
            elif not inspect.isfunction(obj):
                continue
            names.add(f"{module.__name__}.{name}")
    return names


def test_every_public_computing_export_has_a_case():
    covered = {export for export, _, _ in CASES.values()}
    exports = _computing_exports()
    assert not covered & set(EXEMPT), "an exempt export has a case"
    assert sorted(exports - set(EXEMPT) - covered) == [], "public functions without a default-device case"
    assert sorted(covered - exports) == [], "cases of names that are not exported"

"""The contract between the kit and the function it checks: what it is called with, what it must
return (``SIGNATURES``), the call object of a policy loss (``PolicyLossCall``) and the default
adapter. A function that cannot be called on the plainest case raises ``SignatureError`` before any
case runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .user_code import guarded

__all__ = [
    "POLICY_LOSS_SIGNATURE",
    "SIGNATURES",
    "SignatureError",
    "PolicyLossCall",
    "contract_adapter",
    "loss_of",
    "call",
]

POLICY_LOSS_SIGNATURE = (
    "fn(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None) -> scalar loss tensor "
    "(or give an adapter(fn, call: PolicyLossCall))"
)


class SignatureError(TypeError):
    """The function (through its adapter) cannot be called on the plainest case, or does not
    return a scalar tensor: the check stops before running any case class."""


@dataclass(frozen=True)
class PolicyLossCall:
    """What an adapter receives for one (micro-)batch.

    ``logp`` is a leaf tensor with ``requires_grad=True`` (the kit differentiates the returned loss
    w.r.t. it); ``mask`` is bool; ``normalizer`` is the global denominator (a float) when the batch
    is a micro-batch under the global-normaliser convention, else None; ``config`` holds the
    variant's fields (every ``PolicyLossVariant`` field: eps_low, eps_high, dual_clip, tau_pos,
    tau_neg, aggregation, max_length, group_size, kl_coef, kl_estimator, kl_scale, ratio, gate,
    ...) plus ``preset``, ``convention`` (the flag dict) and ``framework_config`` (TRL / verl keys
    under those profiles, else an empty dict).

    Micro-batches (gradient accumulation): ``micro_batch_index`` in ``range(micro_batch_count)``
    (0 and 1 without micro-batches); ``global_tokens`` = ``mask.sum()`` over the whole batch,
    ``global_sequences`` its non-empty rows, ``global_rows`` all its rows (empty ones included),
    the counts frameworks use for a global normaliser (e.g. TRL's ``num_items_in_batch``, verl's
    ``global_batch_info``); for a single batch they are this batch's counts. The kit sums the
    micro-batch losses; under ``micro_batch="local_mean"`` it then divides by their number, unless
    the adapter has the attribute ``scaled_for_accumulation = True`` (it returns each micro-batch's
    loss already divided by ``micro_batch_count``, as TRL's gradient accumulation does).
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logp: torch.Tensor | None
    rewards: torch.Tensor
    group_ids: torch.Tensor
    normalizer: float | None
    config: dict
    micro_batch_index: int = 0
    micro_batch_count: int = 1
    global_tokens: int = 0
    global_sequences: int = 0
    global_rows: int = 0


def contract_adapter(fn: Callable, call: PolicyLossCall) -> torch.Tensor:
    """Call ``fn(logp, old_logp, advantages, mask, *, ref_logp=..., normalizer=...)`` (the contract
    signature of ``refimpl.losses.policy_loss`` without the variant; keywords passed only when
    given) and return the loss (the first element if ``fn`` returns a tuple)."""
    kwargs = {}
    if call.ref_logp is not None:
        kwargs["ref_logp"] = call.ref_logp
    if call.normalizer is not None:
        kwargs["normalizer"] = call.normalizer
    return loss_of(fn(call.logp, call.old_logp, call.advantages, call.mask, **kwargs), fn)


def loss_of(out, fn=None) -> torch.Tensor:
    """The loss in what a loss function returned: a one-element tensor, or a tuple whose first
    element is one (``(loss, metrics)``); anything else (a list, an empty tuple, a tuple of
    something else, None) is a one-line ``SignatureError``."""
    first = out[0] if isinstance(out, tuple) and out else out
    if isinstance(first, torch.Tensor) and first.numel() == 1:
        return first
    name = getattr(fn, "__qualname__", type(fn).__name__) if fn is not None else "the function"
    if isinstance(out, tuple):
        got = "an empty tuple" if not out else f"a tuple whose first element is {_kind(first)}"
    else:
        got = _kind(out)
    raise SignatureError(f"{name} must return a scalar loss tensor, got {got}; expected "
                         f"{POLICY_LOSS_SIGNATURE} (a tuple whose first element is the loss also fits)")


def _kind(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"Tensor of shape {tuple(x.shape)}"
    return "None" if x is None else type(x).__name__


#: the contract signature of each kind without an adapter, and the adapter's (one API for every kind:
#: ``adapter(fn, *inputs)`` receives the function and exactly the inputs the kit would pass it)
SIGNATURES = {
    "policy_loss": POLICY_LOSS_SIGNATURE,
    "kl": "fn(logp [N, T], ref_logp [N, T]) -> per-token KL [N, T] (or give an adapter(fn, logp, ref_logp))",
    "group_advantages": "fn(rewards [N], group_ids [N]) -> advantages [N] "
    "(or give an adapter(fn, rewards, group_ids))",
    "token_logprobs": "fn(logits [N, T, V], tokens [N, T]) -> log-probs [N, T] "
    "(or give an adapter(fn, logits, tokens))",
}


def call(fn, adapter, *inputs):
    """``adapter(fn, *inputs)`` (or ``fn(*inputs)``) as user code (``user_code.guarded``)."""
    name = getattr(fn, "__qualname__", type(fn).__name__)
    return guarded(lambda: adapter(fn, *inputs) if adapter is not None else fn(*inputs), name)


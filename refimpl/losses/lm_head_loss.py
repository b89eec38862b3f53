"""The lm head and the policy loss in one pass over the logits: ``policy_loss(lm_head_logprobs(...))``
with the logits formed once, not twice.

``lm_head_logprobs`` forms each chunk's logits twice (forward, then backward), because a per-token
log-probability's gradient waits for the loss that follows: four ``[N, d] x [d, V]`` products
against the plain formula's three. A policy loss is a sum over sequences, ``(1/D) sum_i c_i``, each
``c_i`` reading only sequence i (policy_losses.md eqs. (10)-(12), "Global normaliser"). So where D is
known from the mask in advance (``loss_normalizer``, or the caller's global ``normalizer``), the
gradient of the loss w.r.t. the log-probabilities of a chunk of whole sequences is the gradient of
``policy_loss`` on those sequences alone with ``normalizer=D``; and for a token-level ratio (md eq.
(2): PPO, GRPO, DAPO, Dr. GRPO, SAPO, CISPO) it is the gradient at the chunk's own tokens of
``policy_loss`` on the rows they lie in, whatever the rows' other tokens hold (a token's derivative
reads its own inputs, its row's length and D). Each chunk then goes: logits ``h W^T`` -> row
statistics and ``log p`` (kl.md eq. (14')) -> ``g = d loss / d log p`` from ``policy_loss`` on its
rows (the closed form where it applies, the reference elsewhere: the loss is not written twice) ->
``g (onehot - softmax)`` written over the logits (kl.md eq. (15')) -> ``grad_hidden[chunk] = G W``
and ``grad_weight += G^T h[chunk]``: three products, as Liger-Kernel's fused linear losses. The loss
and its metrics come from one ``policy_loss`` call on all the log-probabilities afterwards, so they
are those of the two-step code on the same log-probabilities; the backward only scales the saved
gradients by the incoming one.

Where a chunk cannot hold whole sequences under the memory bound (sequence-level ratios, md eqs.
(3)-(5), with ``chunk_rows`` below the response width T) and for ``kl_scale="sequence"`` under
``token_mean`` (md eq. (19): its weight D / S reads the whole batch's sequence count, which no
normaliser carries), the two-step path ``policy_loss(lm_head_logprobs(...))`` runs instead, and
likewise where no gradient is wanted (its forward is the one product per chunk already).
"""

from __future__ import annotations

import torch

from refimpl.losses.lm_head import (
    check_lm_head_inputs,
    chunk_gradient,
    chunk_logits_stats,
    chunk_products,
    lm_head_logprobs,
)
from refimpl.losses.logprobs import _compute_dtype, _logprob_parts, check_distributions
from refimpl.losses.policy import PolicyLossVariant, check_policy_inputs, loss_normalizer, policy_loss

__all__ = ["lm_head_policy_loss"]


def fused_chunk_tokens(variant: PolicyLossVariant, width: int, chunk_rows: int) -> int | None:
    """Tokens per chunk of the fused path for responses of ``width`` tokens and ``chunk_rows`` tokens
    per chunk (the memory bound's), or None where the two-step path must run: any ``chunk_rows`` for a
    token-level ratio (a token's derivative is local), the whole rows within ``chunk_rows`` for a
    sequence-level one (None where not one fits), and None for a KL with ``kl_scale="sequence"``
    under ``token_mean`` (md eq. (19): its weight reads the batch's sequence count)."""
    if variant.kl_coef > 0 and variant.kl_scale == "sequence" and variant.aggregation == "token_mean":
        return None
    if variant.ratio == "token":
        return chunk_rows
    rows = chunk_rows // max(width, 1)
    return rows * width if rows else None


def _chunk_loss_gradient(logp: torch.Tensor, start: int, stop: int, width: int, old_logp: torch.Tensor,
                         advantages: torch.Tensor, mask: torch.Tensor, variant: PolicyLossVariant,
                         optional: dict, normalizer) -> torch.Tensor:
    """``d loss / d logp`` at the flattened tokens ``[start, stop)`` (``logp`` their log-probabilities):
    ``policy_loss`` with the global ``normalizer`` on the rows they lie in, the rows' other tokens
    holding ``old_logp`` (ratio 1; their gradient is dropped)."""
    first, last = start // width, (stop - 1) // width + 1
    rows = slice(first, last)
    piece = old_logp[rows].detach().to(logp.dtype, copy=True).reshape(-1)
    piece[start - first * width:stop - first * width] = logp
    piece = piece.view(last - first, width).requires_grad_(True)
    given = {name: value[rows] for name, value in optional.items() if value is not None}
    with torch.enable_grad():
        loss, _ = policy_loss(piece, old_logp[rows], advantages[rows], mask[rows], variant,
                              normalizer=normalizer, **given)
        (grad,) = torch.autograd.grad(loss, piece)
    return grad.reshape(-1)[start - first * width:stop - first * width]


class _LossWithGradients(torch.autograd.Function):
    """A loss whose gradients w.r.t. ``hidden`` and ``weight`` were formed with it: backward returns
    them times the incoming gradient (as they are when it is 1, as Liger-Kernel's fused losses do:
    no second copy of ``grad_weight``; a host synchronisation)."""

    @staticmethod
    def forward(ctx, loss, hidden, weight, grads):
        ctx.grads = grads
        return loss.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        grads, ctx.grads = ctx.grads, None
        if grads is None:
            raise RuntimeError("lm_head_policy_loss: backward through the same loss twice (its gradients "
                               "are handed over on the first)")
        one = bool(grad_loss == 1)
        out = [g if g is None or one else g * grad_loss.to(g.dtype) for g in grads]
        return None, *out, None


def lm_head_policy_loss(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor,
                        old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                        variant: PolicyLossVariant, *, ref_logp: torch.Tensor | None = None,
                        behavior_logp: torch.Tensor | None = None,
                        normalizer: float | torch.Tensor | None = None, chunk_rows: int | None = None,
                        check_finite: bool = True, backend: str = "auto"
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``policy_loss(lm_head_logprobs(hidden, weight, tokens), old_logp, ...)`` with each chunk's
    logits formed once: their gradients w.r.t. ``hidden`` and ``weight`` are formed in the forward
    (the module docstring; spec: policy_losses.md eqs. (10)-(12), (19) and its "Global normaliser";
    kl.md eqs. (14')-(15')).

    Equal to the two-step code in value, metrics and gradients up to the chunked products' rounding
    (the log-probabilities are ``lm_head_logprobs``'s; the loss and metrics one ``policy_loss`` call
    on them). Memory: ``lm_head_logprobs``'s two ``[chunk_rows, V]`` tensors at its peak, plus the
    gradients of ``hidden`` and ``weight``, held from the forward until backward hands them over
    (once: a second backward through the same loss raises). Runs the two-step path where the fused
    one does not apply (``fused_chunk_tokens``: a sequence-level ratio whose responses are wider than
    a chunk, ``kl_scale="sequence"`` under ``token_mean``) and where no gradient is wanted.

    Args:
        hidden: ``[N, T, d]`` final hidden states of the responses' tokens, a float dtype.
        weight: ``[V, d]`` output-layer weight, the dtype and device of ``hidden``.
        tokens: ``[N, T]`` the sampled token ids in ``[0, V)``.
        old_logp, advantages, mask, variant, ref_logp, behavior_logp, normalizer: ``policy_loss``'s
            (no ``entropy`` or exact ``kl``: they need the logits' distributions; use the two-step
            code there).
        chunk_rows, check_finite, backend: ``lm_head_logprobs``'s.
    Returns:
        ``(loss, metrics)`` as ``policy_loss``.
    """
    if isinstance(tokens, torch.Tensor) and tokens.ndim != 2:
        raise ValueError(f"tokens must be 2-D [N, T], got shape {tuple(tokens.shape)}")
    flat, chunk_rows, kernel = check_lm_head_inputs(hidden, weight, tokens, chunk_rows, backend)
    if isinstance(variant, PolicyLossVariant) and variant.entropy_coef > 0:
        raise ValueError(f"variant.entropy_coef={variant.entropy_coef} > 0: lm_head_policy_loss has no "
                         "entropy term; use policy_loss(lm_head_logprobs(...), entropy=...)")
    optional = {"ref_logp": ref_logp, "behavior_logp": behavior_logp}
    check_policy_inputs(hidden[..., 0], old_logp, advantages, mask, variant, {**optional, "entropy": None,
                                                                                "kl": None})
    n, width = tokens.shape
    step = fused_chunk_tokens(variant, width, chunk_rows)
    wanted = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if step is None or not wanted or tokens.numel() == 0:
        logp = lm_head_logprobs(hidden, weight, tokens, chunk_rows=chunk_rows, check_finite=check_finite,
                                backend=backend)
        return policy_loss(logp, old_logp, advantages, mask, variant, normalizer=normalizer, **optional)
    global_normalizer = loss_normalizer(mask, variant).clamp(min=1.0) if normalizer is None else normalizer
    ids = tokens.reshape(-1).long()
    logp = torch.empty(ids.shape[0], dtype=_compute_dtype(hidden.dtype), device=hidden.device)
    grad_hidden = torch.empty_like(flat) if hidden.requires_grad else None
    grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
    with torch.no_grad():
        for start in range(0, ids.shape[0], step):
            rows = slice(start, start + step)
            chunk, top, rest, picked, exponentiated = chunk_logits_stats(flat[rows], weight, ids[rows],
                                                                         kernel=kernel)
            check_distributions(top, check_finite)
            logp[rows], others = _logprob_parts(top, rest, picked)
            grad = _chunk_loss_gradient(logp[rows], start, min(start + step, ids.shape[0]), width, old_logp,
                                        advantages, mask, variant, optional, global_normalizer)
            dlogits = chunk_gradient(chunk, ids[rows], top, others, grad, kernel=kernel,
                                     picked=picked if exponentiated else None)
            chunk_products(dlogits, flat[rows], weight, grad_weight=grad_weight,
                           grad_hidden_rows=None if grad_hidden is None else grad_hidden[rows])
            del chunk, dlogits
        loss, metrics = policy_loss(logp.view(n, width), old_logp, advantages, mask, variant,
                                    normalizer=normalizer, **optional)
    grads = (None if grad_hidden is None else grad_hidden.view(hidden.shape), grad_weight)
    return _LossWithGradients.apply(loss, hidden, weight, grads), metrics

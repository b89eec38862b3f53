"""The fast path of ``policy_loss``: the same loss, gradient, metrics and guards in a few fused passes.

spec: specs/policy_losses.md eqs. (1)-(13), (19) (the loss of ``refimpl.losses.policy``, which stays
the readable reference; tests/test_policy_loss_fast.py holds this module to it on every case class
of the conformance kit).

``fused_policy_loss(logp, old_logp, advantages, mask, variant, *, ref_logp=None, behavior_logp=None,
entropy=None, kl=None, normalizer=None, compile=True) -> (loss, metrics)`` takes ``policy_loss``'s
arguments and returns what it returns; ``compile`` picks ``torch.compile`` (C++ loops on a CPU,
Triton kernels on CUDA), an AOTInductor package per plan (``"aot"``, ``refimpl.losses.fused_aot``)
or the same formulas run op by op. The fused function itself is ``refimpl.losses.fused_kernel``.

Why it is faster: the reference lets autograd differentiate some twenty elementwise operations (with
their ``torch.where`` guards) forward and backward, about 80 passes over ``[N, T]``, and checks its
guards in separate reductions. Here the gradient is written out in closed form, each unit's
derivative (md eqs. (6)-(9), (15), (16), (18)) times its aggregation weight ((10)-(11), (19)) divided by
the denominator, and computed in the same function as the loss, the metrics and the guard flags,
which ``torch.compile`` fuses into a few loops; the backward pass multiplies the saved gradient by
the incoming one. The guards (a 0/1 mask, NaN / inf at unmasked positions, a positive normaliser,
an overflowing loss) are flags of that function, read once (one host synchronisation): a ValueError
naming the culprit, on every device.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import types
from typing import NamedTuple

import torch

from refimpl.losses.fused_aot import AotKernel
from refimpl.losses.fused_kernel import _fused, _Plan
from refimpl.losses.policy import (
    PolicyLossVariant,
    _max_length_message,
    _normalizer_from_lengths,
    _sequence_kl_weight,
    check_policy_inputs,
    policy_loss,
)

__all__ = ["fused_policy_loss", "METRIC_NAMES"]

METRIC_NAMES = ("policy_objective", "clip_fraction", "ratio_mean", "ratio_min", "ratio_max",
                "approx_kl", "normalizer")


# ----------------------------------------------------------------------------------------------
# compiled functions


class _Compiled:
    """``torch.compile`` of ``_fused`` for one plan and dtypes: on its first call the sizes are
    marked dynamic (on aliases, not the caller's tensors), so that one graph serves every N, T >= 2
    (``fused_policy_loss`` runs smaller batches uncompiled instead of compiling sizes 1 apart).
    Unbacked sizes, which would cover sizes 1 too, give inductor's C++ loops that do not fuse (1.7x
    slower on the development machine). Each instance compiles its own copy of the function's code
    object: dynamo keeps graphs, and its limit on recompilations, per code object, so plans do not
    evict each other's graphs. The copy is named for its plan (``_code_name``): with copies alike in
    name, file and line, torch 2.13's on-disk FX-graph cache came to hold, under the key of DAPO's
    graph, code compiled with PPO's eps_high (1.2, not 1.28; written by a process that had compiled
    PPO's copy just before), and every later process using that cache got PPO's loss for DAPO (their
    plans differ in eps_high alone; a fresh cache directory gave the right one)."""

    def __init__(self, plan: _Plan, device_type: str):
        def fused(*inputs):  # the plan a closure variable: its floats are constants to dynamo
            return _fused(*inputs, plan=plan)

        name = _code_name(plan)
        code = fused.__code__.replace(co_name=name, co_qualname=name)
        copy = types.FunctionType(code, fused.__globals__, name, None, fused.__closure__)
        self.fn = torch.compile(copy, fullgraph=True, options=_inductor_options(device_type))
        self.traced = False

    def __call__(self, *inputs):  # the [N, T] / [N] tensors, then the normaliser and its flag ([1])
        if not self.traced:
            inputs = tuple(None if x is None else _dynamic(x.detach()) for x in inputs[:8]) + inputs[8:]
            self.traced = True
        return self.fn(*inputs)


def _code_name(plan: _Plan) -> str:
    """The compiled copy's name: ``fused_`` and a hash of the plan's repr (the same in every process,
    so inductor's caches on disk still serve later processes; another for every other plan)."""
    return "fused_" + hashlib.sha256(repr(plan).encode()).hexdigest()[:16]


def _inductor_options(device_type: str) -> dict | None:
    """Inductor settings: scalar C++ loops (``cpp.simdlen`` 1) on a CPU where inductor finds no vector
    instruction set (e.g. ``ATEN_CPU_CAPABILITY=default``): there torch 2.13's C++ backend still emits
    16-lane ``at::vec`` reductions for dynamic shapes, without their header, and the compilation
    fails. None (the defaults) elsewhere."""
    if device_type != "cpu":
        return None
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa
    except ImportError:  # another torch: its defaults
        return None
    return None if pick_vec_isa() else {"cpp.simdlen": 1}


def _dynamic(x: torch.Tensor) -> torch.Tensor:
    torch._dynamo.mark_dynamic(x, list(range(x.ndim)))
    return x


@functools.cache
def _kernel(plan: _Plan, dtype: torch.dtype, mask_dtype: torch.dtype, device: torch.device,
            compiled: bool | str):
    """The fused function for one plan: ``torch.compile``'d (True), an AOTInductor package ("aot",
    ``refimpl.losses.fused_aot``) or op by op (False)."""
    if compiled == "aot":
        return AotKernel(plan, device, _inductor_options(device.type))
    return _Compiled(plan, device.type) if compiled else functools.partial(_fused, plan=plan)


def _flag_messages(plan: _Plan, dtype: torch.dtype, max_length: int | None) -> list[str]:
    """The ValueError of each flag of ``_fused`` (the reference's wording)."""
    names = ["logp", "old_logp", "advantages"] + [
        name for name, present in (("ref_logp", plan.ref), ("behavior_logp", plan.behavior),
                                   ("entropy", plan.entropy), ("kl", plan.kl)) if present]
    hint = "" if dtype == torch.float64 else "; pass float64 logp"
    return ["mask must contain only 0 and 1",
            _max_length_message(max_length),
            *(f"{name} contains NaN or inf at unmasked positions" for name in names),
            "normalizer must be finite and > 0",
            f"the loss overflows {dtype} (a ratio exp(logp - old_logp), a KL term from ref_logp / kl, or "
            f"their sum exceeds its range at unmasked positions){hint}"]


def _check_flags(flags: torch.Tensor, entry: _Entry) -> None:
    """One read of the guard flags (one host synchronisation on an accelerator): ValueError naming
    the first failed guard, in the reference's order, on every device. A device-side assertion
    (``torch._assert_async``) would save the synchronisation but leaves a CUDA context unusable after
    a failure and takes no message over 255 characters (seen on an H100), so it is not used. Whether
    all passed is decided here, not in the compiled graph: inductor's CPU code once gave ``all()``
    False over nine flags that read True (a make test run under load; not reproduced)."""
    passed = flags.tolist()
    if not all(passed):
        raise ValueError(_flag_messages(entry.plan, entry.dtype, entry.max_length)[passed.index(False)])


# ----------------------------------------------------------------------------------------------
# what a call needs that does not depend on the values, made once per kind of call


class _Entry(NamedTuple):
    """Everything of a call that depends only on its kind (variant, optional inputs given, dtypes,
    device, compiled or not), cached by ``_entry``: the fused function, the compute dtype, the
    constant inputs (placeholder normaliser, its flag, L_max) and the metrics' names."""

    plan: _Plan
    kernel: object
    dtype: torch.dtype
    max_length: int | None  # the variant's L_max (messages)
    constants: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # normaliser 1.0, use it: False, L_max
    use_normalizer: torch.Tensor  # True
    names: tuple[str, ...]


@functools.cache
def _plan(variant: PolicyLossVariant, per_token_advantages: bool, ref: bool, behavior: bool, entropy: bool,
          kl: bool, bool_mask: bool, global_normalizer: bool) -> _Plan:
    """The plan, after the aggregation's checks of the variant (the reference's messages; cached, so
    they run once per plan)."""
    # the aggregation's own checks (max_length, group_size, the sequence KL)
    empty = torch.zeros(0, device="cpu")
    local = _normalizer_from_lengths(empty, variant)
    if variant.kl_scale == "sequence" and (ref or kl) and variant.kl_coef > 0:
        _sequence_kl_weight(variant, local, empty, global_normalizer)
    if variant.aggregation == "seq_sum":  # L_max is a runtime input of the kernel: one graph for every L_max
        variant = dataclasses.replace(variant, max_length=1)
    return _Plan(variant, per_token_advantages, ref, behavior, entropy, kl, bool_mask)


@functools.cache
def _entry(variant: PolicyLossVariant, per_token_advantages: bool, ref: bool, behavior: bool, entropy: bool,
           kl: bool, mask_dtype: torch.dtype, global_normalizer: bool, logp_dtype: torch.dtype,
           device: torch.device, compiled: bool | str) -> _Entry:
    plan = _plan(variant, per_token_advantages, ref, behavior, entropy, kl, mask_dtype == torch.bool,
                 global_normalizer)
    dtype = torch.promote_types(logp_dtype, torch.float32)
    # a bool mask on a CPU reaches the kernel as 0.0 / 1.0 in the compute dtype (_as_input_mask)
    kernel_mask = dtype if mask_dtype == torch.bool and device.type == "cpu" else mask_dtype
    constants = (torch.ones(1, dtype=dtype, device=device), torch.zeros(1, dtype=torch.bool, device=device),
                 torch.full((1,), float(variant.max_length or 1), dtype=dtype, device=device))
    names = METRIC_NAMES + (("kl",) if ref or kl else ()) + (("entropy",) if entropy else ())
    return _Entry(plan, _kernel(plan, dtype, kernel_mask, device, compiled), dtype, variant.max_length,
                  constants, torch.ones(1, dtype=torch.bool, device=device), names)


# ----------------------------------------------------------------------------------------------
# autograd


def _kernel_input(x: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``x`` detached (a compiled graph's guards hold ``requires_grad``) in the compute dtype, without
    a call where it already is (as the reference's first step: bf16 / fp16 / float32 inputs share one
    compiled graph)."""
    if x is None:
        return None
    if x.requires_grad:
        x = x.detach()
    return x if x.dtype == dtype else x.to(dtype)


class _FusedPolicyLoss(torch.autograd.Function):
    """Forward: the fused function (loss, metrics, the gradient kept for the inputs that need one);
    backward: each kept gradient times the incoming one, in its input's dtype. Differentiable inputs:
    logp, and entropy / kl when their coefficient is non-zero (as in the reference)."""

    @staticmethod
    def forward(ctx, entry, inputs, logp, entropy, kl):
        mask, old_logp, advantages, ref_logp, behavior_logp, normalizer, use_normalizer, max_length = inputs
        dtype = entry.dtype
        loss, metrics, flags, *grads = entry.kernel(
            *(_kernel_input(x, dtype) for x in (logp, old_logp, advantages)), mask,
            *(_kernel_input(x, dtype) for x in (ref_logp, behavior_logp, entropy, kl)),
            normalizer, use_normalizer, max_length)
        _check_flags(flags, entry)
        # the gradients are the kernel's own outputs, seen by no one else: kept on ctx, not saved
        needs = ctx.needs_input_grad[2:]
        ctx.grads = [(grad, x.dtype) if needed and grad is not None else None
                     for grad, x, needed in zip(grads, (logp, entropy, kl), needs, strict=True)]
        ctx.mark_non_differentiable(metrics)
        ctx.set_materialize_grads(False)  # no zeros made for the metrics' (absent) gradient
        return loss, metrics

    @staticmethod
    def backward(ctx, grad_loss, _grad_metrics):
        if grad_loss is None:
            return None, None, None, None, None
        return None, None, *(None if kept is None else _times(*kept, grad_loss) for kept in ctx.grads)


def _times(grad: torch.Tensor, dtype: torch.dtype, grad_loss: torch.Tensor) -> torch.Tensor:
    """The chain rule's one product (first derivatives only), in the input's dtype."""
    product = grad_loss * grad
    return product if product.dtype == dtype else product.to(dtype)


# ----------------------------------------------------------------------------------------------
# the entry point


def _normalizer_tensor(normalizer: object, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    if normalizer is None:
        return None
    if isinstance(normalizer, torch.Tensor):
        if normalizer.numel() != 1:
            raise ValueError(f"normalizer must be a scalar, got shape {tuple(normalizer.shape)}")
        return normalizer.detach().reshape(1).to(device=device, dtype=dtype)
    if isinstance(normalizer, (int, float)) and not isinstance(normalizer, bool):
        return torch.tensor([float(normalizer)], dtype=dtype, device=device)
    raise TypeError(f"normalizer must be None, a positive number or a scalar tensor, "
                    f"got {type(normalizer).__name__}")


def _as_input_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask on a CPU as 0.0 / 1.0 in ``dtype``: inductor's C++ loops load bool vectors an order
    of magnitude slower than floats (1.7 ms against 0.2 ms for a masked sum of 2**19 float32 on the
    development machine), and the conversion takes 0.1 ms. Other masks are passed as they are (their
    0 / 1 check needs the values)."""
    if mask.dtype != torch.bool or mask.device.type != "cpu":
        return mask
    return mask.view(torch.uint8).to(dtype)


def fused_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    variant: PolicyLossVariant,
    *,
    ref_logp: torch.Tensor | None = None,
    behavior_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    normalizer: float | torch.Tensor | None = None,
    compile: bool | str = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``policy_loss`` (spec: policy_losses.md eq. (12); the arguments, results, errors and edge
    cases of ``refimpl.losses.policy.policy_loss``), fused.

    ``compile=True`` runs the fused function through ``torch.compile`` (dynamic shapes; one graph
    per variant, set of optional inputs, compute dtype and device; on a CPU inductor needs a C++
    compiler); ``"aot"`` through an AOTInductor package per plan, cached on disk across processes
    and called without dynamo (``refimpl.losses.fused_aot``: the least fixed cost a call, the longest
    first compile); ``False``, and batches with N or T below 2, run the same formulas op by op. The loss
    is a scalar whose backward pass multiplies the closed-form gradient (computed with the loss) by
    the incoming gradient (first derivatives only); metrics are detached scalars. A batch with no
    elements is passed to the reference. Where several inputs are wrong at once, the error named
    first may differ from the reference's (the value checks are read together, after the others).
    """
    if compile not in (True, False, "aot"):
        raise ValueError(f"compile must be True, False or 'aot', got {compile!r}")
    optional = {"ref_logp": ref_logp, "behavior_logp": behavior_logp, "entropy": entropy, "kl": kl}
    shape, device = check_policy_inputs(logp, old_logp, advantages, mask, variant, optional)
    if logp.numel() == 0:  # nothing to fuse (a shape fact, no host sync)
        return policy_loss(logp, old_logp, advantages, mask, variant, normalizer=normalizer, **optional)
    entry = _entry(variant, advantages.ndim == 2, ref_logp is not None, behavior_logp is not None,
                   entropy is not None, kl is not None, mask.dtype, normalizer is not None, logp.dtype,
                   device, compile if min(shape) >= 2 else False)
    scalars = entry.constants
    if normalizer is not None:
        scalars = (_normalizer_tensor(normalizer, entry.dtype, device), entry.use_normalizer, scalars[2])
    # entropy and kl are differentiable inputs only where they enter the loss (as in the reference)
    if entropy is not None and variant.entropy_coef <= 0:
        entropy = entropy.detach()
    if kl is not None and variant.kl_coef <= 0:
        kl = kl.detach()
    loss, metrics = _FusedPolicyLoss.apply(
        entry, (_as_input_mask(mask, entry.dtype), old_logp, advantages, ref_logp, behavior_logp, *scalars),
        logp, entropy, kl)
    return loss, dict(zip(entry.names, metrics.unbind(), strict=True))

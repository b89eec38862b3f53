"""Driver for the installed Liger-Kernel (0.8.5): its fused-linear, chunked GRPO loss
``LigerFusedLinearGRPOLoss`` (liger_kernel/chunked_loss/grpo_loss.py, fused_linear_ppo.py), called
by the conformance kit for each ``loss_type``.

How Liger is imported. ``import liger_kernel`` runs ``liger_kernel.functional``, which imports every
Triton kernel module (triton is a 641 MB install that the chunked loss never calls). The driver
therefore executes the two installed files it runs, unchanged, as private modules
(``_refimpl_liger.fused_linear_ppo`` and ``_refimpl_liger.grpo_loss``, ``sources.load_source``);
``grpo_loss.py``'s ``from liger_kernel.chunked_loss.fused_linear_ppo import LigerFusedLinearPPOBase``
is served by the private module while that file executes, unless the real package is already
imported (then the real module is used). Nothing else is needed: both files import only torch.

What a call does. ``LigerFusedLinearGRPOLoss(compiled=False, chunk_size=1, ...)(_input, lin_weight,
selected_token_ids, attention_mask, advantages, old_per_token_logps=..., ref_per_token_logps=...,
num_items_in_batch=...)``: Liger splits the batch into chunks of rows, computes each chunk's log-probs
of the selected tokens with ``LigerFusedLinearPPOBase.chunk_forward`` (a float32 log-softmax over the
vocabulary of ``_input @ lin_weight.T``), the chunk's loss with ``ppo_loss_fn`` and its gradient at
once, and sums the chunk losses into a float32 accumulator. The kit hands log-probs, not hidden
states: while the call runs, ``chunk_forward`` returns the kit's log-probs (carried as
``_input[..., 0]``, a hidden size of 1) converted to float32, as Liger's own log-softmax returns
them, so every other line (chunking, the loss, its gradient w.r.t. ``_input``, the accumulation) is
Liger's. ``compiled=False`` runs ``ppo_loss_fn`` eagerly (Liger's default wraps the same function in
``torch.compile``, whose fused float32 kernels may round differently; not checked here).

Numerics (the profile): Liger computes in float32 whatever the inputs (``chunk_forward`` returns
float32; ``_compute_loss_from_logps`` casts old and reference log-probs with ``.float()``; the loss
accumulator is a float32 zero, fused_linear_ppo.py:251, 530-531). bf16 / fp16 inputs are thus computed
in float32 (the spec's ``compute_dtype="float32_min"``), but float64 inputs are rounded to float32:
the profile's ``compute_dtype="float32"`` (float32's tolerance for every case) and
``ratio_dtype="float32_gate"`` (the ratio, and its ties with the clip bounds, as float32 makes them).
Micro-batches: dapo / cispo divide by ``num_items_in_batch`` (the step's global token count, which
the adapter passes, TRL's convention); every other loss_type divides by the call's own rows or tokens,
and the adapter divides its loss by the number of micro-batches, as a trainer with gradient
accumulation does (``micro_batch="local_mean"``).

The registry kind ``fused_linear`` (kinds/fused_linear.py; ``KIND_MODES`` at the end of this file)
runs the same loss on hidden states and an lm-head weight, with Liger's own ``chunk_forward``: the
path the policy-loss modes replace, its row chunks and its weight-gradient accumulation.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator

from . import Mode
from .driver import distribution_version, find_mode
from .liger_findings import FINDINGS, NOTES
from .releases import release_modes
from .sources import (
    installed_files,
    load_failure,
    load_source,
    package_dir,
    private_package,
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
    "KIND_MODES",
    "KIND_UNSUPPORTED",
    "kind_target",
    "availability",
    "source_files",
    "loss_kwargs",
    "target",
]

NAME = "liger"
PINNED_VERSION = "0.8.5"
DISTRIBUTION = "liger-kernel"
_PRIVATE = "_refimpl_liger"
_SOURCES = ("chunked_loss/fused_linear_ppo.py", "chunked_loss/grpo_loss.py")
_INSTALL = "refimpl frameworks install liger"

# The profile (flags of conventions.Convention, as data), shared by every mode:
# * masked_nonfinite "propagate": ppo_loss_fn reduces (per_token_loss * attention_mask).sum(), so a
#   NaN / inf at a masked position reaches the loss;
# * empty_rows "keep" / token_sum_rows "all": grpo / sapo divide the sum of row means by
#   full_attention_mask.shape[0] (every row), dr_grpo by shape[0] * max_completion_length and luspo
#   (aggregation seq_mean_token_sum) its length-weighted row terms by shape[0] (grpo_loss.py:242-245);
# * kl_k3_form "naive" and kl_compute_dtype "float32": k3_loss_fn is exp(x) - x - 1 on float32 log-probs;
# * compute_dtype "float32" and ratio_dtype "float32_gate": every loss is computed in float32 whatever the
#   inputs (fused_linear_ppo.py:32 float32 log-probs, :251 a float32 accumulator, :530-531 .float() on
#   old / reference log-probs), so float64 inputs are rounded and the ratio's ties are float32's (at
#   delta = 3 the float32 ratio of a float64 log-ratio near log 3 is exactly 3.0, where clamp passes
#   the gradient).
_COMMON = {
    "compute_dtype": "float32",
    "ratio_dtype": "float32_gate",
    "masked_nonfinite": "propagate",
    "empty_rows": "keep",
    "token_sum_rows": "all",
    "kl_k3_form": "naive",
    "kl_compute_dtype": "float32",
}
# * ratio_overflow "nan": coef_1 = exp(log_importance_weights) (grpo_loss.py:155) overflows above
#   88.72 and a closed gate's 0 times inf is a NaN gradient (not cispo: its weight is min(r, cap));
# * zero_rows "nan": grpo / sapo / dr_grpo / luspo divide by full_attention_mask.shape[0], 0 rows.
_EXP = {"ratio_overflow": "nan"}
_ROWS = {"zero_rows": "nan"}
_LOCAL = {**_COMMON, **_EXP, "micro_batch": "local_mean"}
_GLOBAL = dict(_COMMON)


_KL = {"kl_coef": 0.04, "kl_estimator": "k3"}


_MODES = (
    Mode("grpo", preset="grpo", framework_config={"loss_type": "grpo"}, convention={**_LOCAL, **_ROWS},
         description="loss_type='grpo': token ratio, hard clip, mean of each row, sum / all rows"),
    Mode("bnpo", preset="bnpo", framework_config={"loss_type": "bnpo"}, convention=_LOCAL,
         description="loss_type='bnpo': token mean over the call's tokens"),
    Mode("dr_grpo", preset="dr_grpo", framework_config={"loss_type": "dr_grpo"},
         convention={**_LOCAL, **_ROWS},
         description="loss_type='dr_grpo': token sum / (all rows x max_completion_length)"),
    Mode("dapo", preset="dapo", framework_config={"loss_type": "dapo"}, convention={**_GLOBAL, **_EXP},
         description="loss_type='dapo': token sum / num_items_in_batch (the step's tokens)"),
    Mode("dapo/delta", preset="dapo", variant_overrides={"dual_clip": 3.0},
         framework_config={"loss_type": "dapo", "delta": 3.0}, convention={**_GLOBAL, **_EXP},
         description="dapo with delta=3.0 (INTELLECT-2's cap on the ratio: dual clip for A < 0)"),
    Mode("cispo", preset="cispo", framework_config={"loss_type": "cispo"}, convention=_GLOBAL,
         description="loss_type='cispo': -sg(min(r, epsilon_high)) A logp / num_items_in_batch"),
    Mode("sapo", preset="sapo", framework_config={"loss_type": "sapo"}, convention={**_LOCAL, **_ROWS},
         description="loss_type='sapo': sigmoid gate 4/tau sigmoid(tau (r - 1)), grpo's aggregation"),
    Mode("gspo", preset="gspo", variant_overrides={"aggregation": "seq_mean_token_mean"},
         framework_config={"loss_type": "grpo", "importance_sampling_level": "sequence"},
         convention={**_LOCAL, **_ROWS},
         description="importance_sampling_level='sequence', loss_type='grpo' (GSPO's sequence ratio)"),
    Mode("luspo", preset="gspo", variant_overrides={"aggregation": "seq_mean_token_sum"},
         framework_config={"loss_type": "luspo", "importance_sampling_level": "sequence"},
         convention={**_LOCAL, **_ROWS},
         description="loss_type='luspo': sequence ratio, each row's loss times its length, mean over rows"),
    Mode("grpo+kl", preset="grpo", variant_overrides=_KL,
         framework_config={"loss_type": "grpo", "beta": 0.04}, convention={**_LOCAL, **_ROWS},
         description="grpo + 0.04 * k3 (beta), the KL per token inside each row's mean"),
    Mode("dapo+kl", preset="dapo", variant_overrides=_KL,
         framework_config={"loss_type": "dapo", "beta": 0.04}, convention={**_GLOBAL, **_EXP},
         description="dapo + 0.04 * k3 (beta), global token mean"),
    Mode("dapo+kl/bias-correction", preset="dapo", variant_overrides=_KL,
         framework_config={"loss_type": "dapo", "beta": 0.04, "use_bias_correction_kl": True},
         convention={**_GLOBAL, **_EXP, "kl_importance_weight": True},
         description="dapo + 0.04 * k3 times the differentiated ratio (use_bias_correction_kl=True)"),
)

#: what a release computes differently from the pinned one (releases.py): forward takes
#: num_items_in_batch from 0.8.4 (chunked_loss/fused_linear_ppo.py:460); before, dapo / cispo divide by the
#: call's own tokens (_compute_dapo_normalizer of the attention mask, 0.7.0's fused_linear_ppo.py:284-296):
#: each micro-batch its own mean
_OWN_TOKENS = {m: {"micro_batch": "local_mean"}
               for m in ("dapo", "dapo/delta", "cispo", "dapo+kl", "dapo+kl/bias-correction")}
RELEASE_FLAGS = {"0.7.0": _OWN_TOKENS, "0.8.0": _OWN_TOKENS}
MODES = release_modes(_MODES, RELEASE_FLAGS, DISTRIBUTION)

_UNSUPPORTED_LOSS = {
    "vespo": "loss_type='vespo': its Gamma weighting of the sequence ratio (get_gamma_weights) has no "
    "gate in refimpl's policy-loss family.",
    "triton_grpo_loss (liger_kernel.transformers.grpo_loss)": "the Triton kernel takes logits [B, L+1, V] "
    "and needs triton (641 MB installed) and a GPU (on CPU tensors only under TRITON_INTERPRET=1 set before "
    "liger_kernel.ops is imported), which the CPU CI has not. Its per-token terms are the chunked loss's, in "
    "float32; two of its reductions are not: luspo weighs each row by T_i^2 / L (finding triton_luspo, a bug "
    "whose script runs the torch reduction) and dr_grpo without max_completion_length divides by the padded "
    "width (finding triton_dr_grpo_width).",
    "importance_sampling_level='sequence' with bnpo / dr_grpo / dapo": "sequence ratios with a token "
    "aggregation (length-weighted GSPO) are not a preset; the sequence level is driven with grpo and luspo.",
    "luspo with importance_sampling_level='token', or beta > 0": "per_token_loss is then [B, T] and "
    "luspo's sum runs over every position, the masked ones included, divided by B x T: each position "
    "of row i weighs T_i / (B T), no spec aggregation (finding luspo_token_level, a bug).",
    "per-token advantages [N, T]": "the kit's policy cases carry per-sequence advantages [N], Liger's "
    "documented shape; [N, T] ones are accepted and crossed between the rows of a chunk when chunk_size > 1 "
    "(finding config:advantages, a validation finding with a script).",
    "the metrics (mean KL, clip fraction)": "the adapter returns the loss: the kit judges the loss and its "
    "gradient, not the logged metrics, where cispo's clip fraction counts only A > 0 tokens (finding "
    "cispo_clip_ratio, value only).",
    "vllm_is_ratio": "the behaviour importance ratio comes from vLLM's log-probs, which the kit's calls "
    "do not carry.",
    "compiled=True": "Liger's default compiles ppo_loss_fn with torch.compile (Inductor needs a C compiler "
    "on the CPU); the same function is run eagerly.",
    "temperature != 1": "divides the logits of the fused log-softmax, which the driver replaces by the "
    "kit's log-probs.",
    "ref_input / ref_weight (use_ref_model without ref_per_token_logps)": "reference log-probs from a "
    "second lm_head; the kit gives reference log-probs directly.",
}


UNSUPPORTED = {
    "policy_loss": _UNSUPPORTED_LOSS,
    "kl": {"k3": "Liger has no standalone KL function: k3_loss_fn is inline in ppo_loss_fn (checked as "
                 "the policy_loss modes with beta > 0)."},
    "group_advantages": {"group": "Liger computes no advantages: its loss takes them as input."},
}
# preset -> the mode whose flags are ``--convention liger --preset P``
PROFILE = {p: (p,) for p in ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "gspo")}
# ----------------------------------------------------------------------------------------------
# Import


def source_files() -> list:
    """The installed files whose code the driver runs (for ``source_hash``); [] when absent."""
    return installed_files("liger_kernel", _SOURCES)


@functools.cache
def _modules() -> dict:
    """``{"ppo": fused_linear_ppo, "grpo": grpo_loss}`` executed from the installed files."""
    import sys

    root = package_dir("liger_kernel")
    if root is None:
        raise ModuleNotFoundError(f"Liger-Kernel is not installed ({_INSTALL})")
    private_package(_PRIVATE)
    real = sys.modules.get("liger_kernel.chunked_loss.fused_linear_ppo")
    ppo = real or load_source(f"{_PRIVATE}.fused_linear_ppo", root / _SOURCES[0])
    with temporary_modules({"liger_kernel.chunked_loss.fused_linear_ppo": ppo}, only_if_missing=False):
        grpo = load_source(f"{_PRIVATE}.grpo_loss", root / _SOURCES[1])
    return {"ppo": ppo, "grpo": grpo}


def availability() -> str | None:
    """None when the installed Liger GRPO loss can be driven, else a one-line reason."""
    return load_failure("liger_kernel", _INSTALL, _modules)


# ----------------------------------------------------------------------------------------------
# Modes


def loss_kwargs(mode: str | Mode, variant) -> dict[str, object]:
    """``LigerFusedLinearGRPOLoss(...)`` arguments that run ``variant`` in ``mode`` (ValueError for a
    variant Liger cannot express there). Liger's clip is ``[1 - epsilon_low, 1 + epsilon_high]``
    except for cispo, whose ``epsilon_high`` is the cap itself; ``delta`` caps the ratio (the dual
    clip of A < 0); ``beta`` weighs the k3 term; ``max_completion_length`` is Dr. GRPO's L_max."""
    m = find_mode(MODES, mode, "Liger")
    v = variant
    m.check_shape(v, "Liger")
    if v.kl_coef > 0 and v.kl_estimator != "k3":
        raise ValueError(f"variant.kl_estimator: Liger's only KL is k3, got {v.kl_estimator!r}")
    if v.entropy_coef or v.behavior_correction != "none":
        raise ValueError("variant.entropy_coef / behavior_correction: not in Liger's GRPO loss")
    config = m.framework_config
    loss_type = config["loss_type"]
    kwargs: dict[str, object] = {
        "loss_type": loss_type,
        "importance_sampling_level": config.get("importance_sampling_level", "token"),
        "beta": float(v.kl_coef),
        "use_bias_correction_kl": bool(config.get("use_bias_correction_kl", False)),
    }
    if loss_type == "cispo":
        if v.eps_low is not None or v.eps_high is None:
            raise ValueError("variant.eps_low / eps_high: Liger's cispo caps the ratio above only")
        kwargs.update(epsilon_low=0.0, epsilon_high=1.0 + v.eps_high)
    elif loss_type == "sapo":
        kwargs.update(sapo_temperature_pos=v.tau_pos, sapo_temperature_neg=v.tau_neg)
    else:
        if v.eps_low is None or v.eps_high is None:
            raise ValueError(f"variant.eps_low / eps_high: Liger's {loss_type} clips on both sides")
        kwargs.update(epsilon_low=v.eps_low, epsilon_high=v.eps_high, delta=v.dual_clip)
    if loss_type == "dr_grpo":
        if v.max_length is None:
            raise ValueError("variant.max_length (Liger's max_completion_length) is required by dr_grpo")
        kwargs["max_completion_length"] = int(v.max_length)
    if loss_type == "luspo" and (v.aggregation != "seq_mean_token_sum" or v.kl_coef > 0):
        raise ValueError("variant: Liger's luspo is aggregation 'seq_mean_token_sum' with no KL term")
    return kwargs


# ----------------------------------------------------------------------------------------------
# Target


def _parameters(fn) -> set[str]:
    return set(inspect.signature(fn).parameters)


@contextlib.contextmanager
def _given_logprobs(base) -> Iterator[None]:
    """While the block runs, ``base.chunk_forward`` returns the log-probs the kit gives
    (``input_chunk[..., 0]``) in float32, the dtype of Liger's own log-softmax; the gradient flows back
    to ``input_chunk``. From 0.8.0 ``chunk_forward(input_chunk, weight, selected_token_ids, ...)``
    returns the selected log-probs; 0.7.0's ``chunk_forward(input_chunk, weight, bias, temperature)``
    returns ``(log_softmax over the vocabulary, logits)``, gathered at ``selected_token_ids`` by the
    loss: a one-token vocabulary (``input_chunk`` itself, the ids 0) gives the same."""
    import torch

    original = base.__dict__["chunk_forward"]

    def given(input_chunk, weight, selected_token_ids, bias=None, temperature=1.0):
        # 0.8.0 differentiates the weight whatever it requires (fused_linear_ppo.py:306-309): it enters
        # the graph with a zero factor (0-dim: the log-probs stay float32 and unchanged)
        return input_chunk[..., 0].to(torch.float32) + 0.0 * weight.sum()

    def given_vocabulary(input_chunk, weight, bias=None, temperature=1.0):
        log_probs = input_chunk.to(torch.float32)
        return log_probs, log_probs

    selective = "selected_token_ids" in _parameters(original.__func__)
    base.chunk_forward = staticmethod(given if selective else given_vocabulary)
    try:
        yield
    finally:
        base.chunk_forward = original


def _release_kwargs(cls, kwargs: dict, mode: Mode) -> dict:
    """``kwargs`` for the installed release's ``LigerFusedLinearGRPOLoss``: an argument it does not
    take (``delta`` and ``use_bias_correction_kl`` arrived in 0.8.0) is dropped at its default (None,
    False); a mode that needs it is refused in one line."""
    accepted = _parameters(cls.__init__)
    missing = {k: v for k, v in kwargs.items() if k not in accepted}
    needed = sorted(k for k, v in missing.items() if v not in (None, False))
    if needed:
        raise ValueError(f"LigerFusedLinearGRPOLoss of liger-kernel {distribution_version('liger-kernel')} "
                         f"has no {', '.join(needed)}: mode {mode.name!r} needs a later release")
    return {k: v for k, v in kwargs.items() if k in accepted}


def _policy_target(m: Mode, variant) -> tuple[Callable, Callable]:
    import torch

    mods = _modules()
    cls = mods["grpo"].LigerFusedLinearGRPOLoss
    kwargs = _release_kwargs(cls, loss_kwargs(m, variant), m)
    loss_fn = cls(compiled=False, chunk_size=1, use_ref_model=variant.kl_coef > 0, **kwargs)
    base = mods["grpo"].LigerFusedLinearPPOBase
    # num_items_in_batch (the step's tokens, 0.8.4 on); before, dapo / cispo divide by the call's own
    items = "num_items_in_batch" in _parameters(cls.forward)
    global_tokens = kwargs["loss_type"] in ("dapo", "cispo") and items

    def adapter(fn, call):
        n, width = call.mask.shape
        hidden = call.logp.unsqueeze(-1)  # [N, T, 1]: the log-probs as a hidden size of 1
        weight = torch.zeros((1, 1), dtype=call.logp.dtype, device=call.logp.device)
        ids = torch.zeros((n, width), dtype=torch.long, device=call.logp.device)
        count = int(getattr(call, "micro_batch_count", 1) or 1)
        tokens = getattr(call, "global_tokens", 0) or int(call.mask.sum())
        if call.normalizer is not None:
            tokens = call.normalizer
        extra = {"num_items_in_batch": tokens if global_tokens else None} if items else {}
        with _given_logprobs(base):
            loss, _metrics = fn(
                hidden, weight, ids, call.mask.to(torch.long), call.advantages,
                ref_per_token_logps=call.ref_logp if variant.kl_coef > 0 else None,
                old_per_token_logps=call.old_logp, **extra,
            )
        return loss if global_tokens else loss / count

    adapter.scaled_for_accumulation = True
    return loss_fn, adapter


def target(mode: Mode, variant) -> tuple[Callable, Callable]:
    """``(fn, adapter)``: ``fn`` is a constructed ``LigerFusedLinearGRPOLoss`` for ``mode`` and
    ``variant``, ``adapter(fn, call)`` its loss of that (micro-)batch, already scaled for gradient
    accumulation."""
    if mode.kind != "policy_loss":
        raise ValueError(f"Liger has no {mode.kind} mode: {next(iter(UNSUPPORTED[mode.kind].values()))}")
    return _policy_target(mode, variant)


# ----------------------------------------------------------------------------------------------
# Kinds of the registry (refimpl/conformance/kinds/): the fused lm head + loss itself, hidden states in.

KIND_MODES = (
    Mode("fused_linear/ppo", kind="fused_linear",
         framework_config={"loss_type": "dapo", "beta": 0.0, "chunk_size": "rows // chunks"},
         convention={"fused_weight_grad": "accumulated"},
         description="LigerFusedLinearGRPOLoss(beta=0, epsilon_low = epsilon_high = eps, loss_type='dapo', "
         "compiled=False) on the hidden states and the lm-head weight: torch.chunk of the rows "
         "(fused_linear_ppo.py:381), each chunk's log-probs by _ChunkedSelectiveLogProbFunction (float32 "
         "log-softmax) and its gradients at once; grad_weight = torch.zeros_like(weight) (line 255) "
         "accumulates the chunks' weight gradients in the weight's dtype (line 360)"),
)
KIND_UNSUPPORTED: dict[str, dict[str, str]] = {}


def kind_target(mode: Mode) -> tuple[Callable, Callable]:
    """``(fn, adapter)`` for a registry-kind mode: ``LigerFusedLinearGRPOLoss`` itself (no log-probs
    handed in: its own lm-head path), ``chunk_size`` such that Liger makes the case's row chunks."""
    import torch

    grpo = _modules()["grpo"]

    def fused(fn, hidden, weight, tokens, old_logp, advantages, mask, *, eps, chunks):
        loss_fn = fn(beta=0.0, use_ref_model=False, compiled=False,
                     chunk_size=max(1, hidden.shape[0] // chunks), epsilon_low=eps, epsilon_high=eps,
                     loss_type="dapo")
        return loss_fn(hidden, weight, tokens, mask.to(torch.long), advantages,
                       old_per_token_logps=old_logp)[0]

    return grpo.LigerFusedLinearGRPOLoss, fused


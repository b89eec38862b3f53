"""Kind ``fused_linear``: the policy loss computed from the final hidden states through the output
layer (the "lm head") in chunks of rows, as fused linear + loss kernels do (Liger-Kernel's
``LigerFusedLinearGRPOLoss``): the ``[N, T, V]`` logits are never all in memory, and the gradients
w.r.t. the hidden states and the lm-head weight are accumulated chunk by chunk.

The function is called as ``fn(hidden [N, T, d], weight [V, d], tokens [N, T], old_logp [N, T],
advantages [N], mask [N, T], *, eps, chunks) -> scalar loss`` and judged by its value and its
gradients in ``hidden`` and ``weight`` (autograd through the function) against the reference in
float64: ``refimpl.losses.lm_head.lm_head_logprobs`` (kl.md eqs. (14')-(15'): the log-softmax of
``hidden @ weight.T`` at the sampled tokens) followed by ``refimpl.losses.policy_loss`` with PPO's
clipped surrogate, ``eps`` on both sides, a token mean over the batch (policy_losses.md eqs. (6),
(10)). ``chunks`` is the number of row chunks the function may use (``torch.chunk`` of the rows):
the spec's loss and gradients do not depend on it.

Inputs are exact in their dtype and so are their logits (entries in {-1, -1/2, 0, 1/2, 1}, d = 4:
every logit is a multiple of 1/4 in [-4, 4], exact in bf16), so a bf16 result of a correct
implementation carries one rounding of each output (its own dtype's) and float32 arithmetic
before it: its tolerance is ``2 u_bf16 = 2^-7`` relative to the largest entry (``float32_rtol``).
A weight gradient summed chunk by chunk in bf16 rounds once per chunk: over 64 chunks it departs
(flag ``fused_weight_grad="accumulated"``, which reproduces that sum exactly).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from refimpl.losses import get_preset, policy_loss
from refimpl.losses.lm_head import lm_head_logprobs

from .base import FLOAT32_RTOL, Expected, Kind, KindCase, check_choices

__all__ = ["FusedLinearFlags", "FUSED_LINEAR", "fused_linear_cases", "expected_fused_linear"]

#: the unit roundoff of bfloat16 (8 significant bits)
_BF16_U = 2.0**-8


@dataclass(frozen=True)
class FusedLinearFlags:
    """How a fused linear + loss function accumulates (defaults: the spec).

    fused_weight_grad: "exact" (the weight gradient rounded once to the weight's dtype) |
        "accumulated" (each row chunk's weight gradient rounded to the weight's dtype and summed into
        an accumulator of that dtype, one rounding per chunk: Liger-Kernel's
        ``grad_weight = torch.zeros_like(weight)`` and ``grad_weight.add_(...)``).
    """

    fused_weight_grad: str = "exact"

    def __post_init__(self) -> None:
        check_choices(self, {"fused_weight_grad": ("exact", "accumulated")})


def fused_linear_cases(seed: int = 0) -> list[KindCase]:
    """Row chunks (one, one per row, uneven), empty rows and bf16 inputs with one chunk and 64 chunks."""
    g = torch.Generator().manual_seed(seed + 503)
    levels = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0], dtype=torch.float64)
    vocab, d = 8, 4

    def case(name, lengths, width, chunks, dtype=torch.float32, note=""):
        n = len(lengths)
        pick = lambda *shape: levels[torch.randint(0, 5, shape, generator=g)]  # noqa: E731
        hidden, weight = pick(n, width, d), pick(vocab, d)
        tokens = torch.randint(0, vocab, (n, width), generator=g)
        mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
        logp = torch.log_softmax(hidden @ weight.T, dim=-1).gather(-1, tokens[..., None])[..., 0]
        # log-ratios of 0.05 (inside the clip band) and 0.5 (outside), either sign: no gate near a bound
        shift = torch.tensor([-0.5, -0.05, 0.05, 0.5], dtype=torch.float64)[torch.randint(0, 4, (n, width),
                                                                                             generator=g)]
        old = (logp - shift).float().double()
        advantages = torch.tensor([-1.0, -0.5, 0.5, 1.0], dtype=torch.float64)[torch.randint(0, 4, (n,),
                                                                                              generator=g)]
        inputs = {"hidden": hidden.to(dtype), "weight": weight.to(dtype), "tokens": tokens,
                  "old_logp": old.float(), "advantages": advantages.float(), "mask": mask}
        return KindCase(name, 0, inputs, {"eps": 0.2, "chunks": chunks}, note)

    return [
        case("one_chunk", [3, 2, 3, 1], 3, 1, note="float32, the four rows in one chunk"),
        case("row_chunks", [3, 2, 3, 1], 3, 4, note="float32, one chunk per row"),
        case("uneven_chunks", [3, 1, 2, 3, 2], 3, 2, note="float32, five rows in chunks of 3 and 2"),
        case("empty_rows", [3, 0, 2, 0], 3, 4, note="float32, rows 1 and 3 (whole chunks) have no token"),
        case("bf16_one_chunk", [2] * 64, 2, 1, torch.bfloat16, note="bf16, 64 rows in one chunk"),
        case("bf16_row_chunks", [2] * 64, 2, 64, torch.bfloat16,
             note="bf16, 64 chunks of one row: a weight gradient summed in bf16 rounds 64 times"),
    ]


def _variant(eps: float):
    return dataclasses.replace(get_preset("ppo"), eps_low=eps, eps_high=eps)


def _loss(hidden, weight, x, rows, eps, normalizer):
    logp = lm_head_logprobs(hidden[rows], weight, x["tokens"][rows])
    return policy_loss(logp, x["old_logp"][rows].double(), x["advantages"][rows].double(), x["mask"][rows],
                       _variant(eps), normalizer=normalizer)[0]


def expected_fused_linear(case: KindCase, flags: FusedLinearFlags) -> dict[str, Expected]:
    x, eps = case.inputs, case.params["eps"]
    hidden = x["hidden"].double().requires_grad_(True)
    weight = x["weight"].double().requires_grad_(True)
    everything = torch.arange(hidden.shape[0], device=hidden.device)
    loss = _loss(hidden, weight, x, everything, eps, None)
    grad_hidden, grad_weight = torch.autograd.grad(loss, (hidden, weight))
    if flags.fused_weight_grad == "accumulated":  # one rounding to the weight's dtype per row chunk
        dtype, tokens = x["weight"].dtype, float(max(int(x["mask"].sum()), 1))
        grad_weight = torch.zeros_like(grad_weight)
        for rows in torch.chunk(everything, case.params["chunks"]):
            w = x["weight"].double().requires_grad_(True)
            (part,) = torch.autograd.grad(_loss(hidden.detach(), w, x, rows, eps, tokens), w)
            grad_weight = (grad_weight + part.to(dtype).double()).to(dtype).double()
    return {"loss": Expected(loss.detach()), "grad_hidden": Expected(grad_hidden, gradient=True),
            "grad_weight": Expected(grad_weight, gradient=True)}


def _call(fn, adapter, case: KindCase) -> dict:
    x = {k: v.clone() for k, v in case.inputs.items()}
    hidden, weight = x["hidden"].requires_grad_(True), x["weight"].requires_grad_(True)
    args = (hidden, weight, x["tokens"], x["old_logp"], x["advantages"], x["mask"])
    params = {"eps": case.params["eps"], "chunks": case.params["chunks"]}
    out = adapter(fn, *args, **params) if adapter is not None else fn(*args, **params)
    loss = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(f"returned {type(loss).__name__}, expected a scalar loss tensor")
    grads = (torch.autograd.grad(loss.sum(), (hidden, weight), allow_unused=True) if loss.requires_grad
             else (None, None))
    return {"loss": loss.detach().reshape(()),
            **{name: torch.zeros_like(t) if g is None else g
               for name, t, g in (("grad_hidden", hidden, grads[0]), ("grad_weight", weight, grads[1]))}}


def _tolerance(case: KindCase) -> float:
    """A bf16 case: one bf16 rounding of each output after float32 arithmetic, 2 u_bf16 (the inputs and
    their logits are exact, module docstring); float32: the kinds' ``FLOAT32_RTOL``."""
    return 2 * _BF16_U if case.inputs["hidden"].dtype == torch.bfloat16 else FLOAT32_RTOL


FUSED_LINEAR = Kind(
    name="fused_linear",
    title="fused lm head + policy loss (row chunks)",
    signature="fn(hidden [N, T, d], weight [V, d], tokens [N, T], old_logp [N, T], advantages [N], "
    "mask [N, T] bool, *, eps, chunks) -> scalar loss",
    flags=FusedLinearFlags,
    cases=lambda seed=0: fused_linear_cases(seed),
    expected=expected_fused_linear,
    call=_call,
    float32_rtol=_tolerance,
)

"""Liger-Kernel's standalone reproductions beyond repro_bodies.py's first ones: ``liger_bodies(liger,
silent)`` returns them keyed as ``BODIES``, given repro_bodies.py's loader of the chunked loss (``grpo``:
chunked_loss/grpo_loss.py executed with its base class) and its warnings-as-errors preamble.

The Triton path (liger_kernel/ops/grpo_loss.py) imports triton at its top and its kernels need a GPU (or
``TRITON_INTERPRET=1``): its reduction ``_reduce_loss``, plain torch, is executed from the installed file
alone (its ``def`` parsed with ``ast``), on the per-token buffer its sequence-level kernel writes."""

from __future__ import annotations

__all__ = ["liger_bodies"]

#: ops/grpo_loss.py's reduction, executed from the installed file without its triton import
_TRITON_REDUCE = """\
import ast  # noqa: E402

path = pathlib.Path(next(iter(importlib.util.find_spec("liger_kernel").submodule_search_locations)))
path = path / "ops" / "grpo_loss.py"
tree = ast.parse(path.read_text())
wanted = [node for node in tree.body if isinstance(node, ast.FunctionDef)
          and node.name in ("_compute_dapo_normalizer", "_reduce_loss")]
namespace = {"torch": torch}
exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)
reduce_loss = namespace["_reduce_loss"]
"""


def liger_bodies(liger: str, silent: str) -> dict[tuple[str, str], str]:
    """The bodies, keyed by (framework, finding key)."""
    return {
        ("liger", "luspo_token_level"): liger + """\
mask = torch.tensor([[1.0, 0.0, 0.0]])  # a response of one token in a batch 3 wide
logp = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)  # ratio 1 everywhere, A = 1
loss, _ = grpo.LigerFusedLinearGRPOFunction.ppo_loss_fn(logp, mask, torch.tensor([1.0]), mask,
                                                   old_per_token_logps=logp.detach(), beta=0.0,
                                                   loss_type="luspo", importance_sampling_level="token")
grad = torch.autograd.grad(loss, logp)[0]
verdict("Liger ppo_loss_fn, loss_type luspo with importance_sampling_level 'token' (chunked_loss/"
        "grpo_loss.py:245: the [B, T] loss times each row's length, summed over every position and divided "
        "by B x T): d loss / d logp", grad.tolist(),
        "[[-1.0, 0.0, 0.0]] (-A r on the response's token; the padding gets nothing)",
        bool(grad[0, 1] != 0.0 and abs(grad[0, 0].item() + 1.0) > 1e-6))
""",
        ("liger", "triton_luspo"): _TRITON_REDUCE + """\
# the sequence-level kernel (_grpo_loss_fwd_kernel_seq, ops/grpo_loss.py:232) stores the row's sequence
# term f_i at every token of the response and returns early at a masked one (the buffer is zeros, :702):
# two rows of 2 and 4 tokens in a width of 4, each with f_i = -A s_i = -1 (A = 1, s_i = 1)
mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
per_token = -1.0 * mask
value = reduce_loss(per_token, mask, "luspo", None, 2, 4).item()
verdict("Liger's Triton GRPO loss, loss_type luspo, importance_sampling_level 'sequence' (ops/"
        "grpo_loss.py:597, (per_token_loss * T_i).mean() over B x L: sum T_i^2 f_i / (B L); the backward, "
        ":925-928, scales by T_i / (B L) likewise): the loss", value,
        "-3.0 (LUSPO, and Liger's chunked path: sum T_i f_i / B, each sequence term times its length)",
        abs(value + 3.0) > 1e-6)
""",
        ("liger", "config:advantages"): silent + liger + """\
torch.manual_seed(0)
hidden, weight = torch.randn(2, 3, 4), torch.randn(5, 4)  # two rows of 3 tokens, an lm head of 5 tokens
ids, mask = torch.tensor([[1, 3, 0], [2, 4, 1]]), torch.ones(2, 3, dtype=torch.long)
adv = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # per-token advantages [B, T]: accepted
got = {}
for chunk_size in (1, 2):  # one row per chunk (the default), then both rows in one chunk
    h = hidden.clone().requires_grad_(True)
    loss_fn = grpo.LigerFusedLinearGRPOLoss(beta=0.0, use_ref_model=False, compiled=False,
                                            chunk_size=chunk_size)
    loss, _ = loss_fn(h, weight, ids, mask, adv)  # no old log-probs: ratio 1, dapo: -sum A / 6
    got[chunk_size] = (loss.item(), torch.autograd.grad(loss, h)[0][1].abs().sum().item())
verdict("Liger LigerFusedLinearGRPOLoss (dapo) given per-token advantages [B, T] = [[1, 1, 1], [0, 0, 0]] "
        "at ratio 1 (chunked_loss/grpo_loss.py:199: advantages.unsqueeze(1) broadcasts against the chunk's "
        "rows): loss and |gradient| of row 2 (A = 0) with chunk_size 1 / 2",
        f"{got[1]} / {got[2]} (no error, no warning)",
        "-0.5 and 0.0 for every chunk_size (or an error: advantages are documented as (batch_size,))",
        abs(got[2][0] + 1.0) < 1e-6 and got[2][1] > 0.0)
""",
        ("liger", "config:epsilon_high"): silent + liger + """\
loss_fn = grpo.LigerFusedLinearGRPOLoss(loss_type="cispo", compiled=False)  # accepted: no error, no warning
logp = torch.tensor([[-1.0]], requires_grad=True)  # old -1: ratio 1, A = 1
one = torch.ones(1, 1)
loss, _ = grpo.LigerFusedLinearGRPOFunction.ppo_loss_fn(logp, one, torch.tensor([1.0]), one,
                                                   old_per_token_logps=torch.tensor([[-1.0]]), beta=0.0,
                                                   epsilon_high=loss_fn.epsilon_high, loss_type="cispo")
grad = torch.autograd.grad(loss, logp)[0].item()
verdict("Liger LigerFusedLinearGRPOLoss(loss_type='cispo') without epsilon_high (chunked_loss/"
        f"grpo_loss.py:80: the cap is epsilon_high itself, default {loss_fn.epsilon_high}): accepted; "
        "d loss / d logp at ratio 1, A = 1", f"{grad} (every weight capped at {loss_fn.epsilon_high})",
        "-1.0 (a cap >= 1, e.g. the docstring's 5.0, keeps the weight 1 of an on-policy token)",
        abs(grad + 1.0) > 1e-6)
""",
        ("liger", "config:epsilon_low"): silent + liger + """\
loss_fn = grpo.LigerFusedLinearGRPOLoss(epsilon_low=-0.1, compiled=False)  # accepted: no error, no warning
logp = torch.tensor([[-1.0]], requires_grad=True)  # old -1: ratio 1, A = -1
one = torch.ones(1, 1)
loss, _ = grpo.LigerFusedLinearGRPOFunction.ppo_loss_fn(logp, one, torch.tensor([-1.0]), one,
                                                   old_per_token_logps=torch.tensor([[-1.0]]), beta=0.0,
                                                   epsilon_low=loss_fn.epsilon_low,
                                                   epsilon_high=loss_fn.epsilon_high, loss_type="dapo")
grad = torch.autograd.grad(loss, logp)[0].item()
verdict("Liger LigerFusedLinearGRPOLoss(epsilon_low=-0.1) (chunked_loss/grpo_loss.py:92: the band "
        "[1 - epsilon_low, 1 + epsilon_high] = [1.1, 1.2] excludes ratio 1): accepted; d loss / d logp of "
        "an on-policy token (ratio 1), A = -1", f"{grad} (clipped up to 1.1: no gradient)",
        "1.0 (-A r: an on-policy token is inside any clip band with epsilon_low >= 0)", grad == 0.0)
""",
    }

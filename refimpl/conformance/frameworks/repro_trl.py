"""TRL's standalone reproductions of its trainer findings (trl/findings.py): ``trl_bodies(trl, silent)``
returns them keyed as repro_bodies.py's ``BODIES``, given its preamble that builds a stand-in
``GRPOTrainer`` (``trl``) and the one that turns warnings into errors (``silent``)."""

from __future__ import annotations

__all__ = ["trl_bodies"]

# one call of GRPOTrainer._compute_loss on the trainer of the preamble: ``grad_of(logp, old, adv, mask)``
_CALL = """\
def grad_of(logp, old, adv, mask, num_items=None):
    logp = logp.clone().requires_grad_(True)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
    n, width = mask.shape
    empty = torch.zeros((n, 0), dtype=torch.long)
    ids = torch.zeros((n, width), dtype=torch.long)
    inputs = {"prompt_ids": empty, "prompt_mask": empty, "completion_ids": ids,
              "completion_mask": mask.long(), "advantages": adv, "old_per_token_logps": old,
              "num_items_in_batch": torch.tensor(int(mask.sum()) if num_items is None else num_items)}
    loss = GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
    return loss, torch.autograd.grad(loss, logp)[0]


"""

# TRL's inline group advantages (grpo_trainer.py:2761-2788, the default multi_objective_aggregation), run
# from the installed file: the statements of that branch, parsed with ast, executed on given rewards
_ADVANTAGES = """\
import ast  # noqa: E402

from trl.trainer.utils import nanstd  # noqa: E402  (grpo_trainer.py's own)

source = pathlib.Path(next(iter(importlib.util.find_spec("trl").submodule_search_locations))) / "trainer"
source = source / "grpo_trainer.py"
branch = next(node for node in ast.walk(ast.parse(source.read_text())) if isinstance(node, ast.If)
              and isinstance(node.test, ast.Compare)
              and getattr(node.test.left, "attr", "") == "multi_objective_aggregation"
              and getattr(node.test.comparators[0], "value", "") == "sum_then_normalize")
code = compile(ast.Module(body=branch.body, type_ignores=[]), str(source), "exec")


def advantages(rewards, num_generations, scale_rewards="group"):
    namespace = {"torch": torch, "nanstd": nanstd, "rewards_per_func": rewards[:, None], "device": "cpu",
                 "unscorable_mask": torch.zeros(len(rewards), dtype=torch.bool),
                 "num_generations": num_generations,
                 "self": SimpleNamespace(reward_weights=torch.ones(1), scale_rewards=scale_rewards)}
    exec(code, namespace)
    return namespace["advantages"]


"""


def trl_bodies(trl: str, silent: str) -> dict[tuple[str, str], str]:
    """TRL's trainer findings' script bodies; ``trl``, ``silent``: repro_bodies.py's preambles."""
    return {
        ("trl", "empty_rows"): trl + _CALL + """\
trainer.loss_type = "grpo"
logp = torch.full((2, 2), -1.0)  # ratio 1; row 1 truncated: mask_truncated_completions zeroed its mask
mask = torch.tensor([[1, 1], [0, 0]])
loss, grad = grad_of(logp, logp.clone(), torch.tensor([1.0, -1.0]), mask)
verdict("TRL GRPOTrainer._compute_loss, loss_type grpo (trainer/grpo_trainer.py:3154), two rows, the second "
        "emptied by mask_truncated_completions: d loss / d logp of row 0", grad[0].tolist(),
        "[-0.5, -0.5] (the mean over the one row with tokens)", abs(grad[0, 0].item() + 0.25) < 1e-7)
""",
        ("trl", "constant_group_rounding"): trl + _ADVANTAGES + """\
rewards = torch.full((8,), 1000.1)  # one group of 8 equal rewards (e.g. a reward with an offset)
got = advantages(rewards, 8)
verdict("TRL GRPOTrainer's group advantages (trainer/grpo_trainer.py:2787, scale_rewards 'group'), a group "
        "of 8 rewards all 1000.1: the largest |advantage|", got.abs().max().item(),
        "0.0 (a group without variance has no signal)", got.abs().max().item() > 0.1)
""",
        ("trl", "generation_batch_normalizer"): trl + _CALL + """\
# a generation batch of 4 tokens over two optimizer steps (steps_per_generation=2, no accumulation):
# the step below holds 1 of them; dapo divides by num_items_in_batch * 1 / 2 = 2, not by its 1 token
trainer.args.steps_per_generation = 2
logp = torch.full((1, 1), -1.0)
loss, grad = grad_of(logp, logp.clone(), torch.tensor([1.0]), torch.ones(1, 1), num_items=4)
verdict("TRL GRPOTrainer._compute_loss, loss_type dapo (trainer/grpo_trainer.py:3172), "
        "steps_per_generation 2, gradient_accumulation_steps 1, a step of 1 token in a generation batch "
        "of 4: d loss / d logp",
        grad.item(), "-1.0 (the step's token mean)", abs(grad.item() + 0.5) < 1e-7)
""",
        ("trl", "rloo_ratio_overflow"): trl + """\
from trl.trainer.rloo_trainer import RLOOTrainer  # noqa: E402

rloo = object.__new__(RLOOTrainer)  # the attributes RLOOTrainer.__init__ sets that _compute_loss reads
rloo.epsilon_low = rloo.epsilon_high = 0.2
rloo.aux_loss_enabled, rloo.model, rloo.accelerator = False, trainer.model, trainer.accelerator
rloo._metrics = trainer._metrics
logp = torch.full((1, 30), -1.0, requires_grad=True)  # 30 tokens, each 3 nats above the old policy
rloo._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
empty, ids = torch.zeros((1, 0), dtype=torch.long), torch.zeros((1, 30), dtype=torch.long)
inputs = {"prompt_ids": empty, "prompt_mask": empty, "completion_ids": ids,
          "completion_mask": torch.ones_like(ids), "old_logps": torch.tensor([-120.0]),
          "advantages": torch.tensor([1.0])}  # the sum of the log-ratios: 90
grad = torch.autograd.grad(RLOOTrainer._compute_loss(rloo, rloo.model, inputs), logp)[0]
verdict("TRL RLOOTrainer._compute_loss (trainer/rloo_trainer.py:1828), float32 sequence log-ratio 90, A = 1 "
        "(the clip gate closed): d loss / d logp of the first tokens", grad[0, :3].tolist(),
        "[0.0, 0.0, 0.0] (the gate is closed)", bool(torch.isnan(grad).all()))
""",
        ("trl", "config:sapo_temperature_neg"): silent + trl + _CALL + """\
import tempfile  # noqa: E402

with tempfile.TemporaryDirectory() as out:  # accepted: no error, no warning
    trainer.args = trl.GRPOConfig(output_dir=out, loss_type="sapo", sapo_temperature_neg=0.0,
                                  report_to="none", use_cpu=True, bf16=False, per_device_train_batch_size=2,
                                  num_generations=2)
trainer.loss_type = "sapo"
logp = torch.full((1, 1), -1.0)
loss, grad = grad_of(logp, logp.clone(), torch.tensor([-1.0]), torch.ones(1, 1))
verdict("TRL GRPOConfig(loss_type='sapo', sapo_temperature_neg=0.0) (trainer/grpo_trainer.py:3123): "
        "accepted; loss and d loss / d logp of an on-policy token with A = -1",
        f"loss {loss.item()}, gradient {grad.item()}",
        "an error: SAPO's temperature must be > 0", not bool(torch.isfinite(grad).all()))
""",
        ("trl", "config:epsilon"): silent + trl + _CALL + """\
import tempfile  # noqa: E402

with tempfile.TemporaryDirectory() as out:  # accepted: no error, no warning
    args = trl.GRPOConfig(output_dir=out, epsilon=-0.1, report_to="none", use_cpu=True, bf16=False,
                          per_device_train_batch_size=2, num_generations=2)
trainer.epsilon_low = args.epsilon  # GRPOTrainer.__init__ (grpo_trainer.py:945-946)
trainer.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
logp = torch.full((1, 1), -1.0)
loss, grad = grad_of(logp, logp.clone(), torch.tensor([1.0]), torch.ones(1, 1))
verdict("TRL GRPOConfig(epsilon=-0.1) (trainer/grpo_trainer.py:3113: the band [1.1, 0.9]): accepted; "
        "d loss / d logp of an on-policy token with A = 1, loss_type dapo", grad.item(),
        "-1.0 (an on-policy token is inside any clip band)", grad.item() == 0.0)
""",
    }

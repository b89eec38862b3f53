"""TRL's standalone reproductions of its trainer findings (trl/findings.py): ``trl_bodies(trl, silent)``
returns them keyed as repro_bodies.py's ``BODIES``, given its preamble that builds a stand-in
``GRPOTrainer`` (``trl``) and the one that turns warnings into errors (``silent``)."""

from __future__ import annotations

from .repro_trl_sweep import SDPO_ADVANTAGES, trl_sweep_bodies

_NAMESPACE = "from types import SimpleNamespace  # noqa: E402\n"

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

def _branch_advantages(aggregation: str) -> str:
    """TRL's inline group advantages for one ``multi_objective_aggregation`` (grpo_trainer.py:2761-2800:
    "sum_then_normalize", the default, or "normalize_then_sum"), run from the installed file: the
    statements of that branch, parsed with ast, executed on given rewards as ``advantages(rewards,
    num_generations, scale_rewards)``."""
    return """\
import ast  # noqa: E402

from trl.trainer.utils import nanstd  # noqa: E402  (grpo_trainer.py's own)

source = pathlib.Path(next(iter(importlib.util.find_spec("trl").submodule_search_locations))) / "trainer"
source = source / "grpo_trainer.py"
branch = next(node for node in ast.walk(ast.parse(source.read_text())) if isinstance(node, ast.If)
              and isinstance(node.test, ast.Compare)
              and getattr(node.test.left, "attr", "") == "multi_objective_aggregation"
              and getattr(node.test.comparators[0], "value", "") == "AGGREGATION")
code = compile(ast.Module(body=branch.body, type_ignores=[]), str(source), "exec")


def advantages(rewards, num_generations, scale_rewards="group"):
    namespace = {"torch": torch, "nanstd": nanstd, "rewards_per_func": rewards[:, None], "device": "cpu",
                 "unscorable_mask": torch.zeros(len(rewards), dtype=torch.bool),
                 "num_generations": num_generations,
                 "self": SimpleNamespace(reward_weights=torch.ones(1), reward_funcs=[None],
                                         scale_rewards=scale_rewards)}
    exec(code, namespace)
    return namespace["advantages"]


""".replace("AGGREGATION", aggregation)


_ADVANTAGES = _branch_advantages("sum_then_normalize")
_NORMALIZE_THEN_SUM = _branch_advantages("normalize_then_sum")

# the experimental GMPOTrainer on the preamble's stand-in: GMPOTrainer.__init__ only calls GRPOTrainer's
_GMPO = """\
from trl.experimental.gmpo import GMPOConfig, GMPOTrainer  # noqa: E402

gmpo = object.__new__(GMPOTrainer)
gmpo.__dict__.update(trainer.__dict__)  # the attributes GRPOTrainer.__init__ sets that _compute_loss reads
gmpo.epsilon_low = gmpo.epsilon_high = 0.4  # GMPOConfig's epsilon (log space)


def gmpo_loss(logp, entropy, adv, **extra):
    logp = logp.clone().requires_grad_(True)
    gmpo._get_per_token_logps_and_entropies = lambda *a, **k: (logp, entropy, None)
    n, width = logp.shape
    empty, ids = torch.zeros((n, 0), dtype=torch.long), torch.zeros((n, width), dtype=torch.long)
    inputs = {"prompt_ids": empty, "prompt_mask": empty, "completion_ids": ids,
              "completion_mask": torch.ones_like(ids), "advantages": adv,
              "old_per_token_logps": logp.detach().clone(), **extra}  # ratio 1
    loss = GMPOTrainer._compute_loss(gmpo, gmpo.model, inputs)
    return loss, torch.autograd.grad(loss, logp)[0]


"""

# the experimental AsyncGRPOTrainer.compute_loss on one packed row: the model (a fused-head forward over the
# packed tokens) returns the given log-probs; the collator's inputs for one completion of n tokens
_ASYNC = """\
import collections  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from trl.experimental.async_grpo.async_grpo_trainer import AsyncGRPOTrainer  # noqa: E402


def async_grad(log_probs, old, adv, accumulation_steps):
    leaf = log_probs.clone().requires_grad_(True)
    n = leaf.numel()
    trainer = object.__new__(AsyncGRPOTrainer)  # the attributes __init__ sets that compute_loss reads
    trainer.epsilon_low = trainer.epsilon_high = 0.2
    trainer.aux_loss_enabled = False
    trainer.accelerator = SimpleNamespace(num_processes=1, reduce=lambda t, reduction="sum": t,
                                          gather=lambda t: t)
    trainer.current_gradient_accumulation_steps = accumulation_steps
    trainer._metrics = {"train": collections.defaultdict(list)}
    trainer._step_forward_tokens = trainer._step_trained_tokens = trainer._step_samples = 0.0
    trainer._step_seq_len_weighted = trainer._step_forward_s = 0.0

    def model(**kwargs):
        return SimpleNamespace(log_probs=leaf.view(1, n), entropy=torch.zeros(1, n))

    row = torch.arange(n).view(1, n)
    unused = torch.full((1, 1), -1)
    inputs = {"attention_mask": torch.ones(1, n, dtype=torch.long), "token_index": row,
              "input_ids": torch.zeros(1, n, dtype=torch.long), "position_ids": row,
              "shift_labels": torch.zeros(1, n, dtype=torch.long), "old_log_probs": old.view(1, n),
              "advantages": adv.view(1, n), "segment_id": torch.zeros(1, n, dtype=torch.long),
              "tree_kv_index": unused, "tree_cu_seqlens_q": unused, "tree_cu_seqlens_k": unused,
              "tree_max_seqlens": torch.tensor([[n, n]]),
              "global_n_tokens": torch.tensor([float(n)]),  # the collator's count: this micro-batch's tokens
              "global_n_forward_tokens": torch.tensor([float(n)]), "mean_seq_len": torch.tensor([float(n)])}
    loss = AsyncGRPOTrainer.compute_loss(trainer, model, inputs)
    return torch.autograd.grad(loss, leaf)[0]


"""


def trl_bodies(trl: str, silent: str) -> dict[tuple[str, str], str]:
    """TRL's trainer findings' script bodies; ``trl``, ``silent``: repro_bodies.py's preambles."""
    return trl_sweep_bodies(trl, silent) | {
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
        ("trl", "gmpo_vllm_is"): trl + _GMPO + """\
# use_vllm with GRPOConfig's default vllm_importance_sampling_correction=True: GRPOTrainer's generation puts
# the weight pi_old / pi_vllm into inputs["importance_sampling_ratio"]; here 0.5 on the one token
gmpo.use_vllm = gmpo.vllm_importance_sampling_correction = True
loss, grad = gmpo_loss(torch.full((1, 1), -1.0), torch.zeros(1, 1), torch.tensor([1.0]),
                       importance_sampling_ratio=torch.tensor([[0.5]]))
verdict("TRL experimental GMPOTrainer._compute_loss (experimental/gmpo/gmpo_trainer.py:105), use_vllm with "
        "the importance-sampling correction, weight 0.5, ratio 1, A = 1: loss and d loss / d logp",
        f"loss {loss.item()}, gradient {grad.item()}", "loss -0.5, gradient -0.5 (the weight times -A r)",
        abs(grad.item() + 1.0) < 1e-6)
""",
        ("trl", "config:entropy_coef"): silent + trl + _GMPO + """\
import tempfile  # noqa: E402

with tempfile.TemporaryDirectory() as out:  # accepted: no error, no warning
    args = GMPOConfig(output_dir=out, entropy_coef=1.0, report_to="none", use_cpu=True, bf16=False,
                      per_device_train_batch_size=2, num_generations=2)
gmpo.entropy_coef = args.entropy_coef  # as GRPOTrainer.__init__ sets them (grpo_trainer.py:846-849)
gmpo._entropy_bonus_enabled = args.entropy_coef != 0.0 or args.use_adaptive_entropy
loss, _ = gmpo_loss(torch.full((1, 1), -1.0), torch.full((1, 1), 2.0), torch.tensor([0.0]))
verdict("TRL experimental GMPOConfig(entropy_coef=1.0) (experimental/gmpo/gmpo_trainer.py:120): accepted; "
        "GMPOTrainer's loss of a token with entropy 2 and A = 0", loss.item(),
        "-2.0 (the entropy bonus -entropy_coef * H, as GRPOTrainer adds it)", abs(loss.item()) < 1e-12)
""",
        ("trl", "async_grpo_normalizer"): _ASYNC + """\
# one optimizer step of two micro-batches (gradient_accumulation_steps 2) of 1 and 3 tokens, A = 1, ratio 1
grads = [async_grad(torch.full((k,), -1.0), torch.full((k,), -1.0), torch.ones(k), 2).tolist()
         for k in (1, 3)]
verdict("TRL experimental AsyncGRPOTrainer.compute_loss "
        "(experimental/async_grpo/async_grpo_trainer.py:1541), gradient_accumulation_steps 2, "
        "micro-batches of 1 and 3 tokens, A = 1, ratio 1: d loss / d logp",
        grads, "[[-0.25], [-0.25, -0.25, -0.25]] (the token mean over the step's 4 tokens)",
        abs(grads[0][0] + 0.5) < 1e-6)
""",
        ("trl", "async_grpo_ratio_overflow"): _ASYNC + """\
# float32, log-ratio 95 against vLLM's log-prob (old -100), A = 1: the clip gate is closed
grad = async_grad(torch.tensor([-5.0]), torch.tensor([-100.0]), torch.ones(1), 1)
verdict("TRL experimental AsyncGRPOTrainer.compute_loss "
        "(experimental/async_grpo/async_grpo_trainer.py:1528), float32 log-ratio 95 under a closed gate: "
        "d loss / d logp", grad.tolist(),
        "[0.0] (the gate is closed)", bool(torch.isnan(grad).all()))
""",
        ("trl", "config:top_entropy_quantile"): silent + trl + _CALL + """\
import tempfile  # noqa: E402

with tempfile.TemporaryDirectory() as out:  # both accepted: no error, no warning (the help: range [0, 1])
    for rho in (1.5, -0.5):
        trl.GRPOConfig(output_dir=out, top_entropy_quantile=rho, report_to="none", use_cpu=True, bf16=False,
                       per_device_train_batch_size=2, num_generations=2)
trainer.accelerator.pad_across_processes = lambda t, dim=0, pad_index=0: t  # one process
logp = torch.full((1, 2), -1.0)
got = {}
for rho in (1.0, 1.5, -0.5):
    trainer.top_entropy_quantile = rho
    try:
        got[rho] = grad_of(logp, logp.clone(), torch.tensor([1.0]), torch.ones(1, 2))[1].tolist()
    except RuntimeError as error:  # torch.quantile's q = 1 - rho outside [0, 1]
        got[rho] = f"RuntimeError at the first step: {str(error).splitlines()[0]}"
verdict("TRL GRPOConfig(top_entropy_quantile=1.5 / -0.5) (trainer/grpo_trainer.py:3049): accepted; "
        "d loss / d logp of a step", f"1.5: {got[1.5]} (= 1.0's {got[1.0]}); -0.5: {got[-0.5]}",
        "an error when the config is built: top_entropy_quantile must be in [0, 1]",
        got[1.5] == got[1.0] and isinstance(got[-0.5], str))
""",
        ("trl", "config:loss_type"): silent + trl + _CALL + """\
import tempfile  # noqa: E402

with tempfile.TemporaryDirectory() as out:  # accepted: no error, no warning
    args = trl.GRPOConfig(output_dir=out, loss_type="sapo", delta=1.1, report_to="none", use_cpu=True,
                          bf16=False, per_device_train_batch_size=2, num_generations=2)
trainer.loss_type = "sapo"
logp, old = torch.full((1, 1), -1.0), torch.full((1, 1), -1.5)  # ratio exp(0.5) = 1.65, above delta
got = {}
for delta in (None, args.delta):
    trainer.args.delta = delta
    got[delta] = grad_of(logp, old, torch.tensor([-1.0]), torch.ones(1, 1))[1].item()
verdict("TRL GRPOConfig(loss_type='sapo', delta=1.1) (trainer/grpo_trainer.py:3115: delta is read by the "
        "clip losses only): accepted; d loss / d logp of a token with ratio 1.65, A = -1",
        f"{got[args.delta]} with delta, {got[None]} without",
        "an error or a warning: delta has no effect with sapo, cispo or vespo", got[args.delta] == got[None])
""",
        ("trl", "config:multi_objective_aggregation"): silent + trl + _NORMALIZE_THEN_SUM + """\
import tempfile  # noqa: E402

with tempfile.TemporaryDirectory() as out:  # accepted: no error, no warning
    trl.GRPOConfig(output_dir=out, multi_objective_aggregation="normalize_then_sum", scale_rewards="none",
                   report_to="none", use_cpu=True, bf16=False, per_device_train_batch_size=2,
                   num_generations=2)
rewards = torch.tensor([0.0, 2.0, 0.0, 4.0])  # one reward function, two groups of 2
got = advantages(rewards, 2, "none")
verdict("TRL GRPOConfig(multi_objective_aggregation='normalize_then_sum', scale_rewards='none') "
        "(trainer/grpo_trainer.py:2799): accepted; the advantages of rewards (0, 2 | 0, 4)", got.tolist(),
        "[-1.0, 1.0, -2.0, 2.0] (scale_rewards='none': the centred rewards, advantages.md eq. (5))",
        abs(got[3].item() - 2.0) > 0.5)
""",
        ("trl", "entropy_quantile_micro_batch"): trl + """\
trainer.accelerator.pad_across_processes = lambda t, dim=0, pad_index=0: t  # one process
rho = 0.25  # top_entropy_quantile: keep the top quarter of the tokens by entropy
first, second = torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.tensor([[5.0, 6.0, 7.0, 8.0]])
ones = torch.ones(1, 4)
# an optimizer step of two micro-batches (gradient_accumulation_steps 2): _compute_loss calls the mask per
# micro-batch
got = [GRPOTrainer.get_high_entropy_mask(trainer, e, ones, 1 - rho) for e in (first, second)]
kept = torch.cat([first, second])[torch.cat(got).bool()].tolist()
step = torch.cat([first, second])
exact = step[step >= torch.quantile(step.flatten(), 1 - rho)].tolist()  # the step's batch quantile
verdict("TRL GRPOTrainer.get_high_entropy_mask (trainer/grpo_trainer.py:1413), top_entropy_quantile 0.25, "
        "two micro-batches of entropies (1, 2, 3, 4) and (5, 6, 7, 8): the entropies of the kept tokens",
        kept, f"{exact} (the top quarter of the step's batch)", kept != exact)
""",
        ("trl", "sdpo_dapo_normalizer"): """\
import collections  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from trl.experimental.sdpo import SDPOTrainer  # noqa: E402

sdpo = object.__new__(SDPOTrainer)  # the attributes SDPOTrainer.__init__ sets that compute_loss reads
sdpo.loss_type, sdpo.importance_sampling_level = "dapo", "token"  # SDPOConfig's defaults
sdpo.epsilon_low = sdpo.epsilon_high = 0.2
sdpo.max_completion_length = 4
sdpo.model = SimpleNamespace(training=True)
sdpo.accelerator = SimpleNamespace(gather=lambda t: t)
sdpo._metrics = {"train": collections.defaultdict(list)}
sdpo.args = SimpleNamespace(distillation_weight=0.0)  # the policy term alone
sdpo.current_gradient_accumulation_steps = 2


def step_part(mask, adv):  # one micro-batch through SDPOTrainer.compute_loss (uniform logits, ratio 1)
    n, width = mask.shape
    sdpo._forward_logits = lambda **kwargs: torch.zeros(n, width, 3)
    inputs = {"prompt_ids": torch.zeros((n, 0), dtype=torch.long), "prompt_mask": torch.zeros((n, 0)),
              "completion_ids": torch.zeros((n, width), dtype=torch.long), "completion_mask": mask,
              "advantages": adv}
    return SDPOTrainer.compute_loss(sdpo, sdpo.model, inputs).item()


got = step_part(torch.tensor([[1.0, 1, 1, 1]]), torch.tensor([1.0])) + step_part(
    torch.tensor([[1.0, 0, 0, 0]]), torch.tensor([-1.0]))
exact = (-4 * 1.0 + 1 * 1.0) / 5  # -A r summed over the step's 5 tokens, over 5
verdict("TRL experimental SDPOTrainer.compute_loss, loss_type dapo (experimental/sdpo/sdpo_trainer.py:1175), "
        "gradient_accumulation_steps 2, micro-batches of 4 tokens (A = 1) and 1 token (A = -1), ratio 1: the "
        "step's loss", got, f"{exact} (the token mean over the accumulated batch, as SDPOConfig's help says)",
        abs(got - exact) > 1e-6)
""",
        ("trl", "sdpo_scale_none"): _NAMESPACE + SDPO_ADVANTAGES + """\
rewards = torch.tensor([[1.0], [0.0], [0.0], [0.0]])  # one group of 4, one reward function
got = sdpo_advantages(rewards, scale_rewards="none")
exact = rewards[:, 0] - rewards[:, 0].mean()
verdict("TRL experimental SDPOTrainer._prepare_training_batch, scale_rewards='none' "
        "(experimental/sdpo/sdpo_trainer.py:864), rewards (1, 0, 0, 0) in one group: the advantages",
        got.tolist(), f"{exact.tolist()} (the centred rewards, advantages.md eq. (5) scale='none')",
        not torch.allclose(got, exact, rtol=0.0, atol=1e-7))
""",
        ("trl", "kl_k3_overflow"): trl + """\
trainer.beta, trainer.args.use_bias_correction_kl = 0.1, True  # the default bias-corrected k3 term
logp = torch.tensor([[-91.0]], requires_grad=True)  # ratio 1; ref_logp - logp = 90 > 88.72 (float32)
trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
empty, ids = torch.zeros((1, 0), dtype=torch.long), torch.zeros((1, 1), dtype=torch.long)
inputs = {"prompt_ids": empty, "prompt_mask": empty, "completion_ids": ids,
          "completion_mask": torch.ones_like(ids), "advantages": torch.tensor([0.0]),
          "old_per_token_logps": torch.tensor([[-91.0]]), "ref_per_token_logps": torch.tensor([[-1.0]]),
          "num_items_in_batch": torch.tensor(1)}
loss = GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
grad = torch.autograd.grad(loss, logp)[0].item()
verdict("TRL GRPOTrainer._compute_loss (trainer/grpo_trainer.py:3101), beta 0.1, use_bias_correction_kl, "
        "float32, ratio 1, ref_logp - logp = 90, A = 0: loss and d loss / d logp",
        f"loss {loss.item()}, gradient {grad}",
        "gradient -9.0 (beta (r k3 + r (1 - e^x)) = -beta x: the e^x cancel); the value e^90 - 91 overflows "
        "float32: an error, not inf", grad != grad)
""",
        ("trl", "opsm_unscored_tokens"): trl + """\
trainer.loss_type, trainer.off_policy_mask_threshold = "dapo", 0.5
logp = torch.full((1, 4), -1.0, requires_grad=True)  # ratio 1 against the recomputed old log-probs
trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
nan = float("nan")  # three tokens vLLM could not score; the scored one is 1 nat off-policy
empty, ids = torch.zeros((1, 0), dtype=torch.long), torch.zeros((1, 4), dtype=torch.long)
inputs = {"prompt_ids": empty, "prompt_mask": empty, "completion_ids": ids,
          "completion_mask": torch.ones_like(ids), "advantages": torch.tensor([-1.0]),
          "old_per_token_logps": logp.detach().clone(), "num_items_in_batch": torch.tensor(4),
          "sampling_per_token_logps": torch.tensor([[0.0, nan, nan, nan]])}
grad = torch.autograd.grad(GRPOTrainer._compute_loss(trainer, trainer.model, inputs), logp)[0]
verdict("TRL GRPOTrainer.get_off_policy_mask (trainer/grpo_trainer.py:2964), off_policy_mask_threshold 0.5, "
        "A = -1, one scored token with log(pi_sampler / pi_theta) = 1 and three unscorable (NaN): "
        "d loss / d logp", grad.tolist(),
        "[[0.0, 0.0, 0.0, 0.0]] (the scored tokens' mean KL 1 > 0.5: the sequence is dropped)",
        bool(grad.abs().sum() > 0))
""",
    }

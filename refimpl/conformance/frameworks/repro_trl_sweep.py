"""TRL's standalone reproductions of the settings sweep 15 found (trl/findings.py, the entries after
"sweep 15"): ``trl_sweep_bodies(trl, silent)`` returns them keyed as repro_bodies.py's ``BODIES``, given
its preamble that builds a stand-in ``GRPOTrainer`` (``trl``) and the one that turns warnings into errors
(``silent``); repro_trl.py merges them into its own."""

from __future__ import annotations

__all__ = ["SDPO_ADVANTAGES", "trl_sweep_bodies"]

# a GRPOConfig built with the given keys: accepted (the ``silent`` preamble turns a warning into an error)
_CONFIG = """\
import tempfile  # noqa: E402


def config(cls=None, **keys):
    with tempfile.TemporaryDirectory() as out:
        return (cls or trl.GRPOConfig)(output_dir=out, report_to="none", use_cpu=True, bf16=False,
                                       per_device_train_batch_size=2, num_generations=2, **keys)


"""

# the block of GRPOTrainer._generate_and_score_completions that forms the vLLM importance-sampling weight
# (grpo_trainer.py:2660-2705), parsed with ast from the installed file and run on given log-probs
_VLLM_IS = """\
import ast  # noqa: E402
import math  # noqa: E402

source = pathlib.Path(next(iter(importlib.util.find_spec("trl").submodule_search_locations)))
source = source / "trainer" / "grpo_trainer.py"
block = next(node for node in ast.walk(ast.parse(source.read_text())) if isinstance(node, ast.If)
             and "vllm_importance_sampling_correction" in ast.unparse(node.test)
             and "per_token_logps_diff" in ast.unparse(node))
code = compile(ast.Module(body=block.body, type_ignores=[]), str(source), "exec")


def vllm_weight(args, old, sampler, mask):
    namespace = {"torch": torch, "math": math, "completion_mask": mask, "tool_mask": None,
                 "old_per_token_logps": old, "sampling_per_token_logps": sampler,
                 "self": SimpleNamespace(**{k: getattr(args, k) for k in vars(args)
                                            if k.startswith("vllm_importance_sampling")})}
    exec(code, namespace)
    return namespace["vllm_importance_sampling_ratio"]


"""

# one statement (or block) of the experimental A2POTrainer._estimate_optimal_values, parsed with ast from the
# installed file and run on given rewards: ``a2po(kind)`` returns its code ("v_star": the V* assignment,
# a2po_trainer.py:268; "filter": the loop that collects the all-incorrect prompts, :270-273)
_A2PO = """\
import ast  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402

os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"  # the package's import notice is not about the setting
from trl.experimental.a2po import A2POConfig  # noqa: E402

source = pathlib.Path(next(iter(importlib.util.find_spec("trl").submodule_search_locations)))
source = source / "experimental" / "a2po" / "a2po_trainer.py"
nodes = list(ast.walk(ast.parse(source.read_text())))


def a2po(kind):
    if kind == "v_star":
        node = next(n for n in nodes if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "v_star"
                    and "logsumexp" in ast.unparse(n.value))
    else:
        node = next(n for n in nodes if isinstance(n, ast.For) and "prompt_text" in ast.unparse(n.target))
    return compile(ast.Module(body=[node], type_ignores=[]), str(source), "exec")


"""

# SDPOTrainer._prepare_training_batch up to its advantages, on a stand-in holding what it reads there
SDPO_ADVANTAGES = """\
import collections  # noqa: E402
import os  # noqa: E402

os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
from trl.experimental.sdpo import SDPOTrainer  # noqa: E402


class Stop(Exception):  # raised once the advantages are in the batch, before the teacher's prompts
    pass


seen = {}


def build(batch, prompts, rewards, feedbacks=None):
    seen["advantages"] = batch["advantages"].clone()
    raise Stop


def sdpo_advantages(rewards, scale_rewards="group"):
    n = len(rewards)
    sdpo = SimpleNamespace(
        accelerator=SimpleNamespace(device="cpu", process_index=0, num_processes=1),
        model=SimpleNamespace(training=True), reward_weights=torch.ones(1),
        sample_rollouts=lambda inputs: {"completion_ids": torch.zeros(n, 2, dtype=torch.long)},
        _get_completion_ids_list=lambda batch: [[0, 0]] * n,
        processing_class=SimpleNamespace(batch_decode=lambda ids, skip_special_tokens=True: ["x"] * n),
        _calculate_rewards=lambda *args, **kwargs: rewards,
        num_generations=n, num_generations_eval=n, scale_rewards=scale_rewards,
        _record_reward_diagnostics=lambda *args, **kwargs: None,
        _record_completion_metrics=lambda *args, **kwargs: None,
        teacher_context_builder=SimpleNamespace(build=build, last_metrics={}),
        _metrics={"train": collections.defaultdict(list)})
    try:
        SDPOTrainer._prepare_training_batch(sdpo, [{"prompt": "p"}] * n)
    except Stop:
        pass
    return seen["advantages"]


"""


def trl_sweep_bodies(trl: str, silent: str) -> dict[tuple[str, str], str]:
    """The sweep's script bodies; ``trl``, ``silent``: repro_bodies.py's preambles."""
    return {
        ("trl", "config:beta"): silent + trl + _CONFIG + """\
args = config(beta=-0.1)  # accepted: no error, no warning
trainer.beta = args.beta
logp = torch.full((1, 1), -1.0, requires_grad=True)  # on-policy, A = 0: only the KL term acts
trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
empty, ids = torch.zeros((1, 0), dtype=torch.long), torch.zeros((1, 1), dtype=torch.long)
inputs = {"prompt_ids": empty, "prompt_mask": empty, "completion_ids": ids,
          "completion_mask": torch.ones_like(ids),
          "advantages": torch.tensor([0.0]), "old_per_token_logps": logp.detach().clone(),
          "ref_per_token_logps": torch.full((1, 1), -2.0), "num_items_in_batch": torch.tensor(1)}
grad = torch.autograd.grad(GRPOTrainer._compute_loss(trainer, trainer.model, inputs), logp)[0].item()
sdpo = pathlib.Path(next(iter(importlib.util.find_spec("trl").submodule_search_locations)))
sdpo_reads = (sdpo / "experimental" / "sdpo" / "sdpo_trainer.py").read_text().count("self.beta")  # assigned
verdict("TRL GRPOConfig(beta=-0.1) (trainer/grpo_trainer.py:3150): accepted; d loss / d logp of a token "
        "1 nat above the reference (A = 0, loss_type dapo): a descent step moves it",
        f"{grad:.6f} (further from the reference); sdpo_trainer.py mentions self.beta {sdpo_reads} time(s)",
        "an error: a KL coefficient must be >= 0 (beta = 0.1 gives +0.1, toward the reference)",
        grad < 0)
""",
        ("trl", "config:off_policy_mask_threshold"): silent + trl + _CONFIG + """\
args = config(off_policy_mask_threshold=-0.1)  # accepted: no error, no warning
logp = torch.full((2, 3), -1.0)  # on-policy: the sampler's log-probs are the policy's, mean KL 0
keep = GRPOTrainer.get_off_policy_mask(advantages=torch.tensor([[1.0], [-1.0]]), per_token_logps=logp,
                                       sampling_per_token_logps=logp.clone(), mask=torch.ones(2, 3),
                                       off_policy_threshold=args.off_policy_mask_threshold)
verdict("TRL GRPOConfig(off_policy_mask_threshold=-0.1) (trainer/grpo_trainer.py:2967): accepted; the "
        "sequence mask of two on-policy rows, A = +1 and A = -1", keep.flatten().tolist(),
        "[1.0, 1.0] (on-policy rows are never off-policy; the help: 'It expects a positive value')",
        keep.flatten().tolist() == [1.0, 0.0])
""",
        ("trl", "config:vespo_lambda_neg"): silent + trl + _CONFIG + """\
args = config(loss_type="vespo", vespo_lambda_neg=-1.0)  # accepted: no error, no warning
case = {"advantages": torch.tensor([[-1.0]]), "log_ratio_per_token": torch.tensor([[1.0]]),
        "mask": torch.ones(1, 1), "importance_sampling_ratio": None, "k_neg": args.vespo_k_neg}
got = GRPOTrainer.get_gamma_weights(**case, lambda_neg=args.vespo_lambda_neg).item()
floor = GRPOTrainer.get_gamma_weights(**case, lambda_neg=1e-4).item()
verdict("TRL GRPOConfig(loss_type='vespo', vespo_lambda_neg=-1.0) (trainer/grpo_trainer.py:3012): accepted; "
        "VESPO's weight phi(w) of a row with A = -1, sequence ratio e", f"{got:.6f}",
        f"an error: lambda must be > 0 (TRL silently uses lambda = 1e-4: {floor:.6f}; lambda = -1 as given: "
        f"{float(torch.exp(torch.tensor(-1.0 + 3.0 * 1.0 + torch.e))):.6f})", got == floor)
""",
        ("trl", "config:entropy_coef_min"): silent + trl + _CONFIG + """\
args = config(use_adaptive_entropy=True, entropy_coef=0.3, entropy_coef_min=0.5, entropy_coef_max=0.1,
              entropy_target=0.2)  # accepted: an inverted band, no error, no warning
for key in ("entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target"):
    setattr(trainer.args, key, getattr(args, key))
trainer.entropy_coef, trainer.use_adaptive_entropy, trainer._entropy_bonus_enabled = 0.3, True, True
trainer._entropy_window_stats, trainer._last_world_entropy = None, float("inf")
trainer.accelerator.sync_gradients = True  # one micro-batch per optimizer step
logp = torch.full((1, 2), -1.0)
entropy = torch.full((1, 2), 3.0)  # far above the target 0.2: the controller should lower the coefficient
trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, entropy, None)
empty, ids = torch.zeros((1, 0), dtype=torch.long), torch.zeros((1, 2), dtype=torch.long)
inputs = {"prompt_ids": empty, "prompt_mask": empty, "completion_ids": ids,
          "completion_mask": torch.ones_like(ids),
          "advantages": torch.tensor([0.0]), "old_per_token_logps": logp.clone(),
          "num_items_in_batch": torch.tensor(2)}
GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
verdict("TRL GRPOConfig(use_adaptive_entropy=True, entropy_coef=0.3, entropy_coef_min=0.5, "
        "entropy_coef_max=0.1) (trainer/grpo_trainer.py:3237): accepted; the coefficient after a step whose "
        "entropy 3.0 is above the target 0.2", trainer.entropy_coef,
        "an error (min > max); at most 0.3 - 0.005 (entropy above the target "
        "lowers it)", trainer.entropy_coef > 0.3)
""",
        ("trl", "config:reward_clip_range"): silent + trl + _CONFIG + """\
args = config(cls=trl.RLOOConfig, reward_clip_range=(1.0, -1.0))  # accepted: an inverted range
rewards = torch.tensor([0.0, 0.5, 1.0, -1.0])  # one group of 4 distinct rewards
# RLOOTrainer._generate_and_score_completions (trainer/rloo_trainer.py:1660-1661), its own lines:
if args.reward_clip_range:
    rewards = rewards.clamp(min=args.reward_clip_range[0], max=args.reward_clip_range[1])
verdict("TRL RLOOConfig(reward_clip_range=(1.0, -1.0)) (trainer/rloo_trainer.py:1661): accepted; the rewards "
        "(0, 0.5, 1, -1) after the clip", rewards.tolist(),
        "an error (low > high); torch.clamp with min > max gives every reward the upper bound -1, so every "
        "leave-one-out advantage is 0", bool((rewards == -1.0).all()))
""",
        ("trl", "config:vllm_importance_sampling_clip_max"): silent + trl + _CONFIG + _VLLM_IS + """\
args = config(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_mask",
              vllm_importance_sampling_clip_max=0.5)  # accepted: a cap below 1
logp = torch.full((1, 3), -1.0)  # the trainer's log-probs equal vLLM's: weight 1 for every token
got = vllm_weight(args, logp, logp.clone(), torch.ones(1, 3))
verdict("TRL GRPOConfig(vllm_importance_sampling_mode='token_mask', vllm_importance_sampling_clip_max=0.5) "
        "(trainer/grpo_trainer.py:2698): accepted; the importance-sampling weights of three tokens whose "
        "sampler and trainer log-probs agree", got.tolist(),
        "an error (a cap below 1); policy_losses.md eq. (13) keeps w = 1 <= cap", bool((got == 0).all()))
""",
        ("trl", "config:beta1"): silent + trl + _CONFIG + _A2PO + """\
with tempfile.TemporaryDirectory() as out:  # accepted: no error, no warning
    args = A2POConfig(output_dir=out, report_to="none", use_cpu=True, bf16=False, beta1=-0.5)
rewards, n = torch.tensor([[0.0, 1.0]]), 2  # one prompt, two reference samples, one correct
namespace = {"torch": torch, "math": math, "rewards": rewards, "beta1": args.beta1, "n": n}
exec(a2po("v_star"), namespace)
got = namespace["v_star"].item()
verdict("TRL experimental A2POConfig(beta1=-0.5) (experimental/a2po/a2po_trainer.py:268): accepted; V*(x) "
        "of a prompt whose reference samples score (0, 1)",
        f"{got:.4f} (a soft minimum: below the mean reward 0.5)",
        "an error: beta1 > 0 (beta1 = 0.5 gives 0.7169, a soft maximum above the mean)", got < 0.5)
""",
        ("trl", "a2po_all_incorrect"): trl + _A2PO + """\
rewards = torch.tensor([[1.0, -1.0], [-1.0, -1.0]])  # +-1: prompt 0 has a correct sample, prompt 1 none
namespace = {"rewards": rewards, "v_star": torch.zeros(2), "prompts_text": ["p0", "p1"], "optimal_values": {},
             "all_incorrect": set()}
exec(a2po("filter"), namespace)
got = sorted(namespace["all_incorrect"])
verdict("TRL experimental A2POTrainer._estimate_optimal_values (experimental/a2po/a2po_trainer.py:272), "
        "filter_all_incorrect=True (the default), rewards +-1: the prompts it drops as 'all incorrect' "
        "(p0: one correct, one incorrect; p1: both incorrect)", got,
        "['p1'] (the help: 'drop prompts for which all reference samples are incorrect')", got == ["p0"])
""",
        ("trl", "sdpo_unscorable_rewards"): trl + SDPO_ADVANTAGES + """\
rewards = torch.tensor([[1.0], [0.0], [float("nan")], [0.0]])  # one group of 4; sample 2 unscorable (None)
got = sdpo_advantages(rewards)
scored = torch.tensor([1.0, 0.0, 0.0])
exact = torch.zeros(4)
exact[[0, 1, 3]] = (scored - scored.mean()) / (scored.std() + 1e-4)  # GRPOTrainer's rule: scored only
verdict("TRL experimental SDPOTrainer._prepare_training_batch (experimental/sdpo/sdpo_trainer.py:850), "
        "rewards "
        "(1, 0, None, 0) in one group: the advantages", [round(v, 4) for v in got.tolist()],
        f"{[round(v, 4) for v in exact.tolist()]} (the unscorable sample gets 0 and is left out of the "
        "baseline, as GRPOTrainer and RLOOTrainer do)", abs(got[2].item()) > 0.1)
""",
        ("trl", "config:ref_model_mixup_alpha"): silent + trl + _CONFIG + """\
from trl.trainer.callbacks import SyncRefModelCallback  # noqa: E402

args = config(sync_ref_model=True, beta=0.1, ref_model_mixup_alpha=1.5)  # accepted: no error, no warning
policy, reference = torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False)
with torch.no_grad():
    policy.weight.fill_(1.0)
    reference.weight.fill_(0.0)
SyncRefModelCallback._sync_target_model(policy, reference, args.ref_model_mixup_alpha)
got = reference.weight.item()
verdict("TRL GRPOConfig(sync_ref_model=True, ref_model_mixup_alpha=1.5) (trainer/callbacks.py:132): "
        "accepted; the reference's weight after a sync (policy weight 1, reference 0)", got,
        "an error: TR-DPO's alpha is in [0, 1] (a mixture of the two models lies in [0, 1])", got > 1.0)
""",
    }

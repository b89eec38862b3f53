"""The cases of the standalone reproductions (repro.py): ``BODIES[(framework, finding key)]`` is the
part of a script after ``repro.PREAMBLE`` (whose helpers it calls: ``stand_ins``, ``load_file``,
``bare_packages``, ``verdict``). Each runs the installed framework's own function on a small case,
computes the exact value beside it with torch alone, and ends with ``verdict(...)``.
"""

from __future__ import annotations

__all__ = ["BODIES"]

BODIES: dict[tuple[str, str], str] = {
    ("openrlhf", "empty_step"): '''\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
loss = load_file("openrlhf", "models/loss.py")
x = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], requires_grad=True)  # per-token losses
mask = torch.zeros(2, 3)  # an optimizer step whose every row is padding
tokens = mask.sum().to(torch.float32)  # the step's float32 token count (_optimizer_step_loss_norm): 0
value = loss.aggregate_loss(x, mask, token_level_loss=True, dp_size=1, batch_num_tokens=tokens)
value.backward()
verdict("OpenRLHF aggregate_loss (models/loss.py:32), a step without any token: loss and gradient",
        f"loss {value.item()}, gradient {x.grad.tolist()}",
        "loss 0.0, gradient all 0.0 (no token, no contribution)",
        not bool(torch.isfinite(x.grad).all()))
''',
    ("openrlhf", "value_empty_step"): '''\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
loss = load_file("openrlhf", "models/loss.py")
loss_utils = load_file("openrlhf", "utils/loss_utils.py")
values = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], requires_grad=True)  # the critic's values
old_values, returns = torch.zeros(2, 3), torch.ones(2, 3)
mask = torch.zeros(2, 3)  # an optimizer step whose every row is padding
if hasattr(loss_utils, "_optimizer_step_loss_norm"):  # the critic's ppo_train: iter_grad_accum_global_norm
    info = loss_utils._optimizer_step_loss_norm([mask], None, 1, 1)
else:  # before 0.10.4: training_step's get_loss_batch_info
    info = loss_utils.get_loss_batch_info(None, mask)
value = loss.ValueLoss(0.2)(values, old_values, returns, action_mask=mask, **info)  # ppo_critic.py's call
value.backward()
verdict("OpenRLHF ValueLoss(value_clip=0.2) (models/loss.py:290 -> aggregate_loss, loss.py:32), a critic "
        "step without any token: loss and gradient", f"loss {value.item()}, gradient {values.grad.tolist()}",
        "loss 0.0, gradient all 0.0 (no token, no contribution)",
        not bool(torch.isfinite(values.grad).all()))
''',
    ("verl", "fixed_aggregation"): '''\
stand_ins("ray", "tensordict", "orjson")
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402

config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                     use_torch_compile=False, loss_agg_mode="token-mean",
                     policy_loss=PolicyLossConfig(loss_mode="sapo"))
old = torch.tensor([[-1.0, -1.2, -0.8, -1.1], [-0.9, -1.3, 0.0, 0.0]], dtype=torch.float64)
logp = old + torch.tensor([[0.1, -0.2, 0.3, 0.05], [-0.15, 0.2, 0.0, 0.0]], dtype=torch.float64)
mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)  # 4 and 2 tokens
adv = torch.tensor([[1.0] * 4, [1.0] * 4], dtype=torch.float64)
value = core_algos.compute_policy_loss_sapo(old, logp, adv, mask, loss_agg_mode="token-mean",
                                           config=config)[0]
tau = float(config.tau_pos)  # A > 0 everywhere: the positive temperature
per_token = -torch.sigmoid(tau * (torch.exp(logp - old) - 1.0)) * (4.0 / tau) * adv
token_mean = float((per_token * mask).sum() / mask.sum())  # what loss_agg_mode="token-mean" asks for
seq_mean = float(((per_token * mask).sum(-1) / mask.sum(-1)).mean())  # seq-mean-token-mean
verdict("verl compute_policy_loss_sapo (trainer/ppo/core_algos.py:1689) with loss_agg_mode='token-mean'",
        f"{float(value)!r} (seq-mean-token-mean would be {seq_mean!r})", f"{token_mean!r} (token-mean)",
        abs(float(value) - token_mean) > 1e-9 * abs(token_mean))
''',
    ("skyrl", "kl_gradient"): '''\
stand_ins("ray", ray__is_initialized=lambda: False)  # SkyRL's registries ask ray whether it runs
ppo = load_file("skyrl_train", "utils/ppo_utils.py")
logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64, requires_grad=True)
ref = torch.tensor([-1.5, -1.0, -0.5], dtype=torch.float64)
kl = ppo.compute_approx_kl(logp, ref, kl_estimator_type="k3")
x = (logp - ref).detach()
exact = (1.0 - torch.exp(-x)).tolist()  # d/d logp of k3 = exp(-x) - 1 + x, x = logp - ref
got = torch.autograd.grad(kl.sum(), logp)[0].tolist() if kl.requires_grad else "no gradient (no_grad)"
verdict("SkyRL compute_approx_kl (utils/ppo_utils.py:91), k3: d KL / d logp of the KL loss term",
        got, exact, not kl.requires_grad)
''',
    ("skyrl", "cispo_clip_low"): '''\
from omegaconf import OmegaConf, open_dict  # noqa: E402  (SkyRL's own config library)

stand_ins("ray", ray__is_initialized=lambda: False)  # SkyRL's registries ask ray whether it runs
ppo = load_file("skyrl_train", "utils/ppo_utils.py")
root = pathlib.Path(next(iter(importlib.util.find_spec("skyrl_train").submodule_search_locations)))
config = OmegaConf.load(root / "config" / "ppo_base_config.yaml").trainer.algorithm  # the shipped defaults
with open_dict(config):
    config.max_seq_len = None
    config.loss_reduction = "token_mean"
old = torch.tensor([[-1.0]], dtype=torch.float64)
logp = torch.tensor([[-1.5]], dtype=torch.float64, requires_grad=True)  # ratio exp(-0.5) = 0.6065 < 1
adv = torch.tensor([[1.0]], dtype=torch.float64)
ones = torch.ones(1, 1, dtype=torch.float64)
loss = ppo.compute_policy_loss_cispo(logp, old, adv, config, loss_mask=ones)[0]
got = torch.autograd.grad(loss, logp)[0].item()
ratio = torch.exp(logp - old).item()
exact = -min(ratio, 1.0 + float(config.cispo.cispo_eps_clip_high)) * adv.item()  # capped above only
verdict(f"SkyRL compute_policy_loss_cispo (utils/ppo_utils.py:744), defaults (cispo_eps_clip_low = "
        f"{config.cispo.cispo_eps_clip_low}), ratio {ratio:.4f}: d loss / d logp",
        got, exact, abs(got - exact) > 1e-9)
''',
}

_SILENT = """\
import warnings  # noqa: E402

warnings.simplefilter("error")  # a warning about the setting would end the script: accepted silently only
"""

_LIGER = """\
root = pathlib.Path(next(iter(importlib.util.find_spec("liger_kernel").submodule_search_locations)))
ppo = load_file("liger_kernel", "chunked_loss/fused_linear_ppo.py")
for parent in ("liger_kernel", "liger_kernel.chunked_loss"):  # grpo_loss.py imports the base class by name
    sys.modules[parent] = types.ModuleType(parent)
    sys.modules[parent].__path__ = []
sys.modules["liger_kernel.chunked_loss.fused_linear_ppo"] = ppo
spec = importlib.util.spec_from_file_location("_repro_liger_grpo", root / "chunked_loss" / "grpo_loss.py")
grpo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grpo)
"""

_AREAL = """\
root = pathlib.Path(next(iter(importlib.util.find_spec("areal").submodule_search_locations)))
for name, attrs in {"areal": {}, "areal.api": {}, "areal.utils": {},  # functional.py's two imports
                    "areal.api.cli_args": {"RejectionSamplingConfig": object},
                    "areal.utils.data": {"KLEstimator": object}}.items():
    sys.modules[name] = types.ModuleType(name)
    sys.modules[name].__path__ = []
    for key, value in attrs.items():
        setattr(sys.modules[name], key, value)
spec = importlib.util.spec_from_file_location("_repro_areal_functional",
                                              root / "utils" / "functional" / "functional.py")
functional = importlib.util.module_from_spec(spec)
spec.loader.exec_module(functional)
"""

_TRL = """\
import collections  # noqa: E402
import dataclasses  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import trl  # noqa: E402
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402

trainer = object.__new__(GRPOTrainer)  # the attributes GRPOTrainer.__init__ sets that _compute_loss reads
trainer.loss_type, trainer.importance_sampling_level, trainer.beta = "dapo", "token", 0.0
trainer.epsilon_low = trainer.epsilon_high = 0.2
trainer.max_completion_length, trainer.top_entropy_quantile = 2, 1.0
trainer.off_policy_mask_threshold, trainer.use_vllm = None, False
trainer.vllm_importance_sampling_correction, trainer.entropy_coef = False, 0.0
trainer.use_adaptive_entropy = trainer._entropy_bonus_enabled = trainer.aux_loss_enabled = False
trainer._metrics = {"train": collections.defaultdict(list), "eval": collections.defaultdict(list)}
trainer.accelerator = SimpleNamespace(gather=lambda t: t, gather_for_metrics=lambda t: t,
                                      reduce=lambda t, reduction="sum": t, num_processes=1)
trainer.model = SimpleNamespace(training=True)
trainer.current_gradient_accumulation_steps = 1
trainer.args = SimpleNamespace(**{f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)
                                  if f.default is not dataclasses.MISSING})
trainer.args.gradient_accumulation_steps = trainer.args.steps_per_generation = 1  # as __post_init__ sets
"""

_OVERFLOW_CASE = """\
# float32: one token with log-ratio 95 (old log-prob -100: a stale token), A > 0, above 1 + eps_high:
# the clip gate is closed, the exact gradient of that token is 0 (and the loss finite)
old = torch.tensor([[-100.0, -1.0]])
logp = torch.tensor([[-5.0, -0.875]], requires_grad=True)
mask = torch.ones(1, 2)
adv = torch.tensor([1.0])
EXACT_OVERFLOW = f"[[0.0, {-float(torch.exp(torch.tensor(0.125))) / 2}]] (0 where the gate is closed)"
"""

BODIES.update({
    ("liger", "ratio_overflow"): _LIGER + _OVERFLOW_CASE + """\
loss, _ = grpo.LigerFusedLinearGRPOFunction.ppo_loss_fn(logp, mask, adv, mask, old_per_token_logps=old,
                                                   loss_type="dapo", beta=0.0)
grad = torch.autograd.grad(loss, logp)[0]
verdict("Liger ppo_loss_fn (chunked_loss/grpo_loss.py:155), loss_type dapo, float32 log-ratio 95 under "
        "a closed gate: d loss / d logp", grad.tolist(), EXACT_OVERFLOW,
        bool(torch.isnan(grad[0, 0])))
""",
    ("areal", "ratio_overflow"): _AREAL + _OVERFLOW_CASE + """\
loss, _ = functional.ppo_actor_loss_fn(logp, old, old, adv.expand(1, 2), 0.2, mask.bool())
grad = torch.autograd.grad(loss, logp)[0]
verdict("AReaL ppo_actor_loss_fn (utils/functional/functional.py:509), float32 log-ratio 95 under a "
        "closed gate: d loss / d logp", grad.tolist(), EXACT_OVERFLOW,
        bool(torch.isnan(grad[0, 0])))
""",
    ("openrlhf", "ratio_overflow"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
loss_module = load_file("openrlhf", "models/loss.py")
old = torch.tensor([[-100.0, -100.0]])  # a row of stale tokens: GSPO's mean log-ratio is 95
logp = torch.tensor([[-5.0, -5.0]], requires_grad=True)
mask = torch.ones(1, 2)
adv = torch.tensor([[1.0, 1.0]])
policy_loss = loss_module.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, policy_loss_type="gspo")
out = policy_loss(logp, old, adv, action_mask=mask)
loss = out[0] if isinstance(out, tuple) else out
grad = torch.autograd.grad(loss, logp)[0]
verdict("OpenRLHF PolicyLoss (models/loss.py:196), policy_loss_type gspo, float32 sequence log-ratio 95 "
        "under a closed gate: d loss / d logp", grad.tolist(), "[[0.0, 0.0]] (the gate is closed)",
        bool(torch.isnan(grad).any()))
""",
    ("trl", "ratio_overflow"): _TRL + """\
logp = torch.tensor([[-5.0, -0.875]], requires_grad=True)  # old -100, -1: log-ratio 95 under a closed gate
EXACT_OVERFLOW = f"[[0.0, {-float(torch.exp(torch.tensor(0.125))) / 2}]] (0 where the gate is closed)"
trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
empty, ids = torch.zeros((1, 0), dtype=torch.long), torch.zeros((1, 2), dtype=torch.long)
inputs = {"prompt_ids": empty, "prompt_mask": empty, "completion_ids": ids,
          "completion_mask": torch.ones_like(ids), "advantages": torch.tensor([1.0]),
          "old_per_token_logps": torch.tensor([[-100.0, -1.0]]),
          "num_items_in_batch": torch.tensor(2)}
loss = GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
grad = torch.autograd.grad(loss, logp)[0]
verdict("TRL GRPOTrainer._compute_loss (trainer/grpo_trainer.py:3095), loss_type dapo, float32 log-ratio 95 "
        "under a closed gate: d loss / d logp", grad.tolist(), EXACT_OVERFLOW,
        bool(torch.isnan(grad[0, 0])))
""",
    ("liger", "config:use_ref_model"): _SILENT + _LIGER + """\
torch.manual_seed(0)
hidden, weight = torch.randn(1, 2, 4), torch.randn(5, 4)
ids, mask, adv = torch.tensor([[1, 3]]), torch.ones(1, 2, dtype=torch.long), torch.tensor([1.0])
ref = torch.tensor([[-9.0, -9.0]])  # reference log-probs far from the policy's: k3 is large
kl = {}
for use_ref in (True, False):
    loss_fn = grpo.LigerFusedLinearGRPOLoss(beta=0.04, use_ref_model=use_ref, compiled=False, chunk_size=1)
    _, metrics = loss_fn(hidden, weight, ids, mask, adv, ref_per_token_logps=ref)
    kl[use_ref] = float(metrics[0])
verdict("Liger LigerFusedLinearGRPOLoss(beta=0.04, use_ref_model=False) given ref_per_token_logps "
        "(chunked_loss/fused_linear_ppo.py:388): the mean KL it uses",
        f"{kl[False]} (no error, no warning)", f"{kl[True]} (what use_ref_model=True computes from them)",
        kl[False] == 0.0 and kl[True] > 0.0)
""",
    ("liger", "config:delta"): _SILENT + _LIGER + """\
grpo.LigerFusedLinearGRPOLoss(delta=1.1, epsilon_high=0.28, compiled=False)  # accepted: no error
logp = torch.tensor([[-0.8]], requires_grad=True)  # ratio exp(0.2) = 1.22, inside [0.8, 1.28]
one = torch.ones(1, 1)
loss, _ = grpo.LigerFusedLinearGRPOFunction.ppo_loss_fn(logp, one, torch.tensor([1.0]), one,
                                                   old_per_token_logps=torch.tensor([[-1.0]]), beta=0.0,
                                                   epsilon_high=0.28, delta=1.1, loss_type="dapo")
grad = torch.autograd.grad(loss, logp)[0].item()
verdict("Liger LigerFusedLinearGRPOLoss(delta=1.1, epsilon_high=0.28) (chunked_loss/grpo_loss.py:467): "
        "accepted; d loss / d logp of an A > 0 token inside the clip band (ratio 1.22)",
        f"{grad} (delta caps it inside the band)",
        f"{-float(torch.exp(torch.tensor(0.2)))} (-A r: inside the band)",
        grad == 0.0)
""",
    ("liger", "config:max_completion_length"): _SILENT + _LIGER + """\
mask = torch.ones(1, 4)  # a response of 4 tokens, max_completion_length 2
logp = torch.full((1, 4), -1.0, requires_grad=True)
loss, _ = grpo.LigerFusedLinearGRPOFunction.ppo_loss_fn(logp, mask, torch.tensor([1.0]), mask,
                                                   old_per_token_logps=logp.detach(), beta=0.0,
                                                   loss_type="dr_grpo", max_completion_length=2)
verdict("Liger ppo_loss_fn, loss_type dr_grpo, a 4-token response with max_completion_length=2 "
        "(chunked_loss/grpo_loss.py:236): accepted", f"loss {loss.item()} (no error, no warning)",
        "an error: Dr. GRPO's constant must bound the length (the loss is -4 / 2 = -2, not a mean)",
        abs(loss.item() + 2.0) < 1e-6)
""",
    ("areal", "config:c_clip"): _SILENT + _AREAL + """\
old = torch.tensor([[-1.0]])
logp = torch.tensor([[-0.85]], requires_grad=True)  # ratio exp(0.15) = 1.16, inside [0.8, 1.2]
loss, _ = functional.ppo_actor_loss_fn(logp, old, old, torch.tensor([[-1.0]]), 0.2, torch.ones(1, 1).bool(),
                                       c_clip=1.1)
grad = torch.autograd.grad(loss, logp)[0].item()
verdict("AReaL ppo_actor_loss_fn(eps_clip=0.2, c_clip=1.1) (utils/functional/functional.py:527): accepted; "
        "d loss / d logp of an A < 0 token inside the clip band (ratio 1.16)",
        f"{grad} (the dual clip acts inside the band)", f"{float(torch.exp(torch.tensor(0.15)))} (-A r)",
        grad == 0.0)
""",
})

_GAE_CASE = """\
# two responses padded to 4 positions: row 1 ends (EOS) after 2 tokens; the critic's outputs at its padding
# positions (a pad token's value, never trained) are 5.0. lambda = 0.5: with gamma = lambda = 1 (SkyRL's
# defaults) the padding's deltas telescope away, with gamma * lambda < 1 they do not
rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
values = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.5, 0.25, 5.0, 5.0]], dtype=torch.float64)
mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
gamma, lam = 1.0, 0.5
exact = []
for r, v, n in zip(rewards, values, mask.sum(-1).long().tolist()):  # each row's own tokens, V = 0 after EOS
    gae, row = 0.0, []
    for t in reversed(range(n)):
        gae = r[t].item() + gamma * (v[t + 1].item() if t + 1 < n else 0.0) - v[t].item() + gamma * lam * gae
        row.insert(0, gae + v[t].item())
    exact.append(row)
"""


def _gae_body(where: str) -> str:
    return _GAE_CASE + f"""\
_, returns = ppo.compute_gae_advantage_return(token_level_rewards=rewards, values=values, response_mask=mask,
                                              gamma=gamma, lambd=lam)
got = [returns[0].tolist(), returns[1, :2].tolist()]
verdict("{where}: GAE returns (gamma 1, lambda 0.5) on the response tokens of a padded batch",
        got, exact, abs(got[1][1] - exact[1][1]) > 1e-9)
"""


BODIES.update({
    ("skyrl", "padding_values"): """\
stand_ins("ray", ray__is_initialized=lambda: False)  # SkyRL's registries ask ray whether it runs
ppo = load_file("skyrl_train", "utils/ppo_utils.py")
""" + _gae_body("SkyRL compute_gae_advantage_return (utils/ppo_utils.py:1018)"),
    ("skyrl_pkg", "padding_values"): """\
stand_ins("ray", "skyrl_gym", ray__is_initialized=lambda: False)  # ray: registries; skyrl_gym: env configs
bare_packages("skyrl", "backends", "backends.skyrl_train", "backends.skyrl_train.utils", "train")
ppo = importlib.import_module("skyrl.backends.skyrl_train.utils.ppo_utils")
""" + _gae_body("skyrl compute_gae_advantage_return (backends/skyrl_train/utils/ppo_utils.py:1332)"),
    ("skyrl", "whiten_mean"): """\
stand_ins("ray", ray__is_initialized=lambda: False)  # SkyRL's registries ask ray whether it runs
ppo = load_file("skyrl_train", "utils/ppo_utils.py")
adv = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0]], dtype=torch.float64)  # 0 on padding
mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
out = ppo.normalize_advantages_dict({"advantages": adv.clone(), "response_mask": mask})["advantages"]
tokens = out[mask.bool()]
x = adv[mask.bool()]
exact = ((x - x.mean()) / x.std(unbiased=False)).tolist()  # masked mean and variance: mean 0, std 1
verdict("SkyRL normalize_advantages_dict (utils/ppo_utils.py:142): the normalised response tokens "
        f"(their mean {tokens.mean().item():.4f})", tokens.tolist(), exact,
        abs(tokens.mean().item()) > 1e-6)
""",
    ("openrlhf", "config:kl_coef"): """\
stand_ins("deepspeed")
identity_compile()  # utils.py:215 decorates compute_entropy, never called here
utils = load_file("openrlhf", "models/utils.py")
""" + _SILENT + """\
scores = torch.tensor([1.0])
kl = torch.tensor([[0.5, -0.25, 2.0]])  # per-token KL estimates
mask = torch.ones(1, 3, dtype=torch.bool)
shaped = {c: utils.compute_reward(scores, c, kl, action_mask=mask).tolist() for c in (-0.1, 0.0)}
verdict("OpenRLHF compute_reward(kl_coef=-0.1) (models/utils.py:138): accepted; the shaped rewards",
        f"{shaped[-0.1]} (no error, no warning)",
        f"an error for a negative coefficient ({shaped[0.0]} is kl_coef = 0: the KL dropped silently)",
        shaped[-0.1] == shaped[0.0])
""",
})
BODIES[("trl", "config:delta")] = _SILENT + _TRL + """\
import tempfile  # noqa: E402

with tempfile.TemporaryDirectory() as out:  # accepted: no error, no warning
    trainer.args = trl.GRPOConfig(output_dir=out, delta=1.1, epsilon_high=0.28, report_to="none",
                                  use_cpu=True, bf16=False, per_device_train_batch_size=2, num_generations=2)
trainer.epsilon_high = 0.28
logp = torch.tensor([[-0.8]], requires_grad=True)  # old -1: ratio exp(0.2) = 1.22, inside [0.8, 1.28]
trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
empty, ids = torch.zeros((1, 0), dtype=torch.long), torch.zeros((1, 1), dtype=torch.long)
inputs = {"prompt_ids": empty, "prompt_mask": empty, "completion_ids": ids,
          "completion_mask": torch.ones_like(ids), "advantages": torch.tensor([1.0]),
          "old_per_token_logps": torch.tensor([[-1.0]]), "num_items_in_batch": torch.tensor(1)}
grad = torch.autograd.grad(GRPOTrainer._compute_loss(trainer, trainer.model, inputs), logp)[0].item()
verdict("TRL GRPOConfig(delta=1.1, epsilon_high=0.28) (trainer/grpo_trainer.py:3116): accepted; "
        "d loss / d logp of an A > 0 token inside the clip band (ratio 1.22), loss_type dapo",
        f"{grad} (delta caps the ratio inside the band)", f"{-float(torch.exp(torch.tensor(0.2)))} (-A r)",
        grad == 0.0)
"""
_UNSLOTH = """\
import os  # noqa: E402

os.environ["UNSLOTH_COMPILE_DISABLE"] = "1"  # Unsloth's own switch: its losses run eagerly (CPU)
bare_packages("unsloth_zoo", "temporary_patches", "fused_losses")  # the package __init__ requires a GPU
for name, attributes in {"device_type": {"DEVICE_TYPE": "cpu", "device_synchronize": lambda: None},
                         "dataset_utils": {"sft_prepare_dataset": None},
                         "temporary_patches.utils": {"torch_compile_with_fallback":
                                                     lambda fullgraph=False, **k: (lambda f: f)}}.items():
    sys.modules[f"unsloth_zoo.{name}"] = types.ModuleType(f"unsloth_zoo.{name}")
    sys.modules[f"unsloth_zoo.{name}"].__dict__.update(attributes)
rl = importlib.import_module("unsloth_zoo.rl_replacements")
"""
BODIES[("unsloth", "ratio_overflow")] = _UNSLOTH + _OVERFLOW_CASE + """\
keys = {"loss_type": "dapo", "importance_sampling_level": "token", "use_bias_correction_kl": True,
        "num_processes": 1, "use_vllm": False, "epsilon_low": 0.2, "epsilon_high": 0.2,
        "current_gradient_accumulation_steps": 1, "steps_per_generation": 1,
        "num_items_in_batch": torch.tensor(2.0)}
ids = torch.zeros((1, 2), dtype=torch.long)
loss = rl.grpo_compute_loss(None, logp, old, None, ids, mask.long(), 0.0, adv, **keys)[0]
grad = torch.autograd.grad(loss, logp)[0]
verdict("Unsloth grpo_compute_loss (rl_replacements.py:1133), loss_type dapo, float32 log-ratio 95 under a "
        "closed gate: d loss / d logp", grad.tolist(), EXACT_OVERFLOW, bool(torch.isnan(grad[0, 0])))
"""

from .repro_skyrl import skyrl_bodies  # noqa: E402  (SkyRL's later findings: repro_skyrl.py)

BODIES.update(skyrl_bodies(_OVERFLOW_CASE, _SILENT))

from .repro_areal import areal_bodies  # noqa: E402  (AReaL's later findings: repro_areal.py)

BODIES.update(areal_bodies(_AREAL))

_VERL = """\
stand_ins("ray", "tensordict", "orjson")
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402

"""


def _verl_config(keys: str, loss_mode: str, policy_keys: str = "") -> str:
    """verl's own ActorConfig with ``keys`` (Python keyword text) for ``loss_mode``."""
    return (f"config = ActorConfig(strategy='fsdp', rollout_n=1, ppo_micro_batch_size_per_gpu=1, "
            f"use_torch_compile=False, {keys}\n"
            f"                     policy_loss=PolicyLossConfig(loss_mode={loss_mode!r}{policy_keys}))\n")


BODIES.update({
    ("verl", "ratio_overflow"): _VERL + _OVERFLOW_CASE
    + _verl_config("", "clip_cov", ", clip_cov_lb=1.0, clip_cov_ub=1.0") + """\
# the empty covariance band (1, 1) selects no token: the loss is PPO's clip on exp(log r), deterministic
loss, _ = core_algos.compute_policy_loss_clip_cov(old, logp, adv.expand(1, 2), mask.bool(),
                                                  loss_agg_mode="token-mean", config=config)
grad = torch.autograd.grad(loss, logp)[0]
verdict("verl compute_policy_loss_clip_cov (trainer/ppo/core_algos.py:1798), float32 log-ratio 95 under a "
        "closed gate: d loss / d logp", grad.tolist(), EXACT_OVERFLOW, bool(torch.isnan(grad[0, 0])))
""",
    ("verl", "config:clip_ratio"): _SILENT + _VERL + _verl_config("clip_ratio=0.1,", "vanilla") + """\
old = torch.tensor([[-1.0]])
logp = torch.tensor([[-0.86]], requires_grad=True)  # ratio exp(0.14) = 1.15: outside [0.9, 1.1]
loss, _ = core_algos.compute_policy_loss_vanilla(old, logp, torch.ones(1, 1), torch.ones(1, 1).bool(),
                                                 loss_agg_mode="token-mean", config=config)
grad = torch.autograd.grad(loss, logp)[0].item()
verdict("verl ActorConfig(clip_ratio=0.1) (workers/config/actor.py:159: clip_ratio_low/high default 0.2), "
        "compute_policy_loss_vanilla: d loss / d logp of an A > 0 token at ratio 1.15",
        f"{grad} (the band [0.8, 1.2] of the defaults: the token is inside)",
        "0.0 (clip_ratio 0.1: the band [0.9, 1.1], the gate is closed)", grad != 0.0)
""",
    ("verl", "config:tau_pos"): _SILENT + _VERL + _verl_config("tau_pos=0.0,", "sapo") + """\
old = torch.tensor([[-1.0]])
logp = torch.tensor([[-0.9]], requires_grad=True)
loss, _ = core_algos.compute_policy_loss_sapo(old, logp, torch.ones(1, 1), torch.ones(1, 1).bool(),
                                              loss_agg_mode="seq-mean-token-mean", config=config)
grad = torch.autograd.grad(loss, logp)[0].item()
verdict("verl ActorConfig(tau_pos=0.0) (trainer/ppo/core_algos.py:1659, gate sigmoid(tau (r - 1)) 4 / tau), "
        "compute_policy_loss_sapo, A > 0: loss and d loss / d logp",
        f"loss {loss.item()}, gradient {grad} (no error, no warning)",
        "an error: SAPO's temperature must be > 0", not bool(torch.isfinite(loss)))
""",
})

from .repro_verl import verl_bodies  # noqa: E402  (verl's later findings: repro_verl.py)

BODIES.update(verl_bodies(_VERL, _SILENT, _verl_config))

# CISPO with epsilon_high unset: TRL's GRPOTrainer.__init__ (grpo_trainer.py:946) takes epsilon_high =
# epsilon (0.2), and cispo caps the weight at epsilon_high itself; one on-policy token (ratio 1), A = 1
_CISPO_EXACT = """\
EXACT_CISPO = "-1.0 (a cap >= 1, e.g. ScaleRL's recommended 5.0, keeps the weight 1 of an on-policy token)"
"""
BODIES[("trl", "config:epsilon_high")] = _SILENT + _TRL + _CISPO_EXACT + """\
import tempfile  # noqa: E402

with tempfile.TemporaryDirectory() as out:  # accepted: no error, no warning
    trainer.args = trl.GRPOConfig(output_dir=out, loss_type="cispo", report_to="none", use_cpu=True,
                                  bf16=False, per_device_train_batch_size=2, num_generations=2)
args = trainer.args
trainer.loss_type = "cispo"
trainer.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon  # __init__, :946
logp = torch.tensor([[-1.0]], requires_grad=True)  # old -1: ratio 1
trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
empty, ids = torch.zeros((1, 0), dtype=torch.long), torch.zeros((1, 1), dtype=torch.long)
inputs = {"prompt_ids": empty, "prompt_mask": empty, "completion_ids": ids,
          "completion_mask": torch.ones_like(ids), "advantages": torch.tensor([1.0]),
          "old_per_token_logps": torch.tensor([[-1.0]]), "num_items_in_batch": torch.tensor(1)}
grad = torch.autograd.grad(GRPOTrainer._compute_loss(trainer, trainer.model, inputs), logp)[0].item()
verdict(f"TRL GRPOConfig(loss_type='cispo') without epsilon_high (trainer/grpo_trainer.py:3110: the cap is "
        f"epsilon_high = epsilon = {args.epsilon}): accepted; d loss / d logp at ratio 1, A = 1",
        f"{grad} (every weight capped at {trainer.epsilon_high})", EXACT_CISPO, abs(grad + 1.0) > 1e-6)
"""
BODIES[("unsloth", "config:epsilon_high")] = _UNSLOTH + _SILENT + _CISPO_EXACT + """\
logp = torch.tensor([[-1.0]], requires_grad=True)  # old -1: ratio 1, A = 1
keys = {"loss_type": "cispo", "importance_sampling_level": "token", "use_bias_correction_kl": True,
        "num_processes": 1, "use_vllm": False, "current_gradient_accumulation_steps": 1,
        "steps_per_generation": 1, "num_items_in_batch": torch.tensor(1.0)}  # epsilon_high not given
ids = torch.zeros((1, 1), dtype=torch.long)
loss = rl.grpo_compute_loss(None, logp, torch.tensor([[-1.0]]), None, ids, torch.ones_like(ids), 0.0,
                            torch.tensor([1.0]), **keys)[0]
grad = torch.autograd.grad(loss, logp)[0].item()
verdict("Unsloth grpo_compute_loss, loss_type cispo without epsilon_high (rl_replacements.py:1153, its "
        "default 0.2 at :951, TRL's epsilon when unset): accepted; d loss / d logp at ratio 1, A = 1",
        f"{grad} (every weight capped at 0.2)", EXACT_CISPO, abs(grad + 1.0) > 1e-6)
"""

from .repro_liger import liger_bodies  # noqa: E402  (the later scripts: repro_liger.py, repro_openrlhf.py)
from .repro_openrlhf import openrlhf_bodies  # noqa: E402
from .repro_openrlhf_sweep import openrlhf_sweep_bodies  # noqa: E402
from .repro_trl import trl_bodies  # noqa: E402  (TRL's trainer findings: repro_trl.py)
from .repro_tunix import TUNIX_BODIES  # noqa: E402  (a JAX framework's scripts: repro_tunix.py)
from .repro_tunix_sweep import TUNIX_SWEEP_BODIES  # noqa: E402  (its sweep's: repro_tunix_sweep.py)
from .repro_unsloth import unsloth_bodies  # noqa: E402  (Unsloth's later findings: repro_unsloth.py)

BODIES.update(liger_bodies(_LIGER, _SILENT))
BODIES.update(trl_bodies(_TRL, _SILENT))
BODIES.update(openrlhf_bodies(_SILENT))
BODIES.update(openrlhf_sweep_bodies(_SILENT))

BODIES.update(TUNIX_BODIES)
BODIES.update(TUNIX_SWEEP_BODIES)
BODIES.update(unsloth_bodies(_UNSLOTH, _SILENT))

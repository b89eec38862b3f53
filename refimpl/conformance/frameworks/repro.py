"""Standalone reproductions of the drivers' bug findings (``refimpl check framework F --repro DIR``).

Each finding of class ``bug`` or ``validation`` (findings.py: ``REPRODUCED_KINDS``) has a script here:
it imports only torch and the installed
framework (no refimpl), runs the framework's own function on a small case, prints the framework's
value next to the exact one, and exits 0 when the departure reproduces, 1 when it does not (a release
that fixed it) and 2 when the framework cannot be loaded. A maintainer can run it without our kit;
tests/test_framework_findings.py runs every script against the installed frameworks (CI).

``PREAMBLE`` is the part every script shares (written at its top, so each file stands alone): inert
stand-ins for import-only dependencies that are not installed (ray, deepspeed, ...), a loader that
executes one installed file of a package without running the package's ``__init__`` (which imports
the training stack), and the verdict. ``BODIES`` holds each finding's case, keyed by framework and
finding key.
"""

from __future__ import annotations

import pathlib

from . import load_driver
from .findings import REPRODUCED_KINDS

__all__ = ["BODIES", "PREAMBLE", "repro_script", "write_repros"]

PREAMBLE = '''\
# Standalone: imports only torch and the installed framework. Import-only dependencies that are not
# installed (ray, deepspeed, ...) are inert stand-ins while the framework's modules load; nothing is
# written to site-packages. Exit 0: the departure reproduces; 1: it does not (a release that fixed
# it?); 2: the framework cannot be loaded.
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import pathlib
import sys
import types

import torch


class _Inert(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():
            value = type(name, (), {"__init__": lambda self, *args, **kwargs: None})
        else:
            value = _Inert(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value

    def __call__(self, *args, **kwargs):  # a decorator returns what it wraps
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else self


class _InertFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Inert(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


def stand_ins(*names, **attributes):
    """Inert modules for those of ``names`` that are not installed; ``attributes`` ("ray.is_initialized"
    spelt ray__is_initialized) set on a stand-in where the inert default would not do."""
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    sys.meta_path.append(_InertFinder(missing))
    for dotted, value in attributes.items():
        name, _, attribute = dotted.partition("__")
        if name in missing:
            setattr(importlib.import_module(name), attribute, value)


def load_file(package, relative):
    """Execute the installed file ``package/relative`` (its siblings importable relatively) without
    running the package's ``__init__``."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        print(f"{package} is not installed")
        sys.exit(2)
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / relative
    parent = types.ModuleType(f"_repro_{package}")
    parent.__path__ = [str(path.parent)]
    sys.modules[parent.__name__] = parent
    spec = importlib.util.spec_from_file_location(f"{parent.__name__}.{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def verdict(what, framework, exact, reproduced):
    print(what)
    print(f"  framework: {framework}")
    print(f"  exact:     {exact}")
    print("REPRODUCED" if reproduced else "NOT REPRODUCED (fixed in this release?)")
    sys.exit(0 if reproduced else 1)

'''

BODIES: dict[tuple[str, str], str] = {
    ("openrlhf", "empty_step"): '''\
stand_ins("deepspeed")
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
    ("trl", "ratio_overflow"): """\
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


def repro_script(framework: str, key: str) -> str:
    """The standalone script of ``framework``'s finding ``key`` (``PREAMBLE`` and its body)."""
    finding = next((f for f in load_driver(framework).findings() if f.key == key), None)
    if finding is None or (framework, key) not in BODIES:
        raise KeyError(f"{framework} has no reproduction for finding {key!r}")
    header = (f'"""{framework} finding `{key}` ({finding.kind}): {finding.text}\n\n'
              f"Where: {finding.where} ({finding.affected}).\n")
    if finding.fixed_in:
        header += f"Fixed in: {finding.fixed_in}.\n"
    if finding.upstream:
        header += f"Upstream: {finding.upstream}.\n"
    return header + '"""\n\n' + PREAMBLE + BODIES[(framework, key)]


def write_repros(framework: str, directory: str | pathlib.Path) -> list[pathlib.Path]:
    """Write one script per bug or validation finding of ``framework`` into ``directory`` (created);
    never replaces
    a file that exists (FileExistsError naming it)."""
    out = pathlib.Path(directory)
    keys = [f.key for f in load_driver(framework).findings() if f.kind in REPRODUCED_KINDS]
    paths = [out / f"repro_{framework}_{key.replace(':', '_')}.py" for key in keys]
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise FileExistsError(f"--repro: {', '.join(existing)} exists; choose an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    for key, path in zip(keys, paths, strict=True):
        path.write_text(repro_script(framework, key))
    return paths

"""Standalone reproductions of the drivers' bug findings (``refimpl check framework F --repro DIR``).

Each finding of class ``bug`` (findings.py) has a script here: it imports only torch and the installed
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
    """Write one script per bug finding of ``framework`` into ``directory`` (created); never replaces
    a file that exists (FileExistsError naming it)."""
    out = pathlib.Path(directory)
    keys = [f.key for f in load_driver(framework).findings() if f.kind == "bug"]
    paths = [out / f"repro_{framework}_{key}.py" for key in keys]
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise FileExistsError(f"--repro: {', '.join(existing)} exists; choose an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    for key, path in zip(keys, paths, strict=True):
        path.write_text(repro_script(framework, key))
    return paths

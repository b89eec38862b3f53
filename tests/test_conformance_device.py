"""A check on a device computes its expected values on that device (``engine.run_cases``).

A GPU's ``exp`` is one unit in the last place (ulp) off the CPU's at some arguments: a ratio the
kit builds to lie exactly on a clip bound on the CPU (``case_types.log_ratio_hitting``) lies one ulp
past it there, the clip is active, and the gradient of a correct loss is 0 where a reference
computed on the CPU expects the unclipped one (seen on an H100 for verl's, OpenRLHF's and AReaL's
clipped losses). No GPU is needed to show it: ``OneUlpDevice`` simulates such a device on the CPU.
A tensor is on it when the kit moved it there (``Tensor.to(SIMULATED)``, a CPU device of index 0,
which the plain "cpu" of every other path never names) or computed it from such a tensor; on it,
``exp`` returns the CPU's result one ulp down (``torch.nextafter``). Everything else is the CPU's.
(One ulp down puts the lower bound's tie 0.8 just outside the clip, where a clipped loss's gradient
is 0; one ulp up would put 1.28 just outside, where -1.7 r rounds to -1.7 * 1.28 and a loss written
with products meets a tie that the spec's gate on the ratio does not have: a departure of such losses
one ulp from a bound, not the device's.)

The check of a correct clipped loss on the simulated device passes only when the expected values
go through the device too; the function's gradient there really differs from the CPU's (so the
simulation bites), and the same check on the CPU is unchanged. For every kind (policy loss with its
micro-batches and diagnosis, KL, advantages, log-probabilities), the expected value is computed
from tensors on the check's device.
"""

from __future__ import annotations

import math
import os
import weakref

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from refimpl.advantages import group_advantages
from refimpl.conformance import checks, diagnosis, policy_check, simple_checks
from refimpl.conformance.cases import advantage_cases, kl_cases, logprob_cases, policy_loss_cases
from refimpl.conformance.conventions import Convention
from refimpl.conformance.expected import (
    effective_variant,
    expected_group_advantages,
    expected_kl,
    expected_policy_loss,
    expected_token_logprobs,
)
from refimpl.conformance.frameworks import EXTRA_FRAMEWORKS, FRAMEWORKS, load_driver
from refimpl.conformance.kinds import KIND_REGISTRY
from refimpl.conformance.presets import resolve_preset
from refimpl.conformance.profiles import mode_convention
from refimpl.kl import kl_k3

SIMULATED = torch.device("cpu", 0)


class _DeviceExp(torch.autograd.Function):
    """The simulated device's ``exp``: the CPU's one ulp down (where finite and positive), and its
    derivative ``grad * exp(x)`` with that same result, as a device's ``exp`` backward uses its own."""

    @staticmethod
    def forward(ctx, x):
        out = torch.exp(x)
        down = torch.nextafter(out, torch.full_like(out, -math.inf))
        out = torch.where(torch.isfinite(out) & (out > 0), down, out)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out


class OneUlpDevice(TorchFunctionMode):
    """The simulated device (see the module docstring). ``holds(x)``: x is on it."""

    def __init__(self):
        super().__init__()
        self._on: dict[int, weakref.ref] = {}
        self.exps = 0  # exp evaluations on the device

    def holds(self, x) -> bool:
        ref = self._on.get(id(x))
        return ref is not None and ref() is x

    def _mark(self, x):
        if isinstance(x, torch.Tensor):
            self._on[id(x)] = weakref.ref(x)
        return x

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.Tensor.to:
            moves = [a for a in args[1:] if isinstance(a, (str, torch.device))]
            target = kwargs.get("device", moves[0] if moves else None)
            if target is not None:  # a move: onto the device, or off it
                return self._mark(out) if torch.device(target) == SIMULATED else out
        if func is torch.Tensor.cpu:
            return out
        if not any(self.holds(x) for x in pytree.tree_leaves((args, kwargs))):
            return out
        if func in (torch.exp, torch.Tensor.exp):
            self.exps += 1
            out = _DeviceExp.apply(args[0])
        pytree.tree_map(self._mark, out)
        return out


def clip_loss(logp, old_logp, advantages, mask, *, normalizer=None):
    """DAPO's clipped token-mean loss (eps_low 0.2, eps_high 0.28; Yu et al. 2025), float64, as the
    frameworks write it: ``max(-A r, -A clip(r))`` whose gradient at a ratio exactly on a bound
    follows the spec's inclusive gate (policy_losses.md eq. (6)) and is 0 one ulp past it."""
    ratio = torch.exp(logp - old_logp)
    a = advantages.unsqueeze(-1)
    losses = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 0.8, 1.28))
    return torch.where(mask, losses, 0.0).sum() / (normalizer or mask.sum().clamp(min=1))


def test_a_clipped_loss_passes_on_a_device_whose_exp_is_one_ulp_off():
    """On the CPU and on the simulated device the correct loss passes ``on_boundary``: its expected
    values are computed where it runs. (Computed on the CPU, the device's expected gradient would
    be the unclipped one: the check failed before they were moved.)"""
    device = OneUlpDevice()
    with device:
        on_cpu = checks.check_loss(clip_loss, "dapo", classes=("on_boundary",))
        assert device.exps == 0  # nothing reached the device
        there = checks.check_loss(clip_loss, "dapo", classes=("on_boundary",), device=SIMULATED)
        assert device.exps > 0
    assert on_cpu.ok, on_cpu.render()
    assert there.ok, there.render()


def test_the_simulated_device_changes_the_gradient_on_a_bound():
    """The simulation bites: on the device, the loss's gradient on an ``on_boundary`` case differs
    from the CPU's (a ratio 0.8 one ulp down with A < 0 is clipped: 0 instead of -A r / n)."""
    _, variant = resolve_preset("dapo")
    (case,) = [c for c in policy_loss_cases(variant, Convention(), classes=("on_boundary",))
               if bool((c.advantages < 0).any())][:1]

    def grad(device):
        logp = case.logp.to(device).requires_grad_(True)
        loss = clip_loss(logp, case.old_logp.to(device), case.advantages.to(device), case.mask.to(device))
        return torch.autograd.grad(loss, logp)[0].cpu()

    with OneUlpDevice():
        cpu, there = grad("cpu"), grad(SIMULATED)
    clipped = (there == 0) & (cpu != 0)
    assert bool(clipped.any())
    assert torch.allclose(there[~clipped], cpu[~clipped], rtol=4 * torch.finfo(torch.float64).eps, atol=0.0)


def _spy(monkeypatch, device: OneUlpDevice, module, name: str, seen: list):
    real = getattr(module, name)

    def spy(case, *args):
        tensors = [x for x in vars(case).values() if isinstance(x, torch.Tensor)]
        seen.append((name, all(device.holds(x) for x in tensors)))
        return real(case, *args)

    monkeypatch.setattr(module, name, spy)


def _wrong_clip_loss(logp, old_logp, advantages, mask, *, normalizer=None):
    """GRPO's eps_high 0.2 where DAPO has 0.28: fails ``outside_clip`` and is diagnosed."""
    ratio = torch.exp(logp - old_logp)
    a = advantages.unsqueeze(-1)
    losses = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 0.8, 1.2))
    return torch.where(mask, losses, 0.0).sum() / (normalizer or mask.sum().clamp(min=1))


def _advantages(rewards, group_ids):
    """The reference convention's group advantages (population std, sqrt(var + 1e-6), singletons
    and zero-variance groups 0)."""
    return group_advantages(rewards, group_ids, scale="group", std="population", eps=1e-6,
                            eps_inside_sqrt=True, zero_variance="zero", singleton="zero")


def _logprobs(logits, tokens):
    return torch.log_softmax(logits.double(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


KINDS = {  # kind: (module and name of its expected-value function, the check on the device)
    "policy_loss": (policy_check, "expected_policy_loss",
                    lambda: checks.check_loss(clip_loss, "dapo", classes=("inside_clip",), device=SIMULATED)),
    "micro_batch": (policy_check, "expected_policy_loss",
                    lambda: checks.check_loss(clip_loss, "dapo", classes=("micro_batch",), device=SIMULATED)),
    "diagnosis": (diagnosis, "expected_policy_loss",
                  lambda: checks.check_loss(_wrong_clip_loss, "dapo", classes=("outside_clip",),
                                            device=SIMULATED)),
    "kl": (simple_checks, "expected_kl",
           lambda: checks.check_kl(kl_k3, classes=("small_log_ratio",), device=SIMULATED)),
    "group_advantages": (simple_checks, "expected_advantages",
                         lambda: checks.check_advantages(_advantages, classes=("unequal_groups",),
                                                         device=SIMULATED)),
    "token_logprobs": (simple_checks, "expected_token_logprobs",
                       lambda: checks.check_logprobs(_logprobs, classes=("random_logits",),
                                                     device=SIMULATED)),
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_computes_its_expected_values_on_the_check_device(kind, monkeypatch):
    """Each kind's expected-value function receives the case with every tensor on the check's
    device (a spy on it); the report is judged as on the CPU (the correct function passes, the
    wrong one is diagnosed)."""
    device, seen = OneUlpDevice(), []
    module, name, check = KINDS[kind]
    _spy(monkeypatch, device, module, name, seen)
    with device:
        report = check()
    assert seen and all(on for _, on in seen), seen
    if kind == "diagnosis":
        assert not report.ok and "eps_high = eps_low" in report.render()
    else:
        assert report.ok, report.render()


def _same_under_meta(expect, *args, outside=None) -> str | None:
    """None when ``expect(*args)`` gives, inside ``with torch.device("meta")`` (where every allocation
    that names no device goes, as it goes to the GPU after ``torch.set_default_device("cuda")``),
    bitwise the CPU results it gives outside (``outside``, when the caller has them); else what went
    wrong."""
    outside = expect(*args) if outside is None else outside
    try:
        with torch.device("meta"):
            inside = expect(*args)
    except (RuntimeError, NotImplementedError) as exc:
        return f"{type(exc).__name__}: {exc}"
    pairs = zip(pytree.tree_leaves(outside), pytree.tree_leaves(inside), strict=True)
    if not all(b.device.type == "cpu" and torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in pairs):
        return "differs"
    return None


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_expected_values_allocate_on_their_inputs_device(framework):
    """Every tensor the expected values make follows the case's device (test_default_device.py's
    method): under every profile of the framework's modes, for every kind, the expected values on
    CPU cases are the same inside ``with torch.device("meta")``; the host numbers (normalisers,
    float32-rounded constants) stay on the CPU. Policy losses on the classes that reach every
    allocation (micro-batches, a KL term, ties, half precision)."""
    driver, failures = load_driver(framework), []
    for kind in ("policy_loss", "kl", "group_advantages"):
        for name, mode in driver.modes(kind).items():
            conv = mode_convention(mode, framework)
            variant = effective_variant(driver.variant(mode, None), conv)
            if kind == "policy_loss":
                classes = ("micro_batch", "kl_penalty", "on_boundary", "bf16")
                calls = [(expected_policy_loss, c, variant, conv)
                         for c in policy_loss_cases(variant, conv, classes=classes)]
            elif kind == "kl":
                calls = [(expected_kl, c, variant.kl_estimator, conv) for c in kl_cases()]
            else:
                calls = [(expected_group_advantages, c, conv) for c in advantage_cases()
                         if _defined(expected_group_advantages, c, conv)]
            failures += [(name, call[1].case_id, why) for call in calls if (why := _same_under_meta(*call))]
    assert not failures, failures[:5]


# fused_linear's expected values (a matrix product and its backward per row chunk) take seconds under the
# device context's per-operation dispatch: the thorough profile only (make test-thorough)
_THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
REGISTRY_KINDS_CHECKED = [k for k in sorted(KIND_REGISTRY) if _THOROUGH or k != "fused_linear"]


@pytest.mark.parametrize("kind", REGISTRY_KINDS_CHECKED)
def test_every_registry_kind_allocates_its_expected_values_on_the_case_device(kind):
    """As above for the registry's kinds (GAE, the KL reward, the behaviour correction, whitening, ...):
    under the kind's default flags and every driven framework's mode of the kind, every case's expected
    values are the same inside ``with torch.device("meta")``. (On an H200, GAE's row recursion, the KL
    reward's last-token mask and the behaviour weight's cap made their tensors on the CPU beside the
    case's CUDA tensors: `check framework F --device cuda` failed for four frameworks.)"""
    registry_kind = KIND_REGISTRY[kind]
    distinct, modes = {registry_kind.make_flags(): "default"}, 0  # each distinct set of flags once
    for framework in FRAMEWORKS + EXTRA_FRAMEWORKS:
        for name, mode in load_driver(framework).modes(kind).items():
            distinct.setdefault(registry_kind.make_flags(dict(mode.convention)), f"{framework} {name}")
            modes += 1
    failures = []

    def tensors(c, f):
        return [x for e in registry_kind.expected(c, f).values() for x in (e.values, e.where)
                if x is not None]

    cases = registry_kind.cases(0)
    for flags, label in distinct.items():
        for case in cases:
            try:
                outside = tensors(case, flags)
            except ValueError:  # the flags refuse the case
                continue
            if why := _same_under_meta(tensors, case, flags, outside=outside):
                failures.append((label, case.case_class, why[:160]))
    assert modes or kind not in ("gae", "kl_reward", "whitening"), kind
    assert not failures, failures[:5]


def _defined(expect, *args) -> bool:
    try:
        expect(*args)
    except ValueError:  # the convention refuses the case (the function must raise too)
        return False
    return True


def test_expected_logprobs_allocate_on_their_inputs_device():
    failures = [(c.case_id, why) for c in logprob_cases()
                if (why := _same_under_meta(expected_token_logprobs, c))]
    assert not failures, failures


# the modes that failed on an H100 with the expected values on the CPU (a GPU's exp one ulp off on a
# clip bound: verl's, OpenRLHF's and AReaL's dual clip; SkyRL's float32 ratio) and two that passed
DEVICE_MODES = [("verl", "vanilla/token-mean"), ("openrlhf", "ppo/token-mean/dual-clip"),
                ("openrlhf", "ppo/token-mean+kl-loss/k3"), ("areal", "ppo/dual-clip"),
                ("skyrl", "regular/token_mean"), ("trl", "dapo"), ("liger", "grpo")]


@pytest.mark.framework
@pytest.mark.parametrize(("framework", "mode"), DEVICE_MODES, ids=["/".join(m) for m in DEVICE_MODES])
def test_a_framework_mode_passes_its_profile_on_the_simulated_device(framework, mode):
    """The framework's own loss on the simulated device passes under its profile, on the classes
    the device's exp moves (ties on the clip bounds and the dual clip, a float32 ratio inside
    the clip); each of these failed with the expected values computed on the CPU."""
    driver = load_driver(framework)
    reason = driver.availability()
    if reason is not None:
        pytest.skip(f"{framework} is not drivable here: {reason}")
    device = OneUlpDevice()
    with device:
        report = checks.check_framework_mode(driver, driver.mode("policy_loss", mode), reference=False,
                                             device=SIMULATED, classes=("inside_clip", "on_boundary",
                                                                        "dual_clip_tie"))
    assert device.exps > 0
    assert report.ok, report.render()

"""Each installed framework's own policy-loss function, called directly on a batch (benchmarks/losses.py).

The conformance drivers (refimpl/conformance/frameworks/) know how to import each framework and what
its function takes; their adapters also convert the kit's call (masks to int64, advantages to [N, T],
TRL's stand-in trainer, global batch info) on every call, work that is not the framework's. Here the
adapter runs once, outside any timing, with a spy in place of the framework's function: the spy
records the arguments the adapter built, and the timed step calls the framework's own function with
exactly those (forward and backward of its loss; the adapter's final scalar scaling is left out).
Liger-Kernel's step is its loss math (``LigerFusedLinearGRPOFunction.ppo_loss_fn``) on the whole
batch, as its chunked path applies it to each chunk of log-probs; its fused linear path (the lm head
inside) is timed by benchmarks/logprobs.py at a real hidden size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import torch


class PeerStep(NamedTuple):
    framework: str  # name and version
    preset: str
    mode: str
    variant: object  # the refimpl variant the mode implements
    step: Callable[[], None]  # one forward + backward of the framework's own function


def _call(batch: dict, leaf: torch.Tensor):
    """The conformance kit's call for the whole batch (one micro-batch)."""
    from refimpl.conformance.checks import PolicyLossCall

    mask = batch["mask"]
    return PolicyLossCall(
        leaf, batch["old_logp"], batch["advantages"], mask, None, batch["advantages"],
        torch.arange(mask.shape[0], device=mask.device), None, {},
        global_tokens=int(mask.sum()), global_sequences=int(mask.any(-1).sum()), global_rows=mask.shape[0],
    )


def _leafed(x, leaf: torch.Tensor):
    """Arguments as recorded, with any tensor that carries a gradient (other than the leaf) made a
    leaf of its own: the framework's function then starts from its inputs, not from adapter work."""
    if isinstance(x, torch.Tensor) and x.requires_grad and x is not leaf:
        return x.detach().requires_grad_(True)
    return x


def _recorded_step(fn, adapter, batch: dict, patch: tuple | None = None) -> Callable[[], None]:
    """Run ``adapter(spy, call)`` once; return the step that calls ``fn`` on the recorded arguments.
    ``patch`` = (owner, attribute): the adapter calls ``owner.attribute`` itself (TRL's
    ``GRPOTrainer._compute_loss``), so the spy is put there while it runs."""
    leaf = batch["logp"].detach().requires_grad_(True)
    seen = []

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        return fn(*args, **kwargs)

    if patch is not None:
        owner, name = patch
        original = owner.__dict__[name]
        setattr(owner, name, spy)
        try:
            adapter(spy, _call(batch, leaf))
        finally:
            setattr(owner, name, original)
    else:
        adapter(spy, _call(batch, leaf))
    (args, kwargs), = seen
    args = tuple(_leafed(a, leaf) for a in args)
    kwargs = {k: _leafed(a, leaf) for k, a in kwargs.items()}

    def step() -> None:
        out = fn(*args, **kwargs)
        loss = out[0] if isinstance(out, (tuple, list)) else out
        loss.backward()
        leaf.grad = None

    return step


def _liger_step(mode, variant, batch: dict) -> Callable[[], None]:
    """Liger's loss math on the batch: ``ppo_loss_fn`` with the driver's keyword arguments."""
    from refimpl.conformance.frameworks import liger as liger_driver

    fn = liger_driver._modules()["grpo"].LigerFusedLinearGRPOFunction.ppo_loss_fn
    kwargs = {"beta": 0.0, **liger_driver.loss_kwargs(mode, variant)}
    mask = batch["mask"].to(batch["logp"].dtype)
    leaf = batch["logp"].detach().requires_grad_(True)
    old, adv = batch["old_logp"], batch["advantages"]
    tokens = int(batch["mask"].sum())

    def step() -> None:
        loss, _metrics = fn(leaf, mask, adv, mask, old_per_token_logps=old, num_items_in_batch=tokens,
                            **kwargs)
        loss.backward()
        leaf.grad = None

    return step


def _mode_variant(mode, t: int):
    """The refimpl variant a framework mode implements (its preset with the mode's overrides; a
    Dr. GRPO L_max of the padded width ``t``, which bounds every length as L_max must)."""
    from refimpl.losses import get_preset

    variant = dataclasses.replace(get_preset(mode.preset), **mode.variant_overrides)
    if variant.aggregation == "seq_sum" and (variant.max_length or 0) < t:
        variant = dataclasses.replace(variant, max_length=t)
    return variant


def peer_steps(batch: dict, presets: list[str], say=print) -> list[PeerStep]:
    """A direct step for the profile mode of every preset of every installed framework; one line
    (through ``say``) for each framework that is not installed or whose function cannot be reached."""
    from refimpl.conformance.frameworks import FRAMEWORKS, load_driver

    t = batch["logp"].shape[1]
    steps = []
    for name in FRAMEWORKS:
        driver = load_driver(name)
        reason = driver.availability()
        if reason is not None:
            say(f"{name}: skipped: {reason}")
            continue
        label = f"{name} {driver.installed_version()}"
        for preset in driver.profile_table:
            if preset not in presets:
                continue
            mode = next(m for m in driver.profile_modes(preset) if m.kind == "policy_loss")
            variant = _mode_variant(mode, t)
            if name == "liger":
                step = _liger_step(mode, variant, batch)
            else:
                fn, adapter = driver.target("policy_loss", mode.name, variant)
                patch = None
                if name == "trl":
                    from refimpl.conformance.frameworks.trl import adapters as trl_adapters

                    patch = (trl_adapters._trl()[0], "_compute_loss")
                step = _recorded_step(fn, adapter, batch, patch)
            steps.append(PeerStep(label, preset, mode.name, variant, step))
    return steps

"""A small fake framework driver (the interface of refimpl/conformance/frameworks/__init__.py) for
testing ``refimpl check --framework`` and ``refimpl matrix`` without TRL / verl / OpenRLHF.

Its "framework code" is written here the way frameworks write it: masking by multiplication
(NaN at a masked position propagates), k3 with verl-style clamps, RLOO advantages; one mode has a
planted bug (a wrong clip bound) that no flag explains."""

from __future__ import annotations

import pathlib
import sys
import types

import torch

from refimpl.conformance.frameworks import Mode

SOURCE = pathlib.Path(__file__)


def masked_mul_dapo(logp, old_logp, advantages, mask, eps_high=0.28):
    """DAPO as frameworks write it: ``(x * mask).sum()`` (a NaN in the padding reaches the loss)."""
    m = mask.to(torch.promote_types(logp.dtype, torch.float32))
    x = (logp.to(m.dtype) - old_logp.to(m.dtype)) * m
    ratio = torch.exp(torch.where(x > 80.0, 80.0, x))
    a = advantages.to(m.dtype).unsqueeze(-1)
    per_token = -torch.min(ratio * a, torch.clamp(ratio, 0.8, 1 + eps_high) * a)
    return (per_token * m).sum() / m.sum().clamp(min=1)


def policy_adapter(fn, call):
    """Global token normaliser from the kit's global counts (gradient accumulation)."""
    loss = fn(call.logp, call.old_logp, call.advantages, call.mask, **call.config["framework_config"])
    local = call.mask.sum().clamp(min=1)
    return loss * local / max(call.global_tokens, 1)


def clamped_k3(logp, ref_logp):
    log_r = torch.clamp(ref_logp - logp, -20, 20)
    return torch.clamp(torch.exp(log_r) - log_r - 1, -10, 10)


def rloo(rewards, group_ids):
    out = torch.zeros_like(rewards, dtype=torch.float64)
    for g in torch.unique(group_ids):
        idx = group_ids == g
        n = int(idx.sum())
        if n > 1:
            r = rewards[idx].double()
            out[idx] = r - (r.sum() - r) / (n - 1)
    return out


MODES = {
    "policy_loss": {
        "dapo": Mode("dapo", preset="dapo", convention={"masked_nonfinite": "propagate"}, description="DAPO"),
        "buggy": Mode(
            "buggy",
            preset="dapo",
            framework_config={"eps_high": 0.2},
            convention={"masked_nonfinite": "propagate"},
            description="eps_high 0.2 where DAPO has 0.28",
        ),
    },
    "kl": {
        "low_var_kl": Mode(
            "low_var_kl",
            kind="kl",
            variant_overrides={"kl_estimator": "k3"},
            convention={"kl_log_ratio_clamp": 20.0, "kl_value_clamp": 10.0},
        )
    },
    "group_advantages": {
        "rloo": Mode(
            "rloo", kind="group_advantages", convention={"adv_leave_one_out": True, "adv_scale": "none"}
        )
    },
}


def make_driver(name: str = "trl", *, version: str = "1.0.0", available: bool = True) -> types.ModuleType:
    """A driver module named ``refimpl.conformance.frameworks.<name>``."""
    driver = types.ModuleType(f"refimpl.conformance.frameworks.{name}")
    driver.NAME = name
    driver.PINNED_VERSION = "1.0.0"
    driver.availability = lambda: None if available else f"{name} is not installed (pip install {name})"
    driver.installed_version = lambda: version if available else None
    driver.source_files = lambda: [SOURCE]
    driver.modes = lambda kind="policy_loss": dict(MODES.get(kind, {}))
    driver.unsupported_modes = lambda kind="policy_loss": (
        {"geo_mean": "GMPO's geometric mean is not in this fake"} if kind == "policy_loss" else {}
    )

    def target(kind, mode, variant):
        if kind == "policy_loss":
            return masked_mul_dapo, policy_adapter
        if kind == "kl":
            return clamped_k3, None
        return rloo, lambda fn, rewards, group_ids: fn(rewards, group_ids)

    driver.target = target
    return driver


def install(monkeypatch, name: str = "trl", **kwargs) -> types.ModuleType:
    """Put the fake driver where ``load_driver(name)`` imports it from."""
    driver = make_driver(name, **kwargs)
    monkeypatch.setitem(sys.modules, f"refimpl.conformance.frameworks.{name}", driver)
    return driver

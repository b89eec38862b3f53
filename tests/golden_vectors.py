"""Shared helpers for tests that read the golden vectors (specs/vectors/*.json): load a file, pad
its ragged rows, compare within SCHEMA.md's float64 tolerance, and run a framework driver's own
loss code on a convention vector (the real TRL / verl / OpenRLHF function, called as the kit calls
it, ``refimpl.conformance.frameworks``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from refimpl.conformance.checks import PolicyLossCall
from refimpl.losses import PolicyLossVariant

VECTORS = Path(__file__).resolve().parents[1] / "specs" / "vectors"
FLOOR = 2.0**-1068  # SCHEMA.md: 64 subnormal ulps


def load_vectors(name: str) -> list[dict]:
    """The vectors of ``specs/vectors/<name>``."""
    return json.loads((VECTORS / name).read_text())["vectors"]


def padded(rows: list[list[str]], fill: float = -5.5, *, dtype: torch.dtype = torch.float64
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged decimal strings -> ``[N, T]`` tensor of ``dtype`` (each value rounded once from float64;
    ``fill`` at padding) and the bool mask."""
    width = max([len(r) for r in rows] + [1])
    x = torch.full((len(rows), width), fill, dtype=torch.float64)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        for t, v in enumerate(row):
            x[i, t] = float(v)
            mask[i, t] = True
    return x.to(dtype), mask


def close(got: float, expected: float, scale: float) -> bool:
    """SCHEMA.md, float64: ``|got - want| <= 1e-10 |want| + 1e-12 abs_scale + 2^-1068``."""
    return abs(got - expected) <= 1e-10 * abs(expected) + 1e-12 * scale + FLOOR


# A CISPO weight without a lower clip, for a framework whose default clips it below (verl:
# cispo_clip_low): eps_low = 1 - 2^-40 puts the bound at 2^-40 = 9.1e-13, under every weight
# exp(clamp(log r, -20, 20)) >= exp(-20) = 2.1e-9 verl can form, so the clip never acts (eps_low = 1,
# the bound 0, is not a valid variant).
NO_LOWER_CLIP = 1.0 - 2.0**-40


def framework_on_vector(driver, mode: str, vector: dict) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(loss, d loss / d logp, mask) of the framework's own loss (``driver.target("policy_loss",
    mode, variant)`` with the vector's variant) on a convention vector's inputs, one batch (no
    micro-batches), float64."""
    inputs = vector["inputs"]
    logp, mask = padded(inputs["logp"])
    old, _ = padded(inputs["old_logp"], -0.5)
    ref = None if inputs["ref_logp"] is None else padded(inputs["ref_logp"], -3.0)[0]
    adv = torch.tensor([float(a) for a in inputs["advantages"]], dtype=torch.float64)
    variant = PolicyLossVariant(**vector["variant"])
    if variant.gate == "cispo" and variant.eps_low is None and "cispo_clip_low" not in vector.get(
        "convention_flags", {}
    ):
        variant = dataclasses.replace(variant, eps_low=NO_LOWER_CLIP)
    fn, adapter = driver.target("policy_loss", mode, variant)
    x = logp.requires_grad_(True)
    call = PolicyLossCall(
        x, old, adv, mask, ref, adv, torch.zeros(len(adv), dtype=torch.long), None, {},
        global_tokens=int(mask.sum()), global_sequences=int(mask.any(-1).sum()), global_rows=len(adv),
    )
    loss = adapter(fn, call)
    (grad,) = torch.autograd.grad(loss, x)
    return float(loss.detach()), grad, mask


def mismatches(vector: dict, loss: float, grad: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """The entries of ``expected`` (loss, grad_logp, or for an acceptable vector either gradient
    entry, grad_logp_other_side; 0 at padding) that ``loss`` / ``grad`` miss."""
    expected = vector["expected"]
    scale = float(expected["abs_scale"])
    other = expected.get("grad_logp_other_side", expected["grad_logp"])
    out = [] if close(loss, float(expected["loss"]), scale) else [f"loss {loss!r} != {expected['loss']}"]
    for i, row in enumerate(expected["grad_logp"]):
        for t, g in enumerate(row):
            got = float(grad[i, t])
            if not (close(got, float(g), scale) or close(got, float(other[i][t]), scale)):
                out.append(f"grad[{i}][{t}] {got!r} != {g}")
    if bool((grad[~mask] != 0).any()):
        out.append("gradient at padded positions")
    return out


def vector_mode(driver, vector: dict) -> str:
    """The framework mode a convention vector stands for: that of a point beyond the presets
    (``specs.golden.VARIANT_MODES``), else the policy-loss mode of the framework's profile for the
    vector's preset."""
    from specs import golden

    named = golden.VARIANT_MODES.get(driver.name, {}).get(vector["preset"])
    return named or driver.profile_table[vector["preset"]][-1]

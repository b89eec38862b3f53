"""The golden vectors as a case class of the kit (reference convention only).

``specs/vectors/policy_loss.json`` holds inputs and 50-digit expected values generated from the
sympy specs (``python -m specs.golden``; schema in ``specs/vectors/SCHEMA.md``). Code in
``refimpl`` may read these plain data files but never imports ``specs`` (docs/architecture.md), so the
file is located on disk: next to this package in a source checkout, else through the installed
``specs`` package's location (``importlib.util.find_spec`` finds it without importing it).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from functools import lru_cache
from pathlib import Path

import torch

from refimpl.losses import PolicyLossVariant

from .cases import PolicyLossCase

__all__ = ["GoldenCase", "vector_file", "golden_cases"]

_JUNK = -5.5  # padding value (masked)
_DTYPES = {"float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclasses.dataclass(frozen=True)
class GoldenCase:
    """A vector as a case: ``case`` (inputs; ``case_class`` "golden_vectors"), the vector's
    ``normalizer`` (None or the global denominator), and the expected loss / gradient (float64)."""

    vector_id: str
    case: PolicyLossCase
    normalizer: float | None
    expected_loss: torch.Tensor
    expected_grad: torch.Tensor
    abs_scale: float


def vector_file(name: str = "policy_loss.json") -> Path | None:
    """Path of a golden vector file, or None when the specs data files are not available."""
    local = Path(__file__).resolve().parents[2] / "specs" / "vectors" / name
    if local.is_file():
        return local
    spec = importlib.util.find_spec("specs")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            path = Path(root) / "vectors" / name
            if path.is_file():
                return path
    return None


@lru_cache(maxsize=4)
def _load(path: str) -> tuple[dict, ...]:
    document = json.loads(Path(path).read_text())
    if document.get("schema") != "rl-oracle-golden-vectors" or document.get("schema_version") != 2:
        raise ValueError(f"{path}: unsupported golden-vector schema (this kit reads schema_version 2)")
    # valid vectors only: invalid inputs have no expected value, and a boundary vector's gradient is
    # acceptable either side of its clip bound (SCHEMA.md), which the kit's exact cases cover instead
    return tuple(v for v in document["vectors"] if v["result"] == "valid")


def _padded(rows: list[list[str]], fill: float = _JUNK) -> tuple[torch.Tensor, torch.Tensor]:
    width = max([len(r) for r in rows] + [1])
    x = torch.full((len(rows), width), fill, dtype=torch.float64)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        if row:
            x[i, : len(row)] = torch.tensor([float(v) for v in row], dtype=torch.float64)
            mask[i, : len(row)] = True
    return x, mask


def golden_cases(variant: PolicyLossVariant) -> list[GoldenCase]:
    """Every valid vector whose variant equals ``variant`` field by field (empty when none does or
    when the vector file is not available)."""
    path = vector_file()
    if path is None:
        return []
    fields = dataclasses.asdict(variant)
    out = []
    for index, vector in enumerate(v for v in _load(str(path)) if v["variant"] == fields):
        inputs = vector["inputs"]
        dtype = _DTYPES[inputs["dtype"]]
        logp, mask = _padded(inputs["logp"])
        old, _ = _padded(inputs["old_logp"], -0.5)
        ref = None if inputs["ref_logp"] is None else _padded(inputs["ref_logp"], -3.0)[0].to(dtype)
        adv = torch.tensor([float(a) for a in inputs["advantages"]], dtype=torch.float64)
        grad, _ = _padded(vector["expected"]["grad_logp"], 0.0)
        case = PolicyLossCase(
            "golden_vectors",
            index,
            logp.to(dtype),
            old.to(dtype),
            adv.to(dtype),
            mask,
            adv,
            torch.zeros(len(adv), dtype=torch.long),
            ref,
            None,
            vector["id"],
        )
        normalizer = None if inputs["normalizer"] is None else float(inputs["normalizer"])
        out.append(
            GoldenCase(
                vector["id"],
                case,
                normalizer,
                torch.tensor(float(vector["expected"]["loss"]), dtype=torch.float64),
                grad,
                float(vector["expected"]["abs_scale"]),
            )
        )
    return out

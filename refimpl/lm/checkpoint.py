"""Checkpoints: one ``torch.save`` file holding only tensors and plain Python values, loaded with
``weights_only=True`` (no pickled code runs on load). Writes are atomic (temporary file, then
rename), so an interrupted save never replaces the last good checkpoint with a broken one."""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["CHECKPOINT_FORMAT", "save_checkpoint", "load_checkpoint", "check_model_config"]

CHECKPOINT_FORMAT = 1


def save_checkpoint(path: str | os.PathLike, state: dict) -> Path:
    """Write ``state`` (tensors, dicts, lists and plain values) to ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"format": CHECKPOINT_FORMAT, **state}, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    """Read a checkpoint written by ``save_checkpoint`` (``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint: no file at {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # a foreign or corrupted file: say what it is, not a pickle trace
        raise ValueError(f"checkpoint: {path} is not a readable refimpl checkpoint ({err})") from err
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint: {path} is not a refimpl LM checkpoint of format {CHECKPOINT_FORMAT}")
    return state


def check_model_config(saved: dict, expected: dict, path: str | os.PathLike = "checkpoint") -> None:
    """Raise ``ValueError`` naming every field where the checkpoint's model shape differs."""
    diffs = [
        f"{key}: checkpoint {saved.get(key)!r}, this run {expected.get(key)!r}"
        for key in sorted(set(saved) | set(expected))
        if saved.get(key) != expected.get(key)
    ]
    if diffs:
        raise ValueError(f"checkpoint: {path} holds a model of another shape ({'; '.join(diffs)})")

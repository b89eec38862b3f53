"""Checkpoints: one ``torch.save`` file holding only tensors and plain Python values, loaded with
``weights_only=True`` (no pickled code runs on load). Writes are atomic (temporary file, then
rename: ``refimpl.lm.files.write_atomic``), so an interrupted save never replaces the last good
checkpoint with a broken one, and a failed one (disk full) removes its partial file and raises
``IOFailure``, one line naming the file and the system's reason.

The run's state is serialised once into a byte payload, stored as a ``uint8`` tensor next to its
SHA-256; loading recomputes the digest before deserialising, so a flipped byte anywhere in the
payload (weights, optimizer moments, counters) is refused instead of loading silently."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import torch

from refimpl.lm.files import write_atomic

__all__ = ["CHECKPOINT_FORMAT", "save_checkpoint", "load_checkpoint", "check_model_config"]

CHECKPOINT_FORMAT = 2  # 2: payload + sha256 (format 1 had no checksum and is refused)


def save_checkpoint(path: str | os.PathLike, state: dict) -> Path:
    """Write ``state`` (tensors, dicts, lists and plain values) to ``path`` atomically, with the
    SHA-256 of its serialised payload. ``IOFailure`` (an ``OSError``) if it cannot be written."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    record = {
        "format": CHECKPOINT_FORMAT,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "payload": torch.frombuffer(bytearray(payload), dtype=torch.uint8),
    }
    buffer = io.BytesIO()
    torch.save(record, buffer)  # in memory: torch's own file writer turns ENOSPC into a RuntimeError
    return write_atomic(path, buffer.getvalue())


def _refuse(path: Path, why: str) -> ValueError:
    return ValueError(f"checkpoint: {path} {why}")


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    """Read a checkpoint written by ``save_checkpoint`` (``weights_only=True``), verifying the
    payload's SHA-256. Every failure is a one-line ``ValueError`` naming the file (torch's own
    multi-line messages, e.g. its advice to retry with ``weights_only=False``, are not relayed)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint: no file at {path}")
    if not path.is_file():
        raise _refuse(path, "is not a file")
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a foreign or damaged file: say what it is, not a pickle trace
        raise _refuse(path, f"is not a readable refimpl checkpoint ({type(err).__name__})") from None
    if not isinstance(record, dict) or record.get("format") != CHECKPOINT_FORMAT:
        found = record.get("format") if isinstance(record, dict) else None
        raise _refuse(
            path,
            f"is not a refimpl LM checkpoint of format {CHECKPOINT_FORMAT} (found format {found!r}; "
            "format 1 files carry no checksum: train again)",
        )
    payload, digest = record.get("payload"), record.get("sha256")
    if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8 or not isinstance(digest, str):
        raise _refuse(path, "is damaged (no payload or checksum)")
    data = payload.numpy().tobytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise _refuse(path, "is damaged: its payload does not match its SHA-256 checksum")
    try:
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as err:  # checksum right but unreadable: written by something else
        raise _refuse(path, f"holds an unreadable payload ({type(err).__name__})") from None
    if not isinstance(state, dict):
        raise _refuse(path, "holds a payload that is not a dict of run state")
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

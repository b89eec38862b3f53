"""The output folder of a run (``RunFolder``: ``metrics.jsonl``, ``checkpoint.pt``, ``config.json``,
``summary.json``, ``curves.png``) and the metrics a resumed run continues (``prepare_folder``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunError", "RunFolder", "prepare_folder", "DEFAULT_OUT"]

DEFAULT_OUT = "runs/train"


class RunError(ValueError):
    """A run cannot start: a bad ``--out``, ``--resume``, ``--init-from`` or ``--device``. The
    message is one line naming the argument or file."""


@dataclass(frozen=True)
class RunFolder:
    """The files of one run."""

    root: Path

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint.pt"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def plot(self) -> Path:
        return self.root / "curves.png"

    @property
    def config(self) -> Path:
        return self.root / "config.json"


def _records_until(path: Path, state: dict) -> list[str]:
    """The lines of ``path`` logged up to the checkpoint ``state`` (later ones will be logged
    again); ``RunError`` if any record belongs to another run."""
    kept = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("run") != state["run_id"]:
            raise RunError(
                f"--out: {path} holds metrics of another run ({rec.get('run')!r}, this checkpoint is run "
                f"{state['run_id']!r}); give a fresh --out"
            )
        if rec.get("phase") == "sft" and rec.get("sft_step", 0) <= state["sft_step"]:
            kept.append(line)
        elif rec.get("phase") == "rl" and state["phase"] == "rl" and rec.get("step", 0) <= state["step"]:
            kept.append(line)
    return kept


def prepare_folder(out_dir, resume, state: dict | None) -> tuple[RunFolder, list[str]]:
    """The output folder: ``out_dir``, else the resumed checkpoint's own folder, else
    ``DEFAULT_OUT``; and the metrics lines it starts with. A resumed run continues its metrics
    (copied from the checkpoint's folder into a fresh ``out_dir``); another run's metrics are
    never mixed in (``RunError``)."""
    if out_dir is None:
        out_dir = Path(resume).parent if resume is not None else DEFAULT_OUT
    folder = RunFolder(Path(out_dir))
    if folder.root.exists() and not folder.root.is_dir():
        raise RunError(f"--out: {folder.root} is a file, not a folder")
    if state is None:
        return folder, []
    if folder.metrics.is_file():
        return folder, _records_until(folder.metrics, state)
    source = Path(resume).parent / "metrics.jsonl"
    return folder, (_records_until(source, state) if source.is_file() else [])

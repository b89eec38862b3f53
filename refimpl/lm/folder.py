"""The output folder of a run (``RunFolder``: ``metrics.jsonl``, ``checkpoint.pt``, ``config.json``,
``summary.json``, ``curves.png``) and the metrics a resumed run continues (``prepare_folder``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

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

    def files(self) -> list[Path]:
        """The run's files present in the folder (nothing else in it is the run's)."""
        paths = (self.metrics, self.checkpoint, self.config, self.summary, self.plot)
        return [path for path in paths if path.is_file()]


def _records_until(path: Path, state: dict, overwrite: bool = False) -> list[str]:
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
                f"{state['run_id']!r}); give a fresh --out, or --overwrite to replace that run"
            )
        if rec.get("phase") == "sft" and rec.get("sft_step", 0) <= state["sft_step"]:
            kept.append(line)
        elif rec.get("phase") == "rl" and state["phase"] == "rl" and rec.get("step", 0) <= state["step"]:
            kept.append(line)
    return kept


class Prepared(NamedTuple):
    """``prepare_folder``'s answer: the folder, the metrics lines the run starts with, and the
    files of another run to delete before it writes (``--overwrite``)."""

    folder: RunFolder
    metrics_lines: list[str]
    replaced: list[Path]


def prepare_folder(out_dir, resume, state: dict | None, overwrite: bool = False) -> Prepared:
    """The output folder: ``out_dir``, else the resumed checkpoint's own folder, else
    ``DEFAULT_OUT``; the metrics lines it starts with; the files it replaces. A folder holding
    another run is refused (``RunError`` naming ``--resume`` and ``--overwrite``) unless
    ``overwrite``: nothing is overwritten without being asked. A resumed run continues its metrics
    (copied from the checkpoint's folder into a fresh ``out_dir``, or continued in an ``out_dir``
    that already holds this run's)."""
    if out_dir is None:
        out_dir = Path(resume).parent if resume is not None else DEFAULT_OUT
    folder = RunFolder(Path(out_dir))
    if folder.root.exists() and not folder.root.is_dir():
        raise RunError(f"--out: {folder.root} is a file, not a folder")
    present = folder.files()
    if state is None:
        if present and not overwrite:
            raise RunError(
                f"--out: {folder.root} holds a run ({', '.join(p.name for p in present)}); continue it with "
                f"--resume {folder.checkpoint}, or replace it with --overwrite"
            )
        return Prepared(folder, [], present)
    own = folder.root.resolve() == Path(resume).resolve().parent
    if folder.metrics.is_file() and (own or not overwrite):
        return Prepared(folder, _records_until(folder.metrics, state), [])
    if present and not own and not overwrite:
        raise RunError(
            f"--out: {folder.root} holds files of a run ({', '.join(p.name for p in present)}) but no "
            f"metrics of this one; resume into a fresh --out, or replace them with --overwrite"
        )
    source = Path(resume).parent / "metrics.jsonl"
    lines = _records_until(source, state) if source.is_file() else []
    return Prepared(folder, lines, [] if own else present)

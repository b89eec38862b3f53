"""The output folder of a run (``RunFolder``: ``metrics.jsonl``, ``checkpoint.pt``, ``config.json``,
``summary.json``, ``curves.png``, and ``run.lock`` while a trainer owns it) and what a run starts
with there: ``lock_folder`` (its one owner) and ``prepare_folder`` (the metrics a resumed run
continues, the files ``--overwrite`` replaces, the notes to print). Every refusal is a
``RunError`` (one line) whose advice, where it gives a command, gives one that works as printed."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from refimpl.lm.files import IOFailure
from refimpl.lm.history import MetricsError, other_runs, read_records, records_until
from refimpl.lm.lock import LOCK_NAME, FolderInUse, RunLock, describe_holder

__all__ = [
    "RunError",
    "RunFolder",
    "Prepared",
    "prepare_folder",
    "lock_folder",
    "print_notes",
    "resume_command",
    "DEFAULT_OUT",
]

DEFAULT_OUT = "runs/train"


class RunError(ValueError):
    """A run cannot start: a bad ``--out``, ``--resume``, ``--init-from`` or ``--device``, or a
    folder another trainer holds. The message is one line naming the argument or file."""


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
    def partial_checkpoint(self) -> Path:
        """What a save writes before it renames it to ``checkpoint``; left only by a kill."""
        return self.root / "checkpoint.pt.tmp"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def plot(self) -> Path:
        return self.root / "curves.png"

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def lock(self) -> Path:
        return self.root / LOCK_NAME

    def files(self) -> list[Path]:
        """The run's files present in the folder (nothing else in it is the run's)."""
        paths = (self.metrics, self.checkpoint, self.config, self.summary, self.plot)
        return [path for path in paths if path.is_file()]


def resume_command(checkpoint: Path, program: str | None = None, out: Path | None = None) -> str:
    """The command that continues a run from ``checkpoint``: ``program`` (the command that runs
    ``refimpl``; default this interpreter's ``-m refimpl``) followed by ``train --resume
    CHECKPOINT``, and ``--out OUT`` when the run continues in another folder."""
    program = program or f"{shlex.quote(sys.executable)} -m refimpl"
    command = f"{program} train --resume {shlex.quote(str(checkpoint))}"
    return command if out is None else f"{command} --out {shlex.quote(str(out))}"


def print_notes(notes: list[str]) -> None:
    for note in notes:
        print(f"note: {note}", file=sys.stderr)


def lock_folder(folder: RunFolder) -> tuple[RunLock, list[str]]:
    """Take ``folder``'s lock (rank 0 of a multi-process run; the others get an unheld one),
    creating the folder; ``RunError`` naming the live holder if another process has it. Notes: a
    stale lock taken over (its dead holder's pid and host) and a partial checkpoint removed (both
    left by a process that was killed)."""
    lock = RunLock(folder.root)
    if int(os.environ.get("RANK", "0")) != 0:
        return lock, []
    try:
        folder.root.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except FolderInUse as err:
        raise RunError(
            f"--out: {folder.root} is in use by a running refimpl train ({describe_holder(err.holder)}); "
            "wait for it to end, or give another --out"
        ) from None
    except OSError as err:  # a full disk, a read-only folder: as any failed write (exit 74)
        raise IOFailure(folder.lock, err) from None
    notes = []
    if lock.stale is not None:
        notes.append(
            f"{folder.lock} was left by {describe_holder(lock.stale)}, which is no longer running "
            "(killed?); this run takes the folder over"
        )
    if folder.partial_checkpoint.is_file():
        folder.partial_checkpoint.unlink()
        notes.append(f"removed {folder.partial_checkpoint}, the partial file of a save that was interrupted")
    return lock, notes


class Prepared(NamedTuple):
    """``prepare_folder``'s answer: the folder, the metrics lines the run starts with, the files
    of another run to delete before it writes (``--overwrite``) and notes for the person."""

    folder: RunFolder
    metrics_lines: list[str]
    replaced: list[Path]
    notes: list[str]


def output_folder(out_dir, resume) -> RunFolder:
    """``out_dir``, else the resumed checkpoint's own folder, else ``DEFAULT_OUT``; ``RunError`` if
    that path is a file."""
    if out_dir is None:
        out_dir = Path(resume).parent if resume is not None else DEFAULT_OUT
    folder = RunFolder(Path(out_dir))
    if folder.root.exists() and not folder.root.is_dir():
        raise RunError(f"--out: {folder.root} is a file, not a folder")
    return folder


def prepare_folder(
    out_dir, resume, state: dict | None, overwrite: bool = False, program: str | None = None
) -> Prepared:
    """What a run starts with in its output folder (``output_folder``): the metrics lines, the
    files it replaces and the notes to print. A folder holding another run is refused
    (``RunError`` naming ``--resume`` and ``--overwrite``) unless ``overwrite``: nothing is
    overwritten without being asked. A resumed run continues its metrics (copied from the
    checkpoint's folder into a fresh ``out_dir``, or continued in an ``out_dir`` that already holds
    this run's). ``program``: the command that runs ``refimpl``, for the commands the advice gives."""
    folder = output_folder(out_dir, resume)
    present = folder.files()
    if state is None:
        if present and not overwrite:
            raise RunError(_holds_a_run(folder, present, program))
        return Prepared(folder, [], present, [])
    own = folder.root.resolve() == Path(resume).resolve().parent
    if folder.metrics.is_file() and (own or not overwrite):
        records, notes = _read(folder.metrics)
        others = other_runs(records, state["run_id"])
        if others and not (own and overwrite):
            raise RunError(_mixed(folder, others, state, resume, own, program))
        lines, more = _until(folder.metrics, records, state)
        if others:
            notes.append(_dropped_note(folder.metrics, others))
        return Prepared(folder, lines, [], notes + more)
    if present and not own and not overwrite:
        raise RunError(
            f"--out: {folder.root} holds files of a run ({', '.join(p.name for p in present)}) but no "
            f"metrics of this one; resume into a fresh --out, or replace them with --overwrite"
        )
    source = Path(resume).parent / "metrics.jsonl"
    lines, notes = [], []
    if source.is_file():
        records, notes = _read(source)
        lines, more = _until(source, records, state)
        others = other_runs(records, state["run_id"])
        notes += more + ([f"{source} also holds {_count(others)}, not copied"] if others else [])
    return Prepared(folder, lines, [] if own else present, notes)


def _read(path: Path):
    try:
        return read_records(path)
    except MetricsError as err:
        raise RunError(f"--resume: {err}") from None
    except OSError as err:
        raise RunError(f"--resume: cannot read {path}: {err.strerror or err}") from None


def _until(path: Path, records, state: dict):
    try:
        return records_until(path, records, state)
    except MetricsError as err:
        raise RunError(f"--resume: {err}") from None


def _count(others) -> str:
    runs = ", ".join(f"{run} ({n} records)" for run, n in sorted(others.items()))
    return f"the records of {'another run' if len(others) == 1 else 'other runs'}: {runs}"


def _dropped_note(path: Path, others) -> str:
    return f"--overwrite: dropped from {path} {_count(others)}"


def fresh_folder(root: Path, run_id: str) -> Path:
    """A folder next to ``root`` that does not exist yet, named after the run."""
    candidate = root.with_name(f"{root.name}-{run_id}")
    n = 2
    while candidate.exists():
        candidate, n = root.with_name(f"{root.name}-{run_id}-{n}"), n + 1
    return candidate


def _mixed(folder: RunFolder, others, state: dict, resume, own: bool, program) -> str:
    """The refusal of metrics holding other runs' records, with the command that recovers."""
    if not own:
        return (
            f"--out: {folder.metrics} holds metrics of another run ({_count(others)}; this checkpoint is "
            f"run {state['run_id']!r}); give a fresh --out, or --overwrite to replace that run"
        )
    fresh = fresh_folder(folder.root, state["run_id"])
    return (
        f"--resume: {folder.metrics} mixes this run's records with {_count(others)} (two trainers "
        f"wrote to {folder.root} at once, before runs were locked); {Path(resume).name} is run "
        f"{state['run_id']}: continue it, nothing lost, with: "
        f"{resume_command(Path(resume), program, fresh)}"
    )


def _holds_a_run(folder: RunFolder, present: list[Path], program) -> str:
    names = ", ".join(p.name for p in present)
    if folder.checkpoint.is_file():
        return (
            f"--out: {folder.root} holds a run ({names}); continue it with: "
            f"{resume_command(folder.checkpoint, program)}; or replace it: this command with --overwrite"
        )
    return (
        f"--out: {folder.root} holds files of a run that saved no checkpoint ({names}); replace them: "
        "this command with --overwrite, or give another --out"
    )

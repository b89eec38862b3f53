"""A run's ``metrics.jsonl`` as a resume reads it: the records (``read_records``: a torn last record,
the trace of a kill in the middle of an append, is dropped with a note; a damaged record anywhere
else is a one-line error naming its line), and the records a resumed run continues with
(``records_until``: this run's, up to its checkpoint).

Folders written before runs were locked (``refimpl.lm.lock``) may hold the records of two
trainers started on one folder (two run ids), or two copies of the same steps (two resumes of one
checkpoint at once); ``records_until`` reports the first and removes the second where the copies
agree in everything but their timings. Every error is a ``MetricsError`` (one line)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import NamedTuple

__all__ = ["MetricsError", "Record", "read_records", "records_until", "other_runs", "TIMING_KEYS"]

# the fields of a record that differ between two computations of the same step
TIMING_KEYS = ("wall_time", "cpu_time")


class MetricsError(ValueError):
    """A metrics file that cannot be continued; the message is one line naming the file and line."""


class Record(NamedTuple):
    """One line of a metrics file: its number (from 1), its text and the record it holds."""

    number: int
    text: str
    record: dict


def _parse(text: str) -> dict | None:
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def read_records(path: Path) -> tuple[list[Record], list[str]]:
    """The records of ``path`` and the notes for the person resuming: a last line without its
    newline that is not a record (a kill in the middle of an append) is dropped with a note; a line
    anywhere else that is not a JSON object is a ``MetricsError`` naming it. Blank lines are
    skipped."""
    data = path.read_bytes().decode("utf-8", errors="replace")
    lines = data.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline (every complete append does)
    records, notes = [], []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        record = _parse(text)
        if record is None:
            raise MetricsError(
                f"{path} line {number} is not a JSON record ({_excerpt(text)}); the file is damaged "
                "before its last line, which a kill cannot do: repair or remove that line"
            )
        records.append(Record(number, text, record))
    if tail.strip():
        number = len(lines) + 1
        record = _parse(tail)
        if record is None:
            notes.append(
                f"{path} line {number} is a torn record (the run was stopped while writing it); "
                "dropped: the resumed run writes that step again"
            )
        else:
            records.append(Record(number, tail, record))
    return records, notes


def _excerpt(text: str, width: int = 40) -> str:
    return repr(text if len(text) <= width else text[:width] + "...")


def other_runs(records: list[Record], run_id: str) -> Counter:
    """How many records of each run other than ``run_id`` the file holds."""
    return Counter(str(r.record.get("run")) for r in records if r.record.get("run") != run_id)


def _within(record: dict, state: dict) -> bool:
    """Whether ``record`` was logged up to the checkpoint ``state`` (later ones are logged again)."""
    if record.get("phase") == "sft":
        return record.get("sft_step", 0) <= state["sft_step"]
    if record.get("phase") == "rl":
        return state["phase"] == "rl" and record.get("step", 0) <= state["step"]
    return False


def _step_key(record: dict) -> tuple:
    return (
        record.get("phase"),
        record.get("sft_step") if record.get("phase") == "sft" else record.get("step"),
    )


def _untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING_KEYS and not k.endswith("_per_s")}


def records_until(path: Path, records: list[Record], state: dict) -> tuple[list[str], list[str]]:
    """The lines of run ``state["run_id"]`` logged up to the checkpoint ``state``, each step once,
    and a note if copies were dropped. Records of other runs are skipped (the caller decides
    whether they may be). Two copies of one step that agree in all but their timings (two
    resumes of one checkpoint computed the same step) keep the first; copies that differ are a
    ``MetricsError`` naming both lines."""
    kept: list[str] = []
    seen: dict[tuple, Record] = {}
    dropped = 0
    for rec in records:
        if rec.record.get("run") != state["run_id"] or not _within(rec.record, state):
            continue
        key = _step_key(rec.record)
        first = seen.get(key)
        if first is None:
            seen[key] = rec
            kept.append(rec.text)
        elif _untimed(first.record) == _untimed(rec.record):
            dropped += 1
        else:
            raise MetricsError(
                f"{path} lines {first.number} and {rec.number} are two different records of {key[0]} "
                f"step {key[1]} of run {state['run_id']} (two trainers wrote this folder at once, before "
                "runs were locked); remove the one that is not this checkpoint's"
            )
    notes = []
    if dropped:
        notes.append(
            f"{path} held {dropped} repeated record(s) of run {state['run_id']} (two resumes of one "
            "checkpoint at once, before runs were locked); each step is kept once"
        )
    return kept, notes

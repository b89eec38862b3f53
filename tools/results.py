"""Regenerate the trainer's results table: every preset x seeds 0-2 (``make results``).

Each run is ``refimpl train --loss PRESET --seed SEED --out OUT/PRESET-sSEED --quiet`` with the
trainer's defaults (one CPU thread unless ``OMP_NUM_THREADS`` is set); the table is read back from
the runs' ``summary.json``. It prints, per preset, the mean and min-max over seeds of the held-out
greedy and sampled accuracy after RL, the warm-up length and the wall and CPU time, then the machine
it ran on (CPU model, cores, thread setting, torch version, load average), since exact figures depend
on the CPU and the thread count.

    python tools/results.py                          # every preset, seeds 0 1 2, into runs/results
    python tools/results.py --presets grpo dapo --seeds 0
    python tools/results.py --table-only             # re-read the summaries of an earlier run
    python tools/results.py --presets grpo --seeds 0 -- --steps 2 --sft-max-steps 5   # extra train flags
    python tools/results.py --check dapo             # make results-check: a fresh seed-0 run vs the table

``--check PRESET`` trains PRESET with seed 0 anew (``runs/results-check/``, the trainer's defaults, as
``make run SEED=0`` does) and fails (exit 1) when its held-out greedy or sampled accuracy or its warm-up
length lies outside the committed row of docs/results.md widened by the row's own spread over the seeds
(``[min - (max - min), max + (max - min)]``): another CPU kind or thread count takes another trajectory,
so the fresh run is compared with the seeds' spread, not with seed 0's digits; a change of the code that
moves the trainer beyond that spread means the table is stale (regenerate it with ``make results``).

A run whose ``summary.json`` already exists is not repeated (delete its folder to redo it), so an
interrupted invocation continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

SEEDS = (0, 1, 2)
COLUMNS = ("greedy %", "sampled %", "warm-up steps", "wall s", "CPU s")
#: the columns ``--check`` compares (the times depend on the machine and its load)
CHECKED = ("greedy %", "sampled %", "warm-up steps")
RESULTS_DOC = Path(__file__).resolve().parents[1] / "docs" / "results.md"
_CELL = re.compile(r"^\s*(-?[\d.]+)(?:\s*\((-?[\d.]+)-(-?[\d.]+)\))?\s*$")


def default_presets() -> list[str]:
    """Every trainer loss name except deprecated aliases (``refimpl.lm.config.LOSS_NAMES``)."""
    from refimpl.lm.config import LOSS_NAMES

    return list(LOSS_NAMES)


def run_folder(out: Path, preset: str, seed: int) -> Path:
    return out / f"{preset}-s{seed}"


def train_command(preset: str, seed: int, folder: Path, extra: Sequence[str]) -> list[str]:
    """The ``refimpl train`` command line of one run (the same interpreter as this script). It runs only
    where no summary exists, so a folder it finds holds an interrupted run, which it replaces
    (``--overwrite``); finished runs are kept."""
    return [sys.executable, "-m", "refimpl", "train", "--loss", preset, "--seed", str(seed),
            "--out", str(folder), "--quiet", "--overwrite", *extra]


def run_one(preset: str, seed: int, out: Path, extra: Sequence[str]) -> dict:
    """Train one preset/seed unless its summary exists; return the summary."""
    folder = run_folder(out, preset, seed)
    summary_path = folder / "summary.json"
    if not summary_path.exists():
        command = train_command(preset, seed, folder, extra)
        print(f"[{time.strftime('%H:%M:%S')}] {shlex.join(command[1:])}", flush=True)
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise SystemExit(f"results: {preset} seed {seed} failed (exit {done.returncode}): "
                             f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
    return json.loads(summary_path.read_text())


def row_values(summary: dict) -> tuple[float, ...]:
    """The table's columns for one run's ``summary.json``."""
    return (
        100 * summary["final_eval_greedy_accuracy"],
        100 * summary["final_eval_sampled_accuracy"],
        float(summary["warmup_steps"]),
        float(summary["wall_time"]),
        float(summary["cpu_time"]),
    )


def format_cell(values: Sequence[float], digits: int) -> str:
    """``mean (min-max)`` of the values; just the value for one run."""
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def format_table(rows: dict[str, list[tuple[float, ...]]]) -> str:
    """A markdown table: one line per preset, each column ``mean (min-max)`` over its seeds."""
    digits = (1, 1, 0, 0, 0)
    lines = ["| preset | seeds | " + " | ".join(COLUMNS) + " |", "| --- | ---: |" + " ---: |" * len(COLUMNS)]
    for preset, runs in rows.items():
        cells = [format_cell([run[i] for run in runs], digits[i]) for i in range(len(COLUMNS))]
        lines.append(f"| {preset} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine_line() -> str:
    """What the figures depend on: CPU model, cores, thread setting, torch version, load."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    threads = os.environ.get("OMP_NUM_THREADS", "unset (the trainer's default: 1)")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (f"CPU: {cpu}, {os.cpu_count()} cores; OMP_NUM_THREADS={threads}; torch {torch.__version__}; "
            f"load average at the end {load}")


def committed_row(preset: str, text: str) -> dict[str, tuple[float, float]]:
    """(min, max) of each ``CHECKED`` column in ``preset``'s row of the results table ``text``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 + len(COLUMNS) and cells[0] == preset:
            out = {}
            for name, cell in zip(COLUMNS, cells[2:], strict=True):
                match = _CELL.match(cell)
                if match is None:
                    raise ValueError(f"results.md: {preset} row, column {name!r}: cannot read {cell!r}")
                low, high = (match.group(2), match.group(3)) if match.group(2) else (match.group(1),) * 2
                out[name] = (float(low), float(high))
            return {name: out[name] for name in CHECKED}
    raise ValueError(f"results.md has no row for preset {preset!r}")


def check_against_row(fresh: tuple[float, ...], row: dict[str, tuple[float, float]]) -> list[str]:
    """The ``CHECKED`` columns of a fresh run (``row_values``) outside the row's widened spread."""
    out = []
    for name in CHECKED:
        low, high = row[name]
        spread = high - low
        value = fresh[COLUMNS.index(name)]
        if not low - spread <= value <= high + spread:
            out.append(f"{name} {value:g} outside [{low - spread:g}, {high + spread:g}] "
                       f"(the row: {low:g}-{high:g})")
    return out


def run_check(preset: str, extra: Sequence[str]) -> int:
    """``--check PRESET``: a fresh seed-0 run against the committed row (module docstring)."""
    row = committed_row(preset, RESULTS_DOC.read_text())
    folder = run_folder(Path("runs/results-check"), preset, 0)
    if folder.exists():
        import shutil

        shutil.rmtree(folder)  # the check's own scratch run, never a user's
    fresh = row_values(run_one(preset, 0, folder.parent, extra))
    problems = check_against_row(fresh, row)
    shown = ", ".join(f"{name} {fresh[COLUMNS.index(name)]:g}" for name in CHECKED)
    if problems:
        print(f"results-check: {preset} seed 0 ({shown}) disagrees with docs/results.md: "
              + "; ".join(problems) + "; regenerate the table (make results)", file=sys.stderr)
        return 1
    print(f"results-check: {preset} seed 0 ({shown}) within the seeds' spread of docs/results.md")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=None, help="loss names (default: every preset)")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS), help="default: 0 1 2")
    parser.add_argument("--out", type=Path, default=Path("runs/results"), help="default: runs/results")
    parser.add_argument("--table-only", action="store_true", help="only read the existing summaries")
    parser.add_argument("--check", metavar="PRESET", help="a fresh seed-0 run of PRESET against its row")
    args = parser.parse_args(argv)
    if args.check:
        if args.check not in default_presets():
            parser.error(f"--check: unknown loss name {args.check!r}; expected one of {default_presets()}")
        return run_check(args.check, extra)
    presets = args.presets or default_presets()
    unknown = sorted(set(presets) - set(default_presets()) - {"ppo"})
    if unknown:
        parser.error(f"--presets: unknown loss names {unknown}; expected some of {default_presets()}")
    rows: dict[str, list[tuple[float, ...]]] = {}
    for preset in presets:
        for seed in args.seeds:
            if args.table_only:
                path = run_folder(args.out, preset, seed) / "summary.json"
                if not path.exists():
                    continue
                summary = json.loads(path.read_text())
            else:
                summary = run_one(preset, seed, args.out, extra)
            rows.setdefault(preset, []).append(row_values(summary))
    seeds = " ".join(str(s) for s in args.seeds)
    print(f"\nHeld-out accuracy after RL, mean (min-max) over seeds {seeds}; runs in {args.out}/")
    print(format_table(rows))
    print(machine_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The run: a ``Trainer`` driven through its warm-up and RL phases, with what a person and a later
session need around it: a metrics file, checkpoints, Ctrl-C, resume, progress output, a summary.

``run_training`` reads as the recipe; each phase is a short function below it. Output folder
(``refimpl.lm.folder``): ``metrics.jsonl`` (one record per step, each naming its run id),
``checkpoint.pt``, ``config.json``, ``summary.json`` and ``curves.png``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

from refimpl.lm import distributed as dist_lib
from refimpl.lm.checkpoint import save_checkpoint
from refimpl.lm.files import IOFailure, append_line, write_atomic
from refimpl.lm.folder import (
    DEFAULT_OUT,
    RunError,
    RunFolder,
    lock_folder,
    output_folder,
    prepare_folder,
    print_notes,
    resume_command,
)
from refimpl.lm.lock import RunLock
from refimpl.lm.saved import (  # re-exported: the functions of a saved run
    evaluate_checkpoint,
    first_line,
    init_policy,
    load_run_state,
    restore_trainer,
    sample_checkpoint,
)
from refimpl.lm.train import NonFiniteLossError, TrainConfig, Trainer, resolve_device

__all__ = [
    "RunError",
    "run_training",
    "load_run_state",
    "restore_trainer",
    "evaluate_checkpoint",
    "sample_checkpoint",
    "init_policy",
    "DEFAULT_OUT",
    "EXIT_DONE",
    "EXIT_TRAINING_FAILED",
    "EXIT_CANNOT_START",
    "EXIT_WRITE_FAILED",
    "EXIT_INTERRUPTED",
]

# exit codes of ``refimpl train`` (docs/usage.md)
EXIT_DONE = 0
EXIT_TRAINING_FAILED = 1  # a non-finite loss or gradient; the last good checkpoint is kept
EXIT_CANNOT_START = 2  # a user mistake, a folder another trainer holds: nothing was done
EXIT_WRITE_FAILED = 74  # an OSError writing the run's files (disk full...); the last checkpoint is kept
EXIT_INTERRUPTED = 130  # Ctrl-C; a checkpoint was saved


def run_training(
    config: TrainConfig | None,
    out_dir=None,
    *,
    resume=None,
    init_from=None,
    progress: bool | str = True,
    steps_override: int | None = None,
    plot: bool = True,
    overwrite: bool = False,
    program: str | None = None,
) -> int:
    """The whole job: warm-up until the held-out sampled accuracy target, then ``steps`` RL
    steps, then a summary. ``out_dir`` defaults to the resumed checkpoint's folder, else
    ``runs/train``; a folder holding another run is refused unless ``overwrite`` (its run files
    are then deleted first). ``init_from``: a checkpoint whose policy starts RL (no warm-up).
    ``progress``: ``True`` (bar on a terminal, periodic lines otherwise), ``False`` /
    ``"quiet"`` (the closing summary only), or ``"bar"`` / ``"lines"``. ``program``: the command
    that runs ``refimpl`` in the Ctrl-C line's resume command (default ``PYTHON -m refimpl``, this
    interpreter). Returns an exit code (``EXIT_*``): 0 done, 1 non-finite loss or gradient (last
    good checkpoint kept), 74 a file could not be written, 130 interrupted (checkpoint saved). A
    run that cannot start raises ``RunError`` before any work. Wall and CPU time (metrics,
    summary) continue those of a resumed run.

    The folder has one owner: its lock (``refimpl.lm.lock``) is taken before anything is read and
    given back when this returns; a folder another live trainer holds is refused (``RunError``).
    Any ``OSError`` writing the run's files (disk full) stops the run with one line naming the file
    and exit code 74; the last checkpoint stays as it was."""
    try:
        start = check_start(config, out_dir, resume, init_from, steps_override, overwrite, program)
    except OSError as err:  # taking the folder: nothing of the run was written
        return stop_write_failed(None, None, err, program)
    try:
        print_notes(start.notes)
        return _train(start, progress, plot, program)
    finally:
        start.lock.release()


def _train(start: Start, progress, plot: bool, program: str | None) -> int:
    started_here = dist_lib.init_from_env(resolve_device(start.config.device))
    run = None
    try:
        trainer = build_trainer(start)
        with _InterruptFlag() as interrupt:
            run = Run(trainer, start.folder, _output_mode(progress), interrupt, start.elapsed)
            try:
                begin_folder(run, start)
                if trainer.phase == "sft":
                    warmup_phase(run)
                rl_phase(run)
            except NonFiniteLossError as err:
                return stop_non_finite(run, err)
            except _StopRequested:  # between steps: the state is consistent, save it
                return stop_interrupted(run, program)
            finish(run, plot)
        return EXIT_DONE
    except OSError as err:
        return stop_write_failed(run, start.folder, err, program)
    except KeyboardInterrupt:
        return stop_at_once(run, start.folder, program)
    finally:
        if started_here:
            torch.distributed.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# before the run


class Start(NamedTuple):
    """What ``check_start`` found: the config (the resumed one with ``--resume``), the resumed and
    ``--init-from`` states with their paths, the output folder, the metrics it starts with, the
    files of another run it replaces (``--overwrite``), the wall and CPU seconds already spent
    (a resumed run's), the folder's lock (held) and the notes to print."""

    config: TrainConfig
    state: dict | None
    resume: Path | None
    init_state: dict | None
    init_from: Path | None
    folder: RunFolder
    metrics_lines: list[str]
    replaced: list[Path]
    elapsed: tuple[float, float]
    lock: RunLock
    notes: list[str]


def check_start(config, out_dir, resume, init_from, steps_override, overwrite=False, program=None) -> Start:
    """Everything that can refuse a run, before any work (``RunError``, one line): the resumed
    state and config, the device, the folder's lock (``lock_folder``), the output folder
    (``prepare_folder``) and the metrics lines it starts with. On a refusal the lock is given
    back."""
    state = init_state = None
    if resume is not None:
        state, config = _load_for("--resume", resume)
    if init_from is not None:
        init_state, _ = _load_for("--init-from", init_from)
    if steps_override is not None:
        config = dataclasses.replace(config, steps=steps_override)
    try:
        resolve_device(config.device)
    except (RuntimeError, ValueError) as err:
        raise RunError(first_line(err)) from None  # "device: 'cuda' requested but CUDA is not available"
    root = output_folder(out_dir, resume).root
    existed = root.exists()
    lock, notes = lock_folder(RunFolder(root))
    print_notes(notes)  # now: a refusal below is one more line, and the lock file is then gone
    try:
        folder, metrics_lines, replaced, more = prepare_folder(out_dir, resume, state, overwrite, program)
        elapsed = (0.0, 0.0) if state is None else elapsed_until(state, metrics_lines)
    except BaseException:
        lock.release()
        if not existed:  # refused: leave no empty folder behind
            with contextlib.suppress(OSError):
                root.rmdir()
        raise
    return Start(
        config,
        state,
        resume,
        init_state,
        init_from,
        folder,
        metrics_lines,
        replaced,
        elapsed,
        lock,
        more,
    )


def elapsed_until(state: dict, metrics_lines: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds a run had spent when ``state`` was saved: stored with it, or (a
    checkpoint written before they were) those of the last metrics record up to it."""
    if "elapsed" in state:
        return float(state["elapsed"]["wall_time"]), float(state["elapsed"]["cpu_time"])
    if metrics_lines:
        last = json.loads(metrics_lines[-1])
        return float(last.get("wall_time", 0.0)), float(last.get("cpu_time", 0.0))
    return 0.0, 0.0


def _load_for(option: str, path) -> tuple[dict, TrainConfig]:
    try:
        return load_run_state(path)
    except (FileNotFoundError, ValueError) as err:
        raise RunError(f"{option}: {err}") from None


def build_trainer(start: Start) -> Trainer:
    """The trainer, restored from ``--resume`` or started from ``--init-from``'s policy."""
    trainer = Trainer(start.config)
    try:
        if start.state is not None:
            restore_trainer(trainer, start.state, start.resume)
        if start.init_state is not None:
            init_policy(trainer, start.init_state, start.init_from)
    except ValueError as err:
        raise RunError(f"{'--resume' if start.state is not None else '--init-from'}: {err}") from None
    return trainer


def begin_folder(run: Run, start: Start) -> None:
    """The folder as the run starts: another run's files deleted (``--overwrite``), a new run's
    first checkpoint (so a kill at any later moment leaves a run to resume), ``config.json``
    and the metrics the run continues (each written atomically)."""
    folder = start.folder
    if run.main:
        for path in start.replaced:  # --overwrite: the other run's files go before this run writes
            path.unlink(missing_ok=True)
        folder.root.mkdir(parents=True, exist_ok=True)
    if start.state is None:  # a new run (or RL from --init-from): a checkpoint before the first step
        run.save()
    if run.main:
        write_atomic(folder.config, (json.dumps(dataclasses.asdict(start.config), indent=2) + "\n").encode())
        write_atomic(folder.metrics, "".join(f"{line}\n" for line in start.metrics_lines).encode())


# ---------------------------------------------------------------------------------------------
# Ctrl-C


class _StopRequested(Exception):
    """Raised between steps after Ctrl-C (a second Ctrl-C raises KeyboardInterrupt at once and
    saves nothing: the last periodic checkpoint stays)."""


class _InterruptFlag:
    """Ctrl-C sets a flag; the run saves a checkpoint between steps and stops (a second Ctrl-C
    interrupts at once)."""

    def __init__(self):
        self.set = False
        self._previous = None

    def __enter__(self):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.set:
            raise KeyboardInterrupt
        self.set = True

    def __exit__(self, *exc):
        import signal

        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False

    def any_rank(self, device) -> bool:
        return bool(dist_lib.all_reduce_max(torch.tensor(float(self.set), device=device)).item())


# ---------------------------------------------------------------------------------------------
# the run and its phases


class Run:
    """One run's trainer, folder, clocks and output; the phases below use it. The clocks count
    from ``elapsed`` (wall and CPU seconds spent before: a resumed run's), so a run's times are
    cumulative over its resumes."""

    def __init__(
        self,
        trainer: Trainer,
        folder: RunFolder,
        output: str,
        interrupt: _InterruptFlag,
        elapsed: tuple[float, float] = (0.0, 0.0),
    ):
        from refimpl.lm.progress import Progress

        self.trainer, self.folder, self.interrupt = trainer, folder, interrupt
        self.config = trainer.config
        self.main = trainer.rank == 0
        self.progress = Progress(self.config, output if self.main else "quiet")
        self.wall0, self.cpu0 = time.perf_counter() - elapsed[0], time.process_time() - elapsed[1]

    def clocks(self) -> dict:
        """``wall_time`` and ``cpu_time``: seconds since the run started, its resumes included."""
        return {"wall_time": time.perf_counter() - self.wall0, "cpu_time": time.process_time() - self.cpu0}

    def log(self, record: dict) -> None:
        record = {**record, "run": self.trainer.run_id, **self.clocks()}
        if self.main:
            append_line(self.folder.metrics, json.dumps(record))

    def save(self) -> None:
        state = self.trainer.state_dict()  # collective (gathers every rank's RNG)
        if self.main:
            save_checkpoint(self.folder.checkpoint, {**state, "elapsed": self.clocks()})

    def check_interrupt(self) -> None:
        if self.interrupt.any_rank(self.trainer.device):
            raise _StopRequested


def warmup_phase(run: Run) -> None:
    """Next-token steps until held-out sampled accuracy reaches the target (or the step limit),
    then the reference is frozen and RL starts with a fresh optimizer. Saved every
    ``checkpoint_every`` warm-up steps, as RL is, and at its end."""
    trainer, c = run.trainer, run.config
    run.progress.start_warmup(trainer.sft_step, trainer.last_eval)
    while trainer.phase == "sft":
        if trainer.sft_step >= c.sft_max_steps:
            trainer.evaluate()
            trainer.finish_warmup()
            break
        record = trainer.sft_step_once()
        if trainer.sft_step % c.sft_eval_every == 0:
            record.update(trainer.evaluate())
            if record["eval_sampled_accuracy"] >= c.sft_target_accuracy:
                trainer.finish_warmup()
        run.progress.warmup_step(record)
        run.log(record)
        if trainer.phase == "sft" and trainer.sft_step % c.checkpoint_every == 0:
            run.save()
        run.check_interrupt()
    run.progress.end_warmup(trainer.sft_step, trainer.warmup_eval)
    run.save()


def rl_phase(run: Run) -> None:
    """``steps`` RL steps, evaluated every ``eval_every`` and saved every ``checkpoint_every``."""
    trainer, c = run.trainer, run.config
    run.progress.start_rl(trainer.step)
    while trainer.step < c.steps:
        record = trainer.rl_step()
        last = trainer.step == c.steps
        if trainer.step % c.eval_every == 0 or last:
            record.update(trainer.evaluate())
        run.progress.rl_step(record, trainer.last_eval)
        run.log(record)
        if trainer.step % c.checkpoint_every == 0 or last:
            run.save()
        run.check_interrupt()
    run.progress.end_rl()


def finish(run: Run, plot: bool) -> dict:
    """Final held-out evaluation, ``summary.json``, the plot and the closing summary."""
    from refimpl.lm.plots import plot_metrics

    trainer = run.trainer
    summary = {
        "run": trainer.run_id,
        "device": str(trainer.device),
        "parameters": trainer.model.num_parameters(),
        "warmup_steps": trainer.sft_step,
        **{f"warmup_{k}": v for k, v in trainer.warmup_eval.items()},
        **{f"final_{k}": v for k, v in trainer.evaluate().items()},
        "steps": trainer.step,
        **run.clocks(),
    }
    if run.main:
        write_atomic(run.folder.summary, (json.dumps(summary, indent=2) + "\n").encode())
        if plot:
            plot_metrics(run.folder.metrics, run.folder.plot, title=_title(run.config))
        run.progress.summary(summary, run.folder, plot)
    return summary


def stop_non_finite(run: Run, err: NonFiniteLossError) -> int:
    """A NaN or infinite loss or gradient: say so; the last good checkpoint stays. Exit code 1."""
    run.progress.close()
    print(f"error: {err}", file=sys.stderr)
    return EXIT_TRAINING_FAILED


def stop_interrupted(run: Run, program: str | None = None) -> int:
    """Ctrl-C between steps: save a checkpoint and print the command that continues. Exit code 130."""
    run.progress.close()
    run.save()
    if run.main:
        print(
            f"interrupted: checkpoint saved to {run.folder.checkpoint}; continue with: "
            f"{resume_command(run.folder.checkpoint, program)}",
            file=sys.stderr,
        )
    return EXIT_INTERRUPTED


def stop_at_once(run: Run | None, folder: RunFolder, program: str | None = None) -> int:
    """A second Ctrl-C (or one before the run started): stop without saving. Exit code 130."""
    if run is not None:
        run.progress.close()
    if _is_main(run):
        print(f"interrupted at once: nothing saved now; {_what_is_kept(folder, program)}", file=sys.stderr)
    return EXIT_INTERRUPTED


def stop_write_failed(
    run: Run | None, folder: RunFolder | None, err: OSError, program: str | None = None
) -> int:
    """An ``OSError`` writing the run's files (disk full, quota, permissions): one line naming the
    file and the system's reason; the partial file is gone (``files.write_atomic``) and the last
    checkpoint is as it was. Exit code 74."""
    if run is not None:
        run.progress.close()
    if _is_main(run):
        if not isinstance(err, IOFailure):
            err = IOFailure(err.filename or (folder.root if folder else "?"), err)
        print(f"error: {err}; {_what_is_kept(folder, program)}", file=sys.stderr)
    return EXIT_WRITE_FAILED


def _is_main(run: Run | None) -> bool:
    return run.main if run is not None else int(os.environ.get("RANK", "0")) == 0


def _what_is_kept(folder: RunFolder | None, program: str | None) -> str:
    """What a stopped run leaves, and the command that continues it."""
    if folder is None:
        return "nothing was started; run this command again"
    if folder.checkpoint.is_file():
        return (
            f"the last checkpoint {folder.checkpoint} is kept; continue with: "
            f"{resume_command(folder.checkpoint, program)}"
        )
    return f"no checkpoint in {folder.root} yet; run this command again"


def _title(config: TrainConfig) -> str:
    return f"{config.task}, loss {config.loss}, seed {config.seed}"


def _output_mode(progress: bool | str) -> str:
    if progress is False or progress == "quiet":
        return "quiet"
    if progress is True:
        return "bar" if sys.stdout.isatty() else "lines"
    if progress not in ("bar", "lines"):
        raise ValueError(f"progress: expected True, False, 'quiet', 'bar' or 'lines', got {progress!r}")
    return progress

"""The run: a ``Trainer`` driven through its warm-up and RL phases, with what a person and a later
session need around it: a metrics file, checkpoints, Ctrl-C, resume, progress output, a summary.

``run_training`` reads as the recipe; each phase is a short function below it. Output folder
(``refimpl.lm.folder``): ``metrics.jsonl`` (one record per step, each naming its run id),
``checkpoint.pt``, ``config.json``, ``summary.json`` and ``curves.png``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

from refimpl.lm import distributed as dist_lib
from refimpl.lm.checkpoint import save_checkpoint
from refimpl.lm.folder import DEFAULT_OUT, RunError, RunFolder, prepare_folder
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
]


def run_training(
    config: TrainConfig | None,
    out_dir=None,
    *,
    resume=None,
    init_from=None,
    progress: bool | str = True,
    steps_override: int | None = None,
    plot: bool = True,
) -> int:
    """The whole job: warm-up until the held-out sampled accuracy target, then ``steps`` RL
    steps, then a summary. ``out_dir`` defaults to the resumed checkpoint's folder, else
    ``runs/train``. ``init_from``: a checkpoint whose policy starts RL (no warm-up).
    ``progress``: ``True`` (bar on a terminal, periodic lines otherwise), ``False`` /
    ``"quiet"`` (the closing summary only), or ``"bar"`` / ``"lines"``. Returns an exit code:
    0 done, 1 non-finite loss or gradient (last good checkpoint kept), 130 interrupted
    (checkpoint saved). A run that cannot start raises ``RunError`` before any work."""
    start = check_start(config, out_dir, resume, init_from, steps_override)  # refusals, before any work
    started_here = dist_lib.init_from_env(resolve_device(start.config.device))
    try:
        trainer = build_trainer(start)
        with _InterruptFlag() as interrupt:
            run = Run(trainer, start.folder, _output_mode(progress), interrupt)
            try:
                if trainer.phase == "sft":
                    warmup_phase(run)
                elif start.init_state is not None:
                    run.save()  # RL's start: a checkpoint even before the first step
                rl_phase(run)
            except NonFiniteLossError as err:
                return stop_non_finite(run, err)
            except _StopRequested:  # between steps: the state is consistent, save it
                return stop_interrupted(run)
        finish(run, plot)
        return 0
    finally:
        if started_here:
            torch.distributed.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# before the run


class Start(NamedTuple):
    """What ``check_start`` found: the config (the resumed one with ``--resume``), the resumed and
    ``--init-from`` states with their paths, the output folder and the metrics it starts with."""

    config: TrainConfig
    state: dict | None
    resume: Path | None
    init_state: dict | None
    init_from: Path | None
    folder: RunFolder
    metrics_lines: list[str]


def check_start(config, out_dir, resume, init_from, steps_override) -> Start:
    """Everything that can refuse a run, before any work (``RunError``, one line): the resumed
    state and config, the device, the output folder and the metrics lines it starts with."""
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
    folder, metrics_lines = prepare_folder(out_dir, resume, state)
    return Start(config, state, resume, init_state, init_from, folder, metrics_lines)


def _load_for(option: str, path) -> tuple[dict, TrainConfig]:
    try:
        return load_run_state(path)
    except (FileNotFoundError, ValueError) as err:
        raise RunError(f"{option}: {err}") from None


def build_trainer(start: Start) -> Trainer:
    """The trainer, restored from ``--resume`` or started from ``--init-from``'s policy; rank 0
    writes ``config.json`` and the metrics file the run continues."""
    trainer = Trainer(start.config)
    try:
        if start.state is not None:
            restore_trainer(trainer, start.state, start.resume)
        if start.init_state is not None:
            init_policy(trainer, start.init_state, start.init_from)
    except ValueError as err:
        raise RunError(f"{'--resume' if start.state is not None else '--init-from'}: {err}") from None
    if trainer.rank == 0:
        folder = start.folder
        folder.root.mkdir(parents=True, exist_ok=True)
        folder.config.write_text(json.dumps(dataclasses.asdict(start.config), indent=2) + "\n")
        folder.metrics.write_text("".join(f"{line}\n" for line in start.metrics_lines))
    return trainer


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
    """One run's trainer, folder, clocks and output; the phases below use it."""

    def __init__(self, trainer: Trainer, folder: RunFolder, output: str, interrupt: _InterruptFlag):
        from refimpl.lm.progress import Progress

        self.trainer, self.folder, self.interrupt = trainer, folder, interrupt
        self.config = trainer.config
        self.main = trainer.rank == 0
        self.progress = Progress(self.config, output if self.main else "quiet")
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def log(self, record: dict) -> None:
        record = {
            **record,
            "run": self.trainer.run_id,
            "wall_time": time.perf_counter() - self.wall0,
            "cpu_time": time.process_time() - self.cpu0,
        }
        if self.main:
            with self.folder.metrics.open("a") as f:
                f.write(json.dumps(record) + "\n")

    def save(self) -> None:
        state = self.trainer.state_dict()  # collective (gathers every rank's RNG)
        if self.main:
            save_checkpoint(self.folder.checkpoint, state)

    def check_interrupt(self) -> None:
        if self.interrupt.any_rank(self.trainer.device):
            raise _StopRequested


def warmup_phase(run: Run) -> None:
    """Next-token steps until held-out sampled accuracy reaches the target (or the step limit),
    then the reference is frozen and RL starts with a fresh optimizer."""
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
        "wall_time": time.perf_counter() - run.wall0,
        "cpu_time": time.process_time() - run.cpu0,
    }
    if run.main:
        run.folder.summary.write_text(json.dumps(summary, indent=2) + "\n")
        if plot:
            plot_metrics(run.folder.metrics, run.folder.plot, title=_title(run.config))
        run.progress.summary(summary, run.folder, plot)
    return summary


def stop_non_finite(run: Run, err: NonFiniteLossError) -> int:
    """A NaN or infinite loss or gradient: say so; the last good checkpoint stays. Exit code 1."""
    run.progress.close()
    print(f"error: {err}", file=sys.stderr)
    return 1


def stop_interrupted(run: Run) -> int:
    """Ctrl-C between steps: save a checkpoint and print the command that continues. Exit code 130."""
    run.progress.close()
    run.save()
    if run.main:
        print(
            f"interrupted: checkpoint saved to {run.folder.checkpoint}; continue with: "
            f"{resume_command(run.folder.checkpoint)}",
            file=sys.stderr,
        )
    return 130


def _title(config: TrainConfig) -> str:
    return f"{config.task}, loss {config.loss}, seed {config.seed}"


def resume_command(checkpoint: Path) -> str:
    """The command that continues a run from ``checkpoint`` (in the checkpoint's own folder)."""
    return f"refimpl train --resume {shlex.quote(str(checkpoint))}"


def _output_mode(progress: bool | str) -> str:
    if progress is False or progress == "quiet":
        return "quiet"
    if progress is True:
        return "bar" if sys.stdout.isatty() else "lines"
    if progress not in ("bar", "lines"):
        raise ValueError(f"progress: expected True, False, 'quiet', 'bar' or 'lines', got {progress!r}")
    return progress

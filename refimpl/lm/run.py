"""The run: a ``Trainer`` driven through its warm-up and RL phases, with what a person and a later
session need around it: a metrics file, checkpoints, Ctrl-C, resume, progress output, a summary.

``run_training`` reads as the recipe; each phase is a short function below it. Output folder:
``metrics.jsonl`` (one record per step, each naming its run id), ``checkpoint.pt``,
``config.json``, ``summary.json`` and ``curves.png``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from refimpl.lm import distributed as dist_lib
from refimpl.lm.checkpoint import load_checkpoint, save_checkpoint
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

DEFAULT_OUT = "runs/train"
_TIMING_KEYS = ("wall_time", "cpu_time", "rollout_tokens_per_s", "update_tokens_per_s")
# what a checkpoint's run state must hold, and the type of each entry
_STATE_TYPES = {
    "config": dict,
    "model_config": dict,
    "model": dict,
    "optimizer": dict,
    "phase": str,
    "step": int,
    "sft_step": int,
    "rng": list,
    "rng_split": int,
    "torch_rng": torch.Tensor,
    "last_eval": dict,
    "warmup_eval": dict,
    "run_id": str,
}


class RunError(ValueError):
    """A run cannot start: a bad ``--out``, ``--resume``, ``--init-from`` or ``--device``. The
    message is one line naming the argument or file."""


# ---------------------------------------------------------------------------------------------
# checkpoints of runs


def load_run_state(path) -> tuple[dict, TrainConfig]:
    """A checkpoint's run state and its config, checked: every entry present with its type, and
    the config valid. Errors are one-line ``ValueError``s naming the file."""
    state = load_checkpoint(path)
    for key, kind in _STATE_TYPES.items():
        if not isinstance(state.get(key), kind):
            found = type(state.get(key)).__name__ if key in state else "nothing"
            raise ValueError(
                f"checkpoint: {path} holds a malformed run state ({key}: expected {kind.__name__}, "
                f"found {found})"
            )
    try:
        config = TrainConfig(**state["config"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint: {path} holds an invalid config ({_first_line(err)})") from None
    return state, config


def restore_trainer(trainer: Trainer, state: dict, path) -> None:
    """``trainer.load_state_dict(state)`` with every failure (missing weights, wrong shapes, a
    broken optimizer state) a one-line ``ValueError`` naming the file."""
    try:
        trainer.load_state_dict(state)
    except ValueError as err:
        if str(err).startswith("checkpoint:"):
            raise
        raise ValueError(f"checkpoint: {path} holds a malformed run state ({_first_line(err)})") from None
    except (KeyError, TypeError, RuntimeError, IndexError, AttributeError) as err:
        raise ValueError(
            f"checkpoint: {path} holds a malformed run state ({type(err).__name__}: {_first_line(err)})"
        ) from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def evaluate_checkpoint(path, device: str = "auto") -> dict:
    """Held-out greedy and sampled accuracy of the policy in a checkpoint."""
    state, config = load_run_state(path)
    config = dataclasses.replace(config, device=device)
    trainer = Trainer(config)
    restore_trainer(trainer, state, path)
    result = trainer.evaluate()
    result.update(phase=trainer.phase, step=trainer.step, warmup_steps=trainer.sft_step, task=config.task)
    return result


def init_policy(trainer: Trainer, state: dict, path) -> None:
    """Start RL from the policy weights of a checkpoint (e.g. a saved warm-up), so several presets
    start from the same policy: the warm-up is marked done, the reference is this policy, the
    optimizer and random streams are this run's own. A value head (PPO-RLHF) absent from the
    checkpoint keeps its fresh initialisation."""
    from refimpl.lm.checkpoint import check_model_config

    saved = {k: v for k, v in state["model_config"].items() if k != "value_head"}
    expected = {k: v for k, v in trainer.model_config.to_dict().items() if k != "value_head"}
    check_model_config(saved, expected, path)
    weights = {k: v for k, v in state["model"].items() if not k.startswith("value.")}
    try:
        missing, unexpected = trainer.model.load_state_dict(weights, strict=False)
    except RuntimeError as err:
        raise ValueError(f"checkpoint: {path} holds malformed weights ({_first_line(err)})") from None
    if unexpected or any(not k.startswith("value.") for k in missing):
        raise ValueError(f"checkpoint: {path} holds other weights (missing {missing}, extra {unexpected})")
    trainer.sft_step = int(state["sft_step"])
    trainer.evaluate()
    trainer.finish_warmup()


def sample_checkpoint(path, n: int = 8, seed: int = 0, device: str = "auto") -> list[str]:
    """Lines showing ``n`` held-out prompts with one sampled answer each (at the run's
    temperature / top-k), the target and the reward."""
    from refimpl.lm.rollout import generate
    from refimpl.lm.tasks import EOS, PAD, decode

    if n < 1:
        raise ValueError(f"--n: expected a positive integer, got {n}")
    state, config = load_run_state(path)
    trainer = Trainer(dataclasses.replace(config, device=device))
    restore_trainer(trainer, state, path)
    problems = trainer.eval_set.index(torch.arange(min(n, len(trainer.eval_set)), device=trainer.device))
    trainer.model.eval()
    with torch.no_grad():
        ro = generate(
            trainer.model,
            problems.prompts,
            max_new_tokens=config.max_new_tokens,
            eos=EOS,
            pad=PAD,
            temperature=config.temperature,
            top_k=config.top_k,
            generator=torch.Generator(trainer.device).manual_seed(seed),
        )
    rewards = trainer.task.rewards(ro.responses, ro.lengths, problems, kind=config.reward)
    where = f"{trainer.phase} step {trainer.step if trainer.phase == 'rl' else trainer.sft_step}"
    lines = [f"{path}: {config.task}, loss {config.loss}, {where}, reward {config.reward}"]
    for i in range(len(problems)):
        prompt = decode(problems.prompts[i])
        answer = decode(ro.responses[i, : int(ro.lengths[i])])
        target = decode(problems.targets[i, : int(problems.target_lengths[i])])
        lines.append(f"{prompt!r:>14} -> {answer!r:<12} target {target!r:<10} reward {float(rewards[i]):.2f}")
    return lines


# ---------------------------------------------------------------------------------------------
# the output folder and its metrics


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


def _prepare_folder(out_dir, resume, state: dict | None) -> tuple[RunFolder, list[str]]:
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
# the run


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


def _title(config: TrainConfig) -> str:
    return f"{config.task}, loss {config.loss}, seed {config.seed}"


def resume_command(checkpoint: Path) -> str:
    """The command that continues a run from ``checkpoint`` (in the checkpoint's own folder)."""
    return f"refimpl train --resume {shlex.quote(str(checkpoint))}"


def _load_for(option: str, path) -> tuple[dict, TrainConfig]:
    try:
        return load_run_state(path)
    except (FileNotFoundError, ValueError) as err:
        raise RunError(f"{option}: {err}") from None


def _start(config, out_dir, resume, init_from, steps_override):
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
        raise RunError(_first_line(err)) from None  # "device: 'cuda' requested but CUDA is not available"
    folder, metrics_lines = _prepare_folder(out_dir, resume, state)
    return config, state, init_state, folder, metrics_lines


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
    config, state, init_state, folder, lines = _start(config, out_dir, resume, init_from, steps_override)
    started_here = dist_lib.init_from_env(resolve_device(config.device))
    try:
        trainer = Trainer(config)
        try:
            if state is not None:
                restore_trainer(trainer, state, resume)
            if init_state is not None:
                init_policy(trainer, init_state, init_from)
        except ValueError as err:
            raise RunError(f"{'--resume' if state is not None else '--init-from'}: {err}") from None
        if trainer.rank == 0:
            folder.root.mkdir(parents=True, exist_ok=True)
            folder.config.write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n")
            folder.metrics.write_text("".join(f"{line}\n" for line in lines))
        with _InterruptFlag() as interrupt:
            run = Run(trainer, folder, _output_mode(progress), interrupt)
            try:
                if trainer.phase == "sft":
                    warmup_phase(run)
                elif init_state is not None:
                    run.save()  # RL's start: a checkpoint even before the first step
                rl_phase(run)
            except NonFiniteLossError as err:
                run.progress.close()
                print(f"error: {err}", file=sys.stderr)
                return 1
            except _StopRequested:  # between steps: the state is consistent, save it
                run.progress.close()
                run.save()
                if run.main:
                    print(
                        f"interrupted: checkpoint saved to {folder.checkpoint}; continue with: "
                        f"{resume_command(folder.checkpoint)}",
                        file=sys.stderr,
                    )
                return 130
        finish(run, plot)
        return 0
    finally:
        if started_here:
            torch.distributed.destroy_process_group()


def _output_mode(progress: bool | str) -> str:
    if progress is False or progress == "quiet":
        return "quiet"
    if progress is True:
        return "bar" if sys.stdout.isatty() else "lines"
    if progress not in ("bar", "lines"):
        raise ValueError(f"progress: expected True, False, 'quiet', 'bar' or 'lines', got {progress!r}")
    return progress

"""``refimpl train`` under faults: nothing lost, nothing silent, every advice a command that works.

A run folder has one owner (a second trainer or resume is refused naming the first; a lock left
by a dead process is taken over and reported); a kill at any moment of the warm-up leaves a run
that resumes bit for bit; a torn last metrics record is dropped with a note, damage elsewhere is
one line naming the line; a full disk is one line naming the file and "No space left on device",
exit 74, the partial file removed and the last checkpoint untouched; folders mixed by versions
before the lock are recovered by the command the refusal prints."""

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from refimpl.lm import cli
from refimpl.lm.checkpoint import load_checkpoint
from refimpl.lm.lock import LOCK_NAME, RunLock
from refimpl.lm.train import Trainer

TINY = [
    "--steps", "2", "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--prompts-per-step", "4",
    "--group-size", "4", "--eval-size", "16", "--sft-target-accuracy", "1.0", "--sft-max-steps", "2",
    "--sft-eval-every", "1", "--sft-batch-size", "8", "--eval-every", "1", "--seed", "3",
    "--device", "cpu", "--quiet",
]  # fmt: skip
# a warm-up of 5 steps saved every 2 (and a checkpoint at its start)
WARM = [*TINY, "--sft-max-steps", "5", "--checkpoint-every", "2"]


def run(argv) -> int:
    """The exit status of ``refimpl ARGV``, run in this process."""
    parser = argparse.ArgumentParser(prog="refimpl")
    cli.register(parser.add_subparsers(dest="command", required=True))
    try:
        args = parser.parse_args([str(a) for a in argv])
    except SystemExit as err:
        return int(err.code)
    return args.func(args)


def run_printed(command: str) -> int:
    """A command the trainer printed (``PYTHON -m refimpl train ...``), run as printed but in this
    process."""
    words = shlex.split(command)
    assert words[:3] == [sys.executable, "-m", "refimpl"], command
    return run(words[3:])


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def untimed(recs: list[dict]) -> list[dict]:
    """Records without what differs between two computations of the same run."""
    skip = ("wall_time", "cpu_time", "run")
    return [{k: v for k, v in r.items() if k not in skip and not k.endswith("_per_s")} for r in recs]


def assert_same_run(a: Path, b: Path) -> None:
    """Two folders hold the same run: metrics (timings aside) and final weights bit for bit."""
    assert untimed(records(a / "metrics.jsonl")) == untimed(records(b / "metrics.jsonl"))
    wa, wb = load_checkpoint(a / "checkpoint.pt")["model"], load_checkpoint(b / "checkpoint.pt")["model"]
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def one_line(capsys, *needles) -> str:
    """stderr is exactly one line (no traceback) holding every needle."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return err.strip()


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """An uninterrupted run of WARM (5 warm-up steps, 2 RL steps)."""
    out = tmp_path_factory.mktemp("whole")
    assert run(["train", "--out", out, *WARM]) == 0
    return out


@pytest.fixture
def copy_of(whole, tmp_path):
    """A fresh copy of the uninterrupted run's folder."""
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    return out


# ------------------------------------------------------------------------------ one owner per folder


@pytest.mark.parametrize("how", ["new run", "--resume", "--overwrite"])
def test_a_folder_in_use_is_refused_naming_the_running_trainer(how, copy_of, capsys):
    """While another process holds the folder (its lock, as a live trainer holds it), a second
    trainer, a resume of its checkpoint and even --overwrite are refused in one line naming it,
    and nothing in the folder changes."""
    argv = {
        "new run": ["train", "--out", copy_of, *WARM],
        "--resume": ["train", "--resume", copy_of / "checkpoint.pt", "--steps", "3"],
        "--overwrite": ["train", "--out", copy_of, *WARM, "--overwrite"],
    }[how]
    with RunLock(copy_of):
        before = snapshot(copy_of)
        assert run(argv) == 2
        one_line(capsys, f"--out: {copy_of} is in use", f"pid {os.getpid()} on host {socket.gethostname()}")
        assert snapshot(copy_of) == before
    assert not (copy_of / LOCK_NAME).exists()  # the holder gave it back on exit


def test_the_lock_is_released_on_exit_and_a_dead_holders_lock_is_reported(copy_of, capsys):
    """A lock file whose holder died (kill -9 leaves one; its flock went with the process) is
    taken over with a note naming the dead pid and host; the run's own lock is gone after it."""
    dead = {"pid": 999999, "host": "node-7", "command": "refimpl train"}
    (copy_of / LOCK_NAME).write_text(json.dumps(dead))
    capsys.readouterr()
    assert run(["train", "--resume", copy_of / "checkpoint.pt", "--steps", "3"]) == 0
    err = one_line(capsys, "pid 999999 on host node-7", "no longer running")
    assert err.startswith("note: ")
    assert not (copy_of / LOCK_NAME).exists()
    assert [r["step"] for r in records(copy_of / "metrics.jsonl") if r["phase"] == "rl"] == [1, 2, 3]


def _start(tmp_path, argv) -> subprocess.Popen:
    """``python -m refimpl ARGV`` in ``tmp_path``, as a user starts it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "refimpl", *argv]
    return subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen, ready, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.01)


def test_a_second_trainer_beside_a_running_one_is_refused(tmp_path, monkeypatch, capsys):
    """A real trainer process runs in a folder; a second trainer and a resume of its checkpoint
    are refused in one line naming its pid; it goes on undisturbed (one run in its metrics)."""
    monkeypatch.chdir(tmp_path)
    proc = _start(tmp_path, ["train", "--out", "r", *WARM, "--steps", "400"])
    metrics = tmp_path / "r" / "metrics.jsonl"
    _wait_for(proc, lambda: metrics.is_file() and metrics.read_text().count("\n") >= 2)
    assert run(["train", "--out", "r", *WARM]) == 2
    one_line(capsys, "--out: r is in use by a running refimpl train", f"(pid {proc.pid} on host ")
    assert run(["train", "--resume", "r/checkpoint.pt"]) == 2
    one_line(capsys, "--out: r is in use", f"(pid {proc.pid} on host ")
    proc.send_signal(signal.SIGINT)
    assert (
        proc.communicate(timeout=120)[1].startswith("interrupted: checkpoint saved")
        and proc.returncode == 130
    )
    assert len({r["run"] for r in records(metrics)}) == 1 and not (tmp_path / "r" / LOCK_NAME).exists()


# ------------------------------------------------------------------------------ warm-up checkpoints


class _Killed(BaseException):
    """Stands for SIGKILL in this process: nothing after it runs (no save, no summary)."""


@pytest.mark.parametrize("kill_at", [1, 4])
def test_a_kill_anywhere_in_the_warm_up_resumes_bit_for_bit(kill_at, whole, tmp_path, monkeypatch, capsys):
    """Killed inside warm-up step ``kill_at`` (before it is logged): the folder holds a checkpoint
    (the run's start, then every 2 steps); the same command again is refused with a command that
    resumes, and that command, run as printed, ends with the uninterrupted run bit for bit."""
    real = Trainer.sft_step_once

    def killed_inside(self):
        if self.sft_step + 1 == kill_at:
            raise _Killed
        return real(self)

    monkeypatch.setattr(Trainer, "sft_step_once", killed_inside)
    out = tmp_path / "run"
    with pytest.raises(_Killed):
        run(["train", "--out", out, *WARM])
    monkeypatch.setattr(Trainer, "sft_step_once", real)
    assert load_checkpoint(out / "checkpoint.pt")["sft_step"] == (kill_at - 1) // 2 * 2
    capsys.readouterr()
    assert run(["train", "--out", out, *WARM]) == 2
    command = one_line(capsys, "continue it with: ").split("continue it with: ")[1].split(";")[0]
    assert run_printed(command) == 0
    assert_same_run(whole, out)


def test_an_uninterrupted_run_saves_the_warm_up_without_changing_it(whole):
    """The warm-up's checkpoints read nothing random: the run is today's (5 warm-up records, then
    RL), and the last checkpoint is RL's."""
    recs = records(whole / "metrics.jsonl")
    assert [r.get("sft_step") for r in recs if r["phase"] == "sft"] == [1, 2, 3, 4, 5]
    assert load_checkpoint(whole / "checkpoint.pt")["step"] == 2


def test_a_real_sigkill_in_the_warm_up_resumes_with_the_printed_command(tmp_path, monkeypatch, capsys):
    """``kill -9`` of ``python -m refimpl train`` in its warm-up: the same command again reports
    the dead trainer and prints the command that continues; run as printed, it ends equal to an
    uninterrupted run bit for bit."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--out", "r", *WARM, "--sft-max-steps", "30"]
    proc = _start(tmp_path, argv)
    metrics = tmp_path / "r" / "metrics.jsonl"
    _wait_for(proc, lambda: metrics.is_file() and metrics.read_text().count("\n") >= 3)
    proc.kill()
    proc.communicate(timeout=60)
    assert '"phase": "rl"' not in metrics.read_text()  # killed in the warm-up
    assert run(argv) == 2
    note, refusal = capsys.readouterr().err.splitlines()
    assert (
        note.startswith(f"note: r/{LOCK_NAME} was left by pid {proc.pid} on host ")
        and "no longer running" in note
    )
    command = refusal.split("continue it with: ")[1].split(";")[0]
    assert command == f"{shlex.quote(sys.executable)} -m refimpl train --resume r/checkpoint.pt"
    assert run_printed(command) == 0
    assert run(["train", "--out", "whole", *argv[3:]]) == 0
    assert_same_run(tmp_path / "whole", tmp_path / "r")


def test_a_folder_without_a_checkpoint_is_not_advised_to_resume(tmp_path, capsys):
    """A folder an older version left without a checkpoint (killed in its warm-up): the refusal
    does not name a file that is not there, and its advice (--overwrite) works."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{}\n")
    (out / "metrics.jsonl").write_text('{"phase": "sft", "sft_step": 1, "run": "old"}\n')
    assert run(["train", "--out", out, *TINY]) == 2
    err = one_line(capsys, "saved no checkpoint", "--overwrite")
    assert "--resume" not in err and "checkpoint.pt" not in err
    assert run(["train", "--out", out, *TINY, "--overwrite"]) == 0
    assert load_checkpoint(out / "checkpoint.pt")["step"] == 2

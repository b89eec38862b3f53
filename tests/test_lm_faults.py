"""``refimpl train`` under faults: nothing lost, nothing silent, every advice a command that works.

A run folder has one owner (a second trainer or resume is refused naming the first; a lock left
by a dead process is taken over and reported); a kill at any moment of the warm-up leaves a run
that resumes bit for bit; a torn last metrics record is dropped with a note, damage elsewhere is
one line naming the line; a full disk is one line naming the file and "No space left on device",
exit 74, the partial file removed and the last checkpoint untouched; folders mixed by versions
before the lock are recovered by the command the refusal prints."""

import argparse
import errno
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from refimpl.lm import cli, files
from refimpl.lm import run as run_module
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
    taken over with a note naming the dead pid and host, and the partial checkpoint it was
    writing is removed with another; the run's own lock is gone after it."""
    dead = {"pid": 999999, "host": "node-7", "command": "refimpl train"}
    (copy_of / LOCK_NAME).write_text(json.dumps(dead))
    (copy_of / "checkpoint.pt.tmp").write_bytes(b"PK\x03\x04 half a checkpoint")
    capsys.readouterr()
    assert run(["train", "--resume", copy_of / "checkpoint.pt", "--steps", "3"]) == 0
    lock_note, tmp_note = capsys.readouterr().err.splitlines()
    assert lock_note.startswith(f"note: {copy_of / LOCK_NAME} was left by pid 999999 on host node-7")
    assert "no longer running" in lock_note
    assert (
        tmp_note
        == f"note: removed {copy_of / 'checkpoint.pt.tmp'}, the partial file of a save that was interrupted"
    )
    assert not (copy_of / LOCK_NAME).exists() and not (copy_of / "checkpoint.pt.tmp").exists()
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


def test_a_real_trainer_refuses_a_second_and_after_kill_9_resumes_bit_for_bit(tmp_path, monkeypatch, capsys):
    """A real ``python -m refimpl train`` in its warm-up: a second trainer and a resume of its
    checkpoint are refused in one line naming its pid. Then ``kill -9``: the same command again
    reports the dead trainer and prints the command that continues; run as printed, it ends equal
    to an uninterrupted run bit for bit."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--out", "r", *WARM, "--sft-max-steps", "60"]
    proc = _start(tmp_path, argv)
    metrics = tmp_path / "r" / "metrics.jsonl"
    _wait_for(proc, lambda: metrics.is_file() and metrics.read_text().count("\n") >= 2)
    assert run(argv) == 2
    one_line(capsys, "--out: r is in use by a running refimpl train", f"(pid {proc.pid} on host ")
    assert run(["train", "--resume", "r/checkpoint.pt"]) == 2
    one_line(capsys, "--out: r is in use", f"(pid {proc.pid} on host ")
    proc.kill()
    proc.communicate(timeout=60)
    assert '"phase": "rl"' not in metrics.read_text()  # killed in the warm-up
    assert run(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    notes, (refusal,) = (
        [n for n in lines if n.startswith("note: ")],
        [n for n in lines if not n.startswith("note: ")],
    )
    assert notes[0].startswith(f"note: r/{LOCK_NAME} was left by pid {proc.pid} on host ")
    assert "no longer running" in notes[0]
    # killed in the middle of a save, the partial file is removed and said so
    assert notes[1:] in (
        [],
        ["note: removed r/checkpoint.pt.tmp, the partial file of a save that was interrupted"],
    )
    command = refusal.split("continue it with: ")[1].split(";")[0]
    assert command == f"{shlex.quote(sys.executable)} -m refimpl train --resume r/checkpoint.pt"
    assert run_printed(command) == 0
    assert len({r["run"] for r in records(metrics)}) == 1
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


# ------------------------------------------------------------------------------ folders mixed before the lock


def _interleave(a: list[str], b: list[str]) -> list[str]:
    """Lines of two writers appending at once: alternately, the rest of the longer at the end."""
    out = []
    for i in range(max(len(a), len(b))):
        out += a[i : i + 1] + b[i : i + 1]
    return out


def test_a_folder_two_trainers_wrote_is_recovered_by_the_printed_command(whole, tmp_path, capsys):
    """Two trainers on one --out with a version without the lock: metrics of two run ids
    interleaved and the checkpoint of whichever saved last. Resuming in place is refused with a
    command; that command, run as printed, continues the checkpoint's run in a fresh folder
    (only its records), and the mixed folder is left as it was: nothing lost."""
    mixed = tmp_path / "mixed"
    shutil.copytree(whole, mixed)
    ours = (whole / "metrics.jsonl").read_text().splitlines()
    theirs = [json.dumps({**json.loads(line), "run": "0123456789ab", "reward": 0.5}) for line in ours[:6]]
    (mixed / "metrics.jsonl").write_text("\n".join(_interleave(theirs, ours)) + "\n")
    before = snapshot(mixed)
    capsys.readouterr()
    assert run(["train", "--resume", mixed / "checkpoint.pt", "--steps", "3"]) == 2
    err = one_line(
        capsys, f"{mixed / 'metrics.jsonl'} mixes this run's records with the records of another run"
    )
    command = err.split("nothing lost, with: ")[1]
    run_id = records(whole / "metrics.jsonl")[0]["run"]
    assert command.endswith(f"--out {tmp_path / f'mixed-{run_id}'}")
    assert run_printed(command + " --steps 3") == 0
    assert snapshot(mixed) == before
    recovered = records(tmp_path / f"mixed-{run_id}" / "metrics.jsonl")
    assert {r["run"] for r in recovered} == {run_id}
    assert untimed(recovered[:-1]) == untimed(records(whole / "metrics.jsonl"))
    assert [r["step"] for r in recovered if r["phase"] == "rl"] == [1, 2, 3]


def test_a_mixed_folder_resumed_in_place_with_overwrite_drops_the_other_run(whole, tmp_path, capsys):
    mixed = tmp_path / "mixed"
    shutil.copytree(whole, mixed)
    ours = (whole / "metrics.jsonl").read_text().splitlines()
    theirs = [json.dumps({**json.loads(line), "run": "0123456789ab"}) for line in ours]
    (mixed / "metrics.jsonl").write_text("\n".join(_interleave(ours, theirs)) + "\n")
    capsys.readouterr()
    assert run(["train", "--resume", mixed / "checkpoint.pt", "--overwrite"]) == 0
    one_line(capsys, "--overwrite: dropped from", "0123456789ab (7 records)")
    assert untimed(records(mixed / "metrics.jsonl")) == untimed(records(whole / "metrics.jsonl"))


def test_steps_written_twice_by_two_resumes_are_kept_once(copy_of, capsys):
    """Two resumes of one checkpoint at once (before the lock) wrote each RL step twice, equal but
    for their timings: a resume keeps each step once and says so."""
    lines = (copy_of / "metrics.jsonl").read_text().splitlines()
    sft, rl = lines[:5], lines[5:]
    twice = [json.dumps({**json.loads(line), "wall_time": 1e6}) for line in rl]
    (copy_of / "metrics.jsonl").write_text("\n".join(sft + _interleave(rl, twice)) + "\n")
    capsys.readouterr()
    assert run(["train", "--resume", copy_of / "checkpoint.pt", "--steps", "3"]) == 0
    one_line(capsys, "held 2 repeated record(s)", "each step is kept once")
    recs = records(copy_of / "metrics.jsonl")
    assert [r.get("sft_step", r.get("step")) for r in recs] == [1, 2, 3, 4, 5, 1, 2, 3]
    assert [r["wall_time"] for r in recs[:7]] == [json.loads(line)["wall_time"] for line in lines]


def test_two_different_records_of_one_step_are_one_line_naming_both(copy_of, capsys):
    lines = (copy_of / "metrics.jsonl").read_text().splitlines()
    other = json.dumps({**json.loads(lines[5]), "reward": -1.0})
    (copy_of / "metrics.jsonl").write_text("\n".join([*lines, other]) + "\n")
    before = snapshot(copy_of)
    assert run(["train", "--resume", copy_of / "checkpoint.pt", "--steps", "3"]) == 2
    one_line(capsys, "lines 6 and 8 are two different records of rl step 1")
    assert snapshot(copy_of) == before


# ------------------------------------------------------------------------------ metrics.jsonl


def test_a_torn_last_record_is_dropped_with_a_note(copy_of, capsys):
    """Killed in the middle of an append: the last line is part of a record, without its newline.
    The resume drops it with one note and continues; the file is whole again."""
    whole_text = (copy_of / "metrics.jsonl").read_text()
    (copy_of / "metrics.jsonl").write_text(whole_text + '{"phase": "rl", "step": 3, "rew')
    capsys.readouterr()
    assert run(["train", "--resume", copy_of / "checkpoint.pt", "--steps", "3"]) == 0
    one_line(capsys, f"note: {copy_of / 'metrics.jsonl'} line 8 is a torn record", "dropped")
    text = (copy_of / "metrics.jsonl").read_text()
    assert (
        text.startswith(whole_text) and [r.get("step") for r in records(copy_of / "metrics.jsonl")][-1] == 3
    )


@pytest.mark.parametrize(
    "damage, line",
    [
        (lambda lines: [lines[0], "{not json", *lines[1:]], 2),  # in the middle
        (lambda lines: [*lines, "[1, 2]"], 8),  # a complete last line that is no record
        (lambda lines: [lines[0][:20], *lines[1:]], 1),  # torn, but not the last: not a kill's trace
    ],
    ids=["middle", "last-line-complete", "torn-first-line"],
)
def test_damage_before_the_last_line_is_one_line_naming_it(damage, line, copy_of, capsys):
    lines = (copy_of / "metrics.jsonl").read_text().splitlines()
    (copy_of / "metrics.jsonl").write_text("\n".join(damage(lines)) + "\n")
    before = snapshot(copy_of)
    assert run(["train", "--resume", copy_of / "checkpoint.pt", "--steps", "3"]) == 2
    one_line(capsys, f"--resume: {copy_of / 'metrics.jsonl'} line {line} is not a JSON record")
    assert snapshot(copy_of) == before


# ------------------------------------------------------------------------------ disk full


def _disk_full_after(monkeypatch, budget: int) -> None:
    """The disk fills up after ``budget`` more bytes: a write gets what fits, then ENOSPC."""
    real, left = files._write, [budget]

    def write(fd, data):
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done = real(fd, bytes(data[: left[0]]))
        left[0] -= done
        return done

    monkeypatch.setattr(files, "_write", write)


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_last_checkpoint(
    whole, tmp_path, monkeypatch, capsys
):
    """The disk fills up in the middle of a checkpoint: one line naming the file and "No space
    left on device", exit 74 (not 1), no partial file left, the last checkpoint byte for byte as
    it was; once there is room the printed command finishes the run equal to the uninterrupted one."""
    out = tmp_path / "run"
    real_save = run_module.Run.save
    saves = []

    def save_then_fill(self):
        saves.append(self.trainer.sft_step)
        if len(saves) == 3:  # the third save (warm-up step 4) finds the disk nearly full
            kept.update(bytes=(out / "checkpoint.pt").read_bytes())
            _disk_full_after(monkeypatch, 1000)
        real_save(self)

    kept = {}
    monkeypatch.setattr(run_module.Run, "save", save_then_fill)
    capsys.readouterr()
    assert run(["train", "--out", out, *WARM]) == 74
    err = one_line(capsys, f"error: cannot write {out / 'checkpoint.pt'}: No space left on device (ENOSPC)")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "config.json", "metrics.jsonl"]
    assert (out / "checkpoint.pt").read_bytes() == kept["bytes"]
    monkeypatch.undo()
    command = err.split("continue with: ")[1]
    assert run_printed(command) == 0
    assert_same_run(whole, out)


def test_a_full_disk_while_logging_leaves_no_torn_record(copy_of, monkeypatch, capsys):
    """The disk fills up in the middle of a metrics record: the record is cut back whole, exit 74,
    and the printed command continues the run."""
    before = (copy_of / "metrics.jsonl").read_text()
    real_log = run_module.Run.log

    def log_on_a_full_disk(self, record):
        _disk_full_after(monkeypatch, 10)
        real_log(self, record)

    monkeypatch.setattr(run_module.Run, "log", log_on_a_full_disk)
    capsys.readouterr()
    assert run(["train", "--resume", copy_of / "checkpoint.pt", "--steps", "3"]) == 74
    err = one_line(capsys, f"cannot write {copy_of / 'metrics.jsonl'}: No space left on device")
    assert (copy_of / "metrics.jsonl").read_text() == before
    monkeypatch.undo()
    assert run_printed(err.split("continue with: ")[1] + " --steps 3") == 0
    assert [r.get("step") for r in records(copy_of / "metrics.jsonl")][-1] == 3


def test_a_second_ctrl_c_is_one_line_with_the_command_that_continues(copy_of, monkeypatch, capsys):
    def ctrl_c_twice(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "rl_step", ctrl_c_twice)
    capsys.readouterr()
    try:
        code = run(["train", "--resume", copy_of / "checkpoint.pt", "--steps", "3"])
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt escaped the trainer (a traceback)")
    assert code == 130
    err = one_line(capsys, "interrupted at once", "continue with: ")
    monkeypatch.undo()
    assert run_printed(err.split("continue with: ")[1] + " --steps 3") == 0
    assert not (copy_of / LOCK_NAME).exists()

"""``refimpl train`` / ``eval`` / ``sample`` / ``compare``: the smoke run (the CI version of the README
main job), every user mistake as one line on stderr with exit status 2, resume in the run's own
folder with one continuous metrics file, the output a person reads."""

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from refimpl.lm import cli
from refimpl.lm.checkpoint import load_checkpoint, save_checkpoint
from refimpl.lm.progress import format_duration
from refimpl.lm.train import Trainer

TINY = [
    "--steps",
    "2",
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--n-embd",
    "16",
    "--prompts-per-step",
    "4",
    "--group-size",
    "4",
    "--eval-size",
    "16",
    "--sft-target-accuracy",
    "1.0",
    "--sft-max-steps",
    "2",
    "--sft-eval-every",
    "1",
    "--sft-batch-size",
    "8",
    "--eval-every",
    "1",
    "--seed",
    "3",
    "--device",
    "cpu",
]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="refimpl")
    cli.register(p.add_subparsers(dest="command", required=True))
    return p


def run(argv) -> int:
    """The exit status of ``refimpl ARGV`` (argparse's own errors included)."""
    try:
        args = parser().parse_args([str(a) for a in argv])
    except SystemExit as err:
        return int(err.code)
    return args.func(args)


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_then_eval_smoke(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["train", "--task", "addition", "--loss", "dapo", "--quiet", "--out", out, *TINY]) == 0
    for name in ("metrics.jsonl", "checkpoint.pt", "summary.json", "curves.png", "config.json"):
        assert (out / name).stat().st_size > 0, name
    recs = records(out / "metrics.jsonl")
    assert [r["phase"] for r in recs] == ["sft", "sft", "rl", "rl"]
    assert {"reward", "accuracy", "entropy", "clip_fraction", "rollout_tokens_per_s"} <= set(recs[-1])
    config = json.loads((out / "config.json").read_text())
    assert config["seed"] == 3 and config["n_embd"] == 16 and config["loss"] == "dapo"
    stdout = capsys.readouterr().out
    # --quiet: only the closing summary, with the paths of what was written
    assert stdout.startswith("done: 2 RL steps (addition, loss dapo, seed 3)")
    for name in ("curves.png", "metrics.jsonl", "checkpoint.pt", "summary.json"):
        assert f"{out / name}" in stdout
    assert "warm-up" not in stdout.splitlines()[0]
    assert run(["eval", out / "checkpoint.pt", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["step"] == 2 and result["task"] == "addition"
    assert 0.0 <= result["eval_greedy_accuracy"] <= 1.0
    # resume (into the checkpoint's own folder, no --out): only --steps may change
    assert run(["train", "--resume", out / "checkpoint.pt", "--steps", "3", "--quiet"]) == 0
    assert [r["phase"] for r in records(out / "metrics.jsonl")] == ["sft", "sft", "rl", "rl", "rl"]
    assert json.loads((out / "summary.json").read_text())["steps"] == 3
    assert run(["train", "--resume", out / "checkpoint.pt", "--lr", "1"]) == 2


def test_plain_lines_without_a_terminal(tmp_path, capsys):
    """Not a terminal (pytest captures stdout): periodic plain lines, held-out accuracy first,
    the end of the warm-up said in a line, then the summary."""
    assert run(["train", "--out", tmp_path, *TINY]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("warm-up done after 2 steps (target 100.0% NOT reached)") for line in lines)
    rl = [line for line in lines if line.startswith("RL step ")]
    assert len(rl) == 2 and rl[0].startswith("RL step 1/2: held-out sampled ")
    assert "\r" not in "".join(lines)  # no progress-bar redraws in a log file
    assert lines[-1] == f"summary:    {tmp_path / 'summary.json'}"


def _one_line_error(capsys, *needles) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    for needle in needles:
        assert needle in err, (needle, err)
    assert "Traceback" not in err and "weights_only" not in err
    return err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained")
    assert run(["train", "--quiet", "--out", out, *TINY]) == 0
    return out


def _malformed_checkpoint(path, trained, drop=None, replace=None):
    state = load_checkpoint(trained / "checkpoint.pt")
    if drop:
        del state[drop]
    if replace:
        state.update(replace)
    save_checkpoint(path, state)
    return path


@pytest.mark.parametrize(
    "mistake",
    [
        "resume_missing",
        "out_is_file",
        "cuda_without_cuda",
        "device_gpu",
        "kl_estimator_k4",
        "aggregation_sum",
        "eps_high_text",
        "task_division",
        "group_size_1",
        "group_size_text",
        "payload_no_model",
        "payload_bad_weights",
        "payload_bad_config",
        "eval_png",
        "eval_missing",
        "eval_payload_no_optimizer",
        "init_from_missing",
    ],
)
def test_each_user_mistake_is_one_line_and_exit_2(mistake, tmp_path, trained, capsys, monkeypatch):
    png = tmp_path / "curves.png"
    png.write_bytes((trained / "curves.png").read_bytes())
    afile = tmp_path / "afile"
    afile.write_text("x")
    bad = tmp_path / "bad.pt"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv, needles = {
        "resume_missing": lambda: (["train", "--resume", tmp_path / "nope.pt"], ["--resume", "no file at"]),
        "out_is_file": lambda: (["train", "--out", afile, *TINY], ["--out", "is a file"]),
        "cuda_without_cuda": lambda: (
            ["train", "--out", tmp_path, *TINY, "--device", "cuda"],
            ["device", "CUDA"],
        ),
        "device_gpu": lambda: (["train", "--out", tmp_path, *TINY, "--device", "gpu"], ["device", "'gpu'"]),
        "kl_estimator_k4": lambda: (["train", "--kl-estimator", "k4"], ["--kl-estimator", "k1, k2, k3"]),
        "aggregation_sum": lambda: (
            ["train", "--aggregation", "sum"],
            ["--aggregation", "token_mean, seq_sum"],
        ),
        "eps_high_text": lambda: (["train", "--eps-high", "high"], ["--eps-high", "'high'"]),
        "task_division": lambda: (["train", "--task", "division"], ["--task", "addition, sort"]),
        "group_size_1": lambda: (["train", "--group-size", "1"], ["group_size"]),
        "group_size_text": lambda: (["train", "--group-size", "eight"], ["--group-size", "'eight'"]),
        "payload_no_model": lambda: (
            ["train", "--resume", _malformed_checkpoint(bad, trained, drop="model")],
            ["--resume", "bad.pt", "malformed", "model"],
        ),
        "payload_bad_weights": lambda: (
            [
                "train",
                "--resume",
                _malformed_checkpoint(bad, trained, replace={"model": {"w": torch.ones(2)}}),
            ],
            ["--resume", "bad.pt", "malformed"],
        ),
        "payload_bad_config": lambda: (
            ["train", "--resume", _malformed_checkpoint(bad, trained, replace={"config": {"colour": 1}})],
            ["--resume", "bad.pt", "invalid config", "colour"],
        ),
        "eval_png": lambda: (
            ["eval", png, "--device", "cpu"],
            ["curves.png", "not a readable refimpl checkpoint"],
        ),
        "eval_missing": lambda: (["eval", tmp_path / "missing.pt", "--device", "cpu"], ["no file at"]),
        "eval_payload_no_optimizer": lambda: (
            ["eval", _malformed_checkpoint(bad, trained, drop="optimizer"), "--device", "cpu"],
            ["bad.pt", "optimizer"],
        ),
        "init_from_missing": lambda: (
            ["train", "--init-from", tmp_path / "nope.pt"],
            ["--init-from", "no file"],
        ),
    }[mistake]()
    assert run(argv) == 2
    _one_line_error(capsys, *needles)


def test_help_lists_the_choices_of_every_flag(capsys):
    assert run(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag, choices in [
        ("--task", "{addition,sort}"),
        ("--loss", "{grpo,dr_grpo,dapo,bnpo,gspo,gspo_token,sapo,cispo,ppo_rlhf,prorl,magistral,ppo}"),
        ("--reward", "{exact,partial}"),
        ("--kl-estimator", "{k1,k2,k3}"),
        ("--aggregation",
         "{seq_mean_token_mean,token_mean,seq_sum,seq_mean_token_sum,seq_mean,seq_sqrt_token_mean}"),
        ("--zero-signal", "{resample,upweight,keep}"),
        ("--advantage-scale", "{none,group,batch}"),
        ("--positions", "{learned,rope}"),
    ]:
        assert f"{flag} {choices}" in text, flag
    assert "--device DEVICE auto (CUDA when present), cpu, cuda or cuda:N" in text
    assert "--dynamic-sampling DYNAMIC_SAMPLING true or false or none" in text
    # what a left-out option means comes from the recipes (refimpl.lm.recipes)
    assert "left out: the loss's own (on for dapo, on for magistral, off otherwise)" in text
    assert "left out: the loss's own (none for dr_grpo, batch for magistral, group otherwise)" in text


def test_resume_after_ctrl_c_with_the_printed_command(tmp_path, capsys, monkeypatch):
    """Ctrl-C prints a command; run as printed (from the same working folder) it continues the
    same run folder, and the metrics are one continuous file equal to an uninterrupted run's."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--quiet", *TINY, "--steps", "4"]
    assert run([*argv, "--out", "whole"]) == 0
    real_step = Trainer.rl_step

    def step_then_ctrl_c(self):
        metrics = real_step(self)
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return metrics

    monkeypatch.setattr(Trainer, "rl_step", step_then_ctrl_c)
    capsys.readouterr()
    assert run([*argv, "--out", "runs/r2"]) == 130
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    command = err.split("continue with: ")[1]
    # called in-process (not as the refimpl program): this interpreter's -m refimpl
    assert command == f"{shlex.quote(sys.executable)} -m refimpl train --resume runs/r2/checkpoint.pt"
    monkeypatch.setattr(Trainer, "rl_step", real_step)
    assert run(shlex.split(command)[3:]) == 0
    assert not (tmp_path / "runs" / "train").exists()

    def strip(recs):
        return [
            {k: v for k, v in r.items() if k not in ("wall_time", "cpu_time", "run") and "per_s" not in k}
            for r in recs
        ]

    whole, resumed = (
        records(tmp_path / "whole" / "metrics.jsonl"),
        records(tmp_path / "runs/r2/metrics.jsonl"),
    )
    assert [r["step"] for r in resumed if r["phase"] == "rl"] == [1, 2, 3, 4]
    assert strip(resumed) == strip(whole)
    assert len({r["run"] for r in resumed}) == 1
    assert (tmp_path / "runs/r2/curves.png").is_file()


def test_resume_into_a_fresh_folder_and_refuse_to_mix_runs(tmp_path, trained, capsys):
    fresh = tmp_path / "fresh"
    assert (
        run(["train", "--resume", trained / "checkpoint.pt", "--steps", "3", "--out", fresh, "--quiet"]) == 0
    )
    recs = records(fresh / "metrics.jsonl")  # the history up to the checkpoint, then the new step
    assert [r.get("step") for r in recs if r["phase"] == "rl"] == [1, 2, 3]
    assert [r["phase"] for r in recs][:2] == ["sft", "sft"] and (fresh / "curves.png").is_file()
    other = tmp_path / "other"
    assert run(["train", "--quiet", "--out", other, *TINY, "--seed", "4"]) == 0
    capsys.readouterr()
    before = (other / "metrics.jsonl").read_text()
    assert run(["train", "--resume", trained / "checkpoint.pt", "--steps", "3", "--out", other]) == 2
    _one_line_error(capsys, "--out", "another run")
    assert (other / "metrics.jsonl").read_text() == before


def test_init_from_sample_and_compare(tmp_path, trained, capsys):
    """--init-from starts RL (no warm-up) from a checkpoint's policy, here into PPO-RLHF (a value
    head the checkpoint lacks); sample prints prompts with answers and rewards; compare overlays."""
    out = tmp_path / "ppo"
    argv = [
        "train",
        "--quiet",
        "--out",
        out,
        *TINY,
        "--loss",
        "ppo_rlhf",
        "--init-from",
        trained / "checkpoint.pt",
    ]
    assert run(argv) == 0
    recs = records(out / "metrics.jsonl")
    assert [r["phase"] for r in recs] == ["rl", "rl"]
    # PPO-RLHF's reference is the policy RL started from: the checkpoint's weights, bit for bit
    source, ref = (
        load_checkpoint(trained / "checkpoint.pt")["model"],
        load_checkpoint(out / "checkpoint.pt")["ref_model"],
    )
    assert set(ref) - set(source) == {"value.weight", "value.bias"}
    assert all(torch.equal(source[k], ref[k]) for k in source)
    assert json.loads((out / "summary.json").read_text())["warmup_steps"] == 2
    capsys.readouterr()
    assert run(["sample", out / "checkpoint.pt", "--n", "3", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and all("reward" in line and "->" in line for line in lines[1:])
    png = tmp_path / "cmp.png"
    assert run(["compare", trained, out, "--out", png]) == 0
    assert png.stat().st_size > 0
    assert run(["compare", tmp_path / "nothing"]) == 2
    _one_line_error(capsys, "RUN_DIR", "nothing")


@pytest.mark.parametrize("env", [None, "2"])
def test_default_thread_count_unless_omp_num_threads_is_set(env, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
    assert run(["train", "--quiet", "--out", tmp_path, *TINY, "--steps", "0"]) == 0
    assert calls == ([cli.DEFAULT_THREADS] if env is None else [])


def test_plot_has_a_title_axis_labels_and_accuracy_over_reward(trained, tmp_path, monkeypatch):
    import matplotlib.figure

    from refimpl.lm.plots import plot_metrics

    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    plot_metrics(trained / "metrics.jsonl", tmp_path / "p.png", title="addition, loss dapo, seed 3")
    (fig,) = figures
    assert fig._suptitle.get_text() == "addition, loss dapo, seed 3"
    for ax in fig.axes:
        assert ax.get_ylabel() and (ax.get_xlabel() or ax.get_ylabel() == "held-out accuracy"), ax.get_title()
    samples = next(ax for ax in fig.axes if ax.get_title() == "RL: training samples")
    reward, accuracy = samples.lines
    assert (reward.get_label(), accuracy.get_label()) == ("reward", "accuracy")
    # drawn later, thinner and dashed: the accuracy stays visible where it equals the reward
    assert accuracy.get_linestyle() == "--" and accuracy.get_linewidth() < reward.get_linewidth()


def test_advantage_scale_none_is_a_value_not_the_preset_default(monkeypatch):
    seen = {}
    monkeypatch.setattr(
        "refimpl.lm.run.run_training", lambda config, *a, **k: seen.setdefault("c", config) and 0
    )
    assert run(["train", "--loss", "grpo", "--advantage-scale", "none"]) == 0
    from refimpl.lm.recipes import resolve_recipe

    assert seen["c"].advantage_scale == "none" and resolve_recipe(seen["c"]).advantage_scale == "none"


# ------------------------------------------------------------------------------------ nothing lost


def test_a_folder_holding_a_run_is_refused_unless_overwrite(tmp_path, trained, capsys):
    """``--out`` on a run's folder: one line naming --resume and --overwrite, exit 2, every file
    left as it was; with --overwrite the run is replaced (a file that is not the run's stays)."""
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert run(["train", "--quiet", "--out", out, *TINY]) == 2
    _one_line_error(capsys, "--out", str(out), "--resume", str(out / "checkpoint.pt"), "--overwrite")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    old_run = records(out / "metrics.jsonl")[0]["run"]
    assert run(["train", "--quiet", "--out", out, *TINY, "--steps", "1", "--overwrite"]) == 0
    recs = records(out / "metrics.jsonl")
    assert {r["run"] for r in recs} != {old_run} and len({r["run"] for r in recs}) == 1
    assert [r["phase"] for r in recs] == ["sft", "sft", "rl"] and (out / "notes.txt").read_text() == "mine"


def test_the_default_folder_is_not_overwritten_either(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--quiet", *TINY, "--steps", "0"]
    assert run(argv) == 0
    metrics = (tmp_path / "runs/train/metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert run(argv) == 2
    _one_line_error(capsys, "runs/train", "--resume runs/train/checkpoint.pt", "--overwrite")
    assert (tmp_path / "runs/train/metrics.jsonl").read_bytes() == metrics


def test_resume_into_another_runs_folder_with_overwrite(tmp_path, trained, capsys):
    other = tmp_path / "other"
    assert run(["train", "--quiet", "--out", other, *TINY, "--seed", "4", "--steps", "0"]) == 0
    argv = ["train", "--resume", trained / "checkpoint.pt", "--steps", "3", "--out", other, "--quiet"]
    assert run(argv) == 2
    _one_line_error(capsys, "--out", "another run", "--overwrite")
    assert run([*argv, "--overwrite"]) == 0
    recs = records(other / "metrics.jsonl")  # the resumed run's history, then its new step
    resumed_run = records(trained / "metrics.jsonl")[0]["run"]
    assert {r["run"] for r in recs} == {resumed_run}
    assert [r.get("step") for r in recs if r["phase"] == "rl"] == [1, 2, 3]


class _Clock:
    """Wall and CPU clocks that advance 10 s at every reading (refimpl.lm.run's ``time``)."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self):
        self.now += 10.0
        return self.now

    process_time = perf_counter


def test_resume_keeps_wall_and_cpu_time_cumulative(tmp_path, capsys, monkeypatch):
    """The times of a resumed run continue those at its checkpoint: metrics.jsonl, summary.json
    and the closing line (a clock that advances 10 s a reading makes each run take minutes)."""
    import refimpl.lm.run as run_module

    monkeypatch.setattr(run_module, "time", _Clock())
    out = tmp_path / "run"
    assert run(["train", "--quiet", "--out", out, *TINY]) == 0
    saved = load_checkpoint(out / "checkpoint.pt")["elapsed"]  # at RL step 2, the run's last checkpoint
    capsys.readouterr()
    assert run(["train", "--quiet", "--resume", out / "checkpoint.pt", "--steps", "3"]) == 0
    done = capsys.readouterr().out.splitlines()[0]
    summary = json.loads((out / "summary.json").read_text())
    recs = records(out / "metrics.jsonl")
    assert [r.get("step") for r in recs] == [None, None, 1, 2, 3]
    for key in ("wall_time", "cpu_time"):
        times = [r[key] for r in recs]
        assert times == sorted(times) and len(set(times)) == len(times), key  # increasing across the resume
        assert summary[key] > times[-1] > saved[key] > times[-2], key
    assert summary["wall_time"] > 120  # minutes of the fake clock: the closing line says so
    assert done.startswith("done: 3 RL steps") and f"in {format_duration(summary['wall_time'])} wall" in done


def test_the_ctrl_c_hint_runs_as_printed(tmp_path):
    """``python -m refimpl train`` interrupted by SIGINT prints a command; that command, run by a
    shell in the same folder, continues the run to its end."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    argv = [sys.executable, "-m", "refimpl", "train", "--quiet", *TINY, "--steps", "400", "--out", "r"]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "r" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and '"phase": "rl"' in metrics.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    command = err.strip().splitlines()[-1].split("continue with: ")[1]
    assert command == f"{shlex.quote(sys.executable)} -m refimpl train --resume r/checkpoint.pt"
    steps = [r["step"] for r in records(metrics) if r["phase"] == "rl"]
    assert 0 < steps[-1] < 400
    # the rest of the run, shortened by a second resume option only the test adds
    done = subprocess.run(f"{command} --steps {steps[-1] + 1} --quiet", shell=True, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [r["step"] for r in records(metrics) if r["phase"] == "rl"] == list(range(1, steps[-1] + 2))


@pytest.mark.parametrize("how", ["console script on PATH", "console script by path", "python -m", "embedded",
                                 "torchrun"])
def test_the_resume_program_is_the_program_as_invoked(how, tmp_path, monkeypatch):
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "refimpl"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    python = shlex.quote(sys.executable)
    if how == "console script on PATH":
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
        monkeypatch.setattr(sys, "argv", [str(script), "train"])
        expected = "refimpl"
    elif how == "console script by path":
        monkeypatch.setattr(sys, "argv", ["venv/bin/refimpl", "train"])
        expected = "venv/bin/refimpl"
    elif how == "python -m":
        main.__spec__ = importlib.util.find_spec("refimpl.__main__")
        monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "refimpl", "train"], raising=False)
        expected = f"{python} -m refimpl"
    elif how == "embedded":
        monkeypatch.setattr(sys, "argv", ["/usr/bin/some-tool"])
        expected = f"{python} -m refimpl"
    else:
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        expected = "torchrun --nproc-per-node 2 -m refimpl"
    assert cli.invoked_program() == expected


# ------------------------------------------------------------------------------------ one-line errors


@pytest.mark.parametrize(
    "mistake",
    ["compare_txt", "compare_no_suffix", "eval_device_gpu", "sample_device_gpu", "compile_yes", "amp_1"],
)
def test_each_left_over_raw_error_is_one_line_and_exit_2(mistake, tmp_path, trained, capsys):
    argv, needles = {
        "compare_txt": (["compare", trained, "--out", tmp_path / "c.txt"], ["--out", "c.txt", ".png"]),
        "compare_no_suffix": (["compare", trained, "--out", tmp_path / "c"], ["--out", ".png"]),
        "eval_device_gpu": (
            ["eval", trained / "checkpoint.pt", "--device", "gpu"],
            ["device", "expected 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'"],
        ),
        "sample_device_gpu": (
            ["sample", trained / "checkpoint.pt", "--device", "gpu"],
            ["device", "expected 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'"],
        ),
        # --group-size 1 would stop a run that took "yes" (exit 2 naming --group-size, not --compile)
        "compile_yes": (
            ["train", "--compile", "yes", "--group-size", "1"],
            ["--compile", "true or false", "'yes'"],
        ),
        "amp_1": (["train", "--amp", "1", "--group-size", "1"], ["--amp", "true or false", "'1'"]),
    }[mistake]
    assert run(argv) == 2
    _one_line_error(capsys, *needles)
    assert not list(tmp_path.iterdir())  # nothing written


def test_booleans_are_true_or_false_in_any_case():
    for text, value in (("true", True), ("False", False), ("TRUE", True)):
        assert parser().parse_args(["train", "--compile", text]).compile is value

"""``refimpl train`` / ``eval`` / ``sample`` / ``compare``: the smoke run (the CI version of the README
main job), every user mistake as one line on stderr with exit status 2, resume in the run's own
folder with one continuous metrics file, the output a person reads."""

import argparse
import json
import os
import shlex
import signal

import pytest
import torch

from refimpl.lm import cli
from refimpl.lm.checkpoint import load_checkpoint, save_checkpoint
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
        "eval_png": lambda: (["eval", png], ["curves.png", "not a readable refimpl checkpoint"]),
        "eval_missing": lambda: (["eval", tmp_path / "missing.pt"], ["no file at"]),
        "eval_payload_no_optimizer": lambda: (
            ["eval", _malformed_checkpoint(bad, trained, drop="optimizer")],
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
        ("--aggregation", "{seq_mean_token_mean,token_mean,seq_sum,seq_mean,seq_sqrt_token_mean}"),
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
    assert command == "refimpl train --resume runs/r2/checkpoint.pt"
    monkeypatch.setattr(Trainer, "rl_step", real_step)
    assert run(shlex.split(command)[1:]) == 0
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

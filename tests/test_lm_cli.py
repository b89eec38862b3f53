"""``refimpl train`` / ``refimpl eval`` smoke run (the CI version of the README main job) and the
command line's clear errors."""

import argparse
import json

import pytest

from refimpl.lm import cli

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
]


def run(argv) -> int:
    parser = argparse.ArgumentParser(prog="refimpl")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_train_then_eval_smoke(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        run(
            [
                "train",
                "--task",
                "addition",
                "--loss",
                "dapo",
                "--device",
                "cpu",
                "--quiet",
                "--out",
                str(out),
                *TINY,
            ]
        )
        == 0
    )
    for name in ("metrics.jsonl", "checkpoint.pt", "summary.json", "curves.png", "config.json"):
        assert (out / name).stat().st_size > 0, name
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in records] == ["sft", "sft", "rl", "rl"]
    assert {"reward", "accuracy", "entropy", "clip_fraction", "rollout_tokens_per_s"} <= set(records[-1])
    config = json.loads((out / "config.json").read_text())
    assert config["seed"] == 3 and config["n_embd"] == 16 and config["loss"] == "dapo"
    capsys.readouterr()
    assert run(["eval", str(out / "checkpoint.pt"), "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["step"] == 2 and result["task"] == "addition"
    assert 0.0 <= result["eval_greedy_accuracy"] <= 1.0
    # resume: only --steps may change
    assert (
        run(["train", "--resume", str(out / "checkpoint.pt"), "--steps", "3", "--quiet", "--out", str(out)])
        == 0
    )
    assert [json.loads(line)["phase"] for line in (out / "metrics.jsonl").read_text().splitlines()][
        -1
    ] == "rl"
    assert json.loads((out / "summary.json").read_text())["steps"] == 3
    assert run(["train", "--resume", str(out / "checkpoint.pt"), "--lr", "1", "--out", str(out)]) == 2


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "--task", "division"], "unknown task"),
        (["train", "--group-size", "1"], "group_size"),
        (["eval", "missing.pt"], "no file"),
    ],
)
def test_clear_errors(argv, message, capsys, tmp_path):
    assert run([*argv, *(["--out", str(tmp_path)] if argv[0] == "train" else [])]) == 2
    assert message in capsys.readouterr().err


def test_unknown_loss_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as err:
        run(["train", "--loss", "reinforce"])
    assert err.value.code == 2
    assert "invalid choice" in capsys.readouterr().err

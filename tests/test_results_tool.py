"""tools/results.py (``make results``): the table it prints from the runs' summaries."""

import pytest

from tests.scripts import load_script


@pytest.fixture(scope="module")
def results():
    return load_script("tools/results.py", "results_tool")


def _summary(greedy: float, sampled: float, warmup: int, wall: float, cpu: float) -> dict:
    return {"final_eval_greedy_accuracy": greedy, "final_eval_sampled_accuracy": sampled,
            "warmup_steps": warmup, "wall_time": wall, "cpu_time": cpu}


def test_row_values_are_percent_and_seconds(results):
    assert results.row_values(_summary(0.5, 0.25, 40, 12.5, 10.0)) == (50.0, 25.0, 40.0, 12.5, 10.0)


def test_table_gives_mean_and_range_per_preset(results):
    rows = {
        "grpo": [results.row_values(_summary(g, s, w, t, c))
                 for g, s, w, t, c in ((0.90, 0.5, 30, 100, 90), (1.0, 0.7, 50, 140, 130))],
        "dapo": [results.row_values(_summary(0.96, 0.75, 42, 120, 110))],
    }
    table = results.format_table(rows).splitlines()
    assert table[0] == "| preset | seeds | greedy % | sampled % | warm-up steps | wall s | CPU s |"
    assert table[2] == (
        "| grpo | 2 | 95.0 (90.0-100.0) | 60.0 (50.0-70.0) | 40 (30-50) | 120 (100-140) | 110 (90-130) |"
    )
    assert table[3] == "| dapo | 1 | 96.0 | 75.0 | 42 | 120 | 110 |"


def test_every_trainer_preset_is_run_by_default(results):
    from refimpl.lm.config import LOSS_NAMES

    assert results.default_presets() == list(LOSS_NAMES)
    assert "ppo" not in results.default_presets()  # the deprecated alias would repeat ppo_rlhf


def test_unknown_preset_is_one_line_error(results, capsys):
    with pytest.raises(SystemExit) as exit_info:
        results.main(["--presets", "nope", "--table-only", "--out", "/nonexistent"])
    assert exit_info.value.code == 2
    assert "--presets: unknown loss names ['nope']" in capsys.readouterr().err


def test_table_only_reads_existing_summaries(results, tmp_path, capsys):
    import json

    folder = results.run_folder(tmp_path, "grpo", 1)
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(_summary(0.98, 0.8, 35, 150, 140)))
    argv = ["--presets", "grpo", "dapo", "--seeds", "0", "1", "--table-only", "--out", str(tmp_path)]
    assert results.main(argv) == 0
    out = capsys.readouterr().out
    assert "| grpo | 1 | 98.0 | 80.0 | 35 | 150 | 140 |" in out
    assert "| dapo |" not in out  # no run, no row


def test_check_reads_the_committed_row_and_widens_it_by_its_spread(results):
    text = ("| preset | seeds | greedy % | sampled % | warm-up steps | wall s | CPU s |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n"
            "| grpo | 3 | 97.5 (97.1-97.9) | 75.1 (70.1-78.7) | 503 (430-550) | 389 (268-500) "
            "| 117 (113-123) |\n"
            "| dapo | 1 | 96.0 | 75.0 | 42 | 120 | 110 |\n")
    row = results.committed_row("grpo", text)
    assert row == {"greedy %": (97.1, 97.9), "sampled %": (70.1, 78.7), "warm-up steps": (430.0, 550.0)}
    assert results.committed_row("dapo", text)["warm-up steps"] == (42.0, 42.0)
    with pytest.raises(ValueError, match="no row for preset 'sapo'"):
        results.committed_row("sapo", text)
    inside = results.row_values(_summary(0.9631, 0.617, 670, 1.0, 1.0))  # each just inside the widened band
    assert results.check_against_row(inside, row) == []
    # the measured drift of issue 26: 620 warm-up steps and 91.6 % sampled against the old dapo row
    old_dapo = {"greedy %": (97.3, 97.9), "sampled %": (75.0, 80.5), "warm-up steps": (430.0, 550.0)}
    problems = results.check_against_row(results.row_values(_summary(0.978, 0.916, 620, 205, 205)), old_dapo)
    assert [p.split(" ", 2)[:2] for p in problems] == [["sampled", "%"]]
    assert "91.6 outside [69.5, 86]" in problems[0]
    outside = results.row_values(_summary(0.9629, 0.601, 671, 1.0, 1.0))  # each just outside
    assert len(results.check_against_row(outside, row)) == 3

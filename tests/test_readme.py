"""The README is a front door whose commands run in CI (issue 22).

Its first screen says what the project is, for whom, and the three uses with one command each;
every ``make`` target it shows exists; the first screen's commands are run by CI (``.ci/run``:
``make test``, and ``make check-frameworks`` runs the framework check exactly as shown) or, for
``make run``, by the smoke run of the same ``refimpl train`` / ``refimpl eval`` commands
(tests/test_lm_cli.py); the command for checking one's own loss runs here as written. Paths and
links are checked for every doc by tests/test_docs_references.py."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from refimpl.conformance.cli import main as check_main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()
CI = (ROOT / ".ci" / "run").read_text()
FIRST_SCREEN = README.split("\n## ", 1)[0]


def recipe(target: str) -> list[str]:
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", MAKEFILE, re.M)
    assert m, f"no recipe for make {target}"
    return [line.strip() for line in m.group(1).splitlines()]


def shown_commands(text: str) -> list[str]:
    """Commands in inline code and in bash blocks (comments dropped)."""
    inline = re.findall(r"`((?:\.venv/bin/)?(?:make|refimpl) [^`]+)`", text)
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return inline + [line for line in lines if line]


def test_the_first_screen_says_what_for_whom_and_three_uses():
    assert len(FIRST_SCREEN.splitlines()) <= 30
    for words in ("**What it is.**", "**For whom.**", "**Three uses**"):
        assert words in FIRST_SCREEN
    for command in ("`make test`", "`.venv/bin/refimpl check --framework trl --preset dapo`", "`make run`"):
        assert command in FIRST_SCREEN, command
    assert len(README.splitlines()) < 150  # a front door; the reference is in docs/


def test_every_make_target_shown_exists():
    targets = set(re.findall(r"^([\w-]+):", MAKEFILE, re.M))
    shown = {cmd.split()[1] for cmd in shown_commands(README) if cmd.startswith("make ")}
    assert {"test", "run", "frameworks", "check-frameworks"} <= shown
    assert shown <= targets, shown - targets


def test_the_first_screen_commands_run_in_ci():
    ci_targets = set(re.findall(r"\bmake ([\w-]+)", CI))
    assert {"install", "frameworks", "test", "check-frameworks"} <= ci_targets
    # the framework check exactly as the README shows it (`$(BIN)` is `.venv/bin`)
    assert "$(BIN)/refimpl check --framework trl --preset dapo" in recipe("check-frameworks")
    # make run = refimpl train + refimpl eval, the commands of the CI smoke run
    # (a finished run in runs/main is kept and only evaluated again: the train command sits in a
    # shell `if`; OVERWRITE=1 trains anew)
    run = " ".join(recipe("run"))
    assert re.search(r"\$\(BIN\)/refimpl train .*--out runs/main", run), run
    assert recipe("run")[-1].startswith("$(BIN)/refimpl eval runs/main/checkpoint.pt"), run
    smoke = (ROOT / "tests" / "test_lm_cli.py").read_text()
    assert "def test_train_then_eval_smoke(" in smoke


def test_checking_your_own_loss_runs_as_written(tmp_path, monkeypatch, capsys):
    command = re.search(r"`(refimpl check (?:loss )?your_module:your_loss [^`]*)`", FIRST_SCREEN).group(1)
    (tmp_path / "your_module.py").write_text(
        "from refimpl.losses import get_preset, policy_loss\n\n\n"
        "def your_loss(logp, old_logp, advantages, mask, *, normalizer=None):\n"
        "    variant = get_preset('dapo')\n"
        "    return policy_loss(logp, old_logp, advantages, mask, variant, normalizer=normalizer)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    try:
        assert check_main(shlex.split(command)[1:]) == 0, capsys.readouterr()
    finally:
        sys.modules.pop("your_module", None)
    assert "PASS" in capsys.readouterr().out

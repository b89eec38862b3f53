"""Every example of docs/conformance.md runs as written: ``# NAME.py`` Python blocks become modules
of a temporary directory, the other Python blocks are executed in order (the "Python API" section's
included), and each ``$ refimpl`` command of a console block runs in-process with the exit code its
shown output implies (PASS: 0, FAIL: 1), in the current spelling (no note of an earlier one).
Framework commands and ``refimpl matrix`` run the real drivers: against the installed frameworks
(``make frameworks``), or, where one is not installed, as its one-line skip (exit 2), so the page
is checked with and without the real frameworks."""

from __future__ import annotations

import pathlib
import re
import shlex
import sys

import pytest

from refimpl.conformance import matrix_check
from refimpl.conformance.cli import main

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "conformance.md"
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", DOC.read_text(), re.S)


def commands(block: str) -> list[tuple[list[str], str]]:
    """(argv, the output shown until the next command) for each ``$ refimpl`` line."""
    out, current, shown = [], None, []
    lines = block.replace("\\\n", " ").splitlines()
    for line in lines + ["$ end"]:
        if line.startswith("$ "):
            if current is not None:
                out.append((current, "\n".join(shown)))
            argv = shlex.split(line[2:])
            current, shown = (argv[1:] if argv[0] == "refimpl" else None), []
        else:
            shown.append(line)
    return [(argv, text) for argv, text in out if argv is not None]


def needs_frameworks(argv: list[str]) -> bool:
    """A command that drives the installed real frameworks (skipped in one line where they are absent)."""
    return "--framework" in argv or argv[:2] == ["check", "framework"] or argv[:1] == ["matrix"]


def test_framework_commands_are_recognised_in_every_spelling():
    for argv in (["check", "framework", "trl"], ["check", "--framework", "verl", "--mode", "grpo"],
                 ["matrix", "--out", "m.md"]):
        assert needs_frameworks(argv), argv
    for argv in (["check", "loss", "hazard:dapo_loss", "--preset", "dapo"], ["conventions"]):
        assert not needs_frameworks(argv), argv


def test_the_page_has_examples_of_every_kind():
    text = DOC.read_text()
    for kind in (
        "$ refimpl check loss ",
        "$ refimpl check kl ",
        "$ refimpl check advantages ",
        "$ refimpl check logprobs ",
        "$ refimpl check framework ",
        "$ refimpl check --framework ",
        "$ refimpl check differences ",
        "--adapter",
        "--variant",
        "--flag",
        "--device cuda",
        "refimpl conventions",
        "$ refimpl matrix",
    ):
        assert kind in text, kind
    assert sum(1 for lang, _ in BLOCKS if lang == "python") >= 6


def test_the_page_has_a_table_of_contents_and_documents_the_python_api():
    text = DOC.read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    contents = text.split("\nContents\n", 1)[1].split("\n\n", 1)[0].strip()
    assert [re.sub(r"^\d+\. \[(.+)\]\(#.+\)$", r"\1", line) for line in contents.splitlines()] == [
        re.sub(r"^\d+\. | \(\d minutes?\)$", "", h) for h in headings
    ]
    for anchor in re.findall(r"\]\(#([^)]+)\)", contents):  # GitHub's anchors of the headings
        assert anchor in {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}, anchor
    api = text.split("## 9. Python API", 1)[1]
    import refimpl.conformance as api_module
    from refimpl.conformance.report import CheckReport

    for name in ("check_loss", "check_kl", "check_advantages", "check_logprobs", "check_framework",
                 "case_classes", "convention_differences"):
        assert f"`{name}(" in api and hasattr(api_module, name), name
    for member in re.findall(r"`report\.(\w+)", api):  # a method, property or field of the report
        assert hasattr(CheckReport, member) or member in CheckReport.__dataclass_fields__, member


def test_every_example_runs_as_written(tmp_path, monkeypatch, capsys, real_matrix):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    # the page's `refimpl matrix` and `refimpl matrix --check` build the same matrix: build it once
    # (patched where `refimpl matrix` looks it up; `built` shows that the commands went through it)
    built = []
    monkeypatch.setattr(matrix_check, "build_matrix",
                        lambda names=None: built.append(names) or real_matrix(tuple(names or ()) or None))
    (tmp_path / "docs").mkdir()
    written, namespace, ran = [], {}, 0
    try:
        for lang, block in BLOCKS:
            first = block.splitlines()[0] if block.strip() else ""
            if lang == "python" and re.fullmatch(r"# (\w+)\.py", first):
                name = first[2:-3]
                (tmp_path / f"{name}.py").write_text(block)
                sys.modules.pop(name, None)
                written.append(name)
            elif lang == "python":
                exec(compile(block, f"{DOC.name} block", "exec"), namespace)
                ran += 1
            elif lang == "console":
                for argv, shown in commands(block):
                    code = main(argv)
                    captured = capsys.readouterr()
                    if code == 2 and needs_frameworks(argv):  # a newcomer's checkout: one line, exit 2
                        assert ("not available, skipped" in captured.err or "not installed" in captured.err
                                ) and len(captured.err.strip().splitlines()) == 1, (argv, captured.err)
                        continue
                    expected = 1 if "FAIL" in shown else 0
                    assert code == expected, (argv, captured.out[-3000:], captured.err)
                    assert "note:" not in captured.err, (argv, captured.err)  # the current spellings
                    for line in shown.splitlines():  # the shown verdict / diagnosis lines are real
                        shown_line = line.strip().startswith(("diagnosis:", "departure ", "FAIL:", "PASS"))
                        if shown_line and "..." not in line:  # "..." abbreviates
                            assert line.strip() in captured.out, (argv, line)
                    ran += 1
    finally:
        for name in written:
            sys.modules.pop(name, None)
    assert ran >= 12 and len(built) == 2, built
    written = tmp_path / "docs" / "conformance-matrix.md"
    if all(f["available"] for f in real_matrix(None)["frameworks"]):
        assert written.read_text().startswith("# Conformance matrix")
    else:  # `refimpl matrix --out` never replaces a matrix with one of "not installed" rows
        assert not written.exists()


@pytest.mark.parametrize("flag", ["compute_dtype", "masked_nonfinite", "adv_leave_one_out"])
def test_the_new_flags_are_documented(flag):
    assert f"`{flag}`" in DOC.read_text()

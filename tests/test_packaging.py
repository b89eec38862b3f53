"""The distribution's metadata (pyproject.toml): the version is stated once, in
``refimpl.__version__`` (setuptools' dynamic version reads it), and every file of the golden
vectors and the specs' Markdown is named by the package data, so the wheel carries it. .ci/wheel
builds the wheel and checks what an installed one holds and runs."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

import pytest

import refimpl

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_single_sourced_from_refimpl():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "refimpl.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", refimpl.__version__), refimpl.__version__


def test_no_other_tracked_file_states_the_version():
    """A second copy (a docs page, a CITATION file) would drift from refimpl.__version__. The example
    third-party packages under examples/ have versions of their own."""
    version = re.escape(refimpl.__version__)
    pattern = rf"(version|__version__)\s*[:=]\s*['\"]?{version}"
    tracked = subprocess.run(
        ["git", "grep", "-l", "-i", "-E", pattern, "--", ":!*.json", ":!examples/"],
        cwd=ROOT, capture_output=True, text=True,
    )
    if tracked.returncode not in (0, 1):  # 1: no match; anything else: not a git checkout
        pytest.skip(f"git grep unavailable: {tracked.stderr.strip()}")
    assert tracked.stdout.split() == ["refimpl/__init__.py"]


def test_the_package_data_names_every_vector_and_spec_file():
    globs = PYPROJECT["tool"]["setuptools"]["package-data"]["specs"]
    specs = ROOT / "specs"
    files = [p.relative_to(specs).as_posix() for p in specs.glob("*.md")]
    files += [p.relative_to(specs).as_posix() for p in (specs / "vectors").iterdir()]
    missing = [f for f in files if not any(fnmatch.fnmatchcase(f, g) for g in globs)]
    assert "vectors/SCHEMA.md" in files and "vectors/kl.json" in files and not missing, missing


def test_the_vectors_subcommand_is_registered():
    commands = PYPROJECT["project"]["entry-points"]["refimpl.commands"]
    assert commands["vectors"] == "specs.numpy_consumer:register"

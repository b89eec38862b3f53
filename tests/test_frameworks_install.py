"""``refimpl frameworks install|list`` (refimpl/conformance/frameworks/install.py): the pinned releases
come from the drivers (one home: each driver's PINNED_VERSION and REQUIREMENTS), the shared packages
from rl-oracle's ``frameworks`` extra, every step under the environment's torch / numpy / sympy; it
works from the wheel (.ci/wheel runs it there)."""

from __future__ import annotations

import re
import sys

import pytest

from refimpl.cli import main
from refimpl.conformance.frameworks import EXTRA_FRAMEWORKS, FRAMEWORKS, load_driver
from refimpl.conformance.frameworks import install as installer

PIN = re.compile(r"^[A-Za-z0-9_.-]+==[0-9][A-Za-z0-9.]*$")


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_each_framework_is_pinned_at_its_profiled_release_and_every_pin_is_exact():
    pinned: dict[str, str] = {}
    for name in FRAMEWORKS:
        pins, options = installer.framework_requirements(name)
        driver = load_driver(name)
        assert pins[0] == f"{getattr(driver.module, 'DISTRIBUTION', name)}=={driver.pinned_version}", name
        for pin in pins:
            assert PIN.match(pin), pin
            dist, version = pin.split("==")
            assert pinned.setdefault(dist.lower(), version) == version, f"{dist} pinned at two versions"
        assert all(o.startswith("--") for o in options)
    assert installer.framework_requirements("skyrl")[1] == ["--ignore-requires-python"]
    extra = installer.extra_requirements()
    assert extra and all(PIN.match(r) for r in extra), extra
    assert {r.split("==")[0] for r in extra} == {"transformers", "accelerate"}


def test_dry_run_prints_the_pip_commands_under_the_constraints(capsys):
    code, out, err = run(capsys, "frameworks", "install", "trl", "skyrl", "--dry-run")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 3 and all(line.startswith("$ python -m pip install -q -c ") for line in lines)
    assert "transformers==5.10.4" in lines[0] and "--no-deps" not in lines[0]
    assert "--no-deps trl==1.16.0" in lines[1] and "skyrl" not in lines[1]
    assert "--no-deps --ignore-requires-python skyrl-train==0.3.1" in lines[2]


def test_install_runs_pip_then_lists_and_a_pip_failure_is_one_line(capsys, monkeypatch):
    ran, constraints = [], []

    def call(command):
        ran.append(command)
        constraints.append(open(command[command.index("-c") + 1]).read())
        return 0

    monkeypatch.setattr(installer.subprocess, "call", call)
    code, out, _ = run(capsys, "frameworks", "install", "liger")
    assert code == 0 and len(ran) == 2 and ran[0][:3] == [sys.executable, "-m", "pip"]
    assert ran[1][-1] == "liger-kernel==0.8.5" and "--no-deps" in ran[1]
    import torch

    assert f"torch=={torch.__version__}" in constraints[0].splitlines() or "+" in torch.__version__
    assert out.splitlines()[-1].startswith("liger     pinned 0.8.5")
    monkeypatch.setattr(installer.subprocess, "call", lambda command: 1)
    code, _, err = run(capsys, "frameworks", "install", "liger")
    assert code == 1 and err.strip() == "refimpl frameworks install: pip exited 1 (above)"


@pytest.mark.parametrize("argv", [("install", "tlr"), ("list", "nope")])
def test_an_unknown_framework_is_one_line(capsys, argv):
    code, out, err = run(capsys, "frameworks", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and "framework must be among trl, verl" in err


def test_list_names_each_framework_with_its_pinned_release(capsys):
    code, out, _ = run(capsys, "frameworks", "list")
    assert code == 0
    rows = out.splitlines()
    assert [r.split()[0] for r in rows] == list(FRAMEWORKS + EXTRA_FRAMEWORKS)
    for row, name in zip(rows, FRAMEWORKS + EXTRA_FRAMEWORKS, strict=True):
        assert f"pinned {load_driver(name).pinned_version}" in row
        assert row.endswith("ready") or "refimpl frameworks install" in row or "cannot" in row, row


def test_a_release_goes_alone_into_its_own_directory(capsys):
    # refimpl frameworks install NAME --version X: pip --no-deps --target, with the driver's options
    command = installer.release_command("skyrl_pkg", "0.3.0", "/tmp/x")
    assert command[1:] == ["-m", "pip", "install", "-q", "--no-deps", "--ignore-requires-python",
                           "--target", "/tmp/x", "skyrl==0.3.0"]
    code, out, err = run(capsys, "frameworks", "install", "verl", "--version", "0.9.0", "--dry-run")
    assert code == 0, err
    assert out.strip() == ("$ python -m pip install -q --no-deps --target .frameworks-releases/verl-0.9.0 "
                           "verl==0.9.0")
    code, out, err = run(capsys, "frameworks", "install", "verl", "trl", "--version", "0.9.0")
    assert code == 2 and err.strip() == ("refimpl frameworks install: --version installs one framework's "
                                         "release: name exactly one framework")


def test_checking_a_release_installs_it_once_and_runs_check_framework_on_it(capsys, monkeypatch, tmp_path):
    ran = []

    def call(command, env=None):
        ran.append((command, env))
        if "--target" in command:
            (tmp_path / "rel").mkdir(exist_ok=True)
        return 0

    monkeypatch.setattr(installer.subprocess, "call", call)
    argv = ("frameworks", "check", "openrlhf", "--version", "0.10.3", "--target", str(tmp_path / "rel"),
            "--mode", "gspo")
    assert run(capsys, *argv)[0] == 0
    assert run(capsys, *argv)[0] == 0  # installed once: the second run only checks
    installs = [c for c, _ in ran if "--target" in c]
    checks = [(c, env) for c, env in ran if "check" in c]
    assert len(installs) == 1 and installs[0][-1] == "openrlhf==0.10.3"
    assert len(checks) == 2
    command, env = checks[0]
    assert command[1:] == ["-m", "refimpl", "check", "framework", "openrlhf", "--mode", "gspo"]
    assert env["PYTHONPATH"].split(":")[0] == str((tmp_path / "rel").resolve())

"""The drivers' findings (refimpl/conformance/frameworks/findings.py) are upstream-grade: each has a
class, every bug names the line it sits on and the releases affected, no tie of ``torch.max`` /
``torch.min`` at a kink is called a bug, and every cited line holds the quoted code in the installed
framework (the line numbers of the matrix are checked, not remembered)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from refimpl.conformance.frameworks import EXTRA_FRAMEWORKS, FRAMEWORKS, load_driver
from refimpl.conformance.frameworks.findings import FINDING_KINDS, REPRODUCED_KINDS, Finding, as_findings
from refimpl.conformance.frameworks.install import opt_in
from refimpl.conformance.frameworks.repro import BODIES, repro_script, write_repros

#: the import name of each framework's installed package, whose folder a finding's path is relative to
PACKAGES = {"trl": "trl", "verl": "verl", "openrlhf": "openrlhf", "liger": "liger_kernel",
            "skyrl": "skyrl_train", "areal": "areal", "skyrl_pkg": "skyrl", "unsloth": "unsloth_zoo",
            "tunix": "tunix"}


def test_every_framework_has_its_package_named_here():
    assert set(PACKAGES) == set(FRAMEWORKS + EXTRA_FRAMEWORKS)


@pytest.mark.parametrize("name", FRAMEWORKS + EXTRA_FRAMEWORKS)
def test_findings_are_classified_and_bugs_are_located(name):
    driver = load_driver(name)
    for finding in driver.findings():
        assert finding.kind in FINDING_KINDS and finding.text.strip(), finding
        if finding.kind == "bug":
            assert finding.where and finding.affected, f"{name} {finding.key}: a bug names its line, releases"
        if finding.key == "dual_clip_tie":
            assert finding.kind == "subgradient", f"{name}: a tie at the dual clip's kink is not a bug"
        if finding.kind == "validation":
            assert finding.key.startswith("config:") and finding.where, finding
        if finding.fixed_in or finding.upstream:
            assert finding.kind != "subgradient"


def test_a_finding_refuses_an_unknown_class_and_an_unchecked_line():
    with pytest.raises(ValueError, match="Finding.kind: expected one of"):
        Finding("k", "candidate", "t")
    with pytest.raises(ValueError, match="where and quote go together"):
        Finding("k", "bug", "t", where="loss.py:3")
    legacy = type("Module", (), {"CANDIDATE_BUGS": {"empty_step": "0 / 0"}})
    assert as_findings(legacy) == (Finding("empty_step", "bug", "0 / 0"),)


# CI installs every framework but the opt-in ones (an extra of their own: Tunix's JAX), so only their
# tests may skip there
_DRIVEN_IN_CI = [n if opt_in(n) else pytest.param(n, marks=pytest.mark.framework)
                 for n in FRAMEWORKS + EXTRA_FRAMEWORKS]


@pytest.mark.parametrize("name", _DRIVEN_IN_CI)
def test_every_cited_line_holds_the_quoted_code(name):
    driver = load_driver(name)
    if driver.availability() is not None:
        pytest.skip(f"{name} is not drivable here: {driver.availability()}")
    if driver.installed_version() != driver.pinned_version:
        pytest.skip(f"{name} {driver.installed_version()} installed: findings cite {driver.pinned_version}")
    spec = importlib.util.find_spec(PACKAGES[name])
    root = pathlib.Path(next(iter(spec.submodule_search_locations)))
    for finding in driver.findings():
        if not finding.where:
            continue
        path, line = finding.where.rsplit(":", 1)
        lines = (root / path).read_text().splitlines()
        assert finding.quote in lines[int(line) - 1], (
            f"{name} {finding.key}: {finding.where} reads {lines[int(line) - 1].strip()!r}, "
            f"not {finding.quote!r}")


def test_every_bug_has_a_standalone_reproduction_and_every_reproduction_a_bug():
    bugs = {(name, f.key) for name in FRAMEWORKS + EXTRA_FRAMEWORKS for f in load_driver(name).findings()
            if f.kind in REPRODUCED_KINDS}
    # an opt-in framework's bug has no script yet (CI, which runs the scripts, does not install JAX):
    # listed here so that the gap is seen and this line changes with it
    unscripted = {("tunix", "ratio_overflow"), ("tunix", "clip_bound_tie"), ("tunix", "whiten_sample_single")}
    assert {b for b in bugs if opt_in(b[0])} >= unscripted
    bugs -= unscripted
    assert bugs == set(BODIES)
    for name, key in sorted(bugs):
        script = repro_script(name, key)
        compile(script, f"repro_{name}_{key}.py", "exec")
        imports = {line.split()[1].split(".")[0] for line in script.splitlines()
                   if line.startswith(("import ", "from ")) and not line.startswith("from __future__")}
        assert imports <= {"importlib", "pathlib", "sys", "types", "torch", "omegaconf", "verl", "trl",
                           "warnings", "collections", "dataclasses", "os", "tempfile"}, imports
        assert "refimpl" not in script


def test_repro_writes_one_script_per_bug_and_never_replaces_a_file(tmp_path, capsys):
    from refimpl.conformance.cli import main

    assert main(["check", "framework", "skyrl", "--repro", str(tmp_path / "r")]) == 0
    written = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert written == ["repro_skyrl_cispo_clip_low.py", "repro_skyrl_kl_gradient.py",
                       "repro_skyrl_padding_values.py", "repro_skyrl_whiten_mean.py"]
    assert main(["check", "framework", "skyrl", "--repro", str(tmp_path / "r")]) == 2
    assert "exists; choose an empty directory" in capsys.readouterr().err
    assert main(["check", "framework", "trl", "--repro", str(tmp_path / "t")]) == 0
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["repro_trl_config_delta.py",
                                                                  "repro_trl_ratio_overflow.py"]
    assert main(["check", "framework", "liger", "--repro", str(tmp_path / "l")]) == 0  # validation too
    assert "repro_liger_config_delta.py" in {p.name for p in (tmp_path / "l").iterdir()}


@pytest.mark.framework
@pytest.mark.parametrize("name, key", sorted(BODIES))
def test_every_reproduction_reproduces_against_the_installed_framework(name, key, tmp_path):
    """CI: each bug's standalone script, run by the interpreter alone outside the checkout, prints the
    framework's value next to the exact one and exits 0 (reproduced)."""
    driver = load_driver(name)
    if driver.availability() is not None:
        pytest.skip(f"{name} is not drivable here: {driver.availability()}")
    wanted = f"repro_{name}_{key.replace(':', '_')}.py"
    (script,) = [p for p in write_repros(name, tmp_path) if p.name == wanted]
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0 and done.stdout.rstrip().endswith("REPRODUCED"), done.stdout + done.stderr
    assert "  framework: " in done.stdout and "  exact:     " in done.stdout

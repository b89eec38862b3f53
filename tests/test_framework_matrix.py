"""Every mode of every installed framework (TRL, verl, OpenRLHF) passes under its own profile
through the code path of ``refimpl check --framework F --mode M [--kind K]`` and ``refimpl matrix``
(``cli.check_framework_mode``), every departure from the spec is explained by a flag of the mode's
profile (none ``unexplained``), and the committed docs/conformance-matrix.md is the matrix of the
installed frameworks (what ``refimpl matrix --out docs/conformance-matrix.md --check`` checks).
Expected values come from the reference implementation with the profile's flags, never from the
framework. Skipped for a framework that is not installed."""

from __future__ import annotations

import pathlib

import pytest

from refimpl.conformance.checks import check_framework_mode
from refimpl.conformance.cli import main
from refimpl.conformance.cli_args import UserError
from refimpl.conformance.frameworks import FRAMEWORKS, KINDS, load_driver
from refimpl.conformance.matrix import matrix_markdown, normalised

pytestmark = pytest.mark.framework

COMMITTED = pathlib.Path(__file__).resolve().parents[1] / "docs" / "conformance-matrix.md"


def installed(name: str):
    driver = load_driver(name)
    reason = driver.availability()
    if reason is not None:
        pytest.skip(f"{name} is not drivable here: {reason}")
    return driver


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_every_mode_passes_under_its_own_profile_on_the_cli_path(name, real_matrix):
    driver = installed(name)
    (row,) = [r for r in real_matrix(None)["frameworks"] if r["framework"] == name]
    entries = {(m["kind"], m["mode"]): m for m in row["modes"]}
    expected = {(kind, mode) for kind in KINDS for mode in driver.modes(kind)}
    assert set(entries) == expected and expected
    for key, entry in entries.items():
        assert "error" not in entry, (key, entry.get("error"))
        assert entry["own"]["ok"], (key, entry["own"]["classes"])
        assert "FAIL" not in entry["own"]["classes"].values(), key
        # each departure is explained by the mode's own flags (one, or all of them together)
        for d in entry["reference"]["departures"]:
            why = d["explanation"]
            assert why.startswith(("flag ", "flags ")), (key, d["case_class"], why)
            named = [f.split("=")[0] for f in why.split(" ", 1)[1].split(", ")]
            assert set(named) <= set(entry["profile"]), (key, why)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_the_cli_exit_code_follows_the_report(name, capsys):
    """`refimpl check --framework F --mode M` exits 0 on the first mode of each kind (the whole list
    runs through check_framework_mode above); a flag the framework does not have makes it fail."""
    driver = installed(name)
    for kind in KINDS:
        modes = driver.modes(kind)
        if not modes:
            continue
        mode = next(iter(modes))
        assert main(["check", "--framework", name, "--mode", mode, "--kind", kind]) == 0, capsys.readouterr()
        assert check_framework_mode(driver, modes[mode], reference=False).ok
    capsys.readouterr()


def test_the_committed_matrix_is_the_installed_frameworks_matrix(real_matrix):
    for name in FRAMEWORKS:
        driver = installed(name)
        if driver.installed_version() != driver.PINNED_VERSION:
            pytest.skip(f"{name} {driver.installed_version()} installed, not {driver.PINNED_VERSION}")
    # compared as `refimpl matrix --check` compares: decimals to 10 significant digits (a framework's
    # last float64 digits depend on the machine's vectorised kernels)
    assert normalised(COMMITTED.read_text()) == normalised(matrix_markdown(real_matrix(None))), (
        "docs/conformance-matrix.md is out of date: python -m refimpl matrix "
        "--out docs/conformance-matrix.md --json docs/conformance-matrix.json"
    )


def test_preset_selects_the_profiles_mode_and_runs_that_preset():
    """`--framework F --preset P` runs the mode profile(F, P) is built from, on preset P (verl's dapo
    is vanilla/token-mean with DAPO's clip-higher 0.28, not the mode's own ppo)."""
    from refimpl.conformance.cli import select_mode
    from refimpl.conformance.conventions import convention_from_flags
    from refimpl.conformance.profiles import profile

    mode = select_mode(load_driver("verl"), "policy_loss", None, "dapo")
    assert (mode.name, mode.preset, mode.variant().eps_high) == ("vanilla/token-mean", "dapo", 0.28)
    missing = set()
    for name in FRAMEWORKS:
        driver = load_driver(name)
        for preset in ("grpo", "dapo", "gspo"):
            if preset not in driver.profile_table:
                with pytest.raises(UserError, match=f"{name} has no policy_loss mode for preset {preset!r}"):
                    select_mode(driver, "policy_loss", None, preset)
                missing.add((name, preset))
                continue
            mode = select_mode(driver, "policy_loss", None, preset)
            assert mode.preset == preset
            own, prof = convention_from_flags(name, mode.convention), profile(name, preset)
            assert all(getattr(prof, k) == getattr(own, k) for k in mode.convention if k != "name")
    assert missing == {("areal", "grpo")}  # AReaL's loss is a global token mean: no seq-mean-token-mean

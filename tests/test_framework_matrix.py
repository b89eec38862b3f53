"""Every mode of every installed framework (``FRAMEWORKS``) passes under its own profile through the
code path of ``refimpl check framework F --mode M`` and ``refimpl matrix``
(``checks.check_framework_mode``), every departure from the spec is explained by a flag of the mode's
profile (none ``unexplained``), and the committed docs/conformance-matrix.md and .json are the matrix
of the installed frameworks (what ``refimpl matrix --out ... --json ... --check`` checks). The
Markdown's format (a summary, then a section per framework, lines of at most 120 characters) is
checked on a matrix made up here for six frameworks. Expected values come from the reference
implementation with the profile's flags, never from the framework. Skipped for a framework that is
not installed."""

from __future__ import annotations

import json
import pathlib

import pytest

from refimpl.conformance.checks import check_framework_mode
from refimpl.conformance.cli import main
from refimpl.conformance.cli_args import UserError
from refimpl.conformance.frameworks import FRAMEWORKS, KINDS, load_driver
from refimpl.conformance.frameworks.findings import Finding
from refimpl.conformance.matrix import LINE_WIDTH, matrix_markdown, matrix_summary, normalised
from refimpl.conformance.matrix_check import compare_matrices

pytestmark = pytest.mark.framework

COMMITTED = pathlib.Path(__file__).resolve().parents[1] / "docs" / "conformance-matrix.md"
COMMITTED_JSON = COMMITTED.with_suffix(".json")


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
        assert main(["check", "framework", name, "--mode", mode, "--kind", kind]) == 0, capsys.readouterr()
        assert check_framework_mode(driver, modes[mode], reference=False).ok
    capsys.readouterr()


def test_the_committed_matrix_is_the_installed_frameworks_matrix(real_matrix):
    for name in FRAMEWORKS:
        driver = installed(name)
        if driver.installed_version() != driver.PINNED_VERSION:
            pytest.skip(f"{name} {driver.installed_version()} installed, not {driver.PINNED_VERSION}")
    # compared as `refimpl matrix --check` compares (refimpl/conformance/matrix_check.py): what the kit
    # decides exactly, the frameworks' measured values within their dtype's tolerance (their last
    # float32 digits depend on the CPU's kernels), the Markdown as the rendering of the JSON
    regenerate = "refimpl matrix --out docs/conformance-matrix.md --json docs/conformance-matrix.json"
    committed = json.loads(COMMITTED_JSON.read_text())
    fresh = json.loads(json.dumps(real_matrix(None)))
    assert compare_matrices(committed, fresh) == [], f"stale: {regenerate}"
    assert normalised(COMMITTED.read_text()) == normalised(matrix_markdown(committed)), f"stale: {regenerate}"


def test_the_committed_matrix_is_readable():
    """The summary comes first and names every framework, its tables on one screen (the findings'
    list after them grows with the findings); no line is longer than LINE_WIDTH."""
    text = COMMITTED.read_text()
    assert max(len(line) for line in text.splitlines()) <= LINE_WIDTH
    summary = text.split("\n## ", 2)[1]
    tables = summary.split("\nFindings: ", 1)[0]
    assert summary.startswith("Summary") and len(tables.splitlines()) < 100 and tables != summary
    for name in FRAMEWORKS:
        assert f"| [{name}](#{name}) |" in summary and f"\n## {name}\n" in text
    data = json.loads(COMMITTED_JSON.read_text())
    assert [r["framework"] for r in data["summary"]["frameworks"]] == list(FRAMEWORKS)


SIX = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")


def made_up_matrix() -> dict:
    """Six frameworks, long texts, a departure per flag combination, findings and an error."""
    long = "a description long enough to need wrapping " * 8
    departures = [
        {"case_class": "empty_rows", "case_id": "empty_rows/0", "explanation": "flag empty_rows='keep'",
         "expected": 0.5, "got": 0.25, "case": "logp = torch.tensor([0.0])"},
        {"case_class": "masked_nonfinite", "case_id": "masked_nonfinite/0",
         "explanation": "flags name='x', masked_nonfinite='propagate', compute_dtype='input'",
         "expected": 0.1, "got": float("nan"), "case": "logp = torch.tensor([0.0])"},
        {"case_class": "outside_clip", "case_id": "outside_clip/3", "explanation": "unexplained",
         "expected": 1.0, "got": 2.0, "case": "logp = torch.tensor([0.0])"},
    ]
    mode = {"kind": "policy_loss", "mode": "m", "preset": "grpo", "description": long,
            "profile": {"empty_rows": "keep", "masked_nonfinite": "propagate", "compute_dtype": "input"},
            "framework_config": {}, "own": {"ok": True, "classes": {"bf16": "ok (compute_dtype='input')"}},
            "reference": {"ok": False, "departures": departures}}
    frameworks = []
    for i, name in enumerate(SIX):
        if name == "zeta":
            frameworks.append({"framework": name, "available": False, "pinned_version": "1.0",
                               "reason": "not installed: " + long})
            continue
        modes = [dict(mode, mode=f"m{j}", reference=dict(mode["reference"], departures=departures[:j + 1]))
                 for j in range(i % 3 + 1)]
        if name == "beta":
            keys = ("kind", "preset", "description", "profile", "framework_config")
            modes.append({k: mode[k] for k in keys} | {"mode": "broken", "error": "RuntimeError: " + long})
        frameworks.append({"framework": name, "available": True, "pinned_version": "1.0", "version": "1.0",
                           "source_hash": "0" * 12, "modes": modes, "notes": {"device": long},
                           "unsupported": [{"kind": "kl", "mode": "k9", "reason": long}],
                           "findings": [
                               Finding("masked_nonfinite='propagate'", "bug", "NaN in the padding: " + long,
                                       where="loss.py:7", quote="x", affected="1.0").to_dict(),
                               Finding("empty_rows", "subgradient", "a kink").to_dict()]})
    matrix = {"frameworks": frameworks}
    matrix["summary"] = matrix_summary(matrix)
    return matrix


def test_the_summary_counts_modes_departures_by_flag_and_findings():
    summary = made_up_matrix()["summary"]
    rows = {r["framework"]: r for r in summary["frameworks"]}
    assert rows["zeta"] == {"framework": "zeta", "available": False}
    # alpha: m0 (empty_rows); beta: m0, m1 (+ masked_nonfinite), an error; gamma: m0, m1, m2 (+ unexplained)
    assert [rows[n]["modes"] for n in SIX[:5]] == [1, 3, 3, 1, 2]
    assert rows["beta"]["errors"] == 1 and rows["beta"]["pass"] == 2 and rows["beta"]["departing"] == 2
    assert [rows[n]["unexplained"] for n in SIX[:5]] == [0, 0, 1, 0, 0]
    # bugs only (not the subgradient), and only where the bug's flag alone reproduces the departure:
    # masked_nonfinite departs by two flags here (masked_nonfinite and compute_dtype), so no bug shows
    assert [rows[n]["bugs"] for n in SIX[:5]] == [0, 0, 0, 0, 0]
    by_flag = summary["departures_by_flag"]
    assert by_flag["empty_rows"] == {"alpha": 1, "beta": 2, "gamma": 3, "delta": 1, "epsilon": 2}
    assert by_flag["masked_nonfinite"] == by_flag["compute_dtype"] == {"beta": 1, "gamma": 2, "epsilon": 1}
    assert by_flag["unexplained"] == {"gamma": 1} and "name" not in by_flag
    gamma_bug = next(b for b in summary["findings"] if b["framework"] == "gamma" and b["kind"] == "bug")
    assert gamma_bug["modes"] == [] and gamma_bug["where"] == "loss.py:7"
    kink = next(b for b in summary["findings"] if b["framework"] == "gamma" and b["kind"] == "subgradient")
    assert kink["modes"] == ["m0", "m1", "m2"]


def test_the_markdown_of_six_frameworks_keeps_every_line_within_the_width():
    text = matrix_markdown(made_up_matrix())
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= LINE_WIDTH
    assert lines.index("## Summary") < lines.index("## alpha") < lines.index("## zeta")
    header = next(line for line in lines if line.startswith("| flag |"))
    assert header == "| flag | " + " | ".join(SIX) + " |"
    assert "| [zeta](#zeta) | not installed |" in text
    assert "- `masked_nonfinite`: flags name='x', masked_nonfinite='propagate', compute_dtype='input'" in text
    flat = " ".join(text.split())
    assert "finding `masked_nonfinite='propagate'` (bug)" not in flat and "got nan" in flat
    assert "`empty_rows` (subgradient)" in flat and "**subgradient**" in flat
    assert "a valid subgradient at a kink, not a bug" in flat and "NaN in the padding: a description" in flat
    assert "- error: RuntimeError: a description" in text and "- kl `k9`: a description" in text


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


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_every_finding_of_a_driver_is_shown_by_a_mode(name, real_matrix):
    """A driver's ``FINDINGS`` name departures its modes show under the reference (a key that no mode
    departs by is a stale or misspelt entry)."""
    installed(name)
    matrix = real_matrix(None)
    bugs = [b for b in matrix["summary"]["findings"] if b["framework"] == name]
    # a validation finding (a setting accepted silently) is shown by its script, not by a mode; a bug is
    # tagged only where its flag alone departs, so one whose flag departs only with others of its mode's
    # profile (AReaL's Normalization: token weighting with the sample std, eps and float32 output), or
    # one the kit's float32-exact cases cannot show (a float64 one-pass variance), is in a mode's profile
    (row,) = [r for r in matrix["frameworks"] if r["framework"] == name]
    profiles = {flag for m in row["modes"] for flag in m["profile"]}
    # a documented default of a setting no mode drives (SkyRL's kl_cov_frac: KL-Cov has no spec variant)
    # has no flag to show it by; one keyed by a flag must be shown like any other finding
    from refimpl.conformance.conventions import FLAGS

    undriven = {b["key"] for b in bugs if b["kind"] == "documented_default"
                and b["key"].split("=", 1)[0] not in set(FLAGS) | profiles}
    # and a bug in a path the kit cannot drive (Liger-Kernel's Triton kernels, its luspo at the token
    # level: no spec aggregation) is shown by its script and named by the unsupported mode that says why
    reasons = " ".join(u["reason"] for u in row["unsupported"])
    undriven |= {b["key"] for b in bugs if f"finding {b['key']}" in reasons}
    untagged = [b["key"] for b in bugs if not b["modes"] and b["kind"] != "validation"
                and b["key"] not in undriven]
    assert [k for k in untagged if k.split("=", 1)[0] not in profiles] == []

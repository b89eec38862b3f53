"""``refimpl check --framework`` and ``refimpl matrix`` with a fake driver (tests/fake_framework.py):
the mode's profile passes, the reference lists every departure with the flag that reproduces it
or ``unexplained``, a missing framework is one line (exit 2; exit 1 when required), the header
names version and source hash."""

from __future__ import annotations

import json

import pytest

from refimpl.conformance.cli import main
from refimpl.conformance.frameworks import source_hash
from refimpl.conformance.matrix import build_matrix, matrix_markdown
from tests import fake_framework


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_framework_mode_passes_under_its_profile_and_the_header_names_version_and_hash(monkeypatch, capsys):
    fake_framework.install(monkeypatch)
    code, out, err = run(capsys, "check", "--framework", "trl", "--preset", "dapo")
    assert code == 0, out + err
    digest = source_hash([fake_framework.SOURCE])
    assert out.splitlines()[0].startswith(f"framework trl 1.0.0 (source sha256 {digest}), mode dapo")
    assert "departure from the spec, allowed by masked_nonfinite='propagate'" in out
    assert "warning" not in out


def test_reference_lists_each_departure_with_its_flag_or_unexplained(monkeypatch, capsys):
    fake_framework.install(monkeypatch)
    code, out, _ = run(capsys, "check", "--framework", "trl", "--preset", "dapo", "--convention", "reference")
    assert code == 1
    assert "departure masked_nonfinite (masked_nonfinite/0): flag masked_nonfinite='propagate'" in out
    assert "expected loss =" in out and "got loss      = nan" in out  # the minimal case in full
    code, out, _ = run(capsys, "check", "--framework", "trl", "--mode", "buggy", "--convention", "reference")
    assert code == 1
    assert "departure outside_clip (outside_clip/0): unexplained" in out
    code, out, _ = run(capsys, "check", "--framework", "trl", "--mode", "buggy")
    assert code == 1 and "FAIL: case classes" in out


def test_other_kinds_and_json(monkeypatch, capsys):
    fake_framework.install(monkeypatch)
    code, out, _ = run(
        capsys, "check", "--framework", "trl", "--kind", "kl", "--mode", "low_var_kl", "--json"
    )
    assert code == 0
    report = json.loads(out)
    assert report["ok"] and report["header"][0].startswith("framework trl 1.0.0")
    code, out, _ = run(capsys, "check", "--framework", "trl", "--kind", "group_advantages", "--mode", "rloo")
    assert code == 0, out
    code, out, _ = run(
        capsys,
        "check",
        "--framework",
        "trl",
        "--kind",
        "kl",
        "--mode",
        "low_var_kl",
        "--convention",
        "reference",
    )
    assert code == 1 and "large_log_ratio" in out
    assert "departure extreme_log_ratio (extreme_log_ratio/0): flag" in out  # explained by a clamp flag


def test_missing_framework_is_one_line_and_a_failure_when_required(monkeypatch, capsys):
    monkeypatch.delenv("RL_ORACLE_REQUIRE_FRAMEWORKS", raising=False)  # CI sets it
    fake_framework.install(monkeypatch, "verl", available=False)
    code, out, err = run(capsys, "check", "--framework", "verl", "--preset", "dapo")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "framework verl is not available, skipped: verl is not installed" in err
    monkeypatch.setenv("RL_ORACLE_REQUIRE_FRAMEWORKS", "1")
    code, _, err = run(capsys, "check", "--framework", "verl", "--preset", "dapo")
    assert code == 1 and "required" in err and err.count("\n") == 1


def test_other_version_warns(monkeypatch, capsys):
    fake_framework.install(monkeypatch, version="2.0.0")
    code, out, _ = run(capsys, "check", "--framework", "trl", "--preset", "dapo")
    assert code == 0
    assert "warning: trl 2.0.0 is installed; the profiles describe 1.0.0" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mode", "nope"], "trl has no policy_loss mode 'nope'"),
        (["--mode", "geo_mean"], "mode 'geo_mean' is not supported: GMPO"),
        (["--preset", "grpo"], "trl has no policy_loss mode for preset 'grpo'"),
        (["--preset", "dapo", "--convention", "verl"], "the mode's own profile, or --convention reference"),
        (["--preset", "dapo", "--variant", "nope=1"], "--variant: unknown field 'nope'"),
    ],
)
def test_framework_usage_errors(monkeypatch, capsys, argv, message):
    fake_framework.install(monkeypatch)
    code, out, err = run(capsys, "check", "--framework", "trl", *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_matrix_with_a_fake_driver(monkeypatch, capsys, tmp_path):
    fake_framework.install(monkeypatch, "trl")
    fake_framework.install(monkeypatch, "verl", available=False)
    matrix = build_matrix(["trl", "verl"])
    trl, verl = matrix["frameworks"]
    assert verl == {
        "framework": "verl",
        "available": False,
        "pinned_version": "1.0.0",
        "reason": "not installed: verl is not installed (pip install verl)",
    }
    modes = {m["mode"]: m for m in trl["modes"]}
    assert modes["dapo"]["own"]["ok"] and not modes["buggy"]["own"]["ok"]
    dapo_departures = {d["case_class"]: d["explanation"] for d in modes["dapo"]["reference"]["departures"]}
    assert dapo_departures == {"masked_nonfinite": "flag masked_nonfinite='propagate'"}
    assert "unexplained" in {d["explanation"] for d in modes["buggy"]["reference"]["departures"]}
    kl = {d["case_class"]: d["explanation"] for d in modes["low_var_kl"]["reference"]["departures"]}
    assert (
        set(kl.values())
        <= {
            "flag kl_log_ratio_clamp=20.0",
            "flag kl_value_clamp=10.0",
            "flags kl_log_ratio_clamp=20.0, kl_value_clamp=10.0",
        }
        and kl
    )
    assert modes["rloo"]["own"]["ok"]
    assert trl["unsupported"] == [
        {"kind": "policy_loss", "mode": "geo_mean", "reason": "GMPO's geometric mean is not in this fake"}
    ]
    # each departure's minimal case is one line of Python that runs
    case = modes["dapo"]["reference"]["departures"][0]["case"]
    namespace: dict = {}
    exec("import torch\n" + case, namespace)
    assert namespace["logp"].shape == namespace["mask"].shape
    text = matrix_markdown(matrix)
    assert "## verl" in text and "not installed" in text and "`geo_mean`: GMPO" in text
    assert "`masked_nonfinite`: flag masked_nonfinite='propagate'" in text
    out_md, out_json = tmp_path / "m.md", tmp_path / "m.json"
    code, _, _ = run(capsys, "matrix", "--framework", "trl", "--out", str(out_md), "--json", str(out_json))
    assert code == 0 and out_md.read_text().startswith("# Conformance matrix")
    assert json.loads(out_json.read_text())["frameworks"][0]["framework"] == "trl"
    # CI: a drift of the committed matrix is a failure
    assert run(capsys, "matrix", "--framework", "trl", "--out", str(out_md), "--check")[0] == 0
    out_md.write_text(out_md.read_text().replace("pass", "PASS"))
    code, _, err = run(capsys, "matrix", "--framework", "trl", "--out", str(out_md), "--check")
    assert code == 1 and "out of date" in err and err.count("\n") == 1


def test_a_driver_that_cannot_load_its_framework_is_one_line(monkeypatch, capsys):
    driver = fake_framework.install(monkeypatch)

    def target(kind, mode, variant):
        raise ModuleNotFoundError("No module named 'ray'")

    monkeypatch.setattr(driver, "target", target)
    code, out, err = run(capsys, "check", "--framework", "trl", "--preset", "dapo")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "trl mode dapo: ModuleNotFoundError: No module named 'ray'" in err

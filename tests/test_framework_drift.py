"""Releases and drift (refimpl/conformance/frameworks/releases.py, drift.py): a driver's flags for a
release apply to that release only; ``compare`` names what changed between two releases' matrix rows
(modes, flags, failing classes, findings); the document renders it; and the committed
docs/conformance-drift.md names the changes the kit is known to see (issue 30): SkyRL's two fixes,
verl's GSPO aggregation and OpenRLHF's empty micro-batch, each where it falls."""

from __future__ import annotations

import pathlib

import pytest

from refimpl.conformance.frameworks import Mode, releases
from refimpl.conformance.frameworks.drift import (
    CHANGES,
    RELEASES,
    compare,
    drift_data,
    drift_markdown,
    locate_findings,
    named_releases,
    package_root,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODES = (Mode("a", convention={"micro_batch": "global"}), Mode("b"))


def test_release_flags_apply_to_their_release_only(monkeypatch):
    flags = {"0.1": {"a": {"micro_batch": "local_mean", "kl_log_ratio_max": None}}}
    monkeypatch.setattr(releases, "distribution_version", lambda dist: "0.1")
    a, b = releases.release_modes(MODES, flags, "pkg")
    assert a.convention == {"micro_batch": "local_mean", "kl_log_ratio_max": None} and b == MODES[1]
    monkeypatch.setattr(releases, "distribution_version", lambda dist: "0.2")
    assert releases.release_modes(MODES, flags, "pkg") == MODES
    with pytest.raises(ValueError, match=r"RELEASE_FLAGS names modes that do not exist: \['c'\]"):
        releases.release_modes(MODES, {"0.2": {"c": {}}}, "pkg")


def test_a_release_directory_comes_first_on_the_path(tmp_path):
    assert releases.release_dir("verl", "0.9.0") == pathlib.Path(".frameworks-releases/verl-0.9.0")
    env = releases.release_env(tmp_path, {"PYTHONPATH": "/x"})
    assert env["PYTHONPATH"] == f"{tmp_path.resolve()}:/x"
    assert releases.release_env(tmp_path, {})["PYTHONPATH"] == str(tmp_path.resolve())


def _mode(name, profile, ok=True, failing=(), departures=()):
    classes = {"inside_clip": "ok", **{c: "FAIL" for c in failing}}
    return {"kind": "policy_loss", "mode": name, "profile": profile, "own": {"ok": ok, "classes": classes},
            "reference": {"departures": [{"case_class": c} for c in departures]}}


def _row(modes, findings=()):
    return {"framework": "f", "available": True, "modes": modes,
            "findings": [{"key": k} for k in findings]}


def test_compare_names_modes_flags_failures_and_findings():
    old = _row([_mode("gspo", {"fixed_aggregation": "seq_mean_token_mean"}),
                _mode("kl", {"kl_gradient": "none"}), _mode("gone", {})],
               findings=("kl_gradient", "empty_step"))
    new = _row([_mode("gspo", {}), _mode("kl", {}), _mode("new", {}),
                _mode("pad", {}, ok=False, failing=("padding_micro_batch",))], findings=("kl_gradient",))
    step = compare(old, new)
    assert step["modes_added"] == ["policy_loss:new", "policy_loss:pad"]
    assert step["modes_removed"] == ["policy_loss:gone"]
    assert step["flags_changed"] == {
        "policy_loss:gspo": {"fixed_aggregation": ["seq_mean_token_mean", None]},
        "policy_loss:kl": {"kl_gradient": ["none", None]},
    }
    assert step["failing"] == {"policy_loss:pad": ["padding_micro_batch"]}
    # kl_gradient: listed in both, but no passing mode of the new release holds the flag
    assert step["findings_fixed"] == ["kl_gradient"] and step["findings_introduced"] == []


def test_the_document_has_a_summary_and_each_step_with_its_change_in_words():
    rows = {"verl": {"0.9.0": _row([_mode("gspo/token-mean", {"fixed_aggregation": "seq_mean_token_mean"})]),
                     "0.9.1": _row([_mode("gspo/token-mean", {})])}}
    text = drift_markdown(drift_data(rows))
    assert "| verl | 0.9.0: 1/1; 0.9.1: 1/1 |" in text
    assert "- **verl 0.9.0 -> verl 0.9.1**:" in text
    assert "`policy_loss:gspo/token-mean`: `fixed_aggregation` 'seq_mean_token_mean' -> None" in text
    assert CHANGES[("verl", "0.9.1")] in text


def test_a_flag_value_finding_is_present_where_a_profile_holds_that_value_and_words_show_unavailable():
    raise_ = _row([_mode("cispo", {"zero_rows": "raise"})], findings=("zero_rows='raise'", "zero_rows='nan'"))
    data = drift_data({"skyrl_pkg": {"0.3.0": {"available": False, "reason": "not installed"},
                                     "0.4.0": raise_}})
    assert data["skyrl_pkg"]["releases"][1]["findings"] == ["zero_rows='raise'"]
    data = drift_data({"tunix": {"0.1.6": {"available": False, "reason": "no rl/algo_core.py"},
                                 "0.1.7": raise_}})
    text = drift_markdown(data)
    assert "- **tunix 0.1.6 -> tunix 0.1.7**: not compared (no rl/algo_core.py)" in text
    assert f"  - {CHANGES[('tunix', '0.1.7')]}" in text


def test_a_finding_whose_quoted_code_the_release_lacks_is_not_present_there(tmp_path, monkeypatch):
    """A finding cites the pinned release's line: in a release whose file does not hold the quoted code
    (or has no such file) it is not present, so the drift neither lists it there nor calls it fixed."""
    monkeypatch.chdir(tmp_path)
    old_root = tmp_path / releases.release_dir("trl", "1.14.2") / "trl"
    (old_root / "trainer").mkdir(parents=True)
    (old_root / "trainer" / "grpo_trainer.py").write_text("x = 1\nloss = per_token_loss.sum()\n")
    assert package_root("trl", "1.14.2").resolve() == old_root
    assert package_root("trl", "1.13.0") is None  # not installed anywhere
    row = _row([_mode("grpo", {})])
    row["findings"] = [
        {"key": "here", "where": "trainer/grpo_trainer.py:40", "quote": "loss = per_token_loss.sum()"},
        {"key": "gone", "where": "trainer/grpo_trainer.py:41", "quote": "coef_1 = torch.exp(log_ratio)"},
        {"key": "no_file", "where": "experimental/async_grpo.py:9", "quote": "x = 1"},
        {"key": "no_line"},
    ]
    located = locate_findings(row, old_root)
    assert [f.get("located") for f in located["findings"]] == [True, False, False, None]
    assert locate_findings(row, None) is row
    new = {**row, "findings": [{k: v for k, v in f.items()} for f in row["findings"]]}
    data = drift_data({"trl": {"1.14.2": located, "1.16.0": new}})
    assert data["trl"]["releases"][0]["findings"] == ["here", "no_line"]
    assert data["trl"]["releases"][1]["findings"] == ["gone", "here", "no_file", "no_line"]
    assert data["trl"]["steps"][0]["findings_introduced"] == ["gone", "no_file"]
    assert data["trl"]["steps"][0]["findings_fixed"] == []


def test_every_framework_has_releases_and_its_pinned_one_among_them():
    from refimpl.conformance.frameworks import EXTRA_FRAMEWORKS, FRAMEWORKS, load_driver

    assert set(RELEASES) == set(FRAMEWORKS + EXTRA_FRAMEWORKS)
    for name, versions in RELEASES.items():
        assert load_driver(name).pinned_version in versions, name


def test_the_committed_drift_document_names_the_known_changes():
    text = (ROOT / "docs" / "conformance-drift.md").read_text()
    for step, words in [
        # seq_sum_extra: max_seq_len is the user's (train/utils/utils.py:379); zero_rows: the policy losses
        # are masked sums (the KL loss's mean over rows is zero_rows='nan', in both packages)
        ("skyrl 0.3.1 -> skyrl_pkg 0.3.0", "findings fixed: kl_gradient, seq_sum_extra, zero_rows\n"),
        ("skyrl 0.3.1 -> skyrl_pkg 0.3.0",
         "list them): config:clip_ratio_c, config:max_seq_len, ratio_overflow, whiten_mean\n"),
        ("skyrl_pkg 0.3.0 -> skyrl_pkg 0.4.0", "findings fixed: cispo_clip_low\n"),
        ("openrlhf 0.10.3 -> openrlhf 0.10.4", "findings fixed: padding_micro_batch\n"),
        ("openrlhf 0.10.4 -> openrlhf 0.11.2", "findings fixed: masked_nonfinite\n"),
        ("verl 0.9.0 -> verl 0.9.1", "`fixed_aggregation`"),
        ("openrlhf 0.10.3 -> openrlhf 0.10.4", "`micro_batch` 'local_mean' -> None"),
        ("openrlhf 0.10.4 -> openrlhf 0.11.2", "`kl_log_ratio_max` None -> 10.0"),
        ("liger 0.7.0 -> liger 0.8.0", "modes added: policy_loss:dapo+kl/bias-correction, "
                                       "policy_loss:dapo/delta, policy_loss:luspo"),
        ("liger 0.8.0 -> liger 0.8.4", "`micro_batch` 'local_mean' -> None"),
        ("tunix 0.1.6 -> tunix 0.1.7", CHANGES[("tunix", "0.1.7")]),
    ]:
        section = text.split(f"**{step}**", 1)
        assert len(section) == 2, step
        assert words in section[1].split("\n- **", 1)[0], (step, words)
    # every failing mode of every release fails only classes that a finding of that release names
    assert "no flag or finding reproduces" not in text and "unexplained" not in text


def _skyrl_rows():
    """SkyRL-train's last release and the skyrl package's two: a finding fixed in the successor
    (kl_gradient), one that ``affected`` says holds in skyrl 0.4.0 although skyrl_pkg does not list it
    (ratio_overflow), one listed by both and fixed in 0.4.0 (cispo_clip_low)."""
    held = {"kl_gradient": "none", "ratio_overflow": "nan", "cispo_clip_low": 0.0}
    last = _row([_mode("m", held)])
    last["findings"] = [
        {"key": "kl_gradient", "affected": "skyrl-train 0.3.1 (its last release)"},
        {"key": "ratio_overflow", "affected": "skyrl-train 0.3.1; skyrl 0.4.0 (ppo_utils.py:960, 1021)"},
        {"key": "cispo_clip_low", "affected": "skyrl-train 0.3.1; skyrl 0.3.0 (default still 0.0)"},
    ]
    return {"skyrl": {"0.3.1": last},
            "skyrl_pkg": {"0.3.0": _row([_mode("m", {"cispo_clip_low": 0.0})],
                                        findings=("cispo_clip_low",)),
                          "0.4.0": _row([_mode("m", {})])}}


def test_a_predecessor_finding_that_its_affected_names_in_the_successor_is_not_fixed_there():
    assert named_releases("skyrl-train 0.3.1; skyrl 0.3.0, 0.4.0 (ppo_utils.py:960, 1021)", "skyrl") == [
        "0.3.0", "0.4.0"]
    assert named_releases("skyrl-train 0.3.1 (its last release)", "skyrl") == []
    data = drift_data(_skyrl_rows())
    successor, step = data["skyrl_pkg"]["steps"]
    assert successor["from"] == "skyrl 0.3.1" and successor["findings_fixed"] == ["kl_gradient"]
    assert successor["findings_carried"] == ["ratio_overflow"] and successor["findings_introduced"] == []
    assert step["findings_fixed"] == ["cispo_clip_low"] and step["findings_introduced"] == []
    assert [r["findings"] for r in data["skyrl_pkg"]["releases"]] == [["cispo_clip_low", "ratio_overflow"],
                                                                      ["ratio_overflow"]]
    text = drift_markdown(data)
    assert "  - findings fixed: kl_gradient\n" in text
    assert "its driver does not list them): ratio_overflow\n" in text


def test_a_failing_class_keyed_by_a_finding_of_the_release_is_that_finding_the_rest_unexplained():
    old = _row([_mode("ppo", {})])
    new = _row([_mode("ppo", {}, ok=False, failing=("padding_micro_batch", "zero_rows")),
                _mode("gspo", {}, ok=False, failing=("padding_micro_batch",))],
               findings=("padding_micro_batch",))
    text = drift_markdown(drift_data({"openrlhf": {"0.10.3": old, "0.10.4": new}}))
    assert ("  - `policy_loss:ppo` fails padding_micro_batch, zero_rows under its profile: finding "
            "padding_micro_batch of this release; zero_rows unexplained (no flag or finding reproduces it)"
            ) in text
    assert ("  - `policy_loss:gspo` fails padding_micro_batch under its profile: finding "
            "padding_micro_batch of this release\n") in text
    assert "| openrlhf | 0.10.3: 1/1; 0.10.4: 0/2 (1 fail by its findings, 1 unexplained), " in text
    text = drift_markdown(drift_data({"openrlhf": {"0.10.4": new}}))
    assert ("- openrlhf 0.10.4: `policy_loss:gspo` fails padding_micro_batch under its profile: "
            "finding padding_micro_batch") in text


def test_a_release_finding_is_a_finding_of_that_release_only():
    from refimpl.conformance.frameworks.findings import Finding, as_findings

    pinned, old = Finding("a", "bug", "t"), Finding("padding_micro_batch", "bug", "u")
    module = type("Module", (), {"FINDINGS": (pinned,), "RELEASE_FINDINGS": {"0.1": (old,)}})
    assert as_findings(module, "0.1") == (pinned, old)
    assert as_findings(module, "0.2") == as_findings(module) == (pinned,)


def test_release_flags_and_findings_name_releases_the_drift_compares():
    from refimpl.conformance.frameworks import load_driver

    for name, versions in RELEASES.items():
        module = load_driver(name).module
        for table in ("RELEASE_FLAGS", "RELEASE_FINDINGS"):
            named = set(getattr(module, table, {}))
            assert named <= set(versions) - {load_driver(name).pinned_version}, (name, table, named)


def test_release_findings_lines_hold_in_their_installed_release():
    """Each RELEASE_FINDINGS line against that release's own directory (``refimpl frameworks drift``
    installs them; absent in CI, where the pinned releases' lines are checked:
    tests/test_framework_findings.py)."""
    from refimpl.conformance.frameworks import load_driver

    checked = 0
    for name in RELEASES:
        driver = load_driver(name)
        distribution = getattr(driver.module, "DISTRIBUTION", name)
        for version, findings in getattr(driver.module, "RELEASE_FINDINGS", {}).items():
            directory = ROOT / releases.release_dir(distribution, version)
            for finding in findings:
                assert finding.where and finding.affected and version in finding.affected, finding
                files = sorted(directory.glob(f"*/{finding.where.rsplit(':', 1)[0]}"))
                if not files:
                    continue
                line = files[0].read_text().splitlines()[int(finding.where.rsplit(":", 1)[1]) - 1]
                assert finding.quote in line, (name, version, finding.key, line)
                checked += 1
    if not checked:
        pytest.skip("no release of RELEASE_FINDINGS installed under .frameworks-releases")

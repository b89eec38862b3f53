"""The pytest plugin (refimpl/pytest_plugin.py) on the example package examples/acme-rl, run
in-process through pytester: its own suite passes (one test per case class), the copy with planted
bugs fails with the smallest failing case, its expected and obtained values in pytest's output, and
a run that does not use the plugin is left alone. The helpers' bad arguments fail at collection.

The pytester runs disable plugin autoloading and name this plugin with ``-p``, so they are the same
whether or not the installed rl-oracle declares its ``pytest11`` entry point (CI checks the entry
point from the built wheel: examples/run_example_ci.sh)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from refimpl.conformance import case_classes, check_loss
from refimpl.conformance.checks import applicable_case_classes
from refimpl.pytest_plugin import advantage_tests, kl_tests, logprob_tests, loss_tests

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "acme-rl"


@pytest.fixture
def example(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester in a copy of the example package, its ``acme_rl`` importable."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".pytest_cache")
    shutil.copytree(EXAMPLE, pytester.path, dirs_exist_ok=True, ignore=ignore)
    pytester.syspathinsert(pytester.path)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # this module imported the plugin already: pytest cannot assertion-rewrite it again (a warning)
    quiet = ("-W", "ignore::pytest.PytestAssertRewriteWarning", "-p", "no:cacheprovider")
    return pytester.runpytest_inprocess("-p", "refimpl.pytest_plugin", *quiet, *args)


def planted_passes() -> int:
    """The planted bugs fail one class of the DAPO loss and three of the advantages (unequal groups,
    a singleton, a trailing partial group: a reshape to (-1, group size))."""
    return len(applicable_case_classes("dapo")) - 1 + len(case_classes("group_advantages")) - 3


def test_the_example_suite_passes_one_test_per_case_class(example):
    result = run(example, "-v")
    expected = (
        len(applicable_case_classes("dapo"))
        + len(case_classes("kl"))
        + len(case_classes("group_advantages"))
        + len(case_classes("token_logprobs"))
    )
    result.assert_outcomes(passed=expected)
    result.stdout.fnmatch_lines(
        [
            "*test_conformance.py::test_dapo_loss[[]masked_nonfinite[]] PASSED*",
            "*test_conformance.py::test_dapo_loss[[]golden_vectors[]] PASSED*",
            "*test_conformance.py::test_kl_k3[[]extreme_log_ratio[]] PASSED*",
            "*test_conformance.py::test_grpo_advantages[[]singleton_group[]] PASSED*",
            "*test_conformance.py::test_token_logprobs[[]bf16[]] PASSED*",
        ]
    )
    assert "kl_penalty" not in result.stdout.str()
    # examples/README.md shows this suite and its count
    readme = (ROOT / "examples" / "README.md").read_text()
    shown = f"$ pytest          # {expected} passed" in readme and f"\n{expected} passed\n" in readme
    assert shown, f"examples/README.md must show the example's {expected} passed tests (twice)"
    suite = (EXAMPLE / "tests" / "test_conformance.py").read_text().splitlines()
    assert all(line in readme for line in suite if line.startswith(("test_", "from refimpl")))


def test_a_planted_bug_fails_with_the_smallest_case_expected_and_got(example):
    result = run(example, "planted")
    result.assert_outcomes(failed=4, passed=planted_passes())
    assert "$ pytest planted  # 4 failed" in (ROOT / "examples" / "README.md").read_text()
    result.stdout.fnmatch_lines(
        [
            "*_ test_dapo_loss[[]masked_nonfinite[]] _*",
            "masked_nonfinite failed: smallest failing case masked_nonfinite/0: value off by inf*; "
            "loss expected *, got nan",
            "*convention reference*",
            "case class masked_nonfinite: 3 cases, value FAIL, gradient FAIL*",
            "smallest failing case: masked_nonfinite/0",
            "  diagnosis: matches flag masked_nonfinite='propagate'",
            "  logp (float64, shape (4, 4)) = [[]*nan*",
            "  expected loss = *",
            "  got loss      = nan",
            "  expected d loss / d logp *",
            "  got d loss / d logp *nan*",
            "the case as one line of Python:",
            "  logp = torch.tensor(*",
            "checked: acme_rl.planted_bug:dapo_loss with rl-oracle *",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "unequal_groups failed: smallest failing case unequal_groups/0: "
            "the function raised RuntimeError*",
            "singleton_group failed: smallest failing case singleton_group/0: value off by *",
            "  rewards (float64, shape (4,)) = *",
            "  expected advantages *",
            "  got advantages *",
            "FAILED planted/test_planted_bug.py::test_dapo_loss[[]masked_nonfinite[]] - mask*",
        ]
    )
    # the message alone, no traceback into the kit
    assert "Traceback" not in result.stdout.str() and "traceback entries" not in result.stdout.str()
    assert "refimpl/pytest_plugin.py" not in result.stdout.str()


def test_without_the_plugin_the_failure_is_still_an_assertion_with_the_message(example):
    # the helpers return plain test functions: with the plugin not loaded (and no --strict-markers)
    # the same failure is an AssertionError carrying the same message
    result = example.runpytest_inprocess("-p", "no:cacheprovider", "-o", "addopts=", "planted")
    result.assert_outcomes(failed=4, passed=planted_passes())
    result.stdout.fnmatch_lines(["E   refimpl.pytest_plugin.ConformanceFailure: masked_nonfinite failed: *"])


def test_a_run_that_does_not_use_the_plugin_is_left_alone(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile("def test_plain():\n    assert 1 + 1 == 3\n")
    result = run(pytester, "--strict-markers", "-m", "not rl_oracle")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([">       assert 1 + 1 == 3", "E       assert (1 + 1) == 3"])
    # loading the plugin imports neither torch nor the kit
    code = (
        "import sys, refimpl.pytest_plugin\n"
        "print(sorted(m for m in ('torch', 'refimpl.conformance') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_entry_point_names_the_plugin_module():
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.entry-points.pytest11]\n", 1)[1].split("\n[", 1)[0]
    entries = [line for line in section.splitlines() if line and not line.startswith("#")]
    assert entries == ['rl_oracle = "refimpl.pytest_plugin"']


def test_a_class_without_a_case_is_skipped_and_a_wrong_signature_fails(example):
    example.makepyfile(
        test_edges="""
        from acme_rl.losses import dapo_loss
        from refimpl.pytest_plugin import loss_tests

        def one_argument(logp):
            return logp.sum()

        def ignores_the_kl_term(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None):
            return dapo_loss(logp, old_logp, advantages, mask, normalizer=normalizer)

        test_signature = loss_tests(one_argument, "dapo", classes=("inside_clip",))
        test_no_kl_term = loss_tests(dapo_loss, "dapo", classes=("kl_penalty",))
        test_with_kl_term = loss_tests(ignores_the_kl_term, "dapo", kl_coef=0.04, classes=("kl_penalty",))
        """
    )
    result = run(example, "test_edges.py", "-rs")
    # without a KL term kl_penalty has no case: skipped, never passed empty
    result.assert_outcomes(failed=2, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*one_argument does not fit the contract*expected fn(logp, old_logp, advantages, mask*",
            "kl_penalty failed: smallest failing case kl_penalty/0*",
            "SKIPPED [[]1[]] *pytest_plugin.py:*: no case of class kl_penalty applies to "
            "acme_rl.losses:dapo_loss (*0 cases)",
        ]
    )


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: loss_tests(len, "no_such_preset"), ValueError, "no_such_preset"),
        (lambda: loss_tests(len, "dapo", convention="nope"), ValueError, "convention"),
        (lambda: loss_tests(len, "dapo", classes=("ragged", "nope")), ValueError, "['nope']"),
        (lambda: loss_tests(len, "dapo", classes="ragged"), TypeError, "classes"),
        (lambda: loss_tests(3, "dapo"), TypeError, "target"),
        (lambda: loss_tests(len, "dapo", adapter=3), TypeError, "adapter"),
        (lambda: kl_tests(len, "k4"), ValueError, "estimator"),
        (lambda: advantage_tests(len, convention="nope"), ValueError, "convention"),
        (lambda: logprob_tests(len, classes=()), ValueError, "classes"),
    ],
)
def test_bad_arguments_fail_at_collection_in_one_line(make, error, words):
    with pytest.raises(error) as info:
        make()
    assert words in str(info.value) and "\n" not in str(info.value)


def test_the_report_gives_one_class_and_its_failure_message(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from acme_rl.planted_bug import dapo_loss

    report = check_loss(dapo_loss, "dapo", classes=("ragged", "masked_nonfinite"))
    assert report.case_class("ragged").ok and not report.case_class("masked_nonfinite").ok
    with pytest.raises(KeyError, match="kl_penalty.*classes: ragged, masked_nonfinite"):
        report.case_class("kl_penalty")
    assert report.failure_message("ragged") == ""
    message = report.failure_message()
    first = message.splitlines()[0]
    assert first.startswith(
        "masked_nonfinite failed: smallest failing case masked_nonfinite/0: value off by ")
    suffix = " more characters: CheckReport.to_dict() has them)"
    cut = report.failure_message(max_line=80).splitlines()
    assert any(line.endswith(suffix) for line in cut)
    assert all(len(line) <= 80 or (line.endswith(suffix) and len(line) < 100 + len(suffix)) for line in cut)


@pytest.mark.parametrize("convention, kl_coef", [("reference", None), ("reference", 0.04), ("trl", None)])
def test_applicable_case_classes_are_those_the_check_runs(monkeypatch, convention, kl_coef):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from acme_rl.losses import dapo_loss

    def loss(logp, old_logp, advantages, mask, *, ref_logp=None, normalizer=None):  # KL term ignored
        return dapo_loss(logp, old_logp, advantages, mask, normalizer=normalizer)

    applicable = applicable_case_classes("dapo", convention=convention, kl_coef=kl_coef)
    report = check_loss(loss, "dapo", convention=convention, kl_coef=kl_coef)
    assert applicable == tuple(row.case_class for row in report.by_class())
    assert ("kl_penalty" in applicable) == (kl_coef is not None)
    # the vectors hold DAPO without a KL term (none with kl_coef 0.04), under the reference only
    assert ("golden_vectors" in applicable) == (convention == "reference" and kl_coef is None)

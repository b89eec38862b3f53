"""CI's guard for the real-framework tests (tests/conftest.py): with RL_ORACLE_REQUIRE_FRAMEWORKS=1 a
skipped ``framework`` test is a failure, otherwise a skip."""

from types import SimpleNamespace

import pytest

from tests import conftest


def _outcome(monkeypatch, marker_name: str, required_env: str, required: bool, marked: bool) -> str:
    """The outcome conftest's report hook gives a skipped test carrying ``marker_name`` (or none)
    when ``required_env`` is "1" (CI) or "0" (locally); the other guard's variable is "0"."""
    for env in ("RL_ORACLE_REQUIRE_FRAMEWORKS", "RL_ORACLE_REQUIRE_NODE"):
        monkeypatch.setenv(env, "1" if (required and env == required_env) else "0")
    report = SimpleNamespace(skipped=True, outcome="skipped", longrepr=f"{marker_name} is not installed")
    marker = object() if marked else None
    item = SimpleNamespace(get_closest_marker=lambda name: marker if name == marker_name else None)
    wrapper = conftest.pytest_runtest_makereport(item, None)
    next(wrapper)
    with pytest.raises(StopIteration):
        wrapper.send(SimpleNamespace(get_result=lambda: report))
    return report.outcome


def _report_after_hook(monkeypatch, required: bool, marked: bool) -> str:
    return _outcome(monkeypatch, "framework", "RL_ORACLE_REQUIRE_FRAMEWORKS", required, marked)


def test_a_skipped_framework_test_fails_when_frameworks_are_required(monkeypatch):
    assert _report_after_hook(monkeypatch, required=True, marked=True) == "failed"


def test_it_stays_a_skip_locally_and_for_unmarked_tests(monkeypatch):
    assert _report_after_hook(monkeypatch, required=False, marked=True) == "skipped"
    assert _report_after_hook(monkeypatch, required=True, marked=False) == "skipped"


def _node_outcome(monkeypatch, required: bool, marked: bool) -> str:
    """The same guard for the ``node`` marker (the JavaScript consumer) and RL_ORACLE_REQUIRE_NODE."""
    return _outcome(monkeypatch, "node", "RL_ORACLE_REQUIRE_NODE", required, marked)


def test_a_skipped_node_test_fails_when_node_is_required(monkeypatch):
    assert _node_outcome(monkeypatch, required=True, marked=True) == "failed"
    assert _node_outcome(monkeypatch, required=False, marked=True) == "skipped"
    assert _node_outcome(monkeypatch, required=True, marked=False) == "skipped"


def test_make_test_matrix_collects_every_module_that_builds_the_real_matrix():
    """CI's two-thread pass leaves out the tests marked ``real_matrix`` (conftest marks every test that
    takes the fixture) and `make test-matrix` runs them, collecting only the Makefile's MATRIX_TESTS:
    a module outside that list that took the fixture would run in neither."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    (listed,) = re.findall(r"^MATRIX_TESTS := (.+)$", (root / "Makefile").read_text(), flags=re.M)
    users = {f"tests/{path.name}" for path in (root / "tests").glob("test_*.py")
             if re.search(r"def test_\w+\([^)]*\breal_matrix\b", path.read_text())}
    assert users and users == set(listed.split())


def test_a_test_that_takes_the_real_matrix_is_marked_and_others_are_not():
    def item(fixtures):
        marks = []
        return SimpleNamespace(path=SimpleNamespace(name="test_x.py"), originalname="test_y",
                               fixturenames=fixtures, get_closest_marker=lambda name: None,
                               add_marker=marks.append, marks=marks)

    taking, other = item(("tmp_path", "real_matrix")), item(("tmp_path",))
    conftest.pytest_collection_modifyitems(None, [taking, other])
    assert taking.marks == ["threads", "real_matrix"] and other.marks == ["threads"]

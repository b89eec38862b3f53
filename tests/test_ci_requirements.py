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

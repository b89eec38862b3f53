"""CI's guard for the real-framework tests (tests/conftest.py): with RL_ORACLE_REQUIRE_FRAMEWORKS=1 a
skipped ``framework`` test is a failure, otherwise a skip."""

from types import SimpleNamespace

import pytest

from tests import conftest


def _report_after_hook(monkeypatch, required: bool, marked: bool) -> str:
    monkeypatch.setenv("RL_ORACLE_REQUIRE_FRAMEWORKS", "1" if required else "0")
    report = SimpleNamespace(skipped=True, outcome="skipped", longrepr="trl is not installed")
    marker = object() if marked else None
    item = SimpleNamespace(get_closest_marker=lambda name: marker if name == "framework" else None)
    wrapper = conftest.pytest_runtest_makereport(item, None)
    next(wrapper)
    with pytest.raises(StopIteration):
        wrapper.send(SimpleNamespace(get_result=lambda: report))
    return report.outcome


def test_a_skipped_framework_test_fails_when_frameworks_are_required(monkeypatch):
    assert _report_after_hook(monkeypatch, required=True, marked=True) == "failed"


def test_it_stays_a_skip_locally_and_for_unmarked_tests(monkeypatch):
    assert _report_after_hook(monkeypatch, required=False, marked=True) == "skipped"
    assert _report_after_hook(monkeypatch, required=True, marked=False) == "skipped"


def _node_outcome(monkeypatch, required: bool, marked: bool) -> str:
    """The same guard for the ``node`` marker (the JavaScript consumer) and RL_ORACLE_REQUIRE_NODE."""
    monkeypatch.setenv("RL_ORACLE_REQUIRE_FRAMEWORKS", "0")
    monkeypatch.setenv("RL_ORACLE_REQUIRE_NODE", "1" if required else "0")
    report = SimpleNamespace(skipped=True, outcome="skipped", longrepr="node is not installed")
    marker = object() if marked else None
    item = SimpleNamespace(get_closest_marker=lambda name: marker if name == "node" else None)
    wrapper = conftest.pytest_runtest_makereport(item, None)
    next(wrapper)
    with pytest.raises(StopIteration):
        wrapper.send(SimpleNamespace(get_result=lambda: report))
    return report.outcome


def test_a_skipped_node_test_fails_when_node_is_required(monkeypatch):
    assert _node_outcome(monkeypatch, required=True, marked=True) == "failed"
    assert _node_outcome(monkeypatch, required=False, marked=True) == "skipped"
    assert _node_outcome(monkeypatch, required=True, marked=False) == "skipped"

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

"""Hypothesis profiles (docs/architecture.md): ``ci`` (default) and ``thorough``, chosen by the
environment variable HYPOTHESIS_PROFILE. CI runs derandomised so failures reproduce from the log."""

import functools
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=25,
    derandomize=True,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=500,
    derandomize=False,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", max_examples=10, derandomize=True, print_blob=True, deadline=None
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Tests build float64 tensors explicitly (docs/architecture.md); the global default dtype is left
# alone so LM code is tested as it runs. Few threads keep CI on 2 cores predictable.
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With RL_ORACLE_REQUIRE_FRAMEWORKS=1 (set by .ci/run after ``make frameworks``), a test marked
    ``framework`` that skips (its framework not importable) fails instead: in CI a skip would hide
    that the real TRL / verl / OpenRLHF code never ran."""
    outcome = yield
    report = outcome.get_result()
    required = os.environ.get("RL_ORACLE_REQUIRE_FRAMEWORKS") == "1"
    if required and report.skipped and item.get_closest_marker("framework") is not None:
        report.outcome = "failed"
        report.longrepr = f"framework test skipped although RL_ORACLE_REQUIRE_FRAMEWORKS=1: {report.longrepr}"
    # likewise RL_ORACLE_REQUIRE_NODE=1 (CI): the JavaScript consumer of the golden vectors must run
    if os.environ.get("RL_ORACLE_REQUIRE_NODE") == "1" and report.skipped and item.get_closest_marker("node"):
        report.outcome = "failed"
        report.longrepr = f"node test skipped although RL_ORACLE_REQUIRE_NODE=1: {report.longrepr}"


@pytest.fixture(scope="session")
def real_matrix():
    """``refimpl.conformance.matrix.build_matrix`` of the installed frameworks, built at most once per
    session for each framework selection (about 15 s of CPU with TRL, verl and OpenRLHF installed)."""
    from refimpl.conformance import matrix

    return functools.cache(matrix.build_matrix)

"""Hypothesis profiles (docs/architecture.md): ``ci`` (default) and ``thorough``, chosen by the
environment variable HYPOTHESIS_PROFILE. CI runs derandomised so failures reproduce from the log.
No test depends on whether CUDA is present unless it says so (``_device_is_named``)."""

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


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "auto_device: resolves the trainer's device='auto' (CUDA when present) on purpose"
    )
    config.addinivalue_line(
        "markers", "threads: may compute differently at two intra-op threads (make test-threads runs these)"
    )


# Test modules whose every torch result was found bit for bit the same at one and at two intra-op
# threads (tests/thread_survey.py; docs/ci.md: the method, and why modules computing with numpy are
# not listed). Every other module is marked ``threads`` and runs again in CI's two-thread pass.
THREAD_INSENSITIVE_MODULES = frozenset({
    "test_default_device.py", "test_losses_parts.py", "test_mutation_kills_advantages.py",
    "test_mutation_kills_kl.py", "test_mutation_kills_lossopts.py", "test_mutation_kills_policy.py",
    "test_policy_loss_nonfinite.py", "test_policy_loss_parts.py", "test_policy_loss_specs.py",
    "test_policy_loss_value_kl.py", "test_spec_exactness.py",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name not in THREAD_INSENSITIVE_MODULES:
            item.add_marker("threads")


@pytest.fixture(autouse=True)
def _device_is_named(request, monkeypatch):
    """A test that builds a trainer names its device: ``device="auto"`` picks CUDA where it is present,
    and a test written on a CPU-only machine then mixes devices (or runs other kernels) on a GPU one.
    Resolving "auto" fails the test unless it is marked ``auto_device``."""
    if request.node.get_closest_marker("auto_device") is not None:
        return

    def refuse() -> str:
        pytest.fail("device='auto' resolved in a test: name the device (e.g. device='cpu', --device cpu), "
                    "or mark the test auto_device", pytrace=False)

    monkeypatch.setattr("refimpl.lm.train.auto_device", refuse)

"""Which tests compute differently at two intra-op threads than at one (docs/ci.md).

A pytest plugin: ``python -m pytest -p tests.thread_survey --thread-survey FILE [tests...]`` runs
every test under a ``TorchDispatchMode`` that hashes the bytes of every floating-point tensor each
torch operation returns, and writes ``{test id: digest}`` to FILE (JSON). Run it at
``OMP_NUM_THREADS=1`` and at ``=2`` and compare with ``python -m tests.thread_survey A.json
B.json``: the tests whose digests differ are those whose numerics depend on the thread count
(a reduction split over threads sums in another order). Their modules are listed in
``THREAD_SENSITIVE_MODULES`` (tests/conftest.py marks them ``threads``), and only they run in the
second, two-thread pass of CI.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import defaultdict

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_UNINITIALISED = ("empty", "resize_", "set_")


def _is_view(func) -> bool:
    """A view (select, slice, transpose, ...): it computes nothing, and may show a buffer not yet
    written (an ``empty`` result that a later in-place operation fills)."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


class _Digest(TorchDispatchMode):
    """The SHA-1 of every floating-point result of every operation, in order."""

    def __init__(self):
        super().__init__()
        self.hash = hashlib.sha1()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(word in func.name() for word in _UNINITIALISED) or _is_view(func):
            return out  # memory as it was found, or a view of it: no result of the computation
        for x in tree_leaves(out):
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.device.type == "cpu":
                x = x.detach()
                self.hash.update((x.float() if x.dtype == torch.bfloat16 else x).numpy().tobytes())
        return out


def pytest_addoption(parser):
    parser.addoption("--thread-survey", metavar="FILE", help="write each test's digest of its results")


_digests: dict[str, str] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if not item.config.getoption("--thread-survey"):
        yield
        return
    mode = _Digest()
    with mode:
        yield
    _digests[item.nodeid] = mode.hash.hexdigest()


def pytest_sessionfinish(session):
    path = session.config.getoption("--thread-survey")
    if path:
        with open(path, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "digests": _digests}, f, indent=0)


def differing(a: dict, b: dict) -> dict[str, list[str]]:
    """The tests (by module) whose digests differ between two surveys."""
    out = defaultdict(list)
    for test, digest in a["digests"].items():
        if test in b["digests"] and b["digests"][test] != digest:
            out[test.split("::")[0]].append(test)
    return dict(out)


if __name__ == "__main__":
    first, second = (json.load(open(p)) for p in sys.argv[1:3])
    common = first["digests"].keys() & second["digests"].keys()
    found = differing(first, second)
    print(f"{len(common)} tests in both surveys ({first['threads']} and {second['threads']} threads); "
          f"{sum(map(len, found.values()))} differ, in {len(found)} modules")
    for module, tests in sorted(found.items()):
        print(f"{module}: {len(tests)}")

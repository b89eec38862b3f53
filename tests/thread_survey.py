"""Which tests compute differently at two intra-op threads than at one (docs/ci.md).

A pytest plugin: ``python -m pytest -p tests.thread_survey --thread-survey FILE [tests...]`` runs
every test under a ``TorchDispatchMode`` that hashes the bytes of every floating-point tensor each
torch operation returns, and writes ``{test id: digest}`` to FILE (JSON). Run it at
``OMP_NUM_THREADS=1`` and at ``=2`` and compare with ``python -m tests.thread_survey A.json
B.json``: the tests whose digests differ are those whose numerics depend on the thread count
(a reduction split over threads sums in another order). The modules, and the test functions, whose
every test agrees are listed in tests/conftest.py's ``THREAD_INSENSITIVE_MODULES`` and
``THREAD_INSENSITIVE_TESTS``; every other test is marked ``threads`` and runs again in the second,
two-thread pass of CI.

A test that starts another process (``subprocess``, ``multiprocessing``, ``os.fork``) computes where
the dispatch mode cannot see: its digest is ``UNMEASURED``, which never agrees with anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import defaultdict

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_UNINITIALISED = ("empty", "resize_", "set_")

#: the digest of a test that started another process: its computation there was not seen
UNMEASURED = "unmeasured: started another process"


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
    mode, spawned = _Digest(), []
    popen_init, fork = subprocess.Popen.__init__, os.fork

    def watched_popen(self, *args, **kwargs):
        spawned.append(args[0] if args else kwargs.get("args"))
        return popen_init(self, *args, **kwargs)

    def watched_fork():
        spawned.append("os.fork")
        return fork()

    subprocess.Popen.__init__, os.fork = watched_popen, watched_fork  # multiprocessing uses one of them
    try:
        with mode:
            yield
    finally:
        subprocess.Popen.__init__, os.fork = popen_init, fork
    _digests[item.nodeid] = UNMEASURED if spawned else mode.hash.hexdigest()


def pytest_sessionfinish(session):
    path = session.config.getoption("--thread-survey")
    if path:
        with open(path, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "digests": _digests}, f, indent=0)


def differing(a: dict, b: dict) -> dict[str, list[str]]:
    """The tests (by module) whose digests differ between two surveys (an unmeasured test differs)."""
    out = defaultdict(list)
    for test, digest in a["digests"].items():
        if test in b["digests"] and (b["digests"][test] != digest or digest == UNMEASURED):
            out[test.split("::")[0]].append(test)
    return dict(out)


def function_of(test: str) -> str:
    """``module.py::function`` of a test id (its parameters dropped): the unit of THREAD_INSENSITIVE_TESTS."""
    path, _, name = test.partition("::")
    return f"{path.rsplit('/', 1)[-1]}::{name.split('[', 1)[0]}"


def insensitive(a: dict, b: dict) -> tuple[list[str], list[str]]:
    """(modules, functions) that agree in both surveys: the modules every test of which agrees, and
    within the other modules, the functions every parametrisation of which agrees."""
    common = a["digests"].keys() & b["digests"].keys()
    found = differing(a, b)
    bad_functions = {function_of(t) for tests in found.values() for t in tests}
    modules = sorted({t.split("::")[0].rsplit("/", 1)[-1] for t in common if t.split("::")[0] not in found})
    functions = sorted({function_of(t) for t in common if t.split("::")[0] in found} - bad_functions)
    return modules, functions


if __name__ == "__main__":
    first, second = (json.load(open(p)) for p in sys.argv[1:3])
    common = first["digests"].keys() & second["digests"].keys()
    found = differing(first, second)
    print(f"{len(common)} tests in both surveys ({first['threads']} and {second['threads']} threads); "
          f"{sum(map(len, found.values()))} differ, in {len(found)} modules")
    for module, tests in sorted(found.items()):
        print(f"{module}: {len(tests)}")
    modules, functions = insensitive(first, second)
    print("modules whose every test agrees (THREAD_INSENSITIVE_MODULES):", *modules, sep="\n  ")
    print("functions that agree in the other modules (THREAD_INSENSITIVE_TESTS):", *functions, sep="\n  ")

"""The two-thread CI pass's selection (tests/conftest.py, tests/thread_survey.py, docs/ci.md)."""

import ast
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests import thread_survey
from tests.conftest import THREAD_INSENSITIVE_MODULES, THREAD_INSENSITIVE_TESTS, pytest_collection_modifyitems
from tests.thread_survey import UNMEASURED, _Digest, differing, function_of, insensitive


def _digest(fn) -> str:
    mode = _Digest()
    with mode:
        fn()
    return mode.hash.hexdigest()


def test_the_listed_modules_exist():
    assert all((Path(__file__).parent / name).is_file() for name in THREAD_INSENSITIVE_MODULES)


def test_the_listed_functions_exist_in_modules_not_listed_whole():
    for entry in THREAD_INSENSITIVE_TESTS:
        module, function = entry.split("::")
        assert module not in THREAD_INSENSITIVE_MODULES, entry
        tree = ast.parse((Path(__file__).parent / module).read_text())
        assert function in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, entry


class _Item(SimpleNamespace):
    def __init__(self, module, name, framework=False):
        super().__init__(path=Path("tests") / module, originalname=name, markers=[], framework=framework)

    def get_closest_marker(self, name):
        return object() if name == "framework" and self.framework else None

    def add_marker(self, name):
        self.markers.append(name)


def test_the_two_thread_pass_takes_every_unlisted_test_and_every_framework_test():
    listed_module = sorted(THREAD_INSENSITIVE_MODULES)[0]
    listed_function = sorted(THREAD_INSENSITIVE_TESTS)[0].split("::")
    items = [_Item(listed_module, "test_x"), _Item(*listed_function), _Item(listed_function[0], "test_other"),
             _Item("test_new_module.py", "test_x"), _Item(listed_module, "test_f", framework=True)]
    pytest_collection_modifyitems(None, items)
    assert [i.markers for i in items] == [[], [], ["threads"], ["threads"], ["threads"]]


def test_the_digest_sees_a_reduction_order_and_ignores_what_computes_nothing():
    x = torch.tensor([1.0, 2.0**-24, 2.0**-24], dtype=torch.float32)
    forward, backward = _digest(lambda: x.cumsum(0)), _digest(lambda: x.flip(0).cumsum(0).flip(0))
    assert forward != backward  # 1 + u + u rounds to 1, u + u + 1 does not
    assert _digest(lambda: x.cumsum(0)) == forward
    # an uninitialised buffer and a view of it are not results
    assert _digest(lambda: torch.empty(1000)[3:]) == _digest(lambda: None)


def test_differing_lists_the_tests_whose_digests_differ():
    one = {"threads": 1, "digests": {"tests/a.py::t1": "x", "tests/a.py::t2": "y", "tests/b.py::t": "z"}}
    two = {"threads": 2, "digests": {"tests/a.py::t1": "x", "tests/a.py::t2": "w", "tests/c.py::t": "z"}}
    assert differing(one, two) == {"tests/a.py": ["tests/a.py::t2"]}


def test_a_function_agrees_only_when_every_parametrisation_agrees():
    base = {"tests/a.py::f[1]": "x", "tests/a.py::f[2]": "y", "tests/a.py::h": "u", "tests/b.py::t": "v"}
    one = {"threads": 1, "digests": {**base, "tests/a.py::g[1]": "z"}}
    two = {"threads": 2, "digests": {**base, "tests/a.py::g[1]": "w"}}
    assert function_of("tests/a.py::f[1-x]") == "a.py::f"
    assert insensitive(one, two) == (["b.py"], ["a.py::f", "a.py::h"])


def test_a_test_that_starts_a_process_is_unmeasured_and_never_agrees():
    """The dispatch mode sees this process only: a child's torch work (a CLI run, a DDP rank) is not
    hashed, so such a test is ``UNMEASURED`` and stays in the two-thread pass."""
    config = SimpleNamespace(getoption=lambda name: "x.json")
    item = SimpleNamespace(config=config, nodeid="tests/a.py::t")
    hook = thread_survey.pytest_runtest_call(item)
    next(hook)
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    with pytest.raises(StopIteration):
        next(hook)
    assert thread_survey._digests.pop("tests/a.py::t") == UNMEASURED
    same = {"threads": 1, "digests": {"tests/a.py::t": UNMEASURED}}
    assert differing(same, {**same, "threads": 2}) == {"tests/a.py": ["tests/a.py::t"]}
    # and one that starts none is measured
    hook = thread_survey.pytest_runtest_call(item)
    next(hook)
    torch.ones(3).sum()
    with pytest.raises(StopIteration):
        next(hook)
    assert thread_survey._digests.pop("tests/a.py::t") not in (UNMEASURED, _digest(lambda: None))

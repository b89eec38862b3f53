"""The two-thread CI pass's selection (tests/conftest.py, tests/thread_survey.py, docs/ci.md)."""

from pathlib import Path

import torch

from tests.conftest import THREAD_INSENSITIVE_MODULES
from tests.thread_survey import _Digest, differing


def _digest(fn) -> str:
    mode = _Digest()
    with mode:
        fn()
    return mode.hash.hexdigest()


def test_the_listed_modules_exist():
    assert all((Path(__file__).parent / name).is_file() for name in THREAD_INSENSITIVE_MODULES)


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

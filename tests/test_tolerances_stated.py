"""Every float comparison in the suite states its absolute tolerance (issue 11; docs/architecture.md
"Exactness"). ``pytest.approx(x, rel=R)`` still allows pytest's default absolute 1e-12, and
``torch.allclose`` / ``torch.isclose`` / ``np.allclose`` / ``np.isclose`` / ``Tensor.allclose`` allow an
absolute 1e-8 unless told otherwise; ``torch.testing.assert_close`` without tolerances uses the
dtype's defaults (float64: 1e-7). A value near 0 then passes whatever it is (a negative KL of
-4.3e-17 passed ``approx(2.7e-17, rel=8 * eps)``). So every such call must pass ``abs=`` (approx) or
``atol=`` (the others) as a keyword, not ``None``; the stated value must follow from the dtype's unit
roundoff and the magnitudes involved, said in a comment, or be 0.

Checked on the syntax tree of every ``tests/*.py``: names are resolved through the module's imports
(``from pytest import approx as ap``, ``import numpy as np``), so a test helper that happens to be
called ``approx`` or ``assert_close`` is not mistaken for pytest's or torch's (its own library calls
are checked where it is defined). A call that cannot be checked fails too: ``**kwargs`` without the
keyword, a positional tolerance, a checked function passed around as a value (``f = torch.allclose``),
or an ``approx`` / ``assert_close`` whose owner cannot be resolved. ``math.isclose`` (abs_tol 0)
and ``np.testing.assert_allclose`` (atol 0) default to no absolute slack and are not required to
state one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# qualified name -> the keyword that carries its absolute tolerance
NEEDS_ABSOLUTE = {
    "pytest.approx": "abs",
    "torch.allclose": "atol",
    "torch.isclose": "atol",
    "torch.Tensor.allclose": "atol",
    "torch.Tensor.isclose": "atol",
    "torch.testing.assert_close": "atol",
    "torch.testing.assert_allclose": "atol",
    "numpy.allclose": "atol",
    "numpy.isclose": "atol",
    "numpy.ma.allclose": "atol",
}
# no absolute slack by default: nothing to state
ZERO_ABSOLUTE_BY_DEFAULT = {"math.isclose", "cmath.isclose", "numpy.testing.assert_allclose"}
# a call whose last name is one of these is either resolved to a known function above, to a helper
# defined in the tests, or reported as unresolvable
WATCHED_NAMES = {"approx", "allclose", "isclose", "assert_close", "assert_allclose"}
LOCAL = "<local>"


def _import_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> qualified name for every import in the module (at any depth)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom):
            module = ("." * node.level) + (node.module or "")
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
    return aliases


def _local_definitions(tree: ast.Module) -> set[str]:
    """Names bound by def / class / assignment anywhere in the module."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _qualified(node: ast.AST, aliases: dict[str, str], local: set[str]) -> str | None:
    """Dotted qualified name of a Name / Attribute chain; None for anything else (a call's result,
    a subscript). An unimported name keeps its own spelling (a variable: ``t.allclose`` -> "t.allclose")."""
    if isinstance(node, ast.Name):
        if node.id in aliases:
            return aliases[node.id]
        return f"{LOCAL}.{node.id}" if node.id in local else node.id
    if isinstance(node, ast.Attribute):
        owner = _qualified(node.value, aliases, local)
        return None if owner is None else f"{owner}.{node.attr}"
    return None


def _is_test_helper(qualified: str) -> bool:
    return qualified.startswith((f"{LOCAL}.", "tests.", "."))


def _needed_keyword(qualified: str | None, last: str) -> str | None:
    """The absolute-tolerance keyword the call must pass; None when it needs none.
    Raises LookupError when the callee cannot be resolved."""
    if qualified in ZERO_ABSOLUTE_BY_DEFAULT:
        return None
    if qualified in NEEDS_ABSOLUTE:
        return NEEDS_ABSOLUTE[qualified]
    if qualified is not None and _is_test_helper(qualified):
        return None
    if last in {"allclose", "isclose"}:
        return "atol"  # a method on a tensor (Tensor.allclose / isclose: atol 1e-8 by default)
    raise LookupError(last)


def tolerance_problems(source: str, filename: str) -> list[str]:
    """One line "file:line: problem" per comparison that does not state its absolute tolerance."""
    tree = ast.parse(source, filename=filename)
    aliases = _import_aliases(tree)
    local = _local_definitions(tree) - set(aliases)
    problems = []
    callees = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callees.add(id(node.func))
        last = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        qualified = _qualified(node.func, aliases, local)
        if last not in WATCHED_NAMES and qualified not in NEEDS_ABSOLUTE:
            continue
        where = f"{filename}:{node.lineno}"
        try:
            keyword = _needed_keyword(qualified, last)
        except LookupError:
            problems.append(f"{where}: cannot resolve {ast.unparse(node.func)}(...) to a known function")
            continue
        if keyword is None:
            continue
        name = qualified or ast.unparse(node.func)
        given = {k.arg: k.value for k in node.keywords}
        if keyword in given:
            value = given[keyword]
            if isinstance(value, ast.Constant) and value.value is None:
                problems.append(f"{where}: {name}(..., {keyword}=None) is the default absolute tolerance")
        elif None in given:
            problems.append(f"{where}: {name}(..., **...) without {keyword}=: cannot check the tolerance")
        else:
            problems.append(f"{where}: {name}(...) without an explicit {keyword}= keyword")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            if id(node) in callees:
                continue
            qualified = _qualified(node, aliases, local)
            if qualified in NEEDS_ABSOLUTE:
                problems.append(
                    f"{filename}:{node.lineno}: {qualified} used as a value: cannot check its tolerance"
                )
    return problems


def test_every_comparison_states_its_absolute_tolerance():
    problems = []
    files = sorted(TESTS.glob("*.py"))
    assert len(files) > 50, files  # the glob found the suite
    for path in files:
        problems += tolerance_problems(path.read_text(), str(path.relative_to(ROOT)))
    assert not problems, "comparisons without a stated absolute tolerance:\n" + "\n".join(problems)


# ------------------------------------------------------------------ the checker itself (planted)
PLANTED_BAD = [
    ("import pytest\nassert x == pytest.approx(1.0, rel=1e-15)\n", "without an explicit abs="),
    ("from pytest import approx\nassert x == approx(1.0)\n", "pytest.approx(...) without"),
    ("from pytest import approx as ap\nassert x == ap(1.0, rel=1e-3)\n", "pytest.approx(...) without"),
    ("import pytest\nassert x == pytest.approx(1.0, abs=None)\n", "abs=None"),
    ("import pytest\nassert x == pytest.approx(1.0, 1e-3, 0.0)\n", "without an explicit abs="),
    ("import pytest\nkw = {}\nassert x == pytest.approx(1.0, **kw)\n", "cannot check"),
    ("import torch\nassert torch.allclose(a, b)\n", "torch.allclose(...) without an explicit atol="),
    ("import torch\nassert torch.isclose(a, b, rtol=0.0).all()\n", "torch.isclose(...) without"),
    ("import torch\nassert t.allclose(u)\n", "t.allclose(...) without"),
    ("import torch\nassert torch.zeros(2).allclose(u)\n", ".allclose(...) without an explicit atol="),
    ("import numpy as np\nassert np.allclose(a, b, rtol=1e-15)\n", "numpy.allclose(...) without"),
    ("import numpy\nassert numpy.isclose(a, b).all()\n", "numpy.isclose(...) without"),
    ("import torch\ntorch.testing.assert_close(a, b)\n", "torch.testing.assert_close(...) without"),
    ("from torch.testing import assert_close\nassert_close(a, b)\n", "torch.testing.assert_close(...)"),
    ("import torch\ncheck = torch.allclose\n", "used as a value"),
    ("import functools, pytest\nf = functools.partial(pytest.approx, rel=0.1)\n", "used as a value"),
    ("assert x == helper.approx(1.0)\n", "cannot resolve"),
]


@pytest.mark.parametrize("source, message", PLANTED_BAD)
def test_checker_flags_a_comparison_without_absolute_tolerance(source, message):
    problems = tolerance_problems(source, "planted.py")
    assert len(problems) == 1, problems
    assert problems[0].startswith("planted.py:")
    assert message in problems[0], problems


PLANTED_GOOD = [
    "import pytest\nassert x == pytest.approx(1.0, rel=1e-15, abs=0.0)\n",
    "from pytest import approx\nassert x == approx(1.0, abs=1e-3)\n",
    "import pytest\nkw = {}\nassert x == pytest.approx(1.0, abs=0.0, **kw)\n",
    "import torch\nassert torch.allclose(a, b, rtol=1e-15, atol=0.0)\n",
    "import torch\nassert t.isclose(u, atol=0.0).all()\n",
    "import numpy as np\nassert np.isclose(a, b, atol=0.0).all()\n",
    "import torch\ntorch.testing.assert_close(a, b, rtol=0.0, atol=0.0)\n",
    "import math\nassert math.isclose(a, b, rel_tol=1e-15)\n",
    "import numpy as np\nnp.testing.assert_allclose(a, b, rtol=1e-15)\n",
    # a test helper named like a library function is checked where it is defined
    "import pytest\ndef approx(e, s):\n    return pytest.approx(e, abs=s)\nassert x == approx(1.0, 2.0)\n",
    "from tests.test_policy_loss_reference import assert_close\nassert_close(a, b, 1.0, 'x')\n",
]


@pytest.mark.parametrize("source", PLANTED_GOOD)
def test_checker_accepts_a_stated_absolute_tolerance(source):
    assert tolerance_problems(source, "planted.py") == []

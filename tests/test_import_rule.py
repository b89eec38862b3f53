"""The import rule of docs/architecture.md (contract): refimpl imports neither tabular nor specs;
tabular and specs import neither refimpl nor each other. Checked on the syntax tree, so that
``import x``, ``from x import y`` and ``from x.sub import y`` at any depth are all caught."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "refimpl": {"tabular", "specs"},
    "tabular": {"refimpl", "specs"},
    "specs": {"refimpl", "tabular"},
}


def imported_top_level_names(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in {
            "import_module",
            "__import__",
        }:
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                names.add(node.args[0].value.split(".")[0])
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_does_not_import_forbidden_layers(layer):
    offenders = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        bad = imported_top_level_names(path.read_text()) & FORBIDDEN[layer]
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, "\n".join(offenders)


def test_checker_detects_each_import_form():
    for src in ("import tabular", "import tabular.mdp as m", "from tabular import MDP",
                "from tabular.mdp import MDP", "def f():\n    import specs.kl",
                "importlib.import_module('tabular.report')"):
        assert imported_top_level_names(src) & {"tabular", "specs"}, src
    assert not imported_top_level_names("from . import tabular\nimport torch") & {"tabular", "specs"}

"""The committed equivalent-mutant listings (mutation/equivalent/*.txt) parse, name a configured
module and a function that exists in it, and give a reason; and the scoring rule of
tools/mutation.py (docs/mutation.md) counts as documented. Runs without mutmut."""

import ast
from pathlib import Path

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
LISTINGS = sorted((ROOT / "mutation" / "equivalent").glob("*.txt"))


def load_driver():
    return load_script("tools/mutation.py", "mutation_driver", register=True)


driver = load_driver()
MODULE_PATHS = {driver.module_name(p): p for p in driver.MODULES}


def mangled_functions(path: Path) -> set[str]:
    """mutmut's mangled names of the top-level functions (x_f) and methods (xǁClassǁm) of a file."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(f"x_{node.name}")
        elif isinstance(node, ast.ClassDef):
            names |= {f"xǁ{node.name}ǁ{m.name}" for m in node.body
                      if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


@pytest.mark.parametrize("listing", LISTINGS, ids=[p.name for p in LISTINGS])
def test_listing_names_existing_mutants_with_reasons(listing):
    module = listing.name[: -len(".txt")]
    assert module in MODULE_PATHS, f"{listing.name}: not a module of tools/mutation.py MODULES"
    functions = mangled_functions(ROOT / MODULE_PATHS[module])
    entries = driver.read_equivalent(listing, module)
    assert entries, f"{listing.name} lists nothing"
    for name, reason in entries.items():
        function = name[len(module) + 1:].partition("__mutmut_")[0]
        assert function in functions, f"{name}: no function {function} in {MODULE_PATHS[module]}"
        assert int(name.rpartition("__mutmut_")[2]) >= 1
        assert len(reason) >= 10, f"{name}: give the reason it is equivalent"


def test_read_equivalent_rejects_lines_without_a_reason(tmp_path):
    f = tmp_path / "refimpl.kl.txt"
    f.write_text("# comment\n\nx_kl_k1__mutmut_3: None is falsy\n")
    assert driver.read_equivalent(f, "refimpl.kl") == {"refimpl.kl.x_kl_k1__mutmut_3": "None is falsy"}
    for bad in ("x_kl_k1__mutmut_3\n", "x_kl_k1__mutmut_3:   \n", "kl_k1: no mutant number\n"):
        f.write_text(bad)
        with pytest.raises(ValueError, match=r"refimpl.kl.txt:1: expected '<mutant name>: <reason>'"):
            driver.read_equivalent(f, "refimpl.kl")


def test_scoring_rule():
    statuses = {"m.x_f__mutmut_1": "killed", "m.x_f__mutmut_2": "timeout", "m.x_f__mutmut_3": "survived",
                "m.x_f__mutmut_4": "no tests", "m.x_f__mutmut_5": "killed"}
    result = driver.ModuleResult("m", 1, statuses, {"m.x_f__mutmut_3": "why"})
    assert result.killed == 3 and result.timeouts == 1
    assert result.unlisted_survivors == ["m.x_f__mutmut_4"]  # a mutant no test reaches is not killed
    assert result.score == 3 / 4
    assert result.listed_but_killed == []
    assert driver.report(result, 0.95)  # below 95 % and an unlisted survivor: problems
    listed = driver.ModuleResult("m", 1, statuses, {"m.x_f__mutmut_3": "a", "m.x_f__mutmut_4": "b",
                                                    "m.x_f__mutmut_5": "wrong"})
    assert listed.unlisted_survivors == [] and listed.listed_but_killed == ["m.x_f__mutmut_5"]
    problems = driver.report(listed, 0.95)
    assert len(problems) == 1 and "listed as equivalent but killed" in problems[0]
    clean = driver.ModuleResult("m", 1, statuses, {"m.x_f__mutmut_3": "a", "m.x_f__mutmut_4": "b"})
    assert clean.score == 1.0 and driver.report(clean, 0.95) == []

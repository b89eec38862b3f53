"""Mutation testing of the oracle's modules with mutmut 3.8.1 (`make mutation`; ISSUE 11).

Every listed module is mutated on its own, against the test files that check it (MODULES), with
the hypothesis ``ci`` profile. For each module it prints

    killed / total  (score %)  [equivalent listed, survivors unlisted]

where ``total`` excludes the mutants listed as equivalent in ``mutation/equivalent/<module>.txt``
(one line per mutant, ``<mutant name>: <reason>``, ``#`` starts a comment; the mutant name is
mutmut's, e.g. ``refimpl.kl.x_kl_k3__mutmut_12``; the module prefix may be left out). The run
fails (exit status 1) when a module scores below MUTATION_MIN_SCORE (default 95 %), when a
surviving mutant is neither killed nor listed, or when a listed mutant was killed (a stale or
wrong listing: mutmut numbers mutants per function, so editing a function renumbers them).
A changed argument name in an error message is never equivalent: errors name the argument and
tests check it with ``match=``.

Killed means a test failed (or the mutant ran past mutmut's CPU-time limit: an infinite loop,
which a real run would also expose; the count of such timeouts is printed). A mutant no test
reaches ("no tests") counts as a survivor.

Sampling: MUTATION_SAMPLE=K (or --sample K) runs only mutants 1, 1+K, 1+2K, ... of every
function; the output says so on every line. K=1 (the default) runs all of them.

Environment: OMP_NUM_THREADS=1 is forced (mutmut forks workers from a process that already ran
torch; with several OpenMP threads the forked workers hang and survivors show up as timeouts).
Each module runs in its own scratch copy ``.mutation/<module>/`` (git-ignored); ``mutants/`` is
created there before it is put on PYTHONPATH (a path that does not exist when the interpreter
starts is cached as having no modules). MUTATION_JOBS=N (default 1) worker processes.

Runtime and scores: docs/mutation.md ("Runtime and scores") has the table of the last full pass
(per module: sample, mutants, killed, equivalent, timeouts, score, wall time, load average). With one
worker on the shared 2-core development machine a mutant costs about 0.3-2 s, so a module takes 1-9
minutes with MUTATION_SAMPLE=4 and up to an estimated half hour in full (refimpl/losses/policy.py,
1,150 mutants, 4 times its MUTATION_SAMPLE=4 time); the whole list in full about an hour.

Usage:
    python tools/mutation.py                       # every module
    python tools/mutation.py refimpl/kl.py          # some modules
    python tools/mutation.py --sample 3 tabular/exact.py
    python tools/mutation.py --only 'refimpl.kl.x_kl_k3__*' refimpl/kl.py   # a partial run
    python tools/mutation.py --show refimpl/kl.py   # list the mutants and their changed lines
    python tools/mutation.py --tests 'tests/test_conformance_judge*.py' refimpl/conformance/tolerance.py
                                                    # a narrower test selection (a lower bound on the score)
    python tools/mutation.py --selftest             # planted mutants: a toy project and kl_k1
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("refimpl", "tabular", "specs", "benchmarks")  # benchmarks: tests import their measuring code
# Tests written to kill mutants (any topic) run for every module: mutmut only runs, for a mutant,
# the tests that called the mutated function, so extra files cost only the stats collection.
KILL_TESTS = "tests/test_mutation_kills_*.py"
# The contract test that results follow the inputs' device, not torch's default device; it calls every
# public function of the refimpl modules below.
DEFAULT_DEVICE = "tests/test_default_device.py"
# The conformance kit's fast tests (the real-framework tests are not needed to kill its mutants).
KIT_TESTS = ["tests/test_conformance_judge*.py", "tests/test_conformance.py",
             "tests/test_conformance_classes.py", "tests/test_conformance_diagnosis.py",
             "tests/test_conformance_zoo.py", "tests/test_checks.py", "tests/test_conformance_kinks.py",
             "tests/test_conformance_named_behaviours.py"]
# module path -> globs of the test files that check it. mutmut runs, for each mutant, every selected
# test that called the mutated function (until the first failure), so a widely used function (e.g.
# tabular.policy_evaluation) costs the whole selection per survivor: keep each selection to the files
# that test the module itself.
MODULES: dict[str, list[str]] = {
    "refimpl/losses/dpo.py": ["tests/test_dpo.py", "tests/test_losses_parts.py", DEFAULT_DEVICE],
    "refimpl/losses/kl_control.py": ["tests/test_policy_loss_value_kl.py", "tests/test_losses_parts.py",
                                     DEFAULT_DEVICE],
    "refimpl/losses/logprobs.py": ["tests/test_logprobs.py", "tests/test_losses_parts.py", DEFAULT_DEVICE],
    "refimpl/losses/lm_head.py": ["tests/test_lm_head.py", "tests/test_logprobs_chunks.py", DEFAULT_DEVICE],
    "refimpl/losses/policy.py": ["tests/test_policy_loss*.py", "tests/test_losses_parts.py", DEFAULT_DEVICE],
    "refimpl/losses/value.py": ["tests/test_policy_loss_value_kl.py", "tests/test_losses_parts.py",
                                DEFAULT_DEVICE],
    "refimpl/advantages.py": ["tests/test_advantages.py", "tests/test_group_expectations.py", DEFAULT_DEVICE],
    "refimpl/kl.py": ["tests/test_kl.py", DEFAULT_DEVICE],
    "refimpl/estimators.py": ["tests/test_estimators*.py", DEFAULT_DEVICE],
    "refimpl/trust_region.py": ["tests/test_trust_region*.py", DEFAULT_DEVICE],
    "tabular/mdp.py": ["tests/test_tabular_validation.py", "tests/test_tabular_evaluation.py"],
    "tabular/evaluation.py": ["tests/test_tabular_evaluation.py", "tests/test_tabular_validation.py"],
    "tabular/control.py": ["tests/test_tabular_control.py"],
    "tabular/improvement.py": ["tests/test_tabular_improvement.py"],
    "tabular/gradients.py": ["tests/test_tabular_gradients.py"],
    "tabular/exact.py": ["tests/test_tabular_evaluation.py", "tests/test_tabular_examples.py",
                         "tests/test_tabular_validation.py"],
    # the conformance kit's judge and check loop: the fast conformance tests (no framework needed)
    **{f"refimpl/conformance/{name}.py": KIT_TESTS
       for name in ("expected", "evaluated_ratio", "tolerance", "engine", "diagnosis", "policy_cases",
                    "report")},
}
# mutmut's exit codes that mean the mutant was detected; everything else is a survivor.
KILLED_STATUSES = {"killed", "timeout", "segfault", "suspicious"}


def module_name(path: str) -> str:
    """'refimpl/losses/policy.py' -> 'refimpl.losses.policy' (mutmut's prefix of mutant names)."""
    return path[: -len(".py")].replace("/", ".")


@dataclass
class ModuleResult:
    """Outcome of one module's run."""

    module: str
    sample: int
    statuses: dict[str, str]  # mutant name -> mutmut status
    equivalent: dict[str, str]  # listed mutant name -> reason
    diffs: dict[str, str] = field(default_factory=dict)  # unlisted survivor -> diff

    @property
    def counted(self) -> dict[str, str]:
        return {k: v for k, v in self.statuses.items() if k not in self.equivalent}

    @property
    def killed(self) -> int:
        return sum(s in KILLED_STATUSES for s in self.counted.values())

    @property
    def timeouts(self) -> int:
        return sum(s == "timeout" for s in self.counted.values())

    @property
    def unlisted_survivors(self) -> list[str]:
        return sorted(k for k, s in self.counted.items() if s not in KILLED_STATUSES)

    @property
    def listed_but_killed(self) -> list[str]:
        return sorted(k for k in self.equivalent if self.statuses.get(k) in KILLED_STATUSES)

    @property
    def listed_run(self) -> int:
        return sum(k in self.statuses for k in self.equivalent)

    @property
    def score(self) -> float:
        total = len(self.counted)
        return 1.0 if total == 0 else self.killed / total


def read_equivalent(path: Path, module: str) -> dict[str, str]:
    """Parse ``<mutant name>: <reason>`` lines; a reason is required (ValueError otherwise)."""
    listed: dict[str, str] = {}
    if not path.exists():
        return listed
    for lineno, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, reason = line.partition(":")
        name, reason = name.strip(), reason.strip()
        if not sep or not reason or "__mutmut_" not in name:
            raise ValueError(f"{path}:{lineno}: expected '<mutant name>: <reason>', got {raw!r}")
        if not name.startswith(module + "."):
            name = f"{module}.{name}"
        listed[name] = reason
    return listed


def sampled_mutant_names(rel_path: str, sample: int) -> list[str]:
    """Mutants 1, 1+K, 1+2K, ... of every function of ``rel_path`` (cwd: a mutmut project)."""
    from mutmut.configuration import reset_config
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name, mangled_name_from_mutant_name

    reset_config()
    mutated = mutate_file_contents(rel_path, Path(rel_path).read_text())
    by_function: dict[str, list[str]] = defaultdict(list)
    for name in mutated.mutant_names:
        full = get_mutant_name(Path(rel_path), name)
        by_function[mangled_name_from_mutant_name(full)].append(full)
    chosen = []
    for names in by_function.values():
        names.sort(key=lambda n: int(n.rpartition("__mutmut_")[2]))
        chosen.extend(names[::sample])
    return chosen


def mutmut_config(rel_path: str, tests: list[str], packages: tuple[str, ...]) -> str:
    """The [tool.mutmut] table for one module (TOML)."""
    def toml_list(items):
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    return textwrap.dedent(f"""
        [tool.mutmut]
        source_paths = {toml_list(packages)}
        only_mutate = {toml_list([rel_path])}
        pytest_add_cli_args_test_selection = {toml_list(tests)}
        pytest_add_cli_args = ["-p", "no:cacheprovider"]
        use_git_change_detection = false
        timeout_multiplier = 5.0
        """)


# Appended to the scratch copy's tests/conftest.py: the ``ci`` profile (same examples, derandomised)
# without the shrink phase and the example database. A failing example already kills the mutant;
# shrinking it costs up to minutes per mutant, and a database would replay one mutant's failures on
# the next.
MUTATION_PROFILE = """

# --- appended by tools/mutation.py (scratch copy only) ---
from hypothesis import Phase as _Phase  # noqa: E402

settings.register_profile("mutation", parent=settings.get_profile("ci"), database=None,
                          phases=[_Phase.explicit, _Phase.reuse, _Phase.generate])
settings.load_profile("mutation")
"""


def prepare_workdir(root: Path, workdir: Path, rel_path: str, tests: list[str],
                    packages: tuple[str, ...]) -> None:
    """A fresh copy of the packages, tests/ and pyproject.toml with the module's mutmut config."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for name in (*packages, "tests"):
        shutil.copytree(root / name, workdir / name, ignore=ignore)
    conftest = workdir / "tests" / "conftest.py"
    if conftest.exists():
        conftest.write_text(conftest.read_text() + MUTATION_PROFILE)
    pyproject = (root / "pyproject.toml").read_text() if (root / "pyproject.toml").exists() else ""
    (workdir / "pyproject.toml").write_text(pyproject + mutmut_config(rel_path, tests, packages))
    # Trap: a PYTHONPATH entry that does not exist yet is cached as empty by the interpreter.
    (workdir / "mutants").mkdir()


def run_mutmut(workdir: Path, names: list[str], jobs: int, log) -> int:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
        HYPOTHESIS_PROFILE="ci", PYTHONPATH=str(workdir / "mutants"), PY_IGNORE_IMPORTMISMATCH="1",
    )
    # The console script's way of starting mutmut (``python -m mutmut`` re-executes __main__).
    cmd = [sys.executable, "-c", "import sys; from mutmut.__main__ import cli; sys.exit(cli())",
           "run", "--max-children", str(jobs), *names]
    proc = subprocess.run(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc.returncode


def collect_results(workdir: Path, rel_path: str, names: list[str] | None) -> dict[str, str]:
    from mutmut.stats import status_by_exit_code

    meta = json.loads((workdir / "mutants" / (rel_path + ".meta")).read_text())
    codes = meta["exit_code_by_key"]
    wanted = codes.keys() if names is None else names
    return {name: status_by_exit_code[codes.get(name)] for name in wanted}


def mutant_diff(workdir: Path, rel_path: str, name: str) -> str:
    from mutmut.configuration import reset_config
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    old = os.getcwd()
    os.chdir(workdir)
    try:
        reset_config()
        return get_diff_for_mutant(name, path=rel_path)
    except Exception as exc:  # a diff is a convenience; never fail the run over it
        return f"(no diff: {exc})"
    finally:
        os.chdir(old)


def run_module(root: Path, rel_path: str, test_globs: list[str], *, sample: int, jobs: int,
               scratch: Path, equivalent_dir: Path, packages: tuple[str, ...] = PACKAGES,
               only: list[str] | None = None) -> ModuleResult:
    """Mutate one module and classify every mutant it ran (``only``: mutant-name globs)."""
    module = module_name(rel_path)
    tests = sorted({p for g in test_globs for p in glob.glob(g, root_dir=root)})
    workdir = scratch / module
    prepare_workdir(root, workdir, rel_path, tests, packages)
    old = os.getcwd()
    os.chdir(workdir)
    try:
        names = sampled_mutant_names(rel_path, max(sample, 1)) if sample > 1 or only else None
        if only:
            names = [n for n in names if any(fnmatch.fnmatch(n, g) for g in only)]
    finally:
        os.chdir(old)
    equivalent = read_equivalent(equivalent_dir / f"{module}.txt", module)
    if names == []:
        return ModuleResult(module, sample, {}, equivalent)
    with open(workdir / "mutmut.log", "w") as log:
        rc = run_mutmut(workdir, names or [], jobs, log)
    meta = workdir / "mutants" / (rel_path + ".meta")
    if not meta.exists():
        tail = (workdir / "mutmut.log").read_text()[-3000:]
        raise RuntimeError(f"mutmut failed on {rel_path} (exit {rc}), log tail:\n{tail}")
    result = ModuleResult(module, sample, collect_results(workdir, rel_path, names), equivalent)
    for name in result.unlisted_survivors:
        result.diffs[name] = mutant_diff(workdir, rel_path, name)
    (workdir / "survivors.txt").write_text(
        "\n\n".join(f"{n}: {result.statuses[n]}\n{d}" for n, d in result.diffs.items()) + "\n")
    return result


def report(result: ModuleResult, min_score: float) -> list[str]:
    """Print one module's line and its problems; return the problems."""
    sampled = f", every {result.sample}th mutant per function" if result.sample > 1 else ""
    total = len(result.counted)
    print(f"{result.module:32s} {result.killed:4d} / {total:4d} killed ({100 * result.score:5.1f} %)"
          f"  [{result.listed_run} equivalent listed, {result.timeouts} timeouts,"
          f" {len(result.unlisted_survivors)} unlisted survivors{sampled}]", flush=True)
    problems = []
    if result.score < min_score:
        problems.append(f"{result.module}: score {100 * result.score:.1f} % < {100 * min_score:.0f} %")
    for name in result.unlisted_survivors:
        problems.append(f"{name}: {result.statuses[name]}, not listed\n{result.diffs.get(name, '')}")
    for name in result.listed_but_killed:
        problems.append(f"{name}: listed as equivalent but killed (stale listing?)")
    return problems


def run_all(root: Path, modules: list[str], *, sample: int, jobs: int, min_score: float,
            module_tests: dict[str, list[str]] | None = None, packages: tuple[str, ...] = PACKAGES,
            quiet_problems: bool = False, only: list[str] | None = None,
            tests: list[str] | None = None) -> tuple[int, list[ModuleResult]]:
    """Run each module; ``tests`` (globs) replaces every module's selection (MODULES and KILL_TESTS)."""
    module_tests = module_tests or MODULES
    scratch = root / ".mutation"
    results, problems = [], []
    for rel_path in modules:
        globs = tests or [*module_tests[rel_path], KILL_TESTS]
        result = run_module(root, rel_path, globs, sample=sample, jobs=jobs, scratch=scratch,
                            equivalent_dir=root / "mutation" / "equivalent", packages=packages,
                            only=only)
        results.append(result)
        problems += report(result, min_score)
    if problems and not quiet_problems:
        print("\nFAILED:")
        for p in problems:
            print("  " + p.replace("\n", "\n    "))
    return (1 if problems else 0), results


SELFTEST_MODULE = '''
def add(a, b):
    return a + b


def clamp_below(x, lo):
    if x < lo:
        return lo
    return x
'''
SELFTEST_TESTS = '''
from toy.arith import add, clamp_below


def test_add():
    assert add(2, 3) == 5


def test_clamp_below_far_from_the_boundary():
    assert clamp_below(-5, 0) == 0
    assert clamp_below(5, 0) == 5
'''


def selftest() -> int:
    """A toy project: its planted mutants of ``add`` are killed, the boundary mutant of
    ``clamp_below`` (x <= lo) survives and fails the run until it is listed."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "toy").mkdir()
        (root / "toy" / "__init__.py").write_text("")
        (root / "toy" / "arith.py").write_text(SELFTEST_MODULE)
        (root / "tests").mkdir()
        (root / "tests" / "__init__.py").write_text("")
        (root / "tests" / "test_toy.py").write_text(SELFTEST_TESTS)
        (root / "pyproject.toml").write_text("")
        kwargs = dict(sample=1, jobs=1, min_score=0.95, module_tests={"toy/arith.py": ["tests/test_toy.py"]},
                      packages=("toy",), quiet_problems=True)
        rc, (result,) = run_all(root, ["toy/arith.py"], **kwargs)
        add_mutants = {k: v for k, v in result.statuses.items() if ".x_add__" in k}
        assert add_mutants and all(v == "killed" for v in add_mutants.values()), add_mutants
        survivors = result.unlisted_survivors
        assert rc == 1 and survivors, (rc, result.statuses)
        assert all(".x_clamp_below__" in s for s in survivors), survivors
        assert any("x <= lo" in result.diffs[s] for s in survivors), result.diffs
        listing = "".join(f"{s.rpartition('.')[2]}: selftest listing\n" for s in survivors)
        (root / "mutation" / "equivalent").mkdir(parents=True)
        (root / "mutation" / "equivalent" / "toy.arith.txt").write_text(listing)
        rc, _ = run_all(root, ["toy/arith.py"], **kwargs)
        assert rc == 0, "the run must pass once every survivor is listed"
        killed = sorted(add_mutants)[0]
        (root / "mutation" / "equivalent" / "toy.arith.txt").write_text(listing + f"{killed}: wrong\n")
        rc, _ = run_all(root, ["toy/arith.py"], **kwargs)
        assert rc == 1, "a killed mutant listed as equivalent must fail the run"
    # The project's own set-up (scratch copy, PYTHONPATH, conftest profile): mutants of kl_k1 (its sign
    # flipped, its argument dropped, ...) must all be killed; were the tests importing the unmutated
    # package, none would be.
    rel = "refimpl/kl.py"
    result = run_module(ROOT, rel, [*MODULES[rel], KILL_TESTS], sample=1, jobs=1,
                        scratch=ROOT / ".mutation" / "selftest",
                        equivalent_dir=ROOT / "mutation" / "equivalent",
                        only=["refimpl.kl.x_kl_k1__mutmut_*"])
    report(result, 0.95)
    assert result.statuses and not result.unlisted_survivors, result.statuses
    assert result.killed == len(result.counted) > 0, result.statuses
    print("mutation selftest passed: planted mutants killed (toy project and refimpl.kl.kl_k1), an unlisted"
          " survivor fails the run, listing it passes, a wrong listing fails")
    return 0


def show_mutants(rel_path: str, only: list[str] | None) -> None:
    """Print every mutant of ``rel_path`` (matching ``only``) with its changed lines, without running
    anything: for writing and re-checking listings after a module changed."""
    import difflib

    import libcst as cst
    from mutmut.configuration import reset_config
    from mutmut.mutation.diff_apply import read_mutant_function, read_original_function
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pyproject.toml").write_text(mutmut_config(rel_path, [], PACKAGES))
        old = os.getcwd()
        os.chdir(tmp)
        try:
            reset_config()
            mutated = mutate_file_contents(rel_path, (ROOT / rel_path).read_text())
        finally:
            os.chdir(old)
    module = cst.parse_module(mutated.code)  # once: re-parsing per mutant is quadratic
    for name in mutated.mutant_names:
        full = get_mutant_name(Path(rel_path), name)
        if only and not any(fnmatch.fnmatch(full, g) for g in only):
            continue
        orig, mutant = (cst.Module([f(module, name)]).code.splitlines()
                        for f in (read_original_function, read_mutant_function))
        changed = [ln for ln in difflib.unified_diff(orig, mutant, lineterm="", n=0)
                   if ln[:1] in "+-" and not ln.startswith(("---", "+++"))]
        print(full + "\n    " + "\n    ".join(changed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="module paths (default: every module)")
    parser.add_argument("--sample", type=int, default=int(os.environ.get("MUTATION_SAMPLE", "1")),
                        help="run every K-th mutant of each function (env MUTATION_SAMPLE)")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATION_JOBS", "1")))
    parser.add_argument("--min-score", type=float,
                        default=float(os.environ.get("MUTATION_MIN_SCORE", "0.95")))
    parser.add_argument("--only", action="append", metavar="GLOB",
                        help="run only the mutants whose names match (repeatable; a partial run)")
    parser.add_argument("--tests", action="append", metavar="GLOB",
                        help="test files to run instead of the module's selection (repeatable): a subset"
                             " kills no more mutants, so its score is a lower bound; faster survivors")
    parser.add_argument("--show", action="store_true",
                        help="print the mutants (names and changed lines) instead of running them")
    parser.add_argument("--selftest", action="store_true")
    args = parser.parse_args(argv)
    if args.selftest:
        return selftest()
    if args.sample < 1:
        parser.error("--sample must be >= 1")
    modules = args.modules or list(MODULES)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        parser.error(f"modules not configured in MODULES: {unknown}")
    if args.show:
        for rel_path in modules:
            show_mutants(rel_path, args.only)
        return 0
    os.environ["OMP_NUM_THREADS"] = "1"
    if args.sample > 1:
        print(f"sampling: every {args.sample}th mutant of each function (MUTATION_SAMPLE={args.sample})")
    if args.only:
        print(f"partial run: only the mutants matching {args.only}")
    if args.tests:
        print(f"test selection: {args.tests} instead of each module's")
    rc, _ = run_all(ROOT, modules, sample=args.sample, jobs=args.jobs, min_score=args.min_score,
                    only=args.only, tests=args.tests)
    return rc


if __name__ == "__main__":
    sys.exit(main())

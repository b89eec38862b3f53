#!/usr/bin/env bash
# CI: the example third-party package (examples/acme-rl) tests itself through rl-oracle's pytest
# plugin, in an environment where rl-oracle is installed (.ci/wheel calls this with the python of
# its fresh venv, which has the built wheel; pytest is installed there when missing). From a copy
# of the example outside the checkout it checks that
#   1. the installed rl-oracle (not the checkout) declares the pytest11 entry point rl_oracle;
#   2. the example, installed with pip --no-deps, passes its own suite (tests/: one test per case
#      class), the plugin loaded by its entry point (no -p);
#   3. its copy with planted bugs (planted/) fails, and pytest's output shows the smallest failing
#      case with its expected and obtained values, as the plugin prints it (no traceback).
# Usage: examples/run_example_ci.sh PYTHON
set -euo pipefail
PY=${1:?usage: examples/run_example_ci.sh PYTHON (a python where rl-oracle and pytest are installed)}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rl-oracle-example.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
step() { echo "== [example $(( SECONDS ))s] $*"; }

step "the installed rl-oracle's pytest plugin"
cd "$WORK"
"$PY" -c "import pytest" 2>/dev/null || "$PY" -m pip install -q pytest  # the example's test extra
"$PY" - "$(dirname "$HERE")" <<'PY'
import importlib.metadata
import sys
from pathlib import Path

import pytest

import refimpl
import refimpl.pytest_plugin

checkout = Path(sys.argv[1]).resolve()
for module in (refimpl, refimpl.pytest_plugin):
    assert not Path(module.__file__).resolve().is_relative_to(checkout), f"{module.__name__} from {module.__file__}"
found = [ep.value for ep in importlib.metadata.entry_points(group="pytest11") if ep.name == "rl_oracle"]
assert "refimpl.pytest_plugin" in found, f"no pytest11 entry point rl_oracle -> refimpl.pytest_plugin: {found}"
print(f"rl-oracle {refimpl.__version__} (pytest11 rl_oracle -> refimpl.pytest_plugin), pytest {pytest.__version__}")
PY

step "pip install --no-deps examples/acme-rl (a copy outside the checkout)"
cp -R "$HERE/acme-rl" "$WORK/acme-rl"
rm -rf "$WORK"/acme-rl/{build,*.egg-info}
# with the venv's own setuptools and wheel nothing is downloaded; else pip builds in isolation
isolation=--no-build-isolation
"$PY" -c "import setuptools, wheel" 2>/dev/null || isolation=
"$PY" -m pip install -q --no-deps $isolation "$WORK/acme-rl"
"$PY" -c "import acme_rl; print('acme_rl from', acme_rl.__file__)"

cd "$WORK/acme-rl"
step "its own suite through the plugin: every case class passes"
"$PY" -m pytest -q -p no:cacheprovider

step "its planted bugs: fail, with the smallest failing case in pytest's output"
status=0
"$PY" -m pytest -q -p no:cacheprovider planted > "$WORK/planted.txt" 2>&1 || status=$?
fail() {
  cat "$WORK/planted.txt"
  echo "run_example_ci: $*" >&2
  exit 1
}
[ "$status" -eq 1 ] || fail "the planted bugs did not fail their tests (pytest exit $status)"
for line in \
  "FAILED planted/test_planted_bug.py::test_dapo_loss[masked_nonfinite]" \
  "masked_nonfinite failed: smallest failing case masked_nonfinite/0: value off by inf" \
  "smallest failing case: masked_nonfinite/0" \
  "  expected loss = " \
  "  got loss      = nan" \
  "the case as one line of Python:" \
  "unequal_groups failed: smallest failing case unequal_groups/0: the function raised RuntimeError" \
  "4 failed"; do
  grep -qF -- "$line" "$WORK/planted.txt" || fail "pytest's output lacks: $line"
done
! grep -q "traceback entries are hidden" "$WORK/planted.txt" \
  || fail "the failures were not rendered by the plugin (is its entry point loaded?)"
grep -F "masked_nonfinite failed:" "$WORK/planted.txt"
tail -n 1 "$WORK/planted.txt"
step "done"

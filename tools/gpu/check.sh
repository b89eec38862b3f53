#!/usr/bin/env bash
# The GPU measurements of issue 21 in one command, for a machine with one CUDA GPU (docs/results.md
# "GPU" and docs/ci.md "On a GPU" say how it is called and what its figures mean).
#
#   bash tools/gpu/check.sh [PART ...]     PART: env tests suite frameworks train losses logprobs steps
#                                          (default: all, in that order; about 9 minutes on an H100)
#
# The parts env, tests, suite, frameworks and train check correctness and may run side by side, in
# separate calls of this script once env has run (it installs the wheels); losses, logprobs and steps
# time things and should run alone.
#
# Run from the repository root. Each part writes one file to $OUT (default ./gpu-out): 8 files at most
# in all, so that a remote runner that returns a few files brings every log back. Each part has its
# own time limit and goes on after a failure; the exit status is that of the first failed part.
# Needs torch with CUDA (and its triton), pytest, pytest-xdist and hypothesis. Wheels in .whl/ (made by
# tools/gpu/wheels.sh: the frameworks for `check framework` and the benchmarks' framework columns, and
# rl-oracle's own) are installed into the interpreter's environment first when present.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  # into the interpreter's own environment (a throwaway machine's): the reproduction scripts of
  # tests/test_framework_findings.py run without PYTHONPATH, and rl-oracle's wheel gives the entry points
  # (`refimpl report`, the pytest plugin) and the metadata `refimpl frameworks install` reads. Once per
  # machine: a second call of this script (parts side by side) uses what the first installed.
  [ -e /tmp/.rl-oracle-wheels ] || { $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade .whl/*.whl && touch /tmp/.rl-oracle-wheels; }
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
REFIMPL=($PY -m refimpl)
status=0
run() {  # run NAME SECONDS COMMAND...: the command's output into $OUT/NAME, with its time and exit code
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "== $name: $*" | tee -a "$OUT/$name"
  timeout "$limit" "$@" >>"$OUT/$name" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - start)) s" | tee -a "$OUT/$name"
  [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
  return 0
}
part_env() {
  run env.txt 60 $PY -c "import torch, platform; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name(), 'host cores', __import__('os').cpu_count(), platform.python_version())"
  run env.txt 60 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
}
part_tests() {  # the CUDA module first, with whole tracebacks
  run cuda_tests.log 240 $PY -m pytest -p no:cacheprovider -q -rfE --tb=long tests/test_cuda.py
}
part_suite() {  # the whole suite with CUDA visible (failures listed with short tracebacks)
  run suite.log 360 $PY -m pytest -p no:cacheprovider -q -rfE --tb=short -n 14 --durations=15
}
# side by side: `beside DIR NAME LIMIT COMMAND...` starts `run` in the background, its log in DIR/NAME;
# `gather FILE DIR NAME...` waits for them (a failure sets status) and appends their logs to $OUT/FILE
beside() { local dir=$1; shift; (OUT=$dir run "$@"; exit $status) & }
gather() {
  local file=$1 dir=$2 name
  shift 2
  for name in "$@"; do wait -n || { [ $status -eq 0 ] && status=1; }; done
  for name in "$@"; do cat "$dir/$name" >>"$OUT/$file"; done
}
part_frameworks() {  # every mode of every framework, expected values on the GPU too (side by side)
  local f tmp frameworks=(trl verl openrlhf liger skyrl areal)
  tmp=$(mktemp -d)
  for f in "${frameworks[@]}"; do beside "$tmp" "$f" 150 "${REFIMPL[@]}" check framework "$f" --device cuda; done
  gather frameworks.txt "$tmp" "${frameworks[@]}"
}
part_losses() {  # the fast path against the floor and the frameworks (graphs compiled first, in parallel)
  timeout 150 $PY benchmarks/losses.py --device cuda --compile-only --presets ppo grpo dr_grpo --no-frameworks &
  timeout 150 $PY benchmarks/losses.py --device cuda --compile-only --presets dapo bnpo gspo --no-frameworks &
  timeout 150 $PY benchmarks/losses.py --device cuda --compile-only --presets gspo_token sapo cispo --no-frameworks &
  timeout 150 $PY benchmarks/losses.py --device cuda --compile-only --presets >/dev/null 2>&1 &
  wait
  run losses.txt 240 $PY benchmarks/losses.py --device cuda --compiled --rounds 7
}
part_logprobs() {
  run logprobs.txt 180 $PY benchmarks/logprobs.py --device cuda
}
part_train() {  # the default run on the GPU, eager and compiled, side by side
  local dir
  dir=$(mktemp -d)
  beside "$dir" eager.log 240 "${REFIMPL[@]}" train --device cuda --out "$dir/eager"
  beside "$dir" compiled.log 300 "${REFIMPL[@]}" train --device cuda --compile true --out "$dir/compiled"
  gather train.txt "$dir" eager.log compiled.log
}
part_steps() {  # seconds per RL step, CPU against CUDA, compile off and on
  run steps.txt 300 $PY benchmarks/trainer.py --steps --device cuda --repeats 3
}
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(env tests suite frameworks train losses logprobs steps)
for p in "${parts[@]}"; do
  case $p in
    env|tests|suite|frameworks|train|losses|logprobs|steps) "part_$p" ;;
    *) echo "unknown part $p (env tests suite frameworks train losses logprobs steps)" >&2; exit 2 ;;
  esac
done
exit $status

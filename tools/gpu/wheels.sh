#!/usr/bin/env bash
# Download, into .whl/, the wheels tools/gpu/check.sh installs on a GPU machine whose Python (3.12)
# has torch but not the frameworks the conformance kit drives (the versions of requirements/frameworks-*.txt;
# tokenizers pinned to what transformers 5.10.4 accepts), and rl-oracle's own wheel built from this tree
# (rerun after a change). Needs pip and PyPI; about 25 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl \
  trl==1.16.0 verl==0.9.1 openrlhf==0.11.2 liger-kernel==0.8.5 skyrl-train==0.3.1 areal==1.0.4 \
  transformers==5.10.4 tokenizers==0.22.1 accelerate==1.15.0 datasets==5.2.0 dill==0.4.1 \
  multiprocess==0.70.19 omegaconf==2.4.0 codetiming==1.4.0 loguru==0.7.3
rm -f .whl/rl_oracle-*.whl
python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl . 2>/dev/null || python3 -m pip wheel -q --no-deps -w .whl .

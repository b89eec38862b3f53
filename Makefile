# Two commands do all the set-up on a fresh machine:
#   make run    -- the main job: train the tiny LM with a verified loss (installs into .venv first)
#   make test   -- the test suite (installs into .venv first)
# TORCH_SPEC picks the torch wheel installed before the project; the default pins a release whose
# CPU wheel is available locally. Elsewhere, e.g.: make test TORCH_SPEC="torch>=2.4"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
# EDITABLE_LOCK=FILE serialises the editable install between makes run side by side in one checkout
# (.ci/run installs two venvs at once; setuptools writes rl_oracle.egg-info into the checkout)
EDITABLE_LOCK ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install frameworks check-frameworks drift run results results-check report test test-threads test-matrix thread-survey test-thorough test-portable lint bench ablation clean mutation mutation-selftest

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(if $(EDITABLE_LOCK),flock $(EDITABLE_LOCK)) $(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# The real frameworks the conformance drivers run (refimpl check framework, refimpl matrix) at the
# releases their profiles describe: `refimpl frameworks install` (refimpl/conformance/frameworks/install.py)
# installs the project's `frameworks` extra with its dependencies, then each framework (its driver's
# PINNED_VERSION) and the few packages its loss code imports (its driver's REQUIREMENTS) with --no-deps:
# their own pins cannot all hold at once (OpenRLHF pins deepspeed and flash-attn, CUDA source builds;
# SkyRL-train declares Python 3.12 only). A constraints file keeps the torch, numpy and sympy already
# installed; the drivers stub the import-only rest.
FRAMEWORKS_STAMP := $(VENV)/.frameworks
$(FRAMEWORKS_STAMP): $(STAMP) $(wildcard refimpl/conformance/frameworks/*.py refimpl/conformance/frameworks/*/__init__.py)
	$(BIN)/refimpl frameworks install
	touch $(FRAMEWORKS_STAMP)

frameworks: $(FRAMEWORKS_STAMP)

# The README's framework check from the command line (every framework's command line runs in-process in
# tests/test_framework_matrix.py, every mode of every framework in the matrix) and the committed matrix
# compared with the installed frameworks' behaviour.
# CHECK_MAIN_MATRIX=0 leaves out the main matrix's --check: .ci/run's two-thread pass compares it
# already (tests/test_framework_matrix.py, the same comparison), so CI does not build it twice.
check-frameworks: $(FRAMEWORKS_STAMP)
	$(BIN)/refimpl check --framework trl --preset dapo
	$(if $(filter 0,$(CHECK_MAIN_MATRIX)),,$(BIN)/refimpl matrix --out docs/conformance-matrix.md \
	  --json docs/conformance-matrix.json --check)
	$(BIN)/refimpl matrix --framework skyrl_pkg --framework unsloth --out docs/conformance-matrix-extra.md \
	  --json docs/conformance-matrix-extra.json --check

# The matrix of every framework at several releases (refimpl/conformance/frameworks/drift.py's RELEASES,
# each installed into .frameworks-releases/DIST-X with pip --no-deps --target) and what changed between
# them: docs/conformance-drift.md. Not in CI: 11 minutes for 24 releases on the 2-core machine at load 2-5
# (session 15; 57 minutes at load 10). Tunix's releases need JAX in the venv (the Tunix stamp below: refimpl frameworks install tunix).
drift: $(VENV)/.frameworks-tunix
	OMP_NUM_THREADS=1 $(BIN)/refimpl frameworks drift --out docs/conformance-drift.md

# The drivers beside the core six, Tunix included, whose JAX CI does not install (about 3 minutes and
# 600 MB from an empty pip cache: docs/ci.md): `refimpl frameworks install tunix` (the `tunix` extra,
# the CPU jax wheel, then google-tunix --no-deps), their matrix docs/conformance-matrix-extra.md checked
# against the installed code, then Tunix's tests (they skip without JAX, so they run here).
.PHONY: check-frameworks-extra
TUNIX_STAMP := $(VENV)/.frameworks-tunix
$(TUNIX_STAMP): $(FRAMEWORKS_STAMP) refimpl/conformance/frameworks/tunix.py
	$(BIN)/refimpl frameworks install tunix
	touch $(TUNIX_STAMP)

check-frameworks-extra: $(TUNIX_STAMP)
	OMP_NUM_THREADS=1 $(BIN)/refimpl matrix --framework skyrl_pkg --framework unsloth --framework tunix \
	  --out docs/conformance-matrix-extra.md --json docs/conformance-matrix-extra.json --check
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_framework_tunix.py \
	  tests/test_framework_findings.py -k tunix

# SEED=n picks the run's seed (default 0): make run SEED=1
# A finished run in runs/main is kept and evaluated again; OVERWRITE=1 trains it anew (refimpl train
# refuses to replace a run without --overwrite).
run: $(STAMP)
	@if [ -f runs/main/summary.json ] && [ -z "$(OVERWRITE)" ]; then \
	  echo "runs/main holds a finished run: evaluating it (make run OVERWRITE=1 trains it again)"; \
	else $(BIN)/refimpl train --seed $(or $(SEED),0) --out runs/main $(if $(OVERWRITE),--overwrite); fi
	$(BIN)/refimpl eval runs/main/checkpoint.pt

# Every preset x seeds 0-2 with the trainer's defaults (tools/results.py); prints the table of docs/results.md.
# About 2.5 min of one core per run on the 2-core development machine; runs already done are kept.
results: $(STAMP)
	$(BIN)/python tools/results.py

# A fresh `make run SEED=0`-equivalent run of dapo against docs/results.md's dapo row, widened by the
# row's spread over the seeds (tools/results.py --check; about 4 minutes of one core, so not in CI).
results-check: $(STAMP)
	$(BIN)/python tools/results.py --check dapo

report: $(STAMP)
	$(BIN)/refimpl report

# TEST_JOBS pytest-xdist workers (each test file in one worker: --dist loadfile keeps a module's
# expensive fixtures, e.g. the conformance matrix, built once); TEST_JOBS=0 runs in this process.
TEST_JOBS ?= 2
test: $(STAMP)
	$(BIN)/ruff check .
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

# The tests whose numerics depend on the intra-op thread count (marked ``threads`` by
# tests/conftest.py from tests/thread_survey.py's measurement, docs/ci.md), at two threads; idle
# OpenMP workers sleep (OMP_WAIT_POLICY=PASSIVE) instead of spinning on a busy machine's cores.
# numpy's BLAS (OpenBLAS, which reads OMP_NUM_THREADS too) stays at one thread, as in the one-thread
# pass: only torch's intra-op threads differ between the passes, the thing the survey measures.
# THREADS_MARK narrows the selection (.ci/run: "threads and not real_matrix", the matrix's tests
# running in make test-matrix beside it).
THREADS_MARK ?= threads
test-threads: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} OPENBLAS_NUM_THREADS=1 \
	  HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(BIN)/python -m pytest -q -m "$(THREADS_MARK)" $(PYTEST_ARGS)

# The tests that build the installed frameworks' whole matrix (marked ``real_matrix`` by
# tests/conftest.py: the committed docs/conformance-matrix.json compared with it, every mode under its
# profile from the command line, docs/conformance.md's `refimpl matrix` examples), in one process so
# that the matrix is built once, at one thread as make check-frameworks builds it. Run it with the
# frameworks installed: make test-matrix VENV=.venv-frameworks. MATRIX_TESTS: the modules that hold
# them (collecting the whole suite costs 10-20 s; tests/test_ci_requirements.py checks that no other module
# uses the fixture).
MATRIX_TESTS := tests/test_conformance_docs.py tests/test_framework_matrix.py tests/test_framework_matrix_extra.py
test-matrix: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1 HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} \
	  $(BIN)/python -m pytest -q -m real_matrix $(PYTEST_ARGS) $(MATRIX_TESTS)

# Which tests compute differently at two threads than at one (docs/ci.md): every torch result of
# every test hashed at 1 and at 2 threads (slow: hours of one core for the whole suite; TESTS=...
# narrows it). Prints the modules to list in tests/conftest.py's THREAD_SENSITIVE_MODULES.
thread-survey: $(STAMP)
	for threads in 1 2; do OMP_NUM_THREADS=$$threads OPENBLAS_NUM_THREADS=1 HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} \
	  $(BIN)/python -m pytest -q -p no:cacheprovider -p tests.thread_survey \
	  --thread-survey $(VENV)/thread-survey-$$threads.json $(TESTS); done; \
	$(BIN)/python -m tests.thread_survey $(VENV)/thread-survey-1.json $(VENV)/thread-survey-2.json

# SEED=N fixes hypothesis' randomisation (pytest --hypothesis-seed), so a failure found by one
# seed can be replayed: make test-thorough SEED=1
test-thorough: $(STAMP)
	HYPOTHESIS_PROFILE=thorough $(BIN)/python -m pytest -q $(if $(SEED),--hypothesis-seed=$(SEED))

# The suite under kernels that imitate other CPUs (ATen's dispatch: no SIMD, AVX2) and with 1 and 2
# threads; run it before resolving a numerical change.
test-portable: $(STAMP)
	$(BIN)/ruff check .
	for cap in default avx2; do for threads in 1 2; do \
	  echo "== ATEN_CPU_CAPABILITY=$$cap OMP_NUM_THREADS=$$threads"; \
	  ATEN_CPU_CAPABILITY=$$cap OMP_NUM_THREADS=$$threads HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} \
	    $(BIN)/python -m pytest -q -p no:cacheprovider || exit 1; done; done

lint: $(STAMP)
	$(BIN)/ruff check .

# Mutation testing (tools/mutation.py, docs/mutation.md): not part of CI. MUTATION_SAMPLE=K runs every
# K-th mutant of each function; MUTATION_JOBS=N parallel workers.
MUTATION_STAMP := $(VENV)/.installed-mutation

$(MUTATION_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install -q -e ".[dev,mutation]"
	touch $(MUTATION_STAMP)

mutation: $(MUTATION_STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python tools/mutation.py

mutation-selftest: $(MUTATION_STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python tools/mutation.py --selftest

# the DAPO ablation (18 training runs of 100 RL steps, about 20 minutes with 2 jobs on 2 loaded cores) is its own target
bench: $(STAMP)
	for b in benchmarks/*.py; do [ $$b = benchmarks/dapo_ablation.py ] || $(BIN)/python $$b || exit 1; done

ablation: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/dapo_ablation.py --jobs 2 --out runs/dapo_ablation

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

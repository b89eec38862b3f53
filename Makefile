# Two commands do all the set-up on a fresh machine:
#   make run    -- the main job: train the tiny LM with a verified loss (installs into .venv first)
#   make test   -- the test suite (installs into .venv first)
# TORCH_SPEC picks the torch wheel installed before the project; the default pins a release whose
# CPU wheel is available locally. Elsewhere, e.g.: make test TORCH_SPEC="torch>=2.4"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run report test test-thorough lint bench clean mutation mutation-selftest

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/refimpl train --out runs/main
	$(BIN)/refimpl eval runs/main/checkpoint.pt

report: $(STAMP)
	$(BIN)/refimpl report

test: $(STAMP)
	$(BIN)/ruff check .
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(BIN)/python -m pytest -q

test-thorough: $(STAMP)
	HYPOTHESIS_PROFILE=thorough $(BIN)/python -m pytest -q

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

bench: $(STAMP)
	for b in benchmarks/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

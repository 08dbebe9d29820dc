# The README's two commands: `make run` and `make test`. Each creates or refreshes .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: setup run test lint format bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

# The tests also drive the loop's DeepSpeed path on CPU workers and train a LightningModule:
# `make test` adds those extras.
$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,deepspeed,lightning]'
	touch $(TEST_STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/trainflow run

# Two pytest workers, one test module each at a time (module fixtures stay whole): most of the
# suite waits on servers and Ray start-up, so two share the 2 cores well. Modules go out in
# collection order, which tests/conftest.py sorts longest first; a module that shares another's
# session fixtures goes with it (tests/conftest.py, RUNS_WITH). Size tests wait for `make bench`.
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

# The benchmark suite (~30 min on 2 cores): benchmarks/results/*.json, docs/benchmarks.md;
# then the `scale` tests (20k against 200k rows from S3, 10M rows, local and from S3,
# and 200,000 images through the whole pipeline, ~1.5 h), which `make test` skips.
bench: setup
	$(BIN)/python -m benchmarks
	TRAINFLOW_SCALE_OUT=docs $(BIN)/python -m pytest -m scale tests/e2e/test_scale_memory.py -s

clean:
	rm -rf $(VENV) .trainflow .pytest_cache

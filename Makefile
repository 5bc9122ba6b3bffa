# Two commands for a new user: `make demo` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test test-unit test-py explore bench compiled lint dist seeded mutation services-up services-down stack stack-down alerts-demo weaver-check clean help

help:
	@echo "make demo         the incident and its fix on the embedded broker (no Java, no Go)"
	@echo "make test         install test deps, start RocketMQ + Jaeger + Prometheus, run every test"
	@echo "make test-unit    only the tests that need no service"
	@echo "make explore      the model tests on fresh random seeds, long budgets (make test repeats its examples)"
	@echo "make test-py V=3.13  those under another Python (venv built once in .cache/venvs)"
	@echo "make bench        the benchmarks behind BENCHMARKS.md"
	@echo "make compiled     build/compiled: rmqtrace with its per-message path compiled by mypyc (needs a C compiler)"
	@echo "make stack        RocketMQ + Jaeger + Prometheus on loopback for your own app (stack-down stops it)"
	@echo "make alerts-demo  Prometheus + Alertmanager + a webhook and the incident: the real rules fire (~1-2 min)"
	@echo "make lint         ruff + mypy --strict"
	@echo "make weaver-check OTel's weaver live check on our spans and metrics (WEAVER=path, WEAVER_REGISTRY=model dir)"
	@echo "make dist         build dist/rmqtrace-VERSION.tar.gz and the wheel, twine check them"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Stamps keep reinstalls cheap: they are redone only when pyproject.toml changes. -qq shows errors
# only: at -q setuptools prints a ten-line notice about editable installs before the demo.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install -qq -e .
	@touch $@

# The legacy 2.x client installs a top-level `rocketmq` package too, so it cannot share this venv
# with the 5.x client: its tests build their own venv (services/rocketmq/legacy_venv.sh).
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(PIP) install -q -e '.[test,rocketmq,grpc]'
	@touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/rmqtrace demo

test: $(VENV)/.installed-test
	@set -o pipefail; status=0; \
	$(MAKE) --no-print-directory services-up || status=$$?; \
	if [ $$status -eq 0 ]; then \
	  RMQTRACE_REQUIRE_SERVICES=1 $(BIN)/python -m pytest -ra --durations=15 tests || status=$$?; \
	fi; \
	$(MAKE) --no-print-directory services-down; \
	exit $$status

test-unit: $(VENV)/.installed-test
	$(BIN)/python -m pytest -ra -m "not integration" tests

# The checkout on PYTHONPATH wins over the copy installed in the shared venv (.ci/pyvenv.sh says why).
# The mypyc build is built and tested once, under the venv's Python, by `make test` (CI time).
test-py:
	@test -n "$(V)" || { echo "make test-py: say which Python, e.g. make test-py V=3.10" >&2; exit 2; }
	@py="$$(bash .ci/pyvenv.sh $(V))" && PYTHONPATH="$(CURDIR)" "$$py" -m pytest -ra -m "not integration and not compiled" tests

services-up:
	bash services/prometheus/prom.sh install
	bash services/alertmanager/am.sh install
	bash services/rocketmq/rmq.sh start
	bash services/jaeger/jaeger.sh start

services-down:
	-bash services/jaeger/jaeger.sh stop
	-bash services/rocketmq/rmq.sh stop
	-bash services/prometheus/prom.sh stop
	-bash services/alertmanager/am.sh stop

bench: $(VENV)/.installed
	$(BIN)/rmqtrace bench overhead
	$(BIN)/rmqtrace bench dispatch

# The per-message path compiled by mypyc (tracer.compiled; README "Compiled build"): a copy of the
# package in build/compiled, used by putting that directory first on PYTHONPATH. Rebuilt every time
# (a compiled module imported beside a newer .py runs the old code).
compiled: $(VENV)/.installed-test
	rm -rf build/compiled
	$(BIN)/python -m tracer.tools.compile build/compiled

# Not part of `make test`: hand-written seeded bugs, each must be caught by a named invariant
# make test draws the same examples each run (tests/conftest.py); this searches for new ones.
explore: $(VENV)/.installed-test
	RMQTRACE_EXPLORE=1 RMQTRACE_LONG=1 nice $(BIN)/python -m pytest -ra -m "not integration" $$(grep -l RuleBasedStateMachine tests/test_*.py)

seeded: $(VENV)/.installed-test
	nice $(BIN)/python tests/mutation/run_seeded.py

$(VENV)/.installed-mutation: pyproject.toml | $(VENV)/.installed-test
	$(PIP) install -q -e '.[test,mutation]'
	@touch $@

# mutmut over the functions in tests/mutation/scope.txt, in a copy of the tree under /tmp, then the seeded bugs
mutation: $(VENV)/.installed-mutation
	bash tests/mutation/run_mutmut.sh
	$(MAKE) --no-print-directory seeded

stack: $(VENV)/.installed
	bash services/stack.sh up

stack-down:
	bash services/stack.sh down

# The real rules of dashboards/prometheus/rmqtrace-alerts.yml, only `for:` shortened
# (RMQTRACE_ALERTS_DEMO_FOR, default 10s): prints each alert the webhook gets, stops all it started.
alerts-demo: $(VENV)/.installed
	bash services/prometheus/prom.sh install
	bash services/alertmanager/am.sh install
	$(BIN)/python services/alerts_demo.py

# weaver is on no package registry reachable here: WEAVER=path or .cache/bin/weaver-<version> (docs/semconv.md).
weaver-check: $(VENV)/.installed-test
	$(BIN)/python tests/semconv/weaver_live_check.py

lint: $(VENV)/.installed-test
	$(BIN)/ruff check tracer tests
	$(BIN)/mypy

# build (isolated: a fresh setuptools from the build-system table) and twine come from the `dist` extra.
$(VENV)/.installed-dist: pyproject.toml | $(BIN)/python
	$(PIP) install -qq -e '.[dist]'
	@touch $@ $(VENV)/.installed

dist: $(VENV)/.installed-dist
	rm -rf dist
	$(BIN)/python -m build -q --outdir dist .
	$(BIN)/twine check --strict dist/*

clean:
	rm -rf $(VENV) rmqtrace-out dist build .pytest_cache .mypy_cache

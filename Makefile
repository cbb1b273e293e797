# Berth: `make demo` runs the portal on a demo cluster; `make test` runs the whole suite.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PG_PORT ?= 55433
export REDIS_PORT ?= 56379
export DATABASE_URL ?= postgres://berth:berth@127.0.0.1:$(PG_PORT)/berth
export REDIS_URL ?= redis://127.0.0.1:$(REDIS_PORT)/0
export DJANGO_SETTINGS_MODULE ?= portal.settings
PORT ?= 8000

.PHONY: venv lock services stop migrate demo-data demo test test-fast lint typecheck bench clean

$(BIN)/.installed: pyproject.toml requirements-dev.lock
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-dev.lock
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

venv: $(BIN)/.installed

lock:  ## re-resolve both pinned trees after editing pyproject.toml (production, and production + dev)
	$(BIN)/pip-compile -q --strip-extras --no-emit-index-url --no-emit-find-links -o requirements.lock pyproject.toml
	$(BIN)/pip-compile -q --strip-extras --no-emit-index-url --no-emit-find-links --extra dev -o requirements-dev.lock pyproject.toml

services:
	@scripts/services.sh start

stop:
	@scripts/demo.sh stop 2>/dev/null || true
	@scripts/services.sh stop

migrate: venv services
	$(BIN)/python manage.py migrate --noinput

# services.sh starts project-local PostgreSQL/Redis unless DATABASE_URL/REDIS_URL point elsewhere.
demo: venv services
	@scripts/demo.sh start

test: venv services
	@scripts/test.sh

test-fast: venv services  ## skip Slurm, browser and slow tests
	$(BIN)/pytest -q -m "not slurm and not e2e and not slow and not fault"

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: venv
	$(BIN)/mypy portal scheduling forecasting notifications ops bench berth_cli  # strict on the pure core (pyproject.toml)

clean: stop
	rm -rf .run

.PHONY: fuzz bench-api
fuzz: venv services  ## longer schemathesis pass over the whole API (BERTH_FUZZ_EXAMPLES per operation)
	BERTH_FUZZ_EXAMPLES=$${BERTH_FUZZ_EXAMPLES:-200} $(BIN)/pytest -q tests/hardening/test_schemathesis.py

bench-api: venv services  ## gunicorn (production settings) on a free loopback port + bench.api
	scripts/bench-api.sh

.PHONY: bench-round
bench-round: venv services  ## the whole engine round on a database of its own (DESIGN §8), artifacts/bench_round.json
	$(BIN)/python -m bench.round --nodes 1000 --gpus-per-node 8 --running 2048 --pending 10000 --out artifacts/bench_round.json

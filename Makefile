# One entry point for developers and CI.
VENV ?= .venv
BIN := $(VENV)/bin
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: venv demo serve test lint bench clean

venv:
	@scripts/bootstrap.sh

## Run the service and dashboard on the embedded default (SQLite, in-process tasks).
demo: venv
	$(BIN)/shaper demo

serve: venv
	$(BIN)/shaper serve

## Install; start PostgreSQL and Redis, install Chromium and a CRIU that works on this
## kernel when missing (Slurm is installed and started by its test fixture); run everything.
test: venv
	scripts/services.sh
	scripts/browser.sh
	scripts/install-criu.sh
	scripts/prometheus.sh
	$(BIN)/pytest -q

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy solver app/core wire

bench: venv
	scripts/services.sh
	$(BIN)/python -m bench.ingest
	$(BIN)/python -m bench.solver --sizes 100 1000
	$(BIN)/python -m bench.actions
	$(BIN)/python -m bench.checkpoint
	$(BIN)/python -m bench.api

clean:
	rm -rf $(VENV) shaper-data .pytest_cache .mypy_cache .ruff_cache

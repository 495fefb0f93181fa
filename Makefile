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
## kernel when missing, build the Kubernetes control plane and Kueue once per machine
## (scripts/k8s-build.sh: cached, ~25 min cold on 2 cores); Slurm and the Kubernetes cluster
## are started by their test fixtures; lint (ruff, strict mypy) first; run everything.
test: venv lint
	scripts/services.sh
	scripts/browser.sh
	scripts/install-criu.sh
	scripts/k8s-build.sh >/dev/null
	scripts/prometheus.sh
	$(BIN)/pytest -q

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy app agent connectors forecast sim solver wire bench

bench: venv
	scripts/services.sh
	$(BIN)/python -m bench.ingest
	$(BIN)/python -m bench.solver --sizes 100 1000
	$(BIN)/python -m bench.actions
	$(BIN)/python -m bench.checkpoint
	$(BIN)/python -m bench.api

clean:
	rm -rf $(VENV) shaper-data .pytest_cache .mypy_cache .ruff_cache

# One entry point for developers and CI.
VENV ?= .venv
BIN := $(VENV)/bin
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: venv demo serve test lint bench clean
.PHONY: web screenshots
WEB := web/frontend
WEB_BUNDLE := web/static/dist/app.js

venv:
	@scripts/bootstrap.sh

## Run the service and dashboard on the embedded default (SQLite, in-process tasks).
demo: venv
	$(BIN)/shaper demo
demo: web

serve: venv
	$(BIN)/shaper serve

## Install; start PostgreSQL and Redis, install Chromium and a CRIU that works on this
## kernel when missing, build the Kubernetes control plane and Kueue once per machine
## (scripts/k8s-build.sh: cached, ~25 min cold on 2 cores) and Slurm 24.11 beside Debian's
## 22.05 (scripts/slurm-build.sh: cached, ~5 min cold); Slurm and the Kubernetes cluster
## are started by their test fixtures; lint (ruff, strict mypy) first; run everything, on
## TEST_WORKERS pytest-xdist workers (tests/support/parallel.py keeps each real service's
## tests on one worker).
TEST_WORKERS ?= 2
test: venv lint
	scripts/services.sh
	scripts/browser.sh
	scripts/install-criu.sh
	scripts/k8s-build.sh >/dev/null
	scripts/slurm-build.sh >/dev/null
	scripts/k8s/real-node/real-node.sh build
	scripts/prometheus.sh
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25
test: web

## The dashboard's bundle (TypeScript, uPlot; esbuild) from web/frontend/package-lock.json:
## `npm ci` takes the locked versions (from npm's cache when it has them), `npm run build`
## type-checks (tsc --noEmit) and bundles into web/static/dist (git-ignored). No browser
## is downloaded: the tests drive Debian's Chromium.
web: venv $(WEB_BUNDLE)

$(WEB)/node_modules/.package-lock.json: $(WEB)/package-lock.json $(WEB)/package.json
	cd $(WEB) && npm ci --prefer-offline --no-audit --no-fund

$(WEB_BUNDLE): $(WEB)/node_modules/.package-lock.json $(wildcard $(WEB)/src/*) $(WEB)/build.mjs $(WEB)/tsconfig.json
	cd $(WEB) && npm run --silent build

## Refresh the dashboard screenshots that the README shows (web/screenshots/).
screenshots: venv web
	scripts/browser.sh
	SHAPER_SCREENSHOTS=web/screenshots $(BIN)/pytest -q tests/web

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
	rm -rf $(WEB)/node_modules web/static/dist

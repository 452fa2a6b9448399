# Trainyard — `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
UV := $(PYTHON) -m uv
DATA_DIR ?= $(CURDIR)/.data
STAMP := .venv/.synced
# Every target starts Python processes by the dozen (services, their tests, the CLI):
# where the environment asks Python not to write bytecode, each one compiled every
# module it imported from source again (about 0.6 s of CPU per service start).
unexport PYTHONDONTWRITEBYTECODE

.DEFAULT_GOAL := help

##@ Run

run: setup ## Install everything, start the platform, run an example job, stay up until Ctrl-C
	$(UV) run --frozen trainyard-stack run --data-dir $(DATA_DIR)

up: setup ## Start the platform in the background; returns once every service is healthy (REPLICAS=status=2,intake=2: replicas)
	$(if $(REPLICAS),YARD_REPLICAS=$(REPLICAS)) $(UV) run --frozen trainyard-stack up --data-dir $(DATA_DIR)

down: ## Stop the platform started by `make up` and the jobs' tasks (KEEP_TASKS=1: leave them for the next start to adopt)
	@if [ -x .venv/bin/trainyard-stack ]; then .venv/bin/trainyard-stack down --data-dir $(DATA_DIR) $(if $(KEEP_TASKS),--keep-tasks); else echo "not running"; fi

kube-up: setup ## A Kubernetes control plane with KWOK nodes (kubeconfig: .data/kube/kubeconfig); YARD_LAUNCHER=kubernetes make up runs Trainyard on it
	$(UV) run --frozen trainyard-stack kube-up --data-dir $(DATA_DIR)

kube-down: ## Stop the cluster `make kube-up` started
	@if [ -x .venv/bin/trainyard-stack ]; then .venv/bin/trainyard-stack kube-down --data-dir $(DATA_DIR); else echo "not running"; fi

metrics: setup ## Prometheus (Debian's, with Trainyard's alert rules) scraping the platform `make up` started, at :9090 until Ctrl-C
	$(UV) run --frozen trainyard-stack metrics --data-dir $(DATA_DIR)

migrate-store: setup ## Copy an earlier version's FerretDB data (or FROM=<MongoDB URL>) into the SQLite store
	$(UV) run --frozen trainyard-stack migrate-store --data-dir $(DATA_DIR) $(if $(FROM),--from $(FROM))

##@ Develop

test: setup lint ## Install everything and run every test (unit, integration, end-to-end)
	$(UV) run --frozen pytest -q -p no:cacheprovider

lint: setup ## The gates: ruff (lint and format), mypy (libs and services) and the import contracts
	$(UV) run --frozen ruff check .
	$(UV) run --frozen ruff format --check .
	$(UV) run --frozen mypy
	$(UV) run --frozen lint-imports

test-unit: setup ## Only the fast pure tests
	$(UV) run --frozen pytest -q tests/unit

bench: setup ## Benchmarks (print JSON): the pipeline against the bus floor, placement speed and trace replay against their baselines, each measured in the same run
	$(UV) run --frozen python bench/pipeline.py
	$(UV) run --frozen python bench/placement_speed.py
	$(UV) run --frozen python bench/placement_replay.py

contracts: setup ## Regenerate contracts/ (JSON Schemas, AsyncAPI, examples) and the bus table of docs/architecture.md
	$(UV) run --frozen python -m trainyard_stack.bus_map contracts docs/architecture.md

setup: $(STAMP) .cache/bin/trainyard-ferretdb .cache/bin/.kube-built .cache/bin/paper-draws tools/js/node_modules/.installed ## Install uv, the Python workspace, build the embedded store, the test cluster and the paper-draws tool, the JavaScript test clients, Open MPI (as root)
	@bash tools/setup-system.sh

$(STAMP): pyproject.toml uv.lock libs/*/pyproject.toml services/*/pyproject.toml
	@$(UV) --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet uv || $(PYTHON) -m pip install --quiet --break-system-packages uv
	$(UV) sync --frozen
	@touch $@

.cache/bin/trainyard-ferretdb: tools/ferretdb/main.go tools/ferretdb/go.mod tools/ferretdb/go.sum tools/ferretdb/build.sh
	@if [ -z "$$MONGO_URL" ]; then bash tools/ferretdb/build.sh >/dev/null; else echo "MONGO_URL set: not building FerretDB"; fi

# Kubernetes v1.34.4 (etcd, apiserver, controller manager, scheduler, kubectl), KWOK and
# helm: a cold build takes 15-30 minutes on 2 cores; Go's caches make rebuilds relinks.
.cache/bin/.kube-built: tools/kube/main.go tools/kube/urls.go tools/kube/go.mod tools/kube/go.sum tools/kube/build.sh
	@bash tools/kube/build.sh >/dev/null && touch $@

# The FGD paper's own workload draws (Go's math/rand, as its simulator draws them), for
# bench/placement_quality.py --draws paper: standard library only, builds in seconds.
.cache/bin/paper-draws: tools/paper-draws/main.go tools/paper-draws/go.mod
	@mkdir -p $(@D) && cd tools/paper-draws && CGO_ENABLED=0 go build -trimpath -o $(CURDIR)/$@.tmp . && mv -f $(CURDIR)/$@.tmp $(CURDIR)/$@

# The JavaScript clients the end-to-end tests use unchanged (OpenPAI's JS SDK), pinned.
tools/js/node_modules/.installed: tools/js/package.json tools/js/package-lock.json
	cd tools/js && npm ci --no-audit --no-fund --loglevel=error >/dev/null
	@touch $@

clean: ## Remove the virtual environment, build cache and local data
	rm -rf .venv .cache .data tools/js/node_modules

help: ## List the targets
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
	  /^##@/ {printf "\n%s\n", substr($$0, 5)} \
	  /^[a-zA-Z_-]+:.*##/ {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: run up down kube-up kube-down metrics migrate-store test lint test-unit bench contracts setup clean help

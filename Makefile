# One entry point for people and CI. `make demo` and `make test` are the README's two commands.
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: bootstrap demo demo-down test lint typecheck unit verify crds dashboards clients-latest

bootstrap:
	@scripts/bootstrap.sh

## The main job: a real local control plane, the operator, a sample fleet reconciled.
demo: bootstrap
	@scripts/demo.sh up

demo-down:
	@scripts/demo.sh down

## Everything CI runs: lint, types, generated-file drift, all test tiers.
test: bootstrap lint typecheck
	$(BIN)/pytest -q

lint:
	$(BIN)/ruff check operator devtools tests benchmarks scripts
	$(BIN)/ruff format --check operator devtools tests benchmarks scripts

typecheck:
	$(BIN)/mypy

unit: bootstrap
	$(BIN)/pytest -q tests/unit

## The pods tier (opt-in, root): a real node on this machine, every pod a real process (docs/real-node.md).
test-pods: bootstrap
	@scripts/install-node.sh
	@scripts/build-node.sh >/dev/null
	@scripts/build-images.sh >/dev/null
	KVR_PODS_TIER=1 $(BIN)/pytest -q tests/pods

## The real-clients tier again with npm's latest Claude Code and Codex: what changed, what is refused.
clients-latest: bootstrap
	@scripts/clients-latest.sh

## Regenerate every generated file: the CRD, the chart's copy of it, the kubectl bundle.
crds:
	$(BIN)/kvretention crds --write crds/
	scripts/sync-chart-crds.sh
	scripts/gen-install-bundle.sh

## Regenerate the Grafana dashboards (deploy/dashboards/ and the chart's copy).
dashboards:
	$(BIN)/python scripts/gen-dashboards.py

## Fail when a generated file differs from its source.
verify:
	$(BIN)/python scripts/gen-dashboards.py --check
	$(BIN)/kvretention crds --write crds/ && git diff --exit-code -- crds/
	scripts/sync-chart-crds.sh --check
	scripts/gen-install-bundle.sh --check

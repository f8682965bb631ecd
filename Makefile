# One entry point for people and CI. `make demo` and `make test` are the README's two commands.
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: bootstrap demo demo-down test lint typecheck unit verify crds dashboards clients-latest node test-pods

bootstrap:
	@scripts/bootstrap.sh

## The main job: a real local control plane, the operator, a sample fleet reconciled, agent requests
## through it. Real pods where this machine allows (root, cgroups, ...), else kwok, saying why;
## KVR_DEMO_NODE=real|kwok chooses.
demo:
	@scripts/bootstrap.sh --demo
	@scripts/demo.sh up

## Stop everything the demo started; a real node's teardown restores the host and checks it.
demo-down:
	@scripts/demo.sh down

## Everything CI runs: lint, types, generated-file drift, all test tiers, then the pods tier in a
## pytest run of its own (a real node: its host changes must not overlap another tier), its images
## built beside the other tiers (scripts/test.sh). Where the machine cannot run a node,
## scripts/test-pods.sh says why and skips it; with CI set it fails.
test: bootstrap lint typecheck
	@scripts/test.sh

## What the pods tier needs: Debian packages (only those missing), kubelet/kube-proxy/CoreDNS and the
## images, each cached (~/.cache/kvretention).
node:
	@scripts/install-node.sh
	@scripts/build-node.sh >/dev/null
	@scripts/build-images.sh >/dev/null

lint:
	$(BIN)/ruff check operator devtools tests benchmarks scripts
	$(BIN)/ruff format --check operator devtools tests benchmarks scripts

typecheck:
	$(BIN)/mypy

unit: bootstrap
	$(BIN)/pytest -q tests/unit

## The pods tier alone (root): a real node on this machine, every pod a real process; builds what it
## needs first (cached), docs/real-node.md.
test-pods: bootstrap
	@scripts/test-pods.sh

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

#!/usr/bin/env bash
# Install everything the tests, the demo and the benchmarks need, from a clean checkout.
# Idempotent: a second run only checks stamps. Slow builds are cached outside the repo.
#
#   scripts/bootstrap.sh          everything (`make test`, `make bootstrap`)
#   scripts/bootstrap.sh --demo   only what `make demo` runs: no LeaderWorkerSet controller, no
#                                 Prometheus, no agent CLIs and none of the Debian packages only
#                                 their tiers use (a newcomer's first demo waits for none of them)
set -euo pipefail
cd "$(dirname "$0")/.."

demo_only=
case "${1:-}" in
  --demo) demo_only=1 ;;
  "") ;;
  *) printf 'usage: %s [--demo]\n' "$0" >&2; exit 2 ;;
esac

VENV=${KVR_VENV:-.venv}
SGLANG_VERSION=0.5.23
MOONCAKE_VERSION=0.3.13.post1

log() { printf '[bootstrap] %s\n' "$*" >&2; }

# Debian packages: openssl for the control plane's keys, libibverbs1 for mooncake_master,
# lua5.1 to test the Argo CD health check with a real Lua, gcc for the test-only libcuda stand-in,
# npm (with Node.js) to install the real Claude Code and Codex CLIs the client tier runs,
# postgresql for the throwaway store `claude gateway` needs to serve its /protocol (that tier).
need_apt=()
command -v openssl >/dev/null || need_apt+=(openssl)
if [ -z "$demo_only" ]; then
  command -v npm >/dev/null || need_apt+=(npm)
  command -v lua5.1 >/dev/null || need_apt+=(lua5.1)
  command -v initdb >/dev/null || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need_apt+=(postgresql)
fi
command -v gcc >/dev/null && command -v nm >/dev/null || need_apt+=(gcc binutils)
[ -e /usr/lib/x86_64-linux-gnu/libibverbs.so.1 ] || [[ "$(ldconfig -p)" == *libibverbs.so.1* ]] || need_apt+=(libibverbs1)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing Debian packages: ${need_apt[*]}"
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  fi
fi

# Python: one venv, the package editable with dev extras, and the real sglang source (--no-deps:
# its engine needs torch and a GPU; the tests use its kv_hints decoder and its signatures).
stamp_src=$(cat pyproject.toml devtools/pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
stamp="$VENV/.kvr-stamp-$stamp_src"
if [ ! -e "$stamp" ]; then
  log "creating $VENV and installing Python packages (first run takes a few minutes)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  # [test]: SGLang's real engine on CPU ([cpu-engine]: torch from PyPI, its parsers, radix caches,
  # scheduler and servers) and jinja2; about 3 GB of wheels, cached by pip after once.
  "$VENV/bin/pip" install -q -e '.[dev,test]'
  # devtools/: the local control plane (`kvretention cluster`), never shipped in the package
  "$VENV/bin/pip" install -q --no-deps -e devtools
  "$VENV/bin/pip" install -q --no-deps "sglang==$SGLANG_VERSION"
  # SGLang's own pin: its Responses server imports it, and the tests compare Codex's prompts with
  # that server's (here, not in pyproject: the worker images' dependency key stays as it is)
  "$VENV/bin/pip" install -q "openai-harmony==0.0.4"
  "$VENV/bin/pip" install -q --no-deps "mooncake-transfer-engine==$MOONCAKE_VERSION"
  rm -f "$VENV"/.kvr-stamp-*
  touch "$stamp"
else
  log "Python environment up to date ($VENV)"
fi

# TEST-ONLY libcuda stand-in + PyPI libcudart so Mooncake's store client loads on a CPU host
# (cached in ~/.cache/kvretention; worker images keep the real driver).
KVR_VENV="$VENV" scripts/build-cuda-standin.sh >/dev/null

# Kubernetes binaries for the real local control plane (cached in ~/.cache/kvretention).
if [ -x scripts/build-kube.sh ]; then
  scripts/build-kube.sh >/dev/null
fi
if [ -n "$demo_only" ]; then
  log "ready for the demo"
  exit 0
fi

# The LeaderWorkerSet controller for multinode fleets on the local plane (its own cache entry,
# ~/.cache/kvretention/lws/<version>-<hash>; 6.5 min cold on 2 cores beside the kube build, instant warm).
if [ -x scripts/build-lws.sh ]; then
  scripts/build-lws.sh >/dev/null
fi

# Prometheus and promtool for the observability tier and the chart's alert tests (Debian's
# `prometheus` package where apt has it, else built from the Go module proxy into the cache).
scripts/install-prometheus.sh >/dev/null

# The pinned Claude Code and Codex CLIs for tests/clients, from npm (cached in
# ~/.cache/kvretention/clients, keyed by version).
scripts/install-clients.sh >/dev/null
log "ready"

#!/usr/bin/env bash
# Install the peers the benchmarks run side by side (LiteLLM's proxy, SGLang's router) and the
# profilers into a SEPARATE venv, .venv-bench/: LiteLLM pulls in many packages that must not reach
# the project's own venv. uvloop, prometheus-client, msgspec and grpcio (which the data plane imports) let
# uvloop_launch.py run our frontend and router from here (an event-loop experiment). Idempotent: a
# second run only checks a stamp.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${KVR_BENCH_VENV:-.venv-bench}
LITELLM_SPEC=${KVR_LITELLM_SPEC:-"litellm[proxy]"}
SGLANG_ROUTER_SPEC=${KVR_SGLANG_ROUTER_SPEC:-"sglang-router"}
stamp_src=$(sha256sum benchmarks/setup.sh | cut -c1-16)
stamp="$VENV/.kvr-bench-stamp-$stamp_src"

log() { printf '[bench-setup] %s\n' "$*" >&2; }

if [ -e "$stamp" ]; then
  log "benchmark venv up to date ($VENV)"
  exit 0
fi
log "creating $VENV (LiteLLM's proxy, sglang-router, py-spy, pyinstrument)"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "$LITELLM_SPEC" "$SGLANG_ROUTER_SPEC" py-spy pyinstrument uvloop prometheus-client msgspec grpcio
rm -f "$VENV"/.kvr-bench-stamp-*
touch "$stamp"
"$VENV/bin/pip" list 2>/dev/null | grep -Ei '^(litellm|sglang-router|sglang_router|py-spy|pyinstrument) ' >&2 || true
log "ready"

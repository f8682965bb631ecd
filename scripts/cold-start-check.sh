#!/usr/bin/env bash
# Start and stop the local plane (`kvretention cluster up` / `down`) N times from a fresh state dir
# each time, optionally with busy loops eating the CPUs, and count the starts that failed: the check
# for start-up races (a process read dead before its exec, a first write refused by a just-started
# API server) that a warm, idle machine hides. One line of summary at the end; exit 1 when any run
# failed, so CI can run it as is. Each run's output is kept in the work dir; a failed one is printed.
#
# With --demo each run is instead a newcomer's first `make demo`: a fresh `git clone` of this checkout's
# HEAD, `make demo` in it (with the machine's caches, ~/.cache/kvretention), then `make demo-down`.
#
# Usage: scripts/cold-start-check.sh [--runs N] [--load [K]] [--real-node] [--demo] [--timeout S] [--keep]
#   --runs N      runs (default 5)
#   --demo        run `make demo` / `make demo-down` from a clean clone instead of `cluster up` / `down`
#   --load [K]    K busy loops (default 2) running for the whole check
#   --real-node   `cluster up --real-node` (root; see docs/real-node.md)
#   --timeout S   passed to `cluster up --timeout` (default: its own, 180)
#   --keep        keep the work dir (logs of every run) when every run passed
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KVR_VENV:-$root/.venv}"
kvr="$venv/bin/kvretention"
[[ -x "$kvr" ]] || kvr="$(command -v kvretention || true)"
[[ -n "$kvr" ]] || { echo "cold-start-check: no kvretention; run make bootstrap" >&2; exit 2; }

runs=5 load=0 keep=0 demo=0 up_args=()
while (($#)); do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --load)
      if [[ "${2:-}" =~ ^[0-9]+$ ]]; then load="$2"; shift 2; else load=2; shift; fi ;;
    --real-node) up_args+=(--real-node); shift ;;
    --timeout) up_args+=(--timeout "$2"); shift 2 ;;
    --keep) keep=1; shift ;;
    --demo) demo=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cold-start-check: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done

log() { printf '[cold-start %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/kvr-cold-start.XXXXXX")"
busy=()
state=""
cleanup() {
  if [[ -n "$state" ]]; then "$kvr" cluster down --state-dir "$state" >/dev/null 2>&1 || true; fi
  local pid
  for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${busy[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for ((i = 0; i < load; i++)); do
  (while :; do :; done) &
  busy+=("$!")
done

# One demo run: clone, `make demo`, `make demo-down`; the clone's own venv is built by `make demo`.
demo_run() { # $1 = clone dir, $2 = log
  git clone --quiet "$root" "$1" >>"$2" 2>&1 \
    && make -C "$1" demo >>"$2" 2>&1 \
    && make -C "$1" demo-down >>"$2" 2>&1
}

ok=0 failed=0 times=()
if ((demo)); then
  for ((run = 1; run <= runs; run++)); do
    out="$work/run-$run.log"
    began=$SECONDS
    if demo_run "$work/run-$run" "$out"; then
      ok=$((ok + 1)) && times+=("$((SECONDS - began))")
      log "run $run/$runs: make demo and demo-down ok in ${times[-1]}s"
    else
      failed=$((failed + 1))
      log "run $run/$runs: FAILED after $((SECONDS - began))s ($out):"
      tail -n 30 "$out" >&2
      make -C "$work/run-$run" demo-down >>"$out" 2>&1 || true
    fi
  done
  runs=0 # the cluster loop below has nothing left to do
fi
for ((run = 1; run <= runs; run++)); do
  state="$work/run-$run"
  out="$work/run-$run.log"
  began=$SECONDS
  if "$kvr" cluster up --state-dir "$state" "${up_args[@]}" >"$out" 2>&1; then
    times+=("$((SECONDS - began))")
    if "$kvr" cluster down --state-dir "$state" >>"$out" 2>&1; then
      ok=$((ok + 1))
      log "run $run/$runs: up in ${times[-1]}s, down ok"
    else
      failed=$((failed + 1))
      log "run $run/$runs: up in ${times[-1]}s, DOWN FAILED ($out):"
      tail -n 20 "$out" >&2
    fi
  else
    failed=$((failed + 1))
    log "run $run/$runs: UP FAILED after $((SECONDS - began))s ($out):"
    tail -n 20 "$out" >&2
    "$kvr" cluster down --state-dir "$state" >>"$out" 2>&1 || true
  fi
  state=""
done

slowest=0
for t in "${times[@]}"; do ((t > slowest)) && slowest=$t; done
kind=kwok
[[ " ${up_args[*]} " == *" --real-node "* ]] && kind="real node"
((demo)) && kind="make demo from a clean clone"
logs="logs in $work"
if ((failed == 0 && keep == 0)); then rm -rf "$work" && logs="logs removed"; fi
echo "cold-start-check: $ok/$((ok + failed)) ok, $failed failed ($kind, $load busy loops on $(nproc) CPUs;" \
  "slowest ${slowest}s; $logs)"
((failed == 0))

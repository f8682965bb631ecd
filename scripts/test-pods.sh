#!/usr/bin/env bash
# The pods tier (tests/pods: a real node on this machine, every pod a real process), as `make test`
# runs it after the other tiers and `make test-pods` runs it alone. A pytest run of its own: while
# the node is up the host has its iptables chains (KUBE-FIREWALL drops non-loopback sources to
# 127/8) and sysctls, which must not overlap another tier; teardown restores the host and checks it.
#
# First it checks the machine can run a node at all (root, capabilities, cgroup v1, bridge
# netfilter, network namespaces, iptables nat); where it cannot it prints each reason and skips
# (exit 0), or fails with CI set (CI=true: a CI machine that cannot run the tier is a broken CI).
# Then it installs the missing Debian packages, builds the node binaries and the images (each
# cached: ~/.cache/kvretention) and runs the tier holding $KVR_REALNODE_LOCK (one node a machine).
#
# Usage: scripts/test-pods.sh [pytest args]
#        scripts/test-pods.sh --prepare   (the checks, packages, binaries and images only: what
#                                          scripts/test.sh runs beside the other tiers)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KVR_VENV:-$root/.venv}"
lock="${KVR_REALNODE_LOCK:-/tmp/kvr-realnode.lock}"

log() { printf '[test-pods %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
in_ci() { [[ -n "${CI:-}" && "${CI}" != false && "${CI}" != 0 ]]; }

cd "$root"
preflight=0
check='import sys; from kvretention_devtools.localcluster.realnode.preflight import main; sys.exit(main())'
problems="$("$venv/bin/python" -c "$check")" || preflight=$?
if ((preflight != 0 && preflight != 3)); then
  log "FAILED: the preflight itself failed (exit $preflight): $venv/bin/python -c '$check'"
  exit 1
fi
if ((preflight == 3)); then
  if in_ci; then
    log "FAILED: CI is set and this machine cannot run the pods tier (a real node):"
    printf '%s\n' "$problems" >&2
    exit 1
  fi
  log "SKIPPED the pods tier: this machine cannot run a real node:"
  printf '%s\n' "$problems" >&2
  exit 0
fi

start=$SECONDS
scripts/install-node.sh
scripts/build-node.sh >/dev/null
scripts/build-images.sh >/dev/null
log "node binaries and images ready in $((SECONDS - start))s"
[[ "${1:-}" == --prepare ]] && exit 0
start=$SECONDS
# Under `flock $lock make test-pods` the lock is held already (its fd inherited): locking again
# from here would wait for ourselves.
held=()
for fd in /proc/$$/fd/*; do
  [[ "$(readlink "$fd")" == "$(realpath -m "$lock")" ]] && held=(env) && break
done
((${#held[@]})) || held=(flock "$lock")
rc=0
"${held[@]}" env KVR_PODS_TIER=1 "$venv/bin/pytest" -q tests/pods "$@" || rc=$?
log "pods tier: exit $rc in $((SECONDS - start))s"
exit "$rc"

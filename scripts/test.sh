#!/usr/bin/env bash
# `make test`'s tiers: every tier but pods in one pytest run, then the pods tier in a run of its own
# (scripts/test-pods.sh: a real node, whose host changes must not overlap another tier).
#
# The pods tier's preparation (checks, Debian packages, node binaries, images; each cached) runs
# beside the pytest run, at the lowest CPU and I/O priority: after a source edit it rebuilds the
# worker image (minutes of buildah copying layers, mostly disk), which would otherwise start only
# once pytest is done. Its output is printed when it ends; a failed preparation fails the run.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KVR_VENV:-$root/.venv}"
cd "$root"
log() { printf '[test %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

prep_log="$(mktemp -t kvr-pods-prepare.XXXXXX)"
trap 'rm -f "$prep_log"' EXIT
nice -n 19 ionice -c 3 scripts/test-pods.sh --prepare >"$prep_log" 2>&1 &
prep=$!
log "preparing the pods tier beside pytest (pid $prep)"

# Two pytest workers (pytest-xdist), each taking whole test files: most of the suite waits on real
# processes (control planes, engines, masters, CLIs), so a second worker uses the idle core. Each
# worker starts its own control plane when a file of its asks for one. KVR_TEST_WORKERS=0 runs in
# one process.
workers="${KVR_TEST_WORKERS:-2}"
rc=0
"$venv/bin/pytest" -q -n "$workers" --dist loadfile || rc=$?
prep_rc=0
wait "$prep" || prep_rc=$?
log "pods tier preparation (exit $prep_rc):"
cat "$prep_log" >&2
((rc == 0)) || exit "$rc"
((prep_rc == 0)) || exit "$prep_rc"
exec scripts/test-pods.sh

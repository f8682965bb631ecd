#!/usr/bin/env bash
# Re-run the real-clients tier (tests/clients) with npm's latest Claude Code and Codex, next to
# the pinned releases, and report what changed: versions, new body fields and headers, fields the
# frontend now ignores, refusals. Exits non-zero when the latest releases are not served.
#
# usage: scripts/clients-latest.sh        (make clients-latest)
# Env:   KVR_CLIENTS_OUT (default build/clients-latest): the reports and pytest logs.
set -uo pipefail
cd "$(dirname "$0")/.."

out="${KVR_CLIENTS_OUT:-build/clients-latest}"
mkdir -p "$out"
rm -f "$out"/report-*.json

for which in pinned latest; do
  echo "[clients-latest] the real-clients tier with the $which releases (log: $out/pytest-$which.log)" >&2
  KVR_CLIENTS="$which" KVR_CLIENTS_REPORT="$out/report-$which.json" \
    .venv/bin/pytest -q -p no:cacheprovider tests/clients >"$out/pytest-$which.log" 2>&1
  echo "[clients-latest]   $(tail -n 1 "$out/pytest-$which.log")" >&2
done

[ -e "$out/report-latest.json" ] || { echo "[clients-latest] no report: see $out/pytest-latest.log" >&2; exit 1; }
.venv/bin/python tests/clients/report.py "$out/report-pinned.json" "$out/report-latest.json"
status=$?
grep -q " passed" "$out/pytest-latest.log" && ! grep -qE " (failed|error)" "$out/pytest-latest.log" || status=1
exit $status

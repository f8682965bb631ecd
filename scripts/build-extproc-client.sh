#!/usr/bin/env bash
# Build (or reuse) devtools/extproc-client: an Envoy ext_proc client on go-control-plane's generated
# types that stands in for Envoy against the router's endpoint picker (no Envoy binary is
# installable here). Cached outside the repo keyed by the go-control-plane version and a hash of
# devtools/extproc-client (scripts/lib/go-cache.sh); tests/dataplane builds it on first use.
#
# Usage: scripts/build-extproc-client.sh          # progress on stderr, the output dir last on stdout
#        scripts/build-extproc-client.sh --check  # print the dir if complete, else exit 3 (no build)
# Env:   KVR_CACHE       cache root (default ~/.cache/kvretention)
#        KVR_BUILD_NICE  nice level for go build (default 10)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../devtools/extproc-client/versions.env
source "$root/devtools/extproc-client/versions.env"
# shellcheck source=lib/go-cache.sh
source "$root/scripts/lib/go-cache.sh"

have_all() { [[ -x "$out/extproc-client" ]]; }

go_cache_open build-extproc-client devtools/extproc-client extproc-client \
  "$ENVOY_CONTROL_PLANE_VERSION" "$@"
(cd "$hack" && go mod download)
go_cache_build "$hack" "" .
go_cache_close

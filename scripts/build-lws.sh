#!/usr/bin/env bash
# Build (or reuse) the LeaderWorkerSet controller (sigs.k8s.io/lws) for the local plane, with the
# CRD of the same release beside it. Multinode fleets render LeaderWorkerSets; the local plane runs
# this controller as a process so they reconcile for real. Built from the pinned wrapper module
# hack/lws into a cache outside the repo, keyed by the LWS version and a hash of hack/lws, apart
# from scripts/build-kube.sh's cache so neither build invalidates the other.
#
# Usage: scripts/build-lws.sh            # prints progress on stderr, the output dir last on stdout
#        scripts/build-lws.sh --check    # print the dir if complete, else exit 3 (no build)
# Env:   KVR_CACHE       cache root (default ~/.cache/kvretention)
#        KVR_BUILD_NICE  nice level for go build (default 10)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
hack="$root/hack/lws"
# shellcheck source=../hack/lws/versions.env
source "$hack/versions.env"
cache="${KVR_CACHE:-$HOME/.cache/kvretention}"
nice_level="${KVR_BUILD_NICE:-10}"

log() { printf '[build-lws %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

hash_inputs() {
  (cd "$root" && find hack/lws -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) |
    sha256sum | cut -c1-12
}

command -v go >/dev/null || { log "error: go is not on PATH (need Go >= 1.26)"; exit 1; }

out="$cache/lws/$LWS_VERSION-$(hash_inputs)"
have_all() { [[ -x "$out/lws-controller-manager" && -f "$out/crds.yaml" ]]; }

if have_all; then
  [[ "${1:-}" == --check ]] || log "reusing $out"
  echo "$out"
  exit 0
fi
if [[ "${1:-}" == --check ]]; then
  log "not built yet: $out (run scripts/build-lws.sh)"
  exit 3
fi

mkdir -p "$out"
exec 9>"$cache/lws/.lock"
if ! flock -n 9; then
  log "another build holds $cache/lws/.lock; waiting for it"
  flock 9
fi
if have_all; then
  log "reusing $out (built by the other caller)"
  echo "$out"
  exit 0
fi
stage="$(mktemp -d "$cache/lws/.stage.XXXXXX")"
trap 'rm -rf "$stage"' EXIT

export CGO_ENABLED=0 GOFLAGS=-mod=readonly
start=$SECONDS
log "cold build of sigs.k8s.io/lws $LWS_VERSION into $out"
(cd "$hack" && go mod download sigs.k8s.io/lws)
(cd "$hack" && nice -n "$nice_level" go build -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION -X sigs.k8s.io/lws/pkg/version.GitCommit=" \
  -o "$stage/lws-controller-manager" sigs.k8s.io/lws/cmd)
mod_dir="$(cd "$hack" && go list -m -f '{{.Dir}}' sigs.k8s.io/lws)"
cat "$mod_dir/config/crd/bases/"*.yaml >"$stage/crds.yaml"
for f in "$stage"/*; do mv -f "$f" "$out/"; done
have_all || { log "error: build finished but files are missing in $out"; exit 1; }
log "done in $((SECONDS - start))s"
echo "$out"

#!/usr/bin/env bash
# Build (or reuse) the LeaderWorkerSet controller (sigs.k8s.io/lws) for the local plane, with the
# CRD of the same release beside it. Multinode fleets render LeaderWorkerSets; the local plane runs
# this controller as a process so they reconcile for real. Built from the pinned wrapper module
# hack/lws into a cache outside the repo, keyed by the LWS version and a hash of hack/lws, apart
# from scripts/build-kube.sh's cache so neither build invalidates the other (scripts/lib/go-cache.sh).
#
# Usage: scripts/build-lws.sh            # prints progress on stderr, the output dir last on stdout
#        scripts/build-lws.sh --check    # print the dir if complete, else exit 3 (no build)
# Env:   KVR_CACHE       cache root (default ~/.cache/kvretention)
#        KVR_BUILD_NICE  nice level for go build (default 10)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../hack/lws/versions.env
source "$root/hack/lws/versions.env"
# shellcheck source=lib/go-cache.sh
source "$root/scripts/lib/go-cache.sh"

have_all() { [[ -x "$out/lws-controller-manager" && -f "$out/crds.yaml" ]]; }

go_cache_open build-lws hack/lws lws "$LWS_VERSION" "$@"
(cd "$hack" && go mod download sigs.k8s.io/lws)
go_cache_build "$hack" \
  "-X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION -X sigs.k8s.io/lws/pkg/version.GitCommit=" \
  sigs.k8s.io/lws/cmd
mv "$stage/cmd" "$stage/lws-controller-manager"
mod_dir="$(cd "$hack" && go list -m -f '{{.Dir}}' sigs.k8s.io/lws)"
cat "$mod_dir/config/crd/bases/"*.yaml >"$stage/crds.yaml"
go_cache_close

#!/usr/bin/env bash
# Build (or reuse) the real node's binaries: kubelet, kube-proxy and CoreDNS, for
# `kvretention cluster up --real-node` and the pods tier. Like scripts/build-kube.sh they are
# compiled from pinned wrapper modules (hack/node/) into a cache outside the repo, but keyed by
# their own version and a hash of hack/node only, so the control plane's cached binaries (and
# CI's warm cache of them) stay valid. Cold: about 10-15 minutes on 2 cores; warm: instant.
#
# Usage: scripts/build-node.sh            # progress on stderr, the bin dir last on stdout
#        scripts/build-node.sh --check    # print the bin dir if complete, else exit 3 (no build)
# Env:   KVR_CACHE   cache root (default ~/.cache/kvretention)
#        KVR_BUILD_NICE  nice level for go build (default 10)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../hack/node/versions.env
source "$root/hack/node/versions.env"
# shellcheck source=lib/go-cache.sh
source "$root/scripts/lib/go-cache.sh"

have_all() {
  local b
  for b in kubelet kube-proxy coredns; do [[ -x "$out/$b" ]] || return 1; done
}

go_cache_open build-node hack/node node-bin "$KUBE_VERSION" "$@"
for d in kubernetes coredns; do (cd "$hack/$d" && go mod download); done
if [[ ! -x "$out/coredns" ]]; then go_cache_build "$hack/coredns" "" github.com/coredns/coredns; fi
kube=()
for b in kubelet kube-proxy; do
  [[ -x "$out/$b" ]] || kube+=("k8s.io/kubernetes/cmd/$b")
done
if ((${#kube[@]})); then go_cache_build "$hack/kubernetes" "$(kube_ldflags)" "${kube[@]}"; fi
go_cache_close
log "$("$out/kubelet" --version), coredns $COREDNS_VERSION"

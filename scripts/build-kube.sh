#!/usr/bin/env bash
# Build (or reuse) the local control-plane binaries: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, kwok and helm. No registry ships them, so they are compiled
# from the pinned wrapper modules under hack/kube/ into a cache outside the repo, keyed by the
# Kubernetes version and a hash of hack/kube, so a second run is instant (scripts/lib/go-cache.sh).
#
# Usage: scripts/build-kube.sh            # prints progress on stderr, the bin dir last on stdout
#        scripts/build-kube.sh --check    # print the bin dir if complete, else exit 3 (no build)
# Env:   KVR_CACHE   cache root (default ~/.cache/kvretention)
#        KVR_BUILD_NICE  nice level for go build (default 10)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../hack/kube/versions.env
source "$root/hack/kube/versions.env"
# shellcheck source=lib/go-cache.sh
source "$root/scripts/lib/go-cache.sh"

all=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok helm)
have_all() {
  local b
  for b in "${all[@]}"; do [[ -x "$out/$b" ]] || return 1; done
  [[ -f "$out/kwok-stages.yaml" ]]
}
need() { [[ ! -x "$out/$1" ]]; } # need <binary>: true when it is missing from the cache

go_cache_open build-kube hack/kube bin "$KUBE_VERSION" "$@"
log "downloading modules"
for d in kubernetes etcd kwok helm; do
  (cd "$hack/$d" && go mod download)
done
if need etcd; then
  go_cache_build "$hack/etcd" "" go.etcd.io/etcd/server/v3
  mv "$stage/server" "$stage/etcd"
fi
if need kwok; then go_cache_build "$hack/kwok" "" sigs.k8s.io/kwok/cmd/kwok; fi
# kwok has no built-in stages: ship the "fast" node and pod stages of the same kwok release, which
# make a managed Node Ready (heartbeat via Lease) and every scheduled Pod Running and Ready.
kwok_dir="$(cd "$hack/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  echo "---"
  cat "$kwok_dir/$f"
done >"$stage/kwok-stages.yaml"
if need helm; then
  go_cache_build "$hack/helm" "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    helm.sh/helm/v3/cmd/helm
fi
kube=()
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  if need "$b"; then kube+=("k8s.io/kubernetes/cmd/$b"); fi
done
if ((${#kube[@]})); then go_cache_build "$hack/kubernetes" "$(kube_ldflags)" "${kube[@]}"; fi
go_cache_close
log "$("$out/kube-apiserver" --version), etcd $ETCD_VERSION"

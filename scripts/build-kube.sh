#!/usr/bin/env bash
# Build (or reuse) the local control-plane binaries: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, kwok and helm. No registry ships them, so they are compiled
# from the pinned wrapper modules under hack/kube/ into a cache outside the repo, keyed by the
# Kubernetes version and a hash of hack/kube, so a second run is instant.
#
# Usage: scripts/build-kube.sh            # prints progress on stderr, the bin dir last on stdout
#        scripts/build-kube.sh --check    # print the bin dir if complete, else exit 3 (no build)
# Env:   KVR_CACHE   cache root (default ~/.cache/kvretention)
#        KVR_BUILD_NICE  nice level for go build (default 10)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
hack="$root/hack/kube"
# shellcheck source=../hack/kube/versions.env
source "$hack/versions.env"
cache="${KVR_CACHE:-$HOME/.cache/kvretention}"
nice_level="${KVR_BUILD_NICE:-10}"

log() { printf '[build-kube %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

hash_inputs() {
  # The wrapper modules and versions.env decide the binaries' content.
  (cd "$root" && find hack/kube -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) |
    sha256sum | cut -c1-12
}

command -v go >/dev/null || { log "error: go is not on PATH (need Go >= 1.26)"; exit 1; }

bin="$cache/bin/$KUBE_VERSION-$(hash_inputs)"
all=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok helm)

have_all() {
  local b
  for b in "${all[@]}"; do [[ -x "$bin/$b" ]] || return 1; done
  [[ -f "$bin/kwok-stages.yaml" ]]
}

if have_all; then
  [[ "${1:-}" == --check ]] || log "reusing $bin"
  echo "$bin"
  exit 0
fi
if [[ "${1:-}" == --check ]]; then
  log "not built yet: $bin (run scripts/build-kube.sh)"
  exit 3
fi

mkdir -p "$bin"
# One build at a time per cache: a second caller waits, then finds the binaries and reuses them.
exec 9>"$cache/bin/.lock"
if ! flock -n 9; then
  log "another build holds $cache/bin/.lock; waiting for it"
  flock 9
fi
if have_all; then
  log "reusing $bin (built by the other caller)"
  echo "$bin"
  exit 0
fi
stage="$(mktemp -d "$cache/bin/.stage.XXXXXX")"
trap 'rm -rf "$stage"' EXIT

# Static, stripped, path-independent binaries; -mod=readonly trusts only the committed go.sum.
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
build() { # build <module dir> <ldflags> <packages...>
  local dir="$1" ldflags="$2"
  shift 2
  local start=$SECONDS
  log "building $* (module hack/kube/$(basename "$dir"))"
  (cd "$dir" && nice -n "$nice_level" go build -trimpath -ldflags "-s -w $ldflags" -o "$stage/" "$@")
  log "built $(basename "$dir") in $((SECONDS - start))s"
}

kube_ldflags() {
  # Mirrors hack/lib/version.sh so --version reports the real release.
  local minor="${KUBE_VERSION#v1.}" pkg flags=""
  minor="${minor%%.*}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitCommit= -X $pkg.gitTreeState=clean -X $pkg.buildDate=$KUBE_BUILD_DATE"
  done
  echo "$flags"
}

need() { # need <binary>: true when it is missing from the cache
  [[ ! -x "$bin/$1" ]]
}

total=$SECONDS
log "cold build into $bin (2 cores take a while; set KVR_BUILD_NICE to change priority)"
log "downloading modules"
for d in kubernetes etcd kwok helm; do
  (cd "$hack/$d" && go mod download)
done
if need etcd; then
  build "$hack/etcd" "" go.etcd.io/etcd/server/v3
  mv "$stage/server" "$stage/etcd"
fi
if need kwok; then build "$hack/kwok" "" sigs.k8s.io/kwok/cmd/kwok; fi
# kwok has no built-in stages: ship the "fast" node and pod stages of the same kwok release, which
# make a managed Node Ready (heartbeat via Lease) and every scheduled Pod Running and Ready.
kwok_dir="$(cd "$hack/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  echo "---"
  cat "$kwok_dir/$f"
done >"$stage/kwok-stages.yaml"
if need helm; then
  build "$hack/helm" "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" helm.sh/helm/v3/cmd/helm
fi
kube=()
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  if need "$b"; then kube+=("k8s.io/kubernetes/cmd/$b"); fi
done
if ((${#kube[@]})); then build "$hack/kubernetes" "$(kube_ldflags)" "${kube[@]}"; fi

# Move finished binaries in only now, so an interrupted build never leaves a half-written one.
for f in "$stage"/*; do mv -f "$f" "$bin/"; done
have_all || { log "error: build finished but binaries are missing in $bin"; exit 1; }
log "done in $((SECONDS - total))s: $("$bin/kube-apiserver" --version), etcd $ETCD_VERSION"
echo "$bin"

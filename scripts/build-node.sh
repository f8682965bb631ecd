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
hack="$root/hack/node"
# shellcheck source=../hack/node/versions.env
source "$hack/versions.env"
cache="${KVR_CACHE:-$HOME/.cache/kvretention}"
nice_level="${KVR_BUILD_NICE:-10}"

log() { printf '[build-node %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

hash_inputs() {
  (cd "$root" && find hack/node -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) |
    sha256sum | cut -c1-12
}

bin="$cache/node-bin/$KUBE_VERSION-$(hash_inputs)"
all=(kubelet kube-proxy coredns)

have_all() {
  local b
  for b in "${all[@]}"; do [[ -x "$bin/$b" ]] || return 1; done
}

if have_all; then
  [[ "${1:-}" == --check ]] || log "reusing $bin"
  echo "$bin"
  exit 0
fi
if [[ "${1:-}" == --check ]]; then
  log "not built yet: $bin (run scripts/build-node.sh)"
  exit 3
fi
command -v go >/dev/null || { log "error: go is not on PATH (need Go >= 1.26)"; exit 1; }

mkdir -p "$bin"
exec 9>"$cache/node-bin/.lock"
if ! flock -n 9; then
  log "another build holds $cache/node-bin/.lock; waiting for it"
  flock 9
fi
if have_all; then
  log "reusing $bin (built by the other caller)"
  echo "$bin"
  exit 0
fi
stage="$(mktemp -d "$cache/node-bin/.stage.XXXXXX")"
trap 'rm -rf "$stage"' EXIT

export CGO_ENABLED=0 GOFLAGS=-mod=readonly
build() { # build <module dir> <ldflags> <packages...>
  local dir="$1" ldflags="$2"
  shift 2
  local start=$SECONDS
  log "building $* (module hack/node/$(basename "$dir"))"
  (cd "$dir" && nice -n "$nice_level" go build -trimpath -ldflags "-s -w $ldflags" -o "$stage/" "$@")
  log "built $(basename "$dir") in $((SECONDS - start))s"
}

kube_ldflags() {
  local minor="${KUBE_VERSION#v1.}" pkg flags=""
  minor="${minor%%.*}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitCommit= -X $pkg.gitTreeState=clean -X $pkg.buildDate=$KUBE_BUILD_DATE"
  done
  echo "$flags"
}

total=$SECONDS
log "cold build into $bin (2 cores take a while)"
for d in kubernetes coredns; do (cd "$hack/$d" && go mod download); done
if [[ ! -x "$bin/coredns" ]]; then build "$hack/coredns" "" github.com/coredns/coredns; fi
kube=()
for b in kubelet kube-proxy; do
  [[ -x "$bin/$b" ]] || kube+=("k8s.io/kubernetes/cmd/$b")
done
if ((${#kube[@]})); then build "$hack/kubernetes" "$(kube_ldflags)" "${kube[@]}"; fi

for f in "$stage"/*; do mv -f "$f" "$bin/"; done
have_all || { log "error: build finished but binaries are missing in $bin"; exit 1; }
log "done in $((SECONDS - total))s: $("$bin/kubelet" --version), coredns $COREDNS_VERSION"
echo "$bin"

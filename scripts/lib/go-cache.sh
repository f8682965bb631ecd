# shellcheck shell=bash
# Shared steps of scripts/build-{kube,lws,node}.sh: compile pinned Go wrapper modules (hack/<name>/)
# into a cache outside the repo, keyed by a version and a hash of the module's folder, so a second
# run is instant and one cache's key never moves when another's inputs change.
#
# A caller sets `root`, sources this file, defines `have_all` (true when "$out" is complete), then:
#   go_cache_open <tag> <hack/name> <cache subfolder> <version> "$@"   # sets out, hack, stage
#   go_cache_build <module dir> <ldflags> <packages...>                 # into "$stage"
#   go_cache_close                                                      # moves "$stage" into "$out"
# Env: KVR_CACHE (default ~/.cache/kvretention), KVR_BUILD_NICE (default 10).

# shellcheck source=reuse.sh
source "$(dirname "${BASH_SOURCE[0]}")/reuse.sh"

cache="${KVR_CACHE:-$HOME/.cache/kvretention}"
nice_level="${KVR_BUILD_NICE:-10}"
go_cache_tag=go-cache
go_cache_started=$SECONDS

log() { printf '[%s %s] %s\n' "$go_cache_tag" "$(date +%H:%M:%S)" "$*" >&2; }

go_cache_hash() { # go_cache_hash <hack/name>: the key part that follows the module's own files
  (cd "$root" && find "$1" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) |
    sha256sum | cut -c1-12
}

# Reuse the cached output (print it and exit 0), answer --check, or take the cache's lock and
# open an empty stage for a cold build. An interrupted build never leaves a half-written output.
go_cache_open() { # go_cache_open <tag> <hack/name> <cache subfolder> <version> [--check]
  go_cache_tag="$1"
  hack="$root/$2"
  local dir="$cache/$3"
  out="$dir/$4-$(go_cache_hash "$2")"
  reuse_or_check have_all "$out" "build-${go_cache_tag#build-}.sh" "${5:-}"
  command -v go >/dev/null || { log "error: go is not on PATH (need Go >= 1.26)"; exit 1; }
  mkdir -p "$out"
  # One build at a time per cache: a second caller waits, then finds the output and reuses it.
  exec 9>"$dir/.lock"
  if ! flock -n 9; then
    log "another build holds $dir/.lock; waiting for it"
    flock 9
  fi
  if have_all; then
    log "reusing $out (built by the other caller)"
    echo "$out"
    exit 0
  fi
  stage="$(mktemp -d "$dir/.stage.XXXXXX")"
  trap 'rm -rf "$stage"' EXIT
  # Static, stripped, path-independent binaries; -mod=readonly trusts only the committed go.sum.
  export CGO_ENABLED=0 GOFLAGS=-mod=readonly
  go_cache_started=$SECONDS
  log "cold build into $out (2 cores take a while; set KVR_BUILD_NICE to change priority)"
}

go_cache_build() { # go_cache_build <module dir> <ldflags> <packages...>
  local dir="$1" ldflags="$2"
  shift 2
  local start=$SECONDS
  log "building $* (module ${dir#"$root"/})"
  (cd "$dir" && nice -n "$nice_level" go build -trimpath -ldflags "-s -w $ldflags" -o "$stage/" "$@")
  log "built $(basename "$dir") in $((SECONDS - start))s"
}

go_cache_close() { # go_cache_close: moves the stage in, says how long it took, prints "$out"
  local f
  for f in "$stage"/*; do mv -f "$f" "$out/"; done
  have_all || { log "error: build finished but files are missing in $out"; exit 1; }
  log "done in $((SECONDS - go_cache_started))s"
  echo "$out"
}

kube_ldflags() { # mirrors Kubernetes' hack/lib/version.sh so --version reports the real release
  local minor="${KUBE_VERSION#v1.}" pkg flags=""
  minor="${minor%%.*}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitCommit= -X $pkg.gitTreeState=clean -X $pkg.buildDate=$KUBE_BUILD_DATE"
  done
  echo "$flags"
}

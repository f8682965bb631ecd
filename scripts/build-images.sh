#!/usr/bin/env bash
# Build (or reuse) the images a real local node runs (`kvretention cluster up --real-node`, the
# pods tier): pause (the pod sandbox), operator, runtime (frontend/router) and the CPU worker
# (SGLang's real engine on CPU with the project's tiny model: images/worker/Dockerfile, ENGINE=cpu).
# With buildah (vfs storage, --network none) from the repo's Dockerfiles on a local Debian bookworm
# base made with debootstrap, and pip wheels prepared here (the build itself is offline). Each
# image is written as a docker-archive that containerd imports, all cached outside the repo
# (~/.cache/kvretention/images) keyed by a hash of what goes in, so a second run is instant. The CPU
# worker is built on its own dependency image (the Dockerfile's cpu-deps stage: torch and its
# nvidia-* wheels, SGLang, Mooncake, the tiny model; ~4 GB), kept in buildah's storage and keyed
# only by what goes into it, so an edit to operator/ rebuilds just the package layer on top.
#
# Usage: scripts/build-images.sh           # progress on stderr, the cache dir last on stdout
#        scripts/build-images.sh --check   # print the cache dir if every image is built, else exit 3
#        scripts/build-images.sh --deps-files  # the files the CPU worker's dependency image is keyed on
# The cache dir holds images.json: {"pause": {"ref": ..., "archive": ...}, "operator": ..., ...}.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${KVR_CACHE:-$HOME/.cache/kvretention}/images"
venv="${KVR_VENV:-$root/.venv}"
suite=bookworm
mirror="${KVR_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# python3-venv: the images' virtualenvs; libibverbs1, libcurl4, libnuma1: mooncake_master (the
# CPU worker image runs the managed Mooncake master); ibverbs-providers: libmlx5, which
# Mooncake's store client links (the pods tier's store round trip); ca-certificates: TLS.
base_packages=python3,python3-venv,python-is-python3,libibverbs1,ibverbs-providers,libcurl4,libnuma1,ca-certificates
base_ref=localhost/kvretention/python:3.11.11-slim-bookworm
k8s_version=$(sed -n 's/^KUBE_VERSION=//p' "$root/hack/node/versions.env")
bflags=(--root "$cache/buildah/root" --runroot "$cache/buildah/run" --storage-driver vfs)

log() { printf '[build-images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
# shellcheck source=lib/reuse.sh
source "$root/scripts/lib/reuse.sh"
sha() { sha256sum | cut -c1-12; }
files_hash() { # the content of the given paths (tracked or new, not ignored) and their names
  (cd "$root" && git ls-files -co --exclude-standard -z -- "$@" | LC_ALL=C sort -z |
    xargs -0 sha256sum) | sha
}

worker_dockerfile="$root/images/worker/Dockerfile"
deps_stage=$(sed -n '/ AS cpu-deps$/,/^# Stage 2/p' "$worker_dockerfile")
mapfile -t deps_files < <(awk '$1 == "COPY" { for (i = 2; i < NF; i++) if ($i !~ /^--/ && $i != "pyproject.toml") print $i }' <<<"$deps_stage")
if [[ "${1:-}" == --deps-files ]]; then  # what the dependency image is keyed on (tests read it)
  printf '%s\n' "${deps_files[@]}"
  exit 0
fi

base_key=$(printf '%s\n' "$suite" "$base_packages" "$(sed -n '/^# --- base/,/^# --- end base/p' "$0")" | sha)
pause_src="$(go env GOMODCACHE 2>/dev/null)/k8s.io/kubernetes@$k8s_version/build/pause/linux/pause.c"
# The pause source comes from Go's module cache (filled when the node binaries were built); a
# cleaned cache beside cached node binaries would otherwise key and build pause from nothing.
if [[ ! -f "$pause_src" && "${1:-}" != --check ]]; then
  log "fetching k8s.io/kubernetes@$k8s_version into Go's module cache (the pause source)"
  (cd / && go mod download "k8s.io/kubernetes@$k8s_version") >&2
fi
pause_key=$( { cat "$pause_src" 2>/dev/null; gcc --version 2>/dev/null | head -1; } | sha)
# The CPU worker's whole dependency set (the [cpu-engine] extra, ~3 GB of wheels with torch's
# nvidia-* ones); the operator and runtime images take the package's own dependencies from it.
wheel_reqs=(setuptools'>=77' '.[cpu-engine]' 'jinja2==3.1.6')
nodeps_reqs=('sglang==0.5.23' 'mooncake-transfer-engine==0.3.13.post1')
# What pip reads of pyproject.toml for an image (its [build-system] and [project] tables, less the
# [dev] extra no image installs): a tool setting or a dev tool (pytest, its plugins, ruff, mypy)
# never rebuilds the wheelhouse or the dependency image.
project_tables() {
  local py="$venv/bin/python"
  [[ -x "$py" ]] || py=python3
  "$py" -c 'import json, sys, tomllib
doc = tomllib.load(open(sys.argv[1], "rb"))
doc.get("project", {}).get("optional-dependencies", {}).pop("dev", None)
print(json.dumps({k: doc.get(k) for k in ("build-system", "project")}, sort_keys=True))' "$root/pyproject.toml"
}
wheels_key=$( { project_tables; printf '%s\n' "${wheel_reqs[@]}" "${nodeps_reqs[@]}"; } | sha)
# README.md goes into the wheel's metadata only: an edit to it does not rebuild the images.
src_key=$(files_hash pyproject.toml operator)
# The CPU worker image carries the TEST-ONLY libcuda stand-in (and PyPI's libcudart) so a real
# Mooncake store client loads in its pods (the pods tier's store round trip); its own cached build.
if [[ "${1:-}" == --check ]]; then
  cuda_standin=$("$root/scripts/build-cuda-standin.sh" --check 2>/dev/null) || {
    log "not built yet: the libcuda stand-in (run scripts/build-images.sh)"
    exit 3
  }
else
  cuda_standin=$(KVR_VENV="$venv" "$root/scripts/build-cuda-standin.sh")
fi
cuda_key=$(cat "$cuda_standin/libcuda.so.1" "$cuda_standin/libcudart.so.12" | sha)
# The CPU worker's dependency image: only what its Dockerfile stage reads, the stage itself, the
# wheelhouse and the libcuda stand-in. The files are the stage's own COPY sources, so the key
# cannot drift from the stage (pyproject.toml counts by the tables pip reads, as for the wheels):
# an edit to any other file of the package never rebuilds the ~4 GB image.
deps_key=$( {
  echo "$base_key $wheels_key $cuda_key"
  project_tables
  files_hash "${deps_files[@]}"
  echo "$deps_stage"
} | sha)
deps_ref=localhost/kvretention/worker-cpu-deps:$deps_key
declare -A keys=(
  [pause]=$pause_key
  [operator]=$( { echo "$base_key $wheels_key $src_key"; cat "$root/images/operator/Dockerfile"; } | sha)
  [runtime]=$( { echo "$base_key $wheels_key $src_key"; cat "$root/images/runtime/Dockerfile"; } | sha)
  [worker]=$( { echo "$deps_key $src_key"; cat "$worker_dockerfile"; } | sha)
)
declare -A repos=(
  [pause]=localhost/kvretention/pause
  [operator]=localhost/kvretention/operator
  [runtime]=localhost/kvretention/kvretention
  [worker]=localhost/kvretention/worker-cpu
)
names=(pause operator runtime worker)
archive() { echo "$cache/$1-${keys[$1]}.tar"; }

write_list() {
  local name sep="" out="{"
  for name in "${names[@]}"; do
    out+="$sep\"$name\": {\"ref\": \"${repos[$name]}:${keys[$name]}\", \"archive\": \"$(archive "$name")\"}"
    sep=", "
  done
  echo "$out}" >"$cache/images.json.tmp"
  mv "$cache/images.json.tmp" "$cache/images.json"
}

have_all() {
  local name
  for name in "${names[@]}"; do [[ -s "$(archive "$name")" ]] || return 1; done
}

listed() { have_all && write_list; }

mkdir -p "$cache"
reuse_or_check listed "$cache" build-images.sh "${1:-}"
for cmd in buildah debootstrap gcc go; do
  command -v "$cmd" >/dev/null || { log "error: $cmd is missing (scripts/install-node.sh)"; exit 1; }
done
[[ -x "$venv/bin/pip" ]] || { log "error: no $venv (make bootstrap)"; exit 1; }
exec 9>"$cache/.lock"
flock 9
total=$SECONDS

# --- disk: a build that runs out of space fails after many minutes, so say so before it starts ---
# GiB each missing piece takes while it is built (measured: wheels 3.1, the dependency image 6.9
# in buildah's vfs storage and as much again while it is committed, the worker image the same
# again plus its 7 GB archive; the intermediate images are removed only at the end).
need_gib() {
  local need=1
  [[ -f "$cache/wheels-$wheels_key/.done" ]] || need=$((need + 4))
  if [[ ! -s "$(archive worker)" ]]; then
    need=$((need + 15))
    [[ "$(buildah "${bflags[@]}" inspect --format '{{index .ImageAnnotations "kvr.deps"}}' "$deps_ref" 2>/dev/null || true)" == "$deps_key" ]] ||
      need=$((need + 14))
  fi
  local name
  for name in operator runtime; do [[ -s "$(archive "$name")" ]] || need=$((need + 2)); done
  echo "$need"
}
need=$(need_gib)
free=$(($(df -Pk "$cache" | awk 'NR == 2 {print $4}') / 1024 / 1024))
if ((free < need)) && [[ "${KVR_IGNORE_DISK_CHECK:-}" != 1 ]]; then
  log "error: building these images takes about ${need} GiB in $cache; its filesystem has ${free} GiB free."
  log "       Free some space (the node imports the worker image again, ~7 GB more), or point"
  log "       KVR_CACHE at a larger disk; KVR_IGNORE_DISK_CHECK=1 builds anyway."
  exit 1
fi

# --- base: a minimal Debian bookworm with Debian's python3, the images' FROM ---
base_tar="$cache/base-$base_key.tar"
if [[ ! -s "$base_tar" ]]; then
  log "debootstrap $suite ($base_packages) from $mirror"
  rootfs="$(mktemp -d "$cache/.rootfs.XXXXXX")"
  trap 'rm -rf "$rootfs"' EXIT
  if ! debootstrap --variant=minbase --include="$base_packages" "$suite" "$rootfs" "$mirror" \
    >"$cache/debootstrap.log" 2>&1; then
    tail -20 "$cache/debootstrap.log" >&2
    log "error: debootstrap failed (log: $cache/debootstrap.log)"
    exit 1
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
  tar --numeric-owner -C "$rootfs" -cf "$base_tar.tmp" .
  mv "$base_tar.tmp" "$base_tar"
  rm -rf "$rootfs"
  trap - EXIT
fi
# --- end base ---
if [[ "$(buildah "${bflags[@]}" inspect --format '{{index .ImageAnnotations "kvr.base"}}' "$base_ref" 2>/dev/null || true)" != "$base_key" ]]; then
  log "importing the base as $base_ref"
  ctr=$(buildah "${bflags[@]}" from scratch)
  buildah "${bflags[@]}" add "$ctr" "$base_tar" / >/dev/null
  buildah "${bflags[@]}" config --env LANG=C.UTF-8 \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --annotation "kvr.base=$base_key" --cmd python3 "$ctr"
  buildah "${bflags[@]}" commit --rm "$ctr" "$base_ref" >/dev/null
fi

# --- wheels: everything pip installs inside the (offline) builds ---
wheels="$cache/wheels-$wheels_key"
if [[ ! -f "$wheels/.done" ]]; then
  log "collecting wheels into $wheels"
  mkdir -p "$wheels"
  (cd "$root" && "$venv/bin/pip" wheel -q --wheel-dir "$wheels" . "${wheel_reqs[@]}")
  "$venv/bin/pip" download -q --no-deps --dest "$wheels" "${nodeps_reqs[@]}"
  rm -f "$wheels"/kvretention-*.whl  # built from the source in each image, not from here
  touch "$wheels/.done"
fi

build_pause() {
  local stage ctr
  stage="$(mktemp -d)"
  gcc -Os -static -Wall -Werror -DVERSION="kvr-$k8s_version" -o "$stage/pause" "$pause_src"
  strip "$stage/pause"
  ctr=$(buildah "${bflags[@]}" from scratch)
  buildah "${bflags[@]}" copy "$ctr" "$stage/pause" /pause >/dev/null
  buildah "${bflags[@]}" config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
  buildah "${bflags[@]}" commit --rm "$ctr" "$1" >/dev/null
  rm -rf "$stage"
}

build_dockerfile() { # build_dockerfile <Dockerfile> <ref> [--build-arg ...]
  (cd "$root" && buildah "${bflags[@]}" bud --quiet --network none --layers=false \
    --build-arg BASE_REGISTRY=localhost/kvretention/ --build-arg PIP_NO_INDEX=1 \
    --build-arg PIP_FIND_LINKS=/wheels --volume "$wheels:/wheels:ro" "${@:3}" \
    -f "$1" -t "$2" . >&2)
}

declare -A dockerfiles=(
  [operator]=images/operator/Dockerfile
  [runtime]=images/runtime/Dockerfile
  [worker]=images/worker/Dockerfile
)
# The worker image's engine and base are build args (its defaults are the GPU image): the CPU
# engine on its dependency image, built first (only its build mounts the libcuda stand-in).
declare -A build_args=(
  [worker]="--build-arg ENGINE=cpu --build-arg WORKER_BASE=$deps_ref"
)
build_cpu_deps() {
  if [[ "$(buildah "${bflags[@]}" inspect --format '{{index .ImageAnnotations "kvr.deps"}}' "$deps_ref" 2>/dev/null || true)" == "$deps_key" ]]; then
    return
  fi
  local start=$SECONDS
  log "building $deps_ref (torch, SGLang, Mooncake, the tiny model: once per dependency change)"
  build_dockerfile images/worker/Dockerfile "$deps_ref" --target cpu-deps \
    --annotation "kvr.deps=$deps_key" --volume "$cuda_standin:/cuda-standin:ro"
  log "built $deps_ref in $((SECONDS - start))s"
}
for name in "${names[@]}"; do
  out="$(archive "$name")"
  [[ -s "$out" ]] && continue
  ref="${repos[$name]}:${keys[$name]}"
  start=$SECONDS
  log "building $ref"
  if [[ $name == pause ]]; then
    build_pause "$ref"
  else
    [[ $name == worker ]] && build_cpu_deps
    read -ra extra <<<"${build_args[$name]:-}"
    build_dockerfile "${dockerfiles[$name]}" "$ref" "${extra[@]}"
  fi
  rm -f "$cache/$name"-*.tar
  buildah "${bflags[@]}" push --quiet "$ref" "docker-archive:$out.tmp:$ref" >&2
  mv "$out.tmp" "$out"
  log "built $ref in $((SECONDS - start))s ($(du -h "$out" | cut -f1))"
done
# The archives are what the node imports: keep only the base and the CPU worker's dependency image
# (the Dockerfiles build FROM them) in buildah's storage, else every source edit leaves GBs of vfs
# layers behind.
while read -r id ref; do
  [[ "$ref" == "$base_ref" || "$ref" == "$deps_ref" ]] || buildah "${bflags[@]}" rmi -f "$id" >/dev/null 2>&1 || true
done < <(buildah "${bflags[@]}" images --noheading --format '{{.ID}} {{.Name}}:{{.Tag}}' 2>/dev/null || true)
buildah "${bflags[@]}" rmi --prune >/dev/null 2>&1 || true
# Older bases and wheelhouses (their keys changed) are not used again.
find "$cache" -maxdepth 1 \( -name 'base-*.tar' ! -name "base-$base_key.tar" \
  -o -name 'wheels-*' ! -name "wheels-$wheels_key" \) -exec rm -rf {} +
write_list
log "done in $((SECONDS - total))s"
echo "$cache"

#!/usr/bin/env bash
# Install prometheus and promtool for the observability and chart tiers (a real Prometheus scraping
# the data plane; `promtool test rules` on the chart's alerts). Nothing to do when both are on PATH.
# Debian ships both in its `prometheus` package (bookworm: 2.42); where apt has no candidate they
# are built from the Go module proxy into the cache, keyed by version, and found there by the tests.
#
# Usage: scripts/install-prometheus.sh    # prints the directory holding promtool on stdout
# Env:   KVR_CACHE  cache root (default ~/.cache/kvretention)
#        KVR_PROMETHEUS_BUILD=1  skip PATH and apt: build from the Go module proxy (checks that path)
set -euo pipefail

# The Go module version of Prometheus 2.54.1 (Prometheus tags its Go module v0.<minor>.<patch>).
PROMETHEUS_MODULE_VERSION=v0.54.1
cache="${KVR_CACHE:-$HOME/.cache/kvretention}"
bin="$cache/bin/prometheus-$PROMETHEUS_MODULE_VERSION"

log() { printf '[install-prometheus] %s\n' "$*" >&2; }

build_only="${KVR_PROMETHEUS_BUILD:-}"
if [[ -z "$build_only" ]] && command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  dirname "$(command -v promtool)"
  exit 0
fi
if [[ -x "$bin/promtool" && -x "$bin/prometheus" ]]; then
  echo "$bin"
  exit 0
fi

# (the policy read whole first: under pipefail, `apt-cache ... | grep -q` fails once grep stops
# reading, so the check never saw the package and every fresh machine compiled it for ~11 minutes)
policy="$(apt-cache policy prometheus 2>/dev/null || true)"
if [[ -z "$build_only" && "$policy" =~ Candidate:\ [0-9] ]]; then
  log "installing Debian's prometheus package (prometheus, promtool)"
  sudo=()
  [[ "$(id -u)" = 0 ]] || sudo=(sudo)
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  dirname "$(command -v promtool)"
  exit 0
fi

# Fallback: build both commands from the Go module proxy. Prometheus' go.mod has replace and
# exclude directives, so `go install pkg@version` refuses it; a throwaway main module repeats them.
command -v go >/dev/null || { log "error: no prometheus package and no go to build it"; exit 1; }
log "building prometheus and promtool $PROMETHEUS_MODULE_VERSION from the Go module proxy"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(
  cd "$work"
  go mod init kvretention.local/prometheus-build >/dev/null 2>&1
  go mod edit \
    -replace=k8s.io/klog=github.com/simonpasquier/klog-gokit@v0.3.0 \
    -replace=k8s.io/klog/v2=github.com/simonpasquier/klog-gokit/v3@v3.3.0 \
    -exclude=github.com/linode/linodego@v1.0.0 \
    -exclude=github.com/grpc-ecosystem/grpc-gateway@v1.14.7 \
    -exclude=google.golang.org/api@v0.30.0
  go get "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_MODULE_VERSION" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_MODULE_VERSION"
  mkdir -p "$bin"
  GOBIN="$bin" nice -n "${KVR_BUILD_NICE:-10}" go install \
    github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool
)
echo "$bin"

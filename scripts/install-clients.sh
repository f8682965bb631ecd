#!/usr/bin/env bash
# Install the real coding-agent CLIs the client tier runs (tests/clients), from npm, into
# ~/.cache/kvretention/clients/<package>-<version>, keyed by version like the other cached builds:
# a second run only checks the stamp written once the installed binary answered --version.
# Concurrent runs take turns (a lock in the cache).
#
# usage: scripts/install-clients.sh            # the pinned releases below
#        scripts/install-clients.sh --latest   # npm's latest of each (make clients-latest)
# Prints one NAME VERSION BINARY line per CLI on stdout; progress goes to stderr.
set -euo pipefail

CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0
CACHE="${KVR_CLIENTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvretention/clients}"

log() { printf '[install-clients] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

command -v npm >/dev/null ||
  die "npm not found: the client tier installs Claude Code and Codex from npm (Debian: apt-get install npm; or run make bootstrap)"

latest=0
[ "${1:-}" = "--latest" ] && latest=1

# name  npm package  pinned version  binary under node_modules/.bin
clients=(
  "claude @anthropic-ai/claude-code $CLAUDE_CODE_VERSION claude"
  "codex @openai/codex $CODEX_VERSION codex"
)

# One install at a time (parallel test workers may all ask on a cold machine): the rest wait here
# and then find the stamp.
mkdir -p "$CACHE"
exec 9>"$CACHE/.install.lock"
flock 9

for entry in "${clients[@]}"; do
  read -r name package version bin <<<"$entry"
  if [ "$latest" = 1 ]; then
    version="$(npm view "$package" version 2>/dev/null)" || die "npm view $package failed"
  fi
  dir="$CACHE/${package##*/}-$version"
  exe="$dir/node_modules/.bin/$bin"
  if [ ! -e "$dir/.kvr-installed" ] || [ ! -x "$exe" ]; then
    log "installing $package@$version into $dir"
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    npm install --prefix "$dir.tmp" --no-audit --no-fund --loglevel=error "$package@$version" >&2 ||
      die "npm install $package@$version failed"
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
    "$exe" --version >/dev/null 2>&1 || die "$exe does not run after installing $package@$version"
    touch "$dir/.kvr-installed"
  fi
  printf '%s %s %s\n' "$name" "$version" "$exe"
done

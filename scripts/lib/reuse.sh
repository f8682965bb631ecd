# shellcheck shell=bash
# The opening every cached build under scripts/ shares: print a complete cached output and exit 0,
# or answer --check (print it when built, else exit 3). The caller defines `log`.

reuse_or_check() { # reuse_or_check <is-complete command> <output> <script name> [--check]
  if "$1"; then
    [[ "${4:-}" == --check ]] || log "reusing $2"
    echo "$2"
    exit 0
  fi
  if [[ "${4:-}" == --check ]]; then
    log "not built yet: $2 (run scripts/$3)"
    exit 3
  fi
}

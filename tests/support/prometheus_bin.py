"""Where the tests find ``prometheus`` and ``promtool``: ``$KVR_PROMETHEUS_BIN`` if set, else PATH
(Debian's package), else the Go build ``scripts/install-prometheus.sh`` caches under
``~/.cache/kvretention/bin/prometheus-<version>``. Missing is a failure, not a skip."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def prometheus_binary(name: str) -> Path:
    folder = os.environ.get("KVR_PROMETHEUS_BIN")
    if folder:
        return Path(folder) / name
    found = shutil.which(name)
    if found:
        return Path(found)
    cache = Path(os.environ.get("KVR_CACHE", Path.home() / ".cache" / "kvretention")) / "bin"
    for candidate in sorted(cache.glob(f"prometheus-*/{name}"), reverse=True):
        if os.access(candidate, os.X_OK):
            return candidate
    raise AssertionError(
        f"{name} is not installed: run scripts/install-prometheus.sh (make bootstrap)"
    )

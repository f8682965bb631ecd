"""Opt-in JSONL request trace: one record per finished request, so a replay can attribute the hint.

Enabled by naming a file (``--trace-file`` or ``KVR_REQUEST_TRACE``). The normalized envelope is
stored under the stable key ``kv_hints``; unhinted and rejected requests have no such key.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Final

TRACE_ENV: Final = "KVR_REQUEST_TRACE"
ENVELOPE_KEY: Final = "kv_hints"


class RequestTrace:
    """Appends one JSON object per line; line-buffered and lock-guarded so records never interleave."""

    def __init__(self, path: str | os.PathLike[str], *, component: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._component = component
        self._lock = threading.Lock()
        self._file = self.path.open("a", buffering=1, encoding="utf-8")

    def record(
        self,
        *,
        request_id: str,
        outcome: str,
        kv_hints: dict[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        entry: dict[str, Any] = {
            "ts": round(time.time(), 6),
            "component": self._component,
            "request_id": request_id,
            "outcome": outcome,
            **fields,
        }
        if kv_hints is not None:
            entry[ENVELOPE_KEY] = kv_hints
        line = json.dumps(entry, separators=(",", ":"), sort_keys=True)
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


def trace_from_env(
    path: str | None, *, component: str, env: dict[str, str] | None = None
) -> RequestTrace | None:
    """The trace named by a flag, else by ``KVR_REQUEST_TRACE``, else none."""
    target = path or (env if env is not None else os.environ).get(TRACE_ENV)
    return RequestTrace(target, component=component) if target else None

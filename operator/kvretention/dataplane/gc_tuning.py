"""The data-plane processes' garbage-collector settings (frontend, router, worker).

A 200 KB agent body decodes into ~10,000 containers and parses into ~1,500 models. At CPython's
default thresholds (700, 10, 10) each such request starts a dozen young collections, and with tens
of bodies in flight the full collections rescan all of them again and again: about a third of the
frontend + router CPU per agent request at concurrency 64 (benchmarks/README.md, issue 21); the
router and the worker hold the same bodies in flight. The request path's garbage is freed by
reference counting as each request ends; the few cycles (exceptions, aiohttp's own) are still
collected, just later.
"""

from __future__ import annotations

import gc
from typing import Final

GC_THRESHOLDS: Final = (50_000, 20, 10)
"""A young collection per 50,000 new containers (~2-5 agent bodies) instead of per 700; a full
one every 10,000,000."""


def tune_gc() -> None:
    """Freeze what startup loaded (never scanned again) and collect at :data:`GC_THRESHOLDS`."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)

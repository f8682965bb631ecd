"""I/O: read the managed Mooncake master's ``/metrics`` for the reconcile, bounded and failure-proof.

The only network call the operator makes outside the API server. It never raises (a master that is
down, slow or not yet scheduled becomes a reading with an error) and never blocks the event loop:
the HTTP GET runs in a thread under a hard timeout.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import http.client
import urllib.request
from typing import Final

from kvretention.controller.kvstore_metrics import (
    KvStoreReading,
    MetricsFormatError,
    format_time,
    parse_usage,
)

TIMEOUT_SECONDS: Final = 2.0
MAX_BYTES: Final = 4 * 1024 * 1024
"""A master's /metrics is about 40 KiB; refuse anything absurd rather than buffer it."""


def _get(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read(MAX_BYTES + 1)
    if len(body) > MAX_BYTES:
        raise MetricsFormatError(f"{url} returned more than {MAX_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


async def read_master_metrics(
    url: str, *, now: dt.datetime, limit_seconds: float = TIMEOUT_SECONDS
) -> KvStoreReading:
    """The master's usage, or why it could not be read within ``limit_seconds``."""
    observed_at = format_time(now)
    try:
        text = await asyncio.wait_for(
            asyncio.to_thread(_get, url, limit_seconds), limit_seconds + 0.5
        )
        return KvStoreReading(observed_at, usage=parse_usage(text))
    except TimeoutError:
        return KvStoreReading(observed_at, error=f"{url}: no answer within {limit_seconds:g}s")
    except MetricsFormatError as err:
        return KvStoreReading(observed_at, error=f"{url}: {err}")
    except (OSError, ValueError, http.client.HTTPException) as err:
        return KvStoreReading(observed_at, error=f"{url}: {err}")

"""I/O: read the managed Mooncake master's and the workers' ``/metrics`` for the reconcile, bounded
and failure-proof.

The only network calls the operator makes outside the API server. They never raise (a master or a
worker that is down, slow or not yet scheduled becomes a reading with an error) and never block the
event loop: the HTTP GET runs in a thread under a hard timeout.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import http.client
import urllib.request
from collections.abc import Callable
from typing import Final, TypeVar

from kvretention.controller.kvstore_metrics import (
    KvStoreReading,
    MetricsFormatError,
    format_time,
    parse_usage,
)
from kvretention.controller.worker_metrics import PodFailures, parse_hook_failures

T = TypeVar("T")

TIMEOUT_SECONDS: Final = 2.0
MAX_BYTES: Final = 4 * 1024 * 1024
"""A master's /metrics is about 40 KiB (a worker's less); refuse anything absurd rather than
buffer it."""


def _get(url: str, timeout: float) -> str | Exception:
    """The body, or the exception as a value: the thread's task must never end with one, since
    kopf re-raises, when it stops, the exception of every task in the loop that did."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body: bytes = response.read(MAX_BYTES + 1)
    except (OSError, ValueError, http.client.HTTPException) as err:
        return err
    if len(body) > MAX_BYTES:
        return MetricsFormatError(f"{url} returned more than {MAX_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


async def _fetch(url: str, limit_seconds: float) -> str:
    got = await asyncio.wait_for(asyncio.to_thread(_get, url, limit_seconds), limit_seconds + 0.5)
    if isinstance(got, Exception):
        raise got
    return got


async def _read(url: str, parse: Callable[[str], T], limit_seconds: float) -> T | str:
    """``parse`` of the body, or why there is none, as status words it (naming the URL)."""
    try:
        return parse(await _fetch(url, limit_seconds))
    except TimeoutError:
        return f"{url}: no answer within {limit_seconds:g}s"
    except (OSError, ValueError, http.client.HTTPException) as err:  # MetricsFormatError too
        return f"{url}: {err}"


async def read_master_metrics(
    url: str, *, now: dt.datetime, limit_seconds: float = TIMEOUT_SECONDS
) -> KvStoreReading:
    """The master's usage, or why it could not be read within ``limit_seconds``."""
    observed_at = format_time(now)
    usage = await _read(url, parse_usage, limit_seconds)
    if isinstance(usage, str):
        return KvStoreReading(observed_at, error=usage)
    return KvStoreReading(observed_at, usage=usage)


async def read_worker_failures(
    pod: str, url: str, *, limit_seconds: float = TIMEOUT_SECONDS
) -> PodFailures:
    """A worker pod's retention hook failure counts, or why they could not be read in time."""
    counts = await _read(url, parse_hook_failures, limit_seconds)
    if isinstance(counts, str):
        return PodFailures(pod, error=counts)
    return PodFailures(pod, counts=counts)

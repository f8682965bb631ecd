"""Pure: what the operator makes of the Mooncake master's store numbers over time (the reading that
``status.kvStore`` carries, when to read again); the ``/metrics`` parser itself is on the ground
floor (:mod:`kvretention.common.kvstore_metrics`), where the retention plugin reads it too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from kvretention.common.kvstore_metrics import (
    REQUIRED,
    KvStoreUsage,
    MetricsFormatError,
    parse_master_metrics,
    parse_usage,
    read_usage,
)

__all__ = [
    "GRACE_SECONDS",
    "READ_INTERVAL_SECONDS",
    "REQUIRED",
    "RETRY_SECONDS",
    "KvStoreReading",
    "KvStoreUsage",
    "MetricsFormatError",
    "format_time",
    "master_metrics_url",
    "parse_master_metrics",
    "parse_usage",
    "plan_metrics_read",
    "plan_read_interval",
    "plan_reading",
    "read_usage",
    "reading_from_status",
]


_STATUS_FIELDS: Final = {
    "capacityBytes": "capacity_bytes",
    "usedBytes": "used_bytes",
    "objects": "keys",
    "pinnedObjects": "pinned_keys",
    "evictedObjects": "evicted_keys",
    "evictedBytes": "evicted_bytes",
    "evictions": "evictions",
}


@dataclass(frozen=True)
class KvStoreReading:
    """One attempt to read the master's metrics: the numbers, or why there are none."""

    observed_at: str
    """RFC 3339, UTC."""
    usage: KvStoreUsage | None = None
    error: str | None = None
    stale_since: str | None = None
    """Set while reads fail but not yet for ``GRACE_SECONDS``: when the first of them failed
    (RFC 3339, UTC). ``usage`` is then the last good reading (None when there was none) and
    ``error`` why the first failed read failed."""


READ_INTERVAL_SECONDS: Final = 30.0
"""Read a master's metrics at most this often per fleet. A changed reading changes status, and a
status write triggers a reconcile: reading on every reconcile would write as fast as the pool's
numbers move."""

GRACE_SECONDS: Final = 2 * READ_INTERVAL_SECONDS
"""How long reads may fail before the master counts as unreadable. Right after the master's pod is
Ready its Service name may not resolve yet (CoreDNS lists it a few seconds later): a failure that
does not outlast this is transient, and status keeps the last reading, marked stale."""

RETRY_SECONDS: Final = 5.0
"""While reads fail within the grace period, read again this soon (not every READ_INTERVAL)."""


def format_time(now: dt.datetime) -> str:
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reading_from_status(status: Mapping[str, Any] | None) -> KvStoreReading | None:
    """The reading a previous status recorded (None when it recorded none); an unreadable
    master's reason comes back from the RetentionBudget condition."""
    kv_store = (status or {}).get("kvStore") or {}
    observed_at = kv_store.get("observedAt")
    if not isinstance(observed_at, str):
        return None
    stale_since = kv_store.get("staleSince")
    if isinstance(stale_since, str):
        return KvStoreReading(
            observed_at,
            usage=_usage_from_status(kv_store),
            error=str(kv_store.get("staleReason") or "not read"),
            stale_since=stale_since,
        )
    usage = _usage_from_status(kv_store)
    if usage is not None:
        return KvStoreReading(observed_at, usage=usage)
    condition: Mapping[str, Any] = next(
        (c for c in (status or {}).get("conditions") or [] if c.get("type") == "RetentionBudget"),
        {},
    )
    return KvStoreReading(observed_at, error=str(condition.get("message") or "not read"))


def _usage_from_status(kv_store: Mapping[str, Any]) -> KvStoreUsage | None:
    values = {attr: kv_store.get(key) for key, attr in _STATUS_FIELDS.items()}
    counts = {attr: v for attr, v in values.items() if type(v) is int and v >= 0}
    return KvStoreUsage(**counts) if len(counts) == len(values) else None


def _parse_time(stamp: str) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def plan_reading(
    previous: KvStoreReading | None,
    current: KvStoreReading,
    *,
    now: dt.datetime,
    grace_seconds: float = GRACE_SECONDS,
) -> KvStoreReading:
    """What status says after ``current``, given what it said before (``previous``).

    - Numbers: ``previous`` when they are the same (``observedAt`` is when the master first
      reported them, so a pool at rest leaves status a fixed point), else ``current``.
    - A failed read after numbers, or before any: transient until reads have failed for
      ``grace_seconds``; status keeps the last numbers (if any) marked ``stale_since`` the first
      failure, with its error. A Service name that does not resolve yet right after the master's
      pod is Ready is such a failure.
    - Failing past the grace period: unreadable (``usage`` and ``stale_since`` None), dated from
      the first failure. An unreadable master is one state whatever the error: one that does not
      answer flips between "Name or service not known" and "no answer within 2s", and each flip
      would be a status write; the first error is the one kept.
    """
    if current.usage is not None:
        if previous is not None and previous.usage == current.usage:
            return replace(previous, error=None, stale_since=None)
        return current
    if previous is not None and previous.usage is None and previous.stale_since is None:
        return previous  # unreadable already
    if previous is None or previous.stale_since is None:
        if grace_seconds <= 0:
            return current
        return KvStoreReading(
            previous.observed_at if previous is not None else format_time(now),
            usage=previous.usage if previous is not None else None,
            error=current.error,
            stale_since=format_time(now),
        )
    since = _parse_time(previous.stale_since)
    age = (now - since).total_seconds() if since is not None else None
    if age is not None and 0 <= age < grace_seconds:
        return previous
    # Past the grace period (or a stale mark this operator did not write, or from the future).
    return KvStoreReading(previous.stale_since, error=previous.error)


def plan_read_interval(reading: KvStoreReading | None) -> float:
    """How soon the master's metrics are read again: sooner while a failure is still transient."""
    if reading is not None and reading.stale_since is not None:
        return RETRY_SECONDS
    return READ_INTERVAL_SECONDS


def plan_metrics_read(
    last_read: dt.datetime | None,
    *,
    now: dt.datetime,
    interval_seconds: float = READ_INTERVAL_SECONDS,
) -> bool:
    """Whether this reconcile reads the master's metrics, or reuses the last reading."""
    if last_read is None:
        return True
    age = (now - last_read).total_seconds()
    return age >= interval_seconds or age < 0


def master_metrics_url(*, host: str, port: int) -> str:
    """The managed master's metrics endpoint (its Service's ``metrics`` port)."""
    return f"http://{host}:{port}/metrics"

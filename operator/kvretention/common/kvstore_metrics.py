"""Pure: the Mooncake master's ``/metrics`` text in, the managed store's capacity and retention out.

The names are the ones ``mooncake_master`` 0.3.13.post1 exposes (checked by running it; the L3 tier
reads a real master through this parser). The master counts soft-pinned *keys* but not pinned
*bytes*, so the pinned share of the pool is estimated from the mean object size: exact when objects
have one size, as HiCache's KV pages do (one page of one model), approximate otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

CAPACITY: Final = "master_total_capacity_bytes"
USED: Final = "master_allocated_bytes"
KEYS: Final = "master_key_count"
PINNED_KEYS: Final = "master_soft_pin_key_count"
EVICTED_KEYS: Final = "master_evicted_key_count"
EVICTED_BYTES: Final = "master_evicted_size_bytes"
EVICTIONS: Final = "master_successful_evictions_total"
REQUIRED: Final = (CAPACITY, USED, KEYS, PINNED_KEYS, EVICTED_KEYS, EVICTED_BYTES, EVICTIONS)


class MetricsFormatError(ValueError):
    """The text is not what a Mooncake master serves (missing names, unparsable numbers)."""


def parse_master_metrics(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text exposition, by name (labelled ones are skipped).

    The master's store-wide gauges carry no labels; skipping labelled series keeps this parser
    small and still exact for them.
    """
    samples: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) < 2 or "{" in parts[0]:
            continue
        try:
            value = float(parts[1])
        except ValueError as err:
            raise MetricsFormatError(f"sample {parts[0]!r} has no number: {parts[1]!r}") from err
        samples[parts[0]] = value
    return samples


@dataclass(frozen=True)
class KvStoreUsage:
    """The managed pool as its master reports it."""

    capacity_bytes: int
    used_bytes: int
    keys: int
    pinned_keys: int
    evicted_keys: int
    evicted_bytes: int
    evictions: int

    @property
    def pinned_bytes(self) -> int:
        """Estimated pinned bytes: pinned keys times the mean object size (see module note)."""
        if self.keys <= 0:
            return 0
        return round(self.used_bytes * min(self.pinned_keys, self.keys) / self.keys)

    @property
    def pinned_ratio(self) -> float | None:
        """Estimated share of the pool's capacity that pins hold; None before any segment."""
        if self.capacity_bytes <= 0:
            return None
        return self.pinned_bytes / self.capacity_bytes

    def to_status(self) -> dict[str, int]:
        """The numbers as ``status.kvStore`` carries them (camelCase)."""
        return {
            "capacityBytes": self.capacity_bytes,
            "usedBytes": self.used_bytes,
            "objects": self.keys,
            "pinnedObjects": self.pinned_keys,
            "pinnedBytesEstimate": self.pinned_bytes,
            "evictedObjects": self.evicted_keys,
            "evictedBytes": self.evicted_bytes,
            "evictions": self.evictions,
        }


def _count(samples: dict[str, float], name: str) -> int:
    value = samples[name]
    if not math.isfinite(value) or value < 0:
        raise MetricsFormatError(f"{name} is {value}, not a count")
    return int(value)


def read_usage(samples: dict[str, float]) -> KvStoreUsage:
    """The usage numbers from parsed samples; every required name must be present."""
    missing = [name for name in REQUIRED if name not in samples]
    if missing:
        raise MetricsFormatError("not a Mooncake master's metrics: missing " + ", ".join(missing))
    return KvStoreUsage(
        capacity_bytes=_count(samples, CAPACITY),
        used_bytes=_count(samples, USED),
        keys=_count(samples, KEYS),
        pinned_keys=_count(samples, PINNED_KEYS),
        evicted_keys=_count(samples, EVICTED_KEYS),
        evicted_bytes=_count(samples, EVICTED_BYTES),
        evictions=_count(samples, EVICTIONS),
    )


def parse_usage(text: str) -> KvStoreUsage:
    """``/metrics`` text straight to usage numbers."""
    return read_usage(parse_master_metrics(text))

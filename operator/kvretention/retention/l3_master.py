"""The L3 (Mooncake) half of the retention plugin: telling a restart of the Mooncake master from two
readings of its ``/metrics`` (pure).

``mooncake_master`` 0.3.13.post1 keeps every object and soft pin in memory and exports no start
time or uptime (its ``/metrics`` and ``/metrics/summary`` were read: only gauges and ``*_total``
counters). Its counters only ever grow while one process lives, and a new process starts them at
0; so a counter lower than at the previous reading means the master restarted in between, and
every pin written before that previous reading is gone. A restart goes unseen only if, between two
readings, the new process has passed the old one on every counter (an old master that had served
almost nothing, read again long after); the reading interval keeps that window short.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from kvretention.common.kvstore_metrics import parse_master_metrics, read_usage

COUNTER_SUFFIX: Final = "_total"
"""The master's monotonic counters (``master_put_start_requests_total``, ``master_ping_requests_total``,
...): the samples that go back on a restart."""


@dataclass(frozen=True)
class MasterReading:
    """One reading of the master's ``/metrics``: when it began, its counters, its pinned objects."""

    at: float
    """``time.time()`` when the read began."""
    counters: Mapping[str, float]
    pinned_keys: int


@dataclass(frozen=True)
class MasterRestart:
    """The master restarted between two readings: the pins written before ``lost_before`` are gone."""

    previous_at: float
    """When the last reading of the old master began."""
    seen_at: float
    """When the first reading of the new master began."""
    counters: tuple[str, ...]
    """The counters that went back (the evidence)."""

    @property
    def lost_before(self) -> float:
        """A pin whose put returned before this was held by the old master (alive then): lost.
        One written later may be on the new master, and stays counted."""
        return self.previous_at


def read_master(text: str, *, at: float) -> MasterReading:
    """A reading from the master's ``/metrics`` text; raises ``MetricsFormatError`` (a
    ``ValueError``) on text that is not a master's."""
    samples = parse_master_metrics(text)
    usage = read_usage(samples)
    counters = {
        name: value
        for name, value in samples.items()
        if name.endswith(COUNTER_SUFFIX) and math.isfinite(value)
    }
    return MasterReading(at=at, counters=counters, pinned_keys=usage.pinned_keys)


def detect_restart(previous: MasterReading, current: MasterReading) -> MasterRestart | None:
    """The restart between two readings of one master, or None: some counter went back."""
    back = tuple(
        sorted(
            name
            for name, value in current.counters.items()
            if value < previous.counters.get(name, -math.inf)
        )
    )
    if not back:
        return None
    return MasterRestart(previous_at=previous.at, seen_at=current.at, counters=back)

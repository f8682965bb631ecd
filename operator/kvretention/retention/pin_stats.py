"""The radix pins' numbers on the worker's ``/metrics``: what they keep, their budget, and the pins
the budget left out.

The pins live in SGLang's scheduler processes (:mod:`kvretention.retention.pins`), so each writes
its numbers into the worker's stats directory (``<STATS_DIR>/radix_pins/<pid>.json``, as the tree
core and the L3 numbers travel), at most once a second and only when they changed, at a checkpoint
or before an eviction pass. The worker exports the largest over its processes (tensor-parallel
ranks hold the same pins): ``kvretention_worker_radix_pinned_tokens{kind="pinned"|"budget"}`` and
``kvretention_worker_radix_pins_dropped_total``. Import-light: no SGLang.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Final

from kvretention.retention.failures import StatsDirCollector
from kvretention.retention.l3_export import read_process_files, write_process_file
from kvretention.retention.pins import PinTable

SUBDIR: Final = "radix_pins"
TOKENS_METRIC: Final = "kvretention_worker_radix_pinned_tokens"
DROPPED_METRIC: Final = "kvretention_worker_radix_pins_dropped_total"
WRITE_EVERY_S: Final = 1.0
FIELDS: Final = ("pins", "pinned_tokens", "budget_tokens", "dropped")

_TABLES: Final[dict[int, dict[int, PinTable]]] = {}
"""Per process (a forked child starts its own): every pinned tree, by ``id``."""
_WRITTEN: Final[dict[int, tuple[float, tuple[int, ...]]]] = {}
"""Per process: when its numbers were last written, and what they were."""


def _numbers(tables: Iterable[PinTable]) -> tuple[int, ...]:
    out = [0, 0, 0, 0]
    for t in tables:
        for i, value in enumerate((len(t), t.pinned_tokens, t.cap_tokens, t.shed)):
            out[i] += value
    return tuple(out)


def record_pins(table: PinTable, *, clock: Callable[[], float] = time.monotonic) -> bool:
    """Write this process's numbers (all its pinned trees, summed) when they changed and a second
    has passed since the last write; whether it wrote."""
    pid = os.getpid()
    tables = _TABLES.setdefault(pid, {})
    tables[id(table)] = table
    numbers = _numbers(tables.values())
    last = _WRITTEN.get(pid)
    now = clock()
    if last is not None and (last[1] == numbers or now - last[0] < WRITE_EVERY_S):
        return False
    write_process_file(SUBDIR, dict(zip(FIELDS, numbers, strict=True)), what="the radix pins")
    _WRITTEN[pid] = (now, numbers)
    return True


def read_pins(directory: str) -> dict[str, int] | None:
    """The largest of each number over the engine's processes; None when none wrote any."""
    found: dict[str, int] | None = None
    for data in read_process_files(directory, SUBDIR):
        values = {k: data.get(k) for k in FIELDS}
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values.values()):
            continue
        found = found or dict.fromkeys(FIELDS, 0)
        for k, v in values.items():
            found[k] = max(found[k], int(v))  # type: ignore[arg-type]
    return found


class PinnedTokensCollector(StatsDirCollector):
    """``pinned``: the tokens the pins keep out of eviction; ``budget``: the most they may keep."""

    kind = "gauge"
    metric = TOKENS_METRIC
    documentation = (
        "Tokens of the device KV pool the kvretain pins keep out of eviction on SGLang's Rust "
        "tree core (kind=pinned), and the most they may keep (kind=budget: "
        "spec.workers.radixPinRatio of the pool, leaving room for the longest request); no sample before the first pin."
    )
    labels = ("kind",)

    def samples(self) -> Iterable[tuple[list[str], float]]:
        pins = read_pins(str(self.directory))
        if pins is None:
            return []
        return [(["pinned"], pins["pinned_tokens"]), (["budget"], pins["budget_tokens"])]


class PinsDroppedCollector(StatsDirCollector):
    """Pins the budget left out or took the place of, since the engine started."""

    kind = "counter"
    metric = DROPPED_METRIC
    documentation = (
        "kv.retain holds the pin budget left out or dropped for a higher-ranked one: those "
        "prefixes are evicted as LRU evicts them (raise spec.workers.radixPinRatio or the pool)."
    )
    labels = ()

    def samples(self) -> Iterable[tuple[list[str], float]]:
        pins = read_pins(str(self.directory))
        return [([], pins["dropped"] if pins is not None else 0)]


__all__ = [
    "DROPPED_METRIC",
    "TOKENS_METRIC",
    "PinnedTokensCollector",
    "PinsDroppedCollector",
    "read_pins",
    "record_pins",
]

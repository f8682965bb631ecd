"""Counts of the retention plugin's fail-open fallbacks, carried from SGLang's scheduler process to
the worker's ``/metrics``.

The hooks run in the scheduler, a child process ``sglang.Engine`` spawns inside the worker; the
worker's ``/metrics`` is served by the parent. Before the engine starts, the worker names a fresh
directory in :data:`STATS_DIR_ENV` (:func:`prepare_stats_dir`); the child inherits it, and each
process that counts a failure rewrites its own small JSON file there (``<pid>.json``, written whole
and renamed into place, so a reader never sees half of one). The worker's
:class:`FailureCollector` sums the files on each scrape.

Why files: prometheus_client's multiprocess mode would move every metric of every process to
mmapped files (a directory to wipe at start, a mode per gauge, a collector that reads them all) for
two or three counters; SGLang's own metrics exist only with ``--enable-metrics`` and its HTTP
server, which the worker does not run. Failures are rare, so one small write per failure costs
nothing and a healthy worker writes nothing. Import-light (no SGLang, no prometheus_client at
import): the scheduler imports it with the plugin.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Final, Literal

logger = logging.getLogger(__name__)

STATS_DIR_ENV: Final = "KVR_RETENTION_STATS_DIR"
"""The directory the worker reads the plugin's failure counts from (inherited by the scheduler)."""

METRIC: Final = "kvretention_retention_hook_failures"
"""Exported as ``kvretention_retention_hook_failures_total{hook, fallback}``."""

FALLBACKS: Final[Mapping[str, str]] = {
    "checkpoint": "unretained",
    "evict": "last_agreed_time",
    "l3_record": "unpinned",
    "l3_put": "unpinned",
}
"""Each fail-open hook and what the worker does instead: ``checkpoint`` (the radix holds of a
request, and the ranks' clock agreement) leaves the request's KV unretained, evicted as plain LRU;
``evict`` (the ranks' clock agreement before an eviction pass) ranks holds by the time last
agreed on; ``l3_record`` (noting a request's retained pages) and ``l3_put`` (the Mooncake put) write the
pages unpinned. The request is served either way."""


class FailureCounts:
    """This process's counts per hook, mirrored to ``<pid>.json`` under :data:`STATS_DIR_ENV`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._counts: dict[str, int] = {}

    def count(self, hook: str) -> int:
        """One more failure of ``hook`` (a :data:`FALLBACKS` key); this process's total for it."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child starts its own count
                self._pid, self._counts = os.getpid(), {}
            total = self._counts[hook] = self._counts.get(hook, 0) + 1
            self._write(dict(self._counts))
        return total

    def _write(self, counts: dict[str, int]) -> None:
        directory = os.environ.get(STATS_DIR_ENV)
        if not directory:
            return  # no worker reads them (a test tree, a bare ``sglang serve``): the log says it
        path = Path(directory) / f"{self._pid}.json"
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(counts), encoding="utf-8")
            tmp.replace(path)
        except OSError as err:
            logger.warning("kvretention: cannot write failure counts to %s: %s", path, err)


COUNTS: Final = FailureCounts()
"""The process's counts: what the plugin's fail-open guards increment."""


def read_counts(directory: str | Path) -> dict[str, int]:
    """The counts of every process under ``directory``, summed per hook; unreadable files skipped
    (a process that died mid-rename leaves at worst its previous, complete file)."""
    totals = dict.fromkeys(FALLBACKS, 0)
    for path in Path(directory).glob("*.json"):
        try:
            counts = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(counts, dict):
            continue
        for hook, n in counts.items():
            if isinstance(hook, str) and type(n) is int and n >= 0:
                totals[hook] = totals.get(hook, 0) + n
    return totals


def prepare_stats_dir() -> str:
    """The directory the engine's processes write their counts to: :data:`STATS_DIR_ENV` when
    set, else a fresh one put there (call before the engine spawns its scheduler)."""
    directory = os.environ.get(STATS_DIR_ENV) or tempfile.mkdtemp(prefix="kvr-retention-")
    os.makedirs(directory, exist_ok=True)
    os.environ[STATS_DIR_ENV] = directory
    return directory


class StatsDirCollector:
    """A prometheus_client collector of one labelled family read from the stats directory on each
    scrape (the engine's scheduler processes write it, the worker exports it); a subclass names
    the family and gives its samples."""

    kind: ClassVar[Literal["counter", "gauge"]]
    metric: ClassVar[str]
    documentation: ClassVar[str]
    labels: ClassVar[tuple[str, ...]]

    def __init__(self, directory: str | Path) -> None:
        self.directory = directory

    def samples(self) -> Iterable[tuple[list[str], float]]:
        """Each sample's label values and value, in the order they are exported."""
        raise NotImplementedError

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        family_type = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        family = family_type(self.metric, self.documentation, labels=list(self.labels))
        for values, value in self.samples():
            family.add_metric(values, value)
        yield family

    def describe(self) -> Iterator[Any]:
        return iter(())  # collected on each scrape, never at registration


class FailureCollector(StatsDirCollector):
    """The summed counts as one counter family, every known hook present from zero (so
    ``increase()`` sees the first failure)."""

    kind = "counter"
    metric = METRIC
    documentation = (
        "Retention plugin hooks that failed in SGLang's scheduler and fell back (fail-open): "
        "the request was served, its KV left unretained or its pages written unpinned "
        "(the worker log has the exception)."
    )
    labels = ("hook", "fallback")

    def samples(self) -> Iterable[tuple[list[str], float]]:
        counts = sorted(read_counts(self.directory).items())
        return [([hook, FALLBACKS.get(hook, "unknown")], n) for hook, n in counts]


__all__ = [
    "COUNTS",
    "FALLBACKS",
    "METRIC",
    "STATS_DIR_ENV",
    "FailureCollector",
    "FailureCounts",
    "StatsDirCollector",
    "prepare_stats_dir",
    "read_counts",
]

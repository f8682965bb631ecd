"""The worker's exact fast paths as a metric. Token reuse (the conversation's previous prompt
tokens, :mod:`kvretention.dataplane.worker.render_cache`) and the compiled chat template
(:mod:`kvretention.dataplane.compiled_template`) each check themselves against the exact path they
stand in for and turn themselves off on a difference: answers stay exact, each agent turn costs
several times the CPU. A log line says so once; this gauge says so on every scrape, for the
dashboards and the chart's ``KvRetentionWorkerFastPathOff`` alert."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

METRIC: Final = "kvretention_worker_fast_path_enabled"
TOKEN_REUSE: Final = "token_reuse"
COMPILED_TEMPLATE: Final = "compiled_template"

Source = Callable[[], bool | None]
"""Whether a fast path serves (``None``: it has not started, or the worker does not have it)."""


class FastPathCollector:
    """A prometheus_client collector: ``1`` per fast path that serves, ``0`` per one that turned
    itself off; a path that never started has no sample (no alert for a template minijinja
    refused at load: Jinja2 renders it from the start, as designed)."""

    documentation: Final = (
        "The worker's exact fast paths (token_reuse: the previous prompt's tokens; "
        "compiled_template: minijinja for the chat template): 1 serving, 0 turned off after a "
        "difference from the exact path (answers stay exact, turns cost more CPU; the worker log "
        "says where). No sample for a path the worker does not run."
    )

    def __init__(self) -> None:
        self.sources: dict[str, Source] = {}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(METRIC, self.documentation, labels=["path"])
        for path, source in sorted(self.sources.items()):
            serving = source()
            if serving is not None:
                family.add_metric([path], 1.0 if serving else 0.0)
        yield family

    def describe(self) -> Iterator[Any]:
        return iter(())  # collected on each scrape, never at registration

"""The L3 (Mooncake) half of the retention plugin's numbers, carried from SGLang's scheduler process
to the worker's ``/metrics`` (``kvretention_l3_*``).

The put hook counts in the scheduler (or a rank's) process; the worker's ``/metrics`` is served by
its parent. As for the hook failures (:mod:`kvretention.retention.failures`, whose directory this
shares): each process rewrites its numbers whole into ``<STATS_DIR>/l3/<pid>.json`` (at most every
:data:`PUBLISH_S` from the write path, and from the master watch's thread), and the worker's
:class:`L3Collector` sums the files on each scrape. Import-light: the worker imports it without
SGLang, the scheduler with the plugin.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from kvretention.retention.failures import STATS_DIR_ENV
from kvretention.retention.l3_budget import OUTCOMES

logger = logging.getLogger("kvretention.retention.l3")

SUBDIR: Final = "l3"
PUBLISH_S: Final = 0.5
"""The write path rewrites its process's file at most this often; the watch thread catches up."""

OUTCOME_HELP: Final = (
    "Pages put to Mooncake by the retention plugin, by outcome (pinned, unretained, over_budget "
    "and over_tenant_budget: retained but written unpinned past the pin budget, expired: the "
    "hold ended before the write, pin_refused: the master refused the pin and the page was "
    "written unpinned), summed over the engine's processes."
)


def write_process_file(subdir: str, data: Mapping[str, Any], *, what: str) -> None:
    """This process's ``data``, whole, into ``<STATS_DIR>/<subdir>/<pid>.json`` where the worker
    reads it (nothing without a worker); ``what`` names it in the warning when that fails."""
    directory = os.environ.get(STATS_DIR_ENV)
    if not directory:
        return
    path = Path(directory) / subdir / f"{os.getpid()}.json"
    try:
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(path)
    except OSError as err:
        logger.warning("kvretention: cannot write %s to %s: %s", what, path, err)


def read_process_files(directory: str | Path, subdir: str) -> Iterator[dict[str, Any]]:
    """Each process's object under ``directory/subdir``, in file order; unreadable files and
    anything but a JSON object skipped."""
    for path in sorted((Path(directory) / subdir).glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            yield data


def write_numbers(numbers: Mapping[str, Any]) -> None:
    """This process's numbers, whole, where the worker reads them (nothing without a worker)."""
    write_process_file(SUBDIR, numbers, what="the L3 numbers")


def _count(value: object) -> int:
    return value if type(value) is int and value >= 0 else 0


def read_numbers(directory: str | Path, outcomes: tuple[str, ...] = OUTCOMES) -> dict[str, Any]:
    """Every process's numbers under ``directory``, summed; unreadable files skipped."""
    total: dict[str, Any] = {
        "pages": dict.fromkeys(outcomes, 0),
        "master_restarts": 0,
        "pins_lost": 0,
        "pinned_bytes": 0,
        "budget_bytes": None,
        "tenant_pinned_bytes": {},
    }
    for numbers in read_process_files(directory, SUBDIR):
        for outcome, n in (numbers.get("pages") or {}).items():
            if isinstance(outcome, str):
                total["pages"][outcome] = total["pages"].get(outcome, 0) + _count(n)
        for key in ("master_restarts", "pins_lost", "pinned_bytes"):
            total[key] += _count(numbers.get(key))
        if type(numbers.get("budget_bytes")) is int:
            total["budget_bytes"] = (total["budget_bytes"] or 0) + _count(numbers["budget_bytes"])
        for tenant, n in (numbers.get("tenant_pinned_bytes") or {}).items():
            if isinstance(tenant, str):
                held = total["tenant_pinned_bytes"]
                held[tenant] = held.get(tenant, 0) + _count(n)
    return total


class L3Collector:
    """A prometheus_client collector: the summed numbers as ``kvretention_l3_*`` families, every
    outcome and counter present from zero (so ``increase()`` sees the first)."""

    def __init__(self, directory: str | Path, outcomes: tuple[str, ...] = OUTCOMES) -> None:
        self.directory = directory
        self.outcomes = outcomes

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        numbers = read_numbers(self.directory, self.outcomes)
        pages = CounterMetricFamily("kvretention_l3_pages", OUTCOME_HELP, labels=["outcome"])
        for outcome, n in sorted(numbers["pages"].items()):
            pages.add_metric([outcome], n)
        yield pages
        yield CounterMetricFamily(
            "kvretention_l3_master_restarts",
            "Restarts of the Mooncake master seen in its /metrics (its counters went back), "
            "counted by each of the engine's store clients (one per TP/PP rank): every object "
            "and soft pin written before was lost.",
            value=numbers["master_restarts"],
        )
        yield CounterMetricFamily(
            "kvretention_l3_pins_lost",
            "Pinned pages the store clients' ledgers stopped counting because a master restart "
            "dropped them (a retained page is pinned again only when SGLang writes it again).",
            value=numbers["pins_lost"],
        )
        yield GaugeMetricFamily(
            "kvretention_l3_pinned_bytes",
            "Bytes the engine's Mooncake clients hold soft-pinned (pins counted to their TTL).",
            value=numbers["pinned_bytes"],
        )
        budget = GaugeMetricFamily(
            "kvretention_l3_pin_budget_bytes",
            "The engine's pin budget: softPin.budgetRatio x its Mooncake segments (no sample "
            "before the first put, or without a budget).",
            labels=[],
        )
        if numbers["budget_bytes"] is not None:
            budget.add_metric([], numbers["budget_bytes"])
        yield budget
        tenants = GaugeMetricFamily(
            "kvretention_l3_tenant_pinned_bytes",
            "Bytes the engine's Mooncake clients hold soft-pinned per tenant.",
            labels=["tenant"],
        )
        for tenant, n in sorted(numbers["tenant_pinned_bytes"].items()):
            tenants.add_metric([tenant], n)
        yield tenants

    def describe(self) -> Iterator[Any]:
        return iter(())  # collected on each scrape, never at registration

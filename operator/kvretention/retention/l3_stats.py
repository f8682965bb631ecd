"""The L3 (Mooncake) half of the retention plugin: what its hooks count (``kvretention_l3_*``
metrics) and trace (the request trace's over-budget records)."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

from kvretention.common.trace import TRACE_ENV
from kvretention.retention.l3_budget import OUTCOMES, Outcome, PagePut, PinLedger
from kvretention.retention.l3_export import PUBLISH_S, write_numbers
from kvretention.retention.l3_master import MasterRestart
from kvretention.retention.l3_pages import RetainedPages

logger = logging.getLogger("kvretention.retention.l3")


class L3Stats:
    """Counters of what the put hook decided, and the ledger's gauges: published for the worker's
    ``/metrics`` (:meth:`publish`, :mod:`~kvretention.retention.l3_export`), and also kept as
    ``kvretention_l3_*`` metrics in this process's default Prometheus registry when
    ``prometheus_client`` is importable (what an SGLang that serves its own metrics would show)."""

    def __init__(self) -> None:
        self.pages: dict[Outcome, int] = dict.fromkeys(OUTCOMES, 0)
        self.hook_failures = 0
        self.master_restarts = 0
        self.pins_lost = 0
        self.pinned_bytes = 0
        self.budget_bytes: int | None = None
        self.tenant_pinned_bytes: dict[str, int] = {}
        self._published_at = -math.inf
        self._unpublished = False
        self._lock = threading.Lock()
        self._pages_metric: Any = None
        self._failures_metric: Any = None
        self._pinned_metric: Any = None
        self._budget_metric: Any = None
        self._tenant_metric: Any = None
        self._restarts_metric: Any = None
        self._lost_metric: Any = None
        try:
            from prometheus_client import Counter, Gauge

            self._pages_metric = Counter(
                "kvretention_l3_pages",
                "Pages put to Mooncake by the retention plugin, by outcome "
                "(pinned, unretained, over_budget: retained but written unpinned past the pin "
                "budget, expired: the hold ended before the write, pin_refused: the master "
                "refused the pin and the page was written unpinned).",
                ["outcome"],
            )
            self._failures_metric = Counter(
                "kvretention_l3_hook_failures",
                "Put batches the retention plugin's L3 hook failed on and handed to SGLang's own "
                "unpinned put (the worker log has the exception).",
            )
            self._pinned_metric = Gauge(
                "kvretention_l3_pinned_bytes",
                "Bytes this worker's Mooncake client holds soft-pinned (pins counted to their TTL).",
                multiprocess_mode="livesum",
            )
            self._budget_metric = Gauge(
                "kvretention_l3_pin_budget_bytes",
                "This worker's pin budget: softPin.budgetRatio x its Mooncake segment.",
                multiprocess_mode="livesum",
            )
            self._tenant_metric = Gauge(
                "kvretention_l3_tenant_pinned_bytes",
                "Bytes this worker's Mooncake client holds soft-pinned per tenant.",
                ["tenant"],
                multiprocess_mode="livesum",
            )
            self._restarts_metric = Counter(
                "kvretention_l3_master_restarts",
                "Restarts of the Mooncake master this worker's store client saw in the master's "
                "/metrics (its counters went back): every object and soft pin written before "
                "was lost.",
            )
            self._lost_metric = Counter(
                "kvretention_l3_pins_lost",
                "Pinned pages the ledger stopped counting because a master restart dropped them "
                "(a retained page is pinned again only when SGLang writes it again).",
            )
        except (ImportError, ValueError):  # no client, or registered twice in one process
            pass

    def count(self, outcome: Outcome, pages: int = 1) -> None:
        with self._lock:
            self.pages[outcome] += pages
        if self._pages_metric is not None:
            self._pages_metric.labels(outcome=outcome).inc(pages)

    def failed(self) -> None:
        with self._lock:
            self.hook_failures += 1
        if self._failures_metric is not None:
            self._failures_metric.inc()

    def master_restarted(self, *, pins_lost: int) -> None:
        with self._lock:
            self.master_restarts += 1
            self.pins_lost += pins_lost
        if self._restarts_metric is not None:
            self._restarts_metric.inc()
        if self._lost_metric is not None:
            self._lost_metric.inc(pins_lost)

    def numbers(self) -> dict[str, Any]:
        """What the worker's ``/metrics`` shows of this process (:mod:`l3_export`)."""
        with self._lock:
            return {
                "pages": dict(self.pages),
                "master_restarts": self.master_restarts,
                "pins_lost": self.pins_lost,
                "pinned_bytes": self.pinned_bytes,
                "budget_bytes": self.budget_bytes,
                "tenant_pinned_bytes": dict(self.tenant_pinned_bytes),
            }

    def publish(self, *, force: bool = False) -> None:
        """Rewrite this process's numbers for the worker: at most every ``PUBLISH_S`` unless
        ``force`` (the watch thread forces what the write path left unpublished)."""
        now = time.monotonic()
        with self._lock:
            if force and not self._unpublished:
                return
            if not force and now - self._published_at < PUBLISH_S:
                self._unpublished = True
                return
            self._published_at, self._unpublished = now, False
        write_numbers(self.numbers())

    def set_pinned(
        self, pinned: int, budget: int | None, tenants: Mapping[str, int] | None = None
    ) -> None:
        with self._lock:
            self.pinned_bytes, self.budget_bytes = pinned, budget
            self.tenant_pinned_bytes.update(tenants or {})
            self._unpublished = True
        self.publish()
        if self._tenant_metric is not None:
            for tenant, held in (tenants or {}).items():
                self._tenant_metric.labels(tenant=tenant).set(held)
        if self._pinned_metric is not None:
            self._pinned_metric.set(pinned)
        if self._budget_metric is not None and budget is not None:
            self._budget_metric.set(budget)


STATS: Final = L3Stats()
INDEX: Final = RetainedPages()


def _trace(record: Mapping[str, Any]) -> None:
    """One line in the request trace (``KVR_REQUEST_TRACE``), when the worker keeps one."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    line = json.dumps({"ts": round(time.time(), 6), **record}, separators=(",", ":"))
    try:
        with open(path, "a", encoding="utf-8") as f:  # one short O_APPEND write per line
            f.write(line + "\n")
    except OSError as err:
        logger.warning("kvretention: cannot append to the trace %s: %s", path, err)


_OVER_BUDGET_LOGGED = [0]
"""Over-budget batches seen by this process: the first and every thousandth is logged."""


def report_over_budget(puts: Iterable[PagePut], *, ledger: PinLedger) -> None:
    """Name the retained pages written unpinned past the budget, per request: one trace record
    each (the request id and its page keys) and, at most every thousandth time, a warning."""
    by_request: dict[tuple[str | None, str | None, str], list[str]] = {}
    for put in puts:
        if put.outcome in ("over_budget", "over_tenant_budget"):
            by_request.setdefault((put.rid, put.tenant, put.outcome), []).append(put.page)
    for (rid, tenant, outcome), pages in by_request.items():
        if _OVER_BUDGET_LOGGED[0] % 1000 == 0:
            logger.warning(
                "kvretention: L3 pin budget full (%d of %s bytes pinned, %d reserved for pins an "
                "earlier process may have left): %d retained pages of "
                "request %s written unpinned (logged once per 1000 times; all counted in "
                "kvretention_l3_pages_total and traced)",
                ledger.pinned_bytes,
                ledger.capacity_bytes,
                ledger.reserved(time.time()),
                len(pages),
                rid,
            )
        _OVER_BUDGET_LOGGED[0] += 1
        record: dict[str, Any] = {
            "component": "engine",
            "request_id": rid,
            "outcome": f"l3_pin_{outcome}",
            "pages": pages,
            "pinned_bytes": ledger.pinned_bytes,
            "reserved_bytes": ledger.reserved(time.time()),
            "budget_bytes": ledger.capacity_bytes,
        }
        if tenant is not None:
            record.update(
                tenant=tenant,
                tenant_pinned_bytes=ledger.tenant_bytes().get(tenant, 0),
                tenant_budget_bytes=ledger.tenant_capacity(),
            )
        _trace(record)


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def report_master_restart(
    restart: MasterRestart, *, url: str, pins: int, nbytes: int, ledger: PinLedger
) -> None:
    """A master restart the pool watch saw and the pins the ledger dropped for it: counted
    (:data:`STATS`), one warning line, one trace record."""
    STATS.master_restarted(pins_lost=pins)
    STATS.set_pinned(ledger.pinned_bytes, ledger.capacity_bytes, ledger.tenant_bytes())
    logger.warning(
        "kvretention: the Mooncake master at %s restarted between %s and %s (%d counters went "
        "back, e.g. %s): every object and soft pin written before is gone; %d pins (%d bytes) "
        "written before %s no longer count against this worker's L3 pin budget; retained pages "
        "are pinned again only when SGLang writes them again (a prefix it still holds in GPU or "
        "host memory is not written again)",
        url,
        _utc(restart.previous_at),
        _utc(restart.seen_at),
        len(restart.counters),
        restart.counters[0],
        pins,
        nbytes,
        _utc(restart.lost_before),
    )
    _trace(
        {
            "component": "engine",
            "outcome": "l3_master_restart",
            "master": url,
            "lost_before": round(restart.lost_before, 3),
            "pins_lost": pins,
            "bytes_lost": nbytes,
            "counters_back": list(restart.counters),
        }
    )

"""L3: the operator's own metrics read against a real master, and the budget condition it drives."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable

import pytest
from mooncake_harness import OK, SEGMENT_BYTES, Master, MasterFactory, Store, value_for

from kvretention.controller.conditions import check_retention_budget
from kvretention.controller.kvstore_client import read_master_metrics

pytestmark = pytest.mark.l3

OBJECT = 256 * 1024
BUDGET = 0.5


@pytest.mark.parametrize(
    ("pinned", "unpinned", "status", "reason"),
    [
        pytest.param(0, 0, "True", "WithinBudget", id="empty-pool"),
        pytest.param(4, 8, "True", "WithinBudget", id="few-pins"),
        pytest.param(32, 0, "True", "WithinBudget", id="exactly-at-the-budget"),
        pytest.param(40, 8, "False", "OverBudget", id="pins-past-the-budget"),
    ],
)
def test_budget_condition_from_a_real_masters_metrics(
    start_master: MasterFactory,
    connect: Callable[[Master], Store],
    pinned: int,
    unpinned: int,
    status: str,
    reason: str,
) -> None:
    spec = {"softPin": {"allowEviction": False, "budgetRatio": BUDGET}}
    with start_master(master=spec) as master:
        store = connect(master)
        for i in range(pinned):
            assert store.put(f"pin-{i}", value_for(f"pin-{i}", OBJECT), pin=True) == OK
        for i in range(unpinned):
            assert store.put(f"plain-{i}", value_for(f"plain-{i}", OBJECT)) == OK
        now = dt.datetime.now(dt.UTC)
        reading = asyncio.run(read_master_metrics(master.metrics_url, now=now))
        assert reading.error is None and reading.usage is not None
        usage = reading.usage
        assert usage.capacity_bytes == SEGMENT_BYTES
        assert usage.keys == pinned + unpinned
        assert usage.pinned_keys == pinned
        assert usage.used_bytes >= (pinned + unpinned) * OBJECT
        assert usage.pinned_bytes == pytest.approx(pinned * OBJECT, rel=0.05)
        verdict = check_retention_budget(reading, budget=BUDGET, external=None)
        assert (verdict.status, verdict.reason) == (status, reason)


def test_a_stopped_master_reads_as_unavailable(start_master: MasterFactory) -> None:
    with start_master(master={}) as master:
        url = master.metrics_url
    reading = asyncio.run(read_master_metrics(url, now=dt.datetime.now(dt.UTC)))
    verdict = check_retention_budget(reading, budget=BUDGET, external=None)
    assert (verdict.status, verdict.reason) == ("Unknown", "MetricsUnavailable")
    assert url in verdict.message

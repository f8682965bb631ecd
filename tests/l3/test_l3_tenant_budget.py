"""L3: tenants' shares of the pin budget, on SGLang's own MooncakeStore and a real master, on CPU.

Two tenants' requests reach SGLang with their ``cache_salt`` (what the worker passes for each),
so their page keys are in separate namespaces and the retention plugin counts each tenant's pins
apart. budgetRatio 0.25 of a 16 MiB segment is 32 pages of pins. team-a retains 48 pages first,
team-b 16 after it: with one shared budget team-a takes all 32 and team-b none; with
``tenant_pin_share`` 0.5 team-a stops at 16 and team-b gets its 16.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mooncake_harness import SEGMENT_BYTES, MasterFactory
from retention_runner import OBJECT_BYTES, Request, Scenario, retain, run_scenario
from test_l3_retention import MAX_TTL_S, master_spec, page_pins, torch_imports  # noqa: F401

from kvretention.common.tenancy import cache_salt_for
from kvretention.controller.kvstore_metrics import parse_usage

pytestmark = pytest.mark.l3

BUDGET = 0.25
SHARE_PAGES = int(BUDGET * SEGMENT_BYTES) // (2 * OBJECT_BYTES)

# (tenant share, team-a's pinned pages, team-b's, the outcome of what did not fit)
CASES = [
    pytest.param(None, SHARE_PAGES, 0, "over_budget", id="one-shared-budget"),
    pytest.param(0.5, SHARE_PAGES // 2, 16, "over_tenant_budget", id="half-each"),
]


@pytest.mark.parametrize(("share", "pinned_a", "pinned_b", "refused"), CASES)
def test_one_tenants_pins_do_not_take_anothers_share(
    torch_imports: None,  # noqa: F811
    start_master: MasterFactory,
    tmp_path: Path,
    share: float | None,
    pinned_a: int,
    pinned_b: int,
    refused: str,
) -> None:
    hold = retain({"priority": 50, "duration": 600})
    requests = (
        Request("team-a", 48, 0, hold, cache_salt=cache_salt_for("team-a")),
        Request("team-b", 16, 10_000, hold, cache_salt=cache_salt_for("team-b")),
    )
    settings = {"pin_budget_ratio": BUDGET, "max_pin_ttl_ms": MAX_TTL_S * 1000}
    if share is not None:
        settings["tenant_pin_share"] = share
    with start_master(master=master_spec(budget=BUDGET)) as master:
        report = run_scenario(master, Scenario(requests, plugin=True, settings=settings), tmp_path)
    a, b = report["requests"]["team-a"], report["requests"]["team-b"]
    assert a["written"] == [True] * 48 and b["written"] == [True] * 16
    assert sum(ttl is not None for ttl in page_pins(report, "team-a")) == pinned_a
    assert sum(ttl is not None for ttl in page_pins(report, "team-b")) == pinned_b
    assert report["stats"]["pinned"] == pinned_a + pinned_b
    assert report["stats"][refused] == 48 + 16 - pinned_a - pinned_b
    assert parse_usage(report["metrics_after_writes"]).pinned_keys == 2 * (pinned_a + pinned_b)
    over = [t for t in report["trace"] if t["outcome"] == f"l3_pin_{refused}"]
    if share is not None:
        assert {t["tenant"] for t in over} == {"team-a"}
        assert all(t["tenant_budget_bytes"] == int(BUDGET * SEGMENT_BYTES * share) for t in over)
    else:
        assert {t["request_id"] for t in over} == {"team-a", "team-b"}
    # Pressure: each tenant's pinned pages survive it.
    assert sum(a["survived"]) >= pinned_a and sum(b["survived"]) >= pinned_b

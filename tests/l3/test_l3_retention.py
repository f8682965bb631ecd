"""L3: the retention plugin's soft pins, on SGLang's own MooncakeStore and a real master, on CPU.

Each case starts a fresh ``mooncake_master`` with the operator's rendered argv, and runs SGLang
0.5.23's ``MooncakeStore`` (set up from the rendered ``mooncake.json``, whose ``kvretention``
section carries the pin budget and the longest pin) in a subprocess, with the retention plugin
loaded by SGLang's own plugin loader (its entry point) or not at all. Pages are written as HiCache backs a
node up (``batch_set_v1`` with the keys its tree computes), then four pools of unhinted pages
press on the 16 MiB pool. What Mooncake was asked to pin is recorded at the client's
``batch_put_from``; what survived is read back byte-exact.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mooncake_harness import SEGMENT_BYTES, MasterFactory, running_master
from retention_runner import OBJECT_BYTES, Request, Scenario, retain, run_scenario

from kvretention.controller.conditions import check_retention_budget
from kvretention.controller.kvstore_metrics import KvStoreReading, parse_usage

pytestmark = pytest.mark.l3

MAX_TTL_S = 43_200
PAGE_BYTES = 2 * OBJECT_BYTES


def master_spec(*, budget: float = 0.5, allow_eviction: bool = False) -> dict[str, Any]:
    return {
        "leaseTtlMilliseconds": 50,
        "eviction": {"highWatermarkRatio": 0.8, "ratio": 0.1},
        "softPin": {
            "defaultTtlSeconds": 600,
            "maxTtlSeconds": MAX_TTL_S,
            "allowEviction": allow_eviction,
            "budgetRatio": budget,
        },
    }


@pytest.fixture(scope="module")
def torch_imports() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import torch"], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        if os.environ.get("KVR_REQUIRE_TORCH"):
            pytest.fail(f"torch does not import: {proc.stderr[-500:]}")
        pytest.skip("SGLang's MooncakeStore needs torch, which does not import here")


def pins_by_object(report: dict[str, Any]) -> dict[str, int | None]:
    """Each object of the scenario's requests -> the pin TTL its put asked for (None: unpinned)."""
    return {k: p["pin_ttl_ms"] for p in report["puts"] for k in p["keys"]}


def page_pins(report: dict[str, Any], rid: str) -> list[int | None]:
    """Per page of ``rid``: the pin TTL both its objects were put with (None: unpinned)."""
    pins = pins_by_object(report)
    out = []
    for k, v in report["requests"][rid]["objects"]:
        assert pins[k] == pins[v], f"the K and V objects of one page were pinned apart: {k}"
        out.append(pins[k])
    return out


REQUESTS = (
    # 22 tokens retained -> rounded down to 5 whole pages of 4; pages 5..7 are not retained.
    Request("hinted", 8, 0, retain({"start": 0, "end": 22, "priority": 50, "duration": 300})),
    # 30 days asked, 12 h (the master's maximum) is what a pin may hold.
    Request("capped", 4, 1_000, retain({"priority": 80, "duration": 2_592_000})),
    Request("plain", 4, 2_000),
    Request("released", 4, 3_000, retain({"priority": 0, "duration": 300})),
    # The hinted request's tokens under another namespace (cache_salt), unhinted: other keys.
    Request("salted", 8, 0, cache_salt="tenant-b"),
)


@pytest.mark.parametrize("plugin", [True, False], ids=["with-plugin", "without-plugin"])
def test_pins_only_retained_pages_and_they_survive_pressure(
    torch_imports: None, start_master: MasterFactory, tmp_path: Path, plugin: bool
) -> None:
    with start_master(master=master_spec()) as master:
        report = run_scenario(master, Scenario(REQUESTS, plugin=plugin), tmp_path)
    requests = report["requests"]
    assert report["hooked"] is plugin
    # The contract: SGLang 0.5.23 still has both targets with the parameters the hooks rely on.
    assert report["contract"] == []
    for rid, info in requests.items():
        assert info["written"] == [True] * len(info["keys"]), f"{rid}: a page was not written"
    assert requests["salted"]["keys"][0] != requests["hinted"]["keys"][0]
    hinted_ttls = page_pins(report, "hinted")
    if not plugin:
        assert parse_usage(report["metrics_after_writes"]).pinned_keys == 0
        assert all(ttl is None for rid in requests for ttl in page_pins(report, rid))
        assert requests["hinted"]["survived"] == [False] * 8
        return
    # Pins on exactly the retained pages, for the directive's remaining time (whole seconds).
    assert [ttl is not None for ttl in hinted_ttls] == [True] * 5 + [False] * 3
    assert all(ttl is not None and 298_000 <= ttl <= 300_000 for ttl in hinted_ttls[:5])
    assert page_pins(report, "capped") == [MAX_TTL_S * 1000] * 4
    for rid in ("plain", "released", "salted"):
        assert page_pins(report, rid) == [None] * len(requests[rid]["keys"]), rid
    assert parse_usage(report["metrics_after_writes"]).pinned_keys == 2 * (5 + 4)
    assert report["stats"] == {
        "pinned": 9,
        "unretained": 3 + 4 + 4 + 8,
        "over_budget": 0,
        "over_tenant_budget": 0,
        "expired": 0,
        "pin_refused": 0,
    }
    # Pressure evicted unpinned pages; the retained ones read back byte-exact.
    assert parse_usage(report["metrics_after_pressure"]).evicted_keys > 0
    assert requests["hinted"]["survived"] == [True] * 5 + [False] * 3
    assert requests["capped"]["survived"] == [True] * 4
    assert not any(requests["plain"]["survived"])


def test_a_pin_ends_with_its_hold(
    torch_imports: None, start_master: MasterFactory, tmp_path: Path
) -> None:
    """A 2 s hold pins for 2 s: after it, pressure evicts the page like any other."""
    requests = (
        Request("short", 4, 0, retain({"priority": 50, "duration": 2})),
        Request("long", 4, 1_000, retain({"priority": 50, "duration": 600})),
    )
    with start_master(master=master_spec()) as master:
        report = run_scenario(master, Scenario(requests, plugin=True, wait_s=3.0), tmp_path)
    assert all(ttl is not None and 1_000 <= ttl <= 2_000 for ttl in page_pins(report, "short"))
    assert report["requests"]["short"]["survived"] == [False] * 4
    assert report["requests"]["long"]["survived"] == [True] * 4


def test_the_budget_holds_under_pressure_writes(
    torch_imports: None, start_master: MasterFactory, tmp_path: Path
) -> None:
    """budgetRatio 0.25 of a 16 MiB segment: 4 MiB of pins, 32 pages. A request retaining 48
    pages gets 32 pinned and 16 written unpinned, each counted and named in the trace; a second
    retained request finds the budget full. Every page is written: no request fails."""
    budget = 0.25
    share_pages = int(budget * SEGMENT_BYTES) // PAGE_BYTES
    requests = (
        Request("big", 48, 0, retain({"priority": 50, "duration": 600})),
        Request("late", 8, 10_000, retain({"priority": 90, "duration": 600})),
    )
    with start_master(master=master_spec(budget=budget)) as master:
        report = run_scenario(master, Scenario(requests, plugin=True), tmp_path)
    big, late = report["requests"]["big"], report["requests"]["late"]
    assert big["written"] == [True] * 48 and late["written"] == [True] * 8
    pinned = [ttl is not None for ttl in page_pins(report, "big")]
    assert pinned == [True] * share_pages + [False] * (48 - share_pages)
    assert page_pins(report, "late") == [None] * 8
    assert report["stats"]["pinned"] == share_pages
    assert report["stats"]["over_budget"] == 48 - share_pages + 8
    assert report["budget_bytes"] == [int(budget * SEGMENT_BYTES)]
    over = [t for t in report["trace"] if t["outcome"] == "l3_pin_over_budget"]
    assert sorted({t["request_id"] for t in over}) == ["big", "late"]
    traced = [page for t in over for page in t["pages"]]
    assert traced == big["keys"][share_pages:] + late["keys"]
    usage = parse_usage(report["metrics_after_writes"])
    assert usage.pinned_keys == 2 * share_pages
    assert usage.pinned_keys * OBJECT_BYTES <= budget * SEGMENT_BYTES
    # Pressure: the pinned share survives, what went past the budget is evicted like the rest.
    assert big["survived"][:share_pages] == [True] * share_pages
    assert not any(big["survived"][share_pages:]) and not any(late["survived"])
    # The operator observes the same, before and after the pressure: pins within the budget.
    for text in (report["metrics_after_writes"], report["metrics_after_pressure"]):
        reading = KvStoreReading("2026-01-01T00:00:00Z", usage=parse_usage(text))
        verdict = check_retention_budget(reading, budget=budget, external=None)
        assert (verdict.status, verdict.reason) == ("True", "WithinBudget"), verdict.message


def test_a_pin_the_master_refuses_is_written_unpinned(
    torch_imports: None, start_master: MasterFactory, tmp_path: Path
) -> None:
    """A master whose maximum pin is shorter than the plugin was told (an external master set up
    apart): the pin is refused (INVALID_PARAMS) and the page written again, unpinned."""
    requests = (Request("long", 4, 0, retain({"priority": 50, "duration": 2_592_000})),)
    settings = {"max_pin_ttl_ms": 86_400_000}  # the master renders 43 200 000
    with start_master(master=master_spec()) as master:
        report = run_scenario(master, Scenario(requests, plugin=True, settings=settings), tmp_path)
    info = report["requests"]["long"]
    assert info["written"] == [True] * 4
    asked = [p for p in report["puts"] if p["pin_ttl_ms"] is not None]
    assert [p["pin_ttl_ms"] for p in asked] == [86_400_000]
    assert set(asked[0]["results"]) == {-600}
    assert page_pins(report, "long") == [None] * 4  # the last put of each object: unpinned
    assert parse_usage(report["metrics_after_writes"]).pinned_keys == 0
    assert report["stats"]["pin_refused"] == 4 and report["stats"]["pinned"] == 0


def test_pins_with_hicache_group_semantics(
    torch_imports: None, start_master: MasterFactory, tmp_path: Path
) -> None:
    """HiCache's Mooncake group semantics (``enable_group_semantics``: each object carries its
    page's group id): the pinned put keeps the group ids and the same pages are pinned."""
    requests = (REQUESTS[0], REQUESTS[2])  # hinted, plain
    with start_master(master=master_spec()) as master:
        scenario = Scenario(requests, plugin=True, extra={"groups": True})
        report = run_scenario(master, scenario, tmp_path)
    assert report["group_semantics"] is True
    assert [ttl is not None for ttl in page_pins(report, "hinted")] == [True] * 5 + [False] * 3
    for put in report["puts"]:
        assert put["results"] == [0] * len(put["keys"])
        # Each object's group is its page (SGLang's own ``_make_group_id`` of the page key).
        pages = [key.rsplit("_", 2)[0] for key in put["keys"]]
        assert put["group_ids"] == [f"sglang-hicache:{page}" for page in pages], put["pin_ttl_ms"]
    assert report["requests"]["hinted"]["survived"] == [True] * 5 + [False] * 3
    assert not any(report["requests"]["plain"]["survived"])


@pytest.mark.parametrize("reads_master", [True, False], ids=["managed-master", "no-metrics-port"])
def test_a_restarted_worker_keeps_the_pool_within_the_budget(
    torch_imports: None, start_master: MasterFactory, tmp_path: Path, reads_master: bool
) -> None:
    """budgetRatio 0.25: a worker pins its whole share (32 pages), then restarts (a new ledger;
    its pins stay in the pool) and is asked to pin 16 more. Reading the master, the new ledger
    reserves its share for the pins still there: the 16 are written unpinned, counted and traced,
    and the pool never holds more than the budget. Without the master's metrics port (an external
    master) the new ledger cannot know, and the pool passes the budget: the documented gap."""
    budget = 0.25
    share_pages = int(budget * SEGMENT_BYTES) // PAGE_BYTES
    requests = (
        Request("before", share_pages, 0, retain({"priority": 50, "duration": 600})),
        Request("after", 16, 10_000, retain({"priority": 90, "duration": 600})),
    )
    scenario = Scenario(
        requests, plugin=True, restart_before=("after",), drop_metrics_port=not reads_master
    )
    with start_master(master=master_spec(budget=budget)) as master:
        started = time.monotonic()
        report = run_scenario(master, scenario, tmp_path)
        # a pin holds what is left of the 600 s hold when its page is written, in whole seconds:
        # at least what the whole run leaves (a loaded machine writes the last pages seconds
        # later), less a second for the clocks' rounding
        floor = (600 - math.ceil(time.monotonic() - started) - 1) * 1000
        url = master.metrics_url
    before, after = report["requests"]["before"], report["requests"]["after"]
    assert before["written"] == [True] * share_pages and after["written"] == [True] * 16
    assert all(ttl is not None and floor <= ttl <= 600_000 for ttl in page_pins(report, "before"))
    assert report["pinned_keys_at_restart"] == [2 * share_pages]
    pinned_keys = parse_usage(report["metrics_after_writes"]).pinned_keys
    if not reads_master:
        assert [ledger["metrics_url"] for ledger in report["ledgers"]] == [None, None]
        assert all(
            ttl is not None and floor <= ttl <= 600_000 for ttl in page_pins(report, "after")
        )
        assert pinned_keys * OBJECT_BYTES > budget * SEGMENT_BYTES
        return
    assert [ledger["metrics_url"] for ledger in report["ledgers"]] == [url, url]
    # The first ledger found an empty pool; the restarted one, its whole share pinned.
    assert [ledger["reserved_keys_at_start"] for ledger in report["ledgers"]] == [
        0,
        2 * share_pages,
    ]
    assert page_pins(report, "after") == [None] * 16
    assert report["stats"]["pinned"] == share_pages
    assert report["stats"]["over_budget"] == 16
    over = [t for t in report["trace"] if t["outcome"] == "l3_pin_over_budget"]
    assert [t["request_id"] for t in over] == ["after"]
    assert over[0]["pages"] == after["keys"]
    assert over[0]["reserved_bytes"] == int(budget * SEGMENT_BYTES)
    assert pinned_keys == 2 * share_pages
    assert pinned_keys * OBJECT_BYTES <= budget * SEGMENT_BYTES


def test_a_master_restart_frees_the_share_and_the_next_put_pins_again(
    torch_imports: None, start_master: MasterFactory, tmp_path: Path
) -> None:
    """budgetRatio 0.25: a worker pins its whole share (32 pages); the master is killed and
    started again on the same ports while the worker stays up. The plugin's watch sees the
    restart (the master's counters went back): it counts it and stops counting the 32 lost pins,
    so 16 new retained pages are pinned; and 16 of the lost pages, written again (as HiCache does
    after computing a prefix anew), are pinned again by the hold the plugin still tracks. Without
    the watch the ledger would count the lost pins until their TTLs end: the 16 new pages would
    go over budget."""
    budget = 0.25
    share_pages = int(budget * SEGMENT_BYTES) // PAGE_BYTES
    requests = (
        Request("before", share_pages, 0, retain({"priority": 50, "duration": 600})),
        Request("after", 16, 10_000, retain({"priority": 90, "duration": 600})),
        Request("again", 16, 0),  # the first 16 pages of "before", unhinted: the same keys
    )
    scenario = Scenario(
        requests,
        plugin=True,
        pressure_pages=0,
        restart_master_before=("after",),
        extra={"master_read_s": 0.2},
    )
    with start_master(master=master_spec(budget=budget)) as master, contextlib.ExitStack() as up:

        def restart() -> None:
            master.process.kill()  # as a crash or an OOM kill: nothing is written anywhere
            master.process.wait(timeout=10)
            up.enter_context(running_master(master.cr, tmp_path / "master-restarted"))

        report = run_scenario(master, scenario, tmp_path / "run", restart_master=restart)
    [seen] = report["master_restarts"]
    page_bytes = PAGE_BYTES
    assert seen["before"] == {
        "ledger_pinned_bytes": share_pages * page_bytes,
        "pool_pinned_keys": 2 * share_pages,
        "restarts_seen": 0,
    }
    assert (seen["restarts_seen"], seen["pins_lost"]) == (1, share_pages)
    assert seen["ledger_pinned_bytes"] == 0 and seen["pool_pinned_keys"] == 0
    restarts = [t for t in report["trace"] if t["outcome"] == "l3_master_restart"]
    assert [(t["pins_lost"], t["bytes_lost"]) for t in restarts] == [
        (share_pages, share_pages * page_bytes)
    ]
    assert "restarted between" in report["stderr"]
    requests_out = report["requests"]
    assert requests_out["after"]["written"] == [True] * 16
    assert requests_out["again"]["written"] == [True] * 16
    assert requests_out["again"]["keys"] == requests_out["before"]["keys"][:16]
    assert all(ttl is not None and ttl >= 590_000 for ttl in page_pins(report, "after"))
    # The last put of each re-written page is pinned again, for what is left of its hold.
    assert all(ttl is not None and ttl >= 590_000 for ttl in page_pins(report, "again"))
    assert report["stats"]["over_budget"] == 0
    assert report["stats"]["pinned"] == share_pages + 16 + 16
    assert parse_usage(report["metrics_after_writes"]).pinned_keys == 2 * (16 + 16)
    # What the worker's /metrics serves of it, counted in SGLang's process.
    served = report["worker_l3_numbers"]
    assert (served["master_restarts"], served["pins_lost"]) == (1, share_pages)
    assert served["pages"]["pinned"] == share_pages + 16 + 16
    assert served["pinned_bytes"] == 32 * page_bytes

"""The L3 half of the retention plugin across a Mooncake master restart: telling one from the
master's ``/metrics``, the ledger that stops counting the pins it lost, and the watch that does
both off the write path. The real master's restart is in ``tests/l3/test_l3_master_restart.py``."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import pytest

from kvretention.retention import l3
from kvretention.retention.directives import Hold
from kvretention.retention.l3_budget import PinLedger
from kvretention.retention.l3_master import MasterReading, detect_restart, read_master
from support.l3_fakes import MASTER_CONFIG, fake_store, serve_master_metrics, use_mooncake_config

FIXTURE = Path(__file__).parents[2] / "fixtures" / "mooncake_master_metrics.prom"
NOW = 1_000_000.0


def reading(at: float, **counters: float) -> MasterReading:
    return MasterReading(at=at, counters=counters, pinned_keys=0)


def test_a_reading_of_the_real_masters_metrics() -> None:
    got = read_master(FIXTURE.read_text(), at=NOW)
    assert got.at == NOW and got.pinned_keys == 8
    assert got.counters["master_put_start_requests_total"] == 88
    assert all(name.endswith("_total") for name in got.counters)
    assert "master_key_count" not in got.counters  # a gauge: it may go down without a restart
    with pytest.raises(ValueError, match="missing"):
        read_master("up 1\n", at=NOW)


RESTARTS = [
    pytest.param({"a_total": 5, "b_total": 7}, {"a_total": 5, "b_total": 7}, (), id="unchanged"),
    pytest.param({"a_total": 5, "b_total": 7}, {"a_total": 9, "b_total": 70}, (), id="grew"),
    pytest.param({"a_total": 5}, {"a_total": 5, "new_total": 0}, (), id="a-new-counter"),
    pytest.param(
        {"a_total": 5, "b_total": 7},
        {"a_total": 0, "b_total": 0},
        ("a_total", "b_total"),
        id="all-reset",
    ),
    pytest.param(
        {"a_total": 5, "b_total": 7},
        {"a_total": 80, "b_total": 2},
        ("b_total",),
        id="one-went-back",
    ),
    pytest.param({"a_total": 5}, {}, (), id="counter-gone"),
]


@pytest.mark.parametrize(("before", "after", "back"), RESTARTS)
def test_a_restart_is_a_counter_that_went_back(
    before: dict[str, float], after: dict[str, float], back: tuple[str, ...]
) -> None:
    got = detect_restart(reading(NOW, **before), reading(NOW + 10, **after))
    if not back:
        assert got is None
        return
    assert got is not None
    assert (got.previous_at, got.seen_at, got.counters) == (NOW, NOW + 10, back)
    assert got.lost_before == NOW


DROPS = [
    # (the last reading of the old master, pins dropped, bytes left)
    pytest.param(NOW, 2, 30, id="the-two-written-before"),
    pytest.param(NOW - 100, 0, 60, id="none-written-before"),
    pytest.param(NOW + 100, 3, 0, id="all-written-before"),
]


@pytest.mark.parametrize(("before", "dropped", "left"), DROPS)
def test_the_ledger_drops_the_pins_a_restart_took(before: float, dropped: int, left: int) -> None:
    ledger = PinLedger(capacity_bytes=70, tenant_share=1.0)
    for key, nbytes, at, tenant in (
        ("p1", 10, -50, "a"),
        ("p2", 20, -10, "b"),
        ("p3", 30, 10, "b"),
    ):
        assert ledger.admit(key, nbytes, ends=NOW + 600, now=NOW + at - 1, tenant=tenant)
        ledger.confirm_written([key], at=NOW + at)
    # Admitted, its put not returned: it may be on the new master, so it stays counted.
    assert ledger.admit("p4", 10, ends=NOW + 600, now=NOW - 60)
    assert not ledger.admit("p5", 10, ends=NOW + 600, now=NOW + 20)  # the share is full
    assert ledger.drop_written_before(before) == (dropped, 60 - left)
    assert ledger.pinned_bytes == left + 10
    assert sum(ledger.tenant_bytes().values()) == left
    # What was dropped is admitted anew when it is put again: it no longer takes the share.
    assert ledger.admit("p5", 10, ends=NOW + 600, now=NOW + 30) is (left <= 50)


def test_a_re_pinned_page_counts_once_and_a_second_restart_drops_it() -> None:
    ledger = PinLedger(capacity_bytes=100)
    assert ledger.admit("p", 40, ends=NOW + 600, now=NOW - 50)
    ledger.confirm_written(["p", "never-admitted"], at=NOW - 49)
    assert ledger.drop_written_before(NOW) == (1, 40)
    assert ledger.admit("p", 40, ends=NOW + 600, now=NOW + 5)
    ledger.confirm_written(["p"], at=NOW + 5)
    assert ledger.drop_written_before(NOW) == (0, 0)
    assert ledger.pinned_bytes == 40
    assert ledger.drop_written_before(NOW + 6) == (1, 40)
    assert ledger.pinned_bytes == 0
    ledger.forget("p")  # nothing left: no negative count
    assert ledger.pinned_bytes == 0


def _wait(predicate: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_watch_sees_a_restart_and_frees_the_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A running client with pins; the master restarts (its counters start again at 0): the
    ledger stops counting the pins written before, the restart is counted, traced and logged once."""
    old = FIXTURE.read_text()
    fresh = re.sub(r"^(master_\w+_total) \d+$", r"\1 0", old, flags=re.M)
    fresh = fresh.replace("master_soft_pin_key_count 8", "master_soft_pin_key_count 0")
    bodies = [old.encode()]
    server, port = serve_master_metrics(bodies)
    use_mooncake_config(monkeypatch, tmp_path, {**MASTER_CONFIG, "master_metrics_port": port})
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("KVR_REQUEST_TRACE", str(trace))
    monkeypatch.setattr(l3, "POOL_READ_S", 0.05)
    monkeypatch.setattr(l3, "MASTER_READ_S", 0.05)
    monkeypatch.setattr(l3.STATS, "master_restarts", 0)
    monkeypatch.setattr(l3.STATS, "pins_lost", 0)
    store = fake_store()
    caplog.set_level(logging.WARNING, logger="kvretention.retention.l3")
    state = l3.client_state(store)
    try:
        assert state.pool_read.wait(30)
        state.ledger.reserved_until = 0.0  # no earlier process: the whole share is this one's
        written = time.time()
        assert state.ledger.admit("a", 1_000, ends=written + 600, now=written)
        assert state.ledger.admit("b", 2_000, ends=written + 600, now=written)
        state.ledger.confirm_written(["a", "b"], at=written)
        reads = state.master_reads
        _wait(lambda: state.master_reads >= reads + 2)
        assert state.ledger.pinned_bytes == 3_000 and l3.STATS.master_restarts == 0
        bodies.append(fresh.encode())
        _wait(lambda: l3.STATS.master_restarts == 1)
        assert state.ledger.pinned_bytes == 0
        assert l3.STATS.pins_lost == 2
        reads = state.master_reads
        _wait(lambda: state.master_reads >= reads + 3)
        assert l3.STATS.master_restarts == 1  # the new master's counters only grow from here
    finally:
        state.closed.set()
        l3._CLIENTS.pop(id(store), None)
        server.shutdown()
    warnings = [r.getMessage() for r in caplog.records if "restarted" in r.getMessage()]
    assert len(warnings) == 1
    assert "2 pins (3000 bytes)" in warnings[0]
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(r["outcome"], r["pins_lost"], r["bytes_lost"]) for r in records] == [
        ("l3_master_restart", 2, 3_000)
    ]


def test_only_a_pin_whose_put_returned_ok_counts_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The put hook confirms a pin once the master answered its put: a page whose put failed is
    not known to be on the old master, so a restart leaves it counted (the budget stays a bound)."""
    use_mooncake_config(monkeypatch, tmp_path, {"kvretention": {"pin_budget_ratio": 0.5}})
    pages = ["c0ffee01", "c0ffee02"]
    until = time.time() + 600
    l3.INDEX.record(pages, [Hold(0, 4, 50, until)] * 2, scope="s", rid="r")
    keys = [f"{page}_0_{kv}" for page in pages for kv in ("k", "v")]
    monkeypatch.setattr(l3, "_put_pinned", lambda *args, **kwargs: [0, 0, -1, -1])
    store = fake_store(config_prefix=None)
    try:
        got = l3.put_with_pins(store, lambda *a: [0] * 4, keys, [1, 2, 3, 4], [10, 10, 10, 10])
        assert got == [0, 0, -1, -1]
        ledger = l3.client_state(store).ledger
        assert ledger.pinned_bytes == 40
        assert ledger.drop_written_before(time.time() + 1) == (1, 20)
        assert ledger.pinned_bytes == 20  # the failed put's pin: still counted
    finally:
        l3._CLIENTS.pop(id(store), None)

"""The Mooncake master's /metrics text -> numbers -> the RetentionBudget condition and exports."""

from __future__ import annotations

import asyncio
import datetime as dt
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvretention.controller.conditions import Verdict, budget_enforced, check_retention_budget
from kvretention.controller.kvstore_client import read_master_metrics, read_worker_failures
from kvretention.controller.kvstore_metrics import (
    REQUIRED,
    KvStoreReading,
    KvStoreUsage,
    MetricsFormatError,
    parse_master_metrics,
    parse_usage,
    plan_metrics_read,
    plan_read_interval,
    plan_reading,
    reading_from_status,
)
from kvretention.controller.metrics import Metrics
from support.loop_tasks import ended_with_exception, recording_tasks
from support.loopback_http import serving

REAL_DUMP = Path(__file__).parents[2] / "fixtures" / "mooncake_master_metrics.prom"
"""A real mooncake_master 0.3.13.post1 /metrics after 8 pinned and 80 pressure writes of 256 KiB
into a 16 MiB pool (captured with tests/l3/mooncake_harness.py)."""

NOW = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)
STAMP = "2026-12-01T12:00:00Z"
MIB = 1024 * 1024


def usage(**overrides: int) -> KvStoreUsage:
    values = {
        "capacity_bytes": 100 * MIB,
        "used_bytes": 50 * MIB,
        "keys": 50,
        "pinned_keys": 20,
        "evicted_keys": 7,
        "evicted_bytes": 7 * MIB,
        "evictions": 2,
    }
    values.update(overrides)
    return KvStoreUsage(**values)


def test_real_master_dump_parses_to_its_numbers() -> None:
    got = parse_usage(REAL_DUMP.read_text())
    assert got == KvStoreUsage(
        capacity_bytes=16_777_216,
        used_bytes=11_796_480,
        keys=45,
        pinned_keys=8,
        evicted_keys=43,
        evicted_bytes=11_272_192,
        evictions=3,
    )
    assert got.pinned_bytes == round(11_796_480 * 8 / 45)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("# HELP x y\n# TYPE x gauge\nx 1\n", {"x": 1.0}),
        ("a 1.5e3\nb   2\n", {"a": 1500.0, "b": 2.0}),
        ('seg{segment="1.2.3.4:1"} 9\nplain 3\n', {"plain": 3.0}),
        ("with_ts 4 1700000000000\n", {"with_ts": 4.0}),
        ("nan_value NaN\n", {"nan_value": float("nan")}),
        ("lonely\n", {}),
    ],
    ids=["empty", "comments", "floats", "labels-skipped", "timestamp", "nan", "no-value"],
)
def test_parse_master_metrics(text: str, expected: dict[str, float]) -> None:
    got = parse_master_metrics(text)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name] == value or (value != value and got[name] != got[name])


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("master_key_count one\n", "has no number"),
        ("some_other_exporter 1\n", "missing master_total_capacity_bytes"),
        ("\n".join(f"{n} 1" for n in REQUIRED if n != "master_soft_pin_key_count"), "soft_pin"),
        ("\n".join(f"{n} -1" for n in REQUIRED), "not a count"),
        ("\n".join(f"{n} +Inf" for n in REQUIRED), "not a count"),
    ],
    ids=["bad-number", "not-mooncake", "one-missing", "negative", "infinite"],
)
def test_unusable_metrics_are_refused(text: str, error: str) -> None:
    with pytest.raises(MetricsFormatError, match=error):
        parse_usage(text)


@pytest.mark.parametrize(
    ("u", "pinned_bytes", "ratio"),
    [
        (usage(), 20 * MIB, 0.2),
        (usage(keys=0, pinned_keys=0, used_bytes=0), 0, 0.0),
        (usage(capacity_bytes=0, used_bytes=0, keys=0, pinned_keys=0), 0, None),
        (usage(pinned_keys=80), 50 * MIB, 0.5),  # more pins than keys (expired pins) caps
    ],
    ids=["mean-size", "empty-pool", "no-segment", "capped"],
)
def test_pinned_share_estimate(u: KvStoreUsage, pinned_bytes: int, ratio: float | None) -> None:
    assert u.pinned_bytes == pinned_bytes
    assert u.pinned_ratio == (pytest.approx(ratio) if ratio is not None else None)


@pytest.mark.parametrize(
    ("reading", "budget", "external", "expected"),
    [
        (None, 0.5, "m:1", ("Unknown", "ExternalMaster")),
        (None, 0.5, None, ("Unknown", "NotMeasured")),
        (KvStoreReading(STAMP, error="boom"), 0.5, None, ("Unknown", "MetricsUnavailable")),
        (
            KvStoreReading(STAMP, usage=usage(capacity_bytes=0, keys=0, pinned_keys=0)),
            0.5,
            None,
            ("Unknown", "NoCapacity"),
        ),
        (KvStoreReading(STAMP, usage=usage()), None, None, ("True", "NoBudget")),
        (KvStoreReading(STAMP, usage=usage()), 0.3, None, ("True", "WithinBudget")),
        (KvStoreReading(STAMP, usage=usage()), 0.2, None, ("True", "WithinBudget")),
        (KvStoreReading(STAMP, usage=usage()), 0.19, None, ("False", "OverBudget")),
    ],
    ids=[
        "external",
        "not-read",
        "unreadable",
        "no-segment",
        "no-budget",
        "within",
        "at-the-budget",
        "over",
    ],
)
def test_retention_budget_condition(
    reading: KvStoreReading | None,
    budget: float | None,
    external: str | None,
    expected: tuple[str, str],
) -> None:
    verdict = check_retention_budget(reading, budget=budget, external=external)
    assert (verdict.status, verdict.reason) == expected
    if expected[1] == "MetricsUnavailable":
        assert verdict.message == "boom"
    if expected[1] == "OverBudget":
        assert "20.0%" in verdict.message and "19.0%" in verdict.message


@pytest.mark.parametrize(
    ("last_read", "due"),
    [
        (None, True),
        (NOW - dt.timedelta(seconds=15), False),
        (NOW - dt.timedelta(seconds=30), True),
        (NOW + dt.timedelta(minutes=5), True),  # from the future: the clock jumped back, re-read
    ],
    ids=["never", "fresh", "stale", "future"],
)
def test_plan_metrics_read(last_read: dt.datetime | None, due: bool) -> None:
    assert plan_metrics_read(last_read, now=NOW, interval_seconds=30) is due


EARLIER = "2026-12-01T11:00:00Z"
GRACE = 60.0


def _at(seconds: float) -> dt.datetime:
    return NOW + dt.timedelta(seconds=seconds)


def _stamp(seconds: float) -> str:
    return _at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


STALE = KvStoreReading(EARLIER, usage=usage(), error="dns", stale_since=STAMP)
"""Numbers read at EARLIER, reads failing since NOW."""
NEVER_READ = KvStoreReading(STAMP, error="dns", stale_since=STAMP)
"""Reads failing since NOW, no numbers before."""


@pytest.mark.parametrize(
    ("previous", "current", "at", "expected"),
    [
        (None, KvStoreReading(STAMP, usage=usage()), 0, KvStoreReading(STAMP, usage=usage())),
        (
            KvStoreReading(EARLIER, usage=usage()),
            KvStoreReading(STAMP, usage=usage()),
            0,
            KvStoreReading(EARLIER, usage=usage()),
        ),
        (
            KvStoreReading(EARLIER, usage=usage()),
            KvStoreReading(STAMP, usage=usage(pinned_keys=21)),
            0,
            KvStoreReading(STAMP, usage=usage(pinned_keys=21)),
        ),
        # The first read right after the master became ready: its name does not resolve yet.
        (None, KvStoreReading(STAMP, error="dns"), 0, NEVER_READ),
        # A good reading, then a failed read: the numbers stay, marked stale, not unavailable.
        (
            KvStoreReading(EARLIER, usage=usage()),
            KvStoreReading(STAMP, error="dns"),
            0,
            STALE,
        ),
        # Still failing inside the grace period: unchanged (no status write), the first error kept.
        (STALE, KvStoreReading(_stamp(55), error="refused"), 55, STALE),
        (NEVER_READ, KvStoreReading(_stamp(30), error="refused"), 30, NEVER_READ),
        # Recovered inside the grace period: fresh again, the numbers' own time kept.
        (
            STALE,
            KvStoreReading(_stamp(10), usage=usage()),
            10,
            KvStoreReading(EARLIER, usage=usage()),
        ),
        (
            NEVER_READ,
            KvStoreReading(_stamp(10), usage=usage()),
            10,
            KvStoreReading(_stamp(10), usage=usage()),
        ),
        # Failing past the grace period: unreadable, dated from the first failure.
        (
            STALE,
            KvStoreReading(_stamp(GRACE), error="refused"),
            GRACE,
            KvStoreReading(STAMP, error="dns"),
        ),
        (
            NEVER_READ,
            KvStoreReading(_stamp(90), error="refused"),
            90,
            KvStoreReading(STAMP, error="dns"),
        ),
        # A stale mark from the future (the clock jumped back) or not ours: not held forever.
        (STALE, KvStoreReading(_stamp(-600), error="x"), -600, KvStoreReading(STAMP, error="dns")),
        (
            KvStoreReading(EARLIER, usage=usage(), error="dns", stale_since="yesterday"),
            KvStoreReading(STAMP, error="x"),
            0,
            KvStoreReading("yesterday", error="dns"),
        ),
        # Unreadable already: one state whatever the error.
        (
            KvStoreReading(EARLIER, error="down: Name or service not known"),
            KvStoreReading(STAMP, error="down: no answer within 2s"),
            0,
            KvStoreReading(EARLIER, error="down: Name or service not known"),
        ),
        (
            KvStoreReading(EARLIER, error="down"),
            KvStoreReading(STAMP, usage=usage()),
            0,
            KvStoreReading(STAMP, usage=usage()),
        ),
    ],
    ids=[
        "first",
        "same-numbers",
        "new-numbers",
        "first-read-fails",
        "lost-after-numbers",
        "still-failing",
        "still-failing-never-read",
        "recovered-same-numbers",
        "recovered-first-numbers",
        "past-grace",
        "past-grace-never-read",
        "stale-from-the-future",
        "stale-mark-unparsable",
        "unreadable-other-error",
        "unreadable-recovered",
    ],
)
def test_a_failed_read_is_stale_until_the_grace_period_passes(
    previous: KvStoreReading | None, current: KvStoreReading, at: float, expected: KvStoreReading
) -> None:
    assert plan_reading(previous, current, now=_at(at), grace_seconds=GRACE) == expected


def test_without_a_grace_period_a_failed_read_is_unreadable_at_once() -> None:
    current = KvStoreReading(STAMP, error="dns")
    got = plan_reading(KvStoreReading(EARLIER, usage=usage()), current, now=NOW, grace_seconds=0)
    assert got == current


@pytest.mark.parametrize(
    ("reading", "interval"),
    [(None, 30.0), (KvStoreReading(STAMP, usage=usage()), 30.0), (STALE, 5.0), (NEVER_READ, 5.0)],
    ids=["none", "fresh", "stale", "never-read"],
)
def test_a_stale_reading_is_retried_sooner(reading: KvStoreReading | None, interval: float) -> None:
    assert plan_read_interval(reading) == interval


@pytest.mark.parametrize(
    ("reading", "expected", "says"),
    [
        (STALE, ("True", "WithinBudget"), f"stale: the numbers are from {EARLIER}"),
        (NEVER_READ, ("Unknown", "NotMeasured"), "not been read yet: reads failing since"),
        (KvStoreReading(STAMP, error="dns"), ("Unknown", "MetricsUnavailable"), "dns"),
    ],
    ids=["stale-numbers", "stale-never-read", "unreadable"],
)
def test_a_stale_reading_keeps_its_verdict_and_says_so(
    reading: KvStoreReading, expected: tuple[str, str], says: str
) -> None:
    verdict = check_retention_budget(reading, budget=0.5, external=None)
    assert (verdict.status, verdict.reason) == expected
    assert says in verdict.message
    if reading.stale_since is not None:
        assert f"since {STAMP} (dns)" in verdict.message


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (None, None),
        ({"kvStore": {"ready": 1, "desired": 1}}, None),
        (
            {"kvStore": {"observedAt": STAMP, **usage().to_status(), "pinnedRatio": 0.2}},
            KvStoreReading(STAMP, usage=usage()),
        ),
        (
            {
                "kvStore": {"observedAt": STAMP},
                "conditions": [{"type": "RetentionBudget", "message": "refused"}],
            },
            KvStoreReading(STAMP, error="refused"),
        ),
        (
            {"kvStore": {"observedAt": STAMP, **usage().to_status(), "objects": "many"}},
            KvStoreReading(STAMP, error="not read"),
        ),
        (
            {
                "kvStore": {
                    "observedAt": EARLIER,
                    **usage().to_status(),
                    "staleSince": STAMP,
                    "staleReason": "dns",
                },
            },
            STALE,
        ),
        (
            {"kvStore": {"observedAt": STAMP, "staleSince": STAMP, "staleReason": "dns"}},
            NEVER_READ,
        ),
    ],
    ids=[
        "no-status",
        "never-read",
        "numbers",
        "error-from-condition",
        "tampered",
        "stale",
        "stale-never-read",
    ],
)
def test_reading_round_trips_through_status(
    status: dict[str, Any] | None, expected: KvStoreReading | None
) -> None:
    assert reading_from_status(status) == expected


def _sample(m: Metrics, name: str) -> float | None:
    value = m.registry.get_sample_value(name, {"fleet_namespace": "ns", "fleet": "f"})
    return None if value is None else float(value)


def test_metrics_export_the_reading_and_the_budget() -> None:
    m = Metrics()
    m.observe_kvstore("ns", "f", KvStoreReading(STAMP, usage=usage()), budget=0.1)
    assert _sample(m, "kvretention_kvstore_metrics_up") == 1
    assert _sample(m, "kvretention_kvstore_capacity_bytes") == 100 * MIB
    assert _sample(m, "kvretention_kvstore_pinned_objects") == 20
    assert _sample(m, "kvretention_kvstore_evicted_objects") == 7
    assert _sample(m, "kvretention_kvstore_pinned_ratio") == pytest.approx(0.2)
    assert _sample(m, "kvretention_kvstore_budget_ratio") == 0.1
    assert _sample(m, "kvretention_kvstore_over_budget") == 1
    m.observe_kvstore("ns", "f", KvStoreReading(STAMP, usage=usage()), budget=None)
    assert _sample(m, "kvretention_kvstore_budget_ratio") is None
    assert _sample(m, "kvretention_kvstore_over_budget") is None
    m.observe_kvstore("ns", "f", KvStoreReading(STAMP, error="down"), budget=0.5)
    assert _sample(m, "kvretention_kvstore_metrics_up") == 0
    m.forget_kvstore("ns", "f")
    assert _sample(m, "kvretention_kvstore_metrics_up") is None
    assert _sample(m, "kvretention_kvstore_capacity_bytes") is None


# -- the I/O half, against a real loopback HTTP server -------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""
    delay = 0.0
    promised = 0
    """Content-Length to announce beyond the body (a master that dies mid-answer)."""
    stop = threading.Event()

    def do_GET(self) -> None:
        if self.delay:
            self.stop.wait(self.delay)
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body) + self.promised))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {"stop": threading.Event()})
    with serving(handler) as base_url:
        try:
            yield f"{base_url}/metrics", handler
        finally:
            handler.stop.set()  # before the shutdown, which waits for a delayed answer


async def test_reads_a_master(server: tuple[str, type[_Handler]]) -> None:
    url, handler = server
    handler.body = REAL_DUMP.read_bytes()
    reading = await read_master_metrics(url, now=NOW)
    assert reading == KvStoreReading(STAMP, usage=parse_usage(REAL_DUMP.read_text()))


async def test_a_slow_master_is_cut_off(server: tuple[str, type[_Handler]]) -> None:
    url, handler = server
    handler.body, handler.delay = REAL_DUMP.read_bytes(), 5.0
    started = asyncio.get_running_loop().time()
    reading = await read_master_metrics(url, now=NOW, limit_seconds=0.3)
    assert asyncio.get_running_loop().time() - started < 2.0
    assert reading.usage is None and reading.error is not None
    assert url in reading.error


@pytest.mark.parametrize(
    ("body", "error"),
    [(b"<html>\n</html>\n", "missing"), (b"master_key_count x\n", "no number")],
    ids=["not-mooncake", "garbage"],
)
async def test_an_unusable_answer_is_a_reading_with_an_error(
    server: tuple[str, type[_Handler]], body: bytes, error: str
) -> None:
    url, handler = server
    handler.body = body
    reading = await read_master_metrics(url, now=NOW)
    assert reading.usage is None and error in (reading.error or "")


async def test_an_answer_cut_short_is_a_reading_with_an_error(
    server: tuple[str, type[_Handler]],
) -> None:
    url, handler = server
    handler.body, handler.promised = b"master_key_count 1\n", 1000
    reading = await read_master_metrics(url, now=NOW)
    assert reading.usage is None and url in (reading.error or "")


async def test_nothing_listening_is_a_reading_with_an_error() -> None:
    reading = await read_master_metrics("http://127.0.0.1:1/metrics", now=NOW)
    assert reading.observed_at == STAMP
    assert reading.usage is None and "127.0.0.1:1" in (reading.error or "")


@pytest.mark.parametrize(
    ("body", "delay", "promised", "listening"),
    [
        (b"master_key_count x\n", 0.0, 0, True),
        (b"master_key_count 1\n", 0.0, 1000, True),
        (b"master_key_count 1\n", 5.0, 0, True),
        (b"", 0.0, 0, False),
    ],
    ids=["garbage", "cut-short", "slow", "nothing-listening"],
)
async def test_no_task_of_a_failed_read_ends_with_an_exception(
    server: tuple[str, type[_Handler]], body: bytes, delay: float, promised: int, listening: bool
) -> None:
    """kopf re-raises, when it stops, the exception of every task in the loop that ended with
    one, handled or not: a read that failed while SIGTERM was handled made the operator exit 1."""
    url, handler = server
    handler.body, handler.delay, handler.promised = body, delay, promised
    if not listening:
        url = "http://127.0.0.1:1/metrics"
    with recording_tasks() as created:
        reading = await read_master_metrics(url, now=NOW, limit_seconds=0.3)
        failures = await read_worker_failures("w-0", url, limit_seconds=0.3)
        await asyncio.sleep(0.5)  # a timed-out thread finishes meanwhile
    assert reading.error is not None
    assert failures.error is not None or body  # a worker's parser skips lines it cannot read
    assert created  # the reads run in tasks: the property below is about them
    assert ended_with_exception(created) == []


@pytest.mark.parametrize(
    ("enforced", "budget", "says"),
    [
        (True, 0.3, "enforced by the workers' retention plugin"),
        (False, 0.3, "observed only"),
        (None, 0.3, None),
        (True, None, None),  # no budget: nothing to enforce
    ],
    ids=["enforced", "observed-only", "unknown", "no-budget"],
)
def test_retention_budget_says_enforced_and_observed(
    enforced: bool | None, budget: float | None, says: str | None
) -> None:
    for reading, external in ((KvStoreReading(STAMP, usage=usage()), None), (None, "m:1")):
        message = check_retention_budget(
            reading, budget=budget, external=external, enforced=enforced
        ).message
        if says is None:
            assert "enforced" not in message and "observed only" not in message
        else:
            assert says in message


@pytest.mark.parametrize(
    ("status", "enforced"),
    [("True", True), ("False", False), ("Unknown", None)],
)
def test_the_budget_is_enforced_where_retention_is_applied(
    status: str, enforced: bool | None
) -> None:
    assert budget_enforced(Verdict(status, "R", "m")) is enforced

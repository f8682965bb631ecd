"""The workers' hook failure counter: parsed from /metrics text, and its increase between two
readings (a counter that stays flat says nothing, whatever it reached)."""

from __future__ import annotations

from typing import Any

import pytest

from kvretention.controller.kvstore_metrics import MetricsFormatError
from kvretention.controller.worker_metrics import (
    FleetFailures,
    HookIncrease,
    PodFailures,
    describe_increases,
    metrics_url,
    parse_hook_failures,
    plan_failures,
    scrape_targets,
)

HELP = (
    "# HELP kvretention_retention_hook_failures_total Retention plugin hooks that failed\n"
    "# TYPE kvretention_retention_hook_failures_total counter\n"
)


def sample(hook: str, fallback: str, value: str) -> str:
    return f'kvretention_retention_hook_failures_total{{hook="{hook}",fallback="{fallback}"}} {value}\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("# a worker image before the counter\nprocess_cpu_seconds_total 1.5\n", {}),
        (
            HELP
            + sample("checkpoint", "unretained", "0.0")
            + sample("l3_put", "unpinned", "0.0")
            + sample("l3_record", "unpinned", "0.0"),
            {"checkpoint": 0, "l3_put": 0, "l3_record": 0},
        ),
        (HELP + sample("checkpoint", "unretained", "3.0"), {"checkpoint": 3}),
        # Labels in either order, spaces, a timestamp after the value.
        (
            'kvretention_retention_hook_failures_total{ fallback="unpinned", hook="l3_put" } 2 1700\n',
            {"l3_put": 2},
        ),
        # Two fallbacks of one hook (a future label value) add up.
        (
            sample("checkpoint", "unretained", "1") + sample("checkpoint", "other", "2"),
            {"checkpoint": 3},
        ),
        # The _created series prometheus_client may add is another name.
        (
            'kvretention_retention_hook_failures_created{hook="checkpoint"} 1.7e9\n'
            + sample("checkpoint", "unretained", "4"),
            {"checkpoint": 4},
        ),
        # An escaped quote in a label value does not end it.
        (sample('we\\"ird', "unknown", "1"), {'we\\"ird': 1}),
    ],
    ids=["empty", "no-counter", "all-zero", "one", "order", "summed", "created", "escaped"],
)
def test_parse_hook_failures(text: str, expected: dict[str, int]) -> None:
    assert parse_hook_failures(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        sample("checkpoint", "unretained", "many"),
        sample("checkpoint", "unretained", "-1"),
        sample("checkpoint", "unretained", "NaN"),
        sample("checkpoint", "unretained", "+Inf"),
        'kvretention_retention_hook_failures_total{fallback="unpinned"} 1\n',
        'kvretention_retention_hook_failures_total{hook="x" 1\n',
        "kvretention_retention_hook_failures_total{hook=x} 1\n",
        'kvretention_retention_hook_failures_total{hook="x"}\n',
    ],
    ids=["word", "negative", "nan", "inf", "no-hook", "unclosed", "unquoted", "no-value"],
)
def test_parse_hook_failures_refuses_what_no_worker_serves(text: str) -> None:
    with pytest.raises(MetricsFormatError):
        parse_hook_failures(text)


def reading(**pods: dict[str, int]) -> FleetFailures:
    return FleetFailures(counts=pods)


@pytest.mark.parametrize(
    ("previous", "reads", "increases", "baseline"),
    [
        # The operator's first reading: a baseline, whatever the counts.
        (None, [PodFailures("w-0", {"checkpoint": 7})], [], {"w-0": {"checkpoint": 7}}),
        # Flat: healthy, however high.
        (
            reading(**{"w-0": {"checkpoint": 7}}),
            [PodFailures("w-0", {"checkpoint": 7})],
            [],
            {"w-0": {"checkpoint": 7}},
        ),
        # Grown: the increase, per pod and hook.
        (
            reading(**{"w-0": {"checkpoint": 7, "l3_put": 0}, "w-1": {}}),
            [PodFailures("w-0", {"checkpoint": 9, "l3_put": 1}), PodFailures("w-1", {"l3_put": 2})],
            [
                HookIncrease("w-0", "checkpoint", 2),
                HookIncrease("w-0", "l3_put", 1),
                HookIncrease("w-1", "l3_put", 2),
            ],
            {"w-0": {"checkpoint": 9, "l3_put": 1}, "w-1": {"l3_put": 2}},
        ),
        # Below the last value: the worker restarted, all of it is new.
        (
            reading(**{"w-0": {"checkpoint": 7}}),
            [PodFailures("w-0", {"checkpoint": 3})],
            [HookIncrease("w-0", "checkpoint", 3)],
            {"w-0": {"checkpoint": 3}},
        ),
        # A new pod in a fleet read before: its baseline.
        (
            reading(**{"w-0": {"checkpoint": 1}}),
            [PodFailures("w-0", {"checkpoint": 1}), PodFailures("w-1", {"checkpoint": 5})],
            [],
            {"w-0": {"checkpoint": 1}, "w-1": {"checkpoint": 5}},
        ),
        # A failed read keeps the baseline and says nothing; a pod gone is forgotten.
        (
            reading(**{"w-0": {"checkpoint": 1}, "w-gone": {"checkpoint": 1}}),
            [PodFailures("w-0", error="timeout")],
            [],
            {"w-0": {"checkpoint": 1}},
        ),
    ],
    ids=["first", "flat", "grown", "restarted", "new-pod", "unread-and-gone"],
)
def test_plan_failures(
    previous: FleetFailures | None,
    reads: list[PodFailures],
    increases: list[HookIncrease],
    baseline: dict[str, dict[str, int]],
) -> None:
    got = plan_failures(previous, reads)
    assert list(got.increases) == increases
    assert got.counts == baseline


def test_a_failed_read_between_two_readings_loses_no_failure() -> None:
    first = plan_failures(None, [PodFailures("w-0", {"checkpoint": 1})])
    unread = plan_failures(first, [PodFailures("w-0", error="timeout")])
    assert unread.unread == ("w-0",) and unread.increases == ()
    later = plan_failures(unread, [PodFailures("w-0", {"checkpoint": 4})])
    assert later.increases == (HookIncrease("w-0", "checkpoint", 3),)


def test_describe_increases_names_pods_hooks_and_what_the_worker_did() -> None:
    text = describe_increases(
        [
            HookIncrease("w-0", "checkpoint", 2),
            HookIncrease("w-0", "l3_put", 1),
            HookIncrease("w-1", "future", 1),
        ]
    )
    assert text == (
        "pod w-0: checkpoint 2 (KV left unretained), l3_put 1 (pages written unpinned); "
        "pod w-1: future 1 (fell back)"
    )


def pod(name: str, *, ip: str | None = "10.0.0.1", ready: bool = True, **meta: Any) -> Any:
    status: dict[str, Any] = {
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]
    }
    if ip is not None:
        status["podIP"] = ip
    return {"metadata": {"name": name, **meta}, "status": status}


def test_scrape_targets_are_ready_live_pods_with_an_ip() -> None:
    pods = [
        pod("w-2", ip="fd00::2"),
        pod("w-0"),
        pod("w-1", ready=False),
        pod("w-3", ip=None),
        pod("w-4", deletionTimestamp="2025-01-01T00:00:00Z"),
        pod("w-5", ip="not-an-ip"),
    ]
    assert scrape_targets(pods) == [
        ("w-0", "http://10.0.0.1:9100/metrics"),
        ("w-2", "http://[fd00::2]:9100/metrics"),
    ]
    assert metrics_url("10.1.2.3", port=1) == "http://10.1.2.3:1/metrics"

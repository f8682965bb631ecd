"""Placement from what the workers' engines report resident (``router --kv-residency``)."""

from __future__ import annotations

from typing import Any

import pytest

from kvretention.common.tenancy import cache_salt_for
from kvretention.dataplane.router.placement import Choice, WorkerView, plan_pair, plan_worker
from kvretention.dataplane.router.residency import (
    ResidencySnapshot,
    parse_residency,
    plan_resident,
    residency_key,
)

A, B, C = "http://a", "http://b", "http://c"


def views(
    *, unhealthy: tuple[str, ...] = (), busy: dict[str, int] | None = None
) -> list[WorkerView]:
    busy = busy or {}
    return [
        WorkerView(url=u, healthy=u not in unhealthy, outstanding=busy.get(u, 0)) for u in (A, B, C)
    ]


PLACEMENTS: list[tuple[str, dict[str, Any], Choice]] = [
    ("no residency: least loaded", {}, Choice(url=A, sticky=False)),
    ("resident wins over load", {"resident": {B: 100}}, Choice(url=B, sticky=False, resident=100)),
    (
        "most resident tokens wins",
        {"resident": {B: 100, C: 300}},
        Choice(url=C, sticky=False, resident=300),
    ),
    (
        "a tie goes to the less loaded",
        {"resident": {B: 100, C: 100}, "busy": {B: 2}},
        Choice(url=C, sticky=False, resident=100),
    ),
    (
        "resident on a busy worker still wins",
        {"resident": {B: 100}, "busy": {B: 50}},
        Choice(url=B, sticky=False, resident=100),
    ),
    (
        "an unhealthy holder is passed over",
        {"resident": {B: 500, C: 10}, "unhealthy": (B,)},
        Choice(url=C, sticky=False, resident=10),
    ),
    (
        "only an unhealthy holder: today's placement",
        {"resident": {B: 500}, "unhealthy": (B,)},
        Choice(url=A, sticky=False),
    ),
    ("zero tokens decide nothing", {"resident": {B: 0}}, Choice(url=A, sticky=False)),
    (
        "a healthy pin stays authoritative",
        {"resident": {B: 100}, "pinned": C},
        Choice(url=C, sticky=True),
    ),
    (
        "an unhealthy pin yields to residency",
        {"resident": {B: 100}, "pinned": C, "unhealthy": (C,)},
        Choice(url=B, sticky=False, resident=100),
    ),
    (
        "residency before a prefix match",
        {"resident": {B: 100}, "matched": {C: 5}},
        Choice(url=B, sticky=False, resident=100),
    ),
    (
        "without residency the prefix match holds",
        {"matched": {C: 5}},
        Choice(url=C, sticky=False, matched=5),
    ),
]


@pytest.mark.parametrize(
    ("given", "expected"), [p[1:] for p in PLACEMENTS], ids=[p[0] for p in PLACEMENTS]
)
def test_plan_worker_with_residency(given: dict[str, Any], expected: Choice) -> None:
    workers = views(unhealthy=given.get("unhealthy", ()), busy=given.get("busy"))
    choice = plan_worker(
        workers,
        pinned=given.get("pinned"),
        matched=given.get("matched"),
        resident=given.get("resident"),
    )
    assert choice == expected


def test_plan_pair_places_prefill_by_residency_and_decode_by_load() -> None:
    pair = plan_pair(
        views(),
        views(),
        pinned_prefill=None,
        pinned_decode=None,
        resident_prefill={C: 64},
    )
    assert pair is not None
    assert (pair.prefill.url, pair.prefill.resident, pair.decode.url) == (C, 64, A)


SALT = cache_salt_for("acme")

PARSED: list[tuple[str, Any, dict[tuple[str | None, str | None], int] | None]] = [
    (
        "entries",
        {
            "entries": [{"cache_salt": SALT, "session_id": "s1", "blocks": 3, "tokens": 48}],
            "seq": 4,
        },
        {(SALT, "s1"): 48},
    ),
    ("empty", {"entries": []}, {}),
    (
        "unsalted and session-less",
        {"entries": [{"cache_salt": None, "session_id": None, "tokens": 7}]},
        {(None, None): 7},
    ),
    ("not an object", [1, 2], None),
    ("no entries", {"seq": 1}, None),
    (
        "a negative count",
        {"entries": [{"cache_salt": SALT, "session_id": "s", "tokens": -1}]},
        None,
    ),
    (
        "a boolean count",
        {"entries": [{"cache_salt": SALT, "session_id": "s", "tokens": True}]},
        None,
    ),
    ("a numeric salt", {"entries": [{"cache_salt": 5, "session_id": "s", "tokens": 1}]}, None),
]


@pytest.mark.parametrize(("body", "expected"), [p[1:] for p in PARSED], ids=[p[0] for p in PARSED])
def test_parse_residency(
    body: Any, expected: dict[tuple[str | None, str | None], int] | None
) -> None:
    snapshot = parse_residency(body, fetched_at=5.0)
    if expected is None:
        assert snapshot is None
    else:
        assert snapshot == ResidencySnapshot(tokens=expected, fetched_at=5.0)


@pytest.mark.parametrize(
    ("tenant", "session", "key"),
    [
        ("acme", "s1", (SALT, "s1")),
        (None, "s1", (None, "s1")),
        ("acme", None, None),
        (None, None, None),
    ],
)
def test_residency_key(tenant: str | None, session: str | None, key: object) -> None:
    assert residency_key(tenant, session) == key


def snap(tokens: int, *, at: float, session: str = "s1") -> ResidencySnapshot:
    return ResidencySnapshot(tokens={(SALT, session): tokens}, fetched_at=at)


RESIDENT: list[tuple[str, dict[str, ResidencySnapshot | None], dict[str, int]]] = [
    ("fresh", {A: snap(10, at=99.0), B: snap(20, at=95.0)}, {A: 10, B: 20}),
    ("stale is ignored", {A: snap(10, at=99.0), B: snap(20, at=93.9)}, {A: 10}),
    ("never fetched", {A: None, B: snap(20, at=99.0)}, {B: 20}),
    ("another session", {A: snap(10, at=99.0, session="s2")}, {}),
]


@pytest.mark.parametrize(
    ("snapshots", "expected"), [r[1:] for r in RESIDENT], ids=[r[0] for r in RESIDENT]
)
def test_plan_resident(
    snapshots: dict[str, ResidencySnapshot | None], expected: dict[str, int]
) -> None:
    assert plan_resident(snapshots, key=(SALT, "s1"), now=100.0, max_age_s=6.0) == expected


def test_plan_resident_without_a_key_finds_nothing() -> None:
    assert plan_resident({A: snap(10, at=100.0)}, key=None, now=100.0, max_age_s=6.0) == {}

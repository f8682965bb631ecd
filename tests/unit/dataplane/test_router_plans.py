"""Router placement, session keys and discovery membership (pure)."""

from __future__ import annotations

import pytest

from kvretention.dataplane.router.discovery import (
    DiscoveryError,
    build_sources,
    held_departing,
    normalize_url,
    plan_membership,
    split_dns,
    url_for,
)
from kvretention.dataplane.router.placement import (
    SessionPins,
    WorkerView,
    plan_pair,
    plan_worker,
    session_of,
)
from kvretention.dataplane.router.relay import is_terminal, plan_bootstrap
from support.worker_views import A, B, C, w


@pytest.mark.parametrize(
    ("workers", "pinned", "url", "sticky"),
    [
        ([w(A, 2), w(B, 0), w(C, 1)], None, B, False),
        ([w(A, 1, served=5), w(B, 1, served=3)], None, B, False),
        ([w(B, 0, served=1), w(A, 0, served=1)], None, A, False),
        # a healthy pin wins even when it is the busiest worker
        ([w(A, 9), w(B, 0)], A, A, True),
        # an unhealthy or vanished pin falls back to load
        ([w(A, 0, healthy=False), w(B, 3)], A, B, False),
        ([w(B, 3), w(C, 1)], A, C, False),
    ],
)
def test_plan_worker(workers: list[WorkerView], pinned: str | None, url: str, sticky: bool) -> None:
    choice = plan_worker(workers, pinned=pinned)
    assert choice is not None
    assert (choice.url, choice.sticky) == (url, sticky)


@pytest.mark.parametrize("workers", [[], [w(A, healthy=False), w(B, healthy=False)]])
def test_plan_worker_without_healthy_workers(workers: list[WorkerView]) -> None:
    assert plan_worker(workers, pinned=A) is None


def test_plan_pair_needs_both_roles_and_keeps_pins() -> None:
    assert plan_pair([w(A)], [w(B, healthy=False)], pinned_prefill=None, pinned_decode=None) is None
    assert plan_pair([], [w(B)], pinned_prefill=None, pinned_decode=None) is None
    pair = plan_pair([w(A, 5), w(C, 0)], [w(B)], pinned_prefill=A, pinned_decode=None)
    assert pair is not None
    assert (pair.prefill.url, pair.prefill.sticky, pair.decode.url) == (A, True, B)


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        (b'{"session_id": "s1"}', {}, "s1"),
        # the header (which our frontend always sets) wins: the body is not even read
        (b'{"session_id": "s1"}', {"x-session-id": "h"}, "h"),
        (b'{"request_id": "r"}', {"x-session-id": "h"}, "h"),
        (b'{"session_id": ""}', {"x-session-id": "h"}, "h"),
        (b'{"session_id": 7}', {}, None),
        (b"not json", {"x-session-id": "h"}, "h"),
        (b'{"prompt_cache_key": "k"}', {}, None),
        (b"[]", {}, None),
        # our frontend (its prefix chain) sends the session in the header whenever it has one
        (b'{"session_id": "s1"}', {"x-kvr-prefix": "a,b"}, None),
        (b'{"session_id": "s1"}', {"x-kvr-prefix": "a", "x-session-id": "h"}, "h"),
    ],
)
def test_session_of(body: bytes, headers: dict[str, str], expected: str | None) -> None:
    assert session_of(body, headers) == expected


def test_session_of_does_not_parse_a_body_without_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large prompt without a session costs a byte search, not a second JSON parse."""
    from kvretention.dataplane.router import placement

    def refuse(_: bytes) -> object:
        raise AssertionError("parsed a body that has no session_id")

    monkeypatch.setattr(placement.json, "loads", refuse)
    body = (
        b'{"request_id": "r", "messages": [{"role": "user", "content": "' + b"x" * 200_000 + b'"}]}'
    )
    assert session_of(body, {"x-session-id": "h"}) == "h"
    assert session_of(body, {}) is None
    with_key = b'{"session_id": "s", "messages": "' + b"x" * 200_000 + b'"}'
    assert session_of(with_key, {"x-session-id": "h"}) == "h"  # the header spares the parse


def test_session_pins_are_per_role_and_bounded() -> None:
    pins = SessionPins(max_sessions=2)
    pins.set("prefill", "s1", A)
    pins.set("decode", "s1", B)
    assert (pins.get("prefill", "s1"), pins.get("decode", "s1")) == (A, B)
    pins.set("decode", "s2", C)  # evicts the least recently used pin: prefill/s1
    assert pins.get("prefill", "s1") is None
    assert len(pins) == 2
    pins.set("aggregated", None, A)
    assert pins.get("aggregated", None) is None
    assert len(pins) == 2


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://w:8100/", "http://w:8100"),
        ("w:8100", "http://w:8100"),
        (" https://w ", "https://w"),
    ],
)
def test_normalize_url(value: str, expected: str) -> None:
    assert normalize_url(value) == expected


@pytest.mark.parametrize("value", ["", "ftp://w:1"])
def test_normalize_url_rejects(value: str) -> None:
    with pytest.raises(DiscoveryError):
        normalize_url(value)


def test_split_dns_and_url_for() -> None:
    assert split_dns("workers.ns.svc:8100") == ("workers.ns.svc", 8100)
    for bad in ("workers.ns.svc", ":80", "h:port"):
        with pytest.raises(DiscoveryError):
            split_dns(bad)
    assert url_for("10.0.0.1", 80) == "http://10.0.0.1:80"
    assert url_for("fd00::1", 80) == "http://[fd00::1]:80"


@pytest.mark.parametrize(
    ("removed", "staying", "healthy", "held"),
    [
        # a rolling update's swap: the new pod is not admitted yet, the old one still serves
        ((A,), (B,), {A: True, B: False}, (A,)),
        # the newcomer is admitted: the departing one goes
        ((A,), (B,), {A: True, B: True}, ()),
        # a departing worker that fails its checks is not kept
        ((A,), (B,), {A: False, B: False}, ()),
        # another staying worker serves: nothing to hold
        ((A,), (B, C), {A: True, B: False, C: True}, ()),
        # the pool shrinks to nothing: the healthy departing ones drain, the broken one goes
        ((A, B), (), {A: True, B: False}, (A,)),
    ],
)
def test_held_departing(
    removed: tuple[str, ...],
    staying: tuple[str, ...],
    healthy: dict[str, bool],
    held: tuple[str, ...],
) -> None:
    assert held_departing(removed, staying, healthy) == held


def test_plan_membership() -> None:
    change = plan_membership([A, B], [B, C])
    assert (change.added, change.removed) == ((C,), (A,))
    assert plan_membership([A], [A]).added == ()


@pytest.mark.parametrize(
    ("kwargs", "roles"),
    [
        ({"workers": [A]}, ["aggregated"]),
        ({"worker_dns": ["svc:1"]}, ["aggregated"]),
        ({"prefill": [A], "decode_dns": ["svc:1"]}, ["prefill", "decode"]),
    ],
)
def test_build_sources(kwargs: dict[str, list[str]], roles: list[str]) -> None:
    full = {
        k: kwargs.get(k, [])
        for k in ("workers", "worker_dns", "prefill", "prefill_dns", "decode", "decode_dns")
    }
    assert [s.role for s in build_sources(**full)] == roles


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"workers": [A], "prefill": [B], "decode": [C]},
        {"prefill": [A]},
        {"worker_dns": ["no-port"]},
    ],
)
def test_build_sources_rejects(kwargs: dict[str, list[str]]) -> None:
    full = {
        k: kwargs.get(k, [])
        for k in ("workers", "worker_dns", "prefill", "prefill_dns", "decode", "decode_dns")
    }
    with pytest.raises(DiscoveryError):
        build_sources(**full)


@pytest.mark.parametrize(
    ("info", "default", "expected"),
    [
        ({"bootstrap_host": "10.1.1.1", "bootstrap_port": 9000}, None, ("10.1.1.1", 9000)),
        ({"bootstrap_host": None, "bootstrap_port": 9000}, None, ("p0", 9000)),
        (None, 8998, ("p0", 8998)),
        ({}, None, None),
    ],
)
def test_plan_bootstrap(
    info: dict[str, object] | None, default: int | None, expected: tuple[str, int] | None
) -> None:
    assert plan_bootstrap("http://p0:8100", info, default_port=default) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"text":"a"}', False),
        (b'{"text":"a","finish_reason":"stop"}', True),
        (b'{"error":{"code":"engine_error","message":"x"}}', True),
        (b'{"text":"a"', False),
        (b"", False),
        (b'{"text":"a","finish_reason":null}', False),
        (b'[{"finish_reason":"stop"}]', False),
        # what msgspec refuses, json decides as before
        (b'{"text":NaN,"finish_reason":"stop"}', True),
        (b'{"n":1e400,"finish_reason":"length"}', True),
        (b'{"text":"\\ud800","finish_reason":"stop"}', True),
        (b'{"finish_reason":"stop"} x', False),
    ],
)
def test_is_terminal(line: bytes, expected: bool) -> None:
    assert is_terminal(line) is expected

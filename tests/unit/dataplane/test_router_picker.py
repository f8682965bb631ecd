"""The endpoint picker's pure decisions: rendezvous by session, round robin without one, the
session read as the frontend reads it, and what each ext_proc phase is answered."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from click.testing import CliRunner
from multidict import CIMultiDict

from kvretention.dataplane.router.cli import router_cmd
from kvretention.dataplane.router.discovery import Endpoints, build_endpoints
from kvretention.dataplane.router.extproc_wire import (
    BUFFERED,
    FULL_DUPLEX_STREAMED,
    Body,
    Continue,
    Headers,
    Immediate,
    ProcessingRequest,
)
from kvretention.dataplane.router.health import HealthRecord
from kvretention.dataplane.router.picker import (
    EndpointPool,
    Pick,
    PickStream,
    address_of,
    plan_endpoint,
    served_of,
    session_of_request,
    subset_of,
)

EPS = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
DEST = "x-gateway-destination-endpoint"


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://10.0.0.7:8000", "10.0.0.7:8000"),
        ("http://[fd00::7]:8000", "[fd00::7]:8000"),
        ("http://10.0.0.7", "10.0.0.7:80"),
    ],
)
def test_address_of(url: str, address: str) -> None:
    assert address_of(url) == address


def test_a_session_gets_the_same_endpoint_whatever_the_order() -> None:
    for session in (f"s{i}" for i in range(50)):
        first = plan_endpoint(EPS, session=session, turn=0)
        assert first is not None and first.outcome == "session"
        assert plan_endpoint(list(reversed(EPS)), session=session, turn=7) == first


def test_only_the_sessions_of_a_gone_endpoint_move() -> None:
    sessions = [f"s{i}" for i in range(300)]
    before = {s: plan_endpoint(EPS, session=s, turn=0) for s in sessions}
    after = {s: plan_endpoint(EPS[:2], session=s, turn=0) for s in sessions}
    for s in sessions:
        pick = before[s]
        assert pick is not None
        if pick.endpoint != EPS[2]:
            assert after[s] == pick
    spread = Counter(p.endpoint for p in before.values() if p is not None)
    assert min(spread.values()) > 60, spread  # each of 3 gets a fair share of 300


def test_sessionless_requests_go_round_robin() -> None:
    picks = [plan_endpoint(EPS, session=None, turn=t) for t in range(6)]
    assert [p.endpoint for p in picks if p is not None] == EPS * 2
    assert {p.outcome for p in picks if p is not None} == {"spread"}
    assert plan_endpoint([], session="s", turn=0) is None


def test_pool_picks_ready_endpoints_within_the_subset() -> None:
    pool = EndpointPool(
        health={
            "http://10.0.0.1:8000": HealthRecord(healthy=True),
            "http://10.0.0.2:8000": HealthRecord(healthy=True),
            "http://10.0.0.3:8000": HealthRecord(healthy=False),
        }
    )
    assert pool.ready() == EPS[:2]
    spread = [pool.choose(None, None) for _ in range(4)]
    assert [p.endpoint for p in spread if p is not None] == EPS[:2] * 2
    only = frozenset({EPS[1], EPS[2]})
    assert pool.choose("s", only) == Pick(EPS[1], "session")
    assert pool.choose("s", frozenset({EPS[2]})) is None


@pytest.mark.parametrize(
    ("metadata", "subset", "served"),
    [
        ({}, None, None),
        (
            {"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": [EPS[0], 3.0]}},
            frozenset({EPS[0]}),
            None,
        ),
        (
            {"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": []}},
            frozenset(),
            None,
        ),
        ({"envoy.lb": {"x-gateway-destination-endpoint-served": EPS[1]}}, None, EPS[1]),
    ],
)
def test_metadata(metadata: Any, subset: frozenset[str] | None, served: str | None) -> None:
    assert subset_of(metadata) == subset
    assert served_of(metadata) == served


@pytest.mark.parametrize(
    ("headers", "body", "session"),
    [
        ({"X-Session-Id": "h"}, {"metadata": {"user_id": "b"}}, "h"),
        ({"x-claude-code-session-id": "cc"}, None, "cc"),
        ({"session_id": "codex"}, None, "codex"),
        ({}, {"metadata": {"user_id": "user_x_session_1"}}, "user_x_session_1"),
        ({}, {"client_metadata": {"session_id": "c"}}, "c"),
        ({}, {"session_id": "not-a-source"}, None),
        ({}, None, None),
    ],
)
def test_the_session_is_read_as_the_frontend_reads_it(
    headers: dict[str, str], body: Any, session: str | None
) -> None:
    raw = None if body is None else json.dumps(body).encode()
    assert session_of_request(CIMultiDict(headers), raw) == session


def test_the_fleets_own_session_keys_are_read_in_their_order() -> None:
    keys = ("X-Conv", "metadata.thread")
    body = json.dumps({"metadata": {"thread": "t", "user_id": "u"}}).encode()
    assert session_of_request(CIMultiDict({"x-conv": "c"}), body, keys=keys) == "c"
    assert session_of_request(CIMultiDict({"x-session-id": "d"}), body, keys=keys) == "t"
    assert session_of_request(CIMultiDict({"x-session-id": "d"}), b"{}", keys=keys) is None


def test_a_body_that_is_not_json_has_no_session() -> None:
    assert session_of_request(CIMultiDict(), b'{"metadata": {') is None


def headers_req(pairs: list[tuple[str, str]], *, eos: bool = False, mode: int | None = None) -> Any:
    return ProcessingRequest(
        "request_headers", headers=Headers(tuple(pairs), end_of_stream=eos), request_body_mode=mode
    )


def body_req(data: bytes, *, eos: bool = True, phase: Any = "request_body") -> Any:
    return ProcessingRequest(phase, body=Body(data, end_of_stream=eos))


BODY = json.dumps({"metadata": {"user_id": "u1"}}).encode()
PATH = [(":path", "/v1/messages")]
PICK = Continue("request_body", set_headers=((DEST, EPS[0]),), clear_route_cache=True)
LB = {"envoy.lb": {DEST: EPS[0]}}


@pytest.mark.parametrize(
    ("messages", "replies"),
    [
        pytest.param(
            [headers_req(PATH, mode=BUFFERED), body_req(BODY)],
            [[(Continue("request_headers"), {})], [(PICK, LB)]],
            id="buffered-session-in-body",
        ),
        pytest.param(
            [headers_req([*PATH, ("x-session-id", "h")]), body_req(BODY)],
            [
                [(Continue("request_headers", PICK.set_headers, True), LB)],
                [(Continue("request_body"), {})],
            ],
            id="buffered-session-in-headers",
        ),
        pytest.param(
            [headers_req(PATH, eos=True)],
            [[(Continue("request_headers", PICK.set_headers, True), LB)]],
            id="no-body",
        ),
        pytest.param(
            [
                headers_req(PATH, mode=FULL_DUPLEX_STREAMED),
                body_req(BODY[:5], eos=False),
                body_req(BODY[5:]),
            ],
            [
                [],
                [],
                [
                    (Continue("request_headers", PICK.set_headers, True), LB),
                    (Continue("request_body", streamed_body=BODY, end_of_stream=True), {}),
                ],
            ],
            id="full-duplex",
        ),
        pytest.param(
            [headers_req(PATH), body_req(BODY[:5], eos=False), body_req(BODY[5:])],
            [
                [(Continue("request_headers"), {})],
                [(Continue("request_body"), {})],
                [(PICK, LB)],
            ],
            id="streamed-chunks",
        ),
        pytest.param(
            [
                headers_req(PATH),
                body_req(BODY, eos=False),
                ProcessingRequest("request_trailers"),
            ],
            [
                [(Continue("request_headers"), {})],
                [(Continue("request_body"), {})],
                [(Continue("request_trailers"), LB)],
            ],
            id="body-ended-by-trailers",
        ),
        pytest.param(
            [body_req(b"x", phase="response_body"), ProcessingRequest("response_trailers")],
            [[(Continue("response_body"), {})], [(Continue("response_trailers"), {})]],
            id="response-phases-continue",
        ),
    ],
)
def test_phases(messages: list[Any], replies: list[list[tuple[Any, Any]]]) -> None:
    sessions: list[str | None] = []

    def pick(session: str | None, subset: frozenset[str] | None) -> Pick | None:
        sessions.append(session)
        return Pick(EPS[0], "session")

    stream = PickStream(pick=pick, served=lambda picked, served: None)
    got = [[(r.answer, r.metadata) for r in stream.answer(m)] for m in messages]
    assert got == replies
    # One pick per request; the response phases alone pick nothing.
    assert len(sessions) == (0 if messages[0].phase.startswith("response") else 1)


def test_served_reports_and_the_duplex_response_body() -> None:
    reports: list[tuple[str | None, str]] = []
    stream = PickStream(
        pick=lambda s, sub: Pick(EPS[0], "spread"), served=lambda p, s: reports.append((p, s))
    )
    first = ProcessingRequest(
        "request_headers",
        headers=Headers(tuple(PATH), end_of_stream=True),
        response_body_mode=FULL_DUPLEX_STREAMED,
    )
    stream.answer(first)
    served = ProcessingRequest(
        "response_headers",
        headers=Headers(),
        metadata={"envoy.lb": {"x-gateway-destination-endpoint-served": EPS[1]}},
    )
    assert [r.answer for r in stream.answer(served)] == [Continue("response_headers")]
    assert reports == [(EPS[0], EPS[1])]
    echoed = stream.answer(body_req(b"tok", eos=True, phase="response_body"))
    assert [r.answer for r in echoed] == [
        Continue("response_body", streamed_body=b"tok", end_of_stream=True)
    ]


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/messages?beta=true", {"type": "error", "error": {"type": "overloaded_error"}}),
        ("/v1/responses", {"error": {"type": "server_error", "code": "no_ready_endpoint"}}),
    ],
)
def test_no_ready_endpoint_is_an_immediate_503(path: str, shape: dict[str, Any]) -> None:
    stream = PickStream(pick=lambda s, sub: None, served=lambda p, s: None)
    (reply,) = stream.answer(headers_req([(":path", path)], eos=True))
    answer = reply.answer
    assert isinstance(answer, Immediate) and answer.status == 503
    assert reply.metadata == {}
    body = json.loads(answer.body)
    for key, value in shape.items():
        assert value.items() <= body[key].items() if isinstance(value, dict) else body[key] == value


@pytest.mark.parametrize(
    ("static", "dns", "expected"),
    [
        ((), (), None),
        (("10.0.0.1:8000",), (), Endpoints(static=("http://10.0.0.1:8000",))),
        ((), ("fe.ns.svc:8000",), Endpoints(dns=("fe.ns.svc:8000",))),
    ],
)
def test_build_endpoints(
    static: tuple[str, ...], dns: tuple[str, ...], expected: Endpoints | None
) -> None:
    assert build_endpoints(static=static, dns=dns) == expected


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--ext-proc-port", "9004"], "go together"),
        (["--endpoint", "http://10.0.0.1:8000"], "go together"),
        (["--ext-proc-port", "9004", "--endpoint-dns", "fe.ns.svc"], "host:port"),
        (["--ext-proc-port", "70000", "--endpoint-dns", "fe.ns.svc:8000"], "70000"),
        (["--session-keys", "x-conv,bad key"], "neither a header name"),
    ],
)
def test_router_cli_refuses_half_a_picker(args: list[str], error: str) -> None:
    result = CliRunner().invoke(router_cmd, ["--worker", "http://w:8002", *args])
    assert result.exit_code == 2, result.output
    assert error in result.output

"""The router as a Gateway's endpoint picker, over real processes and a real ext_proc client.

Two frontends (on 127.0.0.2 and 127.0.0.3, as two pods) in front of one router and two stand-in
workers; a second router serves ``--ext-proc-port`` with the frontends as its ``--endpoint``s (a
picker replica: it shares no state with the frontends' router). No Envoy binary is installable
here, so ``devtools/extproc-client`` plays Envoy with go-control-plane's generated types: it sends
the request's headers and body (buffered, or full-duplex streamed as the upstream EPP runs), reads
the pick from the header mutation and the ``envoy.lb`` metadata, sends the request to the frontend
picked, as Envoy's original-destination routing does, and reports the served endpoint. A real
Envoy 1.40.0 (``support.envoy_gateway``) then stands in front of the same picker; last, one
in-process check resolves ``--endpoint-dns``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kvretention.dataplane.router.discovery import build_endpoints, build_sources
from kvretention.dataplane.router.extproc import check_endpoints, refresh_endpoints
from kvretention.dataplane.router.picker import Pick
from kvretention.dataplane.router.state import RouterState
from kvretention.ports import free_port
from kvretention.replay.sessions import claude_code_session, codex_session
from support.chat_tokenizer import save
from support.envoy_gateway import EnvoyGateway, start_envoy
from support.extproc_client import build_extproc_client, play
from support.processes import KvrProcess, StartKvretention
from support.standin_chain import start_recorded_workers, worker_flags
from support.worker_client import calls, wait_for

MODEL_ARGS = ("--model", "m", "--model-alias", "claude-*=m", "--model-alias", "gpt-*=m")


@dataclass
class Fleet:
    client: Path
    picker: str
    """The picker's ext_proc address (``ip:port``)."""
    picker_http: str
    frontends: list[KvrProcess]
    records: list[Path]

    @property
    def endpoints(self) -> list[str]:
        return [f.base_url.removeprefix("http://") for f in self.frontends]

    def play(self, **kwargs: Any) -> dict[str, Any]:
        return play(self.client, self.picker, **kwargs)

    def worker_of(self, request_id: str) -> int:
        """Index of the worker whose engine served the frontend's request ``request_id``."""
        found = wait_for(lambda: [i for i, r in enumerate(self.records) if calls(r, request_id)])
        (index,) = found
        return int(index)

    def metric(self, name: str, *, base_url: str | None = None) -> float:
        """The sum of the series whose line starts with ``name`` (the picker's by default)."""
        url = (base_url or self.picker_http) + "/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)
        )

    def served_by_frontend(self) -> list[float]:
        """Requests each frontend has answered so far."""
        return [
            self.metric("kvretention_frontend_requests_total", base_url=f.base_url)
            for f in self.frontends
        ]


@pytest.fixture(scope="session")
def extproc_client() -> Path:
    return build_extproc_client()


@pytest.fixture(scope="module")
def fleet(
    kvretention_process: StartKvretention,
    tmp_path_factory: pytest.TempPathFactory,
    extproc_client: Path,
) -> Fleet:
    d = tmp_path_factory.mktemp("extproc")
    tokenizer = str(save(d / "tokenizer"))
    records = [d / f"w{i}.jsonl" for i in range(2)]
    workers = start_recorded_workers(
        kvretention_process, records, args=["--model-path", tokenizer], timeout=90.0
    )
    worker_args = worker_flags(workers)
    router = kvretention_process(["router", *worker_args])
    frontends = [
        kvretention_process(
            ["frontend", "--router-url", router.base_url, *MODEL_ARGS], host=f"127.0.0.{i}"
        )
        for i in (2, 3)
    ]
    port = free_port()
    picker = kvretention_process(
        [
            *("router", *worker_args, "--ext-proc-port", str(port)),
            *(a for f in frontends for a in ("--endpoint", f.base_url)),
            *("--health-interval", "0.2", "--eject-after", "1"),
        ]
    )
    built = Fleet(extproc_client, f"127.0.0.1:{port}", picker.base_url, frontends, records)
    wait_for(lambda: built.metric("kvretention_router_ready_endpoints") == 2)
    return built


def claude_code(*, header: bool) -> Callable[[], list[tuple[str, dict[str, str], Any]]]:
    """Two turns of a Claude Code session; without ``header`` its session is in the body only
    (``metadata.user_id``)."""

    def turns() -> list[tuple[str, dict[str, str], Any]]:
        out = []
        for headers, body in claude_code_session(turns=2)[1:3]:
            if not header:
                headers.pop("x-claude-code-session-id")
            out.append(("/v1/messages?beta=true", headers, body))
        return out

    return turns


def codex() -> list[tuple[str, dict[str, str], Any]]:
    return [("/v1/responses", h, b) for h, b in codex_session(turns=2)[:2]]


CASES = [
    pytest.param(claude_code(header=True), "buffered", id="claude-code-header-buffered"),
    pytest.param(claude_code(header=False), "buffered", id="claude-code-body-buffered"),
    pytest.param(claude_code(header=False), "duplex", id="claude-code-body-duplex"),
    pytest.param(codex, "buffered", id="codex-buffered"),
    pytest.param(codex, "duplex", id="codex-duplex"),
]


@pytest.mark.parametrize(("turns", "mode"), CASES)
def test_a_session_is_picked_to_one_frontend_and_reaches_one_worker(
    fleet: Fleet, turns: Callable[[], list[tuple[str, dict[str, str], Any]]], mode: str
) -> None:
    picked, workers = [], []
    for path, headers, body in turns():
        headers = {**headers, "content-type": "application/json", "x-api-key": "sk-any"}
        report = fleet.play(path=path, headers=headers, body=body, mode=mode, send=True)
        assert report.get("error") is None, report
        assert report["header_endpoint"] in fleet.endpoints, report
        assert report["metadata_endpoint"] == report["header_endpoint"], report
        assert report["http_status"] == 200, report
        assert report["phases"][-1] == "response_headers", report
        if mode == "duplex":
            assert report["body_forwarded"] == len(json.dumps(body)), report
        picked.append(report["header_endpoint"])
        workers.append(fleet.worker_of(report["http_headers"]["x-request-id"]))
    assert len(set(picked)) == 1, picked
    assert len(set(workers)) == 1, workers


def test_sessionless_requests_spread_and_served_reports_are_counted(fleet: Fleet) -> None:
    served_before = fleet.metric('kvretention_router_endpoint_served_total{endpoint="picked"}')
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    picks = [
        fleet.play(path="/v1/messages", headers={"content-type": "application/json"}, body=body)
        for _ in range(4)
    ]
    assert sorted(p["header_endpoint"] for p in picks) == sorted(fleet.endpoints * 2), picks
    sent = fleet.play(headers={"content-type": "application/json"}, body=body, send=True)
    assert sent["http_status"] == 200, sent
    served = fleet.metric('kvretention_router_endpoint_served_total{endpoint="picked"}')
    assert served == served_before + 1
    assert fleet.metric('kvretention_router_endpoint_picks_total{outcome="spread"}') >= 5


def test_a_request_without_body_is_picked_on_its_headers(fleet: Fleet) -> None:
    report = fleet.play(
        path="/v1/models", method="GET", headers={"x-session-id": "s-models"}, send=True
    )
    assert report["phases"][0] == "request_headers", report
    assert report["header_endpoint"] in fleet.endpoints
    assert report["http_status"] == 200, report


def test_the_data_planes_subset_limits_the_pick(fleet: Fleet) -> None:
    """``envoy.lb.subset_hint``: every session goes to the one frontend allowed; an allowed list
    with no ready frontend is a 503."""
    only = fleet.endpoints[1]
    for i in range(6):
        report = fleet.play(headers={"x-session-id": f"subset-{i}"}, body={}, subset=[only])
        assert report["header_endpoint"] == only, report
    report = fleet.play(body={}, subset=["10.255.255.1:8000"])
    assert report["immediate_status"] == 503, report


def test_health_check_says_serving(fleet: Fleet) -> None:
    assert fleet.play(health="readiness")["health"] == "SERVING"


def test_a_malformed_message_ends_the_stream_and_health_names_its_services(fleet: Fleet) -> None:
    """Raw bytes over grpcio: a truncated ProcessingRequest is INVALID_ARGUMENT; the health check
    answers liveness SERVING (``08 01``) and NOT_FOUND for a service it does not serve."""
    with grpc.insecure_channel(fleet.picker) as channel:
        process = channel.stream_stream("/envoy.service.ext_proc.v3.ExternalProcessor/Process")
        with pytest.raises(grpc.RpcError) as err:
            list(process(iter([b"\x12\x05ab"]), timeout=5))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "truncated field" in str(err.value.details())
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        assert check(b"", timeout=5) == b"\x08\x01"
        with pytest.raises(grpc.RpcError) as err:
            check(b"\x0a\x03foo", timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/v1/messages", {"type": "error", "error": {"type": "overloaded_error"}}),
        ("/v1/chat/completions", {"error": {"type": "server_error", "code": "no_ready_endpoint"}}),
    ],
)
def test_no_ready_frontend_is_a_503_in_the_provider_shape(
    kvretention_process: StartKvretention,
    extproc_client: Path,
    path: str,
    error: dict[str, Any],
) -> None:
    port = free_port()
    kvretention_process(
        [
            *("router", "--worker", f"http://127.0.0.1:{free_port()}"),
            *("--ext-proc-port", str(port), "--endpoint", f"http://127.0.0.1:{free_port()}"),
        ]
    )
    report = play(extproc_client, f"127.0.0.1:{port}", path=path, body={"model": "m"})
    assert report["immediate_status"] == 503, report
    assert "header_endpoint" not in report
    answer = json.loads(report["immediate_body"])
    for key, fields in error.items():
        if isinstance(fields, dict):
            assert fields.items() <= answer[key].items(), answer
        else:
            assert answer[key] == fields


@pytest.fixture(scope="module")
def envoy(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvoyGateway]:
    gateway = start_envoy(fleet.picker, tmp_path_factory.mktemp("envoy"))
    yield gateway
    gateway.stop()


def through(url: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, str, bytes]:
    """POST through Envoy: status, the frontend's ``x-request-id``, the body."""
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.headers.get("x-request-id", ""), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, "", err.read()


@pytest.mark.parametrize("listener", ["header", "metadata"])
@pytest.mark.parametrize(
    "turns",
    [pytest.param(claude_code(header=False), id="claude-code"), pytest.param(codex, id="codex")],
)
def test_a_real_envoy_keeps_a_session_on_one_frontend_and_one_worker(
    fleet: Fleet,
    envoy: EnvoyGateway,
    listener: str,
    turns: Callable[[], list[tuple[str, dict[str, str], Any]]],
) -> None:
    """Envoy 1.40.0's ext_proc filter asks the picker (BUFFERED body, routed by the header; or
    FULL_DUPLEX_STREAMED, routed by the ``envoy.lb`` metadata) and its ORIGINAL_DST cluster sends
    each turn to the frontend picked: every turn of the session lands on one frontend and, through
    the router's pin, one worker."""
    url = envoy.header_url if listener == "header" else envoy.metadata_url
    frontends, workers = set(), set()
    for path, headers, body in turns():
        before = fleet.served_by_frontend()
        headers = {**headers, "content-type": "application/json", "x-api-key": "sk-any"}
        status, request_id, answer = through(url, path, headers, body)
        assert status == 200, (answer[:500], envoy.log()[-2000:])
        after = fleet.served_by_frontend()
        (moved,) = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if a > b]
        frontends.add(moved)
        workers.add(fleet.worker_of(request_id))
    assert len(frontends) == 1 and len(workers) == 1, (frontends, workers)


SESSIONLESS = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
JSON = {"content-type": "application/json"}


@pytest.mark.parametrize("listener", ["header", "metadata"])
def test_a_real_envoy_spreads_sessionless_requests(
    fleet: Fleet, envoy: EnvoyGateway, listener: str
) -> None:
    url = envoy.header_url if listener == "header" else envoy.metadata_url
    before = fleet.served_by_frontend()
    for _ in range(4):
        assert through(url, "/v1/messages", JSON, SESSIONLESS)[0] == 200
    after = fleet.served_by_frontend()
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 2]


def test_a_stopped_frontend_is_no_longer_picked(fleet: Fleet) -> None:
    """Last in the module: it stops a frontend."""
    sessions = [f"kill-{i}" for i in range(16)]

    def owners() -> dict[str, str]:
        return {
            s: fleet.play(headers={"x-session-id": s}, body={"model": "m"})["header_endpoint"]
            for s in sessions
        }

    before = owners()
    assert set(before.values()) == set(fleet.endpoints), before  # 16 sessions hash to both
    gone = fleet.frontends[1]
    gone.stop()
    left = fleet.endpoints[0]
    wait_for(lambda: fleet.metric("kvretention_router_ready_endpoints") == 1)
    after = owners()
    assert set(after.values()) == {left}, after
    # Sessions that were on the frontend left stay put: rendezvous moves only the gone one's.
    assert all(after[s] == before[s] for s in sessions if before[s] == left)


def test_with_no_frontend_left_a_real_envoy_answers_the_pickers_503(
    fleet: Fleet, envoy: EnvoyGateway
) -> None:
    """After the test above: the last frontend stops too."""
    fleet.frontends[0].stop()
    wait_for(lambda: fleet.metric("kvretention_router_ready_endpoints") == 0)
    for url in (envoy.header_url, envoy.metadata_url):
        status, _, body = through(url, "/v1/messages", JSON, SESSIONLESS)
        assert status == 503, body
        assert json.loads(body)["error"]["type"] == "overloaded_error"
    assert fleet.metric('kvretention_router_endpoint_picks_total{outcome="unavailable"}') >= 2


async def test_endpoint_dns_names_the_frontends_and_a_not_ready_one_leaves() -> None:
    """``--endpoint-dns localhost:PORT`` in-process: the name resolves to the frontend on
    127.0.0.1, which is picked while its ``/readyz`` says 200 and not once it says 503."""
    ready = {"status": 200}

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(status=ready["status"])

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    async with TestServer(app, host="127.0.0.1") as server:
        state = RouterState(
            sources=build_sources(
                workers=["http://127.0.0.1:1"],
                worker_dns=[],
                prefill=[],
                prefill_dns=[],
                decode=[],
                decode_dns=[],
            ),
            endpoints=build_endpoints(static=(), dns=(f"localhost:{server.port}",)),
        )
        async with aiohttp.ClientSession() as session:
            state.health_session = session
            await refresh_endpoints(state)
            address = f"127.0.0.1:{server.port}"
            assert address in state.picker.ready()
            assert state.picker.choose("s", None) == Pick(address, "session")
            ready["status"] = 503
            await check_endpoints(state)
            assert address not in state.picker.ready()

"""Workers that refuse a request before doing anything (``draining``, ``worker_outdated``), in
front of the router in-process: aggregated and prefill/decode pools alike try another worker,
and any other refusal reaches the client as the worker wrote it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kvretention.dataplane.protocol import GENERATE_PATH, HEADER_ROLE
from kvretention.dataplane.router.app import RouterConfig, RouterState, build_app
from kvretention.dataplane.router.discovery import build_sources
from support.router_inprocess import answer_line, start_servers, url_of, worker_app

OTHER_503 = {"error": {"code": "overloaded", "message": "queue full", "param": None}}


@dataclass
class Worker:
    """One pool member: answers, or refuses with ``refuse`` (an error code) every request that
    ``requires`` anything, or sends ``OTHER_503`` when ``other`` is set."""

    name: str
    role: str
    refuse: str | None = None
    other: bool = False
    served: list[str] = field(default_factory=list)
    refused: int = 0

    def app(self) -> web.Application:
        async def info(_: web.Request) -> web.Response:
            return web.json_response(
                {"role": self.role, "bootstrap_host": "127.0.0.1", "bootstrap_port": 8998}
            )

        async def generate(request: web.Request) -> web.Response:
            body = json.loads(await request.read())
            assert request.headers[HEADER_ROLE] == self.role
            if self.other:
                return web.json_response(OTHER_503, status=503)
            if self.refuse and body.get("requires"):
                self.refused += 1
                return web.json_response(
                    {"error": {"code": self.refuse, "message": "no"}}, status=503
                )
            self.served.append(body["request_id"])
            return answer_line(self.name)

        return worker_app(generate, gets={"/v1/info": info})


@dataclass
class Pools:
    router: TestClient[Any, Any]
    workers: dict[str, Worker]

    async def send(self, rid: str) -> tuple[int, dict[str, Any]]:
        body = {"request_id": rid, "model": "m", "token_ids": [1], "requires": ["template_kwargs"]}
        resp = await self.router.post(GENERATE_PATH, data=json.dumps(body).encode())
        return resp.status, json.loads(await resp.text())


@asynccontextmanager
async def _start(workers: list[Worker]) -> AsyncIterator[Pools]:
    servers = await start_servers(w.app() for w in workers)
    urls: dict[str, list[str]] = {}
    for server, worker in zip(servers, workers, strict=True):
        urls.setdefault(worker.role, []).append(url_of(server))
    sources = build_sources(
        workers=urls.get("aggregated", []),
        worker_dns=(),
        prefill=urls.get("prefill", []),
        prefill_dns=(),
        decode=urls.get("decode", []),
        decode_dns=(),
    )
    state = RouterState(sources, RouterConfig(health_interval_s=0.02, policy="least-outstanding"))
    router: TestClient[Any, Any] = TestClient(TestServer(build_app(state)))
    await router.start_server()
    for _ in range(200):
        listed = await (await router.get("/v1/workers")).json()
        if sum(1 for w in listed if w["healthy"]) == len(workers):
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the router never saw every worker healthy")
    try:
        yield Pools(router, {w.name: w for w in workers})
    finally:
        await router.close()
        for server in servers:
            await server.close()


def _pd(*refusing: tuple[str, str]) -> list[Worker]:
    """Two prefill and two decode workers; ``refusing`` names which refuse, with what code."""
    codes = dict(refusing)
    names = [("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode")]
    return [Worker(name, role, refuse=codes.get(name)) for name, role in names]


# (refusing workers, the prefill and decode worker that serve every request)
SERVED_BY_THE_OTHERS = [
    pytest.param([("p0", "worker_outdated")], ("p1", None), id="prefill-outdated"),
    pytest.param([("d0", "worker_outdated")], (None, "d1"), id="decode-outdated"),
    pytest.param([("p0", "draining"), ("d1", "worker_outdated")], ("p1", "d0"), id="both-halves"),
]


@pytest.mark.parametrize(("refusing", "serving"), SERVED_BY_THE_OTHERS)
async def test_a_pair_half_that_refuses_before_work_is_replaced(
    refusing: list[tuple[str, str]], serving: tuple[str | None, str | None]
) -> None:
    async with _start(_pd(*refusing)) as pools:
        for n in range(4):
            status, line = await pools.send(f"r{n}")
            assert status == 200, line
            assert line["text"] in {"d0", "d1"}
        for name in filter(None, serving):
            # The half that took a request whose other half refused is sent it again (its first
            # copy was closed), so count each request once.
            assert sorted(set(pools.workers[name].served)) == [f"r{n}" for n in range(4)]
        for name, _ in refusing:
            assert pools.workers[name].served == []
            assert pools.workers[name].refused >= 1


@pytest.mark.parametrize(
    ("refusing", "status", "code"),
    [
        pytest.param(
            [("p0", "worker_outdated"), ("p1", "worker_outdated")],
            503,
            "worker_outdated",
            id="every-prefill-outdated",
        ),
        pytest.param(
            [("d0", "worker_outdated"), ("d1", "draining")],
            503,
            "worker_outdated",
            id="every-decode-refuses",
        ),
        pytest.param(
            [("p0", "draining"), ("p1", "draining")],
            502,
            "worker_unavailable",
            id="every-prefill-drains",
        ),
    ],
)
async def test_no_pair_left_tells_the_client_why(
    refusing: list[tuple[str, str]], status: int, code: str
) -> None:
    async with _start(_pd(*refusing)) as pools:
        got, line = await pools.send("none")
        assert (got, line["error"]["code"]) == (status, code)
        assert all(pools.workers[name].refused == 1 for name, _ in refusing)  # each tried once


@pytest.mark.parametrize("role", ["aggregated", "decode"])
async def test_another_503_reaches_the_client_as_the_worker_wrote_it(role: str) -> None:
    workers = (
        [Worker("a0", "aggregated", other=True)]
        if role == "aggregated"
        else [Worker("p0", "prefill"), Worker("d0", "decode", other=True)]
    )
    async with _start(workers) as pools:
        status, line = await pools.send("busy")
        assert (status, line) == (503, OTHER_503)

"""``router --kv-residency`` in-process, in front of three fake workers: the health poll fetches each
worker's ``/kv/residency``, and a session without a pin goes where its tenant's KV is resident."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kvretention.common.tenancy import HEADER_TENANT, cache_salt_for, scoped_session
from kvretention.dataplane.protocol import GENERATE_PATH, HEADER_SESSION, RESIDENCY_PATH
from kvretention.dataplane.router.app import RouterConfig, RouterState
from support.router_inprocess import answer_line, start_router, start_servers, url_of, worker_app


@dataclass
class ResidentWorker:
    """Ready; serves one NDJSON line; reports ``entries`` on ``/kv/residency`` (None: 404, a worker
    without ``--kv-events``)."""

    name: str
    entries: list[dict[str, Any]] | None = None
    served: int = 0
    polled: int = 0

    def app(self) -> web.Application:
        async def residency(_: web.Request) -> web.Response:
            self.polled += 1
            if self.entries is None:
                return web.json_response({"error": "off"}, status=404)
            return web.json_response({"entries": self.entries, "seq": 1})

        async def generate(_: web.Request) -> web.Response:
            self.served += 1
            return answer_line(self.name)

        return worker_app(generate, gets={RESIDENCY_PATH: residency})


@dataclass
class Fleet:
    router: TestClient[Any, Any]
    workers: list[ResidentWorker]
    state: RouterState
    servers: list[TestServer] = field(default_factory=list)

    async def served_by(self, *, tenant: str, session: str) -> str:
        body = json.dumps({"request_id": "r", "model": "m", "token_ids": [1, 2]}).encode()
        headers = {HEADER_TENANT: tenant, HEADER_SESSION: session}
        resp = await self.router.post(GENERATE_PATH, data=body, headers=headers)
        assert resp.status == 200
        text: str = json.loads(await resp.text())["text"]
        return text

    def resident_placements(self) -> float | None:
        registry = self.state.metrics.registry
        return registry.get_sample_value("kvretention_router_resident_placements_total")

    def least_loaded(self) -> str:
        """The worker load alone picks first: all idle, so the lowest URL."""
        urls = [url_of(s) for s in self.servers]
        return self.workers[urls.index(min(urls))].name

    async def polled(self) -> None:
        """Wait (bounded) until every worker's summary was fetched twice more."""
        wanted = [w.polled + 2 for w in self.workers]
        for _ in range(200):
            if all(w.polled >= n for w, n in zip(self.workers, wanted, strict=True)):
                return
            await asyncio.sleep(0.02)
        raise AssertionError("the router never polled every worker's /kv/residency")


def entry(tenant: str, session: str, tokens: int) -> dict[str, Any]:
    return {
        "cache_salt": cache_salt_for(tenant),
        "session_id": scoped_session(tenant, session),  # as the worker files it
        "blocks": tokens,
        "tokens": tokens,
    }


async def start_fleet(workers: list[ResidentWorker], *, kv_residency: bool = True) -> Fleet:
    servers = await start_servers(w.app() for w in workers)
    config = RouterConfig(health_interval_s=0.02, kv_residency=kv_residency)
    router, state = await start_router([url_of(s) for s in servers], config)
    return Fleet(router, workers, state, servers)


@pytest.fixture
async def fleets() -> AsyncIterator[list[Fleet]]:
    started: list[Fleet] = []
    yield started
    for fleet in started:
        await fleet.router.close()
        for server in fleet.servers:
            await server.close()


@pytest.mark.parametrize("holder", [0, 1, 2])
async def test_a_session_goes_where_its_kv_is_resident(fleets: list[Fleet], holder: int) -> None:
    workers = [ResidentWorker(f"w{i}", entries=[]) for i in range(3)]
    workers[holder].entries = [entry("acme", "s1", 400)]
    workers[(holder + 1) % 3].entries = [entry("acme", "s1", 100), entry("globex", "s1", 900)]
    fleets.append(fleet := await start_fleet(workers))
    await fleet.polled()
    assert await fleet.served_by(tenant="acme", session="s1") == f"w{holder}"
    assert fleet.resident_placements() == 1


async def test_another_tenants_residency_does_not_steer(fleets: list[Fleet]) -> None:
    workers = [ResidentWorker(f"w{i}", entries=[]) for i in range(3)]
    fleets.append(fleet := await start_fleet(workers))
    other = next(w for w in workers if w.name != fleet.least_loaded())
    other.entries = [entry("globex", "s1", 900), entry("acme", "s2", 900)]
    await fleet.polled()
    assert await fleet.served_by(tenant="acme", session="s1") == fleet.least_loaded()
    assert fleet.resident_placements() == 0


async def test_workers_without_kv_events_stay_healthy_and_place_as_before(
    fleets: list[Fleet],
) -> None:
    workers = [ResidentWorker(f"w{i}") for i in range(3)]  # every /kv/residency answers 404
    fleets.append(fleet := await start_fleet(workers))
    await fleet.polled()
    assert all(w.healthy for w in fleet.state.workers.values())
    await fleet.served_by(tenant="acme", session="s1")
    assert fleet.resident_placements() == 0


async def test_without_the_flag_nothing_is_polled(fleets: list[Fleet]) -> None:
    workers = [ResidentWorker(f"w{i}", entries=[entry("acme", "s1", 400)]) for i in range(3)]
    fleets.append(fleet := await start_fleet(workers, kv_residency=False))
    for _ in range(10):
        await asyncio.sleep(0.02)
    assert [w.polled for w in workers] == [0, 0, 0]
    await fleet.served_by(tenant="acme", session="s1")
    assert fleet.resident_placements() == 0


async def test_a_stale_summary_is_ignored(fleets: list[Fleet]) -> None:
    workers = [ResidentWorker(f"w{i}", entries=[]) for i in range(3)]
    fleets.append(fleet := await start_fleet(workers))
    holder = next(w for w in workers if w.name != fleet.least_loaded())
    holder.entries = [entry("acme", "s1", 400)]
    await fleet.polled()
    holder.entries = None  # its summary stops answering: the router keeps the last one ...
    await fleet.polled()
    await asyncio.sleep(0.1)  # ... until it is older than three poll periods (0.06 s)
    assert await fleet.served_by(tenant="acme", session="s1") == fleet.least_loaded()
    assert fleet.resident_placements() == 0

"""The router's per-pool outstanding requests (``kvretention_router_pool_outstanding_requests``),
the signal a pool's autoscaler reads: counted while requests are in flight, back to 0 after,
and present at 0 for every pool before the first request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from kvretention.dataplane.protocol import GENERATE_PATH
from kvretention.dataplane.router.app import RouterConfig, RouterState
from kvretention.dataplane.router.state import Worker
from support.router_inprocess import answer_line, start_router, start_servers, url_of, worker_app

POOL = "kvretention_router_pool_outstanding_requests"


@dataclass
class HeldWorker:
    """Answers ``/readyz`` at once and holds every ``/v1/generate`` until ``release`` is set."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: int = 0

    def app(self) -> web.Application:
        async def generate(request: web.Request) -> web.Response:
            await request.read()
            self.arrived += 1
            await self.release.wait()
            return answer_line("ok")

        return worker_app(generate)


def pool_outstanding(text: str) -> dict[str, float]:
    """``role -> value`` of the pool gauge in one ``/metrics`` answer."""
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == POOL]
    return {s.labels["role"]: s.value for s in family.samples}


@pytest.fixture
async def router_and_worker() -> AsyncIterator[tuple[TestClient[Any, Any], HeldWorker]]:
    worker = HeldWorker()
    (server,) = await start_servers([worker.app()])
    router, _ = await start_router([url_of(server)], RouterConfig(health_interval_s=0.02))
    for _ in range(200):
        if (await router.get("/readyz")).status == 200:
            break
        await asyncio.sleep(0.02)
    yield router, worker
    worker.release.set()
    await router.close()
    await server.close()


async def _metrics(router: TestClient[Any, Any]) -> dict[str, float]:
    return pool_outstanding(await (await router.get("/metrics")).text())


@pytest.mark.parametrize("in_flight", [1, 4])
async def test_in_flight_requests_count_on_their_pool_until_answered(
    router_and_worker: tuple[TestClient[Any, Any], HeldWorker], in_flight: int
) -> None:
    router, worker = router_and_worker
    assert await _metrics(router) == {"aggregated": 0, "prefill": 0, "decode": 0}
    body = json.dumps({"request_id": "r", "model": "m", "token_ids": [1]}).encode()
    sent = [asyncio.create_task(router.post(GENERATE_PATH, data=body)) for _ in range(in_flight)]
    for _ in range(200):
        if worker.arrived == in_flight:
            break
        await asyncio.sleep(0.02)
    assert (await _metrics(router))["aggregated"] == in_flight
    worker.release.set()
    for resp in await asyncio.gather(*sent):
        assert resp.status == 200
        await resp.read()
    assert await _metrics(router) == {"aggregated": 0, "prefill": 0, "decode": 0}


@pytest.mark.parametrize(
    ("begun", "expected"),
    [
        ([("prefill", "p0"), ("decode", "d0")], {"prefill": 1, "decode": 1, "aggregated": 0}),
        (
            [("prefill", "p0"), ("prefill", "p1"), ("decode", "d0")],
            {"prefill": 2, "decode": 1, "aggregated": 0},
        ),
        (
            [("aggregated", "w0"), ("aggregated", "w0")],
            {"aggregated": 2, "prefill": 0, "decode": 0},
        ),
    ],
    ids=["pair", "two-prefill", "one-worker-twice"],
)
def test_each_pool_counts_its_own_workers(
    begun: list[tuple[Any, str]], expected: dict[str, float]
) -> None:
    state = RouterState(sources=[])
    workers = [Worker(url=url, role=role) for role, url in begun]
    for worker in workers:
        state.begin(worker)
    sample = state.metrics.registry.get_sample_value
    assert {r: sample(POOL, {"role": r}) for r in expected} == expected
    for worker in workers:
        state.end(worker)
    assert {r: sample(POOL, {"role": r}) for r in expected} == dict.fromkeys(expected, 0)

"""The router app in-process, in front of two in-process fake workers: placement, forwarding and
ejection decided by the same code the router process runs, without starting processes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from kvretention.dataplane.protocol import GENERATE_PATH, HEADER_SESSION, ErrorCode
from kvretention.dataplane.router.app import RouterConfig, check_all, refresh_membership
from support.router_inprocess import answer_line, start_router, start_servers, url_of, worker_app


@dataclass
class FakeWorker:
    """Answers ``/readyz`` (``ready`` decides) and ``/v1/generate`` (one NDJSON line), and keeps
    every body it got, byte for byte."""

    name: str
    ready: bool = True
    bodies: list[bytes] = field(default_factory=list)
    stalled: asyncio.Event | None = None
    """Set: ``/readyz`` never answers (a worker too busy to), while requests are still served."""
    outdated: bool = False
    """Refuses a request that ``requires`` anything, as a worker older than its frontend does."""
    refused: int = 0

    def app(self) -> web.Application:
        async def readyz(_: web.Request) -> web.Response:
            if self.stalled is not None:
                await asyncio.Event().wait()
            return web.json_response({}, status=200 if self.ready else 503)

        async def generate(request: web.Request) -> web.Response:
            body = await request.read()
            if self.outdated and json.loads(body).get("requires"):
                self.refused += 1
                error = {"code": ErrorCode.WORKER_OUTDATED.value, "message": "older"}
                return web.json_response({"error": error}, status=503)
            self.bodies.append(body)
            return answer_line(self.name)

        return worker_app(generate, readyz=readyz)


@dataclass
class Fleet:
    router: TestClient[Any, Any]
    workers: list[FakeWorker]

    async def generate(self, body: bytes, **headers: str) -> tuple[int, str]:
        resp = await self.router.post(GENERATE_PATH, data=body, headers=headers)
        return resp.status, await resp.text()

    async def settle(self, ready: int) -> None:
        """Wait (bounded) until the router's health checks see ``ready`` healthy workers."""
        for _ in range(200):
            workers = await (await self.router.get("/v1/workers")).json()
            if sum(1 for w in workers if w["healthy"]) == ready:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"the router never saw {ready} healthy workers")


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    workers = [FakeWorker("w0"), FakeWorker("w1")]
    servers = await start_servers(w.app() for w in workers)
    config = RouterConfig(health_interval_s=0.02, policy="least-outstanding")
    router, _ = await start_router([url_of(s) for s in servers], config)
    fleet = Fleet(router, workers)
    await fleet.settle(2)
    yield fleet
    await router.close()
    for server in servers:
        await server.close()


def _body(rid: str, **fields: Any) -> bytes:
    return json.dumps({"request_id": rid, "model": "m", "token_ids": [1, 2], **fields}).encode()


async def test_the_request_reaches_a_worker_byte_for_byte(fleet: Fleet) -> None:
    body = _body("bytes", kv_hints={"retain_full_prompt": {"ttl_seconds": 60}}, z=" spaced ")
    status, text = await fleet.generate(body)
    assert status == 200
    (worker,) = [w for w in fleet.workers if w.bodies]
    assert worker.bodies == [body]
    assert json.loads(text)["text"] == worker.name


async def test_a_session_stays_on_one_worker_and_another_may_move(fleet: Fleet) -> None:
    for n in range(6):
        await fleet.generate(_body(f"s{n}"), **{HEADER_SESSION: "conversation-a"})
    served = [len(w.bodies) for w in fleet.workers]
    assert sorted(served) == [0, 6]


async def test_without_a_session_load_spreads_over_both_workers(fleet: Fleet) -> None:
    await asyncio.gather(*(fleet.generate(_body(f"spread{n}")) for n in range(8)))
    assert all(w.bodies for w in fleet.workers)


async def test_a_worker_that_stops_being_ready_gets_nothing_more(fleet: Fleet) -> None:
    fleet.workers[0].ready = False
    await fleet.settle(1)
    for n in range(4):
        status, _ = await fleet.generate(_body(f"eject{n}"), **{HEADER_SESSION: f"s{n}"})
        assert status == 200
    assert fleet.workers[0].bodies == [] and len(fleet.workers[1].bodies) == 4


async def test_no_ready_worker_is_a_503_no_workers_and_the_router_is_not_ready(
    fleet: Fleet,
) -> None:
    for worker in fleet.workers:
        worker.ready = False
    await fleet.settle(0)
    status, text = await fleet.generate(_body("none"))
    assert status == 503
    assert json.loads(text)["error"]["code"] == "no_workers"
    assert (await fleet.router.get("/readyz")).status == 503


async def test_a_request_an_older_worker_cannot_serve_goes_to_a_newer_one(fleet: Fleet) -> None:
    """Mid-rollout: the old worker refuses what it predates and stays in rotation for the rest."""
    old, new = fleet.workers
    old.outdated = True
    for n in range(4):
        status, text = await fleet.generate(_body(f"new{n}", requires=["continue_final_message"]))
        assert (status, json.loads(text)["text"]) == (200, "w1")
    for n in range(4):
        status, _ = await fleet.generate(_body(f"plain{n}"), **{HEADER_SESSION: "pinned-plain"})
        assert status == 200
    await fleet.settle(2)  # the old worker was never ejected
    assert len(old.bodies) + len(new.bodies) == 8


async def test_no_worker_new_enough_is_a_503_worker_outdated(fleet: Fleet) -> None:
    for worker in fleet.workers:
        worker.outdated = True
    status, text = await fleet.generate(_body("future", requires=["from_a_later_release"]))
    assert status == 503
    assert json.loads(text)["error"]["code"] == "worker_outdated"
    assert [w.refused for w in fleet.workers] == [1, 1]  # each tried once, then the client told
    assert all(not w.bodies for w in fleet.workers)


async def test_answered_requests_keep_a_worker_whose_polls_time_out() -> None:
    """Passive evidence: polls that time out do not eject a worker that answers real requests in
    between; once it answers nothing, three in a row do (another worker is there to take over).
    The polls are driven one by one (the background loop waits an hour after its first round),
    so the outcome depends on the order of polls and answers only, not on timing."""
    slow, other = FakeWorker("slow"), FakeWorker("other")
    servers = await start_servers(w.app() for w in (slow, other))
    urls = [url_of(s) for s in servers]
    config = RouterConfig(health_interval_s=3600.0, health_timeout_s=0.3)
    router, state = await start_router(urls, config)
    try:
        assert all(w.healthy for w in state.workers.values())
        slow.stalled = asyncio.Event()
        state.pins.set("aggregated", "pinned", urls[0])
        for n in range(6):
            await check_all(state)
            resp = await router.post(
                GENERATE_PATH, data=_body(f"passive{n}"), headers={HEADER_SESSION: "pinned"}
            )
            assert resp.status == 200 and json.loads(await resp.text())["text"] == "slow"
            assert state.workers[urls[0]].healthy
        await check_all(state)  # the last request's answer excuses this one
        for failed in (1, 2):
            await check_all(state)
            assert state.workers[urls[0]].health.failures == failed
        await check_all(state)
        assert not state.workers[urls[0]].healthy
        assert state.workers[urls[1]].healthy
    finally:
        await router.close()
        for server in servers:
            await server.close()


async def test_a_swapped_last_worker_serves_until_its_replacement_is_ready() -> None:
    """A rolling update swaps the pool's only pod in one discovery answer: the departing worker
    keeps serving while the newcomer is not ready (no 503), and leaves once it is admitted."""
    old, new = FakeWorker("old"), FakeWorker("new")
    servers = await start_servers(w.app() for w in (old, new))
    old_url, new_url = (url_of(s) for s in servers)
    new.ready = False
    config = RouterConfig(health_interval_s=3600.0, health_timeout_s=0.5)
    router, state = await start_router([old_url], config)
    try:
        assert state.workers[old_url].healthy
        state.sources[0] = replace(state.sources[0], static=(new_url,))
        await refresh_membership(state)
        assert set(state.workers) == {old_url, new_url}
        resp = await router.post(GENERATE_PATH, data=_body("during"))
        assert resp.status == 200 and json.loads(await resp.text())["text"] == "old"
        new.ready = True
        await refresh_membership(state)
        assert set(state.workers) == {old_url, new_url}  # not admitted until its next poll
        await check_all(state)
        await refresh_membership(state)
        assert set(state.workers) == {new_url}
        resp = await router.post(GENERATE_PATH, data=_body("after"))
        assert resp.status == 200 and json.loads(await resp.text())["text"] == "new"
    finally:
        await router.close()
        for server in servers:
            await server.close()

"""The router forwards the exact request bytes, so ``kv_hints`` arrives byte-identical everywhere.

The workers here are capture servers in the test process that keep the raw bytes and headers they
receive; the router is the real process. Every placement path is covered: aggregated, sticky,
and both halves of a disaggregated request.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from support.processes import StartKvretention, free_port
from support.worker_client import post

# Deliberately odd formatting: spacing, key order, escapes, an exponent, an unknown future action.
# Any parse-and-reserialize step on the way would change these bytes.
BODY = (
    b'{ "model":"m",  "request_id":"fwd-%s","token_ids":[1, 2,3],\n'
    b' "kv_hints":{"prefetch_prefix":{"tokens":1e2},"retain_full_prompt":{"tier":"l3","ttl_seconds":1800}},'
    b' "session_id":%s, "note":"caf\\u00e9 \xe2\x9c\x93"}'
)


def body(rid: str, session: str | None = None) -> bytes:
    return BODY % (rid.encode(), json.dumps(session).encode())


@dataclass
class Captured:
    body: bytes
    headers: dict[str, str]


@dataclass
class CaptureWorker:
    """A stand-in worker process-free: answers health and info, records every generate."""

    role: str = "aggregated"
    port: int = field(default_factory=free_port)
    seen: list[Captured] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        async def generate(request: web.Request) -> web.StreamResponse:
            self.seen.append(Captured(await request.read(), dict(request.headers)))
            resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            await resp.prepare(request)
            await resp.write(b'{"text":"ok","token_ids":[1]}\n')
            await resp.write(b'{"text":"!","token_ids":[2],"finish_reason":"stop"}\n')
            await resp.write_eof()
            return resp

        async def ok(request: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        async def info(request: web.Request) -> web.Response:
            return web.json_response(
                {"role": self.role, "bootstrap_host": "bootstrap.example", "bootstrap_port": 7777}
            )

        app = web.Application()
        app.router.add_post("/v1/generate", generate)
        app.router.add_get("/healthz", ok)
        app.router.add_get("/readyz", ok)
        app.router.add_get("/v1/info", info)
        return app


@pytest.fixture(scope="module")
def capture() -> Iterator[dict[str, CaptureWorker]]:
    """Four capture servers (two aggregated, a prefill and a decode) on a private event loop."""
    workers = {
        "a0": CaptureWorker(),
        "a1": CaptureWorker(),
        "prefill": CaptureWorker(role="prefill"),
        "decode": CaptureWorker(role="decode"),
    }
    loop = asyncio.new_event_loop()
    runners: list[web.AppRunner] = []

    async def start() -> None:
        for w in workers.values():
            runner = web.AppRunner(w.app(), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", w.port).start()
            runners.append(runner)

    async def stop() -> None:
        for runner in runners:
            await runner.cleanup()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    try:
        yield workers
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


@pytest.fixture(scope="module")
def routers(
    capture: dict[str, CaptureWorker], kvretention_process: StartKvretention
) -> dict[str, str]:
    agg = kvretention_process(
        ["router", "--worker", capture["a0"].url, "--worker", capture["a1"].url]
    )
    pd = kvretention_process(
        [
            "router",
            "--prefill-worker",
            capture["prefill"].url,
            "--decode-worker",
            capture["decode"].url,
        ]
    )
    return {"aggregated": agg.base_url, "disaggregated": pd.base_url}


def _received(workers: list[CaptureWorker], rid: str) -> list[tuple[str, Captured]]:
    return [(w.role, c) for w in workers for c in w.seen if f'"fwd-{rid}"'.encode() in c.body]


def test_aggregated_forwards_exact_bytes(
    routers: dict[str, str], capture: dict[str, CaptureWorker]
) -> None:
    sent = body("agg", session=None)
    status, lines = post(routers["aggregated"], sent)
    assert status == 200 and lines[-1]["finish_reason"] == "stop"
    ((_, got),) = _received([capture["a0"], capture["a1"]], "agg")
    assert got.body == sent
    assert got.headers["x-kvr-role"] == "aggregated"


def test_sticky_forwards_exact_bytes_to_the_pinned_worker(
    routers: dict[str, str], capture: dict[str, CaptureWorker]
) -> None:
    first, second = body("sticky1", session="s-9"), body("sticky2", session="s-9")
    assert post(routers["aggregated"], first)[0] == 200
    assert post(routers["aggregated"], second)[0] == 200
    pool = [capture["a0"], capture["a1"]]
    ((_, got1),) = _received(pool, "sticky1")
    ((_, got2),) = _received(pool, "sticky2")
    assert (got1.body, got2.body) == (first, second)
    owner = [w for w in pool if any(c.body == first for c in w.seen)]
    assert len(owner) == 1 and any(c.body == second for c in owner[0].seen)


def test_disaggregated_forwards_exact_bytes_to_both_halves(
    routers: dict[str, str], capture: dict[str, CaptureWorker]
) -> None:
    sent = body("pd", session="s-pd")
    status, lines = post(routers["disaggregated"], sent)
    assert status == 200
    assert [line["text"] for line in lines] == ["ok", "!"]
    got = dict(_received([capture["prefill"], capture["decode"]], "pd"))
    assert got["prefill"].body == sent
    assert got["decode"].body == sent
    p, d = got["prefill"].headers, got["decode"].headers
    assert (p["x-kvr-role"], d["x-kvr-role"]) == ("prefill", "decode")
    assert p["x-kvr-bootstrap-room"] == d["x-kvr-bootstrap-room"]
    assert 0 <= int(p["x-kvr-bootstrap-room"]) < 2**63
    for h in (p, d):
        assert (h["x-kvr-bootstrap-host"], h["x-kvr-bootstrap-port"]) == (
            "bootstrap.example",
            "7777",
        )


def test_each_disaggregated_request_gets_a_fresh_room(
    routers: dict[str, str], capture: dict[str, CaptureWorker]
) -> None:
    for rid in ("room1", "room2"):
        assert post(routers["disaggregated"], body(rid))[0] == 200
    rooms = {
        c.headers["x-kvr-bootstrap-room"]
        for rid in ("room1", "room2")
        for _, c in _received([capture["decode"]], rid)
    }
    assert len(rooms) == 2

"""One tenant's huge prompt does not hold up another tenant's small request on the same worker.

The worker renders and tokenizes each request before calling the engine. A ~1 MB prompt takes
seconds of that (the test tokenizer makes one token per byte); a small request from another
tenant arriving meanwhile must be planned on another thread and answered while the huge one is
still being prepared. "Still being prepared" is measured, not slept: the engine stand-in notes
when each request reaches it, and the small answer must be complete before the huge request
reaches the engine.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kvretention.common.tenancy import HEADER_TENANT
from kvretention.dataplane.worker.app import WorkerState, build_app
from kvretention.dataplane.worker.dialect import Dialect
from kvretention.dataplane.worker.engine import LoadedEngine
from kvretention.dataplane.worker.standin import STANDINS, StandinConfig
from support.chat_tokenizer import build_tokenizer

HUGE_BYTES = 1_000_000
CODE = "def double(x):\n    return x * 2  # a line of an agent's file\n" * 40


def huge_body() -> bytes:
    """An agent-like conversation of ``HUGE_BYTES``: many turns of code."""
    messages: list[dict[str, str]] = []
    size = 0
    while size < HUGE_BYTES:
        role = "user" if len(messages) % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"turn {len(messages)}\n{CODE}"})
        size += len(CODE)
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "go on"})
    payload = {"request_id": "huge", "model": "m", "session_id": "big", "messages": messages}
    return json.dumps(payload).encode()


SMALL = {
    "request_id": "small",
    "model": "m",
    "session_id": "small",
    "messages": [{"role": "user", "content": "hello"}],
}


class Arrivals:
    """Notes when each request id reaches the stand-in's ``async_generate`` (wrapped so that its
    signature, ``cache_salt`` included, still reads as the engine's)."""

    def __init__(self, engine: Any) -> None:
        self.at: dict[str, float] = {}
        generate = engine.async_generate

        @functools.wraps(generate)
        async def noted(**kwargs: Any) -> Any:
            self.at[kwargs["rid"]] = time.monotonic()
            return await generate(**kwargs)

        engine.async_generate = noted


@pytest.fixture
async def worker() -> AsyncIterator[tuple[TestClient[Any, Any], Arrivals]]:
    engine = STANDINS[Dialect.FLAT](StandinConfig(), tokenizer=build_tokenizer())
    arrivals = Arrivals(engine)
    loaded = LoadedEngine(engine=engine, name="standin", dialect=Dialect.FLAT)
    client: TestClient[Any, Any] = TestClient(
        TestServer(build_app(WorkerState(engine=loaded, role="aggregated")))
    )
    await client.start_server()
    yield client, arrivals
    await client.close()


async def post(client: TestClient[Any, Any], body: bytes, *, tenant: str) -> tuple[int, float]:
    """Status and when the whole answer had arrived."""
    headers = {HEADER_TENANT: tenant, "Content-Type": "application/json"}
    async with client.post("/v1/generate", data=body, headers=headers) as resp:
        lines = [json.loads(line) for line in (await resp.text()).splitlines()]
    assert lines[-1].get("finish_reason") == "stop", lines[-1]
    return resp.status, time.monotonic()


async def planning(client: TestClient[Any, Any]) -> int:
    async with client.get("/readyz") as resp:
        count: int = (await resp.json())["planning"]
    return count


async def test_a_small_request_is_answered_while_a_huge_one_is_prepared(
    worker: tuple[TestClient[Any, Any], Arrivals],
) -> None:
    client, arrivals = worker
    huge = asyncio.create_task(post(client, huge_body(), tenant="team-a"))
    while await planning(client) == 0:  # the huge request is being prepared from here on
        assert not huge.done()
    status, small_done = await post(client, json.dumps(SMALL).encode(), tenant="team-b")
    assert status == 200
    huge_status, _ = await huge
    assert huge_status == 200
    assert small_done < arrivals.at["huge"], (
        f"the small request finished {small_done - arrivals.at['huge']:.3f}s after the huge one "
        "was prepared: it waited behind it"
    )

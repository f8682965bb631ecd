"""A worker's exact fast paths that turn themselves off are visible on ``/metrics``.

Token reuse and the compiled (minijinja) chat template each check themselves against the exact
path and stop on a difference; answers stay exact and only a log line said so. The real worker
app, with the stand-in engine and the tests' chat tokenizer, must report each path it runs as 1,
then 0 once it turned itself off, and no sample for a path it does not run.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from kvretention.dataplane.compiled_template import compiled_template_for
from kvretention.dataplane.worker.app import WorkerState, build_app
from kvretention.dataplane.worker.dialect import Dialect
from kvretention.dataplane.worker.engine import LoadedEngine
from kvretention.dataplane.worker.fast_paths import METRIC
from kvretention.dataplane.worker.standin import STANDINS, StandinConfig
from support.chat_tokenizer import build_tokenizer

TURN = {
    "request_id": "r1",
    "model": "m",
    "session_id": "s1",
    "messages": [{"role": "user", "content": "hello"}],
}


def worker_state(tokenizer: Any) -> WorkerState:
    engine = STANDINS[Dialect.FLAT](StandinConfig(), tokenizer=tokenizer)
    loaded = LoadedEngine(engine=engine, name="standin", dialect=Dialect.FLAT)
    return WorkerState(engine=loaded, role="aggregated")


@pytest.fixture
async def served() -> AsyncIterator[tuple[TestClient[Any, Any], WorkerState, Any]]:
    tokenizer = build_tokenizer()
    state = worker_state(tokenizer)
    client: TestClient[Any, Any] = TestClient(TestServer(build_app(state)))
    await client.start_server()
    yield client, state, tokenizer
    await client.close()


async def fast_paths(client: TestClient[Any, Any]) -> dict[str, float]:
    async with client.get("/metrics") as resp:
        text = await resp.text()
    return {
        sample.labels["path"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == METRIC
        for sample in family.samples
    }


async def answer(client: TestClient[Any, Any]) -> None:
    headers = {"Content-Type": "application/json"}
    async with client.post("/v1/generate", data=json.dumps(TURN), headers=headers) as resp:
        lines = [json.loads(line) for line in (await resp.text()).splitlines()]
    assert resp.status == 200 and lines[-1].get("finish_reason") == "stop", lines[-1]


async def test_each_fast_path_reads_1_while_it_serves_and_0_once_it_turned_itself_off(
    served: tuple[TestClient[Any, Any], WorkerState, Any],
) -> None:
    client, state, tokenizer = served
    await answer(client)
    assert await fast_paths(client) == {"token_reuse": 1.0, "compiled_template": 1.0}

    assert state.render_cache is not None
    state.render_cache._disable("a reused prompt differed (test)")
    compiled = compiled_template_for(tokenizer)
    assert compiled is not None
    compiled.enabled = False  # what a sampled difference from Jinja2 does
    await answer(client)  # still answered, on the exact paths
    assert await fast_paths(client) == {"token_reuse": 0.0, "compiled_template": 0.0}


async def test_a_worker_without_a_chat_template_reports_no_fast_path() -> None:
    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    client: TestClient[Any, Any] = TestClient(TestServer(build_app(worker_state(tokenizer))))
    await client.start_server()
    try:
        assert await fast_paths(client) == {}
    finally:
        await client.close()

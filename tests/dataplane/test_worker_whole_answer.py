"""An answer the client reads whole leaves the worker in a few merged chunks, not one per token.

The real worker app with the engine stand-in and SGLang's own parsers: the same request asked
with ``stream`` true and false must fold into the same answer (text, reasoning, tool calls,
finish reason, usage), the second in two lines (the first chunk at once, the rest merged) while
the engine is faster than the flush interval, and in one line per output when every output is
due (interval 0).
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from kvretention.dataplane.frontend.common import Completion
from kvretention.dataplane.protocol import GenerateChunk
from kvretention.dataplane.worker import app as worker_app
from kvretention.dataplane.worker.app import WorkerState, build_app
from kvretention.dataplane.worker.dialect import Dialect
from kvretention.dataplane.worker.engine import LoadedEngine
from kvretention.dataplane.worker.parsing import ParserNames
from kvretention.dataplane.worker.standin import STANDINS, StandinConfig
from support.chat_tokenizer import build_tokenizer

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "parameters": CITY}
PROMPTS = {
    "text": "Say something long about the weather in Paris and Rome, please.",
    "reasoning": "[[standin:reasoning]] Think, then say hello.",
    "two tool calls": "[[standin:parallel_tool_calls]] Weather, twice.",
}


async def start(config: StandinConfig) -> TestClient[Any, Any]:
    parsers = ParserNames(tool_call_parser="qwen25", reasoning_parser="qwen3")
    engine = STANDINS[Dialect.FLAT](config, tokenizer=build_tokenizer())
    loaded = LoadedEngine(engine=engine, name="standin", dialect=Dialect.FLAT, parsers=parsers)
    server = TestClient(TestServer(build_app(WorkerState(engine=loaded, role="aggregated"))))
    await server.start_server()
    return server


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    server = await start(StandinConfig(thinks=True))
    yield server
    await server.close()


async def raw_lines(client: TestClient[Any, Any], prompt: str, *, stream: bool) -> list[Any]:
    payload = {
        "request_id": f"r-{stream}",
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "tools": [WEATHER],
        "stream": stream,
    }
    resp = await client.post("/v1/generate", json=payload)
    assert resp.status == 200, await resp.text()
    return [json.loads(line) for line in (await resp.text()).splitlines()]


async def lines_of(
    client: TestClient[Any, Any], prompt: str, *, stream: bool
) -> list[GenerateChunk]:
    lines = await raw_lines(client, prompt, stream=stream)
    return [msgspec.convert(line, GenerateChunk) for line in lines]


def answer(chunks: list[GenerateChunk]) -> tuple[Any, ...]:
    """What the frontend makes of the lines (the prompt's cached tokens and the calls' ids aside:
    the second ask of a prompt finds it cached, and each answer names its calls anew; and the
    newline before ``</think>``, which SGLang's whole reasoning parse drops and its streaming
    one keeps)."""
    out = Completion()
    for chunk in chunks:
        out.add(chunk)
    usage = (out.usage.prompt_tokens, out.usage.completion_tokens)
    assert all(call.id.startswith("call_") for call in out.tool_calls)  # fresh ids each answer
    calls = [(call.name, call.arguments, call.kind) for call in out.tool_calls]
    return out.text, out.reasoning.strip(), calls, out.finish_reason, usage


def ids(chunks: list[GenerateChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


@pytest.mark.parametrize("prompt", list(PROMPTS.values()), ids=list(PROMPTS))
async def test_a_whole_answer_is_the_streamed_one_in_two_lines(
    client: TestClient[Any, Any], prompt: str
) -> None:
    streamed = await lines_of(client, prompt, stream=True)
    whole = await lines_of(client, prompt, stream=False)
    assert len(streamed) > 2, "the stand-in answers in many outputs"
    assert len(whole) == 2
    assert ids(whole[:1]) == ids(streamed[:1])  # the first chunk is not held
    assert answer(whole) == answer(streamed)
    assert ids(whole) == ids(streamed)


async def test_every_output_is_written_once_it_is_due(
    client: TestClient[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_app, "WHOLE_ANSWER_FLUSH_S", 0.0)
    streamed = await lines_of(client, PROMPTS["text"], stream=True)
    whole = await lines_of(client, PROMPTS["text"], stream=False)
    assert [ids([c]) for c in whole] == [ids([c]) for c in streamed]
    assert answer(whole) == answer(streamed)


def fail_after(engine: Any, outputs: int) -> None:
    """The engine's answers break off with an exception after ``outputs`` outputs (wrapped so
    that its signature still reads as the engine's)."""
    generate = engine.async_generate

    @functools.wraps(generate)
    async def failing(**kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        inner = await generate(**kwargs)

        async def broken() -> AsyncIterator[dict[str, Any]]:
            count = 0
            async for output in inner:
                yield output
                count += 1
                if count == outputs:
                    raise RuntimeError("the engine died")

        return broken()

    engine.async_generate = failing


async def test_an_answer_that_breaks_off_sends_what_was_held_then_the_error() -> None:
    server = await start(StandinConfig())
    fail_after(server.server.app[worker_app.STATE].engine.engine, 4)
    try:
        streamed = await raw_lines(server, PROMPTS["text"], stream=True)
        whole = await raw_lines(server, PROMPTS["text"], stream=False)
    finally:
        await server.close()
    assert len(streamed) == 5 and len(whole) == 3  # four outputs and the error; 1 + 3 merged
    assert whole[-1]["error"]["code"] == streamed[-1]["error"]["code"] == "engine_error"
    assert [t for line in whole[:-1] for t in line["token_ids"]] == [
        t for line in streamed[:-1] for t in line["token_ids"]
    ]

"""Tools, reasoning, structured output, images and counting through the real worker app.

The worker renders with a real tool-aware chat template (``support.chat_tokenizer``) and parses
with SGLang's own parsers; the engine stand-in answers in the model's native format (Qwen's
``<tool_call>`` JSON and ``<think>`` tags, or Llama 3's ``<|python_tag|>``), chosen per request
by markers in the last user message, and records what the engine was called with.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kvretention.dataplane.worker import app as worker_app
from kvretention.dataplane.worker import output_parser
from kvretention.dataplane.worker.app import WorkerState, build_app
from kvretention.dataplane.worker.dialect import Dialect
from kvretention.dataplane.worker.engine import EngineLoadError, LoadedEngine, load_engine
from kvretention.dataplane.worker.parsing import ParserNames
from kvretention.dataplane.worker.standin import STANDINS, StandinConfig
from support.chat_tokenizer import build_tokenizer

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
TIME = {
    "name": "get_time",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"type": "string"}},
        "required": ["zone"],
    },
}
PATCH = {"kind": "custom", "name": "apply_patch", "description": "Apply a patch."}
QWEN = ParserNames(tool_call_parser="qwen25", reasoning_parser="qwen3")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


Client = Callable[..., Any]


@pytest.fixture
async def worker(tokenizer: Any) -> AsyncIterator[Client]:
    """``await worker(parsers=..., tool_format=..., dialect=...)`` -> (client, stand-in engine)."""
    clients: list[TestClient[Any, Any]] = []

    async def start(
        parsers: ParserNames = QWEN, tool_format: str = "qwen25", dialect: Dialect = Dialect.FLAT
    ) -> tuple[TestClient[Any, Any], Any]:
        config = StandinConfig(tool_format=tool_format, thinks=parsers.reasoning_parser is not None)
        engine = STANDINS[dialect](config, tokenizer=tokenizer)
        loaded = LoadedEngine(engine=engine, name="standin", dialect=dialect, parsers=parsers)
        client: TestClient[Any, Any] = TestClient(
            TestServer(build_app(WorkerState(engine=loaded, role="aggregated")))
        )
        await client.start_server()
        clients.append(client)
        return client, engine

    yield start
    for client in clients:
        await client.close()


def body(content: Any, **fields: Any) -> dict[str, Any]:
    return {
        "request_id": fields.pop("request_id", "r1"),
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        **fields,
    }


async def generate(client: TestClient[Any, Any], payload: dict[str, Any]) -> tuple[int, list[Any]]:
    resp = await client.post("/v1/generate", json=payload)
    text = await resp.text()
    return resp.status, [json.loads(line) for line in text.splitlines() if line.strip()]


def joined(lines: list[dict[str, Any]], key: str) -> str:
    return "".join(line.get(key, "") for line in lines)


def calls_of(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-call deltas merged by index, checking id and name come first and only once."""
    merged: dict[int, dict[str, Any]] = {}
    for line in lines:
        for delta in line.get("tool_calls", []):
            index = delta["index"]
            if index not in merged:
                assert delta["id"].startswith("call_") and delta["name"], delta
                merged[index] = {
                    "id": delta["id"],
                    "name": delta["name"],
                    "arguments": "",
                    "kind": delta.get("kind", "function"),
                }
            else:
                assert "id" not in delta and "name" not in delta, delta
            merged[index]["arguments"] += delta.get("arguments", "")
    return [merged[i] for i in sorted(merged)]


def engine_prompt(engine: Any, tokenizer: Any) -> str:
    (call,) = [c for c in engine.calls if c.get("event") == "generate"][-1:]
    kwargs = call["kwargs"]
    return kwargs["prompt"] if "prompt" in kwargs else str(tokenizer.decode(kwargs["input_ids"]))


async def test_tool_call_streams_by_index_with_id_and_name_first(
    worker: Client, tokenizer: Any
) -> None:
    client, engine = await worker()
    status, lines = await generate(
        client, body("Weather in Paris? [[standin:tool_call]]", tools=[WEATHER, TIME])
    )
    assert status == 200
    (call,) = calls_of(lines)
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "stand-in"}
    assert lines[-1]["finish_reason"] == "tool_calls"
    # the empty think block and its trailing "\n\n" make no reasoning and no text (issue 20, 7)
    assert joined(lines, "text") == "" and joined(lines, "reasoning") == ""
    assert sum(len(line.get("tool_calls", [])) for line in lines) > 2  # streamed in fragments
    prompt = engine_prompt(engine, tokenizer)
    assert '"name": "get_weather"' in prompt and '"name": "get_time"' in prompt
    sampling = engine.calls[-1]["kwargs"]["sampling_params"]
    assert sampling == {"skip_special_tokens": False}  # auto: no constraint, as SGLang
    assert engine.calls[-1]["kwargs"]["require_reasoning"] is True  # qwen3 thinks by default


async def test_parallel_tool_calls_get_their_own_indices_and_ids(worker: Client) -> None:
    client, _ = await worker()
    _, lines = await generate(
        client, body("Both please [[standin:parallel_tool_calls]]", tools=[WEATHER, TIME])
    )
    calls = calls_of(lines)
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c["arguments"]) for c in calls] == [
        {"city": "stand-in"},
        {"zone": "stand-in"},
    ]
    assert calls[0]["id"] != calls[1]["id"]
    assert lines[-1]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_one_call_only_stops_the_engine_at_the_second(worker: Client, stream: bool) -> None:
    """``parallel_tool_calls: false`` with an automatic choice (unconstrained, as SGLang): the
    client gets the first call whole, the finish reason ``tool_calls`` and the usage so far, and
    the engine request is aborted when a second call begins instead of running to its end."""
    client, engine = await worker()
    payload = body(
        "Both please [[standin:parallel_tool_calls]]",
        tools=[WEATHER, TIME],
        parallel_tool_calls=False,
        stream=stream,
    )
    _, lines = await generate(client, payload)
    (call,) = calls_of(lines)
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "stand-in"})
    assert lines[-1]["finish_reason"] == "tool_calls"
    assert "r1" in engine.tokenizer_manager.aborted
    _, everything = await generate(
        client, {**payload, "parallel_tool_calls": True, "request_id": "r2"}
    )
    both = everything[-1]["usage"]["completion_tokens"]
    assert 0 < lines[-1]["usage"]["completion_tokens"] < both
    assert "<tool_call>" not in joined(lines, "text")


async def test_reasoning_is_split_from_the_answer(worker: Client) -> None:
    client, _ = await worker()
    _, lines = await generate(client, body("Think first [[standin:reasoning]]"))
    assert joined(lines, "reasoning").strip() == "The user wants the stand-in answer."
    assert joined(lines, "text").strip() == "Hello from the kvretention stand-in."
    assert lines[-1]["finish_reason"] == "stop"
    assert lines[-1]["usage"]["reasoning_tokens"] > 0
    assert "<think>" not in joined(lines, "text")


async def test_reasoning_left_in_the_text_when_not_separated(worker: Client) -> None:
    """SGLang's ``separate_reasoning: false``: no reasoning parser, the markers stay."""
    client, _ = await worker()
    payload = body("Think first [[standin:reasoning]]", separate_reasoning=False)
    _, lines = await generate(client, payload)
    assert joined(lines, "reasoning") == ""
    text = joined(lines, "text")
    assert "<think>" in text and "The user wants the stand-in answer." in text
    assert text.rstrip().endswith("Hello from the kvretention stand-in.")


@pytest.mark.parametrize("streamed", [True, False])
async def test_reasoning_streams_as_it_comes_or_in_one_piece(
    worker: Client, streamed: bool
) -> None:
    """SGLang's ``stream_reasoning: false``: the reasoning comes in one piece once it ends."""
    client, _ = await worker()
    payload = body("Think first [[standin:reasoning]]", stream_reasoning=streamed)
    _, lines = await generate(client, payload)
    pieces = [line["reasoning"] for line in lines if line.get("reasoning", "").strip()]
    assert "".join(pieces).strip() == "The user wants the stand-in answer."
    assert (len(pieces) > 1) == streamed


async def test_reasoning_then_tool_call(worker: Client) -> None:
    client, _ = await worker()
    _, lines = await generate(
        client, body("[[standin:reasoning]] [[standin:tool_call:get_time]]", tools=[WEATHER, TIME])
    )
    assert "stand-in answer" in joined(lines, "reasoning")
    assert [c["name"] for c in calls_of(lines)] == ["get_time"]
    assert lines[-1]["finish_reason"] == "tool_calls"


async def test_thinking_off_reaches_the_template(worker: Client, tokenizer: Any) -> None:
    client, engine = await worker()
    _, lines = await generate(client, body("hi", reasoning={"enabled": False}))
    assert engine_prompt(engine, tokenizer).endswith("<think>\n\n</think>\n\n")
    assert "require_reasoning" not in engine.calls[-1]["kwargs"]
    assert joined(lines, "text") == "Hello from the kvretention stand-in."
    assert joined(lines, "reasoning") == ""


async def test_without_a_reasoning_parser_think_tags_stay_in_the_text(worker: Client) -> None:
    client, _ = await worker(parsers=ParserNames(tool_call_parser="qwen25"))
    _, lines = await generate(client, body("[[standin:reasoning]]"))
    assert joined(lines, "text").startswith("<think>")
    assert joined(lines, "reasoning") == ""


@pytest.mark.parametrize(
    "choice",
    [{"mode": "required"}, {"mode": "named", "name": "get_time"}],
    ids=["required", "named"],
)
async def test_required_and_named_choice_are_constrained_like_sglang(
    worker: Client, tokenizer: Any, choice: dict[str, Any]
) -> None:
    client, engine = await worker()
    marker = "[[standin:tool_call:get_time]]"
    _, lines = await generate(client, body(marker, tools=[WEATHER, TIME], tool_choice=choice))
    sampling = engine.calls[-1]["kwargs"]["sampling_params"]
    tag = json.loads(sampling["structural_tag"])
    assert tag["type"] == "structural_tag"
    assert tag["triggers"] == ["<tool_call>"]
    assert tag["at_least_one"] is True
    # SGLang's legacy tag for qwen25 admits every tool even for a named choice (its server builds
    # the parser with all tools); the template is shown only the named one.
    names = {s["begin"].split('"name":"')[1].split('"')[0] for s in tag["structures"]}
    assert names == {"get_weather", "get_time"}
    prompt = engine_prompt(engine, tokenizer)
    assert ('"name": "get_weather"' in prompt) is (choice["mode"] == "required")
    assert [c["name"] for c in calls_of(lines)] == ["get_time"]
    assert lines[-1]["finish_reason"] == "tool_calls"


async def test_required_without_a_native_format_uses_the_json_array(worker: Client) -> None:
    client, engine = await worker(parsers=ParserNames())
    _, lines = await generate(
        client,
        body("go", tools=[WEATHER], tool_choice={"mode": "required"}, parallel_tool_calls=False),
    )
    schema = json.loads(engine.calls[-1]["kwargs"]["sampling_params"]["json_schema"])
    assert (schema["type"], schema["minItems"], schema["maxItems"]) == ("array", 1, 1)
    (call,) = calls_of(lines)
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "stand-in"}
    assert lines[-1]["finish_reason"] == "tool_calls"


async def test_tool_choice_none_offers_and_parses_no_tools(worker: Client, tokenizer: Any) -> None:
    client, engine = await worker()
    _, lines = await generate(
        client,
        body("[[standin:tool_call]]", tools=[WEATHER], tool_choice={"mode": "none"}),
    )
    assert "<tools>" not in engine_prompt(engine, tokenizer)
    assert "<tool_call>" in joined(lines, "text")
    assert calls_of(lines) == []
    assert lines[-1]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("response_format", "schema"),
    [
        (
            {"type": "json_schema", "json_schema": {"type": "object", "required": ["answer"]}},
            {"type": "object", "required": ["answer"]},
        ),
        ({"type": "json_object"}, {"type": "object"}),
    ],
)
async def test_structured_output_is_a_json_schema_constraint(
    worker: Client, response_format: dict[str, Any], schema: dict[str, Any]
) -> None:
    client, engine = await worker()
    _, lines = await generate(client, body("[[standin:json]]", response_format=response_format))
    assert json.loads(engine.calls[-1]["kwargs"]["sampling_params"]["json_schema"]) == schema
    assert json.loads(joined(lines, "text")) == {"answer": "stand-in"}


async def test_required_tool_choice_with_structured_output_is_refused(worker: Client) -> None:
    client, engine = await worker()
    status, (err,) = await generate(
        client,
        body(
            "x",
            tools=[WEATHER],
            tool_choice={"mode": "required"},
            response_format={"type": "json_object"},
        ),
    )
    assert status == 400
    assert err["error"]["code"] == "invalid_request"
    assert err["error"]["param"] == "tool_choice"
    assert engine.calls == []


async def test_custom_tool_input_comes_back_as_free_text(worker: Client) -> None:
    client, _ = await worker()
    _, lines = await generate(client, body("[[standin:tool_call:apply_patch]]", tools=[PATCH]))
    (call,) = calls_of(lines)
    assert (call["name"], call["kind"], call["arguments"]) == ("apply_patch", "custom", "stand-in")


async def test_history_with_calls_and_results_renders_and_answers_in_text(
    worker: Client, tokenizer: Any
) -> None:
    client, engine = await worker()
    payload = {
        "request_id": "loop-2",
        "model": "m",
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": "Weather? [[standin:tool_call]]"},
            {
                "role": "assistant",
                "reasoning": {"text": "call the tool"},
                "tool_calls": [
                    {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    }
    _, lines = await generate(client, payload)
    prompt = engine_prompt(engine, tokenizer)
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        in prompt
    )
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    assert "<think>\ncall the tool\n</think>" in prompt
    assert calls_of(lines) == []
    assert joined(lines, "text").strip() == "Hello from the kvretention stand-in."


async def test_bad_history_arguments_are_a_400_before_the_engine(worker: Client) -> None:
    client, engine = await worker()
    payload = body("x")
    payload["messages"].insert(
        0, {"role": "assistant", "tool_calls": [{"id": "c", "name": "f", "arguments": "{oops"}]}
    )
    status, (err,) = await generate(client, payload)
    assert status == 400
    assert err["error"]["param"] == "messages.0.tool_calls.0.arguments"
    assert engine.calls == []


async def test_count_only_renders_and_counts_without_the_engine(
    worker: Client, tokenizer: Any
) -> None:
    client, engine = await worker()
    payload = body("count me", tools=[WEATHER], count_only=True)
    status, lines = await generate(client, payload)
    assert status == 200
    (line,) = lines
    assert line["finish_reason"] == "stop"
    _, generated = await generate(client, body("count me", tools=[WEATHER], request_id="r2"))
    (call,) = engine.calls
    assert line["usage"]["prompt_tokens"] == len(call["kwargs"]["input_ids"]) > 100
    assert generated[-1]["usage"]["prompt_tokens"] == line["usage"]["prompt_tokens"]


async def test_frontend_token_ids_are_used_and_tools_still_parse(
    worker: Client, tokenizer: Any
) -> None:
    client, engine = await worker()
    from kvretention.dataplane.frontend.tokenizer import HfChatTokenizer
    from kvretention.dataplane.protocol import PreprocessedRequest

    request = PreprocessedRequest.model_validate(
        body("Weather? [[standin:tool_call]]", tools=[WEATHER])
    )
    token_ids = HfChatTokenizer(tokenizer).encode_request(request)
    assert token_ids is not None
    _, lines = await generate(client, {**body("ignored", tools=[WEATHER]), "token_ids": token_ids})
    assert engine.calls[-1]["kwargs"]["input_ids"] == token_ids
    assert [c["name"] for c in calls_of(lines)] == ["get_weather"]


async def test_images_are_passed_as_image_data_with_the_rendered_text(
    worker: Client, tokenizer: Any
) -> None:
    client, engine = await worker()
    url = "data:image/png;base64,iVBORw0KGgo="
    content = [{"type": "image", "url": url}, {"type": "text", "text": "what is it?"}]
    status, _ = await generate(client, body(content))
    assert status == 200
    kwargs = engine.calls[-1]["kwargs"]
    assert kwargs["image_data"] == [url]
    assert "<|vision_start|><|image_pad|><|vision_end|>what is it?" in kwargs["prompt"]
    assert "input_ids" not in kwargs


async def test_cached_tokens_come_from_the_engine(worker: Client) -> None:
    client, _ = await worker()
    first = body("same prefix", request_id="c1")
    _, lines1 = await generate(client, first)
    _, lines2 = await generate(client, {**first, "request_id": "c2"})
    assert lines1[-1]["usage"].get("cached_tokens", 0) == 0
    assert lines2[-1]["usage"]["cached_tokens"] == lines2[-1]["usage"]["prompt_tokens"]


@pytest.mark.parametrize("dialect", [Dialect.FLAT, Dialect.VERSIONED])
async def test_hinted_tool_request_keeps_its_kv_hints(worker: Client, dialect: Dialect) -> None:
    client, engine = await worker(dialect=dialect)
    hint = {"retain_full_prompt": {"ttl_seconds": 600}}
    _, lines = await generate(client, body("[[standin:tool_call]]", tools=[WEATHER], kv_hints=hint))
    assert "kv_hints" in engine.calls[-1]["kwargs"]
    assert lines[-1]["finish_reason"] == "tool_calls"
    _, _ = await generate(client, body("plain", request_id="r2", tools=[WEATHER]))
    assert "kv_hints" not in engine.calls[-1]["kwargs"]


async def test_llama3_family_parses_its_own_format(worker: Client) -> None:
    client, _ = await worker(parsers=ParserNames(tool_call_parser="llama3"), tool_format="llama3")
    _, lines = await generate(
        client, body("[[standin:parallel_tool_calls]]", tools=[WEATHER, TIME])
    )
    assert [c["name"] for c in calls_of(lines)] == ["get_weather", "get_time"]
    assert lines[-1]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tool-call-parser", "qwen2.5"], "unknown --tool-call-parser 'qwen2.5'; SGLang knows: "),
        (["--reasoning-parser=qwen-3"], "unknown --reasoning-parser 'qwen-3'; SGLang knows: "),
    ],
)
def test_unknown_parser_names_fail_at_start_listing_the_valid_ones(
    argv: list[str], message: str
) -> None:
    with pytest.raises(EngineLoadError) as info:
        load_engine("standin:flat", server_argv=argv, role="aggregated")
    assert str(info.value).startswith(message)
    assert "qwen25" in str(info.value) or "qwen3" in str(info.value)


async def test_count_only_ignores_a_hint_the_engine_could_not_take(worker: Client) -> None:
    client, engine = await worker(dialect=Dialect.NONE)
    hint = {"retain_full_prompt": {"ttl_seconds": 600}}
    status, (line,) = await generate(client, body("count", count_only=True, kv_hints=hint))
    assert status == 200
    assert line["usage"]["prompt_tokens"] > 0
    assert engine.calls == []


async def test_a_slow_prompt_is_prepared_off_the_event_loop(
    worker: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one request's prompt is still being rendered and tokenized, ``/readyz`` and the
    router's health checks answer (a blocked loop would get the worker ejected). The planning step
    is held until the probe has answered: on the event loop that could never happen."""
    real, planning, release = worker_app.plan_call, threading.Event(), threading.Event()
    waited: list[bool] = []

    def held(*args: Any, **kwargs: Any) -> Any:
        planning.set()
        waited.append(release.wait(timeout=10))  # False: nothing could answer meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(worker_app, "plan_call", held)
    client, _ = await worker()
    pending = asyncio.create_task(generate(client, body("hello", request_id="slow")))
    assert await asyncio.to_thread(planning.wait, 10)
    ready = await asyncio.wait_for(client.get("/readyz"), timeout=5)
    assert ready.status == 200 and not pending.done()
    assert (await ready.json()) == {"status": "ready", "planning": 1, "inflight": 0}
    release.set()
    status, lines = await pending
    assert waited == [True]
    assert status == 200 and lines[-1]["finish_reason"] == "stop"


async def test_a_deferred_tool_is_callable_but_not_listed(worker: Client, tokenizer: Any) -> None:
    """Tool search (Claude Code's ToolSearch): the template lists only ``tools``; a deferred tool
    whose definition a tool result carried is parsed like any other when the model calls it."""
    client, engine = await worker()
    marker = '[[standin:tool_call:get_weather]] [[standin:tool_args:{"city": "Rome"}]]'
    status, lines = await generate(
        client, body(f"Weather? {marker}", tools=[TIME], deferred_tools=[WEATHER])
    )
    assert status == 200
    (call,) = calls_of(lines)
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Rome"})
    prompt = engine_prompt(engine, tokenizer)
    assert '"name": "get_time"' in prompt and '"name": "get_weather"' not in prompt


@pytest.mark.parametrize("unlike", [False, True], ids=["alike", "unlike"])
async def test_calls_unlike_the_whole_parse_are_counted(
    worker: Client, monkeypatch: pytest.MonkeyPatch, unlike: bool
) -> None:
    """The worker compares each streamed answer's calls with SGLang's whole parse of its text
    and counts those that differ, by parser, on ``/metrics``."""
    if unlike:  # a detector whose whole parse reads another call than it streamed
        real = output_parser.OutputParser._parsed_calls

        def another(self: Any, text: str) -> tuple[str, list[tuple[str, str]]]:
            rest, calls = real(self, text)
            return rest, [*calls, ("get_time", '{"zone": "UTC"}')]

        monkeypatch.setattr(output_parser.OutputParser, "_parsed_calls", another)
    client, _ = await worker()
    _, lines = await generate(
        client, body("Weather? [[standin:tool_call]]", tools=[WEATHER], stream=True)
    )
    assert [c["name"] for c in calls_of(lines)] == ["get_weather"]
    metrics = await (await client.get("/metrics")).text()
    counted = 'kvretention_worker_tool_calls_unlike_whole_total{parser="qwen25"} 1.0'
    assert (counted in metrics) is unlike

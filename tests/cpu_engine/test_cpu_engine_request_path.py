"""The whole request path on SGLang's real engine: official SDKs -> frontend -> router -> worker ->
``sglang.Engine`` on CPU with the project's tiny model.

The model's text is noise, so each test asserts what the engine must get right whatever it says:
the providers' shapes, token counts, SGLang's own ``cached_tokens`` for a repeated prefix, tool calls
that SGLang's constraint forced and its ``qwen25`` parser parsed, well-formed event streams, bounds
refused before anything reaches the engine, and that no ``sgl_kernel`` shim function was called
while serving.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest

from support.cpu_engine import SERVED_NAME, CpuWorker, start_cpu_fleet
from support.processes import KvrProcess, StartKvretention

pytestmark = pytest.mark.cpu_engine

SYSTEM = (
    "You are a helpful assistant. Read the file, answer the question, tell me what the cache "
    "prefix token retention radix tree engine server request reply model is. "
) * 3
OPENING = 8
"""Tokens every prompt shares whatever it says (the chat format's opening ``<|im_start|>system``)."""
WEATHER_TOOL: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
}


@dataclass
class Fleet:
    worker: CpuWorker
    router: KvrProcess
    frontend: KvrProcess
    openai: openai.OpenAI
    anthropic: anthropic.Anthropic


@pytest.fixture(scope="module")
def fleet(start: StartKvretention, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("cpu-fleet")
    instructions = tmp / "codex-instructions.md"
    instructions.write_text("You are a coding agent.\n")
    started = start_cpu_fleet(
        start,
        tmp,
        sglang_args=["--max-total-tokens", "16384", "--context-length", "8192"],
        router_args=["--health-interval", "0.3"],
        frontend_args=["--codex-instructions-file", str(instructions)],
    )
    worker, frontend = started.worker, started.frontend
    yield Fleet(
        worker=worker,
        router=started.router,
        frontend=frontend,
        openai=openai.OpenAI(
            base_url=frontend.base_url + "/v1", api_key="unused", max_retries=0, timeout=120
        ),
        anthropic=anthropic.Anthropic(
            base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=120
        ),
    )
    assert worker.shim_functions_called() == [], "serving called an sgl_kernel shim function"


def nonce() -> str:
    return f"question {uuid.uuid4().hex[:12]}"


def test_the_worker_serves_sglangs_real_engine_on_cpu(fleet: Fleet) -> None:
    with urllib.request.urlopen(fleet.worker.base_url + "/v1/info", timeout=5) as resp:
        info = json.load(resp)
    assert info["engine"] == "sglang-0.5.23"
    assert info["device"] == "cpu"
    assert info["dialect"] == "versioned"
    assert info["model_type"] == "llama"  # the tiny model: what SGLang's special-token rules read
    assert info["sampling_defaults"] == {}  # its generation config recommends no sampling
    assert fleet.worker.shim_functions_called() == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_openai_chat_second_turn_reads_its_prefix_from_sglangs_radix_cache(
    fleet: Fleet, stream: bool
) -> None:
    system = nonce() + " " + SYSTEM
    cached: list[int] = []
    for turn in ("first turn", "second turn"):
        kwargs: dict[str, Any] = {
            "model": SERVED_NAME,
            "max_tokens": 4,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": turn},
            ],
            "prompt_cache_options": {"mode": "implicit"},
        }
        if stream:
            chunks = list(
                fleet.openai.chat.completions.create(
                    stream=True, stream_options={"include_usage": True}, **kwargs
                )
            )
            usage = chunks[-1].usage
            assert chunks[-1].choices == [] and any(c.choices for c in chunks)
        else:
            completion = fleet.openai.chat.completions.create(**kwargs)
            usage = completion.usage
            assert completion.choices[0].finish_reason in ("length", "stop")
        assert usage is not None and usage.completion_tokens <= 4
        details = usage.prompt_tokens_details
        cached.append(details.cached_tokens or 0 if details else 0)
        prompt_tokens = usage.prompt_tokens
    assert cached[0] <= OPENING
    # The system prompt is shared, the user turn is not.
    assert 60 <= cached[1] < prompt_tokens, cached


def test_openai_responses_is_served_with_usage(fleet: Fleet) -> None:
    instructions = nonce() + " " + SYSTEM
    cached = []
    for turn in ("one", "two"):
        response = fleet.openai.responses.create(
            model=SERVED_NAME, instructions=instructions, input=turn, max_output_tokens=4
        )
        assert response.status in ("completed", "incomplete")
        assert response.usage is not None and response.usage.output_tokens <= 4
        cached.append(response.usage.input_tokens_details.cached_tokens)
    assert cached[0] <= OPENING and cached[1] >= 60, cached


def test_anthropic_messages_stream_and_cache_read(fleet: Fleet) -> None:
    system = nonce() + " " + SYSTEM
    reads = []
    for turn in ("one", "two"):
        with fleet.anthropic.messages.stream(
            model=SERVED_NAME,
            max_tokens=4,
            system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
            messages=[{"role": "user", "content": turn}],
        ) as stream:
            message = stream.get_final_message()
        assert message.stop_reason in ("max_tokens", "end_turn")
        assert message.usage.output_tokens <= 4
        reads.append(message.usage.cache_read_input_tokens or 0)
    assert reads[0] <= OPENING and reads[1] >= 60, reads


FORCED_CALL_TOKENS = 256
"""Room for one strict call of the tiny model (its tokens are short: 40-110 per call seen)."""


def city_arguments(arguments: str | dict[str, Any]) -> str:
    """The call's ``city``: ``strict`` tools have SGLang constrain the arguments to the schema, so
    even the tiny model's noise parses as ``{"city": "..."}`` (its length is not checked: a
    character the model split over tokens can come back as several U+FFFD)."""
    parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert isinstance(parsed, dict) and set(parsed) == {"city"}, arguments
    assert isinstance(parsed["city"], str), arguments
    return str(parsed["city"])


def test_a_forced_tool_call_comes_back_parsed_by_sglang_openai(fleet: Fleet) -> None:
    completion = fleet.openai.chat.completions.create(
        model=SERVED_NAME,
        max_tokens=FORCED_CALL_TOKENS,
        messages=[{"role": "user", "content": "What is the weather in Paris? " + nonce()}],
        tools=[
            {
                "type": "function",
                "function": {"name": "get_weather", "parameters": WEATHER_TOOL, "strict": True},
            }
        ],
        tool_choice="required",
        parallel_tool_calls=False,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert call.id.startswith("call_")
    city_arguments(call.function.arguments)  # type: ignore[union-attr]


def test_a_forced_tool_call_comes_back_as_tool_use_anthropic(fleet: Fleet) -> None:
    message = fleet.anthropic.messages.create(
        model=SERVED_NAME,
        max_tokens=FORCED_CALL_TOKENS,
        messages=[{"role": "user", "content": "What is the weather in Paris? " + nonce()}],
        tools=[{"name": "get_weather", "input_schema": WEATHER_TOOL, "strict": True}],  # type: ignore[typeddict-unknown-key]
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    )
    assert message.stop_reason == "tool_use"
    [use] = [b for b in message.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    city_arguments(use.input)  # type: ignore[arg-type]


def test_responses_function_call_item_from_a_forced_tool(fleet: Fleet) -> None:
    """No ``strict`` given: Responses tools are strict by default, so the engine's grammar keeps
    even the tiny model's arguments to the schema."""
    response = fleet.openai.responses.create(
        model=SERVED_NAME,
        input="What is the weather in Paris? " + nonce(),
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL}],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=FORCED_CALL_TOKENS,
    )
    assert response.status == "completed"
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather"
    city_arguments(call.arguments)


# -- event streams, read off the wire ---------------------------------------------------------


def sse_events(fleet: Fleet, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST ``body`` to the frontend and read its SSE frames: each frame's ``event:`` name must be
    its data's ``type`` (both SDKs dispatch on one or the other)."""
    headers = {"anthropic-version": "2023-06-01"} if path == "/v1/messages" else {}
    events: list[dict[str, Any]] = []
    with httpx.stream(
        "POST", fleet.frontend.base_url + path, json=body, headers=headers, timeout=120
    ) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for frame in resp.read().decode().split("\n\n"):
            if not frame.strip():
                continue
            fields = dict(line.split(": ", 1) for line in frame.splitlines())
            assert set(fields) == {"event", "data"}, frame
            data = json.loads(fields["data"])
            assert data["type"] == fields["event"], frame
            events.append(data)
    return events


def test_responses_stream_events_are_well_formed_and_read_the_cache(fleet: Fleet) -> None:
    """``response.created``, ``response.in_progress``, one message item whose text deltas add up to
    its ``done`` text and to the final response's, then one terminal event carrying the usage."""
    instructions = nonce() + " " + SYSTEM
    cached = []
    for turn in ("one", "two"):
        events = sse_events(
            fleet,
            "/v1/responses",
            {
                "model": SERVED_NAME,
                "instructions": instructions,
                "input": turn,
                "max_output_tokens": 4,
                "stream": True,
            },
        )
        kinds = [e["type"] for e in events]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert kinds[:2] == ["response.created", "response.in_progress"], kinds
        final = events[-1]["response"]
        assert kinds[-1] == f"response.{final['status']}", kinds
        assert final["status"] in ("completed", "incomplete")
        assert {e["response"]["id"] for e in events if "response" in e} == {final["id"]}
        assert kinds[2:-1] == [
            "response.output_item.added",
            "response.content_part.added",
            *["response.output_text.delta"] * kinds.count("response.output_text.delta"),
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ], kinds
        item_id = events[2]["item"]["id"]
        assert {e["item_id"] for e in events[3:-2]} == {item_id}
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        (message,) = final["output"]
        assert message["id"] == item_id and message["type"] == "message"
        assert [p["text"] for p in message["content"]] == [deltas]
        assert next(e for e in events if e["type"] == "response.output_text.done")["text"] == deltas
        usage = final["usage"]
        assert 1 <= usage["output_tokens"] <= 4, usage
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        cached.append(usage["input_tokens_details"]["cached_tokens"])
    assert cached[0] <= OPENING and cached[1] >= 60, cached


def stream_one_message(fleet: Fleet) -> list[dict[str, Any]]:
    """The SSE events of a streamed one-turn ``/v1/messages`` (a fresh system prompt, 4 tokens)."""
    return sse_events(
        fleet,
        "/v1/messages",
        {
            "model": SERVED_NAME,
            "max_tokens": 4,
            "system": nonce() + " " + SYSTEM,
            "messages": [{"role": "user", "content": "one"}],
            "stream": True,
        },
    )


def test_anthropic_messages_stream_events_are_well_formed(fleet: Fleet) -> None:
    """``message_start``, one text block (start, deltas, stop), ``message_delta`` with the stop
    reason and usage, ``message_stop``; no ``ping`` or ``error`` in between on a healthy turn."""
    events = stream_one_message(fleet)
    kinds = [e["type"] for e in events if e["type"] != "ping"]
    deltas = kinds.count("content_block_delta")
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ], kinds
    start = events[0]["message"]
    assert start["role"] == "assistant" and start["content"] == []
    assert start["usage"]["output_tokens"] == 0
    block = next(e for e in events if e["type"] == "content_block_start")
    assert block["index"] == 0 and block["content_block"] == {"type": "text", "text": ""}
    text_deltas = [e for e in events if e["type"] == "content_block_delta"]
    assert all(e["index"] == 0 and e["delta"]["type"] == "text_delta" for e in text_deltas)
    assert next(e for e in events if e["type"] == "content_block_stop")["index"] == 0
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] in ("max_tokens", "end_turn")
    assert 1 <= delta["usage"]["output_tokens"] <= 4
    assert delta["usage"]["input_tokens"] + delta["usage"]["cache_read_input_tokens"] > 60


def test_anthropic_message_start_carries_the_prompts_input_tokens(fleet: Fleet) -> None:
    """Anthropic's ``message_start`` reports the prompt's counts before the first token; SGLang's
    first stream output has them (``meta_info.prompt_tokens``, ``cached_tokens``)."""
    events = stream_one_message(fleet)
    usage = events[0]["message"]["usage"]
    assert usage["input_tokens"] > 60, usage


# -- bounds: refused by the frontend, never forwarded --------------------------------------------

TOO_MANY = 2**64 + 1
BAD_COUNTS: list[tuple[object, str]] = [
    (TOO_MANY, "invalid_value"),
    (0, "invalid_value"),
    (-1, "invalid_value"),
    (1.5, "invalid_type"),
    ("16", "invalid_type"),
]
SHAPES = {
    "openai-chat": ("/v1/chat/completions", "max_tokens"),
    "openai-chat-completion-tokens": ("/v1/chat/completions", "max_completion_tokens"),
    "openai-responses": ("/v1/responses", "max_output_tokens"),
    "anthropic": ("/v1/messages", "max_tokens"),
}


def forwarded(fleet: Fleet) -> tuple[float, float]:
    """:func:`counted` once two reads 0.2 s apart agree (a stream that just ended may be counted
    a moment later)."""
    last = counted(fleet)
    for _ in range(25):
        time.sleep(0.2)
        now, last = last, counted(fleet)
        if now == last:
            break
    return last


def counted(fleet: Fleet) -> tuple[float, float]:
    """The router's routed requests and the worker's finished ones, from their ``/metrics``."""

    def total(url: str, metric: str) -> float:
        text = httpx.get(url + "/metrics", timeout=10).text
        # the name is right (a counter with no sample yet is a zero, not a typo)
        assert re.search(rf"^# TYPE {metric}(_total)? counter$", text, re.M), text
        return sum(float(v) for v in re.findall(rf"^{metric}_total{{[^}}]*}} (\S+)$", text, re.M))

    return (
        total(fleet.router.base_url, "kvretention_router_requests"),
        total(fleet.worker.base_url, "kvretention_worker_requests"),
    )


def test_a_bounded_max_tokens_is_forwarded_and_counted(fleet: Fleet) -> None:
    """The counters the bounds cases compare do move when a request reaches the engine."""
    before = forwarded(fleet)
    resp = httpx.post(
        fleet.frontend.base_url + "/v1/chat/completions",
        json={
            "model": SERVED_NAME,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "hi " + nonce()}],
        },
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    after = forwarded(fleet)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


@pytest.mark.parametrize(("value", "code"), BAD_COUNTS, ids=["2**64+1", "0", "-1", "float", "str"])
@pytest.mark.parametrize("shape", SHAPES)
def test_max_tokens_out_of_bounds_is_the_providers_400_before_anything_is_forwarded(
    fleet: Fleet, shape: str, value: object, code: str
) -> None:
    path, key = SHAPES[shape]
    body: dict[str, Any] = {"model": SERVED_NAME, key: value}
    if path == "/v1/responses":
        body["input"] = "hi " + nonce()
    else:
        body["messages"] = [{"role": "user", "content": "hi " + nonce()}]
    before = forwarded(fleet)
    headers = {"anthropic-version": "2023-06-01"} if path == "/v1/messages" else {}
    resp = httpx.post(fleet.frontend.base_url + path, json=body, headers=headers, timeout=30)
    assert resp.status_code == 400, resp.text
    error = resp.json()
    if path == "/v1/messages":
        assert error["type"] == "error"
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["message"].startswith(f"{key}: ")
    else:
        assert error["error"]["type"] == "invalid_request_error"
        assert (error["error"]["param"], error["error"]["code"]) == (key, code)
    if value == TOO_MANY:
        assert str(TOO_MANY) in resp.text and str(2**31 - 1) in resp.text
    assert forwarded(fleet) == before


def test_the_workers_fast_paths_serve_sglangs_own_template_and_tokenizer(fleet: Fleet) -> None:
    """After turns on the real tokenizer, the worker's exact fast paths still serve: neither found
    a difference from the exact path (a ``0`` is what ``KvRetentionWorkerFastPathOff`` fires on)."""
    messages = [{"role": "user", "content": SYSTEM + nonce()}]
    for _ in range(2):
        reply = fleet.openai.chat.completions.create(
            model=SERVED_NAME,
            messages=messages,
            max_tokens=2,  # type: ignore[arg-type]
        )
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": nonce()},
        ]
    text = httpx.get(fleet.worker.base_url + "/metrics", timeout=10).text
    serving = dict(
        re.findall(r'^kvretention_worker_fast_path_enabled\{path="(\w+)"\} (\S+)$', text, re.M)
    )
    assert serving == {"compiled_template": "1.0", "token_reuse": "1.0"}, text


def test_sglangs_own_fields_reach_the_engine(fleet: Fleet) -> None:
    """SGLang's extensions (the SDK's ``extra_body``) do what SGLang's server makes them do: a
    ``regex`` holds the noise to its pattern, ``min_tokens`` with ``ignore_eos`` fills the budget,
    and ``top_k: 1`` is greedy, so the same request answers the same."""
    question = [{"role": "user", "content": "yes or no? " + nonce()}]
    constrained = fleet.openai.chat.completions.create(
        model=SERVED_NAME, max_tokens=8, messages=question, extra_body={"regex": "(yes|no)"}
    )
    assert constrained.choices[0].message.content in ("yes", "no")
    filled = fleet.openai.chat.completions.create(
        model=SERVED_NAME,
        max_tokens=6,
        messages=question,
        extra_body={"min_tokens": 6, "ignore_eos": True},
    )
    assert filled.usage is not None and filled.usage.completion_tokens == 6
    greedy = [
        fleet.openai.chat.completions.create(
            model=SERVED_NAME,
            max_tokens=8,
            temperature=1.0,
            messages=question,
            extra_body={"top_k": 1},
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert greedy[0] == greedy[1]


def test_an_anthropic_prefill_is_continued_not_closed(fleet: Fleet) -> None:
    """A last assistant message is where the answer starts: the prompt grows by the prefill's own
    tokens, not by a closed turn and a new assistant header (at least five more)."""
    question = {"role": "user", "content": "Name a city. " + nonce()}
    counts = []
    for messages in ([question], [question, {"role": "assistant", "content": "Sure"}]):
        message = fleet.anthropic.messages.create(
            model=SERVED_NAME, max_tokens=2, messages=messages
        )
        usage = message.usage  # the prompt: what was read from the cache, written, and the rest
        read, written = usage.cache_read_input_tokens or 0, usage.cache_creation_input_tokens or 0
        counts.append(usage.input_tokens + read + written)
    assert 1 <= counts[1] - counts[0] <= 4, counts


PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
IMAGE_BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "openai-chat": (
        "/v1/chat/completions",
        {
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{PIXEL}"},
                        },
                    ],
                }
            ],
        },
    ),
    "openai-responses": (
        "/v1/responses",
        {
            "max_output_tokens": 4,
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {"type": "input_image", "image_url": f"data:image/png;base64,{PIXEL}"},
                    ],
                }
            ],
        },
    ),
    "anthropic": (
        "/v1/messages",
        {
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": PIXEL},
                        },
                    ],
                }
            ],
        },
    ),
}


def test_codex_is_told_what_the_model_reads_and_how_much(fleet: Fleet) -> None:
    """The worker reports what SGLang's model reads and its context; Codex's catalog says so, so
    Codex keeps a pasted screenshot out of a conversation this model would refuse, and compacts
    before a prompt overflows the context."""
    with urllib.request.urlopen(fleet.worker.base_url + "/v1/info", timeout=5) as resp:
        info = json.load(resp)
    assert info["input_modalities"] == ["text"]
    assert 8000 < info["context_length"] <= 8192  # --context-length 8192, less what SGLang keeps
    resp = httpx.get(
        fleet.frontend.base_url + "/v1/models", params={"client_version": "0.171.0"}, timeout=30
    )
    assert resp.status_code == 200, resp.text
    [entry] = resp.json()["models"]
    assert (entry["input_modalities"], entry["context_window"]) == (
        ["text"],
        info["context_length"],
    )


def refused(fleet: Fleet, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` (with the served model) to the frontend's ``path``; its 400 body."""
    headers = {"anthropic-version": "2023-06-01"} if path == "/v1/messages" else {}
    resp = httpx.post(
        fleet.frontend.base_url + path,
        json={"model": SERVED_NAME, **body},
        headers=headers,
        timeout=120,
    )
    assert resp.status_code == 400, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


@pytest.mark.parametrize("shape", IMAGE_BODIES)
def test_an_image_to_the_text_only_model_is_a_400_not_an_answer_without_it(
    fleet: Fleet, shape: str
) -> None:
    """The tiny model has no multimodal processor, so SGLang would drop the image and answer the
    text alone: the client is told instead, in its provider's error shape."""
    path, body = IMAGE_BODIES[shape]
    error = refused(fleet, path, body)
    if path == "/v1/messages":
        assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert "image input is not supported" in error["error"]["message"]
    assert "1 image" in error["error"]["message"]


LONG = "word " * 10_000
"""About 10,000 tokens of the tiny model's: more than the fleet's 8,192 context."""
OVERFLOWS: dict[str, tuple[str, dict[str, Any]]] = {
    "openai-chat": (
        "/v1/chat/completions",
        {"max_tokens": 4, "messages": [{"role": "user", "content": LONG}]},
    ),
    "openai-responses": ("/v1/responses", {"max_output_tokens": 4, "input": LONG}),
    "anthropic": (
        "/v1/messages",
        {"max_tokens": 4, "messages": [{"role": "user", "content": LONG}]},
    ),
    "anthropic-stream": (
        "/v1/messages",
        {"max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": LONG}]},
    ),
}


@pytest.mark.parametrize("shape", OVERFLOWS)
def test_a_prompt_longer_than_the_context_gets_the_providers_own_error(
    fleet: Fleet, shape: str
) -> None:
    """What agents act on: Codex reads the code ``context_length_exceeded``, Claude Code reads
    ``prompt is too long: N tokens > M maximum`` (and compacts)."""
    path, body = OVERFLOWS[shape]
    error = refused(fleet, path, body)["error"]
    assert error["type"] == "invalid_request_error"
    if path == "/v1/messages":
        found = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", error["message"])
        assert found is not None, error["message"]
        assert int(found[1]) > int(found[2]) > 8000
    else:
        assert error["code"] == "context_length_exceeded"
        assert "maximum context length is" in error["message"]

"""The frontend as a real process, driven by the official ``openai`` SDK, against the router stand-in.

Checks end to end that hinted requests reach the router with ``kv_hints`` at top level, unhinted
ones without it, refused ones not at all, and that both OpenAI stream formats are well formed; then
agent traffic: tool loops, parallel calls, tool_choice, structured output, images, reasoning and a
Codex-shaped Responses turn, each parsed by the SDK and checked at the router.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import openai
import pytest

from kvretention.dataplane.protocol import (
    ChatMessage,
    PreprocessedRequest,
    ReasoningControl,
    ToolChoice,
)
from support.openai_shapes import APPLY_PATCH, CODEX_MESSAGES, CODEX_TOOLS, codex_body
from support.router_standin import (
    CANNED,
    CUSTOM_INPUT,
    REASONING,
    TOOL_ARGS,
    RouterStandIn,
    parse_sse,
    tag,
    untyped,
    user,
)

HINT_30M = {"retain_full_prompt": {"ttl_seconds": 1800}}
HINT_12H = {"retain_full_prompt": {"ttl_seconds": 43200}}


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trace") / "frontend.jsonl"


@pytest.fixture(scope="module")
def frontend(router_standin: RouterStandIn, kvretention_process: Any, trace_path: Path) -> Any:
    args = ["frontend", "--router-url", router_standin.base_url, "--model", "m"]
    args += ["--upstream-timeout", "1", "--trace-file", str(trace_path)]
    return kvretention_process(args)


@pytest.fixture(scope="module")
def client(frontend: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{frontend.base_url}/v1", api_key="unused", max_retries=0, timeout=15
    )


@pytest.fixture(scope="module")
def clients(
    client: openai.OpenAI, router_standin: RouterStandIn, kvretention_process: Any
) -> dict[str, openai.OpenAI]:
    """One client per breakpoint mode; ``reject`` is the v1 contract, exactly."""
    args = ["frontend", "--router-url", router_standin.base_url, "--model", "m"]
    reject = kvretention_process([*args, "--breakpoints", "reject", "--upstream-timeout", "1"])
    return {
        "prefix": client,
        "reject": openai.OpenAI(
            base_url=f"{reject.base_url}/v1", api_key="unused", max_retries=0, timeout=15
        ),
    }


Refused = tuple[str, str]
"""``(param, code)`` of the 400."""
PREFIX_1 = {"retain_prefixes": {"breakpoints": 1}}
NO_HINT: dict[str, Any] = {}


def expect_per_mode(
    mode: str, reject: Refused, prefix: Refused | dict[str, Any]
) -> Refused | dict[str, Any]:
    return reject if mode == "reject" else prefix


def received(router: RouterStandIn, needle: str) -> list[dict[str, Any]]:
    return router.bodies_for(needle)


def marked_content(text_type: str, word: str, part: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A user message's content: ``word`` as a ``text_type`` part, then ``part`` (if any) marked
    as an explicit breakpoint."""
    content: list[dict[str, Any]] = [{"type": text_type, "text": word}]
    if part is not None:
        content.append({**part, "prompt_cache_breakpoint": {"mode": "explicit"}})
    return content


def forwarded_or_refused(
    send: Callable[[], object],
    expected: Refused | dict[str, Any],
    router: RouterStandIn,
    word: str,
) -> dict[str, Any] | openai.BadRequestError:
    """``send()`` a request carrying ``word``. Expected a hint: the one body the router got, whose
    ``kv_hints`` is that hint. Expected a refusal: the 400 raised, with that ``(param, code)``,
    and nothing forwarded."""
    if isinstance(expected, dict):
        send()
        [body] = received(router, word)
        assert body.get("kv_hints", {}) == expected
        return body
    with pytest.raises(openai.BadRequestError) as info:
        send()
    assert (info.value.param, info.value.code) == expected
    assert received(router, word) == []
    return info.value


# -- Chat Completions --------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("extra", "hint"),
    [
        pytest.param({}, None, id="unhinted"),
        pytest.param({"prompt_cache_options": {}}, HINT_30M, id="implicit_default"),
        pytest.param(
            {"prompt_cache_options": {"mode": "implicit", "ttl": "30m"}},
            HINT_30M,
            id="implicit_30m",
        ),
        pytest.param({"prompt_cache_key": "k", "prompt_cache_retention": "24h"}, None, id="legacy"),
    ],
)
def test_chat_forwards_hint_exactly_when_asked(
    client: openai.OpenAI,
    router_standin: RouterStandIn,
    extra: dict[str, Any],
    hint: dict[str, Any] | None,
    stream: bool,
) -> None:
    word = tag()
    kwargs: dict[str, Any] = {"model": "m", "messages": user(word), "extra_body": extra}
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "stop"
    else:
        completion = client.chat.completions.create(**kwargs)
        text = completion.choices[0].message.content or ""
        assert completion.choices[0].finish_reason == "stop"
        assert completion.usage is not None and completion.usage.prompt_tokens == 7
    assert text == "".join(CANNED)
    [body] = received(router_standin, word)
    assert body.get("kv_hints") == hint
    assert ("kv_hints" in body) == (hint is not None)
    assert "prompt_cache_options" not in body and "prompt_cache_key" not in body


def test_chat_maps_sampling_and_session(frontend: Any, router_standin: RouterStandIn) -> None:
    word = tag()
    client = openai.OpenAI(
        base_url=f"{frontend.base_url}/v1",
        api_key="unused",
        max_retries=0,
        default_headers={"x-session-id": "sess-42"},
    )
    completion = client.chat.completions.create(
        model="m",
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": word}]},
        ],
        max_completion_tokens=2,
        temperature=0.5,
        top_p=0.9,
        stop=["END"],
        seed=7,
        presence_penalty=0.1,
    )
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content == "".join(CANNED[:2])
    [body] = received(router_standin, word)
    assert body["session_id"] == "sess-42"
    assert body["messages"] == [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": word},
    ]
    assert body["sampling"] == {
        "max_new_tokens": 2,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["END"],
        "sampling_seed": 7,
        "presence_penalty": 0.1,
    }


def test_chat_stream_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=user(tag()),
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens_details is not None
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 3


BREAKPOINT_400: Final = ("messages[0].content[1].prompt_cache_breakpoint", "unsupported_parameter")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["prefix", "reject"])
@pytest.mark.parametrize(
    ("extra", "messages_part", "reject", "prefix"),
    [
        pytest.param(
            {"prompt_cache_options": {"mode": "explicit"}},
            None,
            ("prompt_cache_options.mode", "unsupported_value"),
            NO_HINT,  # explicit mode without a breakpoint retains nothing, as OpenAI's
            id="explicit_mode",
        ),
        pytest.param(
            {"prompt_cache_options": {"ttl": "12h"}},
            None,
            ("prompt_cache_options.ttl", "invalid_value"),
            ("prompt_cache_options.ttl", "invalid_value"),
            id="chat_has_no_12h",
        ),
        pytest.param(
            {"prompt_cache_options": {"mode": "implicit", "extra": 1}},
            None,
            ("prompt_cache_options.extra", "unknown_parameter"),
            ("prompt_cache_options.extra", "unknown_parameter"),
            id="unknown_subfield",
        ),
        pytest.param(
            {"prompt_cache_options": {}},
            {"type": "image_url", "image_url": {"url": "https://x/a.png"}},
            BREAKPOINT_400,
            {**HINT_30M, **PREFIX_1},
            id="image_part_breakpoint",
        ),
        pytest.param(
            {},
            {"type": "text", "text": "x"},
            BREAKPOINT_400,
            PREFIX_1,
            id="text_part_breakpoint_without_options",
        ),
    ],
)
def test_chat_cache_controls_per_breakpoint_mode(
    clients: dict[str, openai.OpenAI],
    router_standin: RouterStandIn,
    extra: dict[str, Any],
    messages_part: dict[str, Any] | None,
    reject: Refused,
    prefix: Refused | dict[str, Any],
    mode: str,
    stream: bool,
) -> None:
    """``reject`` is the v1 table; ``prefix`` forwards a breakpoint as a marker on its part. What
    is refused never reaches the router."""
    word = tag()
    content = marked_content("text", word, messages_part)
    expected = expect_per_mode(mode, reject, prefix)

    def send() -> None:
        clients[mode].chat.completions.create(
            model="m",
            messages=untyped([{"role": "user", "content": content}]),
            stream=stream,
            extra_body=extra,
        )

    outcome = forwarded_or_refused(send, expected, router_standin, word)
    if isinstance(outcome, dict):
        marks = json.dumps(outcome).count('"retain_ttl": 1800')
        assert marks == outcome.get("kv_hints", {}).get("retain_prefixes", {}).get("breakpoints", 0)
        return
    assert outcome.status_code == 400
    assert outcome.type == "invalid_request_error"
    assert outcome.response.headers["content-type"].startswith("application/json")


def test_chat_unknown_model_is_404(client: openai.OpenAI, router_standin: RouterStandIn) -> None:
    word = tag()
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=user(word))
    assert info.value.code == "model_not_found" and info.value.param == "model"
    assert received(router_standin, word) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_chat_kv_hints_unsupported_before_stream_is_visible(
    client: openai.OpenAI, router_standin: RouterStandIn, stream: bool
) -> None:
    word = tag()
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(
            model="m",
            messages=user(f"{word} [[kv_unsupported]]"),
            stream=stream,
            extra_body={"prompt_cache_options": {}},
        )
    assert info.value.status_code == 501
    assert info.value.code == "kv_hints_unsupported"
    assert "kv_hints" in info.value.message
    assert info.value.param == "prompt_cache_options"
    [body] = received(router_standin, word)
    assert body["kv_hints"] == HINT_30M


def test_chat_kv_hints_unsupported_mid_stream_is_an_sse_error(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="m",
        messages=user(f"{tag()} [[kv_unsupported_midstream]]"),
        stream=True,
        extra_body={"prompt_cache_options": {}},
    )
    seen: list[str] = []
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            seen.append(chunk.choices[0].delta.content or "")
    assert "".join(seen) == CANNED[0]
    assert "kv_hints" in info.value.message
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "kv_hints_unsupported"


def test_chat_sse_is_well_formed(frontend: Any) -> None:
    body = {"model": "m", "stream": True, "messages": user(tag()), "prompt_cache_options": {}}
    raw = _post_raw(frontend.base_url + "/v1/chat/completions", body)
    frames = parse_sse(raw)
    assert frames[-1] == (None, "[DONE]")
    chunks = [json.loads(data) for event, data in frames[:-1]]
    assert all(event is None for event, _ in frames)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


# -- Responses ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("extra", "hint"),
    [
        pytest.param({}, None, id="unhinted"),
        pytest.param({"prompt_cache_options": {"mode": "implicit"}}, HINT_30M, id="implicit"),
        pytest.param({"prompt_cache_options": {"ttl": "12h"}}, HINT_12H, id="ttl_12h"),
        pytest.param({"prompt_cache_retention": "24h"}, None, id="legacy_only"),
    ],
)
def test_responses_forwards_hint_exactly_when_asked(
    client: openai.OpenAI,
    router_standin: RouterStandIn,
    extra: dict[str, Any],
    hint: dict[str, Any] | None,
    stream: bool,
) -> None:
    word = tag()
    kwargs: dict[str, Any] = {
        "model": "m",
        "instructions": "be brief",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": word}]}],
        "extra_body": extra,
    }
    if stream:
        events = list(client.responses.create(stream=True, **kwargs))
        types = [e.type for e in events]
        assert types[0] == "response.created" and types[-1] == "response.completed"
        final = untyped(events[-1]).response
    else:
        final = client.responses.create(**kwargs)
    assert final.status == "completed"
    assert final.output_text == "".join(CANNED)
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens == 3
    [body] = received(router_standin, word)
    assert body.get("kv_hints") == hint
    assert ("kv_hints" in body) == (hint is not None)
    assert body["messages"][0] == {"role": "system", "content": "be brief"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("mode", ["prefix", "reject"])
@pytest.mark.parametrize(
    ("part", "extra", "reject", "prefix"),
    [
        pytest.param(
            {"type": "input_file", "file_id": "file-1"},
            {"prompt_cache_options": {}},
            ("input[0].content[1].prompt_cache_breakpoint", "unsupported_parameter"),
            # a valid breakpoint, on a part this server cannot take (stored files)
            ("input[0].content[1].type", "unsupported_parameter"),
            id="input_file_breakpoint",
        ),
        pytest.param(
            {"type": "input_text", "text": "more"},
            {"prompt_cache_options": {"ttl": "12h"}},
            ("input[0].content[1].prompt_cache_breakpoint", "unsupported_parameter"),
            {"retain_full_prompt": {"ttl_seconds": 43200}, **PREFIX_1},
            id="input_text_breakpoint",
        ),
        pytest.param(
            None,
            {"prompt_cache_options": {"prewarm": True}},
            ("prompt_cache_options.prewarm", "unsupported_value"),
            ("prompt_cache_options.prewarm", "unsupported_value"),
            id="prewarm",
        ),
        pytest.param(
            None,
            {"prompt_cache_options": {"mode": "Implicit"}},
            ("prompt_cache_options.mode", "invalid_value"),
            ("prompt_cache_options.mode", "invalid_value"),
            id="mode_case",
        ),
    ],
)
def test_responses_cache_controls_per_breakpoint_mode(
    clients: dict[str, openai.OpenAI],
    router_standin: RouterStandIn,
    part: dict[str, Any] | None,
    extra: dict[str, Any],
    reject: Refused,
    prefix: Refused | dict[str, Any],
    mode: str,
    stream: bool,
) -> None:
    word = tag()
    content = marked_content("input_text", word, part)
    expected = expect_per_mode(mode, reject, prefix)

    def send() -> None:
        clients[mode].responses.create(
            model="m",
            input=untyped([{"role": "user", "content": content}]),
            stream=stream,
            extra_body=extra,
        )

    outcome = forwarded_or_refused(send, expected, router_standin, word)
    if isinstance(outcome, dict):
        assert json.dumps(outcome).count('"retain_ttl": 43200') == 1


def test_responses_length_is_incomplete(client: openai.OpenAI) -> None:
    response = client.responses.create(model="m", input=tag(), max_output_tokens=1)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


def test_responses_mid_stream_error_events(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model="m",
            input=f"{tag()} [[kv_unsupported_midstream]]",
            stream=True,
            extra_body={"prompt_cache_options": {}},
        )
    )
    types = [e.type for e in events]
    assert types[-2:] == ["error", "response.failed"]
    error = untyped(events[-2])
    assert error.code == "kv_hints_unsupported"
    assert "kv_hints" in error.message


def test_responses_sse_is_well_formed(frontend: Any) -> None:
    body = {"model": "m", "stream": True, "input": tag(), "prompt_cache_options": {}}
    frames = parse_sse(_post_raw(frontend.base_url + "/v1/responses", body))
    events = [(name, json.loads(data)) for name, data in frames]
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    names = [name for name, _ in events]
    assert names[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert names[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [data["delta"] for name, data in events if name == "response.output_text.delta"]
    assert "".join(deltas) == events[-4][1]["text"] == "".join(CANNED)


# -- trace -------------------------------------------------------------------------------------


def test_trace_records_hint_only_for_accepted_hinted_requests(
    client: openai.OpenAI, trace_path: Path
) -> None:
    client.chat.completions.create(
        model="m", messages=user(tag()), extra_body={"prompt_cache_options": {}}
    )
    client.chat.completions.create(model="m", messages=user(tag()))
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="m", messages=user(tag()), extra_body={"prompt_cache_options": {"mode": "x"}}
        )
    records = [json.loads(line) for line in trace_path.read_text().splitlines()][-3:]
    hinted, plain, rejected = records
    assert (hinted["outcome"], hinted["kv_hints"]) == ("ok", HINT_30M)
    assert hinted["endpoint"] == "chat.completions" and hinted["component"] == "frontend"
    assert plain["outcome"] == "ok" and "kv_hints" not in plain
    assert rejected["outcome"] == "rejected" and "kv_hints" not in rejected
    assert rejected["error_code"] == "invalid_value" and rejected["status"] == 400
    assert len({r["request_id"] for r in records}) == 3


def _post_raw(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=15) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        data: bytes = resp.read()
        return data


# -- agents: tools, reasoning, structured output, images (issue 10) ---------------------------

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME: Any = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
ARGS = "".join(TOOL_ARGS)
PNG = "data:image/png;base64,iVBORw0KGgo="


def weather_call_and_result(result: str, **assistant: Any) -> list[dict[str, Any]]:
    """What the router gets for a turn that called ``get_weather`` (``call_0``) and the tool's
    ``result``: the assistant's call (with ``assistant``'s extra fields) and the tool message."""
    call = {"id": "call_0", "name": "get_weather", "arguments": ARGS, "kind": "function"}
    return [
        {"role": "assistant", "content": "", **assistant, "tool_calls": [call]},
        {"role": "tool", "content": result, "tool_call_id": "call_0", "name": "get_weather"},
    ]


def _chat_turn(
    client: openai.OpenAI, messages: list[Any], *, stream: bool, **kwargs: Any
) -> tuple[Any, str | None]:
    """One chat turn, streamed or not, folded into (assistant message as the SDK sees it, finish)."""
    if not stream:
        completion = client.chat.completions.create(model="m", messages=messages, **kwargs)
        return completion.choices[0].message, completion.choices[0].finish_reason
    with client.chat.completions.stream(model="m", messages=messages, **kwargs) as events:
        final = events.get_final_completion()
    return final.choices[0].message, final.choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_chat_tool_loop(client: openai.OpenAI, router_standin: RouterStandIn, stream: bool) -> None:
    word = tag()
    messages: list[Any] = [{"role": "user", "content": f"{word} weather? [[tool_call]]"}]
    message, finish = _chat_turn(client, messages, stream=stream, tools=[WEATHER, TIME])
    assert finish == "tool_calls"
    assert message.content in (None, "")
    [call] = message.tool_calls
    assert (call.id, call.type, call.function.name) == ("call_0", "function", "get_weather")
    assert call.function.arguments == ARGS
    [first] = received(router_standin, word)
    assert [t["name"] for t in first["tools"]] == ["get_weather", "get_time"]
    assert "tool_choice" not in first or first["tool_choice"] == {"mode": "auto"}

    messages.append(message)  # the SDK's own object, as its docs show a tool loop
    messages.append({"role": "tool", "tool_call_id": call.id, "content": f"9C {word}-result"})
    answer, finish = _chat_turn(client, messages, stream=stream, tools=[WEATHER, TIME])
    assert (answer.content, finish) == ("".join(CANNED), "stop")
    [second] = received(router_standin, f"{word}-result")
    assert second["messages"][1:] == weather_call_and_result(f"9C {word}-result")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_chat_parallel_tool_calls(client: openai.OpenAI, stream: bool) -> None:
    messages: Any = user(f"{tag()} [[parallel_tool_calls]]")
    message, finish = _chat_turn(client, messages, stream=stream, tools=[WEATHER])
    assert finish == "tool_calls"
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("call_0", "get_weather", ARGS),
        ("call_1", "get_weather", ARGS),
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        pytest.param("required", {"mode": "required"}, id="required"),
        pytest.param(
            {"type": "function", "function": {"name": "get_time"}},
            {"mode": "named", "name": "get_time"},
            id="named",
        ),
        pytest.param("none", {"mode": "none"}, id="none"),
    ],
)
def test_chat_tool_choice_reaches_the_router(
    client: openai.OpenAI, router_standin: RouterStandIn, choice: Any, expected: dict[str, Any]
) -> None:
    word = tag()
    client.chat.completions.create(
        model="m",
        messages=user(word),
        tools=[WEATHER, TIME],
        tool_choice=choice,
        parallel_tool_calls=False,
    )
    [body] = received(router_standin, word)
    assert body["tool_choice"] == expected
    assert body["parallel_tool_calls"] is False


def test_chat_structured_output_image_and_reasoning(
    client: openai.OpenAI, router_standin: RouterStandIn
) -> None:
    word = tag()
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
    }
    completion = client.chat.completions.create(
        model="m",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"{word} [[reasoning]]"},
                    {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                ],
            }
        ],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "reply", "schema": schema, "strict": True},
        },
        reasoning_effort="low",
    )
    message = completion.choices[0].message
    assert message.content == "".join(CANNED)
    assert (message.model_extra or {})["reasoning_content"] == "".join(REASONING)
    [body] = received(router_standin, word)
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": f"{word} [[reasoning]]"},
        {"type": "image", "url": PNG, "detail": "low"},
        {"type": "image", "url": "https://example.com/cat.png"},
    ]
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": schema,
        "name": "reply",
        "strict": True,
    }
    assert body["reasoning"] == {"enabled": True, "effort": "low"}


def test_chat_streams_reasoning_content(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="m", messages=user(f"{tag()} [[reasoning]]"), stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content", "") for d in deltas)
    assert reasoning == "".join(REASONING)
    assert "".join(d.content or "" for d in deltas) == "".join(CANNED)


CHAT_REFUSALS = [
    ({"tool_choice": "auto"}, "tool_choice", "invalid_value"),
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions", "unsupported_parameter"),
    ({"logit_bias": {"x": 1}}, "logit_bias", "invalid_value"),
    (
        {"tools": [{"type": "custom", "custom": {"name": "x"}}]},
        "tools[0].type",
        "unsupported_parameter",
    ),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice.function.name",
        "invalid_value",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
        "response_format.json_schema.schema",
        "missing_required_parameter",
    ),
    # keys are open, types are closed (docs/frontend.md, Forward compatibility)
    ({"tools": [{"type": "hologram"}]}, "tools[0].type", "unsupported_parameter"),
]


@pytest.mark.parametrize(
    ("extra", "param", "code"), CHAT_REFUSALS, ids=[r[1] for r in CHAT_REFUSALS]
)
def test_chat_agent_refusals_are_openai_errors(
    client: openai.OpenAI,
    router_standin: RouterStandIn,
    extra: dict[str, Any],
    param: str,
    code: str,
) -> None:
    word = tag()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=user(word), extra_body=extra)
    assert (info.value.status_code, info.value.param, info.value.code) == (400, param, code)
    assert info.value.type == "invalid_request_error"
    assert isinstance(info.value.body, dict) and info.value.body["param"] == param
    assert received(router_standin, word) == []


RESPONSES_TOOLS: Any = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    APPLY_PATCH,
]


def _responses_turn(client: openai.OpenAI, *, stream: bool, **kwargs: Any) -> Any:
    """One Responses turn, streamed or not; the final ``Response`` as the SDK parsed it."""
    if not stream:
        return client.responses.create(model="m", **kwargs)
    events = list(client.responses.create(model="m", stream=True, **kwargs))
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(numbers)))
    assert events[-1].type == "response.completed"
    return untyped(events[-1]).response


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_responses_tool_loop(
    client: openai.OpenAI, router_standin: RouterStandIn, stream: bool
) -> None:
    word = tag()
    first_input: list[Any] = [{"role": "user", "content": f"{word} [[reasoning]] [[tool_call]]"}]
    response = _responses_turn(client, stream=stream, input=first_input, tools=RESPONSES_TOOLS)
    reasoning, call = response.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "".join(REASONING)
    assert call.type == "function_call"
    assert (call.call_id, call.name, call.arguments, call.status) == (
        "call_0",
        "get_weather",
        ARGS,
        "completed",
    )
    assert response.tools[1].type == "custom"

    second_input = [
        *first_input,
        *(item.model_dump(exclude_none=True) for item in response.output),
        {"type": "function_call_output", "call_id": call.call_id, "output": f"9C {word}-out"},
    ]
    final = _responses_turn(client, stream=stream, input=second_input, tools=RESPONSES_TOOLS)
    assert final.output_text == "".join(CANNED)
    [body] = received(router_standin, f"{word}-out")
    assert body["messages"][1:] == weather_call_and_result(
        f"9C {word}-out", reasoning={"text": "".join(REASONING), "encrypted": False}
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_responses_custom_tool_call(client: openai.OpenAI, stream: bool) -> None:
    tools = [APPLY_PATCH, RESPONSES_TOOLS[0]]
    response = _responses_turn(client, stream=stream, input=f"{tag()} [[custom_tool]]", tools=tools)
    [call] = response.output
    assert call.type == "custom_tool_call"
    assert (call.call_id, call.name, call.input) == ("call_0", "apply_patch", "".join(CUSTOM_INPUT))


def test_responses_stream_events_for_parallel_calls(frontend: Any) -> None:
    body = {
        "model": "m",
        "stream": True,
        "input": f"{tag()} [[parallel_tool_calls]]",
        "tools": RESPONSES_TOOLS,
        "parallel_tool_calls": True,
    }
    frames = parse_sse(_post_raw(frontend.base_url + "/v1/responses", body))
    names = [name for name, _ in frames]
    call_events = [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert names == [
        "response.created",
        "response.in_progress",
        *call_events,
        *call_events,
        "response.completed",
    ]
    final = json.loads(frames[-1][1])["response"]
    assert [(i["call_id"], i["arguments"]) for i in final["output"]] == [
        ("call_0", ARGS),
        ("call_1", ARGS),
    ]


def test_codex_shaped_request_is_served_and_converted_exactly(
    frontend: Any, router_standin: RouterStandIn
) -> None:
    body = codex_body()
    word = tag()
    body["input"][-1]["content"][0]["text"] += f" {word}"
    client = openai.OpenAI(
        base_url=f"{frontend.base_url}/v1",
        api_key="unused",
        max_retries=0,
        default_headers={"session_id": "019a2b3c-conversation", "x-session-id": "019a2b3c"},
    )
    extra = {"client_metadata": body.pop("client_metadata")}  # Codex sends it; the SDK has no kwarg
    events = list(client.responses.create(**body, extra_body=extra))
    assert events[-1].type == "response.completed"
    final = untyped(events[-1]).response
    assert final.output_text == "".join(CANNED) and final.store is False
    assert final.text.verbosity == "low" and final.reasoning.summary == "auto"
    [got] = received(router_standin, word)
    request = PreprocessedRequest.model_validate(got)
    expected = [*CODEX_MESSAGES]
    expected[-1] = ChatMessage(role="user", content=f"now run the tests {word}")
    assert request.messages == expected
    assert request.tools == CODEX_TOOLS
    assert request.tool_choice == ToolChoice(mode="auto")
    assert request.parallel_tool_calls is False
    assert request.reasoning == ReasoningControl(enabled=True, effort="medium")
    assert request.response_format is None and request.kv_hints is None
    assert request.session_id == "019a2b3c"
    assert "kv_hints" not in got  # Codex sends no prompt_cache_options: no hint


def test_responses_structured_output_and_image(
    client: openai.OpenAI, router_standin: RouterStandIn
) -> None:
    word = tag()
    client.responses.create(
        model="m",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": word},
                    {
                        "type": "input_image",
                        "image_url": "https://example.com/cat.png",
                        "detail": "auto",
                    },
                ],
            }
        ],
        text={"format": {"type": "json_schema", "name": "reply", "schema": {"type": "object"}}},
        tools=RESPONSES_TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
    )
    [body] = received(router_standin, word)
    assert body["messages"][0]["content"][1] == {
        "type": "image",
        "url": "https://example.com/cat.png",
        "detail": "auto",
    }
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"type": "object"},
        "name": "reply",
    }
    assert body["tool_choice"] == {"mode": "named", "name": "get_weather"}


RESPONSES_REFUSALS = [
    (
        {"input": [{"type": "item_reference", "id": "msg_1"}]},
        "input[0].type",
        "unsupported_parameter",
    ),
    (
        {"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]},
        "tools[0].type",
        "unsupported_parameter",
    ),
    ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
    ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
    (
        {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
        "input[0].call_id",
        "invalid_value",
    ),
    (
        {"text": {"format": {"type": "json_schema", "name": "a"}}},
        "text.format.schema",
        "missing_required_parameter",
    ),
    ({"reasoning": {"effort": "huge"}}, "reasoning.effort", "invalid_value"),
    ({"tools": [{"type": "hologram"}]}, "tools[0].type", "unsupported_parameter"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("extra", "param", "code"), RESPONSES_REFUSALS, ids=[r[1] for r in RESPONSES_REFUSALS]
)
def test_responses_agent_refusals_are_openai_errors(
    client: openai.OpenAI,
    router_standin: RouterStandIn,
    extra: dict[str, Any],
    param: str,
    code: str,
    stream: bool,
) -> None:
    word = tag()
    body: dict[str, Any] = {"input": word, **extra}
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", stream=stream, extra_body=body)
    assert (info.value.status_code, info.value.param, info.value.code) == (400, param, code)
    assert received(router_standin, word) == []


def test_responses_stream_helper_accumulates_calls_and_text(client: openai.OpenAI) -> None:
    """The SDK's ``responses.stream`` helper rebuilds the response from the events alone."""
    with client.responses.stream(
        model="m", input=f"{tag()} [[reasoning]] [[tool_call]]", tools=RESPONSES_TOOLS
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == ARGS
    assert [item.type for item in final.output] == ["reasoning", "function_call"]
    with client.responses.stream(model="m", input=tag()) as stream:
        assert stream.get_final_response().output_text == "".join(CANNED)

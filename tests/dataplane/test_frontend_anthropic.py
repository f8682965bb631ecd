"""The frontend as a real process, driven by the official ``anthropic`` SDK, against the stand-in."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, cast

import anthropic
import pytest

from kvretention.dataplane.protocol import (
    ChatMessage,
    ImagePart,
    PreprocessedRequest,
    Reasoning,
    ReasoningControl,
    SamplingParams,
    ToolCall,
    ToolDefinition,
)
from support.router_standin import (
    CANNED,
    REASONING,
    USAGE,
    RouterStandIn,
    parse_sse,
    tag,
    untyped,
    user,
)
from support.weather_tool import CITY_SCHEMA

EPHEMERAL = {"type": "ephemeral"}
ALIAS = "claude-haiku-fast"
MARK = {"cache_control": EPHEMERAL}


@pytest.fixture(scope="module")
def frontend(router_standin: RouterStandIn, kvretention_process: Any) -> Any:
    args = ["frontend", "--router-url", router_standin.base_url, "--model", "claude-test"]
    args += ["--model-alias", f"{ALIAS}=claude-test"]
    return kvretention_process([*args, "--upstream-timeout", "1"])


@pytest.fixture(scope="module")
def client(frontend: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=15
    )


@pytest.fixture(scope="module")
def reject_frontend(router_standin: RouterStandIn, kvretention_process: Any) -> Any:
    """A fleet with ``spec.hints.breakpoints: Reject``: the v1 contract, exactly."""
    args = ["frontend", "--router-url", router_standin.base_url, "--model", "claude-test"]
    return kvretention_process([*args, "--breakpoints", "reject", "--upstream-timeout", "1"])


@pytest.fixture(scope="module")
def clients(client: anthropic.Anthropic, reject_frontend: Any) -> dict[str, anthropic.Anthropic]:
    """One client per breakpoint mode."""
    reject = anthropic.Anthropic(
        base_url=reject_frontend.base_url, api_key="unused", max_retries=0, timeout=15
    )
    return {"prefix": client, "reject": reject}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("cache_control", "ttl"),
    [
        pytest.param(None, None, id="unhinted"),
        pytest.param(EPHEMERAL, 300, id="ephemeral_default"),
        pytest.param({"type": "ephemeral", "ttl": "5m"}, 300, id="ttl_5m"),
        pytest.param({"type": "ephemeral", "ttl": "1h"}, 3600, id="ttl_1h"),
    ],
)
def test_messages_forward_hint_exactly_when_asked(
    client: anthropic.Anthropic,
    router_standin: RouterStandIn,
    cache_control: dict[str, Any] | None,
    ttl: int | None,
    stream: bool,
) -> None:
    word = tag()
    kwargs: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": word}]}],
    }
    if cache_control is not None:
        kwargs["cache_control"] = cache_control
    if stream:
        with client.messages.stream(**kwargs) as events:
            text = "".join(events.text_stream)
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
        text = "".join(b.text for b in message.content if b.type == "text")
    assert text == "".join(CANNED)
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 4
    [body] = router_standin.bodies_for(word)
    expected = None if ttl is None else {"retain_full_prompt": {"ttl_seconds": ttl}}
    assert body.get("kv_hints") == expected
    assert ("kv_hints" in body) == (ttl is not None)
    assert "cache_control" not in json.dumps(body)
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    assert body["sampling"]["max_new_tokens"] == 64


def test_messages_map_sampling_and_session(frontend: Any, router_standin: RouterStandIn) -> None:
    word = tag()
    client = anthropic.Anthropic(
        base_url=frontend.base_url,
        api_key="unused",
        max_retries=0,
        default_headers={"x-session-id": "claude-sess"},
    )
    message = client.messages.create(
        model="claude-test",
        max_tokens=2,
        stop_sequences=["\n\nHuman:"],
        messages=user(word),
        # this SDK release no longer types the sampling knobs; the Messages API still takes them
        extra_body={"temperature": 0.2, "top_p": 0.8, "top_k": 20},
    )
    assert message.stop_reason == "max_tokens"
    [body] = router_standin.bodies_for(word)
    assert body["session_id"] == "claude-sess"
    assert body["sampling"] == {
        "max_new_tokens": 2,
        "temperature": 0.2,
        "top_p": 0.8,
        "top_k": 20,
        "stop": ["\n\nHuman:"],
    }


def split_block(word: str, fields: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A table row's ``fields`` as the user's content (a text part of ``word``, then the row's
    ``messages_block`` if it has one) and a copy of the other fields, for the request's top level."""
    fields = dict(fields)
    content: list[dict[str, Any]] = [{"type": "text", "text": word}]
    if "messages_block" in fields:
        content.append(fields.pop("messages_block"))
    return content, fields


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        pytest.param(
            {"system": [{"type": "text", "text": "sys", **MARK}]},
            "system.0.cache_control",
            id="system_block",
        ),
        pytest.param(
            {
                "messages_block": {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "d"},
                    **MARK,
                }
            },
            "messages.0.content.1.cache_control",
            id="message_document_block",
        ),
        pytest.param(
            {
                "tools": [
                    {"name": "t", "input_schema": {"type": "object"}, **MARK},
                ]
            },
            "tools.0.cache_control",
            id="tool_definition",
        ),
        pytest.param(
            {"messages_block": {"type": "text", "text": "x", **MARK}},
            "messages.0.content.1.cache_control",
            id="message_text_block",
        ),
        pytest.param(
            {
                "messages_block": {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                    **MARK,
                }
            },
            "messages.0.content.1.cache_control",
            id="message_image_block",
        ),
        pytest.param(
            {"cache_control": {"type": "ephemeral", "ttl": "2h"}},
            "cache_control.ttl",
            id="top_level_bad_ttl",
        ),
        pytest.param(
            {"system": [{"type": "text", "text": "sys", "cache_control": {"type": "persistent"}}]},
            "system.0.cache_control.type",
            id="block_bad_type",
        ),
    ],
)
@pytest.mark.parametrize("top_level", [False, True], ids=["alone", "with_top_level"])
@pytest.mark.parametrize("mode", ["prefix", "reject"])
def test_messages_block_breakpoints_per_mode(
    clients: dict[str, anthropic.Anthropic],
    router_standin: RouterStandIn,
    fields: dict[str, Any],
    param: str,
    top_level: bool,
    mode: str,
    stream: bool,
) -> None:
    """``Reject`` refuses every block-level breakpoint naming the block (the v1 table);
    ``Prefix`` forwards one breakpoint on the element made from that block. A malformed control
    is refused in both modes, and nothing refused reaches the router."""
    word = tag()
    content, fields = split_block(word, fields)
    if top_level and "cache_control" not in fields:
        fields["cache_control"] = EPHEMERAL

    def send() -> object:
        return clients[mode].messages.create(
            model="claude-test",
            max_tokens=16,
            messages=untyped([{"role": "user", "content": content}]),
            stream=stream,
            **fields,
        )

    malformed = param.endswith((".ttl", ".type"))
    if mode == "prefix" and not malformed:
        send()
        [body] = router_standin.bodies_for(word)
        expected: dict[str, Any] = {"retain_prefixes": {"breakpoints": 1}}
        if top_level:
            expected["retain_full_prompt"] = {"ttl_seconds": 300}
        assert body["kv_hints"] == expected
        assert json.dumps(body).count('"retain_ttl": 300') == 1
        return
    if mode == "reject":  # v1 names the block before looking inside its control
        param = param.removesuffix(".type")
    with pytest.raises(anthropic.BadRequestError) as info:
        send()
    assert info.value.status_code == 400
    assert info.value.response.headers["content-type"].startswith("application/json")
    body = info.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(f"{param}: ")
    assert router_standin.bodies_for(word) == []


def test_messages_unknown_model_is_404(
    client: anthropic.Anthropic, router_standin: RouterStandIn
) -> None:
    word = tag()
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="claude-nope", max_tokens=8, messages=user(word))
    assert isinstance(info.value.body, dict)
    assert info.value.body["error"]["type"] == "not_found_error"
    assert router_standin.bodies_for(word) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_messages_kv_hints_unsupported_before_stream(
    client: anthropic.Anthropic, router_standin: RouterStandIn, stream: bool
) -> None:
    word = tag()
    with pytest.raises(anthropic.APIStatusError) as info:
        client.messages.create(
            model="claude-test",
            max_tokens=8,
            messages=user(f"{word} [[kv_unsupported]]"),
            cache_control=untyped(EPHEMERAL),
            stream=stream,
        )
    assert info.value.status_code == 501
    assert isinstance(info.value.body, dict)
    assert "kv_hints" in info.value.body["error"]["message"]
    assert "cache_control" in info.value.body["error"]["message"]
    [body] = router_standin.bodies_for(word)
    assert body["kv_hints"] == {"retain_full_prompt": {"ttl_seconds": 300}}


def test_messages_kv_hints_unsupported_mid_stream(client: anthropic.Anthropic) -> None:
    texts: list[str] = []
    with (
        pytest.raises(anthropic.APIStatusError) as info,
        client.messages.stream(
            model="claude-test",
            max_tokens=8,
            messages=user(f"{tag()} [[kv_unsupported_midstream]]"),
            cache_control=untyped(EPHEMERAL),
        ) as events,
    ):
        texts.extend(events.text_stream)
    assert texts == [CANNED[0]]
    assert isinstance(info.value.body, dict)
    assert info.value.body["error"]["type"] == "api_error"
    assert "kv_hints" in info.value.body["error"]["message"]


def test_messages_sse_is_well_formed(frontend: Any) -> None:
    body = {
        "model": "claude-test",
        "max_tokens": 16,
        "stream": True,
        "cache_control": EPHEMERAL,
        "messages": user(tag()),
    }
    request = urllib.request.Request(
        frontend.base_url + "/v1/messages",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=15) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        frames = parse_sse(resp.read())
    events = [(name, json.loads(data)) for name, data in frames]
    assert all(name == data["type"] for name, data in events)
    names = [name for name, _ in events]
    deltas = len(CANNED)
    assert names == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["content"] == []
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == "".join(CANNED)


# -- tools, thinking, images, count_tokens, aliases (issue 10) -----------------------------------

WEATHER: Any = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": CITY_SCHEMA,
}
PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
PNG_SOURCE = {"type": "base64", "media_type": "image/png", "data": PNG_B64}
PNG_URL = f"data:image/png;base64,{PNG_B64}"


def expected_wire(**fields: Any) -> dict[str, Any]:
    """What the router must receive, serialized by the protocol itself (request id aside)."""
    request = PreprocessedRequest(request_id="x", model="claude-test", **fields)
    wire: dict[str, Any] = json.loads(request.to_json_bytes())
    del wire["request_id"]
    return wire


def received(router_standin: RouterStandIn, word: str) -> dict[str, Any]:
    [body] = router_standin.bodies_for(word)
    body = dict(body)
    del body["request_id"]
    return body


def _final(client: anthropic.Anthropic, stream: bool, **kwargs: Any) -> Any:
    if stream:
        with client.messages.stream(**kwargs) as events:
            return events.get_final_message()
    return client.messages.create(**kwargs)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_tool_loop_call_result_answer(
    client: anthropic.Anthropic, router_standin: RouterStandIn, stream: bool
) -> None:
    first_word, second_word = tag(), tag()
    question = {"role": "user", "content": f"{first_word} weather in Paris? [[tool_call]]"}
    first = _final(
        client, stream, model="claude-test", max_tokens=256, tools=[WEATHER], messages=[question]
    )
    assert first.stop_reason == "tool_use"
    [call] = [b for b in first.content if b.type == "tool_use"]
    assert call.name == "get_weather"
    assert call.input == {"city": "Paris"}
    assert call.id.startswith("toolu_")
    assert first.usage.input_tokens + first.usage.cache_read_input_tokens == 7

    history: Any = [
        question,
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "18C, sunny"},
                {"type": "text", "text": second_word},
            ],
        },
    ]
    second = _final(
        client, stream, model="claude-test", max_tokens=256, tools=[WEATHER], messages=history
    )
    assert second.stop_reason == "end_turn"
    assert [b.type for b in second.content] == ["text"]
    assert second.content[0].text == "".join(CANNED)

    tool = ToolDefinition(
        name="get_weather",
        description="Current weather in a city",
        parameters=WEATHER["input_schema"],
    )
    assert received(router_standin, second_word) == expected_wire(
        messages=[
            ChatMessage(role="user", content=question["content"]),
            ChatMessage(
                role="assistant",
                tool_calls=[
                    ToolCall(id=call.id, name="get_weather", arguments='{"city": "Paris"}')
                ],
            ),
            ChatMessage(
                role="tool", content="18C, sunny", tool_call_id=call.id, name="get_weather"
            ),
            ChatMessage(role="user", content=second_word),
        ],
        tools=[tool],
        sampling=SamplingParams(max_new_tokens=256),
        stream=stream,
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_parallel_tool_use(client: anthropic.Anthropic, stream: bool) -> None:
    message = _final(
        client,
        stream,
        model="claude-test",
        max_tokens=64,
        tools=[WEATHER],
        messages=user(f"{tag()} [[parallel_tool_calls]]"),
    )
    calls = [b for b in message.content if b.type == "tool_use"]
    assert [c.input for c in calls] == [{"city": "Paris"}, {"city": "Paris"}]
    assert len({c.id for c in calls}) == 2
    assert message.stop_reason == "tool_use"


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        pytest.param({"type": "any"}, {"mode": "required"}, True, id="any"),
        pytest.param(
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            {"mode": "named", "name": "get_weather"},
            False,
            id="tool_single",
        ),
        pytest.param({"type": "none"}, {"mode": "none"}, True, id="none"),
    ],
)
def test_tool_choice_reaches_the_router(
    client: anthropic.Anthropic,
    router_standin: RouterStandIn,
    choice: Any,
    expected: dict[str, Any],
    parallel: bool,
) -> None:
    word = tag()
    client.messages.create(
        model="claude-test", max_tokens=16, tools=[WEATHER], tool_choice=choice, messages=user(word)
    )
    body = received(router_standin, word)
    assert body["tool_choice"] == expected
    assert body.get("parallel_tool_calls", True) is parallel


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("thinking", "reasoning"),
    [
        pytest.param(
            {"type": "enabled", "budget_tokens": 1024},
            {"enabled": True, "budget_tokens": 1024},
            id="enabled",
        ),
        pytest.param({"type": "adaptive"}, {"enabled": True}, id="adaptive"),
        pytest.param({"type": "disabled"}, {"enabled": False}, id="disabled"),
    ],
)
def test_thinking_on_and_off(
    client: anthropic.Anthropic,
    router_standin: RouterStandIn,
    thinking: Any,
    reasoning: dict[str, Any],
    stream: bool,
) -> None:
    word = tag()
    marker = "" if reasoning["enabled"] is False else " [[reasoning]]"
    message = _final(
        client,
        stream,
        model="claude-test",
        max_tokens=2048,
        thinking=thinking,
        messages=user(word + marker),
    )
    assert received(router_standin, word)["reasoning"] == reasoning
    types = [b.type for b in message.content]
    if marker:
        assert types == ["thinking", "text"]
        assert message.content[0].thinking == "".join(REASONING)
        assert message.content[0].signature
    else:
        assert types == ["text"]
    assert message.content[-1].text == "".join(CANNED)


def test_signed_thinking_in_history_is_replayed(
    client: anthropic.Anthropic, router_standin: RouterStandIn
) -> None:
    word = tag()
    first = client.messages.create(
        model="claude-test",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=user("q [[reasoning]]"),
    )
    history: Any = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": word},
    ]
    client.messages.create(
        model="claude-test",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=history,
    )
    assistant = received(router_standin, word)["messages"][1]
    assert assistant == {
        "role": "assistant",
        "content": "".join(CANNED),
        "reasoning": {
            "text": "".join(REASONING),
            "signature": first.content[0].signature,
            "encrypted": False,
        },
    }


def test_an_image_reaches_the_router_as_a_data_url(
    client: anthropic.Anthropic, router_standin: RouterStandIn
) -> None:
    word = tag()
    client.messages.create(
        model="claude-test",
        max_tokens=16,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": cast(Any, PNG_SOURCE)},
                    {
                        "type": "image",
                        "source": {"type": "url", "url": "https://example.com/a.png"},
                    },
                    {"type": "text", "text": word},
                ],
            }
        ],
    )
    assert received(router_standin, word)["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "image", "url": PNG_URL},
                {"type": "image", "url": "https://example.com/a.png"},
                {"type": "text", "text": word},
            ],
        }
    ]


def test_structured_output(client: anthropic.Anthropic, router_standin: RouterStandIn) -> None:
    word = tag()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    client.messages.create(
        model="claude-test",
        max_tokens=16,
        output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "medium"},
        messages=user(word),
    )
    body = received(router_standin, word)
    assert body["response_format"] == {"type": "json_schema", "json_schema": schema}
    assert body["reasoning"] == {"enabled": True, "effort": "medium"}


def test_count_tokens(client: anthropic.Anthropic, router_standin: RouterStandIn) -> None:
    word = tag()
    counted = client.messages.count_tokens(
        model="claude-test",
        system="be brief",
        tools=[WEATHER],
        messages=user(word),
    )
    assert counted.input_tokens == USAGE["prompt_tokens"]
    body = received(router_standin, word)
    assert body["count_only"] is True
    assert body["tools"][0]["name"] == "get_weather"
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    assert "kv_hints" not in body


def test_count_tokens_refuses_like_messages(
    client: anthropic.Anthropic, router_standin: RouterStandIn
) -> None:
    word = tag()
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.count_tokens(
            model="claude-test",
            tools=[cast(Any, {"type": "web_search_20250305", "name": "web_search"})],
            messages=user(word),
        )
    assert info.value.response.headers["x-should-retry"] == "false"
    assert isinstance(info.value.body, dict)
    assert info.value.body["error"]["message"].startswith("tools.0.type: ")
    assert router_standin.bodies_for(word) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_model_alias_reaches_the_served_model(
    client: anthropic.Anthropic, router_standin: RouterStandIn, stream: bool
) -> None:
    word = tag()
    message = _final(client, stream, model=ALIAS, max_tokens=16, messages=user(word))
    assert message.model == ALIAS
    assert received(router_standin, word)["model"] == "claude-test"
    listed = [m.id for m in client.models.list()]
    assert listed == ["claude-test", ALIAS]


REFUSED_FIELDS = [
    pytest.param(
        {"output_format": {"type": "json_schema", "schema": {}}},
        "output_format",
        id="output_format",
    ),
    pytest.param({"container": "cntr_1"}, "container", id="container"),
    # keys are open, types are closed (docs/frontend.md, Forward compatibility)
    pytest.param(
        {"messages_block": {"type": "hologram", "data": "x"}},
        "messages.0.content.1.type",
        id="unknown_block_type",
    ),
    pytest.param(
        {"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools.0.type", id="bash_tool"
    ),
    pytest.param(
        {"tools": [{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]},
        "tools.0.type",
        id="text_editor_tool",
    ),
    pytest.param(
        {"thinking": {"type": "enabled", "budget_tokens": 4096}}, "max_tokens", id="budget_over_max"
    ),
    pytest.param(
        {
            "messages_block": {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"},
            }
        },
        "messages.0.content.1.source.type",
        id="pdf_document",
    ),
]


@pytest.mark.parametrize(("fields", "param"), REFUSED_FIELDS)
def test_refusals_are_400_naming_the_field_and_not_retried(
    client: anthropic.Anthropic, router_standin: RouterStandIn, fields: dict[str, Any], param: str
) -> None:
    word = tag()
    content, fields = split_block(word, fields)
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="claude-test",
            max_tokens=1024,
            messages=untyped([{"role": "user", "content": content}]),
            extra_body=fields,
        )
    assert info.value.response.headers["x-should-retry"] == "false"
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(f"{param}: ")
    assert router_standin.bodies_for(word) == []


# -- a Claude Code-shaped session --------------------------------------------------------------

CLAUDE_CODE_TOOL_NAMES = [
    "Task",
    "Bash",
    "Glob",
    "Grep",
    "ExitPlanMode",
    "Read",
    "Edit",
    "MultiEdit",
    "Write",
    "NotebookEdit",
    "WebFetch",
    "TodoWrite",
    "WebSearch",
    "BashOutput",
    "KillShell",
    "SlashCommand",
    "ListMcpResourcesTool",
]
BETAS = (
    "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14"
)


def claude_code_tool(name: str) -> dict[str, Any]:
    """Claude Code's tool shape: a long description and a draft-07 schema without extra keys."""
    return {
        "name": name,
        "description": f"{name}: a Claude Code tool. Usage notes follow.\n- one\n- two",
        "input_schema": {
            "type": "object",
            "properties": {
                "command" if name == "Bash" else "file_path": {"type": "string"},
                "timeout": {"type": "number", "description": "ms"},
            },
            "required": ["command" if name == "Bash" else "file_path"],
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        },
    }


def claude_code_body(word: str) -> dict[str, Any]:
    """What Claude Code sends mid-session (block-level cache_control left out: issue 11)."""
    reminder = "<system-reminder>\nAs you answer, use the context below.\n</system-reminder>"
    return {
        "model": "claude-test",
        "max_tokens": 32000,
        "stream": True,
        "temperature": 1,
        "metadata": {"user_id": "user_0f3a_account__session_6c1e"},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "system": [
            {
                "type": "text",
                "text": "x-anthropic-billing-header: cc_version=2.0.14; cc_entrypoint=cli",
            },
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {
                "type": "text",
                "text": "You are an interactive CLI tool that helps users with software engineering tasks.",
            },
        ],
        "tools": [claude_code_tool(n) for n in CLAUDE_CODE_TOOL_NAMES],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": reminder},
                    {"type": "text", "text": "why does the test fail?"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": "Read the test first.",
                        "signature": "EqQBCkYIBxgCKkB=",
                    },
                    {"type": "text", "text": "Let me look."},
                    {
                        "type": "tool_use",
                        "id": "toolu_01A",
                        "name": "Read",
                        "input": {"file_path": "/src/t.py"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01A",
                        "content": "     1\tassert 1 == 2",
                    }
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"},
                    {
                        "type": "tool_use",
                        "id": "toolu_01B",
                        "name": "Bash",
                        "input": {"command": "pytest -q", "timeout": 120000},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01B",
                        "is_error": True,
                        "content": [{"type": "text", "text": "Exit code 1\nFAILED t.py::test"}],
                    }
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_01C",
                        "name": "Read",
                        "input": {"file_path": "/tmp/shot.png"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01C",
                        "content": [{"type": "image", "source": PNG_SOURCE}],
                    },
                    {"type": "text", "text": reminder},
                    {"type": "text", "text": f"{word} fix it [[reasoning]] [[tool_call]]"},
                ],
            },
        ],
    }


def claude_code_expected(body: dict[str, Any]) -> dict[str, Any]:
    reminder = body["messages"][0]["content"][0]["text"]
    last = body["messages"][-1]["content"][-1]["text"]
    return expected_wire(
        messages=[
            # the billing header is normalised away (--normalize-clients, on by default)
            ChatMessage(
                role="system",
                content="\n".join(
                    b["text"]
                    for b in body["system"]
                    if not b["text"].startswith("x-anthropic-billing-header:")
                ),
            ),
            ChatMessage(role="user", content=f"{reminder}\nwhy does the test fail?"),
            ChatMessage(
                role="assistant",
                content="Let me look.",
                reasoning=Reasoning(text="Read the test first.", signature="EqQBCkYIBxgCKkB="),
                tool_calls=[
                    ToolCall(id="toolu_01A", name="Read", arguments='{"file_path": "/src/t.py"}')
                ],
            ),
            ChatMessage(
                role="tool", content="     1\tassert 1 == 2", tool_call_id="toolu_01A", name="Read"
            ),
            ChatMessage(
                role="assistant",
                reasoning=Reasoning(encrypted=True),
                tool_calls=[
                    ToolCall(
                        id="toolu_01B",
                        name="Bash",
                        arguments='{"command": "pytest -q", "timeout": 120000}',
                    )
                ],
            ),
            ChatMessage(
                role="tool",
                content="Exit code 1\nFAILED t.py::test",
                tool_call_id="toolu_01B",
                name="Bash",
                is_error=True,
            ),
            ChatMessage(
                role="assistant",
                tool_calls=[
                    ToolCall(
                        id="toolu_01C", name="Read", arguments='{"file_path": "/tmp/shot.png"}'
                    )
                ],
            ),
            ChatMessage(
                role="tool",
                content=[ImagePart(url=PNG_URL)],
                tool_call_id="toolu_01C",
                name="Read",
            ),
            ChatMessage(role="user", content=f"{reminder}\n{last}"),
        ],
        tools=[
            ToolDefinition(
                name=t["name"], description=t["description"], parameters=t["input_schema"]
            )
            for t in body["tools"]
        ],
        # Claude Code's session travels in metadata.user_id (the default --session-keys)
        session_id=body["metadata"]["user_id"],
        reasoning=ReasoningControl(enabled=True, budget_tokens=31999),
        sampling=SamplingParams(max_new_tokens=32000, temperature=1.0),
    )


def test_claude_code_request_is_accepted_and_converted_exactly(
    frontend: Any, router_standin: RouterStandIn
) -> None:
    word = tag()
    body = claude_code_body(word)
    client = anthropic.Anthropic(
        base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=15
    )
    # this SDK release no longer types temperature; Claude Code still sends it
    kwargs = {k: v for k, v in body.items() if k not in ("stream", "temperature")}
    with client.beta.messages.stream(
        **kwargs,
        extra_headers={"anthropic-beta": BETAS},
        extra_query={"beta": "true"},
        extra_body={"temperature": body["temperature"]},
    ) as events:
        message = events.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "tool_use"]
    assert message.content[1].name == "Task"  # the stand-in calls the first tool
    assert message.content[1].input == {"city": "Paris"}
    assert message.stop_reason == "tool_use"
    assert received(router_standin, word) == claude_code_expected(body)


def test_claude_code_request_with_block_cache_control_is_refused_in_reject_mode(
    reject_frontend: Any, router_standin: RouterStandIn
) -> None:
    """``breakpoints: Reject``: refused by the hint normalizer, naming the block (v1)."""
    frontend = reject_frontend
    word = tag()
    body = claude_code_body(word)
    body["system"][2]["cache_control"] = EPHEMERAL
    request = urllib.request.Request(
        frontend.base_url + "/v1/messages?beta=true",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "anthropic-beta": BETAS},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=15)
    assert info.value.code == 400
    assert info.value.headers["x-should-retry"] == "false"
    error = json.loads(info.value.read())
    assert error["error"]["message"].startswith("system.2.cache_control: ")
    assert router_standin.bodies_for(word) == []


def test_claude_code_breakpoints_become_markers_on_their_blocks(
    frontend: Any, router_standin: RouterStandIn
) -> None:
    """``breakpoints: Prefix``: Claude Code's system and newest-block breakpoints (a 1h one before
    a 5m one) each mark the neutral element made from their block, and the billing header is
    dropped without taking a marker with it."""
    word = tag()
    body = claude_code_body(word)
    body["system"][2]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    body["tools"][-1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    last = body["messages"][-1]["content"][-1]
    last["cache_control"] = EPHEMERAL
    request = urllib.request.Request(
        frontend.base_url + "/v1/messages?beta=true",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "anthropic-beta": BETAS},
    )
    with urllib.request.urlopen(request, timeout=15) as resp:
        assert resp.status == 200
        resp.read()
    [sent] = router_standin.bodies_for(word)
    assert sent["kv_hints"] == {"retain_prefixes": {"breakpoints": 3}}
    system = sent["messages"][0]
    assert system["role"] == "system"
    assert [p.get("retain_ttl") for p in system["content"]] == [None, 3600]
    assert "billing" not in json.dumps(system)
    assert sent["tools"][-1]["retain_ttl"] == 3600
    assert all("retain_ttl" not in t for t in sent["tools"][:-1])
    marked = [m for m in sent["messages"][1:] if "retain_ttl" in json.dumps(m)]
    assert len(marked) == 1 and marked[0] is sent["messages"][-1]
    assert "cache_control" not in json.dumps(sent)


def test_message_start_comes_with_the_first_chunk(frontend: Any) -> None:
    """``message_start`` is held until the router's first chunk, then the blocks follow in order."""
    body = {
        "model": "claude-test",
        "max_tokens": 2048,
        "stream": True,
        "thinking": {"type": "adaptive"},
        "tools": [WEATHER],
        "messages": user(f"{tag()} [[reasoning]] [[tool_call]]"),
    }
    request = urllib.request.Request(
        frontend.base_url + "/v1/messages",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=15) as resp:
        frames = parse_sse(resp.read())
    events = [json.loads(data) for _, data in frames]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "tool_use"]
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1]
    signature = [e for e in events if e.get("delta", {}).get("type") == "signature_delta"]
    assert len(signature) == 1 and signature[0]["index"] == 0
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert events[-2]["usage"]["input_tokens"] == USAGE["prompt_tokens"] - USAGE["cached_tokens"]
    assert events[-2]["usage"]["cache_read_input_tokens"] == USAGE["cached_tokens"]

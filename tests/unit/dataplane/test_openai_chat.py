"""Chat Completions parsing and formatting (pure): bodies in, neutral conversation out, and back.

Formatted objects are validated with the official SDK's own pydantic models, so a field the SDK
requires, or a literal it does not know, fails here before any client sees it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from kvretention.dataplane.frontend.common import Completion
from kvretention.dataplane.frontend.openai import ChatStream, chat_response, parse_chat
from kvretention.dataplane.frontend.openai.chat_request import FIELDS, NO_OP, REFUSED
from kvretention.dataplane.protocol import (
    GenerateChunk,
    ImagePart,
    Reasoning,
    ReasoningControl,
    ResponseFormat,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from support.client_refusals import assert_refused, refusal_cases

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
PNG = "data:image/png;base64,iVBORw0KGgo="
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_tool_loop_history_becomes_the_neutral_conversation() -> None:
    parsed = parse_chat(
        body(
            messages=[
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "need a tool",
                    "tool_calls": [CALL],
                },
                {
                    "role": "tool",
                    "tool_call_id": "call_1",
                    "content": [{"type": "text", "text": "9C"}],
                },
                {"role": "assistant", "content": "It is 9C."},
                {"role": "user", "content": "thanks"},
            ],
            tools=[WEATHER, TIME],
            tool_choice="auto",
            parallel_tool_calls=False,
        )
    )
    dumped = [m.model_dump(mode="json") for m in parsed.messages]
    assert dumped == [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris"}',
                    "kind": "function",
                }
            ],
            "reasoning": {"text": "need a tool", "signature": None, "encrypted": False},
        },
        {"role": "tool", "content": "9C", "tool_call_id": "call_1", "name": "get_weather"},
        {"role": "assistant", "content": "It is 9C."},
        {"role": "user", "content": "thanks"},
    ]
    assert parsed.tools == [
        ToolDefinition(
            name="get_weather",
            description="Weather for a city",
            parameters=WEATHER["function"]["parameters"],  # type: ignore[index]
            strict=True,
        ),
        ToolDefinition(name="get_time", parameters={"type": "object"}),
    ]
    assert parsed.tool_choice == ToolChoice(mode="auto")
    assert parsed.parallel_tool_calls is False


@pytest.mark.parametrize(
    ("choice", "expected", "names"),
    [
        pytest.param("none", ToolChoice(mode="none"), ["get_weather", "get_time"], id="none"),
        pytest.param(
            "required", ToolChoice(mode="required"), ["get_weather", "get_time"], id="required"
        ),
        pytest.param(
            {"type": "function", "function": {"name": "get_time"}},
            ToolChoice(mode="named", name="get_time"),
            ["get_weather", "get_time"],
            id="named",
        ),
        pytest.param(
            {
                "type": "allowed_tools",
                "allowed_tools": {
                    "mode": "required",
                    "tools": [{"type": "function", "function": {"name": "get_time"}}],
                },
            },
            ToolChoice(mode="required"),
            ["get_time"],
            id="allowed_tools",
        ),
    ],
)
def test_tool_choice(choice: Any, expected: ToolChoice, names: list[str]) -> None:
    parsed = parse_chat(body(tools=[WEATHER, TIME], tool_choice=choice))
    assert parsed.tool_choice == expected
    assert [t.name for t in parsed.tools] == names


def test_image_parts_structured_output_reasoning_and_logit_bias() -> None:
    parsed = parse_chat(
        body(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                    ],
                }
            ],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
            },
            reasoning_effort="xhigh",
            logit_bias={"42": -100, "7": 5},
        )
    )
    assert parsed.messages[0].content == [
        TextPart(text="what is this?"),
        ImagePart(url=PNG, detail="low"),
        ImagePart(url="https://example.com/a.png"),
    ]
    assert parsed.response_format == ResponseFormat(
        type="json_schema", json_schema={"type": "object"}, name="answer", strict=True
    )
    assert parsed.reasoning == ReasoningControl(enabled=True, effort="high")
    assert parsed.sampling.logit_bias == {"42": -100.0, "7": 5.0}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, ResponseFormat(type="json_object")),
    ],
)
def test_response_format_text_and_json_object(extra: dict[str, Any], expected: Any) -> None:
    assert parse_chat(body(**extra)).response_format == expected


@pytest.mark.parametrize(
    ("effort", "expected"),
    [
        ("none", ReasoningControl(enabled=False)),
        ("minimal", ReasoningControl(effort="minimal")),
        ("medium", ReasoningControl(effort="medium")),
        (None, None),
    ],
)
def test_reasoning_effort(effort: str | None, expected: ReasoningControl | None) -> None:
    assert parse_chat(body(reasoning_effort=effort)).reasoning == expected


@pytest.mark.parametrize("key", sorted(NO_OP))
def test_documented_no_ops_are_accepted(key: str) -> None:
    values = {"metadata": {"k": "v"}, "store": True, "verbosity": "low", "modalities": ["text"]}
    value: Any = values.get(key, "x")
    parsed = parse_chat(body(**{key: value}))
    assert parsed.tools == [] and parsed.response_format is None


def test_every_refused_field_is_known() -> None:
    assert set(REFUSED) <= FIELDS


REFUSALS = [
    # (extra body, param, code)
    ({"functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
    ({"function_call": "auto"}, "function_call", "unsupported_parameter"),
    ({"audio": {"voice": "x"}}, "audio", "unsupported_parameter"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction", "unsupported_parameter"),
    (
        {"web_search_options": {"search_context_size": "low"}},
        "web_search_options",
        "unsupported_parameter",
    ),
    ({"web_search_options": {}}, "web_search_options", "unsupported_parameter"),
    ({"top_logprobs": 2}, "top_logprobs", "unsupported_parameter"),
    ({"logprobs": True}, "logprobs", "unsupported_parameter"),
    ({"n": 2}, "n", "unsupported_parameter"),
    ({"modalities": ["text", "audio"]}, "modalities", "unsupported_parameter"),
    ({"tool_choice": "auto"}, "tool_choice", "invalid_value"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice.function.name",
        "invalid_value",
    ),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "custom", "custom": {"name": "x"}}},
        "tool_choice.type",
        "unsupported_parameter",
    ),
    (
        {"tools": [{"type": "custom", "custom": {"name": "x"}}]},
        "tools[0].type",
        "unsupported_parameter",
    ),
    ({"tools": [{"type": "function"}]}, "tools[0].function", "missing_required_parameter"),
    (
        {"tools": [{"type": "function", "function": {"name": "a b"}}]},
        "tools[0].function.name",
        "invalid_value",
    ),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "invalid_value"),
    (
        {
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
            ]
        },
        "tools[0].function.parameters",
        "invalid_value",
    ),
    ({"tools": {"type": "function"}}, "tools", "invalid_type"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "invalid_value"),
    (
        {"response_format": {"type": "json_schema"}},
        "response_format.json_schema",
        "missing_required_parameter",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
        "response_format.json_schema.schema",
        "missing_required_parameter",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
        "response_format.json_schema.name",
        "missing_required_parameter",
    ),
    ({"reasoning_effort": "extreme"}, "reasoning_effort", "invalid_value"),
    ({"logit_bias": {"abc": 1}}, "logit_bias", "invalid_value"),
    ({"logit_bias": {"1": 101}}, "logit_bias.1", "invalid_value"),
    ({"logit_bias": [1]}, "logit_bias", "invalid_type"),
    ({"verbosity": "loud"}, "verbosity", "invalid_value"),
    ({"metadata": {"k": 1}}, "metadata.k", "invalid_type"),
    (
        {"messages": [{"role": "function", "name": "f", "content": "x"}]},
        "messages[0].role",
        "unsupported_parameter",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "tool", "tool_call_id": "c9", "content": "r"},
            ]
        },
        "messages[1].tool_call_id",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "tool", "content": "r"}]},
        "messages[0].tool_call_id",
        "missing_required_parameter",
    ),
    (
        {"messages": [{"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}]},
        "messages[0].function_call",
        "unsupported_parameter",
    ),
    (
        {"messages": [{"role": "assistant", "tool_calls": [{**CALL, "type": "custom"}]}]},
        "messages[0].tool_calls[0].type",
        "unsupported_parameter",
    ),
    (
        {
            "messages": [
                {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}
            ]
        },
        "messages[0].tool_calls[0].function.arguments",
        "missing_required_parameter",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
        "messages[0].content[0].type",
        "unsupported_parameter",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]},
        "messages[0].content[0].type",
        "unsupported_parameter",
    ),
    (
        {
            "messages": [
                {"role": "system", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}
            ]
        },
        "messages[0].content[0].type",
        "unsupported_parameter",
    ),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "ftp://x/a.png"}}],
                }
            ]
        },
        "messages[0].content[0].image_url.url",
        "invalid_value",
    ),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:text/plain;base64,eA=="}}
                    ],
                }
            ]
        },
        "messages[0].content[0].image_url.url",
        "invalid_value",
    ),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": PNG, "detail": "original"}}
                    ],
                }
            ]
        },
        "messages[0].content[0].image_url.detail",
        "invalid_value",
    ),
]


@pytest.mark.parametrize(("extra", "param", "code"), refusal_cases(REFUSALS))
def test_refusals_name_the_field(extra: dict[str, Any], param: str, code: str) -> None:
    assert_refused(lambda: parse_chat(body(**extra)), param=param, code=code)


@pytest.mark.parametrize(
    "extra",
    [{"functions": []}, {"function_call": None}, {"audio": {}}, {"prediction": {}}, {"n": 1}],
)
def test_a_refused_field_that_asks_for_nothing_is_accepted(extra: dict[str, Any]) -> None:
    assert parse_chat(body(**extra)).messages


# -- formatting --------------------------------------------------------------------------------


def _parsed(**extra: Any) -> Any:
    return parse_chat(body(tools=[WEATHER], **extra))


def test_response_with_tool_calls_only_has_null_content() -> None:
    result = Completion(
        reasoning="hmm",
        tool_calls=[ToolCall(id="call_a", name="get_weather", arguments='{"city":"Paris"}')],
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=4, reasoning_tokens=2),
    )
    raw = chat_response(_parsed(), result, request_id="r1")
    completion = ChatCompletion.model_validate(raw)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert (call.id, call.type) == ("call_a", "function")
    assert call.function.name == "get_weather" and call.function.arguments == '{"city":"Paris"}'
    assert raw["choices"][0]["message"]["reasoning_content"] == "hmm"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 4
    assert completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == 2


def test_plain_response_has_no_tool_calls_key() -> None:
    raw = chat_response(_parsed(), Completion(text="hi", finish_reason="stop"), request_id="r")
    message = raw["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "hi", "refusal": None}
    assert raw["choices"][0]["finish_reason"] == "stop"


def _stream(chunks: list[GenerateChunk], **extra: Any) -> list[dict[str, Any]]:
    stream = ChatStream(_parsed(**extra), request_id="r9")
    raw = stream.start() + b"".join(stream.chunk(c) for c in chunks) + stream.finish()
    frames = [f.removeprefix(b"data: ") for f in raw.split(b"\n\n") if f]
    assert frames[-1] == b"[DONE]"
    out = [json.loads(f) for f in frames[:-1]]
    for frame in out:
        ChatCompletionChunk.model_validate(frame)
    return out


def test_stream_names_each_call_first_then_sends_argument_fragments() -> None:
    frames = _stream(
        [
            GenerateChunk(reasoning="think"),
            GenerateChunk(tool_calls=[ToolCallDelta(index=0, id="call_a", name="get_weather")]),
            GenerateChunk(tool_calls=[ToolCallDelta(index=0, arguments='{"city": ')]),
            GenerateChunk(tool_calls=[ToolCallDelta(index=0, arguments='"Paris"}')]),
            GenerateChunk(
                tool_calls=[ToolCallDelta(index=1, id="call_b", name="get_weather", arguments="{}")]
            ),
            GenerateChunk(finish_reason="tool_calls", usage=Usage(prompt_tokens=3)),
        ],
        stream_options={"include_usage": True},
    )
    deltas = [f["choices"][0]["delta"] for f in frames if f["choices"]]
    assert deltas[:5] == [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "think"},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
    ]
    assert deltas[5]["tool_calls"][0]["id"] == "call_b"
    assert frames[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert frames[-1]["choices"] == [] and frames[-1]["usage"]["prompt_tokens"] == 3


FINISH_REASONS = [
    # (the engine's finish reason, whether a call was parsed, the chat finish_reason)
    ("stop", False, "stop"),
    ("length", False, "length"),
    ("stop", True, "tool_calls"),
    ("tool_calls", True, "tool_calls"),
    (None, True, "tool_calls"),
    # a call cut off by max_tokens: its arguments are partial, and the client must know
    ("length", True, "length"),
]


@pytest.mark.parametrize(("reason", "called", "expected"), FINISH_REASONS)
def test_finish_reason_whole_and_streamed(reason: str | None, called: bool, expected: str) -> None:
    calls = [ToolCall(id="call_a", name="get_weather", arguments='{"city": "Pa')] if called else []
    result = Completion(tool_calls=calls, finish_reason=reason, usage=Usage(prompt_tokens=1))
    whole = chat_response(_parsed(), result, request_id="r1")
    assert whole["choices"][0]["finish_reason"] == expected
    delta = [ToolCallDelta(index=0, id="call_a", name="get_weather", arguments="{")]
    frames = _stream([GenerateChunk(tool_calls=delta if called else [], finish_reason=reason)])
    assert frames[-1]["choices"][0]["finish_reason"] == expected


def test_stream_text_finish_is_stop() -> None:
    frames = _stream([GenerateChunk(text="a"), GenerateChunk(text="b", finish_reason="stop")])
    assert [f["choices"][0]["delta"].get("content") for f in frames] == ["", "a", "b", None]
    assert frames[-1]["choices"][0]["finish_reason"] == "stop"


def test_reasoning_history_round_trips_as_reasoning() -> None:
    parsed = parse_chat(
        body(
            messages=[
                {"role": "assistant", "content": "x", "reasoning_content": "r"},
                {"role": "user", "content": "y"},
            ]
        )
    )
    assert parsed.messages[0].reasoning == Reasoning(text="r")


CHAT_IGNORED = [
    # (extra body, the ignored field's label): accepted, counted, and otherwise the same request
    ({"bogus": 1}, ("bogus",)),
    ({"stream_options": {"include_usage": True, "x": 1}}, ("stream_options.x",)),
    ({"messages": [{"role": "user", "content": "x", "extra": 1}]}, ("messages[*].extra",)),
    ({"messages": [{"role": "user", "content": "x", "name": "ann"}]}, ("messages[*].name",)),
    ({"store": False, "user": "u"}, ("store", "user")),
    (
        {"stream_options": {"include_usage": True, "include_obfuscation": False}},
        ("stream_options.include_obfuscation",),
    ),
    ({"metadata": {"session": "s"}}, ()),  # may hold the session key: read, not ignored
    ({"bogus": None}, ()),  # null carries nothing
]


@pytest.mark.parametrize(
    ("extra", "labels"), [pytest.param(e, lb, id=str(lb)) for e, lb in CHAT_IGNORED]
)
def test_unknown_keys_and_no_ops_are_ignored_and_counted(
    extra: dict[str, Any], labels: tuple[str, ...]
) -> None:
    parsed = parse_chat(body(**extra))
    assert parsed.ignored == labels


def test_whitespace_before_tool_calls_is_not_content() -> None:
    """Issue 20, item 7: the template's "\\n\\n" before a call is not the message's content."""
    call = ToolCall(id="call_a", name="get_weather", arguments="{}")
    result = Completion(text="\n\n", tool_calls=[call], finish_reason="tool_calls")
    raw = chat_response(_parsed(), result, request_id="r1")
    assert raw["choices"][0]["message"]["content"] is None


def test_function_tools_are_strict_only_when_they_say_so() -> None:
    """Chat Completions' rule (Responses tools are strict unless they opt out)."""
    parsed = parse_chat(body(tools=[WEATHER, TIME]))
    assert [t.strict for t in parsed.tools] == [True, None]

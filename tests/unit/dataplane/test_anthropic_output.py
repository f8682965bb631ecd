"""The parsed engine output -> Anthropic message objects and SSE events (pure formatters)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from kvretention.dataplane.frontend.anthropic import (
    MessagesStream,
    messages_response,
    parse_messages,
    tool_input,
    tool_use_id,
    usage_object,
)
from kvretention.dataplane.frontend.common import Completion, ParsedRequest
from kvretention.dataplane.protocol import GenerateChunk, ToolCall, ToolCallDelta, Usage

RID = "0123456789abcdef0123456789abcdef"
USAGE = Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=4)
TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}


def parsed(**extra: Any) -> ParsedRequest:
    base = {"model": "alias", "max_tokens": 2048, "messages": [{"role": "user", "content": "q"}]}
    return parse_messages({**base, **extra})


def chunks() -> list[GenerateChunk]:
    return [
        GenerateChunk(reasoning="Let me ", prompt_usage=Usage(prompt_tokens=10, cached_tokens=4)),
        GenerateChunk(reasoning="think."),
        GenerateChunk(text="Calling."),
        GenerateChunk(tool_calls=[ToolCallDelta(index=0, id="call_0", name="get_weather")]),
        GenerateChunk(tool_calls=[ToolCallDelta(index=0, arguments='{"city": ')]),
        GenerateChunk(tool_calls=[ToolCallDelta(index=0, arguments='"Paris"}')]),
        GenerateChunk(tool_calls=[ToolCallDelta(index=1, id="toolu_x", name="get_weather")]),
        GenerateChunk(tool_calls=[ToolCallDelta(index=1, arguments="{}")]),
        GenerateChunk(finish_reason="tool_calls", usage=USAGE),
    ]


def events(request: ParsedRequest, pieces: list[GenerateChunk]) -> list[dict[str, Any]]:
    stream = MessagesStream(request, request_id=RID)
    raw = stream.start() + b"".join(stream.chunk(c) for c in pieces) + stream.finish()
    out = []
    for frame in raw.decode().strip().split("\n\n"):
        name_line, data_line = frame.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {data['type']}"
        out.append(data)
    return out


def test_stream_has_one_block_per_run_and_real_prompt_usage() -> None:
    got = events(parsed(tools=[TOOL]), chunks())
    summary = [
        (e["type"], e.get("index"), (e.get("delta") or e.get("content_block") or {}).get("type"))
        for e in got
    ]
    assert summary == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("content_block_start", 3, "tool_use"),
        ("content_block_delta", 3, "input_json_delta"),
        ("content_block_stop", 3, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert got[0]["message"]["usage"] == {
        "input_tokens": 6,
        "output_tokens": 0,
        "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 0,
    }
    assert got[0]["message"]["model"] == "alias"
    assert got[9]["content_block"] == {
        "type": "tool_use",
        "id": f"toolu_{RID}00",
        "name": "get_weather",
        "input": {},
    }
    assert got[13]["content_block"]["id"] == "toolu_x"
    partial = "".join(e["delta"]["partial_json"] for e in got[10:12])
    assert json.loads(partial) == {"city": "Paris"}
    assert got[-2]["delta"]["stop_reason"] == "tool_use"
    assert got[-2]["usage"]["output_tokens"] == 5


def test_stream_without_output_still_has_a_text_block() -> None:
    got = events(parsed(), [GenerateChunk(finish_reason="stop", usage=USAGE)])
    assert [e["type"] for e in got] == [
        "message_start",
        "content_block_start",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    # the first chunk was also the last: its usage is the prompt's
    assert got[0]["message"]["usage"]["input_tokens"] == 6


def test_omitted_thinking_keeps_the_block_and_signature_without_text() -> None:
    request = parsed(thinking={"type": "adaptive", "display": "omitted"})
    got = events(request, [*chunks()[:3], GenerateChunk(finish_reason="stop")])
    deltas = [e["delta"]["type"] for e in got if e["type"] == "content_block_delta"]
    assert deltas == ["signature_delta", "text_delta"]
    result = Completion()
    for c in chunks():
        result.add(c)
    message = messages_response(request, result, request_id=RID)
    assert message["content"][0]["thinking"] == ""
    assert message["content"][0]["signature"]


def test_non_streaming_message_orders_thinking_text_tool_use() -> None:
    result = Completion()
    for c in chunks():
        result.add(c)
    message = messages_response(parsed(tools=[TOOL]), result, request_id=RID)
    assert [b["type"] for b in message["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert message["content"][0]["thinking"] == "Let me think."
    assert message["content"][2] == {
        "type": "tool_use",
        "id": f"toolu_{RID}00",
        "name": "get_weather",
        "input": {"city": "Paris"},
    }
    assert message["stop_reason"] == "tool_use"
    assert message["model"] == "alias"


@pytest.mark.parametrize(
    ("hinted", "retained", "expected"),
    [
        pytest.param(False, None, (6, 4, 0), id="unhinted"),
        pytest.param(True, None, (0, 4, 6), id="hinted-whole-prompt-by-default"),
        pytest.param(True, 10, (0, 4, 6), id="hinted-whole-prompt"),
        pytest.param(True, 8, (2, 4, 4), id="prefix-past-the-cache: written up to it"),
        pytest.param(True, 3, (6, 4, 0), id="prefix-inside-the-cache: nothing written"),
        pytest.param(True, 0, (6, 4, 0), id="every-breakpoint-dropped"),
        pytest.param(True, 12, (0, 4, 6), id="past-the-prompt-is-clamped"),
    ],
)
def test_usage_splits_the_prompt(
    hinted: bool, retained: int | None, expected: tuple[int, int, int]
) -> None:
    usage = msgspec.structs.replace(USAGE, retained_tokens=retained)
    got = usage_object(usage, hinted=hinted)
    assert (
        got["input_tokens"],
        got["cache_read_input_tokens"],
        got["cache_creation_input_tokens"],
    ) == expected
    assert sum(expected) == USAGE.prompt_tokens


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        pytest.param('{"a": 1}', {"a": 1}, id="object"),
        pytest.param("", {}, id="empty"),
        pytest.param("[1]", {"raw_arguments": "[1]"}, id="not_object"),
        pytest.param("{oops", {"raw_arguments": "{oops"}, id="broken"),
    ],
)
def test_tool_input(arguments: str, expected: dict[str, Any]) -> None:
    assert tool_input(arguments) == expected


def test_tool_use_ids_are_unique_per_request() -> None:
    assert tool_use_id("call_0", request_id="a" * 32, index=0) != tool_use_id(
        "call_0", request_id="b" * 32, index=0
    )
    assert tool_use_id("toolu_keep", request_id=RID, index=3) == "toolu_keep"


@pytest.mark.parametrize(
    ("text", "blocks"), [("\n\n", ["tool_use"]), ("Ok.", ["text", "tool_use"])]
)
def test_no_whitespace_only_text_block_before_tool_use(text: str, blocks: list[str]) -> None:
    """Issue 20, item 7: the template's "\\n\\n" before a call is not a text block of its own."""
    call = ToolCall(id="call_0", name="get_weather", arguments="{}")
    result = Completion(text=text, tool_calls=[call], finish_reason="tool_calls", usage=USAGE)
    message = messages_response(parsed(tools=[TOOL]), result, request_id=RID)
    assert [b["type"] for b in message["content"]] == blocks

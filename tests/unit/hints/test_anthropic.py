"""The v1 Anthropic rows of docs/contract.md, streaming and not: ``Reject`` mode reproduces them.

Every row runs through the v1 entry point (``normalize_messages``) and through
``hints_from_messages(..., breakpoints="reject")``; both must give the same outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import pytest

from kvretention.hints import (
    ClientErrorCode,
    KvHintEnvelope,
    hints_from_messages,
    normalize_messages,
)
from support.hint_outcomes import Err, assert_full_prompt, refusal
from support.messages_body import messages_body

Normalizer = Callable[[Mapping[str, Any]], KvHintEnvelope | None]


def _reject_mode(body: Mapping[str, Any]) -> KvHintEnvelope | None:
    return hints_from_messages(body, breakpoints="reject").envelope


V1_ENTRY_POINTS: list[Normalizer] = [normalize_messages, _reject_mode]


Outcome = int | None | Err
CC = "cache_control"
EPHEMERAL = {"type": "ephemeral"}
INVALID_TYPE = ClientErrorCode.INVALID_TYPE
INVALID_VALUE = ClientErrorCode.INVALID_VALUE
UNSUPPORTED = ClientErrorCode.UNSUPPORTED_PARAMETER
STREAM_VARIANTS: list[dict[str, Any]] = [{}, {"stream": False}, {"stream": True}]
STREAM_IDS = ["no_stream", "stream_false", "stream"]


def body(**fields: Any) -> dict[str, Any]:
    return messages_body(16, **fields)


def assert_outcome(request: dict[str, Any], expected: Outcome) -> None:
    for normalize in V1_ENTRY_POINTS:
        if isinstance(expected, Err):
            error = refusal(partial(normalize, request), expected)
            assert error.message.startswith(f"{expected.param}: ")
            assert error.status == 400
        else:
            assert_full_prompt(normalize(request), expected)


TOP_LEVEL_ROWS: list[tuple[str, dict[str, Any], Outcome]] = [
    ("no_cache_control", {}, None),
    ("cache_control_null", {CC: None}, None),
    ("ephemeral_default_5m", {CC: EPHEMERAL}, 300),
    ("ephemeral_5m", {CC: {"type": "ephemeral", "ttl": "5m"}}, 300),
    ("ephemeral_1h", {CC: {"type": "ephemeral", "ttl": "1h"}}, 3600),
    ("ttl_null_is_default", {CC: {"type": "ephemeral", "ttl": None}}, 300),
    ("ttl_unpublished", {CC: {"type": "ephemeral", "ttl": "30m"}}, Err(INVALID_VALUE, f"{CC}.ttl")),
    ("ttl_wrong_case", {CC: {"type": "ephemeral", "ttl": "1H"}}, Err(INVALID_VALUE, f"{CC}.ttl")),
    ("ttl_number", {CC: {"type": "ephemeral", "ttl": 3600}}, Err(INVALID_TYPE, f"{CC}.ttl")),
    ("type_wrong_case", {CC: {"type": "Ephemeral"}}, Err(INVALID_VALUE, f"{CC}.type")),
    ("type_unknown", {CC: {"type": "persistent"}}, Err(INVALID_VALUE, f"{CC}.type")),
    ("type_null", {CC: {"type": None}}, Err(INVALID_TYPE, f"{CC}.type")),
    (
        "type_missing",
        {CC: {"ttl": "1h"}},
        Err(ClientErrorCode.MISSING_REQUIRED_PARAMETER, f"{CC}.type"),
    ),
    (
        "unknown_subfield",
        {CC: {"type": "ephemeral", "scope": "global"}},
        Err(ClientErrorCode.UNKNOWN_PARAMETER, f"{CC}.scope"),
    ),
    ("cache_control_string", {CC: "ephemeral"}, Err(INVALID_TYPE, CC)),
    ("cache_control_array", {CC: [EPHEMERAL]}, Err(INVALID_TYPE, CC)),
    ("cache_control_boolean", {CC: True}, Err(INVALID_TYPE, CC)),
    ("system_string_with_top_level", {"system": "be brief", CC: EPHEMERAL}, 300),
    (
        "system_blocks_without_markers",
        {"system": [{"type": "text", "text": "be brief"}], CC: {"type": "ephemeral", "ttl": "1h"}},
        3600,
    ),
]


@pytest.mark.parametrize("stream", STREAM_VARIANTS, ids=STREAM_IDS)
@pytest.mark.parametrize(
    ("fields", "expected"), [pytest.param(f, e, id=name) for name, f, e in TOP_LEVEL_ROWS]
)
def test_top_level_rows(fields: dict[str, Any], expected: Outcome, stream: dict[str, Any]) -> None:
    assert_outcome(body(**fields, **stream), expected)


def _user(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


MARK = {CC: EPHEMERAL}
TEXT = {"type": "text", "text": "hello"}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
DOCUMENT = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}}
TOOL = {"name": "lookup", "description": "d", "input_schema": {"type": "object"}}
TOOL_USE = {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "x"}}

# (row id, fields, the block path that is refused)
BLOCK_ROWS: list[tuple[str, dict[str, Any], str]] = [
    ("system_text_block", {"system": [{**TEXT, **MARK}]}, "system.0"),
    ("second_system_block", {"system": [TEXT, {**TEXT, **MARK}]}, "system.1"),
    ("tool_definition", {"tools": [TOOL, {**TOOL, "name": "other", **MARK}]}, "tools.1"),
    ("message_text", {"messages": _user(TEXT, {**TEXT, **MARK})}, "messages.0.content.1"),
    ("message_image", {"messages": _user({**IMAGE, **MARK})}, "messages.0.content.0"),
    ("message_document", {"messages": _user({**DOCUMENT, **MARK})}, "messages.0.content.0"),
    (
        "message_tool_use",
        {"messages": [*_user(TEXT), {"role": "assistant", "content": [{**TOOL_USE, **MARK}]}]},
        "messages.1.content.0",
    ),
    (
        "message_tool_result",
        {"messages": _user({"type": "tool_result", "tool_use_id": "t1", "content": "ok", **MARK})},
        "messages.0.content.0",
    ),
    (
        "nested_in_tool_result",
        {
            "messages": _user(
                {"type": "tool_result", "tool_use_id": "t1", "content": [TEXT, {**TEXT, **MARK}]}
            )
        },
        "messages.0.content.0.content.1",
    ),
    (
        "message_thinking",
        {
            "messages": [
                *_user(TEXT),
                {
                    "role": "assistant",
                    "content": [{"type": "thinking", "thinking": "t", "signature": "s", **MARK}],
                },
            ]
        },
        "messages.1.content.0",
    ),
    (
        "document_content_source",
        {
            "messages": _user(
                {"type": "document", "source": {"type": "content", "content": [{**TEXT, **MARK}]}}
            )
        },
        "messages.0.content.0.source.content.0",
    ),
    (
        "unknown_future_block_type",
        {"messages": _user({"type": "future_block", **MARK})},
        "messages.0.content.0",
    ),
    (
        "on_the_message_itself",
        {"messages": [{"role": "user", "content": "hi", **MARK}]},
        "messages.0",
    ),
]


@pytest.mark.parametrize("stream", STREAM_VARIANTS, ids=STREAM_IDS)
@pytest.mark.parametrize(
    "top_level",
    [None, EPHEMERAL, {"type": "ephemeral", "ttl": "1h"}],
    ids=["no_top_level", "top_level_5m", "top_level_1h"],
)
@pytest.mark.parametrize(("fields", "path"), [pytest.param(f, p, id=n) for n, f, p in BLOCK_ROWS])
def test_block_level_cache_control_is_rejected(
    fields: dict[str, Any], path: str, top_level: dict[str, Any] | None, stream: dict[str, Any]
) -> None:
    top = {CC: top_level} if top_level is not None else {}
    assert_outcome(body(**fields, **top, **stream), Err(UNSUPPORTED, f"{path}.{CC}"))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({"system": [{**TEXT, CC: None}], CC: EPHEMERAL}, 300, id="null_block_marker"),
        pytest.param(
            {"tools": [{**TOOL, "input_schema": {"properties": {CC: {"type": "string"}}}}]},
            None,
            id="tool_schema_property_named_cache_control",
        ),
        pytest.param(
            {
                "messages": [
                    *_user(TEXT),
                    {"role": "assistant", "content": [{**TOOL_USE, "input": {CC: EPHEMERAL}}]},
                ],
                CC: EPHEMERAL,
            },
            300,
            id="tool_use_input_is_user_data",
        ),
        pytest.param(
            {"system": [{**TEXT, **MARK}], CC: {"type": "bogus"}},
            Err(INVALID_VALUE, f"{CC}.type"),
            id="top_level_error_reported_first",
        ),
    ],
)
def test_edge_rows(fields: dict[str, Any], expected: Outcome) -> None:
    assert_outcome(body(**fields), expected)

"""The v2 (``Prefix`` mode) Anthropic rows of docs/contract.md, streaming and not."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from test_anthropic import (
    CC,
    DOCUMENT,
    EPHEMERAL,
    IMAGE,
    MARK,
    STREAM_IDS,
    STREAM_VARIANTS,
    TEXT,
    TOOL,
    TOOL_USE,
    TOP_LEVEL_ROWS,
    _user,
    body,
)

from kvretention.hints import (
    CacheHints,
    ClientErrorCode,
    build_envelope,
    hints_from_messages,
)
from support.hint_outcomes import Err, Ok, refusal

Outcome = Ok | Err | None
INVALID_TYPE = ClientErrorCode.INVALID_TYPE
INVALID_VALUE = ClientErrorCode.INVALID_VALUE
EXTRA = ClientErrorCode.UNKNOWN_PARAMETER
H1 = {"type": "ephemeral", "ttl": "1h"}
M5 = {"type": "ephemeral", "ttl": "5m"}


def run(request: dict[str, Any]) -> CacheHints:
    return hints_from_messages(request, breakpoints="prefix")


def assert_outcome(request: dict[str, Any], expected: Outcome) -> None:
    if isinstance(expected, Err):
        error = refusal(partial(run, request), expected)
        assert error.message.startswith(f"{expected.param}: ")
        assert error.status == 400
        return
    hints = run(request)
    if expected is None:
        assert hints.envelope is None and hints.breakpoints == ()
        assert hints.client_controls is False
        return
    assert [(b.where, b.ttl_seconds) for b in hints.breakpoints] == list(expected.breakpoints)
    assert hints.envelope is not None and hints.envelope.to_wire() == expected.wire()
    assert hints.client_controls is True
    for b in hints.breakpoints:  # the provider parser's lookup
        assert hints.ttl_at(*b.path) == b.ttl_seconds


# The top level keeps v1's meaning; only unknown keys (Claude Code's ``scope``) are now ignored.
PREFIX_TOP_LEVEL = {"unknown_subfield": 300}


@pytest.mark.parametrize("stream", STREAM_VARIANTS, ids=STREAM_IDS)
@pytest.mark.parametrize(
    ("fields", "expected"),
    [pytest.param(f, PREFIX_TOP_LEVEL.get(name, e), id=name) for name, f, e in TOP_LEVEL_ROWS],
)
def test_top_level_rows(fields: dict[str, Any], expected: int | Err | None, stream: Any) -> None:
    outcome: Outcome = Ok(full=expected) if isinstance(expected, int) else expected
    assert_outcome(body(**fields, **stream), outcome)


def _blocks(n: int, control: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**TEXT, "text": f"b{i}", CC: control} for i in range(n)]


def _assistant(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [*_user(TEXT), {"role": "assistant", "content": list(blocks)}]


TOOL_RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}

# (row id, fields, outcome)
BLOCK_ROWS: list[tuple[str, dict[str, Any], Outcome]] = [
    ("system_text_block", {"system": [{**TEXT, **MARK}]}, Ok(breakpoints=(("system.0", 300),))),
    (
        "second_system_block_1h_with_scope_ignored",
        {"system": [TEXT, {**TEXT, CC: {**H1, "scope": "global", "future": 1}}]},
        Ok(breakpoints=(("system.1", 3600),)),
    ),
    ("tool_definition", {"tools": [TOOL, {**TOOL, **MARK}]}, Ok(breakpoints=(("tools.1", 300),))),
    (
        "message_text",
        {"messages": _user(TEXT, {**TEXT, **MARK})},
        Ok(breakpoints=(("messages.0.content.1", 300),)),
    ),
    (
        "message_image",
        {"messages": _user({**IMAGE, **MARK})},
        Ok(breakpoints=(("messages.0.content.0", 300),)),
    ),
    (
        "message_document",
        {"messages": _user({**DOCUMENT, **MARK})},
        Ok(breakpoints=(("messages.0.content.0", 300),)),
    ),
    (
        "message_tool_use",
        {"messages": _assistant({**TOOL_USE, **MARK})},
        Ok(breakpoints=(("messages.1.content.0", 300),)),
    ),
    (
        "message_tool_result",
        {"messages": _user({**TOOL_RESULT, **MARK})},
        Ok(breakpoints=(("messages.0.content.0", 300),)),
    ),
    (
        "nested_in_tool_result",
        {"messages": _user({**TOOL_RESULT, "content": [TEXT, {**TEXT, **MARK}]})},
        Ok(breakpoints=(("messages.0.content.0.content.1", 300),)),
    ),
    (
        "document_content_source",
        {
            "messages": _user(
                {"type": "document", "source": {"type": "content", "content": [{**TEXT, **MARK}]}}
            )
        },
        Ok(breakpoints=(("messages.0.content.0.source.content.0", 300),)),
    ),
    (
        "unknown_future_block_type",
        {"messages": _user({"type": "future_block", **MARK})},
        Ok(breakpoints=(("messages.0.content.0", 300),)),
    ),
    (
        "block_type_not_a_string",
        {"messages": _user({"type": ["text"], **MARK})},
        Ok(breakpoints=(("messages.0.content.0", 300),)),
    ),
    (
        "thinking_block_has_no_cache_control",
        {"messages": _assistant({"type": "thinking", "thinking": "t", "signature": "s", **MARK})},
        Err(EXTRA, "messages.1.content.0.cache_control"),
    ),
    (
        "redacted_thinking_block_has_no_cache_control",
        {"messages": _assistant({"type": "redacted_thinking", "data": "d", **MARK})},
        Err(EXTRA, "messages.1.content.0.cache_control"),
    ),
    (
        "message_object_has_no_cache_control",
        {"messages": [{"role": "user", "content": "hi", **MARK}]},
        Err(EXTRA, "messages.0.cache_control"),
    ),
    ("null_block_marker_is_absent", {"system": [{**TEXT, CC: None}]}, None),
    (
        "tool_schema_property_named_cache_control",
        {"tools": [{**TOOL, "input_schema": {"properties": {CC: {"type": "string"}}}}]},
        None,
    ),
    (
        "tool_use_input_is_user_data",
        {"messages": _assistant({**TOOL_USE, "input": {CC: EPHEMERAL}})},
        None,
    ),
    # malformed block-level controls: Anthropic's wording with the block's path
    (
        "block_control_string",
        {"system": [{**TEXT, CC: "ephemeral"}]},
        Err(INVALID_TYPE, "system.0.cache_control"),
    ),
    (
        "block_type_missing",
        {"system": [{**TEXT, CC: {"ttl": "1h"}}]},
        Err(ClientErrorCode.MISSING_REQUIRED_PARAMETER, "system.0.cache_control.type"),
    ),
    (
        "block_type_unknown",
        {"tools": [{**TOOL, CC: {"type": "persistent"}}]},
        Err(INVALID_VALUE, "tools.0.cache_control.type"),
    ),
    (
        "block_ttl_unpublished",
        {"messages": _user({**TEXT, CC: {"type": "ephemeral", "ttl": "30m"}})},
        Err(INVALID_VALUE, "messages.0.content.0.cache_control.ttl"),
    ),
    (
        "block_ttl_number",
        {"messages": _user({**TEXT, CC: {"type": "ephemeral", "ttl": 300}})},
        Err(INVALID_TYPE, "messages.0.content.0.cache_control.ttl"),
    ),
    (
        "block_ttl_null_is_default",
        {"system": [{**TEXT, CC: {"type": "ephemeral", "ttl": None}}]},
        Ok(breakpoints=(("system.0", 300),)),
    ),
    # at most 4 breakpoints, the automatic one included
    (
        "four_breakpoints",
        {"system": _blocks(4, EPHEMERAL)},
        Ok(breakpoints=tuple((f"system.{i}", 300) for i in range(4))),
    ),
    (
        "five_breakpoints",
        {"system": _blocks(5, EPHEMERAL)},
        Err(INVALID_VALUE, "system.4.cache_control"),
    ),
    (
        "four_blocks_and_the_automatic_one",
        {"system": _blocks(4, EPHEMERAL), CC: EPHEMERAL},
        Err(INVALID_VALUE, CC),
    ),
    (
        "automatic_on_an_already_marked_last_block_shares_its_slot",
        {"system": _blocks(3, EPHEMERAL), "messages": _user({**TEXT, **MARK}), CC: EPHEMERAL},
        Ok(
            full=300,
            breakpoints=(
                *((f"system.{i}", 300) for i in range(3)),
                ("messages.0.content.0", 300),
            ),
        ),
    ),
    (
        "automatic_ttl_differs_from_the_marked_last_block",
        {"messages": _user({**TEXT, CC: H1}), CC: M5},
        Err(INVALID_VALUE, f"{CC}.ttl"),
    ),
    # longer TTLs first, in the order tools -> system -> messages (nested before their block)
    (
        "1h_tools_then_5m_system",
        {"tools": [{**TOOL, CC: H1}], "system": [{**TEXT, **MARK}]},
        Ok(breakpoints=(("tools.0", 3600), ("system.0", 300))),
    ),
    (
        "5m_tools_then_1h_system",
        {"tools": [{**TOOL, **MARK}], "system": [{**TEXT, CC: H1}]},
        Err(INVALID_VALUE, "system.0.cache_control.ttl"),
    ),
    (
        "1h_5m_1h",
        {"system": [{**TEXT, CC: H1}, {**TEXT, CC: M5}], "messages": _user({**TEXT, CC: H1})},
        Err(INVALID_VALUE, "messages.0.content.0.cache_control.ttl"),
    ),
    (
        "nested_5m_before_its_1h_tool_result",
        {"messages": _user({**TOOL_RESULT, "content": [{**TEXT, **MARK}], CC: H1})},
        Err(INVALID_VALUE, "messages.0.content.0.cache_control.ttl"),
    ),
    (
        "automatic_1h_after_a_5m_block",
        {"system": [{**TEXT, **MARK}], CC: H1},
        Err(INVALID_VALUE, f"{CC}.ttl"),
    ),
    (
        "1h_block_then_automatic_5m",
        {"system": [{**TEXT, CC: H1}], CC: EPHEMERAL},
        Ok(full=300, breakpoints=(("system.0", 3600),)),
    ),
    (
        "claude_code_shape",
        {
            "system": [
                {**TEXT, "text": "x-anthropic-billing-header: cc_version=1; cch=2;"},
                {**TEXT, CC: {**H1, "scope": "global"}},
                {**TEXT, CC: H1},
            ],
            "messages": [
                *_user(TEXT),
                {"role": "assistant", "content": [TOOL_USE]},
                {"role": "user", "content": [{**TOOL_RESULT, CC: EPHEMERAL}]},
            ],
        },
        Ok(breakpoints=(("system.1", 3600), ("system.2", 3600), ("messages.2.content.0", 300))),
    ),
    (
        "top_level_error_reported_first",
        {"system": [{**TEXT, CC: "bad"}], CC: {"type": "bogus"}},
        Err(INVALID_VALUE, f"{CC}.type"),
    ),
]


@pytest.mark.parametrize("stream", STREAM_VARIANTS, ids=STREAM_IDS)
@pytest.mark.parametrize(
    ("fields", "expected"), [pytest.param(f, e, id=n) for n, f, e in BLOCK_ROWS]
)
def test_block_rows(fields: dict[str, Any], expected: Outcome, stream: dict[str, Any]) -> None:
    assert_outcome(body(**fields, **stream), expected)


def test_default_mode_is_prefix() -> None:
    request = body(system=[{**TEXT, **MARK}])
    assert hints_from_messages(request) == run(request)


def test_null_top_level_is_no_client_control_so_the_fleet_default_applies() -> None:
    envelope = build_envelope(run(body(**{CC: None})), default_ttl_seconds=600)
    assert envelope is not None
    assert envelope.to_wire() == {"retain_full_prompt": {"ttl_seconds": 600, "origin": "policy"}}


def test_a_client_control_is_never_replaced_by_the_fleet_default() -> None:
    envelope = build_envelope(run(body(system=[{**TEXT, **MARK}])), default_ttl_seconds=600)
    assert envelope is not None
    assert envelope.to_wire() == {"retain_prefixes": {"breakpoints": 1}}

"""The v2 (``Prefix`` mode) OpenAI rows of docs/contract.md, Chat Completions and Responses."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import pytest
from test_openai import (
    BREAKPOINT,
    CHAT_PARTS,
    OPTION_ROWS,
    PCO,
    RESPONSES_PARTS,
    STREAM_VARIANTS,
    chat_body,
    responses_body,
)

from kvretention.hints import (
    CacheHints,
    ClientErrorCode,
    build_envelope,
    hints_from_chat_completions,
    hints_from_responses,
)
from support.hint_outcomes import Err, Ok, refusal

STREAM_IDS = ["no_stream", "stream_false", "stream"]
INVALID_TYPE = ClientErrorCode.INVALID_TYPE
INVALID_VALUE = ClientErrorCode.INVALID_VALUE
UNKNOWN = ClientErrorCode.UNKNOWN_PARAMETER
MISSING = ClientErrorCode.MISSING_REQUIRED_PARAMETER
BP = "prompt_cache_breakpoint"


Outcome = Ok | Err | None
Hints = Callable[..., CacheHints]
API: dict[str, Hints] = {"chat": hints_from_chat_completions, "responses": hints_from_responses}


def assert_outcome(hints_from: Hints, request: Mapping[str, Any], expected: Outcome) -> None:
    if isinstance(expected, Err):
        error = refusal(partial(hints_from, request, breakpoints="prefix"), expected)
        assert expected.param in error.message
        return
    hints = hints_from(request, breakpoints="prefix")
    if expected is None:
        assert hints == CacheHints()
        return
    paths = [(_openai_path(b.path), b.ttl_seconds) for b in hints.breakpoints]
    assert paths == list(expected.breakpoints)
    assert (hints.envelope.to_wire() if hints.envelope else {}) == expected.wire()
    assert hints.client_controls is expected.controls


def _openai_path(path: tuple[str | int, ...]) -> str:
    out = str(path[0])
    for p in path[1:]:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return f"{out}.{BP}"  # the block's path, named as OpenAI names its marker


# Prefix mode changes two v1 rows: explicit mode is accepted (and retains nothing by itself).
EXPLICIT_NOTHING = Ok(controls=True)
PREFIX_OPTION_ROWS = {"mode_explicit": EXPLICIT_NOTHING, "explicit_30m": EXPLICIT_NOTHING}


def _v2(v1: int | Err | None) -> Outcome:
    return Ok(full=v1) if isinstance(v1, int) else v1


@pytest.mark.parametrize("stream", STREAM_VARIANTS, ids=STREAM_IDS)
@pytest.mark.parametrize("api", API)
@pytest.mark.parametrize(
    ("fields", "chat", "responses"),
    [
        pytest.param(
            f,
            PREFIX_OPTION_ROWS.get(name, _v2(c)),
            PREFIX_OPTION_ROWS.get(name, _v2(r)),
            id=name,
        )
        for name, f, c, r in OPTION_ROWS
    ],
)
def test_option_rows(
    api: str, fields: dict[str, Any], chat: Outcome, responses: Outcome, stream: dict[str, Any]
) -> None:
    build = chat_body if api == "chat" else responses_body
    assert_outcome(API[api], build(**fields, **stream), chat if api == "chat" else responses)


def _chat(*parts: dict[str, Any], **fields: Any) -> dict[str, Any]:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "first"}, *parts]},
    ]
    return chat_body(messages=messages, **fields)


def _responses(*parts: dict[str, Any], **fields: Any) -> dict[str, Any]:
    items = [
        {"role": "developer", "content": "be brief"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, *parts],
        },
    ]
    return responses_body(input=items, **fields)


CONTEXTS: dict[str, tuple[dict[str, Any], int | None]] = {
    "without_options": ({}, None),
    "implicit": ({PCO: {"mode": "implicit"}}, 1800),
    "explicit": ({PCO: {"mode": "explicit"}}, None),
}


# Per API: its content parts, the request around one of them, and the field holding the turns.
PART_SHAPES: dict[str, tuple[dict[str, dict[str, Any]], Callable[..., dict[str, Any]], str]] = {
    "chat": (CHAT_PARTS, _chat, "messages"),
    "responses": (RESPONSES_PARTS, _responses, "input"),
}


@pytest.mark.parametrize("stream", STREAM_VARIANTS, ids=STREAM_IDS)
@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize(
    ("api", "part_type"),
    [
        pytest.param(api, part_type, id=f"{api}-{part_type}")
        for api, (parts, _, _) in PART_SHAPES.items()
        for part_type in parts
    ],
)
def test_part_breakpoint_is_a_prefix(api: str, part_type: str, context: str, stream: Any) -> None:
    parts, build, turns = PART_SHAPES[api]
    fields, full = CONTEXTS[context]
    part = {**parts[part_type], BP: BREAKPOINT}
    expected = Ok(full=full, breakpoints=((f"{turns}[1].content[1].{BP}", 1800),))
    assert_outcome(API[api], build(part, **fields, **stream), expected)


TEXT = CHAT_PARTS["text"]
ITEXT = RESPONSES_PARTS["input_text"]


def _marked(n: int, *, chat: bool = True) -> list[dict[str, Any]]:
    return [{**(TEXT if chat else ITEXT), BP: BREAKPOINT} for _ in range(n)]


# (row id, request, outcome) for Chat Completions
CHAT_ROWS: list[tuple[str, dict[str, Any], Outcome]] = [
    (
        "refusal_part_has_no_breakpoint_field",
        _chat({"type": "refusal", "refusal": "no", BP: BREAKPOINT}),
        Err(UNKNOWN, f"messages[1].content[1].{BP}"),
    ),
    (
        "breakpoint_string",
        _chat({**TEXT, BP: "explicit"}),
        Err(INVALID_TYPE, f"messages[1].content[1].{BP}"),
    ),
    (
        "breakpoint_mode_missing",
        _chat({**TEXT, BP: {}}),
        Err(MISSING, f"messages[1].content[1].{BP}.mode"),
    ),
    (
        "breakpoint_mode_implicit",
        _chat({**TEXT, BP: {"mode": "implicit"}}),
        Err(INVALID_VALUE, f"messages[1].content[1].{BP}.mode"),
    ),
    (
        "breakpoint_mode_null",
        _chat({**TEXT, BP: {"mode": None}}),
        Err(INVALID_TYPE, f"messages[1].content[1].{BP}.mode"),
    ),
    (
        "breakpoint_unknown_key",
        _chat({**TEXT, BP: {"mode": "explicit", "scope": "x"}}),
        Err(UNKNOWN, f"messages[1].content[1].{BP}.scope"),
    ),
    (
        "breakpoint_ttl_30m",
        _chat({**TEXT, BP: {"mode": "explicit", "ttl": "30m"}}),
        Ok(breakpoints=((f"messages[1].content[1].{BP}", 1800),)),
    ),
    (
        "breakpoint_ttl_12h_not_published_for_chat",
        _chat({**TEXT, BP: {"mode": "explicit", "ttl": "12h"}}),
        Err(INVALID_VALUE, f"messages[1].content[1].{BP}.ttl"),
    ),
    (
        "breakpoint_ttl_null",
        _chat({**TEXT, BP: {"mode": "explicit", "ttl": None}}),
        Err(INVALID_TYPE, f"messages[1].content[1].{BP}.ttl"),
    ),
    ("breakpoint_null_is_absent", _chat({**TEXT, BP: None}), None),
    (
        "implicit_writes_the_latest_three",
        _chat(*_marked(5)),
        Ok(breakpoints=tuple((f"messages[1].content[{j}].{BP}", 1800) for j in (3, 4, 5))),
    ),
    (
        "explicit_writes_the_latest_four",
        _chat(*_marked(5), **{PCO: {"mode": "explicit"}}),
        Ok(breakpoints=tuple((f"messages[1].content[{j}].{BP}", 1800) for j in (2, 3, 4, 5))),
    ),
    (
        "explicit_mode_error_no_longer_hides_a_bad_breakpoint",
        _chat({**TEXT, BP: "x"}, **{PCO: {"mode": "explicit"}}),
        Err(INVALID_TYPE, f"messages[1].content[1].{BP}"),
    ),
    (
        "options_error_reported_before_the_breakpoint",
        _chat({**TEXT, BP: "x"}, **{PCO: {"mode": "auto"}}),
        Err(INVALID_VALUE, f"{PCO}.mode"),
    ),
    (
        "string_content_has_no_breakpoints",
        chat_body(**{PCO: {"mode": "explicit"}}),
        EXPLICIT_NOTHING,
    ),
]

# (row id, request, outcome) for Responses
RESPONSES_ROWS: list[tuple[str, dict[str, Any], Outcome]] = [
    (
        "function_call_output_parts",
        responses_body(
            input=[
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": _marked(1, chat=False)},
            ]
        ),
        Ok(breakpoints=((f"input[1].output[0].{BP}", 1800),)),
    ),
    (
        "bare_part_item",
        responses_body(input=[{**ITEXT, BP: BREAKPOINT}]),
        Ok(breakpoints=((f"input[0].{BP}", 1800),)),
    ),
    (
        "part_type_not_a_string",
        responses_body(input=[{"type": [], BP: BREAKPOINT}]),
        Err(UNKNOWN, f"input[0].{BP}"),
    ),
    (
        "output_text_has_no_breakpoint_field",
        responses_body(
            input=[
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "x", BP: BREAKPOINT}],
                }
            ]
        ),
        Err(UNKNOWN, f"input[0].content[0].{BP}"),
    ),
    (
        "breakpoint_ttl_12h",
        _responses({**ITEXT, BP: {"mode": "explicit", "ttl": "12h"}}),
        Ok(breakpoints=((f"input[1].content[1].{BP}", 43200),)),
    ),
    (
        "breakpoint_inherits_the_request_ttl",
        _responses({**ITEXT, BP: BREAKPOINT}, **{PCO: {"ttl": "12h"}}),
        Ok(full=43200, breakpoints=((f"input[1].content[1].{BP}", 43200),)),
    ),
    (
        "breakpoint_ttl_1h",
        _responses({**ITEXT, BP: {"mode": "explicit", "ttl": "1h"}}),
        Err(INVALID_VALUE, f"input[1].content[1].{BP}.ttl"),
    ),
    (
        "explicit_mode_12h_and_mixed_breakpoints",
        _responses(
            {**ITEXT, BP: BREAKPOINT},
            {**ITEXT, BP: {"mode": "explicit", "ttl": "30m"}},
            **{PCO: {"mode": "explicit", "ttl": "12h"}},
        ),
        Ok(
            breakpoints=(
                (f"input[1].content[1].{BP}", 43200),
                (f"input[1].content[2].{BP}", 1800),
            )
        ),
    ),
]


@pytest.mark.parametrize("stream", STREAM_VARIANTS, ids=STREAM_IDS)
@pytest.mark.parametrize(
    ("request_body", "expected"), [pytest.param(b, e, id=n) for n, b, e in CHAT_ROWS]
)
def test_chat_rows(request_body: dict[str, Any], expected: Outcome, stream: Any) -> None:
    assert_outcome(hints_from_chat_completions, {**request_body, **stream}, expected)


@pytest.mark.parametrize("stream", STREAM_VARIANTS, ids=STREAM_IDS)
@pytest.mark.parametrize(
    ("request_body", "expected"), [pytest.param(b, e, id=n) for n, b, e in RESPONSES_ROWS]
)
def test_responses_rows(request_body: dict[str, Any], expected: Outcome, stream: Any) -> None:
    assert_outcome(hints_from_responses, {**request_body, **stream}, expected)


@pytest.mark.parametrize("api", API)
def test_default_mode_is_prefix(api: str) -> None:
    request = _chat(*_marked(1)) if api == "chat" else _responses(*_marked(1, chat=False))
    assert API[api](request) == API[api](request, breakpoints="prefix")
    assert API[api](request).breakpoints


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param(
            {},
            {"retain_full_prompt": {"ttl_seconds": 600, "origin": "policy"}},
            id="codex_sends_none",
        ),
        pytest.param(
            {"prompt_cache_key": "conv-1"},
            {"retain_full_prompt": {"ttl_seconds": 600, "origin": "policy"}},
            id="cache_key_is_not_a_control",
        ),
        pytest.param({PCO: {"mode": "explicit"}}, None, id="explicit_nothing_is_respected"),
        pytest.param({PCO: {}}, {"retain_full_prompt": {"ttl_seconds": 1800}}, id="client_intent"),
    ],
)
def test_fleet_default_applies_only_without_client_controls(
    fields: dict[str, Any], expected: dict[str, Any] | None
) -> None:
    envelope = build_envelope(
        hints_from_responses(responses_body(**fields)), default_ttl_seconds=600
    )
    assert (envelope.to_wire() if envelope else None) == expected

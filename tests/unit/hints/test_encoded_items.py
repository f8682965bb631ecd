"""The Anthropic, Chat and Responses normalizers given each item's encoding (the frontend's resumer has
it) skip the items whose bytes never name the key, and answer exactly what a full walk answers:
every v2 block row of the contract tables, plus rows where the key sits where no walk looks (tool
inputs, text) or on a message."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from test_anthropic import CC, EPHEMERAL, STREAM_VARIANTS, TEXT, TOOL_USE, _user, body
from test_anthropic_prefix import BLOCK_ROWS
from test_openai_prefix import CHAT_ROWS, RESPONSES_ROWS

from kvretention.dataplane.frontend.resume import encode_items
from kvretention.hints import (
    CacheControlError,
    CacheHints,
    hints_from_chat_completions,
    hints_from_messages,
    hints_from_responses,
)

Normalizer = Callable[..., CacheHints]

EXTRA_MESSAGES_ROWS: list[tuple[str, dict[str, Any]]] = [
    (
        "key_in_tool_input",
        {"messages": [{"role": "assistant", "content": [{**TOOL_USE, "input": {CC: EPHEMERAL}}]}]},
    ),
    ("key_in_text", {"messages": _user({**TEXT, "text": f'"{CC}"'})}),
    ("null_control", {"messages": _user({**TEXT, CC: None})}),
    ("control_on_message", {"messages": [{"role": "user", "content": "hi", CC: EPHEMERAL}]}),
    ("non_dict_message", {"messages": ["x", *_user({**TEXT, CC: EPHEMERAL})]}),
]

BP = "prompt_cache_breakpoint"
EXTRA_RESPONSES_ROWS: list[tuple[str, dict[str, Any]]] = [
    ("bare_part", {"input": [{"type": "input_text", "text": "x", BP: {"mode": "explicit"}}]}),
    ("non_dict_item", {"input": [1, {"role": "user", "content": "x"}]}),
    (
        "key_in_tool_arguments",
        {
            "input": [
                {"role": "user", "content": "x"},
                {
                    "type": "function_call",
                    "call_id": "c",
                    "name": "f",
                    "arguments": f'{{"{BP}": 1}}',
                },
            ]
        },
    ),
]


def _outcome(normalize: Normalizer, request: Mapping[str, Any], **kwargs: Any) -> object:
    try:
        hints = normalize(request, breakpoints="prefix", **kwargs)
    except CacheControlError as err:
        return ("error", err.code, err.param, err.message)
    return hints


def _same(normalize: Normalizer, request: dict[str, Any], key: str) -> None:
    items = request.get(key)
    encoded = encode_items(items) if isinstance(items, list) else None
    full = _outcome(normalize, request)
    assert _outcome(normalize, request, encoded=encoded) == full
    if encoded:  # a list that is not this body's (another length) is not used
        assert _outcome(normalize, request, encoded=[*encoded, b"{}"]) == full
        # what the resumer passes: b"" for each item whose bytes do not name the key
        marker = b'"cache_control"' if normalize is hints_from_messages else f'"{BP}"'.encode()
        named = [blob if marker in blob else b"" for blob in encoded]
        assert _outcome(normalize, request, encoded=named) == full


@pytest.mark.parametrize("stream", STREAM_VARIANTS)
@pytest.mark.parametrize(
    "fields",
    [pytest.param(f, id=n) for n, f, _ in BLOCK_ROWS]
    + [pytest.param(f, id=n) for n, f in EXTRA_MESSAGES_ROWS],
)
def test_messages_rows(fields: dict[str, Any], stream: dict[str, Any]) -> None:
    _same(hints_from_messages, body(**fields, **stream), "messages")


CHAT_KEY_IN_ARGUMENTS: dict[str, Any] = {
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "x"}]},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "f", "arguments": f'{{"{BP}": 1}}'},
                }
            ],
        },
    ]
}


@pytest.mark.parametrize(
    "request_body",
    [pytest.param(b, id=n) for n, b, _ in CHAT_ROWS]
    + [pytest.param(CHAT_KEY_IN_ARGUMENTS, id="key_in_tool_arguments")],
)
def test_chat_rows(request_body: dict[str, Any]) -> None:
    _same(hints_from_chat_completions, request_body, "messages")


@pytest.mark.parametrize(
    "request_body",
    [pytest.param(b, id=n) for n, b, _ in RESPONSES_ROWS]
    + [pytest.param(b, id=n) for n, b in EXTRA_RESPONSES_ROWS],
)
def test_responses_rows(request_body: dict[str, Any]) -> None:
    _same(hints_from_responses, request_body, "input")


def test_a_skipped_item_is_one_whose_bytes_lack_the_key() -> None:
    """The skip is real: bytes that do not name the key hide a control from the walk (the
    frontend only ever passes the items' own encodings)."""
    request = body(messages=_user({**TEXT, CC: EPHEMERAL}))
    assert hints_from_messages(request).breakpoints
    assert not hints_from_messages(request, encoded=[b"{}"]).breakpoints
    responses = {
        "input": [
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "x", BP: {"mode": "explicit"}}],
            }
        ]
    }
    assert hints_from_responses(responses).breakpoints
    assert not hints_from_responses(responses, encoded=[b"{}"]).breakpoints

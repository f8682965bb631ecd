"""The v1 OpenAI rows of docs/contract.md (Chat Completions and Responses), streaming and not.

``Reject`` mode reproduces them: every row runs through the v1 entry point and through
``hints_from_*(..., breakpoints="reject")``; both must give the same outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import pytest

from kvretention.hints import (
    CacheHints,
    ClientErrorCode,
    KvHintEnvelope,
    hints_from_chat_completions,
    hints_from_responses,
    normalize_chat_completions,
    normalize_responses,
)
from support.hint_outcomes import Err, assert_full_prompt, refusal

Normalizer = Callable[[Mapping[str, Any]], KvHintEnvelope | None]
REJECT_MODE: dict[Normalizer, Callable[..., CacheHints]] = {
    normalize_chat_completions: hints_from_chat_completions,
    normalize_responses: hints_from_responses,
}


def _entry_points(normalize: Normalizer) -> list[Normalizer]:
    """The v1 function and the same API's v2 function in ``reject`` mode."""
    hints = REJECT_MODE[normalize]
    return [normalize, lambda body: hints(body, breakpoints="reject").envelope]


Outcome = int | None | Err
BOTH = ("chat", "responses")
INVALID_TYPE = ClientErrorCode.INVALID_TYPE
INVALID_VALUE = ClientErrorCode.INVALID_VALUE
UNKNOWN = ClientErrorCode.UNKNOWN_PARAMETER
UNSUPPORTED_VALUE = ClientErrorCode.UNSUPPORTED_VALUE
UNSUPPORTED_PARAM = ClientErrorCode.UNSUPPORTED_PARAMETER
PCO = "prompt_cache_options"

# (row id, top-level fields added to a plain request, outcome for chat, outcome for responses)
OPTION_ROWS: list[tuple[str, dict[str, Any], Outcome, Outcome]] = [
    ("no_cache_fields", {}, None, None),
    ("options_empty_object", {PCO: {}}, 1800, 1800),
    ("mode_implicit", {PCO: {"mode": "implicit"}}, 1800, 1800),
    ("ttl_30m", {PCO: {"ttl": "30m"}}, 1800, 1800),
    ("implicit_30m", {PCO: {"mode": "implicit", "ttl": "30m"}}, 1800, 1800),
    ("ttl_12h", {PCO: {"ttl": "12h"}}, Err(INVALID_VALUE, f"{PCO}.ttl"), 43200),
    (
        "mode_explicit",
        {PCO: {"mode": "explicit"}},
        Err(UNSUPPORTED_VALUE, f"{PCO}.mode"),
        Err(UNSUPPORTED_VALUE, f"{PCO}.mode"),
    ),
    (
        "explicit_30m",
        {PCO: {"mode": "explicit", "ttl": "30m"}},
        Err(UNSUPPORTED_VALUE, f"{PCO}.mode"),
        Err(UNSUPPORTED_VALUE, f"{PCO}.mode"),
    ),
    (
        "mode_wrong_case",
        {PCO: {"mode": "Implicit"}},
        Err(INVALID_VALUE, f"{PCO}.mode"),
        Err(INVALID_VALUE, f"{PCO}.mode"),
    ),
    (
        "mode_unknown",
        {PCO: {"mode": "auto"}},
        Err(INVALID_VALUE, f"{PCO}.mode"),
        Err(INVALID_VALUE, f"{PCO}.mode"),
    ),
    (
        "mode_null",
        {PCO: {"mode": None}},
        Err(INVALID_TYPE, f"{PCO}.mode"),
        Err(INVALID_TYPE, f"{PCO}.mode"),
    ),
    (
        "mode_boolean",
        {PCO: {"mode": True}},
        Err(INVALID_TYPE, f"{PCO}.mode"),
        Err(INVALID_TYPE, f"{PCO}.mode"),
    ),
    (
        "ttl_wrong_case",
        {PCO: {"ttl": "30M"}},
        Err(INVALID_VALUE, f"{PCO}.ttl"),
        Err(INVALID_VALUE, f"{PCO}.ttl"),
    ),
    (
        "ttl_unpublished",
        {PCO: {"ttl": "1h"}},
        Err(INVALID_VALUE, f"{PCO}.ttl"),
        Err(INVALID_VALUE, f"{PCO}.ttl"),
    ),
    (
        "ttl_seconds_number",
        {PCO: {"ttl": 1800}},
        Err(INVALID_TYPE, f"{PCO}.ttl"),
        Err(INVALID_TYPE, f"{PCO}.ttl"),
    ),
    (
        "ttl_null",
        {PCO: {"ttl": None}},
        Err(INVALID_TYPE, f"{PCO}.ttl"),
        Err(INVALID_TYPE, f"{PCO}.ttl"),
    ),
    ("options_null", {PCO: None}, Err(INVALID_TYPE, PCO), Err(INVALID_TYPE, PCO)),
    ("options_string", {PCO: "implicit"}, Err(INVALID_TYPE, PCO), Err(INVALID_TYPE, PCO)),
    (
        "options_array",
        {PCO: [{"mode": "implicit"}]},
        Err(INVALID_TYPE, PCO),
        Err(INVALID_TYPE, PCO),
    ),
    ("options_boolean", {PCO: True}, Err(INVALID_TYPE, PCO), Err(INVALID_TYPE, PCO)),
    ("unknown_subfield", {PCO: {"foo": 1}}, Err(UNKNOWN, f"{PCO}.foo"), Err(UNKNOWN, f"{PCO}.foo")),
    (
        "unknown_subfield_with_implicit",
        {PCO: {"mode": "implicit", "ttl_seconds": 60}},
        Err(UNKNOWN, f"{PCO}.ttl_seconds"),
        Err(UNKNOWN, f"{PCO}.ttl_seconds"),
    ),
    ("prewarm_false", {PCO: {"prewarm": False}}, Err(UNKNOWN, f"{PCO}.prewarm"), 1800),
    (
        "prewarm_true",
        {PCO: {"prewarm": True}},
        Err(UNKNOWN, f"{PCO}.prewarm"),
        Err(UNSUPPORTED_VALUE, f"{PCO}.prewarm"),
    ),
    (
        "prewarm_string",
        {PCO: {"prewarm": "yes"}},
        Err(UNKNOWN, f"{PCO}.prewarm"),
        Err(INVALID_TYPE, f"{PCO}.prewarm"),
    ),
    (
        "comparison_response_id",
        {PCO: {"comparison_response_id": "resp_1"}},
        Err(UNKNOWN, f"{PCO}.comparison_response_id"),
        1800,
    ),
    (
        "comparison_response_id_number",
        {PCO: {"comparison_response_id": 7}},
        Err(UNKNOWN, f"{PCO}.comparison_response_id"),
        Err(INVALID_TYPE, f"{PCO}.comparison_response_id"),
    ),
    ("cache_key_alone", {"prompt_cache_key": "tenant-a"}, None, None),
    ("cache_key_null", {"prompt_cache_key": None}, None, None),
    ("cache_key_with_options", {"prompt_cache_key": "k", PCO: {}}, 1800, 1800),
    (
        "cache_key_number",
        {"prompt_cache_key": 5},
        Err(INVALID_TYPE, "prompt_cache_key"),
        Err(INVALID_TYPE, "prompt_cache_key"),
    ),
    ("legacy_24h_alone", {"prompt_cache_retention": "24h"}, None, None),
    ("legacy_in_memory_alone", {"prompt_cache_retention": "in_memory"}, None, None),
    ("legacy_null", {"prompt_cache_retention": None}, None, None),
    ("legacy_24h_does_not_widen", {"prompt_cache_retention": "24h", PCO: {}}, 1800, 1800),
    (
        "legacy_in_memory_does_not_shorten",
        {"prompt_cache_retention": "in_memory", PCO: {"mode": "implicit"}},
        1800,
        1800,
    ),
    (
        "legacy_unknown",
        {"prompt_cache_retention": "forever"},
        Err(INVALID_VALUE, "prompt_cache_retention"),
        Err(INVALID_VALUE, "prompt_cache_retention"),
    ),
    (
        "legacy_wrong_case",
        {"prompt_cache_retention": "24H"},
        Err(INVALID_VALUE, "prompt_cache_retention"),
        Err(INVALID_VALUE, "prompt_cache_retention"),
    ),
    (
        "legacy_number",
        {"prompt_cache_retention": 24},
        Err(INVALID_TYPE, "prompt_cache_retention"),
        Err(INVALID_TYPE, "prompt_cache_retention"),
    ),
]

CHAT_PARTS: dict[str, dict[str, Any]] = {
    "text": {"type": "text", "text": "hello"},
    "image_url": {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    "input_audio": {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    "file": {"type": "file", "file": {"file_id": "file-1"}},
}
RESPONSES_PARTS: dict[str, dict[str, Any]] = {
    "input_text": {"type": "input_text", "text": "hello"},
    "input_image": {"type": "input_image", "image_url": "https://example.com/a.png"},
    "input_file": {"type": "input_file", "file_id": "file-1"},
}
BREAKPOINT = {"mode": "explicit"}
STREAM_VARIANTS: list[dict[str, Any]] = [{}, {"stream": False}, {"stream": True}]


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def responses_body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hi", **fields}


NORMALIZE: dict[str, tuple[Normalizer, Callable[..., dict[str, Any]]]] = {
    "chat": (normalize_chat_completions, chat_body),
    "responses": (normalize_responses, responses_body),
}


def assert_outcome(v1: Normalizer, body: Mapping[str, Any], expected: Outcome) -> None:
    for normalize in _entry_points(v1):
        if isinstance(expected, Err):
            error = refusal(partial(normalize, body), expected)
            assert error.status == 400
            assert expected.param in error.message
        else:
            assert_full_prompt(normalize(body), expected)


@pytest.mark.parametrize("stream", STREAM_VARIANTS, ids=["no_stream", "stream_false", "stream"])
@pytest.mark.parametrize("api", BOTH)
@pytest.mark.parametrize(
    ("fields", "chat", "responses"),
    [pytest.param(f, c, r, id=name) for name, f, c, r in OPTION_ROWS],
)
def test_option_rows(
    api: str, fields: dict[str, Any], chat: Outcome, responses: Outcome, stream: dict[str, Any]
) -> None:
    normalize, build = NORMALIZE[api]
    assert_outcome(normalize, build(**fields, **stream), chat if api == "chat" else responses)


def _chat_with_part(part: dict[str, Any], **fields: Any) -> dict[str, Any]:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "first"}, part]},
    ]
    return chat_body(messages=messages, **fields)


def _responses_with_part(part: dict[str, Any], **fields: Any) -> dict[str, Any]:
    items = [
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, part]},
    ]
    return responses_body(input=items, **fields)


OPTION_CONTEXTS: dict[str, dict[str, Any]] = {
    "without_options": {},
    "with_implicit": {PCO: {"mode": "implicit"}},
    "with_default_options": {PCO: {}},
}


@pytest.mark.parametrize("stream", STREAM_VARIANTS, ids=["no_stream", "stream_false", "stream"])
@pytest.mark.parametrize("context", OPTION_CONTEXTS)
@pytest.mark.parametrize("part_type", CHAT_PARTS)
def test_chat_part_breakpoint_is_rejected(
    part_type: str, context: str, stream: dict[str, Any]
) -> None:
    part = {**CHAT_PARTS[part_type], "prompt_cache_breakpoint": BREAKPOINT}
    body = _chat_with_part(part, **OPTION_CONTEXTS[context], **stream)
    expected = Err(UNSUPPORTED_PARAM, "messages[1].content[1].prompt_cache_breakpoint")
    assert_outcome(normalize_chat_completions, body, expected)


@pytest.mark.parametrize("stream", STREAM_VARIANTS, ids=["no_stream", "stream_false", "stream"])
@pytest.mark.parametrize("context", OPTION_CONTEXTS)
@pytest.mark.parametrize("part_type", RESPONSES_PARTS)
def test_responses_part_breakpoint_is_rejected(
    part_type: str, context: str, stream: dict[str, Any]
) -> None:
    part = {**RESPONSES_PARTS[part_type], "prompt_cache_breakpoint": BREAKPOINT}
    body = _responses_with_part(part, **OPTION_CONTEXTS[context], **stream)
    expected = Err(UNSUPPORTED_PARAM, "input[1].content[1].prompt_cache_breakpoint")
    assert_outcome(normalize_responses, body, expected)


def test_explicit_mode_is_reported_before_breakpoints() -> None:
    part = {**CHAT_PARTS["text"], "prompt_cache_breakpoint": BREAKPOINT}
    body = _chat_with_part(part, **{PCO: {"mode": "explicit"}})
    assert_outcome(normalize_chat_completions, body, Err(UNSUPPORTED_VALUE, f"{PCO}.mode"))


@pytest.mark.parametrize(
    ("api", "body", "expected"),
    [
        pytest.param(
            "chat",
            _chat_with_part({**CHAT_PARTS["text"], "prompt_cache_breakpoint": None}, **{PCO: {}}),
            1800,
            id="chat_null_breakpoint_is_absent",
        ),
        pytest.param(
            "responses",
            _responses_with_part(
                {**RESPONSES_PARTS["input_text"], "prompt_cache_breakpoint": None}
            ),
            None,
            id="responses_null_breakpoint_is_absent",
        ),
        pytest.param(
            "chat",
            _chat_with_part(
                {"type": "refusal", "refusal": "no", "prompt_cache_breakpoint": BREAKPOINT}
            ),
            Err(UNSUPPORTED_PARAM, "messages[1].content[1].prompt_cache_breakpoint"),
            id="chat_breakpoint_on_any_part_type",
        ),
        pytest.param(
            "chat",
            _chat_with_part({**CHAT_PARTS["text"], "prompt_cache_breakpoint": "explicit"}),
            Err(UNSUPPORTED_PARAM, "messages[1].content[1].prompt_cache_breakpoint"),
            id="chat_malformed_breakpoint",
        ),
        pytest.param(
            "responses",
            responses_body(
                input=[
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                    {
                        "type": "function_call_output",
                        "call_id": "c1",
                        "output": [
                            {**RESPONSES_PARTS["input_text"], "prompt_cache_breakpoint": {}}
                        ],
                    },
                ],
                **{PCO: {}},
            ),
            Err(UNSUPPORTED_PARAM, "input[1].output[0].prompt_cache_breakpoint"),
            id="responses_function_output_part",
        ),
        pytest.param(
            "responses",
            responses_body(
                input=[{**RESPONSES_PARTS["input_text"], "prompt_cache_breakpoint": {}}]
            ),
            Err(UNSUPPORTED_PARAM, "input[0].prompt_cache_breakpoint"),
            id="responses_bare_part_item",
        ),
        pytest.param(
            "responses",
            responses_body(input="plain string input", instructions="sys", **{PCO: {}}),
            1800,
            id="responses_string_input_hinted",
        ),
        pytest.param(
            "chat",
            chat_body(messages=[{"role": "user", "content": [CHAT_PARTS["text"]]}], **{PCO: {}}),
            1800,
            id="chat_parts_without_breakpoints_hinted",
        ),
    ],
)
def test_part_edge_rows(api: str, body: dict[str, Any], expected: Outcome) -> None:
    assert_outcome(NORMALIZE[api][0], body, expected)


def test_normalizer_does_not_mutate_the_body() -> None:
    body = _chat_with_part(CHAT_PARTS["text"], prompt_cache_key="k", **{PCO: {}})
    before = repr(body)
    normalize_chat_completions(body)
    assert repr(body) == before

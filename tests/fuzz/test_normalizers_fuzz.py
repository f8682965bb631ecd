"""Bad input at the normalizers and the frontend's parsers: a typed client error or a result, never a crash.

Properties, for arbitrary JSON and for bodies built around the real field names with wrong types
at every level:

- ``normalize_chat_completions`` / ``normalize_responses`` / ``normalize_messages`` return ``None``
  or an envelope whose TTL is one the provider publishes, or raise ``CacheControlError``;
- ``parse_chat`` / ``parse_responses`` / ``parse_messages`` return a ``ParsedRequest`` whose router
  request serializes, or raise ``ClientError``: no KeyError/TypeError/AttributeError/RecursionError.

Every crash these found is pinned below as an explicit regression case.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from fuzz_strategies import (
    budget,
    chat_parser_bodies,
    json_objects,
    messages_parser_bodies,
    outcome,
    responses_parser_bodies,
)
from hypothesis import given
from hypothesis import strategies as st

from kvretention.dataplane.frontend.anthropic import parse_messages
from kvretention.dataplane.frontend.common import ParsedRequest
from kvretention.dataplane.frontend.openai import parse_chat, parse_responses
from kvretention.dataplane.frontend.prepare import build_preprocessed
from kvretention.hints import (
    CacheControlError,
    ClientError,
    KvHintEnvelope,
    normalize_chat_completions,
    normalize_messages,
    normalize_responses,
)
from kvretention.hints import anthropic as anthropic_hints
from kvretention.hints import openai as openai_hints

Normalizer = Callable[[Mapping[str, Any]], KvHintEnvelope | None]
Parser = Callable[..., ParsedRequest]

CHAT_TTLS = frozenset(openai_hints.CHAT_TTLS.values())
RESPONSES_TTLS = frozenset(openai_hints.RESPONSES_TTLS.values())
ANTHROPIC_TTLS = frozenset(anthropic_hints.TTLS.values())
NORMALIZERS: list[tuple[Normalizer, frozenset[int]]] = [
    (normalize_chat_completions, CHAT_TTLS),
    (normalize_responses, RESPONSES_TTLS),
    (normalize_messages, ANTHROPIC_TTLS),
]
PARSERS: list[Parser] = [parse_chat, parse_responses, parse_messages]


def _check_normalizer(normalize: Normalizer, ttls: frozenset[int], body: dict[str, Any]) -> None:
    try:
        envelope = normalize(body)
    except CacheControlError as exc:
        assert exc.status == 400 and exc.message and exc.param
        outcome("CacheControlError")
        return
    outcome("no hint" if envelope is None else "hint")
    if envelope is None:
        return
    assert isinstance(envelope, KvHintEnvelope)
    assert envelope.retain_full_prompt is not None
    assert envelope.retain_full_prompt.ttl_seconds in ttls


def _check_parser(parse: Parser, body: dict[str, Any], *, hints: bool) -> None:
    try:
        parsed = parse(body, hints=hints)
    except ClientError as exc:
        assert exc.status == 400 and exc.message
        outcome("ClientError")
        return
    outcome("parsed, hinted" if parsed.envelope is not None else "parsed")
    assert isinstance(parsed, ParsedRequest)
    assert parsed.messages, "a parsed request always has a message to send"
    if not hints:
        assert parsed.envelope is None
    upstream = build_preprocessed(parsed, request_id="r", session_id=None, tokenizer=None)
    upstream.to_json_bytes()  # what the frontend sends the router must serialize


@budget(150)
@given(body=chat_parser_bodies)
def test_normalize_chat_completions_on_field_shaped_bodies(body: dict[str, Any]) -> None:
    _check_normalizer(normalize_chat_completions, CHAT_TTLS, body)


@budget(150)
@given(body=responses_parser_bodies)
def test_normalize_responses_on_field_shaped_bodies(body: dict[str, Any]) -> None:
    _check_normalizer(normalize_responses, RESPONSES_TTLS, body)


@budget(150)
@given(body=messages_parser_bodies)
def test_normalize_messages_on_field_shaped_bodies(body: dict[str, Any]) -> None:
    _check_normalizer(normalize_messages, ANTHROPIC_TTLS, body)


@pytest.mark.parametrize(
    ("normalize", "ttls"), NORMALIZERS, ids=lambda v: getattr(v, "__name__", "")
)
@budget(100)
@given(body=json_objects)
def test_normalizers_on_arbitrary_json(
    normalize: Normalizer, ttls: frozenset[int], body: dict[str, Any]
) -> None:
    _check_normalizer(normalize, ttls, body)


@budget(150)
@given(body=chat_parser_bodies, hints=st.booleans())
def test_parse_chat_on_field_shaped_bodies(body: dict[str, Any], hints: bool) -> None:
    _check_parser(parse_chat, body, hints=hints)


@budget(150)
@given(body=responses_parser_bodies, hints=st.booleans())
def test_parse_responses_on_field_shaped_bodies(body: dict[str, Any], hints: bool) -> None:
    _check_parser(parse_responses, body, hints=hints)


@budget(150)
@given(body=messages_parser_bodies, hints=st.booleans())
def test_parse_messages_on_field_shaped_bodies(body: dict[str, Any], hints: bool) -> None:
    _check_parser(parse_messages, body, hints=hints)


@pytest.mark.parametrize("parse", PARSERS, ids=lambda v: getattr(v, "__name__", ""))
@budget(100)
@given(body=json_objects)
def test_parsers_on_arbitrary_json(parse: Parser, body: dict[str, Any]) -> None:
    _check_parser(parse, body, hints=True)


# -- regressions: shrunk examples the properties above found ---------------------------------------


@pytest.mark.parametrize(
    ("parse", "body", "param"),
    [
        pytest.param(
            parse_chat,
            {"model": "m", "messages": [{"role": [], "content": "x"}]},
            "messages[0].role",
            id="chat_role_list_was_TypeError_unhashable",
        ),
        pytest.param(
            parse_chat,
            {"model": "m", "messages": [{"role": {}, "content": "x"}]},
            "messages[0].role",
            id="chat_role_object_was_TypeError_unhashable",
        ),
    ],
)
def test_regression_parser_cases(parse: Parser, body: dict[str, Any], param: str) -> None:
    with pytest.raises(ClientError) as info:
        parse(body)
    assert info.value.param == param

"""Prefix-mode normalizers on bodies full of breakpoints, valid and not.

Properties: a body is either refused with a typed 400 naming a parameter, or its hints hold the
provider rules: every breakpoint sits on a block of the body that carries the control, at most 4,
the envelope announces exactly that many, and (Anthropic) TTLs never grow along the processing
order. Nothing else escapes (no ``TypeError`` on odd shapes).
"""

from __future__ import annotations

from typing import Any

from fuzz_strategies import budget, chat_parser_bodies, messages_parser_bodies, outcome
from hypothesis import given
from hypothesis import strategies as st

from kvretention.hints import (
    CacheHints,
    ClientError,
    KvHintEnvelope,
    hints_from_chat_completions,
    hints_from_messages,
    hints_from_responses,
)

CONTROLS = st.one_of(
    st.sampled_from(
        [
            {"type": "ephemeral"},
            {"type": "ephemeral", "ttl": "1h"},
            {"type": "ephemeral", "ttl": "5m", "scope": "global"},
            {"type": "ephemeral", "ttl": None},
            {"ttl": "1h"},
            {"type": "persistent"},
            {"type": "ephemeral", "ttl": "30m"},
            "ephemeral",
            None,
            [],
        ]
    ),
    st.dictionaries(st.sampled_from(["type", "ttl", "scope"]), st.none() | st.text(max_size=4)),
)
BLOCK_TYPES = st.sampled_from(
    ["text", "image", "document", "tool_use", "tool_result", "thinking", "future", 7, None]
)


@st.composite
def anthropic_blocks(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    block: dict[str, Any] = {"type": draw(BLOCK_TYPES), "text": "x"}
    if draw(st.booleans()):
        block["cache_control"] = draw(CONTROLS)
    if depth == 0 and draw(st.integers(0, 4)) == 0:
        block["content"] = draw(st.lists(anthropic_blocks(depth=1), max_size=3))
    return block


@st.composite
def anthropic_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "max_tokens": 8}
    body["system"] = draw(st.lists(anthropic_blocks(), max_size=3))
    body["tools"] = [
        {"name": f"t{k}", "input_schema": {"type": "object"}}
        | ({"cache_control": draw(CONTROLS)} if draw(st.booleans()) else {})
        for k in range(draw(st.integers(0, 3)))
    ]
    body["messages"] = [
        {"role": "user", "content": draw(st.lists(anthropic_blocks(), min_size=1, max_size=3))}
        for _ in range(draw(st.integers(1, 3)))
    ]
    if draw(st.booleans()):
        body["cache_control"] = draw(CONTROLS)
    return body


def _at(body: dict[str, Any], path: tuple[str | int, ...]) -> Any:
    node: Any = body
    for key in path:
        node = node[key]
    return node


def _check(hints: CacheHints, body: dict[str, Any], *, marker: str) -> None:
    assert len(hints.breakpoints) <= 4
    for bp in hints.breakpoints:
        block = _at(body, bp.path)
        assert isinstance(block, dict) and block.get(marker) is not None
        assert bp.ttl_seconds > 0
    if hints.envelope is None:
        assert not hints.breakpoints
        return
    assert hints.envelope.prefix_count == len(hints.breakpoints)
    assert KvHintEnvelope.from_wire(hints.envelope.to_wire()) == hints.envelope


@budget(150)
@given(body=anthropic_bodies())
def test_anthropic_prefix_mode(body: dict[str, Any]) -> None:
    try:
        hints = hints_from_messages(body)
    except ClientError as exc:
        assert exc.status == 400 and exc.param and exc.message.startswith(f"{exc.param}: ")
        outcome("refused")
        return
    outcome(f"{len(hints.breakpoints)} breakpoints")
    _check(hints, body, marker="cache_control")
    ttls = [bp.ttl_seconds for bp in hints.breakpoints]
    assert ttls == sorted(ttls, reverse=True), "a longer TTL came after a shorter one"


BREAKPOINTS = st.one_of(
    st.sampled_from(
        [
            {"mode": "explicit"},
            {"mode": "explicit", "ttl": "30m"},
            {"mode": "explicit", "ttl": "12h"},
        ]
    ),
    st.none() | st.text(max_size=3) | st.dictionaries(st.text(max_size=4), st.none()),
)
PART_TYPES = st.sampled_from(["text", "image_url", "input_text", "input_file", "refusal", [], 3])


@st.composite
def parts(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for _ in range(draw(st.integers(0, 6))):
        part: dict[str, Any] = {"type": draw(PART_TYPES), "text": "x"}
        if draw(st.booleans()):
            part["prompt_cache_breakpoint"] = draw(BREAKPOINTS)
        out.append(part)
    return out


OPTIONS = st.sampled_from([None, {}, {"mode": "explicit"}, {"mode": "implicit", "ttl": "30m"}])


@st.composite
def openai_bodies(draw: st.DrawFn, *, chat: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m"}
    body["messages" if chat else "input"] = [
        {"role": "user", "content": draw(parts())} for _ in range(draw(st.integers(1, 3)))
    ]
    options = draw(OPTIONS)
    if options is not None:
        body["prompt_cache_options"] = options
    return body


def _openai(hints_from: Any, body: dict[str, Any]) -> None:
    try:
        hints = hints_from(body)
    except ClientError as exc:
        assert exc.status == 400 and exc.param and exc.message
        outcome("refused")
        return
    outcome(f"{len(hints.breakpoints)} breakpoints")
    _check(hints, body, marker="prompt_cache_breakpoint")


@budget(150)
@given(body=openai_bodies(chat=True))
def test_chat_prefix_mode(body: dict[str, Any]) -> None:
    _openai(hints_from_chat_completions, body)


@budget(150)
@given(body=openai_bodies(chat=False))
def test_responses_prefix_mode(body: dict[str, Any]) -> None:
    _openai(hints_from_responses, body)


@budget(100)
@given(body=st.one_of(chat_parser_bodies, messages_parser_bodies))
def test_prefix_mode_on_the_frontend_fuzz_bodies(body: dict[str, Any]) -> None:
    for hints_from in (hints_from_messages, hints_from_chat_completions, hints_from_responses):
        try:
            hints_from(body)
        except ClientError as exc:
            assert exc.status == 400 and exc.message

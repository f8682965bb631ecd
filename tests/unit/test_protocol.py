"""The PreprocessedRequest wire form: kv_hints top level, absent when there is no hint; the fast
serialization writes the same bytes as pydantic's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import pytest

from kvretention.dataplane.frontend.endpoints import CHAT, MESSAGES, RESPONSES
from kvretention.dataplane.frontend.prepare import build_preprocessed
from kvretention.dataplane.protocol import (
    ChatMessage,
    ImagePart,
    PreprocessedRequest,
    Reasoning,
    SamplingParams,
    TextPart,
    ToolCall,
    ToolDefinition,
    trusted,
)
from kvretention.hints import KvHintEnvelope
from kvretention.replay.sessions import claude_code_session, codex_session


def _request(**extra: object) -> PreprocessedRequest:
    return PreprocessedRequest(
        request_id="r1",
        model="m",
        messages=[ChatMessage(role="user", content="hi")],
        sampling=SamplingParams(max_new_tokens=8),
        **extra,  # type: ignore[arg-type]
    )


def test_hinted_request_carries_envelope_at_top_level() -> None:
    body = json.loads(_request(kv_hints=KvHintEnvelope.retain(300).to_wire()).to_json_bytes())
    assert body["kv_hints"] == {"retain_full_prompt": {"ttl_seconds": 300}}


def test_unhinted_request_has_no_kv_hints_key() -> None:
    body = json.loads(_request().to_json_bytes())
    assert "kv_hints" not in body
    assert body["sampling"] == {"max_new_tokens": 8}


# -- the fast wire form: the same bytes as pydantic's serializer ---------------------------------

SHAPES: Final = Path(__file__).parents[1] / "dataplane" / "shapes"


def _every_field() -> PreprocessedRequest:
    """A conversation with each optional field of each element set once (and once unset)."""
    return PreprocessedRequest(
        request_id="r1",
        model="m",
        messages=[
            ChatMessage(role="system", content=[TextPart(text="sys", retain_ttl=3600)]),
            ChatMessage(
                role="user",
                content=[
                    TextPart(text="look\u2028\x01 é 😀"),
                    ImagePart(url="https://x/y.png", detail="high", retain_ttl=300),
                    ImagePart(url="data:image/png;base64,AA=="),
                ],
                retain_ttl=600,
            ),
            ChatMessage(
                role="assistant",
                content="",
                reasoning=Reasoning(text="hmm", signature="sig", encrypted=True),
                tool_calls=[
                    ToolCall(id="c1", name="f", arguments='{"a": 1}', retain_ttl=60),
                    ToolCall(id="c2", name="apply_patch", arguments="", kind="custom"),
                ],
            ),
            ChatMessage(role="assistant", reasoning=Reasoning()),
            ChatMessage(role="tool", content="out", tool_call_id="c1", name="f", is_error=True),
            ChatMessage(role="tool", content="", tool_call_id="c2"),
        ],
        tools=[ToolDefinition(name="f", parameters={"type": "object"}, retain_ttl=60)],
        sampling=SamplingParams(max_new_tokens=8, temperature=0.7, sampling_seed=3),
        session_id="s",
        kv_hints=KvHintEnvelope.retain(300).to_wire(),
    )


def _parsed(path: str, body: dict[str, Any]) -> PreprocessedRequest:
    api = MESSAGES if path.startswith("/v1/messages") else RESPONSES
    if path.startswith("/v1/chat/completions"):
        api = CHAT
    parsed = api.parse(body, hints=True, breakpoints="prefix")
    return build_preprocessed(parsed, request_id="r1", session_id="s", tokenizer=None)


def _cases() -> dict[str, PreprocessedRequest]:
    cases = {
        "every field": _every_field(),
        "no messages": PreprocessedRequest(request_id="r", model="m", token_ids=[1, 2]),
    }
    for shape in sorted(SHAPES.glob("*.json")):
        recorded = json.loads(shape.read_text())
        cases[shape.stem] = _parsed(recorded["path"], recorded["body"])
    for name, session in (
        ("codex session", codex_session()),
        ("claude code session", claude_code_session()),
    ):
        cases[name] = _parsed(
            "/v1/responses" if "codex" in name else "/v1/messages", session[-1][1]
        )
    return cases


CASES: Final = _cases()


@pytest.mark.parametrize("name", list(CASES))
def test_wire_form_is_pydantics_bytes(name: str) -> None:
    request = CASES[name]
    expected = request.model_dump_json(exclude_none=True, by_alias=True).encode()
    assert request.to_json_bytes() == expected
    assert request.to_json_bytes() == expected  # each message's bytes remembered
    if request.messages is not None:  # the same messages as new objects: the same bytes
        copied = request.model_copy(update={"messages": [m.model_copy() for m in request.messages]})
        assert copied.to_json_bytes() == expected


def test_wire_form_of_large_and_special_numbers_parses_to_pydantics() -> None:
    """Integers past 64 bits, infinities (``1e400`` in a client's schema) and exponents: the
    same values as pydantic writes them (only an exponent's ``+`` may differ)."""
    schema = {"maximum": 2**70, "minimum": float("inf"), "multipleOf": 1e22, "x": float("nan")}
    request = PreprocessedRequest(
        request_id="r", model="m", tools=[ToolDefinition(name="f", parameters=schema)]
    )
    expected = json.loads(request.model_dump_json(exclude_none=True, by_alias=True))
    assert json.loads(request.to_json_bytes()) == expected
    assert expected["tools"][0]["parameters"]["minimum"] is None


@pytest.mark.parametrize("name", list(CASES))
def test_parsed_conversation_equals_its_validated_form(name: str) -> None:
    """The parsers build the conversation with ``trusted`` (no second validation); validating
    what they built gives the same objects, so nothing the validation would change is skipped."""
    request = CASES[name]
    assert PreprocessedRequest.model_validate_json(request.to_json_bytes()) == request


def test_trusted_refuses_a_missing_or_unknown_field() -> None:
    first, second = trusted(ChatMessage, role="user"), trusted(ChatMessage, role="user")
    assert first == ChatMessage(role="user")
    assert first.tool_calls is not second.tool_calls  # each gets its own default list
    with pytest.raises(TypeError):
        trusted(ToolCall, id="c")
    with pytest.raises(TypeError):
        trusted(TextPart, text="x", retain=3)
    with pytest.raises(TypeError):
        trusted(SamplingParams, max_new_tokens=1)  # an aliased field: validate it instead

"""Decoding a body by reusing the conversation's previous turn plans exactly what a whole decode
plans, and refuses every bad body with the very error a whole decode gives.

Each case runs twice with a real chat template and fast tokenizer: through one worker cache that
served the conversation's previous turn (the body split by msgspec, known messages taken from
that turn's memo, only new ones converted for the template), and through a fresh worker that
decodes and renders the whole body. Requests, engine calls, resolved breakpoints and rejections
must be equal.
"""

from __future__ import annotations

import dataclasses
import json
import types
from typing import Any

import pytest

from kvretention.dataplane.frontend.affinity import drop_billing_header
from kvretention.dataplane.frontend.anthropic import parse_messages
from kvretention.dataplane.frontend.config import FrontendConfig
from kvretention.dataplane.frontend.prepare import apply_hint_policy, build_preprocessed
from kvretention.dataplane.protocol import (
    ChatMessage,
    ImagePart,
    Reasoning,
    TextPart,
    ToolCall,
    ToolDefinition,
)
from kvretention.dataplane.template_input import ConvertedMessages, build_template_input
from kvretention.dataplane.worker.app import PlannedCall, RequestRejected, plan_call
from kvretention.dataplane.worker.dialect import Dialect
from kvretention.dataplane.worker.engine import LoadedEngine
from kvretention.dataplane.worker.render_cache import RenderCache
from kvretention.replay.sessions import claude_code_session
from support import chat_tokenizer

SESSION = "s1"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return chat_tokenizer.build_tokenizer()


def engine(tokenizer: Any) -> LoadedEngine:
    manager = types.SimpleNamespace(tokenizer=tokenizer)
    return LoadedEngine(
        engine=types.SimpleNamespace(tokenizer_manager=manager), name="t", dialect=Dialect.VERSIONED
    )


def forwarded(body: dict[str, Any], rid: str = "r1") -> bytes:
    """What the frontend forwards for a Claude Code body (normalised, fleet policy applied)."""
    parsed = parse_messages(body)
    messages, _ = drop_billing_header(parsed.messages)
    parsed = dataclasses.replace(parsed, messages=messages)
    parsed = apply_hint_policy(parsed, config=FrontendConfig(router_url="http://r"))
    request = build_preprocessed(parsed, request_id=rid, session_id=SESSION, tokenizer=None)
    return request.to_json_bytes()


def plan(
    body: bytes, eng: LoadedEngine, cache: RenderCache | None, **headers: str
) -> PlannedCall | RequestRejected:
    try:
        return plan_call(body, headers=headers, state_role="aggregated", engine=eng, cache=cache)
    except RequestRejected as exc:
        return exc


def outcome(planned: PlannedCall | RequestRejected) -> Any:
    """What a plan amounts to: the request, the engine call and the breakpoints; or the error."""
    if isinstance(planned, RequestRejected):
        return (planned.code, str(planned), planned.param)
    return (planned.request, planned.kwargs, planned.breakpoints, planned.prompt_tokens)


def test_every_turn_of_a_session_plans_as_a_whole_decode(tokenizer: Any) -> None:
    eng, cache = engine(tokenizer), RenderCache(tokenizer, verify_every=0)
    previous: list[ChatMessage] = []
    for n, (_, body) in enumerate(claude_code_session(turns=5)[1:]):
        raw = forwarded(body, rid=f"r{n}")
        got, whole = plan(raw, eng, cache), plan(raw, eng, None)
        assert isinstance(got, PlannedCall) and isinstance(whole, PlannedCall)
        assert outcome(got) == outcome(whole)
        assert got.breakpoints is not None and got.breakpoints.resolved
        messages = got.request.messages or []
        if previous:  # the turn took its earlier messages from the previous turn's memo
            shared = [m for m in messages if any(m is p for p in previous)]
            assert len(shared) >= len(previous) - 1 > 0
        previous = messages


def _good(**fields: Any) -> dict[str, Any]:
    _, body = claude_code_session(turns=3)[-1]
    data = json.loads(forwarded(body))
    data.update(fields)
    return data


def _with_message(index: int, message: dict[str, Any]) -> dict[str, Any]:
    data = _good()
    data["messages"][index] = message
    return data


def _raw(data: dict[str, Any]) -> bytes:
    return json.dumps(data, ensure_ascii=False).encode()


CALL = {"id": "c1", "name": "Bash", "arguments": "{not json", "kind": "function"}
# (case, body): each planned after the session's previous turn, with and without that memo
BODIES: list[tuple[str, bytes]] = [
    ("not JSON", b"not json"),
    ("an array", b"[1]"),
    ("truncated", _raw(_good())[:-3]),
    ("invalid UTF-8 in a message", _raw(_good()).replace(b"Fix the failing", b"Fix \xff failing")),
    ("NaN in sampling", _raw(_good()).replace(b'"max_new_tokens":32000', b'"max_new_tokens":NaN')),
    ("empty request id", _raw(_good(request_id=""))),
    ("no messages and no token ids", _raw(_good(messages=None))),
    ("messages not a list", _raw(_good(messages="hello"))),
    ("an unknown role in a known conversation", _raw(_with_message(2, {"role": "wizard"}))),
    ("an unknown message field", _raw(_with_message(1, {"role": "user", "colour": "red"}))),
    ("tools null", _raw(_good(tools=None))),
    ("a tool without a name", _raw(_good(tools=[{"name": ""}]))),
    ("bad sampling and a bad message", _raw({**_with_message(1, {"role": "x"}), "sampling": 3})),
    ("a bad hint and a bad message", _raw({**_with_message(1, {"role": "x"}), "kv_hints": 3})),
    (
        "tool call arguments that are not JSON",
        _raw(_with_message(3, {"role": "assistant", "content": "", "tool_calls": [CALL]})),
    ),
    ("a lone surrogate (msgspec refuses it)", json.dumps(_good(model="m\ud800")).encode()),
    ("duplicate keys: the last wins", _raw(_good())[:-1] + b',"request_id":"again"}'),
    ("an unknown top-level field", _raw(_good(future_field={"x": [1, 2]}))),
    ("a message repeated", _raw(_with_message(2, _good()["messages"][1]))),
    ("the previous turn again", _raw(_good())),
]


@pytest.mark.parametrize(("body"), [pytest.param(b, id=c) for c, b in BODIES])
def test_a_body_is_refused_or_planned_exactly_as_a_whole_decode(
    tokenizer: Any, body: bytes
) -> None:
    eng, cache = engine(tokenizer), RenderCache(tokenizer, verify_every=0)
    _, previous = claude_code_session(turns=3)[-1]
    assert isinstance(plan(forwarded(previous), eng, cache), PlannedCall)
    assert cache.memo_for(session=SESSION) is not None
    assert outcome(plan(body, eng, cache)) == outcome(plan(body, eng, None))


def test_a_malformed_tenant_is_refused_after_the_body_as_before(tokenizer: Any) -> None:
    eng, cache = engine(tokenizer), RenderCache(tokenizer, verify_every=0)
    for body in (_raw(_good()), _raw(_good(request_id=""))):
        got = plan(body, eng, cache, **{"x-kvr-tenant": "Not A Tenant"})
        assert isinstance(got, RequestRejected)
        assert outcome(got) == outcome(plan(body, eng, None, **{"x-kvr-tenant": "Not A Tenant"}))


def _messages(turns: int) -> list[ChatMessage]:
    out = [
        ChatMessage(role="developer", content="Be brief."),
        ChatMessage(
            role="user",
            content=[TextPart(text="Look:"), ImagePart(url="data:image/png;base64,AAAA")],
        ),
    ]
    for t in range(turns):
        arguments = '{"n": 1.0}' if t == 1 else f'{{"command": "ls {t}"}}'  # 1.0: an odd number
        out.append(
            ChatMessage(
                role="assistant",
                content="",
                reasoning=Reasoning(text=f"step {t}"),
                tool_calls=[ToolCall(id=f"c{t}", name="Bash", arguments=arguments)],
            )
        )
        out.append(
            ChatMessage(role="tool", tool_call_id=f"c{t}", content=f"ok {t}", is_error=t == 2)
        )
    return out


@pytest.mark.parametrize("odd_tool", [False, True])
@pytest.mark.parametrize("developer_role", [False, True])
def test_template_input_reusing_earlier_conversions_equals_a_full_conversion(
    developer_role: bool, odd_tool: bool
) -> None:
    tools = [ToolDefinition(name="Bash", parameters={"type": "object", "properties": {}})]
    if odd_tool:  # a schema default minijinja would print unlike Python
        tools.append(ToolDefinition(name="Odd", parameters={"default": 2.0}))
    conversation = _messages(4)
    converted = ConvertedMessages()
    for turns in range(5):  # each turn: the same message objects, plus the new ones
        messages = conversation[: 2 + 2 * turns]
        converted = converted.after()
        got = build_template_input(
            messages, tools=tools, developer_role=developer_role, converted=converted
        )
        whole = build_template_input(messages, tools=tools, developer_role=developer_role)
        assert got == whole
        assert got.odd_numbers == (turns >= 2 or odd_tool)
        assert set(converted.tools) == {id(t) for t in tools}
        assert set(converted.current) == {id(m) for m in messages}
    # a conversion made under the other developer-role setting is not taken
    other = build_template_input(
        conversation, developer_role=not developer_role, converted=converted, keep=False
    )
    assert other == build_template_input(conversation, developer_role=not developer_role)


def _edit(data: dict[str, Any]) -> dict[str, Any]:
    data["messages"][3]["content"] = "an edited tool result"
    return data


def _compact(data: dict[str, Any]) -> dict[str, Any]:
    messages = data["messages"]
    data["messages"] = [messages[0], {"role": "user", "content": "Summary so far."}, messages[-1]]
    return data


def _fewer_tools(data: dict[str, Any]) -> dict[str, Any]:
    data["tools"] = data["tools"][:-1]
    return data


def _keys_reordered(data: dict[str, Any]) -> dict[str, Any]:
    data["messages"] = [dict(reversed(list(m.items()))) for m in data["messages"]]
    return data


def _thinking_off(data: dict[str, Any]) -> dict[str, Any]:
    data["reasoning"] = {"enabled": False}
    return data


# (case, how the next turn's body differs from the one the memo holds)
CHANGES = [
    ("an earlier message edited", _edit),
    ("history compacted", _compact),
    ("a tool dropped", _fewer_tools),
    ("the same messages with keys reordered (new bytes)", _keys_reordered),
    ("thinking switched off", _thinking_off),
]


@pytest.mark.parametrize("change", [pytest.param(c, id=n) for n, c in CHANGES])
def test_a_changed_conversation_plans_as_a_whole_decode(tokenizer: Any, change: Any) -> None:
    eng, cache = engine(tokenizer), RenderCache(tokenizer, verify_every=0)
    _, previous = claude_code_session(turns=4)[-1]
    assert isinstance(plan(forwarded(previous), eng, cache), PlannedCall)
    body = _raw(change(json.loads(forwarded(previous))))
    got = plan(body, eng, cache)
    assert isinstance(got, PlannedCall)
    assert outcome(got) == outcome(plan(body, eng, None))

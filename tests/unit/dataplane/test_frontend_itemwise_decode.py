"""A large body's message items decoded only past what its conversation's last body repeats
byte for byte (``Resumer.decode`` through ``decode_json_body``): every body decodes to what
``json.loads`` gives, or to the same 400, whatever came before it; and the parse of such a body
equals a full parse."""

from __future__ import annotations

import copy
import json
from typing import Final

import pytest

from kvretention.dataplane.frontend import body as frontend_body
from kvretention.dataplane.frontend import compat
from kvretention.dataplane.frontend.anthropic import parse_messages
from kvretention.dataplane.frontend.body import ITEMWISE_BYTES, decode_json_body
from kvretention.dataplane.frontend.errors import FrontendError
from kvretention.dataplane.frontend.openai import parse_chat, parse_responses
from kvretention.dataplane.frontend.resume import (
    BACK,
    CONTROL_KEY,
    Resumer,
    encode_items,
)
from support.agent_sessions import (
    Body,
    Session,
    agent_sessions,
    claude_code_bodies,
    codex_bodies,
    with_output_config,
)


def _chat(bodies: list[Body]) -> list[Body]:
    """The Claude Code conversation as Chat Completions messages (text only, enough to repeat)."""
    out = []
    for body in bodies:
        messages = [
            {"role": m["role"], "content": json.dumps(m["content"])} for m in body["messages"]
        ]
        out.append({"model": "m", "messages": messages})
    return out


def _chat_breakpoints(bodies: list[Body]) -> list[Body]:
    """A breakpoint on the first message (stable) and on the newest one (moving)."""
    out = []
    for body in bodies:
        body = copy.deepcopy(body)
        for index in sorted({0, len(body["messages"]) - 1}):
            message = body["messages"][index]
            text = message["content"]
            message["content"] = [
                {"type": "text", "text": text, "prompt_cache_breakpoint": {"mode": "explicit"}}
            ]
        out.append(body)
    return out


def _responses_breakpoints(bodies: list[Body]) -> list[Body]:
    """A breakpoint on the first user part (the session's stable head) and on the newest item's
    first part when it has parts (moving with each turn)."""
    out = []
    for body in bodies:
        body = copy.deepcopy(body)
        users = [i for i in body["input"] if i.get("role") == "user"]
        for item in (users[0], body["input"][-1]):
            if isinstance(item.get("content"), list) and item["content"]:
                item["content"][0]["prompt_cache_breakpoint"] = {"mode": "explicit"}
        out.append(body)
    return out


ALIKE: Final = 16
"""Conversations that open alike, as many sub-agents as a task may start at once (more than
were ever kept per first message: 4)."""
ADDITIONAL_TOOLS: Final = {
    "type": "additional_tools",
    "role": "developer",
    "tools": [
        {
            "type": "namespace",
            "name": "extra",
            "description": "More tools.",
            "tools": [
                {
                    "type": "function",
                    "name": "wait",
                    "description": "Wait.",
                    "parameters": {"type": "object", "properties": {}},
                }
            ],
        }
    ],
}


def _additional_tools(bodies: list[Body]) -> list[Body]:
    """From the fourth turn on, an ``additional_tools`` item after the history so far (then
    repeated): its tools join the tool list."""
    out = []
    at = len(bodies[3]["input"])
    for t, body in enumerate(bodies):
        body = copy.deepcopy(body)
        if t >= 3:
            body["input"].insert(at, copy.deepcopy(ADDITIONAL_TOOLS))
        out.append(body)
    return out


SESSIONS: Final[dict[str, Session]] = {
    **agent_sessions(8),
    "claude-code-output-config": (
        parse_messages,
        lambda: with_output_config(claude_code_bodies(8), early=False),
    ),
    "codex-additional-tools": (parse_responses, lambda: _additional_tools(codex_bodies(8))),
    "codex-breakpoints": (parse_responses, lambda: _responses_breakpoints(codex_bodies(8))),
    "chat": (parse_chat, lambda: _chat(claude_code_bodies(8))),
    "chat-breakpoints": (parse_chat, lambda: _chat_breakpoints(_chat(claude_code_bodies(8)))),
}


def _reference(raw: bytes) -> str | None:
    """``json.loads``'s value (as its repr: ``1 == 1.0 == True`` would hide a change), or
    ``None`` where the frontend answers 400."""
    try:
        body = json.loads(raw.decode("utf-8-sig"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or "\\ud800" in raw.decode():
        return None  # the frontend refuses a lone surrogate json.loads accepts
    return repr(body)


def _decoded(raw: bytes, resumer: Resumer) -> str | None:
    try:
        return repr(decode_json_body(raw, resumer=resumer))
    except FrontendError as err:
        assert err.status == 400
        return None


@pytest.mark.parametrize("name", SESSIONS)
def test_each_turn_decodes_and_parses_as_a_full_decode(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frontend_body, "ITEMWISE_BYTES", 0)  # the sessions are 5-40 KB
    parse, session = SESSIONS[name]
    resumer = Resumer()
    bodies = [json.dumps(b).encode() for b in session()]
    for raw in bodies:
        body = decode_json_body(raw, resumer=resumer)
        assert repr(body) == repr(json.loads(raw))
        with compat.collecting() as ignored:
            got = parse(body, resumer=resumer)
        with compat.collecting() as expected_ignored:
            expected = parse(json.loads(raw))
        assert got == expected
        assert list(ignored) == list(expected_ignored)
        key = "messages" if "messages" in body else "input"
        encoded = encode_items(body[key])
        assert encoded is not None and resumer.encode_items(body[key]) == encoded
        for named_key in (CONTROL_KEY, b'"prompt_cache_breakpoint"', b'"additional_tools"'):
            named = [named_key in blob for blob in encoded]
            assert resumer.names(body[key], encoded, named_key) == named
    assert resumer.reused_items > 0


def _padded(item: bytes, *, first: bytes = b'{"role": "user", "content": "start"}') -> bytes:
    """A body past :data:`ITEMWISE_BYTES` whose third message is ``item``."""
    pad = json.dumps({"role": "user", "content": "x" * ITEMWISE_BYTES}).encode()
    return b'{"model": "m", "messages": [' + first + b", " + pad + b", " + item + b"]}"


ITEMS: Final[dict[str, bytes]] = {
    "true": b'{"role": "user", "content": "a", "flag": true}',
    "1 for true": b'{"role": "user", "content": "a", "flag": 1}',
    "1.0 for 1": b'{"role": "user", "content": "a", "flag": 1.0}',
    "keys reordered": b'{"content": "a", "role": "user", "flag": true}',
    "an escaped key": b'{"role": "user", "\\u0063ontent": "a", "flag": true}',
    "duplicate keys": b'{"role": "user", "content": "a", "content": "b"}',
    "integer past 64 bits": b'{"role": "user", "content": 123456789012345678901234567890}',
    "a float past the double range": b'{"role": "user", "content": 1e400}',
    "NaN": b'{"role": "user", "content": NaN}',
    "a surrogate pair": b'{"role": "user", "content": "\\ud83d\\ude00"}',
    "a lone surrogate escape": b'{"role": "user", "content": "\\ud800"}',
    "invalid JSON inside": b'{"role": "user", "content": tru}',
    "a control character": b'{"role": "user", "content": "\x01"}',
    "nested deeply": b'{"role": "user", "content": ' + b"[" * 5000 + b"]" * 5000 + b"}",
}


@pytest.mark.parametrize("previous", ["true", "1 for true"])
@pytest.mark.parametrize("name", ITEMS)
def test_an_item_decodes_as_json_loads_whatever_came_before(previous: str, name: str) -> None:
    """The conversation's last body had ``previous`` there; the next has ``name``: the same
    values or the same 400 as a full decode (bytes, not values, decide what is reused)."""
    resumer = Resumer()
    assert _decoded(_padded(ITEMS[previous]), resumer) == _reference(_padded(ITEMS[previous]))
    raw = _padded(ITEMS[name])
    assert _decoded(raw, resumer) == _reference(raw)
    assert _decoded(raw, resumer) == _reference(raw)  # and once more, from itself


def test_a_changed_item_is_decoded_again_and_later_ones_too() -> None:
    resumer = Resumer()
    decode_json_body(_padded(ITEMS["true"]), resumer=resumer)
    assert resumer.reused_items == 0
    body = decode_json_body(_padded(ITEMS["1 for true"]), resumer=resumer)
    assert resumer.reused_items == 2  # the first two messages; the third's bytes changed
    assert body["messages"][2]["flag"] == 1 and body["messages"][2]["flag"] is not True


def test_decoded_bodies_remembered_are_bounded() -> None:
    resumer = Resumer(capacity=2)
    firsts = [b'{"role": "user", "content": "start %d"}' % i for i in range(3)]
    for first in firsts:
        decode_json_body(_padded(ITEMS["true"], first=first), resumer=resumer)
    decode_json_body(_padded(ITEMS["true"], first=firsts[0]), resumer=resumer)
    assert resumer.reused_items == 0  # the oldest was forgotten
    decode_json_body(_padded(ITEMS["true"], first=firsts[2]), resumer=resumer)
    assert resumer.reused_items == 3


def test_conversations_that_open_alike_each_reuse_their_own_items(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Agents that start from the same task (the same prompt sent again, sub-agents) share their
    first message and then diverge: each one's next turn must reuse its own last body, not
    lose it to the others' turns (they used to take one memory slot per first message)."""
    monkeypatch.setattr(frontend_body, "ITEMWISE_BYTES", 0)
    sessions = [claude_code_bodies(8) for _ in range(ALIKE)]
    assert len({json.dumps(s[-1]["messages"][0]) for s in sessions}) == 1  # they open alike
    assert len({json.dumps(s[-1]["messages"][1]) for s in sessions}) == ALIKE  # then diverge
    resumer = Resumer()
    for session in sessions:
        decode_json_body(json.dumps(session[2]).encode(), resumer=resumer)
    for turn in range(3, 8):
        for session in sessions:  # interleaved, as concurrent clients send them
            raw = json.dumps(session[turn]).encode()
            before = resumer.reused_items
            assert repr(decode_json_body(raw, resumer=resumer)) == repr(json.loads(raw))
            repeated = len(session[turn - 1]["messages"]) - BACK  # Claude Code rewrites its last
            assert resumer.reused_items - before >= repeated


def _conversation(n: int) -> bytes:
    """Five messages past :data:`ITEMWISE_BYTES`: the same two, then three of conversation
    ``n`` (more than :data:`BACK`: a body that repeats all but its last two items is the same
    conversation's next turn)."""
    own = json.dumps({"role": "user", "content": f"conversation {n}"}).encode()
    return _padded(b", ".join([own] * 3))


def test_conversations_that_open_alike_are_bounded_by_the_capacity() -> None:
    resumer = Resumer(capacity=3)
    bodies = [_conversation(n) for n in range(4)]
    for raw in bodies:  # one more conversation than are kept
        decode_json_body(raw, resumer=resumer)
    before = resumer.reused_items
    decode_json_body(bodies[0], resumer=resumer)
    assert resumer.reused_items - before == 2  # its own went: only the shared two are found
    before = resumer.reused_items
    decode_json_body(bodies[-1], resumer=resumer)
    assert resumer.reused_items - before == 5


def test_small_bodies_are_decoded_whole() -> None:
    resumer = Resumer()
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    for _ in range(2):
        assert decode_json_body(raw, resumer=resumer) == json.loads(raw)
    assert resumer.reused_items == 0


def test_a_body_not_an_object_is_refused_as_before() -> None:
    raw = b"[" + json.dumps({"content": "x" * ITEMWISE_BYTES}).encode() + b"]"
    with pytest.raises(FrontendError) as err:
        decode_json_body(raw, resumer=Resumer())
    assert err.value.code == "invalid_type"
    body = copy.deepcopy(json.loads(_padded(ITEMS["true"])))
    body["messages"] = "text"
    raw = json.dumps(body).encode()
    assert decode_json_body(raw, resumer=Resumer()) == body

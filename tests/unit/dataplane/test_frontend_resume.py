"""A body that repeats the last one's start parses only its new items, into what a full parse gives.

Every case parses a sequence of bodies, as a session sends them, once with a shared ``Resumer`` and
once without; each resumed ``ParsedRequest`` (messages, tools, ignored fields...) must equal the
full parse, and the resumed run must have resumed (so the test fails if resuming silently stops).
Refusals must stay the same: a body whose repeated start changed (a type, a key order, a value
that only ``==`` calls equal) is parsed again and answers the full parse's error.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Final

import pytest

from kvretention.dataplane.frontend.anthropic import parse_messages
from kvretention.dataplane.frontend.common import ParsedRequest
from kvretention.dataplane.frontend.openai import parse_chat
from kvretention.dataplane.frontend.resume import HEAD_BYTES, Resumer
from kvretention.hints.errors import ClientError
from kvretention.replay.sessions import claude_code_session
from support.agent_sessions import (
    Body,
    Session,
    agent_sessions,
    claude_code_bodies,
)


def _chat_session(turns: int) -> list[Body]:
    """A Chat Completions agent session: each body resends the last and adds a tool turn."""
    tools = [
        {
            "type": "function",
            "function": {"name": "read", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    messages: list[Body] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": [{"type": "text", "text": "fix the bug"}]},
    ]
    bodies: list[Body] = []
    for t in range(turns):
        bodies.append({"model": "m", "messages": copy.deepcopy(messages), "tools": tools})
        call = {"id": f"c{t}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "r"},
            {"role": "tool", "tool_call_id": f"c{t}", "content": f"file {t}", "name": "read"},
        ]
    return bodies


def _with_breakpoint(bodies: list[Body]) -> list[Body]:
    """Chat bodies with a breakpoint on the newest user part, moving with each turn."""
    out = []
    for body in bodies:
        body = copy.deepcopy(body)
        body["messages"].append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "go on",
                        "prompt_cache_breakpoint": {"mode": "explicit"},
                    }
                ],
            }
        )
        out.append(body)
    return out


SESSIONS: Final[dict[str, Session]] = {
    **agent_sessions(6),
    "chat": (parse_chat, lambda: _chat_session(6)),
    "chat-breakpoints": (parse_chat, lambda: _with_breakpoint(_chat_session(6))),
}


@pytest.mark.parametrize("name", SESSIONS)
def test_each_turn_resumed_equals_a_full_parse(name: str) -> None:
    parse, session = SESSIONS[name]
    resumer = Resumer()
    bodies = session()
    for body in bodies:
        expected = parse(copy.deepcopy(body))
        assert parse(copy.deepcopy(body), resumer=resumer) == expected
    assert resumer.resumed_items > 0


@pytest.mark.parametrize("name", SESSIONS)
def test_a_body_repeated_resumes_to_the_same_request(name: str) -> None:
    parse, session = SESSIONS[name]
    resumer = Resumer()
    body = session()[-1]
    first = parse(copy.deepcopy(body), resumer=resumer)
    assert parse(copy.deepcopy(body), resumer=resumer) == first == parse(copy.deepcopy(body))


def _claude_turns() -> tuple[Body, Body]:
    bodies = claude_code_bodies(4)
    return bodies[-2], bodies[-1]


def _first_tool_use(body: Body) -> Body:
    for message in body["messages"]:
        if message["role"] == "assistant" and isinstance(message["content"], list):
            for block in message["content"]:
                if block["type"] == "tool_use":
                    return block
    raise AssertionError("no tool_use")


def _first_tool_result(body: Body) -> Body:
    for message in body["messages"]:
        if isinstance(message["content"], list):
            for block in message["content"]:
                if block["type"] == "tool_result":
                    return block
    raise AssertionError("no tool_result")


def _is_error_one(body: Body) -> None:
    _first_tool_result(body)["is_error"] = 1  # == True, but not a boolean


def _input_reordered(body: Body) -> None:
    block = _first_tool_use(body)
    block["input"] = {"extra": 1.0, **block["input"]}


def _input_float(body: Body) -> None:
    _first_tool_use(body)["input"]["n"] = 1.0  # == 1, written differently


CHANGES: Final[dict[str, Callable[[Body], None]]] = {
    "is_error 1 instead of true": _is_error_one,
    "tool input keys reordered": _input_reordered,
    "a float that equals an int": _input_float,
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_start_is_parsed_again(change: str) -> None:
    """The previous turn had ``true`` / ``1``; the next one changes an early item so that ``==``
    still holds: it must be parsed, not resumed."""
    previous, last = _claude_turns()
    _first_tool_result(previous)["is_error"] = True
    _first_tool_use(previous)["input"]["n"] = 1
    _first_tool_use(last)["input"]["n"] = 1
    _first_tool_result(last)["is_error"] = True
    CHANGES[change](last)
    resumer = Resumer()
    parse_messages(copy.deepcopy(previous), resumer=resumer)
    try:
        expected: ParsedRequest | ClientError = parse_messages(copy.deepcopy(last))
    except ClientError as exc:
        expected = exc
    try:
        got: ParsedRequest | ClientError = parse_messages(copy.deepcopy(last), resumer=resumer)
    except ClientError as exc:
        got = exc
    if isinstance(expected, ClientError):
        assert isinstance(got, ClientError)
        assert (got.param, got.message) == (expected.param, expected.message)
    else:
        assert got == expected
        arguments = [c.arguments for m in got.messages for c in m.tool_calls]
        assert any(json.loads(a).get("n") == 1 for a in arguments)


def test_a_new_tool_list_is_parsed_again() -> None:
    """A tool result names its tool from the tool list: new tools, new parse."""
    previous, last = _claude_turns()
    resumer = Resumer()
    parse_messages(copy.deepcopy(previous), resumer=resumer)
    resumed = resumer.resumed_items
    last = copy.deepcopy(last)
    last["tools"] = last["tools"][:-1]
    assert parse_messages(copy.deepcopy(last), resumer=resumer) == parse_messages(last)
    assert resumer.resumed_items == resumed


def _early_breakpoint(bodies: list[Body], *, ttl: str | None = None) -> list[Body]:
    """Chat bodies with a breakpoint on the first user part (a stable head), as
    ``prompt_cache_options`` clients mark it."""
    out = []
    for body in bodies:
        body = copy.deepcopy(body)
        body["messages"][1]["content"][0]["prompt_cache_breakpoint"] = {"mode": "explicit"}
        if ttl is not None:
            body["prompt_cache_options"] = {"ttl": ttl}
        out.append(body)
    return out


def test_a_stable_early_breakpoint_still_resumes() -> None:
    resumer = Resumer()
    for body in _early_breakpoint(_chat_session(4)):
        assert parse_chat(copy.deepcopy(body), resumer=resumer) == parse_chat(body)
    assert resumer.resumed_items > 0


def test_the_same_items_with_other_breakpoints_are_parsed_again() -> None:
    """Breakpoints come from the whole body (and the fleet's settings): the same items marked
    differently (here: hints off) resume only up to the first item whose marks changed."""
    body = _early_breakpoint(_chat_session(4))[-1]
    resumer = Resumer()
    parse_chat(copy.deepcopy(body), resumer=resumer)
    parsed = parse_chat(copy.deepcopy(body), hints=False, resumer=resumer)
    assert parsed == parse_chat(body, hints=False)
    assert resumer.resumed_items <= 1  # at most the system message, before the breakpoint
    assert all(isinstance(m.content, str) for m in parsed.messages)  # no retain_ttl part


def test_conversations_remembered_are_bounded() -> None:
    resumer = Resumer(capacity=3)
    bodies = _chat_session(3)
    for n in range(5):  # five conversations, each its own first message
        for body in bodies:
            body = copy.deepcopy(body)
            body["messages"][0]["content"] = f"agent {n}"
            parse_chat(body, resumer=resumer)
        assert len(resumer) == min(n + 1, 3)
    body = copy.deepcopy(bodies[-1])
    body["messages"][0]["content"] = "agent 4"
    resumed = resumer.resumed_items
    parse_chat(body, resumer=resumer)  # the newest is still there
    assert resumer.resumed_items > resumed


def test_growing_conversations_round_robin_each_hold_one_entry() -> None:
    """Claude Code moves its newest breakpoint, so each turn rewrites the last turn's last
    item; the new turn still supersedes the last one. As many conversations as the memory holds,
    served in turn (as concurrent clients are), each resume every turn after their first."""
    capacity = 4
    resumer = Resumer(capacity=capacity)
    sessions = [claude_code_session(turns=6, marker=f"agent {n}")[1:] for n in range(capacity)]
    for turn in range(6):
        resumed = resumer.resumed_items
        for session in sessions:
            body = session[turn][1]
            parsed = parse_messages(copy.deepcopy(body), resumer=resumer)
            assert parsed == parse_messages(copy.deepcopy(body))
        assert len(resumer) == capacity
        if turn:  # every conversation resumed its last turn
            assert (
                resumer.resumed_items - resumed
                >= capacity * len(session[turn - 1][1]["messages"]) - capacity * 2
            )


def test_conversations_that_open_alike_each_resume_their_own_last_turn() -> None:
    """Sub-agents started from one task share its message and then diverge; served in turn,
    each resumes its own last turn, however many there are (4 per first message were kept)."""
    sessions = [claude_code_bodies(6) for _ in range(12)]
    assert len({json.dumps(s[-1]["messages"][0]) for s in sessions}) == 1
    resumer = Resumer()
    for turn in range(6):
        resumed = resumer.resumed_items
        for session in sessions:
            body = session[turn]
            parsed = parse_messages(copy.deepcopy(body), resumer=resumer)
            assert parsed == parse_messages(copy.deepcopy(body))
        if turn:
            repeated = sum(len(s[turn - 1]["messages"]) - 2 for s in sessions)
            assert resumer.resumed_items - resumed >= repeated


def test_a_claude_code_turn_is_known_to_resume_though_its_billing_header_changed() -> None:
    """Claude Code's first system block (``x-anthropic-billing-header: cc_version=...;
    cch=...;``) changes on every request: the scheduling guess must look past it, or every turn
    of a conversation is handed to the parse thread as if it were new."""
    session = claude_code_session(turns=6)
    first, second = (json.dumps(body).encode() for _, body in session[-2:])
    assert first[:HEAD_BYTES] != second[:HEAD_BYTES]  # the header did change
    resumer = Resumer().scoped("team-a")
    resumer.parsed(first)
    assert resumer.resumes(second)
    other = json.loads(second)
    other["system"][1]["text"] = "Another agent entirely."
    assert not resumer.resumes(json.dumps(other).encode())
    assert not Resumer().scoped("team-b").resumes(second)

"""The walks over the neutral conversation that remember a conversation's last request
(``frontend/repeats.py``): the prefix chain and the breakpoint markers equal a walk from scratch
on every turn of a session, whatever the turn changed, kept or dropped."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Final

import pytest

from kvretention.dataplane.breakpoints import find_markers
from kvretention.dataplane.frontend import affinity
from kvretention.dataplane.frontend.affinity import prefix_chain
from kvretention.dataplane.frontend.repeats import (
    MIN_ELEMENTS,
    Walks,
    common_prefix,
    conversation_markers,
)
from kvretention.dataplane.frontend.upstream import router_body
from kvretention.dataplane.protocol import (
    ChatMessage,
    PreprocessedRequest,
    TextPart,
    ToolCall,
    ToolDefinition,
)


@pytest.mark.parametrize("n", [0, 1, 2, 5, 40])
def test_common_prefix_finds_the_first_difference_anywhere(n: int) -> None:
    base = list(range(n))
    assert common_prefix(base, list(base)) == n
    assert common_prefix(base, [*base, 7]) == n
    assert common_prefix([*base, 7], base) == n
    for at in range(n):
        changed = [*base[:at], -1, *base[at + 1 :]]
        assert common_prefix(base, changed) == at
        assert common_prefix(changed, base[: at + 1]) == at


ALIKE: Final = 16
"""Conversations that open with the same message object (sub-agents of one task)."""


@pytest.mark.parametrize("n", [20, 400])
def test_common_prefix_of_lists_that_differ_early_or_late(n: int) -> None:
    base = [f"item {i}" for i in range(n)]
    for at in (0, 1, 3, 7, 8, 9, n // 2, n - 2, n - 1):
        changed = [*base[:at], "other", *base[at + 1 :]]
        assert common_prefix(base, changed) == at
        for upto in (0, 1, at, at + 1, n):
            assert common_prefix(base, changed, upto) == min(at, upto)
            assert common_prefix(base, base, upto) == upto


def test_conversations_that_open_alike_each_find_their_own_walk() -> None:
    """Each next turn repeats its own conversation's last walk, however many open alike; a
    conversation's new walk takes its last one's place."""
    task = _message(0)
    conversations = [
        [task, *(_message(i) for i in range(1, MIN_ELEMENTS + 1))] for _ in range(ALIKE)
    ]
    walks: Walks[int] = Walks(capacity=ALIKE)
    for history in conversations:  # the first turns: only the task is shared
        same, after, ids = walks.repeated(history, context=None)
        assert same <= 1
        walks.keep(history, ids, [*after, *range(same, len(history))], context=None)
    for _ in range(3):
        for history in conversations:  # interleaved, as concurrent agents send them
            history.append(_message(len(history)))
            same, after, ids = walks.repeated(history, context=None)
            assert same == len(history) - 1
            assert after == list(range(same))
            walks.keep(history, ids, [*after, *range(same, len(history))], context=None)
            assert len(walks) == ALIKE


def test_walks_are_bounded_by_their_capacity() -> None:
    task = _message(0)
    conversations = [[task, *(_message(i) for i in range(1, MIN_ELEMENTS + 1))] for _ in range(4)]
    walks: Walks[int] = Walks(capacity=3)
    for history in conversations:
        same, after, ids = walks.repeated(history, context=None)
        walks.keep(history, ids, [*after, *range(same, len(history))], context=None)
    assert len(walks) == 3
    assert walks.repeated(conversations[0], context=None)[0] == 1  # forgotten: only the task
    assert walks.repeated(conversations[-1], context=None)[0] == MIN_ELEMENTS + 1


def _message(i: int, *, ttl: int | None = None) -> ChatMessage:
    if i % 3 == 0:
        return ChatMessage(role="user", content=[TextPart(text=f"ask {i}", retain_ttl=ttl)])
    if i % 3 == 1:
        call = ToolCall(id=f"c{i}", name="bash", arguments="{}", retain_ttl=ttl)
        return ChatMessage(role="assistant", content=f"on it {i}", tool_calls=[call])
    return ChatMessage(role="tool", content=f"ran {i}", tool_call_id=f"c{i - 1}", retain_ttl=ttl)


SYSTEM: Final = ChatMessage(role="system", content="You are a coding agent.")
TOOLS: Final = [ToolDefinition(name="bash", parameters={"type": "object"}, retain_ttl=300)]
Turns = list[list[ChatMessage]]


def _growing() -> Turns:
    """Each turn the same objects, then two new messages; the newest carries the breakpoint,
    so the last turn's newest message comes back as a new object without it."""
    history: list[ChatMessage] = []
    turns = []
    for t in range(60):
        history = (
            [*history[:-1], _message(2 * t - 1), _message(2 * t)] if history else [_message(0)]
        )
        history[-1] = _message(len(history) - 1, ttl=3600)
        turns.append([SYSTEM.model_copy(), *history])
    return turns


def _edited_early() -> Turns:
    turns = _growing()[-3:]
    edited = list(turns[-1])
    edited[3] = _message(99, ttl=60)
    return [*turns, edited, turns[-1]]


def _equal_copies() -> Turns:
    """The same values as new objects: equal, so remembered results still apply."""
    last = _growing()[-1]
    return [last, [m.model_copy() for m in last]]


def _shorter() -> Turns:
    turns = _growing()
    return [turns[-1], turns[20], turns[-1][:5], []]


def _another_head() -> Turns:
    last = _growing()[-1]
    other = ChatMessage(role="system", content="Another agent.")
    return [last, [other, *last[1:]], last[1:], last]


def _opening_alike() -> Turns:
    """Six conversations from one task message (the same object: the decode shares it), each
    growing its own, their turns interleaved; one then edits an early message."""
    task = _message(0)
    conversations = [[task, *(_message(i + 100 * c) for i in range(1, 20))] for c in range(6)]
    turns = []
    for t in range(4):
        for history in conversations:
            history += [_message(1000 + t), _message(1001 + t, ttl=60)]
            turns.append([SYSTEM.model_copy(), *history])
    turns.append([SYSTEM, *conversations[2][:5], _message(7), *conversations[2][6:]])
    return [*turns, [SYSTEM, *conversations[2]]]


SESSIONS: Final[dict[str, Callable[[], Turns]]] = {
    "growing": _growing,
    "conversations that open alike": _opening_alike,
    "an early message edited": _edited_early,
    "equal copies": _equal_copies,
    "shorter, then empty": _shorter,
    "another head, then none": _another_head,
}


def _chain_from_scratch(messages: list[ChatMessage], tools: list[ToolDefinition]) -> list[str]:
    head = 0
    while head < len(messages) and messages[head].role in ("system", "developer"):
        head += 1
    hasher = hashlib.blake2b(affinity._head_bytes(messages[:head], tools), digest_size=8)
    chain = [hasher.hexdigest()]
    rest = messages[head:]
    for i, message in enumerate(rest, start=1):
        hasher = hasher.copy()
        hasher.update(b"\x1d" + affinity._message_bytes(message))
        if i < affinity.FULL_CHAIN_BLOCKS or i % affinity.CHAIN_STRIDE == 0 or i == len(rest):
            chain.append(hasher.hexdigest())
    return chain


@pytest.mark.parametrize("session", SESSIONS)
def test_each_turns_prefix_chain_equals_one_from_scratch(session: str) -> None:
    for tools in (TOOLS, []):
        for messages in SESSIONS[session]():
            assert prefix_chain(messages, tools) == _chain_from_scratch(messages, tools)


@pytest.mark.parametrize("session", SESSIONS)
def test_each_turns_markers_equal_a_full_walk(session: str) -> None:
    turns = SESSIONS[session]()
    assert any(find_markers(m, TOOLS)[1:] for m in turns)
    for tools in (TOOLS, []):
        for messages in turns:
            assert conversation_markers(messages, tools) == find_markers(messages, tools)


def _billing(text: str) -> ChatMessage:
    return ChatMessage(role="system", content=f"{affinity.BILLING_HEADER} cch=1;\n{text}")


def _billing_mid_way() -> Turns:
    """A billing line in the leading system message each turn, then one turn adds a system
    message with one after the history (kept in the next turns)."""
    turns = _growing()[-4:]
    with_head = [[_billing("You are a coding agent."), *t[1:]] for t in turns]
    late = [*with_head[-2], _billing("late")]
    return [*with_head[:2], late, [*late, _message(500)], with_head[-1]]


@pytest.mark.parametrize("session", [*SESSIONS, "billing mid-way"])
def test_each_turns_billing_header_drop_equals_a_full_walk(session: str) -> None:
    turns = _billing_mid_way() if session == "billing mid-way" else SESSIONS[session]()
    for messages in turns:
        assert affinity.drop_billing_header(messages) == affinity._drop_billing_header(messages)


def test_an_equal_message_that_is_not_the_same_object_is_walked_again() -> None:
    """``True == 1``: a message equal to the last walk's but built apart is walked, not taken."""
    history = [_message(i) for i in range(20)]  # past MIN_ELEMENTS: remembered
    as_int = ChatMessage.model_construct(role="tool", content="ran", retain_ttl=1)
    as_bool = ChatMessage.model_construct(role="tool", content="ran", retain_ttl=True)
    assert as_int == as_bool
    for messages in ([SYSTEM, *history, as_int], [SYSTEM, *history, as_bool]):
        assert repr(conversation_markers(messages, [])) == repr(find_markers(messages, []))


@pytest.mark.parametrize("session", [*SESSIONS, "billing mid-way"])
def test_each_turns_router_body_equals_a_full_serialization(session: str) -> None:
    turns = _billing_mid_way() if session == "billing mid-way" else SESSIONS[session]()
    for messages in turns:
        request = PreprocessedRequest(request_id="r", model="m", messages=messages, tools=TOOLS)
        fresh = request.model_copy(update={"messages": [m.model_copy() for m in messages]})
        assert router_body(request) == fresh.to_json_bytes()
    assert router_body(PreprocessedRequest(request_id="r", model="m", token_ids=[1])) == (
        PreprocessedRequest(request_id="r", model="m", token_ids=[1]).to_json_bytes()
    )


SCHEMAS: Final[list[dict[str, object]]] = [
    {"type": "object", "default": 1},
    {"type": "object", "default": True},
    {"type": "object", "default": 1.0},
    {"type": "object", "default": None},
    {"type": "object", "default": float("nan")},
    {"type": "object", "default": float("inf")},
    {"type": "object", "default": -0.0},
    {"type": "object", "default": 0.0},
    {"default": 1, "type": "object"},
    {"type": "object", "default": 2**70},
    {"type": "object", "default": "\ud800"},
]


def test_a_remembered_tool_schema_text_is_json_dumps_of_that_schema() -> None:
    """Schemas equal under ``==`` or written alike by msgspec (NaN as null) keep their own text."""
    for _ in range(2):
        for schema in SCHEMAS:
            assert affinity._schema_text(schema) == json.dumps(schema, sort_keys=True)

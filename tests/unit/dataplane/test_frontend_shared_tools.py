"""A conversation's tools decoded and parsed once (``Resumer.decode`` shares a ``tools`` list
between bodies of one tenant with the same bytes; ``Resumer.derived`` keeps the Chat parse of
it): every body still decodes and parses as a body decoded whole, ignored fields and errors
included, and the prefix chain's head is the same as computed from scratch."""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec
import pytest

from kvretention.dataplane.frontend import affinity
from kvretention.dataplane.frontend.body import ITEMWISE_BYTES, decode_json_body
from kvretention.dataplane.frontend.errors import FrontendError
from kvretention.dataplane.frontend.openai import parse_chat
from kvretention.dataplane.frontend.resume import Resumer
from kvretention.dataplane.frontend.upstream import router_body
from kvretention.dataplane.protocol import (
    ChatMessage,
    PreprocessedRequest,
    ToolDefinition,
    ToolGrammar,
)
from kvretention.hints.errors import ClientError

PAD: Final = "x" * ITEMWISE_BYTES  # every body below is decoded item by item


def _tool(name: str, **extra: Any) -> dict[str, Any]:
    function = {
        "name": name,
        "description": f"the {name} tool",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        **extra,
    }
    return {"type": "function", "function": function}


TOOLS: Final = [_tool("read"), _tool("write")]


def _body(turn: int, tools: Any = TOOLS) -> bytes:
    messages = [{"role": "user", "content": PAD}]
    for i in range(turn):
        messages += [
            {"role": "assistant", "content": f"answer {i}"},
            {"role": "user", "content": f"question {i}"},
        ]
    return json.dumps({"model": "m", "messages": messages, "tools": tools}).encode()


def _parse(raw: bytes, resumer: Resumer | None, scope: str | None = None) -> tuple[Any, list[str]]:
    scoped = None if resumer is None else resumer.scoped(scope)
    body = decode_json_body(raw, resumer=scoped)
    parsed = parse_chat(body, resumer=scoped)
    return parsed, list(parsed.ignored)


def test_same_tools_bytes_decode_and_parse_once_per_tenant() -> None:
    resumer = Resumer()
    first = decode_json_body(_body(1), resumer=resumer.scoped("a"))
    second = decode_json_body(_body(2), resumer=resumer.scoped("a"))
    other = decode_json_body(_body(2), resumer=resumer.scoped("b"))
    assert first["tools"] is second["tools"]
    assert other["tools"] is not first["tools"]  # another tenant never shares a decoded value
    assert other["tools"] == first["tools"] == json.loads(_body(1))["tools"]

    made: list[object] = []

    def make(values: Any) -> tuple[int]:
        made.append(values)
        return (len(values),)

    assert resumer.derived(first["tools"], "t", make) == (2,)
    assert resumer.derived(second["tools"], "t", make) == (2,)
    assert len(made) == 1
    assert resumer.derived(list(first["tools"]), "t", make) == (2,)  # not shared: made again
    assert len(made) == 2
    # the Chat parse of a shared list is made once: the same definitions on the next turn
    one, _ = _parse(_body(3), resumer, scope="a")
    two, _ = _parse(_body(4), resumer, scope="a")
    three, _ = _parse(_body(4), resumer, scope="b")
    assert all(a is b for a, b in zip(one.tools, two.tools, strict=True))
    assert not any(a is b for a, b in zip(one.tools, three.tools, strict=True))


def _max_items(value: object) -> dict[str, Any]:
    parameters = {"type": "object", "maxItems": value}
    return {"type": "function", "function": {"name": "w", "parameters": parameters}}


def _reordered(tool: dict[str, Any]) -> dict[str, Any]:
    return {"function": tool["function"], "type": tool["type"]}


@pytest.mark.parametrize(
    ("name", "tools"),
    [
        ("number written 1.0", [_tool("read", strict=None), _max_items(1.0)]),
        ("number written 1", [_tool("read", strict=None), _max_items(1)]),
        ("true for strict", [_tool("read", strict=True), _tool("write")]),
        ("keys in another order", [_reordered(_tool("read")), _tool("write")]),
        ("one tool less", [_tool("read")]),
        ("an unknown key, ignored", [_tool("read", cache_control={"t": "e"}), _tool("write")]),
        ("no tools", []),
    ],
)
def test_every_turn_parses_as_a_whole_decode(name: str, tools: list[Any]) -> None:
    """Each body after the same earlier ones gives the tools, ignored fields and dumps of a
    body parsed with no memory at all."""
    resumer = Resumer()
    sequence = [_body(1), _body(2, tools), _body(3), _body(4, tools), _body(5, tools)]
    for raw in sequence:
        parsed, ignored = _parse(raw, resumer)
        expected, expected_ignored = _parse(raw, None)
        assert _typed(parsed.tools) == _typed(expected.tools), name
        assert ignored == expected_ignored, name
        assert parsed == expected, name
        affinity._TOOLS.clear()
        fresh = affinity.prefix_chain(expected.messages, expected.tools)
        assert affinity.prefix_chain(parsed.messages, parsed.tools) == fresh, name
        assert affinity.prefix_chain(parsed.messages, parsed.tools) == fresh, name  # remembered


def _typed(tools: list[Any]) -> bytes:
    """The tools' JSON, which tells ``1``, ``1.0`` and ``true`` apart (``==`` does not)."""
    return msgspec.json.encode([t.model_dump() for t in tools])


def test_equal_but_differently_written_tools_are_not_shared() -> None:
    """``1``, ``1.0`` and ``true`` compare equal in Python: each body still gets its own."""
    resumer = Resumer()
    for value in (1, 1.0, True, 1, 1.0):
        tools = [_max_items(value)]
        parsed, _ = _parse(_body(2, tools), resumer)
        expected, _ = _parse(_body(2, tools), None)
        assert _typed(parsed.tools) == _typed(expected.tools), value
        assert json.dumps(parsed.tools[0].parameters["maxItems"]) == json.dumps(value)


def test_ignored_tool_fields_are_counted_on_every_turn() -> None:
    resumer = Resumer()
    tools = [_tool("read", cache_control={"type": "ephemeral"})]
    counted = [_parse(_body(turn, tools), resumer)[1] for turn in (1, 2, 3)]
    assert counted[0] == counted[1] == counted[2]
    assert any("cache_control" in label for label in counted[0])


def test_a_refused_tools_list_is_refused_on_every_turn() -> None:
    resumer = Resumer()
    tools = [_tool("read"), _tool("read")]  # a name used twice
    for turn in (1, 2, 3):
        with pytest.raises((ClientError, FrontendError), match="used twice"):
            _parse(_body(turn, tools), resumer)


def test_an_edited_tool_changes_the_chain_head() -> None:
    resumer = Resumer()
    before, _ = _parse(_body(1), resumer)
    write = _tool("write")
    edited = [_tool("read"), {**write, "function": {**write["function"], "description": "new"}}]
    after, _ = _parse(_body(2, edited), resumer)
    chain_before = affinity.prefix_chain(before.messages, before.tools)
    chain_after = affinity.prefix_chain(after.messages, after.tools)
    assert chain_before[0] != chain_after[0]


GRAMMAR: Final = ToolGrammar(syntax="regex", definition="[a-z]+")


@pytest.mark.parametrize(
    "tools",
    [
        [ToolDefinition(name="a", parameters={"type": "object", "x": 1.0}, strict=True)],
        [ToolDefinition(name="a", description=None, parameters=None, retain_ttl=300)],
        [ToolDefinition(kind="custom", name="c", grammar=GRAMMAR), ToolDefinition(name="d")],
        [],
    ],
    ids=["function", "breakpoint on a tool", "custom and plain", "none"],
)
@pytest.mark.parametrize("messages", [True, False], ids=["messages", "token ids"])
def test_router_body_with_remembered_tool_dumps_is_the_full_serialization(
    tools: list[ToolDefinition], messages: bool
) -> None:
    deferred = [ToolDefinition(name="later", description="deferred")]
    fields: dict[str, Any] = (
        {"messages": [ChatMessage(role="user", content="hi")]} if messages else {"token_ids": [1]}
    )
    for _ in range(2):  # the second time from the remembered dumps
        request = PreprocessedRequest(
            request_id="r", model="m", tools=tools, deferred_tools=deferred, **fields
        )
        assert router_body(request) == request.to_json_bytes()
        assert (
            router_body(request)
            == request.model_dump_json(exclude_none=True, by_alias=True).encode()
        )


def test_parsed_turns_router_bodies_equal_full_serializations() -> None:
    resumer = Resumer()
    for turn in (1, 2, 3):
        parsed, _ = _parse(_body(turn), resumer)
        request = PreprocessedRequest(
            request_id="r", model="m", messages=parsed.messages, tools=parsed.tools
        )
        fresh = request.model_copy(update={"tools": [t.model_copy() for t in parsed.tools]})
        assert router_body(request) == fresh.to_json_bytes()

"""A Messages conversation's tools parsed once per shared ``tools`` list and breakpoints on the
tools (``anthropic.tools.shared_tool_lists``): every body still parses as one with no memory at
all (tools, deferred tools, their breakpoint TTLs, ignored fields and errors), and the prefix
chain and router body are the ones computed from scratch."""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec
import pytest

from kvretention.dataplane.frontend import affinity
from kvretention.dataplane.frontend.anthropic import parse_messages
from kvretention.dataplane.frontend.body import ITEMWISE_BYTES, decode_json_body
from kvretention.dataplane.frontend.errors import FrontendError
from kvretention.dataplane.frontend.resume import Resumer
from kvretention.dataplane.frontend.upstream import router_body
from kvretention.dataplane.protocol import PreprocessedRequest
from kvretention.hints.errors import ClientError

PAD: Final = "x" * ITEMWISE_BYTES  # every body below is decoded item by item
CONTROL: Final = {"type": "ephemeral", "ttl": "1h"}


def _tool(name: str, **extra: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    return {"name": name, "description": f"the {name} tool", "input_schema": schema, **extra}


TOOLS: Final = [_tool("Read"), _tool("Write")]


def _body(turn: int, tools: Any = TOOLS) -> bytes:
    messages: list[dict[str, Any]] = [{"role": "user", "content": PAD}]
    for i in range(turn):
        messages += [
            {"role": "assistant", "content": f"answer {i}"},
            {"role": "user", "content": [{"type": "text", "text": f"question {i}"}]},
        ]
    messages[-1]["content"][-1]["cache_control"] = dict(CONTROL)
    body = {"model": "m", "max_tokens": 8, "messages": messages, "tools": tools}
    return json.dumps(body).encode()


def _parse(raw: bytes, resumer: Resumer | None) -> Any:
    scoped = None if resumer is None else resumer.scoped(None)
    return parse_messages(decode_json_body(raw, resumer=scoped), resumer=scoped)


def _typed(tools: list[Any]) -> bytes:
    """The tools' JSON, which tells ``1``, ``1.0`` and ``true`` apart (``==`` does not)."""
    return msgspec.json.encode([t.model_dump() for t in tools])


def test_a_shared_tools_list_is_parsed_once() -> None:
    resumer = Resumer()
    one, two = _parse(_body(1), resumer), _parse(_body(2), resumer)
    assert all(a is b for a, b in zip(one.tools, two.tools, strict=True))
    fresh = _parse(_body(2), None)
    assert not any(a is b for a, b in zip(fresh.tools, two.tools, strict=True))


@pytest.mark.parametrize(
    ("name", "tools"),
    [
        ("a breakpoint on a tool", [_tool("Read"), _tool("Write", cache_control=CONTROL)]),
        ("a breakpoint on the first tool", [_tool("Read", cache_control=CONTROL), _tool("W")]),
        ("a deferred tool", [_tool("Read"), _tool("Write", defer_loading=True)]),
        ("an ignored key", [_tool("Read", input_examples=[{"path": "a"}]), _tool("Write")]),
        ("strict", [_tool("Read", strict=True), _tool("Write")]),
        ("number written 1.0", [_tool("Read", input_schema={"type": "object", "maxItems": 1.0})]),
        ("number written 1", [_tool("Read", input_schema={"type": "object", "maxItems": 1})]),
        ("one tool less", [_tool("Read")]),
        ("no tools", []),
    ],
)
def test_every_turn_parses_as_a_whole_parse(name: str, tools: list[Any]) -> None:
    """Each body after the same earlier ones (the same tool bytes with and without breakpoints
    between them) gives the tools, deferred tools, ignored fields, chain and router body of a
    body parsed with no memory at all."""
    resumer = Resumer()
    sequence = [_body(1), _body(2, tools), _body(3), _body(4, tools), _body(5, tools)]
    for raw in sequence:
        parsed = _parse(raw, resumer)
        expected = _parse(raw, None)
        assert _typed(parsed.tools) == _typed(expected.tools), name
        assert _typed(parsed.deferred_tools) == _typed(expected.deferred_tools), name
        assert parsed.ignored == expected.ignored, name
        assert parsed == expected, name
        affinity._TOOLS.clear()
        fresh = affinity.prefix_chain(expected.messages, expected.tools)
        assert affinity.prefix_chain(parsed.messages, parsed.tools) == fresh, name
        request = PreprocessedRequest(
            request_id="r", model="m", messages=parsed.messages, tools=parsed.tools,
            deferred_tools=parsed.deferred_tools,
        )  # fmt: skip
        assert router_body(request) == request.to_json_bytes(), name


def test_the_same_tool_bytes_with_other_breakpoints_get_their_own_ttls() -> None:
    """The tools' bytes hold their own ``cache_control``, so breakpoints on the tools change
    with them; the parse is still kept per breakpoints on the tools, never shared across."""
    resumer = Resumer()
    marked = [_tool("Read", cache_control=CONTROL)]
    for tools in (marked, [_tool("Read")], marked):
        parsed = _parse(_body(2, tools), resumer)
        assert _typed(parsed.tools) == _typed(_parse(_body(2, tools), None).tools)


def test_a_refused_tools_list_is_refused_on_every_turn() -> None:
    resumer = Resumer()
    tools = [_tool("Read"), _tool("Read")]  # a name used twice
    for turn in (1, 2, 3):
        with pytest.raises((ClientError, FrontendError), match="unique"):
            _parse(_body(turn, tools), resumer)


def test_the_same_tool_bytes_read_without_hints_get_no_ttls() -> None:
    """With hints off no breakpoint is read, so the same bytes parse to tools without a TTL:
    the kept parse is per breakpoints on the tools, not per bytes alone."""
    resumer = Resumer().scoped(None)
    tools = [_tool("Read", cache_control=CONTROL)]
    for hints in (True, False, True):
        body = decode_json_body(_body(2, tools), resumer=resumer)
        parsed = parse_messages(body, hints=hints, resumer=resumer)
        fresh = parse_messages(json.loads(_body(2, tools)), hints=hints)
        assert _typed(parsed.tools) == _typed(fresh.tools)
        assert (parsed.tools[0].retain_ttl is not None) is hints

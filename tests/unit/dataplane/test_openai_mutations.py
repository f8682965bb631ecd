"""Every position of an agent-shaped body, replaced by each wrong JSON type: a 400 or a request.

Deterministic and exhaustive where the fuzz tier is random: for a Codex-shaped Responses body and
a tool-loop chat body, each value at each path (and each dict or list as a whole) is swapped for
``null``, a boolean, a number, a string, ``[]`` and ``{}``. The parser must raise ``ClientError``
(never ``KeyError``/``TypeError``/pydantic's ``ValidationError``) or return a request that
serializes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvretention.dataplane.frontend.common import ParsedRequest
from kvretention.dataplane.frontend.openai import parse_chat, parse_responses
from kvretention.dataplane.frontend.prepare import build_preprocessed
from kvretention.hints.errors import ClientError
from support.openai_shapes import codex_body

WRONG: tuple[Any, ...] = (None, True, 7, 1.5, "x", "", [], {}, [{}], {"type": "x"})
Path = tuple[str | int, ...]


def chat_body() -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return {
        "model": "m",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}},
                ],
            },
            {"role": "assistant", "content": None, "reasoning_content": "r", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": {"type": "object"}},
        },
        "reasoning_effort": "low",
        "logit_bias": {"1": 2},
        "stream_options": {"include_usage": True},
        "stream": True,
    }


def paths(value: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every path into ``value`` (the root excluded), parents before children."""
    children: list[tuple[str | int, Any]] = []
    if isinstance(value, dict):
        children = list(value.items())
    elif isinstance(value, list):
        children = list(enumerate(value))
    for key, child in children:
        yield (*prefix, key)
        yield from paths(child, (*prefix, key))


def replaced(body: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    target: Any = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def _check(parse: Callable[..., ParsedRequest], body: dict[str, Any]) -> str:
    try:
        parsed = parse(body)
    except ClientError as exc:
        assert exc.status == 400 and exc.message and exc.param is not None
        return "refused"
    build_preprocessed(parsed, request_id="r", session_id=None, tokenizer=None).to_json_bytes()
    return "accepted"


@pytest.mark.parametrize(
    ("parse", "make"),
    [(parse_chat, chat_body), (parse_responses, codex_body)],
    ids=["chat", "responses"],
)
def test_every_wrong_type_at_every_path_is_a_400_or_a_request(
    parse: Callable[..., ParsedRequest], make: Callable[[], dict[str, Any]]
) -> None:
    body = make()
    assert _check(parse, body) == "accepted"
    outcomes: dict[str, int] = {"refused": 0, "accepted": 0}
    for path in paths(body):
        for value in WRONG:
            outcomes[_check(parse, replaced(body, path, value))] += 1
    assert outcomes["refused"] > outcomes["accepted"] > 0

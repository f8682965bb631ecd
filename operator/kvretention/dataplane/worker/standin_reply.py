"""The stand-in engine's answers: which pieces of engine text one request is answered with.

What it answers is chosen per request by markers in the last user turn of the prompt (the text
after the last ``<|im_start|>user`` / ``<|user|>``; input ids are decoded with the tokenizer):

- no marker: ``Hello from the kvretention stand-in.``;
- ``[[standin:reasoning]]``: a ``<think>...</think>`` block first (the opening tag is left out
  when the prompt already ends with it, as a template that opens the think block would);
- ``[[standin:tool_call]]``: one call, in the native format, to the first tool of the prompt's
  ``<tools>`` block (``[[standin:tool_call:NAME]]`` picks the tool); arguments fill each required
  property (strings ``"stand-in"``, numbers ``1``, booleans ``true``);
- ``[[standin:tool_args:JSON]]`` (with a tool-call marker): the calls' arguments, as written (a
  real CLI then runs something real, e.g. ``{"command": "echo hi"}``);
- ``[[standin:parallel_tool_calls]]``: two calls (the first two tools, or the first one twice);
- ``[[standin:json]]``: the JSON object ``{"answer": "stand-in"}``.

Markers combine (reasoning then the answer). A request whose ``sampling_params.json_schema`` is
SGLang's tool-call array (required / named ``tool_choice`` without a native format) is answered
with that array, as a constrained engine would. Special tokens (``<think>``, ``<tool_call>``, ...)
are streamed as whole pieces, other text in small pieces, so streaming parsers see real engine
text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

REPLY_PIECES: Final = ("Hello", " from", " the", " kvretention", " stand-in", ".")
"""The deterministic answer, one piece per generated token."""
MARKER: Final = re.compile(r"\[\[standin:([a-z_]+)(?::(.+?))?\]\]")
USER_TURN_HEADERS: Final = ("<|im_start|>user", "<|user|>")
REASONING_PIECES: Final = (
    "\n", "The", " user", " wants", " the", " stand-in", " answer", ".", "\n",
)  # fmt: skip
JSON_ANSWER: Final = {"answer": "stand-in"}
PIECE_CHARS: Final = 6


@dataclass(frozen=True)
class Reply:
    """What the stand-in generates for one request: engine text pieces, one per token."""

    pieces: tuple[str, ...]
    reasoning_pieces: int = 0


def last_user_turn(prompt: str) -> str:
    """The prompt after its last user-turn header (the whole prompt when there is none)."""
    cut = max((prompt.rfind(h) for h in USER_TURN_HEADERS), default=-1)
    return prompt if cut < 0 else prompt[cut:]


def markers_of(prompt: str) -> dict[str, str | None]:
    """``[[standin:KIND]]`` / ``[[standin:KIND:ARG]]`` markers of the last user turn."""
    return {m.group(1): m.group(2) for m in MARKER.finditer(last_user_turn(prompt))}


def tools_in_prompt(prompt: str) -> list[dict[str, Any]]:
    """The functions a Qwen-style template listed between ``<tools>`` and ``</tools>``."""
    start = prompt.find("<tools>\n")
    end = prompt.find("\n</tools>", start)
    if start < 0 or end < start:
        return []
    found = []
    for line in prompt[start + len("<tools>\n") : end].splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            fn = item.get("function", item)
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                found.append(fn)
    return found


def example_arguments(schema: Any) -> dict[str, Any]:
    """Arguments that fill every required property of a JSON schema with a typed value."""
    if not isinstance(schema, dict):
        return {}
    props = schema.get("properties") or {}
    required = schema.get("required") or list(props)
    values = {"integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}
    out: dict[str, Any] = {}
    for name in required:
        spec = props.get(name) or {}
        kind = spec.get("type") if isinstance(spec, dict) else None
        enum = spec.get("enum") if isinstance(spec, dict) else None
        out[name] = enum[0] if enum else values.get(str(kind), "stand-in")
    return out


def _given_arguments(raw: str | None) -> dict[str, Any] | None:
    """The ``tool_args`` marker's JSON object, or None when absent or not an object."""
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _split(text: str) -> list[str]:
    return [text[i : i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)]


def tool_call_pieces(calls: Sequence[tuple[str, dict[str, Any]]], *, tool_format: str) -> list[str]:
    """Calls in a model family's native format; tags as whole pieces, JSON in small pieces."""
    pieces: list[str] = []
    for i, (name, args) in enumerate(calls):
        if tool_format == "llama3":
            body = json.dumps({"name": name, "parameters": args})
            pieces += [";"] if i else ["<|python_tag|>"]
            pieces += _split(body)
        else:
            body = json.dumps({"name": name, "arguments": args})
            pieces += (["\n"] if i else []) + ["<tool_call>", "\n", *_split(body), "\n"]
            pieces.append("</tool_call>")
    return pieces


def tool_array_schema_calls(json_schema: str | None) -> list[tuple[str, dict[str, Any]]] | None:
    """The call SGLang's required / named tool-array schema admits, or None for other schemas."""
    try:
        schema = json.loads(json_schema) if json_schema else None
    except ValueError:
        return None
    if not isinstance(schema, dict) or schema.get("type") != "array":
        return None
    items = schema.get("items") or {}
    options = items.get("anyOf") or [items]
    for option in options:
        props = option.get("properties") or {}
        names = (props.get("name") or {}).get("enum") or []
        if names:
            return [(str(names[0]), example_arguments(props.get("parameters")))]
    return None


def plan_reply(
    prompt: str, *, sampling: dict[str, Any], tool_format: str, thinks: bool = False
) -> Reply:
    """The pieces one request is answered with (see the module docstring)."""
    array_calls = tool_array_schema_calls(sampling.get("json_schema"))
    if array_calls is not None:
        body = json.dumps([{"name": n, "parameters": a} for n, a in array_calls])
        return Reply(pieces=tuple(_split(body)))
    markers = markers_of(prompt)
    pieces: list[str] = []
    reasoning = 0
    opened = prompt.rstrip().endswith("<think>")
    closed = prompt.rstrip().endswith("</think>")
    if "reasoning" in markers and not closed:
        pieces += ([] if opened else ["<think>"]) + list(REASONING_PIECES) + ["</think>", "\n\n"]
        reasoning = len(pieces)
    elif thinks and not closed:
        # A thinking model opens its answer with a think block even when it has little to say.
        pieces += ([] if opened else ["<think>"]) + ["\n\n", "</think>", "\n\n"]
        reasoning = len(pieces)
    tools = tools_in_prompt(prompt)
    wanted = markers.get("tool_call")
    if "tool_call" in markers or "parallel_tool_calls" in markers:
        chosen = [t for t in tools if t["name"] == wanted] if wanted else tools
        if not chosen:
            chosen = [{"name": wanted or "stand_in_tool", "parameters": {}}]
        count = 2 if "parallel_tool_calls" in markers else 1
        picks = (chosen * 2)[:count] if len(chosen) < count else chosen[:count]
        given = _given_arguments(markers.get("tool_args"))
        calls = [
            (t["name"], example_arguments(t.get("parameters")) if given is None else given)
            for t in picks
        ]
        pieces += tool_call_pieces(calls, tool_format=tool_format)
    elif "json" in markers:
        pieces += _split(json.dumps(JSON_ANSWER))
    else:
        pieces += list(REPLY_PIECES)
    return Reply(pieces=tuple(pieces), reasoning_pieces=reasoning)

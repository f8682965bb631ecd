"""Anthropic tool definitions: ``tools`` (custom tools, deferred or not) and the ``<functions>``
text a tool search answers with."""

from __future__ import annotations

import json
from functools import partial
from typing import Any, Final

from kvretention.dataplane.frontend import compat
from kvretention.dataplane.frontend.anthropic.fields import F, check_keys, req_str
from kvretention.dataplane.frontend.common import Marks
from kvretention.dataplane.frontend.resume import Resumer
from kvretention.dataplane.protocol import ToolDefinition
from kvretention.hints.anthropic import CACHE_CONTROL

_TOOL_KEYS: Final = frozenset(
    {
        "type",
        "name",
        "description",
        "input_schema",
        CACHE_CONTROL,
        "strict",
        "defer_loading",
        "input_examples",
        "eager_input_streaming",
        "allowed_callers",
    }
)
_TOOL_NO_OPS: Final = ("input_examples", "eager_input_streaming")
"""Tool keys accepted and counted as ignored: examples are not shown to the model, and input is
always streamed as it is parsed."""
SERVER_TOOL_PREFIXES: Final = (
    "bash_",
    "text_editor_",
    "web_search_",
    "web_fetch_",
    "code_execution_",
    "computer_",
    "memory_",
    "tool_search_tool_",
    "browser_",
)
"""Anthropic-defined tool types: run by Anthropic or with a schema only Anthropic's models know."""


ToolLists = tuple[list[ToolDefinition], list[ToolDefinition]]


def shared_tool_lists(raw: object, *, marks: Marks, resumer: Resumer | None) -> ToolLists:
    """:func:`tool_lists`, parsed once per tools list the resumer shares between bodies (an
    agent's every turn: the same bytes, the same definitions) and breakpoints on the tools (the
    only marks the parse reads); the fields it recorded as ignored are recorded again each time."""
    if resumer is None or not isinstance(raw, list) or not raw:
        return tool_lists(raw, marks=marks)
    on_tools = tuple((path, ttl) for path, ttl in marks.items() if path.startswith("tools."))
    (tools, deferred), ignored = resumer.derived(
        raw, f"anthropic.tools{on_tools!r}", partial(_parse_tool_lists, marks=dict(on_tools))
    )
    compat.record(ignored)
    return list(tools), list(deferred)


def _parse_tool_lists(
    raw: list[Any], *, marks: Marks
) -> tuple[tuple[tuple[ToolDefinition, ...], tuple[ToolDefinition, ...]], tuple[str, ...]]:
    """The tool lists, and the fields the parse recorded as ignored (in order)."""
    ignored: dict[str, None] = {}
    try:
        with compat.collecting() as ignored:
            tools, deferred = tool_lists(raw, marks=marks)
    except BaseException:
        compat.record(ignored)  # as a parse in place would have, before its error
        raise
    return (tuple(tools), tuple(deferred)), tuple(ignored)


def tool_lists(raw: object, *, marks: Marks) -> ToolLists:
    """The tools the prompt lists, and the deferred ones (``defer_loading: true``)."""
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        raise F.invalid_type("tools", raw, expected="a valid list")
    tools: list[ToolDefinition] = []
    deferred: list[ToolDefinition] = []
    seen: set[str] = set()
    for i, tool in enumerate(raw):
        where = f"tools.{i}"
        definition = tool_definition(tool, where=where, ttl=marks.get(where))
        if definition.name in seen:
            raise F.invalid_value(f"{where}.name", "Tool names must be unique.")
        seen.add(definition.name)
        if isinstance(tool, dict) and tool.get("defer_loading") is True:
            # not in the prompt until a tool_reference loads it: no breakpoint can end there
            deferred.append(definition.model_copy(update={"retain_ttl": None}))
        else:
            tools.append(definition)
    return tools, deferred


def tool_definition(raw: object, *, where: str, ttl: int | None) -> ToolDefinition:
    if not isinstance(raw, dict):
        raise F.invalid_type(where, raw, expected="a valid dictionary")
    kind = raw.get("type")
    if kind not in (None, "custom"):
        known = isinstance(kind, str) and kind.startswith(SERVER_TOOL_PREFIXES)
        reason = (
            f"Anthropic-defined tools such as {kind!r} are not supported by this server; "
            "declare a custom tool with an input_schema instead"
            if known
            else f"tools of type {kind!r} are not supported (custom tools with input_schema are)"
        )
        raise F.unsupported(f"{where}.type", reason)
    check_keys(raw, _TOOL_KEYS, where=where)
    name = req_str(raw, "name", where=where)
    if not name:
        raise F.invalid_value(f"{where}.name", "String should have at least 1 character")
    description = F.opt_str(raw, "description", param=f"{where}.description")
    if "input_schema" not in raw:
        raise F.missing(f"{where}.input_schema")
    schema = raw["input_schema"]
    if not isinstance(schema, dict):
        raise F.invalid_type(f"{where}.input_schema", schema, expected="a valid dictionary")
    if schema.get("type") != "object":
        raise F.invalid_value(f"{where}.input_schema.type", "Input should be 'object'")
    strict = raw.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise F.invalid_type(f"{where}.strict", strict, expected="a valid boolean")
    F.opt_bool(raw, "defer_loading", param=f"{where}.defer_loading")
    callers = raw.get("allowed_callers")
    if callers is not None and callers != ["direct"]:
        raise F.unsupported(f"{where}.allowed_callers", "only direct tool calls are supported")
    compat.ignore_set(raw, ("allowed_callers",), where=where)
    for key in _TOOL_NO_OPS:
        if key in raw and raw[key] is not None:
            if not isinstance(raw[key], list | bool):
                raise F.invalid_type(f"{where}.{key}", raw[key], expected="a valid list or boolean")
            compat.ignore(f"{where}.{key}")
    return ToolDefinition(
        name=name, description=description, parameters=schema, strict=strict, retain_ttl=ttl
    )


def tool_definitions_text(tools: list[ToolDefinition]) -> str:
    """Tools as a tool search returns them: one ``<function>`` JSON line each in ``<functions>``."""
    lines = [
        "<function>"
        + json.dumps(
            {"description": t.description or "", "name": t.name, "parameters": t.parameters or {}},
            ensure_ascii=False,
        )
        + "</function>"
        for t in tools
    ]
    return "\n".join(["<functions>", *lines, "</functions>"])

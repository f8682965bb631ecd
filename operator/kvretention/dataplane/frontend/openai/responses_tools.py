"""OpenAI Responses tools. They come from ``tools`` and from ``additional_tools`` input items
(Codex's code mode puts them all there). A ``namespace`` groups tools: the model sees its tools
flat, each under its own name (``{namespace}{name}`` when that name is taken), with the namespace's
description first, as Codex flattens namespaces for backends without them; the answer's calls carry
``namespace`` and the tool's own name again. Tool search cannot run here, so deferred tools
(``defer_loading``) are offered from the start and a ``tool_search`` tool is accepted and not
offered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kvretention.dataplane.frontend import compat
from kvretention.dataplane.frontend.openai.fields import (
    F,
    enum,
    ignore_present,
    obj,
    only_keys,
    opt_str,
    opt_strict,
    parameters_schema,
    req_str,
    tool_name,
)
from kvretention.dataplane.protocol import ToolDefinition, ToolGrammar

HOSTED_SEARCH: Final = frozenset(
    {"web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11"}
)
"""OpenAI's hosted web search. Codex adds it to every turn by default (``web_search = "cached"``),
also for custom providers; it is accepted and not offered to the model (nothing here can search),
so the model answers from what it has, as with ``web_search = "disabled"``."""
_SEARCH_KEYS: Final = (
    "type",
    "external_web_access",
    "indexed_web_access",
    "filters",
    "search_context_size",
    "search_content_types",
    "user_location",
)
_TOOL_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "function": ("type", "name", "description", "parameters", "strict"),
    "custom": ("type", "name", "description", "format"),
}
_TOOL_NO_OPS: Final = ("allowed_callers", "defer_loading", "output_schema")
"""SDK tool fields that change nothing here when set to what happens anyway (see ``_tool_no_ops``)."""
_NAMESPACE_KEYS: Final = ("type", "name", "description", "tools")
_TOOL_SEARCH_KEYS: Final = ("type", "execution", "description", "parameters")
DEFAULT_NAMESPACE: Final = "functions"
"""The namespace of plain function tools (``functions.exec``). Codex's code mode wraps its plain
tools in it and routes a call to one by name alone: such a call is answered without ``namespace``,
as in Codex's own recorded tool turn."""


@dataclass(frozen=True)
class ToolOrigin:
    """Where a tool the model sees was declared: its namespace (``None``: none) and own name."""

    namespace: str | None
    name: str
    where: str


ADDITIONAL_TOOLS: Final = b'"additional_tools"'


def all_tools(
    body: Mapping[str, Any], *, named: list[bool] | None = None
) -> tuple[list[dict[str, Any]], list[ToolDefinition], dict[str, ToolOrigin]]:
    """The ``tools`` as echoed in the response object; every tool the model sees (``tools``, then
    each ``additional_tools`` item's, namespaces flattened); and each seen name's origin.

    ``named``: whether each input item's encoding holds ``"additional_tools"``
    (``Resumer.names``); when none does, no item is looked at."""
    raw = body.get("tools")
    if raw is not None and not isinstance(raw, list):
        raise F.invalid_type("tools", raw, expected="an array")
    declared = _declared(raw or [], where="tools")
    items = body.get("input")
    if not isinstance(items, list) or (
        named is not None and len(named) == len(items) and True not in named
    ):
        items = []
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            where = F.path("input", index)
            enum(item, "role", where=where, values=("developer", "system"))
            listed = item.get("tools")
            if not isinstance(listed, list):
                raise F.invalid_type(f"{where}.tools", listed, expected="an array")
            declared += _declared(listed, where=f"{where}.tools")
    tools, origin = _flatten(declared)
    echo = [t for t in (raw or []) if isinstance(t, dict)]
    return echo, tools, origin


_Declared = tuple[ToolOrigin, ToolDefinition, str | None]
"""A declared tool, and its namespace's description."""


def _declared(raw: list[Any], *, where: str) -> list[_Declared]:
    """The function and custom tools of one list, namespaces opened; search tools left out."""
    out: list[_Declared] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        tool = obj(item, where=at)
        kind = tool.get("type")
        if isinstance(kind, str) and kind in HOSTED_SEARCH:
            only_keys(tool, where=at, allowed=_SEARCH_KEYS)
            compat.ignore(f"{at}:{kind}")  # echoed as sent; the model is not offered it
            continue
        if kind == "tool_search":
            _tool_search(tool, where=at)
            continue
        if kind == "namespace":
            out += _namespace(tool, where=at)
            continue
        definition = _tool(tool, where=at)
        out.append((ToolOrigin(None, definition.name, at), definition, None))
    return out


def _strict_unless_opted_out(tool: Mapping[str, Any], *, where: str) -> bool:
    """Responses function tools are strict unless they say ``strict: false`` (OpenAI's rule for
    this API; Chat Completions tools are not strict unless they say so)."""
    strict = opt_strict(tool, where=where)
    return True if strict is None else strict


def _tool(tool: Mapping[str, Any], *, where: str) -> ToolDefinition:
    kind = tool.get("type")
    if isinstance(kind, str) and kind in _TOOL_KEYS:
        only_keys(tool, where=where, allowed=(*_TOOL_KEYS[kind], *_TOOL_NO_OPS))
        _tool_no_ops(tool, where=where)
    if kind == "function":
        return ToolDefinition(
            name=tool_name(tool, where=where),
            description=opt_str(tool, "description", where=where),
            parameters=parameters_schema(tool, where=where),
            strict=_strict_unless_opted_out(tool, where=where),
        )
    if kind == "custom":
        return ToolDefinition(
            kind="custom",
            name=tool_name(tool, where=where),
            description=opt_str(tool, "description", where=where),
            grammar=_grammar(tool.get("format"), where=f"{where}.format"),
        )
    raise F.unsupported(
        f"{where}.type",
        f"tools of type {kind!r} are not supported; use 'function', 'custom' or 'namespace' "
        "('web_search' and 'tool_search' are accepted and not offered to the model).",
    )


def _namespace(tool: Mapping[str, Any], *, where: str) -> list[_Declared]:
    """A namespace's function and custom tools, each remembering the namespace."""
    only_keys(tool, where=where, allowed=_NAMESPACE_KEYS)
    namespace = req_str(tool, "name", where=where)
    if not namespace:
        raise F.invalid_value(f"{where}.name", "a namespace needs a non-empty name.")
    description = opt_str(tool, "description", where=where)
    inner = tool.get("tools")
    if not isinstance(inner, list) or not inner:
        raise F.invalid_type(f"{where}.tools", inner, expected="a non-empty array")
    out: list[_Declared] = []
    for j, item in enumerate(inner):
        at = f"{where}.tools[{j}]"
        entry = obj(item, where=at)
        if entry.get("type") not in ("function", "custom"):
            raise F.unsupported(
                f"{at}.type", "a namespace holds 'function' and 'custom' tools only."
            )
        definition = _tool(entry, where=at)
        out.append((ToolOrigin(namespace, definition.name, at), definition, description))
    return out


def _tool_search(tool: Mapping[str, Any], *, where: str) -> None:
    """Tool search cannot run here (hosted) and is not needed (deferred tools are offered from
    the start), so the tool is accepted, checked and not offered."""
    only_keys(tool, where=where, allowed=_TOOL_SEARCH_KEYS)
    enum(tool, "execution", where=where, values=("server", "client", "sync", "async"))
    opt_str(tool, "description", where=where)
    if tool.get("parameters") is not None:
        obj(tool["parameters"], where=f"{where}.parameters")
    compat.ignore(f"{where}:tool_search")


_UNSAFE_NAME: Final = re.compile(r"[^A-Za-z0-9_-]")


def _flatten(declared: list[_Declared]) -> tuple[list[ToolDefinition], dict[str, ToolOrigin]]:
    """The tools the model sees, and each one's origin. A namespaced tool keeps its own name
    unless another tool has it; then it is ``{namespace}{name}`` (Codex's own flattening)."""
    counts: dict[str, int] = {}
    for origin, _, _ in declared:
        counts[origin.name] = counts.get(origin.name, 0) + 1
    tools: list[ToolDefinition] = []
    seen: dict[str, ToolOrigin] = {}
    for origin, definition, ns_description in declared:
        name = origin.name
        if origin.namespace is not None and counts[name] > 1:
            flat = _UNSAFE_NAME.sub("_", f"{origin.namespace}{name}").strip("_")[:64]
            name = flat or name
        if name in seen:
            raise F.invalid_value(f"{origin.where}.name", f"the tool name '{name}' is used twice.")
        seen[name] = origin
        update: dict[str, Any] = {"name": name}
        if ns_description:
            update["description"] = "\n\n".join(
                d for d in (ns_description, definition.description) if d
            )
        tools.append(definition.model_copy(update=update))
    return tools, seen


def _tool_no_ops(tool: Mapping[str, Any], *, where: str) -> None:
    """``allowed_callers: ["direct"]`` and an ``output_schema`` change nothing here; a deferred
    tool (``defer_loading: true``) is offered from the start, since tool search cannot run here
    (counted as ignored); programmatic callers are not available."""
    callers = tool.get("allowed_callers")
    if callers is not None and callers != ["direct"]:
        raise F.unsupported(
            f"{where}.allowed_callers", "only direct tool calls are supported (['direct'])."
        )
    if F.opt_bool(tool, "defer_loading", param=f"{where}.defer_loading"):
        compat.ignore(f"{where}.defer_loading")
    schema = tool.get("output_schema")
    if schema is not None:
        obj(schema, where=f"{where}.output_schema")
    ignore_present(tool, ("allowed_callers", "output_schema"), where=where)


def _grammar(raw: object, *, where: str) -> ToolGrammar | None:
    if raw is None:
        return None
    fmt = obj(raw, where=where)
    kind = fmt.get("type")
    if kind == "text":
        only_keys(fmt, where=where, allowed=("type",))
        return None
    if kind != "grammar":
        raise F.invalid_value(
            f"{where}.type", f"{kind!r}. Supported values are: 'text', 'grammar'."
        )
    only_keys(fmt, where=where, allowed=("type", "syntax", "definition"))
    syntax = enum(fmt, "syntax", where=where, values=("lark", "regex"))
    if syntax is None:
        raise F.missing(f"{where}.syntax")
    definition = req_str(fmt, "definition", where=where)
    return ToolGrammar(syntax=syntax, definition=definition)

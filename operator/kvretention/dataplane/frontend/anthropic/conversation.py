"""The Anthropic conversation: ``system`` and ``messages`` -> neutral chat messages, block by block,
resumed from the last body's parse when a conversation repeats its start."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kvretention.dataplane.frontend import compat
from kvretention.dataplane.frontend.anthropic.fields import F, check_keys, req_str
from kvretention.dataplane.frontend.anthropic.tools import tool_definition, tool_definitions_text
from kvretention.dataplane.frontend.common import Marks, joined
from kvretention.dataplane.frontend.resume import Resumer, context_bytes
from kvretention.dataplane.protocol import (
    ChatMessage,
    ContentPart,
    ImagePart,
    Reasoning,
    TextPart,
    ToolCall,
    ToolDefinition,
    trusted,
)
from kvretention.hints.anthropic import CACHE_CONTROL
from kvretention.hints.errors import ClientError

_IMAGE_TYPES: Final = ("image/jpeg", "image/png", "image/gif", "image/webp")


# -- block keys (beyond ``type``) ---------------------------------------------------------------


_MESSAGE_KEYS: Final = frozenset({"role", "content", CACHE_CONTROL, "output_config"})
"""``output_config`` on the last message sets that turn's effort and format (Claude Code puts the
turn's ``{effort}`` on a trailing system message); on an earlier message it configured a past
turn and is ignored."""
"""``cache_control`` anywhere is the hint normalizer's: refused, or ignored with hints off."""
_TEXT_KEYS: Final = frozenset({"text", CACHE_CONTROL, "citations"})
_IMAGE_KEYS: Final = frozenset({"source", CACHE_CONTROL, "transformations"})
_DOCUMENT_KEYS: Final = frozenset({"source", CACHE_CONTROL, "citations", "context", "title"})
_TOOL_USE_KEYS: Final = frozenset({"id", "name", "input", CACHE_CONTROL, "caller", "toolset_name"})
_TOOL_RESULT_KEYS: Final = frozenset(
    {"tool_use_id", "content", "is_error", CACHE_CONTROL, "toolset_name"}
)
_TOOL_REFERENCE_KEYS: Final = frozenset({"tool_name", CACHE_CONTROL})
_BLOCK_NO_OPS: Final[Mapping[str, tuple[str, ...]]] = {
    "text": ("citations",),
    "image": ("transformations",),
    "document": ("citations",),
    "tool_use": ("caller", "toolset_name"),
    "tool_result": ("toolset_name",),
}
"""Block keys accepted and counted as ignored: citations are not shown, images are not
transformed, every call here is direct, and toolsets do not exist here."""
_THINKING_KEYS: Final = frozenset({"thinking", "signature"})
_REDACTED_KEYS: Final = frozenset({"data"})


# -- the conversation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fold:
    """The message loop's state: the neutral messages so far, tool_use id -> tool name (so a tool
    result can name its tool), and every tool the conversation may load so far."""

    messages: list[ChatMessage]
    names: dict[str, str]
    catalog: dict[str, ToolDefinition]

    def copy(self) -> _Fold:
        return _Fold(list(self.messages), dict(self.names), dict(self.catalog))


def fold_messages(
    raw: list[Any],
    *,
    tools: object,
    marks: Marks,
    catalog: dict[str, ToolDefinition],
    resumer: Resumer | None,
    encoded: list[bytes] | None,
) -> _Fold:
    """The messages in order, resumed from the last body's parse when it repeats its start."""

    def step(state: _Fold, i: int, message: object) -> None:
        state.messages.extend(
            _message(message, index=i, names=state.names, marks=marks, catalog=state.catalog)
        )

    def start() -> _Fold:
        return _Fold([], {}, dict(catalog))

    if resumer is None:
        state = start()
        for i, message in enumerate(raw):
            step(state, i, message)
        return state
    return resumer.fold(
        raw,
        scope="messages",
        context=context_bytes(tools),
        marks=marks,
        prefix="messages.",
        start=start,
        step=step,
        copy=_Fold.copy,
        encoded=encoded,
    )


def _message(
    raw: object,
    *,
    index: int,
    names: dict[str, str],
    marks: Marks,
    catalog: dict[str, ToolDefinition],
) -> list[ChatMessage]:
    """One Anthropic message -> one neutral message, or several when it holds tool results."""
    where = f"messages.{index}"  # F.path("messages", index)
    if not isinstance(raw, dict):
        raise F.invalid_type(where, raw, expected="a valid dictionary")
    role = raw.get("role")
    if role not in ("user", "assistant", "system"):
        raise F.invalid_value(f"{where}.role", "Input should be 'user', 'assistant' or 'system'")
    if "content" not in raw:
        raise F.missing(f"{where}.content")
    check_keys(raw, _MESSAGE_KEYS, where=where)
    content = raw["content"]
    param = f"{where}.content"
    if role == "system":
        system = system_content(content, where=param, marks=marks, catalog=catalog)
        return [trusted(ChatMessage, role="system", content=system)]
    if isinstance(content, str):
        return [trusted(ChatMessage, role=role, content=content)]
    if not isinstance(content, list):
        raise F.invalid_type(param, content, expected="a valid string or list of content blocks")
    if role == "assistant":
        return [_assistant(content, where=param, names=names, marks=marks)]
    return _user(content, where=param, names=names, marks=marks, catalog=catalog)


def _blocks(content: list[Any], *, where: str) -> list[tuple[str, str, dict[str, Any]]]:
    """``(path, type, block)`` for each block, each a dict with a string ``type``."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for j, block in enumerate(content):
        param = f"{where}.{j}"
        if not isinstance(block, dict):
            raise F.invalid_type(param, block, expected="a valid dictionary")
        kind = block.get("type")
        if not isinstance(kind, str):
            raise (F.missing if kind is None else _bad_type)(f"{param}.type")
        out.append((param, kind, block))
    return out


def _bad_type(param: str) -> ClientError:
    return F.invalid_value(param, "Input should be a valid string")


def _user(
    content: list[Any],
    *,
    where: str,
    names: dict[str, str],
    marks: Marks,
    catalog: Mapping[str, ToolDefinition],
) -> list[ChatMessage]:
    """User blocks in order; each ``tool_result`` becomes its own ``tool`` message."""
    out: list[ChatMessage] = []
    parts: list[ContentPart] = []
    for param, kind, block in _blocks(content, where=where):
        if kind == "tool_result":
            if parts:
                out.append(trusted(ChatMessage, role="user", content=joined(parts)))
                parts = []
            out.append(_tool_result(block, where=param, names=names, marks=marks, catalog=catalog))
        else:
            parts.append(_part(block, kind=kind, where=param, marks=marks))
    if parts or not out:
        out.append(trusted(ChatMessage, role="user", content=joined(parts)))
    return out


def _assistant(
    content: list[Any], *, where: str, names: dict[str, str], marks: Marks
) -> ChatMessage:
    """Assistant blocks: thinking (replayed as reasoning), text, and tool_use (tool calls)."""
    parts: list[ContentPart] = []
    calls: list[ToolCall] = []
    thoughts: list[str] = []
    signature: str | None = None
    encrypted = False
    for param, kind, block in _blocks(content, where=where):
        if kind == "thinking":
            check_keys(block, _THINKING_KEYS, where=param)
            thoughts.append(req_str(block, "thinking", where=param))
            signature = req_str(block, "signature", where=param)
        elif kind == "redacted_thinking":
            check_keys(block, _REDACTED_KEYS, where=param)
            req_str(block, "data", where=param)
            encrypted = True
        elif kind == "tool_use":
            call = _tool_use(block, where=param, ttl=marks.get(param))
            names[call.id] = call.name
            calls.append(call)
        elif kind == "text":
            parts.append(_part(block, kind=kind, where=param, marks=marks))
        else:
            raise _unsupported_block(param, kind, role="assistant")
    reasoning = None
    if thoughts or encrypted:
        reasoning = trusted(
            Reasoning, text="\n".join(thoughts), signature=signature, encrypted=encrypted
        )
    return trusted(
        ChatMessage, role="assistant", content=joined(parts), tool_calls=calls, reasoning=reasoning
    )


def _part(block: dict[str, Any], *, kind: str, where: str, marks: Marks) -> ContentPart:
    """A text, image or plain-text document block of a user message or a tool result."""
    ttl = marks.get(where)
    compat.ignore_set(block, _BLOCK_NO_OPS.get(kind, ()), where=where)
    if kind == "text":
        check_keys(block, _TEXT_KEYS, where=where)
        return trusted(TextPart, text=req_str(block, "text", where=where), retain_ttl=ttl)
    if kind == "image":
        check_keys(block, _IMAGE_KEYS, where=where)
        url = _image_url(block.get("source"), where=f"{where}.source")
        return ImagePart(url=url, retain_ttl=ttl)
    if kind == "document":
        check_keys(block, _DOCUMENT_KEYS, where=where)
        return trusted(TextPart, text=_document_text(block, where=where), retain_ttl=ttl)
    raise _unsupported_block(where, kind, role="user")


def _unsupported_block(param: str, kind: str, *, role: str) -> ClientError:
    known = {
        "user": "text, image, document (plain text) and tool_result",
        "assistant": "text, thinking, redacted_thinking and tool_use",
    }[role]
    return F.unsupported(
        f"{param}.type",
        f"content blocks of type {kind!r} are not supported in {role} messages by this server "
        f"({known} are)",
    )


def _image_url(source: object, *, where: str) -> str:
    """A base64 source becomes a ``data:`` URL; a url source stays; file ids are refused."""
    if not isinstance(source, dict):
        raise F.invalid_type(where, source, expected="a valid dictionary")
    kind = source.get("type")
    if kind == "base64":
        check_keys(source, frozenset({"media_type", "data"}), where=where)
        media = source.get("media_type")
        if media not in _IMAGE_TYPES:
            choices = ", ".join(f"'{t}'" for t in _IMAGE_TYPES)
            raise F.invalid_value(f"{where}.media_type", f"Input should be {choices}")
        data = req_str(source, "data", where=where)
        if not data:
            raise F.invalid_value(f"{where}.data", "String should have at least 1 character")
        return f"data:{media};base64,{data}"
    if kind == "url":
        check_keys(source, frozenset({"url"}), where=where)
        url = req_str(source, "url", where=where)
        if not url.startswith(("http://", "https://")):
            raise F.invalid_value(f"{where}.url", "Input should be an http(s) URL")
        return url
    if kind == "file":
        raise F.unsupported(f"{where}.type", "file sources (the Files API) are not supported")
    raise F.invalid_value(f"{where}.type", "Input should be 'base64' or 'url'")


def _document_text(block: Mapping[str, Any], *, where: str) -> str:
    """Plain-text documents become text (title and context first); PDFs and files are refused."""
    source = block.get("source")
    param = f"{where}.source"
    if not isinstance(source, dict):
        raise F.invalid_type(param, source, expected="a valid dictionary")
    if source.get("type") != "text":
        raise F.unsupported(
            f"{param}.type",
            f"document sources of type {source.get('type')!r} are not supported by this server "
            "(plain-text documents are)",
        )
    check_keys(source, frozenset({"media_type", "data"}), where=param)
    if source.get("media_type") != "text/plain":
        raise F.invalid_value(f"{param}.media_type", "Input should be 'text/plain'")
    pieces = [
        block[k] for k in ("title", "context") if isinstance(block.get(k), str) and block.get(k)
    ]
    return "\n".join([*pieces, req_str(source, "data", where=param)])


def _tool_use(block: dict[str, Any], *, where: str, ttl: int | None) -> ToolCall:
    check_keys(block, _TOOL_USE_KEYS, where=where)
    compat.ignore_set(block, _BLOCK_NO_OPS["tool_use"], where=where)
    caller = block.get("caller")
    if caller is not None and not (isinstance(caller, dict) and caller.get("type") == "direct"):
        raise F.unsupported(f"{where}.caller", "only direct tool calls are supported")
    call_id = req_str(block, "id", where=where)
    name = req_str(block, "name", where=where)
    if not call_id or not name:
        raise F.invalid_value(
            f"{where}.{'id' if not call_id else 'name'}", "String should have at least 1 character"
        )
    if "input" not in block:
        raise F.missing(f"{where}.input")
    arguments = block["input"]
    if not isinstance(arguments, dict):
        raise F.invalid_type(f"{where}.input", arguments, expected="a valid dictionary")
    arguments_json = _ARGUMENTS.encode(arguments)  # json.dumps(arguments, ensure_ascii=False)
    return trusted(ToolCall, id=call_id, name=name, arguments=arguments_json, retain_ttl=ttl)


_ARGUMENTS: Final = json.JSONEncoder(ensure_ascii=False)
"""One encoder for every ``tool_use`` input (``json.dumps`` builds one per call)."""


def _tool_result(
    block: dict[str, Any],
    *,
    where: str,
    names: Mapping[str, str],
    marks: Marks,
    catalog: Mapping[str, ToolDefinition],
) -> ChatMessage:
    """A ``tool_result`` block -> a ``tool`` message; a breakpoint on the block ends with it.

    ``tool_reference`` blocks (a tool search's answer) become the referenced tools' definitions,
    in the ``<functions>`` encoding Claude Code's ToolSearch tool tells the model to expect."""
    check_keys(block, _TOOL_RESULT_KEYS, where=where)
    compat.ignore_set(block, _BLOCK_NO_OPS["tool_result"], where=where)
    call_id = req_str(block, "tool_use_id", where=where)
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise F.invalid_type(f"{where}.is_error", is_error, expected="a valid boolean")
    raw = block.get("content", "")
    param = f"{where}.content"
    content: str | list[ContentPart]
    if raw is None or isinstance(raw, str):
        content = raw or ""
    elif isinstance(raw, list):
        parts: list[ContentPart] = []
        for nested, kind, inner in _blocks(raw, where=param):
            if kind == "tool_reference":
                parts.append(_tool_reference(inner, where=nested, catalog=catalog, marks=marks))
                continue
            if kind not in ("text", "image", "document"):
                raise F.unsupported(
                    f"{nested}.type",
                    f"tool_result content of type {kind!r} is not supported by this server "
                    "(text, image, plain-text document and tool_reference are)",
                )
            parts.append(_part(inner, kind=kind, where=nested, marks=marks))
        content = joined(parts)
    else:
        raise F.invalid_type(param, raw, expected="a valid string or list of content blocks")
    return trusted(
        ChatMessage,
        role="tool",
        content=content,
        tool_call_id=call_id,
        name=names.get(call_id),
        is_error=bool(is_error),
        retain_ttl=marks.get(where),
    )


def _tool_reference(
    block: dict[str, Any], *, where: str, catalog: Mapping[str, ToolDefinition], marks: Marks
) -> TextPart:
    """A ``tool_reference`` -> the referenced tool's definition (it must be in ``tools``)."""
    check_keys(block, _TOOL_REFERENCE_KEYS, where=where)
    name = req_str(block, "tool_name", where=where)
    tool = catalog.get(name)
    if tool is None:
        raise F.invalid_value(f"{where}.tool_name", f"Tool '{name}' not found in 'tools'")
    return trusted(TextPart, text=tool_definitions_text([tool]), retain_ttl=marks.get(where))


def _tool_change(
    block: dict[str, Any],
    *,
    kind: str,
    where: str,
    catalog: dict[str, ToolDefinition],
    marks: Marks,
) -> TextPart:
    """A mid-conversation tool change (``mid-conversation-tool-changes`` beta), on a system
    message: ``tool_addition`` of a definition (it joins the callable tools) or of a reference to
    a declared tool becomes the tool's definition, as a ``tool_reference`` does; ``tool_removal``
    becomes a one-line notice (the model still sees the definition earlier in the prompt, and a
    call to a removed tool gets the client's own "not found" result)."""
    check_keys(block, frozenset({"tool", CACHE_CONTROL}), where=where)
    tool = block.get("tool")
    at = f"{where}.tool"
    if not isinstance(tool, dict):
        raise F.invalid_type(at, tool, expected="a valid dictionary")
    ref = tool.get("type")
    if kind == "tool_addition" and ref == "tool_definition":
        check_keys(tool, frozenset({"definition"}), where=at)
        definition = tool_definition(tool.get("definition"), where=f"{at}.definition", ttl=None)
        catalog[definition.name] = definition
        return trusted(
            TextPart, text=tool_definitions_text([definition]), retain_ttl=marks.get(where)
        )
    if ref != "tool_reference":
        choices = (
            "'tool_definition' or 'tool_reference'"
            if kind == "tool_addition"
            else "'tool_reference'"
        )
        raise F.invalid_value(f"{at}.type", f"Input should be {choices}")
    check_keys(tool, frozenset({"name"}), where=at)
    name = req_str(tool, "name", where=at)
    if kind == "tool_removal":
        return trusted(
            TextPart, text=f"The tool {name} is no longer available.", retain_ttl=marks.get(where)
        )
    found = catalog.get(name)
    if found is None:
        raise F.invalid_value(f"{at}.name", f"Tool '{name}' not found in 'tools'")
    return trusted(TextPart, text=tool_definitions_text([found]), retain_ttl=marks.get(where))


def system_content(
    content: object,
    *,
    where: str,
    marks: Marks,
    catalog: dict[str, ToolDefinition] | None = None,
) -> str | list[ContentPart]:
    """System content: a string, or text blocks (joined by newlines unless one is a breakpoint).
    A system *message* (``catalog`` given) may also change the tools mid-conversation."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise F.invalid_type(where, content, expected="a valid string or list of text blocks")
    parts: list[ContentPart] = []
    for param, kind, block in _blocks(content, where=where):
        if catalog is not None and kind in ("tool_addition", "tool_removal"):
            parts.append(_tool_change(block, kind=kind, where=param, catalog=catalog, marks=marks))
            continue
        if kind != "text":
            raise F.unsupported(
                f"{param}.type", f"system blocks of type {kind!r} are not supported (text only)"
            )
        parts.append(_part(block, kind=kind, where=param, marks=marks))
    return joined(parts)

"""The Chat Completions conversation: ``messages`` -> neutral chat messages, resumed from the
last body's parse when a conversation repeats its start."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from kvretention.dataplane.frontend import compat
from kvretention.dataplane.frontend.common import Marks, joined
from kvretention.dataplane.frontend.openai.fields import (
    F,
    image,
    obj,
    only_keys,
    opt_str,
    refuse_set,
    req_arguments,
    req_str,
)
from kvretention.dataplane.frontend.resume import Resumer
from kvretention.dataplane.protocol import (
    ChatMessage,
    ContentPart,
    Reasoning,
    TextPart,
    ToolCall,
    trusted,
)

_ROLE_KEYS: Final[Mapping[str, frozenset[str]]] = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset(
        {"role", "content", "name", "tool_calls", "refusal", "reasoning_content", "reasoning"}
        | {"audio", "function_call"}
    ),
    "tool": frozenset({"role", "content", "tool_call_id", "name"}),
}
_PART_KEYS: Final[Mapping[str, frozenset[str]]] = {
    "text": frozenset({"type", "text", "prompt_cache_breakpoint"}),
    "refusal": frozenset({"type", "refusal"}),
    "image_url": frozenset({"type", "image_url", "prompt_cache_breakpoint"}),
}
_PARTS_BY_ROLE: Final[Mapping[str, tuple[str, ...]]] = {
    "user": ("text", "image_url"),
    "assistant": ("text", "refusal"),
    "tool": ("text", "image_url"),
}
"""Tool results may hold images: Codex's chat wire sends a screenshot tool's output that way."""


@dataclass(frozen=True)
class _Fold:
    """The message loop's state: the neutral messages so far, and tool call id -> tool name."""

    messages: list[ChatMessage]
    calls: dict[str, str]

    def copy(self) -> _Fold:
        return _Fold(list(self.messages), dict(self.calls))


def fold_messages(
    raw: list[Any], *, marks: Marks, resumer: Resumer | None, encoded: list[bytes] | None = None
) -> list[ChatMessage]:
    """The messages in order, resumed from the last body's parse when it repeats its start."""

    def step(state: _Fold, i: int, message: object) -> None:
        state.messages.append(_message(message, index=i, calls=state.calls, marks=marks))

    if resumer is None:
        calls: dict[str, str] = {}
        return [_message(m, index=i, calls=calls, marks=marks) for i, m in enumerate(raw)]
    folded = resumer.fold(
        raw,
        scope="chat.messages",
        context=b"",  # a message reads nothing but earlier messages
        marks=marks,
        prefix="messages[",
        start=lambda: _Fold([], {}),
        step=step,
        copy=_Fold.copy,
        encoded=encoded,
    )
    return folded.messages


def _message(raw: object, *, index: int, calls: dict[str, str], marks: Marks) -> ChatMessage:
    where = f"messages[{index}]"  # F.path("messages", index)
    msg = obj(raw, where=where)
    role = msg.get("role")
    if not isinstance(role, str):  # before the dict lookup: a list or object role is unhashable
        raise F.invalid_type(f"{where}.role", role, expected="a string")
    if role == "function":
        raise F.unsupported(
            f"{where}.role", "legacy 'function' messages are not supported; use 'tool' messages."
        )
    if role not in _ROLE_KEYS:
        supported = ", ".join(f"'{r}'" for r in _ROLE_KEYS)
        raise F.invalid_value(f"{where}.role", f"'{role}'. Supported values are: {supported}.")
    only_keys(msg, where=where, allowed=_ROLE_KEYS[role])
    if opt_str(msg, "name", where=where) is not None:
        compat.ignore(f"{where}.name")  # a participant name: templates do not render it
    if role == "assistant":
        return _assistant(msg, where=where, calls=calls, marks=marks)
    content = _content(msg.get("content"), where=f"{where}.content", role=role, marks=marks)
    if role != "tool":
        return trusted(ChatMessage, role=role, content=content)
    call_id = req_str(msg, "tool_call_id", where=where)
    if call_id not in calls:
        raise F.invalid_value(
            f"{where}.tool_call_id",
            f"'{call_id}' does not answer a tool call of an earlier assistant message.",
        )
    return trusted(
        ChatMessage, role="tool", content=content, tool_call_id=call_id, name=calls[call_id]
    )


def _assistant(
    msg: Mapping[str, Any], *, where: str, calls: dict[str, str], marks: Marks
) -> ChatMessage:
    refuse_set(
        msg,
        {
            "audio": "assistant audio is not supported.",
            "function_call": "legacy 'function_call' is not supported; use 'tool_calls'.",
        },
        where=where,
    )
    content: str | list[ContentPart] = ""
    if msg.get("content") is not None:
        content = _content(msg["content"], where=f"{where}.content", role="assistant", marks=marks)
    refusal = opt_str(msg, "refusal", where=where)
    if refusal and not content:
        content = refusal  # the model's own words: replayed as its text
    # ``reasoning`` is the same replay under the name Codex's chat wire (and vLLM) use
    reasoning = opt_str(msg, "reasoning_content", where=where)
    alias = opt_str(msg, "reasoning", where=where)
    reasoning = reasoning or alias
    tool_calls = _history_calls(msg.get("tool_calls"), where=f"{where}.tool_calls")
    calls.update((c.id, c.name) for c in tool_calls)
    return trusted(
        ChatMessage,
        role="assistant",
        content=content,
        tool_calls=tool_calls,
        reasoning=_reasoning(reasoning),
    )


def _reasoning(text: str | None) -> Reasoning | None:
    return trusted(Reasoning, text=text) if text else None


def array_objects(raw: object, *, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """An optional array's objects, each with its parameter path (``None``: no objects). Lazy,
    so that the first failing element, in array order, is the one reported."""
    if raw is None:
        return
    if not isinstance(raw, list):
        raise F.invalid_type(where, raw, expected="an array")
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        yield at, obj(item, where=at)


def _history_calls(raw: object, *, where: str) -> list[ToolCall]:
    out: list[ToolCall] = []
    for at, call in array_objects(raw, where=where):
        # ``index`` is what a streamed call carried; clients that replay it are not wrong
        only_keys(call, where=at, allowed=("id", "type", "function", "index"))
        kind = call.get("type", "function")
        if kind != "function":
            raise F.unsupported(f"{at}.type", f"tool calls of type {kind!r} are not supported.")
        call_id = req_str(call, "id", where=at)
        if "function" not in call:
            raise F.missing(f"{at}.function")
        function = obj(call["function"], where=f"{at}.function")
        only_keys(function, where=f"{at}.function", allowed=("name", "arguments"))
        name = req_str(function, "name", where=f"{at}.function")
        arguments = req_arguments(function, "arguments", where=f"{at}.function")
        if not call_id or not name:
            raise F.invalid_value(f"{at}", "a tool call needs a non-empty 'id' and 'name'.")
        out.append(trusted(ToolCall, id=call_id, name=name, arguments=arguments))
    return out


ReadPart = Callable[[dict[str, Any], str, int | None], ContentPart]
"""One content part's object, its parameter path and its breakpoint's TTL -> the neutral part."""


def content_parts(
    content: object, *, where: str, marks: Marks, read: ReadPart
) -> str | list[ContentPart]:
    """String content, or an array of parts each taken by ``read`` (see :func:`joined`).

    Chat Completions and Responses walk content alike and differ only in the parts they take.
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise F.invalid_type(where, content, expected="a string or an array of content parts")
    parts: list[ContentPart] = []
    for j, raw in enumerate(content):
        param = f"{where}[{j}]"
        parts.append(read(obj(raw, where=param), param, marks.get(param)))
    return joined(parts)


def _content(content: object, *, where: str, role: str, marks: Marks) -> str | list[ContentPart]:
    """A string, or the parts ``role`` may send; a marked part gets its ``retain_ttl``."""
    kinds = _PARTS_BY_ROLE.get(role, ("text",))

    def read(part: dict[str, Any], param: str, ttl: int | None) -> ContentPart:
        kind = part.get("type")
        if not isinstance(kind, str) or kind not in kinds:
            supported = ", ".join(f"'{k}'" for k in kinds)
            raise F.unsupported(
                f"{param}.type",
                f"content parts of type {kind!r} are not supported in '{role}' messages "
                f"(supported: {supported}).",
            )
        only_keys(part, where=param, allowed=_PART_KEYS[kind])
        if kind == "image_url":
            spec = obj(part.get("image_url"), where=f"{param}.image_url")
            only_keys(spec, where=f"{param}.image_url", allowed=("url", "detail"))
            picture = image(
                spec.get("url"),
                detail=spec.get("detail"),
                where=f"{param}.image_url",
                url_param=f"{param}.image_url.url",
            )
            return picture.model_copy(update={"retain_ttl": ttl})
        return trusted(TextPart, text=req_str(part, kind, where=param), retain_ttl=ttl)

    return content_parts(content, where=where, marks=marks, read=read)

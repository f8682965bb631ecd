"""The Responses conversation: input items fold into chat turns. ``reasoning``, assistant
``message``, ``function_call`` and ``custom_tool_call`` items of one turn become one assistant
message (reasoning, then text, then tool calls); ``*_output`` items become ``tool`` messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kvretention.dataplane.frontend import compat
from kvretention.dataplane.frontend.common import Marks
from kvretention.dataplane.frontend.openai.chat_conversation import array_objects, content_parts
from kvretention.dataplane.frontend.openai.fields import (
    RESPONSES_IMAGE_DETAILS,
    F,
    enum,
    ignore_present,
    image,
    obj,
    only_keys,
    opt_str,
    req_arguments,
    req_str,
)
from kvretention.dataplane.frontend.openai.responses_tools import ToolOrigin
from kvretention.dataplane.frontend.resume import Resumer, context_bytes
from kvretention.dataplane.protocol import (
    ChatMessage,
    ContentPart,
    Reasoning,
    TextPart,
    ToolCall,
    trusted,
)

_ROLES: Final = ("user", "assistant", "system", "developer")
_TEXT_PARTS: Final[Mapping[str, str]] = {
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
}
_PART_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "input_text": ("type", "text", "prompt_cache_breakpoint"),
    "output_text": ("type", "text", "annotations", "logprobs"),
    "refusal": ("type", "refusal"),
    "input_image": ("type", "image_url", "file_id", "detail", "prompt_cache_breakpoint"),
}
_ITEM_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "message": ("type", "role", "content", "id", "status", "phase", "end_turn"),
    "reasoning": ("type", "id", "summary", "content", "encrypted_content", "status"),
    "function_call": ("type", "id", "call_id", "name", "arguments", "status", "caller"),
    "custom_tool_call": ("type", "id", "call_id", "name", "input", "status", "caller"),
    "function_call_output": ("type", "id", "call_id", "output", "status", "name", "caller"),
    "custom_tool_call_output": ("type", "id", "call_id", "output", "status", "name", "caller"),
    "additional_tools": ("type", "id", "role", "tools"),
}
_CALL_KEYS: Final = ("namespace",)
"""Calls and outputs name a namespaced tool's namespace (Codex replays it)."""


def fold_items(
    items: list[Any],
    *,
    marks: Marks,
    origin: Mapping[str, ToolOrigin],
    resumer: Resumer | None,
    encoded: list[bytes] | None = None,
) -> list[ChatMessage]:
    """The items folded into messages, resumed from the last body's parse when it repeats its
    start."""
    visible = {(o.namespace, o.name): n for n, o in origin.items()}
    if resumer is None:
        conversation = _Conversation([], marks=marks, visible=visible)
        conversation.extend(items)
        return conversation.messages

    def step(state: _Conversation, i: int, item: object) -> None:
        state.add(item, where=f"input[{i}]")  # F.path("input", index)

    def copy(state: _Conversation) -> _Conversation:
        return state.copy(marks=marks)

    folded = resumer.fold(
        items,
        scope="responses.input",
        # what an item reads besides earlier items: the names tools are seen by
        context=context_bytes([[*key, name] for key, name in visible.items()]),
        marks=marks,
        prefix="input[",
        start=lambda: _Conversation([], marks=marks, visible=visible),
        step=step,
        copy=copy,
        encoded=encoded,
    )
    return folded.messages


class _Conversation:
    """Folds Responses input items into neutral chat messages (see the module docstring)."""

    def __init__(
        self,
        messages: list[ChatMessage],
        *,
        marks: Marks,
        visible: Mapping[tuple[str | None, str], str],
        calls: dict[str, str] | None = None,
    ) -> None:
        self.messages = messages
        self.marks = marks
        self.visible = visible
        """(namespace, name) -> the name the model sees."""
        self.calls: dict[str, str] = {} if calls is None else calls
        """call_id -> tool name, of the calls seen so far (outputs must answer one)."""

    def copy(self, *, marks: Marks) -> _Conversation:
        """The state so far, to go on with under ``marks`` (a resumed body's own)."""
        return _Conversation(
            list(self.messages), marks=marks, visible=self.visible, calls=dict(self.calls)
        )

    def extend(self, items: list[Any]) -> None:
        for index, raw in enumerate(items):
            self.add(raw, where=f"input[{index}]")  # F.path("input", index)

    def add(self, raw: object, *, where: str) -> None:
        item = obj(raw, where=where)
        kind = item.get("type", "message")
        if kind == "item_reference":
            raise F.unsupported(
                f"{where}.type", "item references need stored responses; send the item itself."
            )
        if not isinstance(kind, str) or kind not in _ITEM_KEYS:
            supported = ", ".join(f"'{k}'" for k in _ITEM_KEYS)
            raise F.unsupported(
                f"{where}.type",
                f"input items of type {kind!r} are not supported (supported: {supported}).",
            )
        calls = _CALL_KEYS if kind.endswith(("_call", "_call_output")) else ()
        only_keys(item, where=where, allowed=(*_ITEM_KEYS[kind], *calls))
        _caller(item, where=where)
        if kind == "additional_tools":
            return  # its tools joined the tool list (``all_tools``)
        if kind == "message":
            self._message(item, where=where)
        elif kind == "reasoning":
            self._reasoning(item, where=where)
        elif kind in ("function_call", "custom_tool_call"):
            self._call(item, where=where, custom=kind == "custom_tool_call")
        else:
            self._output(item, where=where)

    def _turn(self) -> ChatMessage | None:
        """The assistant message the current turn's items join, if the last message is one."""
        last = self.messages[-1] if self.messages else None
        return last if last is not None and last.role == "assistant" else None

    def _message(self, item: Mapping[str, Any], *, where: str) -> None:
        role = item.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            supported = ", ".join(f"'{r}'" for r in _ROLES)
            raise F.invalid_value(f"{where}.role", f"{role!r}. Supported values are: {supported}.")
        # ``phase`` (commentary / final_answer) labels an output message and ``end_turn`` says the
        # turn ended there (Codex replays both); templates show neither
        enum(item, "phase", where=where, values=("commentary", "final_answer"))
        F.opt_bool(item, "end_turn", param=f"{where}.end_turn")
        ignore_present(item, ("phase", "end_turn"), where=where)
        content = _content(
            item.get("content"), where=f"{where}.content", images=role == "user", marks=self.marks
        )
        turn = self._turn()
        if role == "assistant" and turn is not None and not turn.content and not turn.tool_calls:
            self.messages[-1] = _merged(turn, content=content)
            return
        self.messages.append(trusted(ChatMessage, role=role, content=content))

    def _reasoning(self, item: Mapping[str, Any], *, where: str) -> None:
        """Summary (or ``reasoning_text`` content) is what the model sees; encrypted_content is opaque."""
        summary = _texts(item.get("summary"), where=f"{where}.summary", kinds=("summary_text",))
        # Codex replays content only as ``text`` parts; OpenAI's own are ``reasoning_text``
        kinds = ("reasoning_text", "text")
        content = _texts(item.get("content"), where=f"{where}.content", kinds=kinds)
        encrypted = opt_str(item, "encrypted_content", where=where)
        text = "\n\n".join(content or summary)
        reasoning = trusted(Reasoning, text=text, encrypted=encrypted is not None)
        turn = self._turn()
        if turn is not None and turn.reasoning is None and not turn.content and not turn.tool_calls:
            self.messages[-1] = _merged(turn, reasoning=reasoning)
            return
        self.messages.append(trusted(ChatMessage, role="assistant", reasoning=reasoning))

    def _call(self, item: Mapping[str, Any], *, where: str, custom: bool) -> None:
        call_id = req_str(item, "call_id", where=where)
        name = req_str(item, "name", where=where)
        namespace = opt_str(item, "namespace", where=where)
        name = self.visible.get((namespace, name), name)
        arguments = (
            req_str(item, "input", where=where)
            if custom
            else req_arguments(item, "arguments", where=where)
        )
        if not call_id or not name:
            raise F.invalid_value(where, "a tool call needs a non-empty 'call_id' and 'name'.")
        call = trusted(
            ToolCall,
            id=call_id,
            name=name,
            arguments=arguments,
            kind="custom" if custom else "function",
        )
        self.calls[call_id] = name
        turn = self._turn()
        if turn is not None:
            self.messages[-1] = _merged(turn, tool_calls=[*turn.tool_calls, call])
        else:
            self.messages.append(trusted(ChatMessage, role="assistant", tool_calls=[call]))

    def _output(self, item: Mapping[str, Any], *, where: str) -> None:
        opt_str(item, "namespace", where=where)  # the name comes from the call
        call_id = req_str(item, "call_id", where=where)
        if call_id not in self.calls:
            raise F.invalid_value(
                f"{where}.call_id", f"no tool call found for output with call_id '{call_id}'."
            )
        if "output" not in item:
            raise F.missing(f"{where}.output")
        content = _content(item["output"], where=f"{where}.output", images=True, marks=self.marks)
        self.messages.append(
            trusted(
                ChatMessage,
                role="tool",
                content=content,
                tool_call_id=call_id,
                name=self.calls[call_id],
            )
        )


def _merged(turn: ChatMessage, **update: Any) -> ChatMessage:
    """``turn`` with a later item of its turn joined in: ``model_copy(update=...)`` without the
    copy machinery (Codex replays ~300 such items per request)."""
    return trusted(ChatMessage, **{**turn.__dict__, **update})


def _texts(raw: object, *, where: str, kinds: tuple[str, ...]) -> list[str]:
    """The texts of a reasoning item's ``summary`` / ``content`` list."""
    out: list[str] = []
    for at, entry in array_objects(raw, where=where):
        only_keys(entry, where=at, allowed=("type", "text"))
        if entry.get("type") not in kinds:
            expected = ", ".join(f"'{k}'" for k in kinds)
            raise F.invalid_value(f"{at}.type", f"{entry.get('type')!r}. Expected {expected}.")
        out.append(req_str(entry, "text", where=at))
    return out


def _content(content: object, *, where: str, images: bool, marks: Marks) -> str | list[ContentPart]:
    """String content, or text parts (and images where ``images``); a marked part gets its
    ``retain_ttl``."""

    def read(part: dict[str, Any], param: str, ttl: int | None) -> ContentPart:
        kind = part.get("type")
        allowed = isinstance(kind, str) and (
            kind in _TEXT_PARTS or (images and kind == "input_image")
        )
        if not allowed:
            raise F.unsupported(
                f"{param}.type", f"content parts of type {kind!r} are not supported here."
            )
        only_keys(part, where=param, allowed=_PART_KEYS[str(kind)])
        if kind == "input_image":
            if part.get("file_id") is not None:
                raise F.unsupported(f"{param}.file_id", "file ids need stored files; send a URL.")
            picture = image(
                part.get("image_url"),
                detail=part.get("detail"),
                where=param,
                url_param=f"{param}.image_url",
                details=RESPONSES_IMAGE_DETAILS,
            )
            return picture.model_copy(update={"retain_ttl": ttl})
        text = req_str(part, _TEXT_PARTS[str(kind)], where=param)
        return trusted(TextPart, text=text, retain_ttl=ttl)

    return content_parts(content, where=where, marks=marks, read=read)


def _caller(item: Mapping[str, Any], *, where: str) -> None:
    """A replayed call's ``caller``: ``direct`` is how every call here is made; programs are not."""
    caller = item.get("caller")
    if caller is None:
        return
    spec = obj(caller, where=f"{where}.caller")
    if spec.get("type") != "direct":
        raise F.unsupported(
            f"{where}.caller.type", "only direct tool calls are supported ('direct')."
        )
    only_keys(spec, where=f"{where}.caller", allowed=("type",))
    compat.ignore(f"{where}.caller")  # how every call here is made

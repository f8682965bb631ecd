"""OpenAI Responses requests: a body -> the neutral conversation (answers: ``openai_responses_output``).

Input items fold into chat turns: ``reasoning``, assistant ``message``, ``function_call`` and
``custom_tool_call`` items of one turn become one assistant message (reasoning, then text, then
tool calls); ``*_output`` items become ``tool`` messages. Nothing is stored, so anything that
needs a stored response (``previous_response_id``, ``item_reference``...) is a 400. Every known
field is honoured, a documented no-op (counted as ignored), or a 400 naming it (``FIELDS``;
docs/frontend.md lists the same); unknown keys are ignored and counted (``compat``).

Tools come from ``tools`` and from ``additional_tools`` input items (Codex's code mode puts them
all there). A ``namespace`` groups tools: the model sees its tools flat, each under its own name
(``{namespace}{name}`` when that name is taken), with the namespace's description first, as Codex
flattens namespaces for backends without them; the answer's calls carry ``namespace`` and the
tool's own name again. Tool search cannot run here, so deferred tools (``defer_loading``) are
offered from the start and a ``tool_search`` tool is accepted and not offered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kvretention.dataplane.frontend import compat
from kvretention.dataplane.frontend.common import (
    Marks,
    ParsedRequest,
    joined,
    marks_of,
    records_ignored,
)
from kvretention.dataplane.frontend.openai_shared import (
    RESPONSES_IMAGE_DETAILS,
    F,
    breakpoint_encodings,
    enum,
    ignore_present,
    image,
    json_schema_format,
    metadata,
    obj,
    only_keys,
    opt_str,
    opt_strict,
    parameters_schema,
    reasoning_effort,
    refuse_set,
    req_str,
    sampling,
    tool_name,
    unknown_tool,
)
from kvretention.dataplane.frontend.resume import Resumer, context_bytes
from kvretention.dataplane.protocol import (
    ChatMessage,
    ContentPart,
    Reasoning,
    ReasoningControl,
    ResponseFormat,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    ToolGrammar,
    trusted,
)
from kvretention.hints.errors import ClientError
from kvretention.hints.intent import NO_HINTS, BreakpointMode
from kvretention.hints.openai import OPTIONS, hints_from_responses

HONOURED: Final = frozenset(
    {
        "model",
        "input",
        "instructions",
        "stream",
        "max_output_tokens",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "reasoning",
        "prompt_cache_options",
        "prompt_cache_key",
        "prompt_cache_retention",
    }
)
NO_OP: Final = frozenset(
    {
        "store",
        "include",
        "metadata",
        "user",
        "safety_identifier",
        "service_tier",
        "stream_options",
        "truncation",
        "max_tool_calls",
        "client_metadata",
    }
)
"""Accepted and type-checked; nothing here acts on them (docs/frontend.md says why for each).
Each is counted as ignored when set, except the two a session key may be read from."""
_SESSION_SOURCES: Final = frozenset({"metadata", "client_metadata"})
_NO_STORE: Final = "this server keeps no stored responses, conversations or prompts."
REFUSED: Final[Mapping[str, str]] = {
    "previous_response_id": _NO_STORE,
    "conversation": _NO_STORE,
    "prompt": _NO_STORE,
    "background": "background responses are not supported.",
    "background_options": "background responses are not supported.",
    "top_logprobs": "log probabilities are not supported.",
    "context_management": "server-side context management is not supported.",
    "moderation": "moderation is not supported.",
    "image": "image generation is not supported.",
    "access_programs": "programmatic tool calling is not supported.",
}
FIELDS: Final = HONOURED | NO_OP | frozenset(REFUSED)

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
_REASONING_CONTEXTS: Final = ("auto", "current_turn", "all_turns")
DEFAULT_NAMESPACE: Final = "functions"
"""The namespace of plain function tools (``functions.exec``). Codex's code mode wraps its plain
tools in it and routes a call to one by name alone: such a call is answered without ``namespace``,
as in Codex's own recorded tool turn."""
_TOOL_CHOICES: Final = ("none", "auto", "required")


# -- parsing -----------------------------------------------------------------------------------


@records_ignored
def parse_responses(
    body: dict[str, Any],
    *,
    hints: bool = True,
    breakpoints: BreakpointMode = "prefix",
    resumer: Resumer | None = None,
) -> ParsedRequest:
    """A ``/v1/responses`` body -> ``ParsedRequest``; raises ``ClientError``.

    With ``hints=False`` the prompt-cache fields are not interpreted: accepted and ignored. In
    ``prefix`` mode a part's ``prompt_cache_breakpoint`` puts ``retain_ttl`` on that part.
    """
    listed = body.get("input")
    encoded = resumer.encode_items(listed) if resumer is not None and type(listed) is list else None
    cache = (
        hints_from_responses(
            body,
            breakpoints=breakpoints,
            encoded=breakpoint_encodings(listed, encoded, resumer=resumer),
        )
        if hints
        else NO_HINTS
    )
    envelope = cache.envelope
    model = F.required_str(body, "model")
    only_keys(body, where="", allowed=FIELDS)
    refuse_set(body, REFUSED)
    no_ops = _no_ops(body)
    additional = (
        None
        if resumer is None or encoded is None or type(listed) is not list
        else resumer.names(listed, encoded, _ADDITIONAL_TOOLS)
    )
    raw_tools, tools, origin = _all_tools(body, named=additional)
    messages: list[ChatMessage] = []
    instructions = F.opt_str(body, "instructions")
    if instructions:
        messages.append(trusted(ChatMessage, role="system", content=instructions))
    if "input" not in body:
        raise F.missing("input")
    items = body["input"]
    if isinstance(items, str):
        messages.append(trusted(ChatMessage, role="user", content=items))
    elif isinstance(items, list):
        marks = marks_of(cache, F.path)
        messages += _fold(items, marks=marks, origin=origin, resumer=resumer, encoded=encoded)
    else:
        raise F.invalid_type("input", items, expected="a string or an array")
    if not any(m.role != "system" for m in messages):
        raise F.invalid_value("input", "the input has no user or assistant message.")
    tool_choice, allowed = _tool_choice(body.get("tool_choice"), tools=tools)
    parallel = F.opt_bool(body, "parallel_tool_calls", default=True)
    text_format, text_echo = _text(body.get("text"))
    control, reasoning_echo = _reasoning_control(body.get("reasoning"))
    max_tokens = F.opt_int(body, "max_output_tokens", minimum=1)
    params = sampling(body, max_tokens=max_tokens, stop_key=None)
    cache_key = body.get("prompt_cache_key")  # type-checked by the normalizer when hints are on
    echo: dict[str, Any] = {
        "instructions": instructions,
        "max_output_tokens": max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "metadata": metadata(body),
        "prompt_cache_key": cache_key if isinstance(cache_key, str) else None,
        "tools": raw_tools,
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": parallel,
        "text": text_echo,
        "reasoning": reasoning_echo,
        **no_ops,
    }
    return ParsedRequest(
        model=model,
        messages=messages,
        sampling=params,
        stream=F.opt_bool(body, "stream"),
        envelope=envelope,
        hint_param=OPTIONS if envelope is not None else None,
        include_usage=True,
        echo=echo,
        tools=allowed,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        response_format=text_format,
        reasoning=control,
        client_controls=cache.client_controls,
        tool_origin={
            n: (o.namespace, o.name)
            for n, o in origin.items()
            if o.namespace is not None and o.namespace != DEFAULT_NAMESPACE
        },
    )


def _no_ops(body: Mapping[str, Any]) -> dict[str, Any]:
    """Type-check the documented no-ops; returns those the response object repeats."""
    ignore_present(body, NO_OP - _SESSION_SOURCES)
    F.opt_bool(body, "store")
    include = body.get("include")
    if include is not None and (
        not isinstance(include, list) or not all(isinstance(i, str) for i in include)
    ):
        raise F.invalid_type("include", include, expected="an array of strings")
    options = body.get("stream_options")
    if options is not None:
        only_keys(
            obj(options, where="stream_options"),
            where="stream_options",
            allowed=("include_obfuscation",),
        )
    truncation = enum(body, "truncation", where="", values=("disabled", "auto"))
    if truncation == "auto":
        raise F.unsupported("truncation", "'auto' truncation is not supported; use 'disabled'.")
    max_tool_calls = F.opt_int(body, "max_tool_calls", minimum=1)
    _string_map(body, "client_metadata")  # Codex's per-request tags: nothing here reads them
    return {
        "user": F.opt_str(body, "user"),
        "safety_identifier": F.opt_str(body, "safety_identifier"),
        "service_tier": F.opt_str(body, "service_tier"),
        "truncation": "disabled",
        "max_tool_calls": max_tool_calls,
        "store": False,  # nothing is ever stored here, whatever the client asked
    }


def _string_map(body: Mapping[str, Any], key: str) -> None:
    value = body.get(key)
    if value is None:
        return
    if not isinstance(value, dict):
        raise F.invalid_type(key, value, expected="an object")
    for name, item in value.items():
        if not isinstance(item, str):
            raise F.invalid_type(f"{key}.{name}", item, expected="a string")


def _fold(
    items: list[Any],
    *,
    marks: Marks,
    origin: Mapping[str, _Origin],
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
            return  # its tools joined the tool list (``_all_tools``)
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
        arguments = req_str(item, "input" if custom else "arguments", where=where)
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
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise F.invalid_type(where, raw, expected="an array")
    out: list[str] = []
    for i, part in enumerate(raw):
        at = f"{where}[{i}]"
        entry = obj(part, where=at)
        only_keys(entry, where=at, allowed=("type", "text"))
        if entry.get("type") not in kinds:
            expected = ", ".join(f"'{k}'" for k in kinds)
            raise F.invalid_value(f"{at}.type", f"{entry.get('type')!r}. Expected {expected}.")
        out.append(req_str(entry, "text", where=at))
    return out


def _content(content: object, *, where: str, images: bool, marks: Marks) -> str | list[ContentPart]:
    """String content, or parts (see :func:`joined`); a marked part gets its ``retain_ttl``."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise F.invalid_type(where, content, expected="a string or an array of content parts")
    parts: list[ContentPart] = []
    for j, raw in enumerate(content):
        param = f"{where}[{j}]"
        part = obj(raw, where=param)
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
            parts.append(picture.model_copy(update={"retain_ttl": marks.get(param)}))
        else:
            text = req_str(part, _TEXT_PARTS[str(kind)], where=param)
            parts.append(trusted(TextPart, text=text, retain_ttl=marks.get(param)))
    return joined(parts)


@dataclass(frozen=True)
class _Origin:
    """Where a tool the model sees was declared: its namespace (``None``: none) and own name."""

    namespace: str | None
    name: str
    where: str


_ADDITIONAL_TOOLS: Final = b'"additional_tools"'


def _all_tools(
    body: Mapping[str, Any], *, named: list[bool] | None = None
) -> tuple[list[dict[str, Any]], list[ToolDefinition], dict[str, _Origin]]:
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


_Declared = tuple[_Origin, ToolDefinition, str | None]
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
        out.append((_Origin(None, definition.name, at), definition, None))
    return out


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
            strict=opt_strict(tool, where=where),
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
        out.append((_Origin(namespace, definition.name, at), definition, description))
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


def _flatten(declared: list[_Declared]) -> tuple[list[ToolDefinition], dict[str, _Origin]]:
    """The tools the model sees, and each one's origin. A namespaced tool keeps its own name
    unless another tool has it; then it is ``{namespace}{name}`` (Codex's own flattening)."""
    counts: dict[str, int] = {}
    for origin, _, _ in declared:
        counts[origin.name] = counts.get(origin.name, 0) + 1
    tools: list[ToolDefinition] = []
    seen: dict[str, _Origin] = {}
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


def _tool_choice(
    raw: object, *, tools: list[ToolDefinition]
) -> tuple[ToolChoice, list[ToolDefinition]]:
    """The choice, and the tools the template shows (``allowed_tools`` narrows them)."""
    if raw is None:
        return ToolChoice(), tools
    if isinstance(raw, str):
        if raw not in _TOOL_CHOICES:
            supported = ", ".join(f"'{c}'" for c in _TOOL_CHOICES)
            raise F.invalid_value("tool_choice", f"'{raw}'. Supported values are: {supported}.")
        if raw == "required" and not tools:
            raise _no_tools()
        return ToolChoice(mode=raw), tools
    choice = obj(raw, where="tool_choice")
    kind = choice.get("type")
    if kind in ("function", "custom"):
        only_keys(choice, where="tool_choice", allowed=("type", "name"))
        name = req_str(choice, "name", where="tool_choice")
        if not any(t.name == name and t.kind == kind for t in tools):
            raise unknown_tool("tool_choice.name", name)
        return ToolChoice(mode="named", name=name), tools
    if kind == "allowed_tools":
        return _allowed_tools(choice, tools=tools)
    raise F.unsupported(
        "tool_choice.type",
        f"tool_choice of type {kind!r} is not supported; use 'function', 'custom' or "
        "'allowed_tools'.",
    )


def _no_tools() -> ClientError:
    return F.invalid_value("tool_choice", "'required' needs at least one tool in 'tools'.")


def _allowed_tools(
    choice: Mapping[str, Any], *, tools: list[ToolDefinition]
) -> tuple[ToolChoice, list[ToolDefinition]]:
    only_keys(choice, where="tool_choice", allowed=("type", "mode", "tools"))
    mode = enum(choice, "mode", where="tool_choice", values=("auto", "required"))
    listed = choice.get("tools")
    if not isinstance(listed, list) or not listed:
        raise F.invalid_type("tool_choice.tools", listed, expected="a non-empty array")
    names: set[str] = set()
    for i, item in enumerate(listed):
        at = f"tool_choice.tools[{i}]"
        entry = obj(item, where=at)
        only_keys(entry, where=at, allowed=("type", "name"))
        name = req_str(entry, "name", where=at)
        if not any(t.name == name and t.kind == entry.get("type") for t in tools):
            raise unknown_tool(f"{at}.name", name)
        names.add(name)
    return (
        ToolChoice(mode="required" if mode == "required" else "auto"),
        [t for t in tools if t.name in names],
    )


def _text(raw: object) -> tuple[ResponseFormat | None, dict[str, Any]]:
    """``text.format`` -> structured output; ``text.verbosity`` is echoed only (a no-op)."""
    if raw is None:
        return None, {"format": {"type": "text"}, "verbosity": "medium"}
    text = obj(raw, where="text")
    only_keys(text, where="text", allowed=("format", "verbosity"))
    verbosity = enum(text, "verbosity", where="text", values=("low", "medium", "high"))
    if verbosity is not None:
        compat.ignore("text.verbosity")  # echoed; the model is not told
    echo: dict[str, Any] = {"format": {"type": "text"}, "verbosity": verbosity or "medium"}
    fmt_raw = text.get("format")
    if fmt_raw is None:
        return None, echo
    fmt = obj(fmt_raw, where="text.format")
    echo["format"] = fmt
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        only_keys(fmt, where="text.format", allowed=("type",))
        return (None if kind == "text" else ResponseFormat(type="json_object")), echo
    if kind == "json_schema":
        only_keys(
            fmt, where="text.format", allowed=("type", "name", "schema", "strict", "description")
        )
        return json_schema_format(fmt, where="text.format"), echo
    raise F.invalid_value(
        "text.format.type", f"{kind!r}. Supported values are: 'text', 'json_object', 'json_schema'."
    )


def _reasoning_control(raw: object) -> tuple[ReasoningControl | None, dict[str, Any]]:
    if raw is None:
        return None, {"effort": None, "summary": None}
    spec = obj(raw, where="reasoning")
    only_keys(
        spec,
        where="reasoning",
        allowed=("effort", "summary", "generate_summary", "mode", "context"),
    )
    # which turns' replayed reasoning the model sees is the chat template's rule here: every
    # replayed reasoning item travels, and the template renders what it renders
    if enum(spec, "context", where="reasoning", values=_REASONING_CONTEXTS) is not None:
        compat.ignore("reasoning.context")
    mode = enum(spec, "mode", where="reasoning", values=("standard", "pro"))
    if mode == "pro":
        raise F.unsupported("reasoning.mode", "only 'standard' reasoning is supported.")
    summaries = ("auto", "concise", "detailed")
    summary = enum(spec, "summary", where="reasoning", values=summaries)
    summary = summary or enum(spec, "generate_summary", where="reasoning", values=summaries)
    control = reasoning_effort(spec.get("effort"), param="reasoning.effort")
    return control, {"effort": spec.get("effort"), "summary": summary}

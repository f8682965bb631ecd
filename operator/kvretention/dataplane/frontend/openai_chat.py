"""OpenAI Chat Completions: a request body -> the neutral conversation, and the answer back.

Parsing is pure: the cache controls go through ``kvretention.hints`` first (so a refused control is
reported even on an otherwise unusual body), then every known field is honoured, a documented no-op
(counted as ignored), or a 400 naming it (``FIELDS`` below; docs/frontend.md lists the same);
unknown keys are ignored and counted (``compat``). Output follows the objects the
official SDK parses: ``chat.completion`` / ``chat.completion.chunk`` + ``data: [DONE]``, tool calls
streamed by index (id, type and name first, then argument fragments), reasoning as
``reasoning_content`` as SGLang's, vLLM's and DeepSeek's servers send it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kvretention.dataplane.frontend import compat, sse
from kvretention.dataplane.frontend.common import (
    Completion,
    Marks,
    ParsedRequest,
    joined,
    marks_of,
    records_ignored,
)
from kvretention.dataplane.frontend.errors import FrontendError, openai_error_body
from kvretention.dataplane.frontend.openai_shared import (
    F,
    breakpoint_encodings,
    chat_usage,
    enum,
    ignore_present,
    image,
    json_schema_format,
    logit_bias,
    metadata,
    no_tools,
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
from kvretention.dataplane.frontend.resume import Resumer
from kvretention.dataplane.protocol import (
    ChatMessage,
    ContentPart,
    GenerateChunk,
    Reasoning,
    ResponseFormat,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
    Usage,
    trusted,
)
from kvretention.hints.intent import NO_HINTS, BreakpointMode
from kvretention.hints.openai import OPTIONS, hints_from_chat_completions

HONOURED: Final = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "max_completion_tokens",
        "max_tokens",
        "temperature",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "stop",
        "seed",
        "logit_bias",
        "n",
        "logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "reasoning_effort",
        "prompt_cache_options",
        "prompt_cache_key",
        "prompt_cache_retention",
    }
)
NO_OP: Final = frozenset(
    {"metadata", "store", "user", "safety_identifier", "service_tier", "verbosity", "modalities"}
)
"""Accepted and type-checked; nothing here acts on them (docs/frontend.md says why for each)."""
REFUSED: Final[Mapping[str, str]] = {
    "functions": "the legacy 'functions' parameter is not supported; use 'tools'.",
    "function_call": "the legacy 'function_call' parameter is not supported; use 'tool_choice'.",
    "audio": "audio output is not supported.",
    "prediction": "predicted outputs are not supported.",
    "web_search_options": "web search is not supported.",
    "moderation": "moderation is not supported.",
    "top_logprobs": "log probabilities are not supported.",
}
FIELDS: Final = HONOURED | NO_OP | frozenset(REFUSED)

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
_TOOL_CHOICES: Final = ("none", "auto", "required")


# -- parsing -----------------------------------------------------------------------------------


@records_ignored
def parse_chat(
    body: dict[str, Any],
    *,
    hints: bool = True,
    breakpoints: BreakpointMode = "prefix",
    resumer: Resumer | None = None,
) -> ParsedRequest:
    """A ``/v1/chat/completions`` body -> ``ParsedRequest``; raises ``ClientError``.

    With ``hints=False`` the prompt-cache fields are not interpreted: accepted and ignored. In
    ``prefix`` mode a part's ``prompt_cache_breakpoint`` puts ``retain_ttl`` on that part.
    """
    listed = body.get("messages")
    encoded = resumer.encode_items(listed) if resumer is not None and type(listed) is list else None
    cache = (
        hints_from_chat_completions(
            body,
            breakpoints=breakpoints,
            encoded=breakpoint_encodings(listed, encoded, resumer=resumer),
        )
        if hints
        else NO_HINTS
    )
    envelope = cache.envelope
    marks = marks_of(cache, F.path)
    model = F.required_str(body, "model")
    if "messages" not in body:
        raise F.missing("messages")
    raw = body["messages"]
    if not isinstance(raw, list):
        raise F.invalid_type("messages", raw, expected="an array")
    if not raw:
        raise F.invalid_value("messages", "[] is too short - 'messages' must not be empty.")
    messages = _fold(raw, marks=marks, resumer=resumer, encoded=encoded)
    only_keys(body, where="", allowed=FIELDS)
    refuse_set(body, REFUSED)
    _check_no_ops(body)
    n = F.opt_int(body, "n", minimum=1)
    if n is not None and n != 1:
        raise F.unsupported("n", "only one choice per request (n=1) is supported.")
    if F.opt_bool(body, "logprobs"):
        raise F.unsupported("logprobs", "log probabilities are not supported.")
    max_tokens = F.opt_int(body, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = F.opt_int(body, "max_tokens", minimum=1)
    options = body.get("stream_options")
    if options is not None:
        only_keys(
            obj(options, where="stream_options"),
            where="stream_options",
            allowed=("include_usage", "include_obfuscation"),
        )
        ignore_present(options, ("include_obfuscation",), where="stream_options")
    include_usage = bool(options and options.get("include_usage") is True)
    tools = _tools(body, resumer=resumer)
    return ParsedRequest(
        model=model,
        messages=messages,
        sampling=sampling(body, max_tokens=max_tokens, logit_bias=logit_bias(body)),
        stream=F.opt_bool(body, "stream"),
        envelope=envelope,
        hint_param=OPTIONS if envelope is not None else None,
        include_usage=include_usage,
        tools=_allowed(tools, body),
        tool_choice=_tool_choice(body.get("tool_choice"), tools=tools),
        parallel_tool_calls=F.opt_bool(body, "parallel_tool_calls", default=True),
        response_format=_response_format(body.get("response_format")),
        reasoning=reasoning_effort(body.get("reasoning_effort"), param="reasoning_effort"),
        client_controls=cache.client_controls,
    )


@dataclass(frozen=True)
class _Fold:
    """The message loop's state: the neutral messages so far, and tool call id -> tool name."""

    messages: list[ChatMessage]
    calls: dict[str, str]

    def copy(self) -> _Fold:
        return _Fold(list(self.messages), dict(self.calls))


def _fold(
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


def _check_no_ops(body: Mapping[str, Any]) -> None:
    ignore_present(body, NO_OP - {"metadata"})  # metadata may hold the session key
    metadata(body)
    F.opt_bool(body, "store")
    for key in ("user", "safety_identifier", "service_tier"):  # prompt_cache_*: the normalizer's
        F.opt_str(body, key)
    enum(body, "verbosity", where="", values=("low", "medium", "high"))
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise F.unsupported("modalities", "only text output (['text']) is supported.")


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


def _history_calls(raw: object, *, where: str) -> list[ToolCall]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise F.invalid_type(where, raw, expected="an array")
    out: list[ToolCall] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        call = obj(item, where=at)
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
        arguments = req_str(function, "arguments", where=f"{at}.function")
        if not call_id or not name:
            raise F.invalid_value(f"{at}", "a tool call needs a non-empty 'id' and 'name'.")
        out.append(trusted(ToolCall, id=call_id, name=name, arguments=arguments))
    return out


def _content(content: object, *, where: str, role: str, marks: Marks) -> str | list[ContentPart]:
    """A string, or parts (see :func:`joined`); a marked part gets its ``retain_ttl``."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise F.invalid_type(where, content, expected="a string or an array of content parts")
    kinds = _PARTS_BY_ROLE.get(role, ("text",))
    parts: list[ContentPart] = []
    for j, raw in enumerate(content):
        param = f"{where}[{j}]"
        part = obj(raw, where=param)
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
            parts.append(picture.model_copy(update={"retain_ttl": marks.get(param)}))
        else:
            text = req_str(part, kind, where=param)
            parts.append(trusted(TextPart, text=text, retain_ttl=marks.get(param)))
    return joined(parts)


def _tools(body: Mapping[str, Any], *, resumer: Resumer | None) -> list[ToolDefinition]:
    """The tools; parsed once per tools list the resumer shares between bodies (an agent's
    every turn: the same bytes, the same definitions)."""
    raw = body.get("tools")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise F.invalid_type("tools", raw, expected="an array")
    made = (
        _parse_tools(raw) if resumer is None else resumer.derived(raw, "chat.tools", _parse_tools)
    )
    tools, ignored = made
    compat.record(ignored)  # what the parse met, met again on every body that shares it
    return list(tools)


def _parse_tools(raw: list[Any]) -> tuple[tuple[ToolDefinition, ...], tuple[str, ...]]:
    """The definitions, and the fields the parse recorded as ignored (in order)."""
    ignored: dict[str, None] = {}
    try:
        with compat.collecting() as ignored:
            tools = _tool_list(raw)
    except BaseException:
        compat.record(ignored)  # as a parse in place would have, before its error
        raise
    return tuple(tools), tuple(ignored)


def _tool_list(raw: list[Any]) -> list[ToolDefinition]:
    tools: list[ToolDefinition] = []
    for i, item in enumerate(raw):
        where = f"tools[{i}]"
        tool = obj(item, where=where)
        kind = tool.get("type")
        if kind != "function":
            raise F.unsupported(
                f"{where}.type", f"tools of type {kind!r} are not supported; use 'function'."
            )
        only_keys(tool, where=where, allowed=("type", "function"))
        if "function" not in tool:
            raise F.missing(f"{where}.function")
        at = f"{where}.function"
        function = obj(tool["function"], where=at)
        only_keys(function, where=at, allowed=("name", "description", "parameters", "strict"))
        name = tool_name(function, where=at)
        if any(t.name == name for t in tools):
            raise F.invalid_value(f"{at}.name", f"the tool name '{name}' is used twice.")
        tools.append(
            ToolDefinition(
                name=name,
                description=opt_str(function, "description", where=at),
                parameters=parameters_schema(function, where=at),
                strict=opt_strict(function, where=at),
            )
        )
    return tools


def _tool_choice(raw: object, *, tools: list[ToolDefinition]) -> ToolChoice:
    if raw is None:
        return ToolChoice()
    if not tools:
        raise no_tools("tool_choice")
    if isinstance(raw, str):
        if raw not in _TOOL_CHOICES:
            supported = ", ".join(f"'{c}'" for c in _TOOL_CHOICES)
            raise F.invalid_value("tool_choice", f"'{raw}'. Supported values are: {supported}.")
        return ToolChoice(mode=raw)
    choice = obj(raw, where="tool_choice")
    kind = choice.get("type")
    if kind == "allowed_tools":
        spec = obj(choice.get("allowed_tools"), where="tool_choice.allowed_tools")
        mode = enum(spec, "mode", where="tool_choice.allowed_tools", values=("auto", "required"))
        return ToolChoice(mode="required" if mode == "required" else "auto")
    if kind != "function":
        raise F.unsupported(
            "tool_choice.type", f"tool_choice of type {kind!r} is not supported; use 'function'."
        )
    only_keys(choice, where="tool_choice", allowed=("type", "function"))
    function = obj(choice.get("function"), where="tool_choice.function")
    name = req_str(function, "name", where="tool_choice.function")
    if not any(t.name == name for t in tools):
        raise unknown_tool("tool_choice.function.name", name)
    return ToolChoice(mode="named", name=name)


def _allowed(tools: list[ToolDefinition], body: Mapping[str, Any]) -> list[ToolDefinition]:
    """``tool_choice: {type: allowed_tools}``: only the listed tools reach the template."""
    choice = body.get("tool_choice")
    if not isinstance(choice, dict) or choice.get("type") != "allowed_tools" or not tools:
        return tools
    only_keys(choice, where="tool_choice", allowed=("type", "allowed_tools"))
    where = "tool_choice.allowed_tools"
    spec = obj(choice.get("allowed_tools"), where=where)
    only_keys(spec, where=where, allowed=("mode", "tools"))
    listed = spec.get("tools")
    if not isinstance(listed, list) or not listed:
        raise F.invalid_type(f"{where}.tools", listed, expected="a non-empty array")
    names: set[str] = set()
    for i, item in enumerate(listed):
        at = f"{where}.tools[{i}]"
        entry = obj(item, where=at)
        if entry.get("type") != "function":
            raise F.unsupported(f"{at}.type", "only function tools can be allowed.")
        name = req_str(obj(entry.get("function"), where=f"{at}.function"), "name", where=at)
        if not any(t.name == name for t in tools):
            raise unknown_tool(f"{at}.function.name", name)
        names.add(name)
    return [t for t in tools if t.name in names]


def _response_format(raw: object) -> ResponseFormat | None:
    if raw is None:
        return None
    fmt = obj(raw, where="response_format")
    kind = fmt.get("type")
    if kind == "text":
        only_keys(fmt, where="response_format", allowed=("type",))
        return None
    if kind == "json_object":
        only_keys(fmt, where="response_format", allowed=("type",))
        return ResponseFormat(type="json_object")
    if kind == "json_schema":
        only_keys(fmt, where="response_format", allowed=("type", "json_schema"))
        if "json_schema" not in fmt:
            raise F.missing("response_format.json_schema")
        spec = obj(fmt["json_schema"], where="response_format.json_schema")
        only_keys(
            spec,
            where="response_format.json_schema",
            allowed=("name", "description", "schema", "strict"),
        )
        return json_schema_format(spec, where="response_format.json_schema")
    raise F.invalid_value(
        "response_format.type",
        f"{kind!r}. Supported values are: 'text', 'json_object', 'json_schema'.",
    )


# -- formatting --------------------------------------------------------------------------------

_FINISH: Final = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}


def _finish(reason: str | None, *, called: bool) -> str:
    if called:
        return "tool_calls"
    return _FINISH.get(reason or "stop", "stop")


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def chat_response(parsed: ParsedRequest, result: Completion, *, request_id: str) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` object."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if result.tool_calls and not result.shown_text else result.text,
        "refusal": None,
    }
    if result.reasoning:
        message["reasoning_content"] = result.reasoning
    if result.tool_calls:
        message["tool_calls"] = [_tool_call(c) for c in result.tool_calls]
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": parsed.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": _finish(result.finish_reason, called=bool(result.tool_calls)),
            }
        ],
        "usage": chat_usage(result.usage),
    }


class ChatStream:
    """``chat.completion.chunk`` frames, a final chunk with the finish reason, then ``[DONE]``."""

    def __init__(self, parsed: ParsedRequest, *, request_id: str) -> None:
        self._parsed = parsed
        self._rid = request_id
        self._id = f"chatcmpl-{request_id}"
        self._created = int(time.time())
        self._finish: str | None = None
        self._usage = Usage()
        self._calls: set[int] = set()

    def _frame(self, delta: dict[str, Any], *, finish: str | None = None) -> bytes:
        # strings, integers and None only: no float to write differently
        return sse.plain_event(
            {
                "id": self._id,
                "object": "chat.completion.chunk",
                "created": self._created,
                "model": self._parsed.model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
        )

    def start(self) -> bytes:
        return self._frame({"role": "assistant", "content": ""})

    def _call_delta(self, delta: ToolCallDelta) -> dict[str, Any]:
        """The first delta of a call names it (id, type, name); later ones carry fragments only."""
        if delta.index in self._calls:
            return {"index": delta.index, "function": {"arguments": delta.arguments}}
        self._calls.add(delta.index)
        return {
            "index": delta.index,
            "id": delta.id or f"call_{self._rid}_{delta.index}",
            "type": "function",
            "function": {"name": delta.name or "", "arguments": delta.arguments},
        }

    def chunk(self, chunk: GenerateChunk) -> bytes:
        if chunk.finish_reason is not None:
            self._finish = chunk.finish_reason
        if chunk.usage is not None:
            self._usage = chunk.usage
        delta: dict[str, Any] = {}
        if chunk.reasoning:
            delta["reasoning_content"] = chunk.reasoning
        if chunk.text:
            delta["content"] = chunk.text
        if chunk.tool_calls:
            delta["tool_calls"] = [self._call_delta(d) for d in chunk.tool_calls]
        return self._frame(delta) if delta else b""

    def finish(self) -> bytes:
        out = self._frame({}, finish=_finish(self._finish, called=bool(self._calls)))
        if self._parsed.include_usage:
            out += sse.event(
                {
                    "id": self._id,
                    "object": "chat.completion.chunk",
                    "created": self._created,
                    "model": self._parsed.model,
                    "choices": [],
                    "usage": chat_usage(self._usage),
                }
            )
        return out + sse.DONE

    def error(self, err: FrontendError) -> bytes:
        """OpenAI streams a failure as a ``data: {"error": ...}`` frame (the SDK raises on it)."""
        return sse.event(openai_error_body(err))

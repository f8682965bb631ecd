"""OpenAI Chat Completions requests: a ``/v1/chat/completions`` body -> ``ParsedRequest``.

Parsing is pure: the cache controls go through ``kvretention.hints`` first (so a refused control is
reported even on an otherwise unusual body), then every known field is honoured, a documented no-op
(counted as ignored), or a 400 naming it (``FIELDS`` below; docs/frontend.md lists the same);
unknown keys are ignored and counted (``compat``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import kvretention.dataplane.frontend.openai.sglang_fields as sglang
from kvretention.dataplane.frontend import compat
from kvretention.dataplane.frontend.common import Opener, Opening, ParsedRequest
from kvretention.dataplane.frontend.openai.chat_conversation import fold_messages
from kvretention.dataplane.frontend.openai.fields import (
    F,
    breakpoint_encodings,
    enum,
    ignore_present,
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
    string_tool_choice,
    tool_name,
    unknown_tool,
)
from kvretention.dataplane.frontend.resume import Resumer
from kvretention.dataplane.protocol import ResponseFormat, ToolChoice, ToolDefinition
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
ASKED_BY_EMPTY: Final = frozenset({"web_search_options"})
"""Refused fields whose empty object asks for the feature: ``"web_search_options": {}`` is how
a client turns on web search with its defaults."""
FIELDS: Final = HONOURED | NO_OP | frozenset(REFUSED) | sglang.FIELDS


_OPENER: Final = Opener(
    items="messages",
    read_hints=hints_from_chat_completions,
    skips=breakpoint_encodings,
    path=F.path,
)


@_OPENER.parser
def parse_chat(body: dict[str, Any], opening: Opening, resumer: Resumer | None) -> ParsedRequest:
    """A ``/v1/chat/completions`` body -> ``ParsedRequest``; raises ``ClientError``.

    In ``prefix`` mode a part's ``prompt_cache_breakpoint`` puts ``retain_ttl`` on that part.
    """
    cache, marks, encoded = opening.cache, opening.marks, opening.encoded
    envelope = cache.envelope
    model = F.required_str(body, "model")
    raw = F.required_list(
        body,
        "messages",
        expected="an array",
        empty="[] is too short - 'messages' must not be empty.",
    )
    messages = fold_messages(raw, marks=marks, resumer=resumer, encoded=encoded)
    only_keys(body, where="", allowed=FIELDS)
    refuse_set(body, REFUSED, asked_by_empty=ASKED_BY_EMPTY)
    refuse_set(body, sglang.REFUSED)
    separate, streamed = sglang.reasoning_shape(body)
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
    response_format = _response_format(body.get("response_format"))
    extra = sglang.sglang_sampling(body, max_tokens=max_tokens, response_format=response_format)
    base = sampling(body, max_tokens=max_tokens, logit_bias=logit_bias(body))
    kwargs = sglang.template_kwargs(body)
    effort = reasoning_effort(body.get("reasoning_effort"), param="reasoning_effort")
    return ParsedRequest(
        model=model,
        messages=messages,
        sampling=base.model_copy(update=extra) if extra else base,
        stream=F.opt_bool(body, "stream"),
        envelope=envelope,
        hint_param=OPTIONS if envelope is not None else None,
        include_usage=include_usage,
        tools=_allowed(tools, body),
        tool_choice=_tool_choice(body.get("tool_choice"), tools=tools),
        parallel_tool_calls=F.opt_bool(body, "parallel_tool_calls", default=True),
        response_format=response_format,
        reasoning=sglang.thinking_switch(kwargs, effort),
        template_kwargs=kwargs,
        continue_final_message=F.opt_bool(body, "continue_final_message"),
        separate_reasoning=separate,
        stream_reasoning=streamed,
        client_controls=cache.client_controls,
    )


def _check_no_ops(body: Mapping[str, Any]) -> None:
    ignore_present(body, NO_OP - {"metadata"})  # metadata may hold the session key
    ignore_present(body, sglang.NO_OP)
    metadata(body)
    F.opt_bool(body, "store")
    for key in ("user", "safety_identifier", "service_tier"):  # prompt_cache_*: the normalizer's
        F.opt_str(body, key)
    enum(body, "verbosity", where="", values=("low", "medium", "high"))
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise F.unsupported("modalities", "only text output (['text']) is supported.")


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
        return string_tool_choice(raw)
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

"""OpenAI Responses requests: a ``/v1/responses`` body -> ``ParsedRequest`` (answers:
``responses_answer``).

Nothing is stored, so anything that needs a stored response (``previous_response_id``,
``item_reference``...) is a 400. Every known field is honoured, a documented no-op (counted as
ignored), or a 400 naming it (``FIELDS``; docs/frontend.md lists the same); unknown keys are
ignored and counted (``compat``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import kvretention.dataplane.frontend.openai.sglang_fields as sglang
from kvretention.dataplane.frontend import compat
from kvretention.dataplane.frontend.common import Opener, Opening, ParsedRequest
from kvretention.dataplane.frontend.openai.fields import (
    F,
    breakpoint_encodings,
    enum,
    ignore_present,
    json_schema_format,
    metadata,
    obj,
    only_keys,
    reasoning_effort,
    refuse_set,
    req_str,
    sampling,
    string_tool_choice,
    unknown_tool,
)
from kvretention.dataplane.frontend.openai.responses_conversation import fold_items
from kvretention.dataplane.frontend.openai.responses_tools import (
    ADDITIONAL_TOOLS,
    DEFAULT_NAMESPACE,
    ToolOrigin,
    all_tools,
)
from kvretention.dataplane.frontend.resume import Resumer
from kvretention.dataplane.protocol import (
    ChatMessage,
    ReasoningControl,
    ResponseFormat,
    ToolChoice,
    ToolDefinition,
    trusted,
)
from kvretention.hints.errors import ClientError
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
        "seed",
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
FIELDS: Final = HONOURED | NO_OP | frozenset(REFUSED) | sglang.RESPONSES_FIELDS
_REASONING_CONTEXTS: Final = ("auto", "current_turn", "all_turns")


_OPENER: Final = Opener(
    items="input", read_hints=hints_from_responses, skips=breakpoint_encodings, path=F.path
)


@_OPENER.parser
def parse_responses(
    body: dict[str, Any], opening: Opening, resumer: Resumer | None
) -> ParsedRequest:
    """A ``/v1/responses`` body -> ``ParsedRequest``; raises ``ClientError``.

    In ``prefix`` mode a part's ``prompt_cache_breakpoint`` puts ``retain_ttl`` on that part.
    """
    cache, encoded = opening.cache, opening.encoded
    envelope = cache.envelope
    model = F.required_str(body, "model")
    only_keys(body, where="", allowed=FIELDS)
    refuse_set(body, REFUSED)
    refuse_set(body, sglang.RESPONSES_REFUSED)
    ignore_present(body, sglang.RESPONSES_NO_OP)
    no_ops = _no_ops(body)
    listed = body.get("input")
    additional = (
        None
        if resumer is None or encoded is None or type(listed) is not list
        else resumer.names(listed, encoded, ADDITIONAL_TOOLS)
    )
    raw_tools, tools, origin = all_tools(body, named=additional)
    instructions = F.opt_str(body, "instructions")
    messages = _conversation(body, instructions, opening, origin=origin, resumer=resumer)
    tool_choice, allowed = _tool_choice(body.get("tool_choice"), tools=tools)
    parallel = F.opt_bool(body, "parallel_tool_calls", default=True)
    text_format, text_echo = _text(body.get("text"))
    control, reasoning_echo = _reasoning_control(body.get("reasoning"))
    max_tokens = F.opt_int(body, "max_output_tokens", minimum=1)
    base = sampling(body, max_tokens=max_tokens)
    extra = sglang.shared_sampling(body)
    params = base.model_copy(update=extra) if extra else base
    kwargs = sglang.template_kwargs(body)
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
        reasoning=sglang.thinking_switch(kwargs, control),
        template_kwargs=kwargs,
        client_controls=cache.client_controls,
        tool_origin={
            n: (o.namespace, o.name)
            for n, o in origin.items()
            if o.namespace is not None and o.namespace != DEFAULT_NAMESPACE
        },
    )


def _conversation(
    body: dict[str, Any],
    instructions: str | None,
    opening: Opening,
    *,
    origin: dict[str, ToolOrigin],
    resumer: Resumer | None,
) -> list[ChatMessage]:
    """``instructions`` as the system message, then ``input`` (a string or items) folded into
    the neutral conversation; a conversation with no user or assistant message is refused."""
    messages: list[ChatMessage] = []
    if instructions:
        messages.append(trusted(ChatMessage, role="system", content=instructions))
    if "input" not in body:
        raise F.missing("input")
    items = body["input"]
    if isinstance(items, str):
        messages.append(trusted(ChatMessage, role="user", content=items))
    elif isinstance(items, list):
        messages += fold_items(
            items, marks=opening.marks, origin=origin, resumer=resumer, encoded=opening.encoded
        )
    else:
        raise F.invalid_type("input", items, expected="a string or an array")
    if not any(m.role != "system" for m in messages):
        raise F.invalid_value("input", "the input has no user or assistant message.")
    return messages


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


def _tool_choice(
    raw: object, *, tools: list[ToolDefinition]
) -> tuple[ToolChoice, list[ToolDefinition]]:
    """The choice, and the tools the template shows (``allowed_tools`` narrows them)."""
    if raw is None:
        return ToolChoice(), tools
    if isinstance(raw, str):
        given = string_tool_choice(raw)
        if given.mode == "required" and not tools:
            raise _no_tools()
        return given, tools
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

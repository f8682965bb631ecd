"""Anthropic Messages: request parsing and response/SSE formatting.

The top-level ``cache_control`` is normalized (and block-level ones refused) by
``kvretention.hints.anthropic`` before the rest of the body is checked. Every other top-level field,
block type and block key is one of: honoured, accepted and ignored (``NO_OPS``, counted by
``compat``), or a 400 naming it (``REFUSED``). Keys this server does not know are ignored and
counted; block and tool types it does not know are refused (``compat``'s rule). Deferred tools
(``defer_loading``) stay out of the prompt's tool list until a ``tool_reference`` block in a tool
result loads them, as Anthropic's tool search does. The stream follows the
Messages event sequence the official SDK parses: ``message_start``, then for each content block
(``thinking``, ``text``, ``tool_use``, each its own index) ``content_block_start``,
``content_block_delta``..., ``content_block_stop``; then ``message_delta`` and ``message_stop``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from kvretention.dataplane.frontend import compat, sse
from kvretention.dataplane.frontend.common import (
    Completion,
    Marks,
    ParsedRequest,
    joined,
    marks_of,
    records_ignored,
)
from kvretention.dataplane.frontend.errors import FrontendError, anthropic_error_body
from kvretention.dataplane.frontend.resume import Resumer, context_bytes
from kvretention.dataplane.frontend.validate import Fields
from kvretention.dataplane.protocol import (
    ChatMessage,
    ContentPart,
    GenerateChunk,
    ImagePart,
    Reasoning,
    ReasoningControl,
    ResponseFormat,
    SamplingParams,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    Usage,
    trusted,
)
from kvretention.hints.anthropic import CACHE_CONTROL, hints_from_messages
from kvretention.hints.errors import ClientError
from kvretention.hints.intent import NO_HINTS, BreakpointMode

log = logging.getLogger("kvretention.frontend")

F: Final = Fields(anthropic=True)
OMIT_THINKING: Final = "omit_thinking"
"""``ParsedRequest.echo`` key: the client asked for ``thinking.display: omitted``."""
_STOP: Final = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_MAX_STOP_SEQUENCES: Final = 8
_MIN_THINKING_BUDGET: Final = 1024
_IMAGE_TYPES: Final = ("image/jpeg", "image/png", "image/gif", "image/webp")
_EFFORT: Final[Mapping[str, Literal["low", "medium", "high"]]] = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}
"""``output_config.effort`` -> the neutral effort; ``xhigh`` and ``max`` are the highest we have."""

# -- which top-level fields exist, and what happens to each ------------------------------------

_HONOURED: Final = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "stream",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        CACHE_CONTROL,
    }
)
NO_OPS: Final[Mapping[str, str]] = {
    "metadata": "validated (user_id); a session source, never forwarded to the engine",
    "service_tier": "validated ('auto' or 'standard_only'); one tier here",
    "inference_geo": "validated (a string); one location here",
    "speed": "validated ('standard' or 'fast'); one speed here",
    "user_profile_id": "validated (a string); no accounts here",
    "workspace_id": "validated (a string); no workspaces here",
    "context_management": "only the no-op edit clear_thinking_20251015 with keep 'all' is accepted",
    "safeguards": "a list; no safety classifier runs here, so nothing is ever flagged",
    "diagnostics": "cache-miss diagnostics are not reported here",
    "fallbacks": "one model here: nothing to fall back to",
    "fallback_credit_token": "one model here: nothing to fall back to",
    "billing_policy": "no billing here",
}
"""Accepted, checked where they have a shape, and without effect on what the model computes
(listed in docs/frontend.md); each is counted as ignored except ``metadata``, which the frontend
reads for the session."""
REFUSED: Final[Mapping[str, str]] = {
    "container": "code-execution containers are not available on this server",
    "mcp_servers": "MCP connectors are not available on this server",
    "compaction": "server-side compaction is not available on this server",
    "thread": "threads are not available on this server",
    "output_format": "use output_config.format for structured output",
}
"""Real Messages fields that would change the answer and are not implemented: a 400 naming them,
never a silent drop."""
_COUNT_FIELDS: Final = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        CACHE_CONTROL,
        "speed",
        "user_profile_id",
        "workspace_id",
        "context_management",
    }
)
"""``/v1/messages/count_tokens`` takes the prompt-shaping fields (as Anthropic's does); others are
ignored and counted."""

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
_THINKING_DISPLAYS: Final = ("summarized", "omitted", "updates")
"""``omitted`` returns thinking blocks with a signature and no text; ``summarized`` and Claude
Code's ``updates`` return the reasoning the model wrote (it is never re-summarized here)."""
_PARALLEL: Final = "disable_parallel_tool_use"
_TOOL_CHOICE_KEYS: Final[Mapping[str, frozenset[str]]] = {
    "auto": frozenset({_PARALLEL}),
    "any": frozenset({_PARALLEL}),
    "tool": frozenset({"name", _PARALLEL}),
    "none": frozenset(),
}
_TOOL_CHOICE_MODES: Final[Mapping[str, Literal["auto", "required", "none"]]] = {
    "auto": "auto",
    "any": "required",
    "none": "none",
}
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


@dataclass(frozen=True)
class _Conversation:
    """The converted messages plus what tool_choice validation needs to know."""

    messages: list[ChatMessage]
    tools: list[ToolDefinition]
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    reasoning: ReasoningControl | None
    response_format: ResponseFormat | None
    omit_thinking: bool
    """``thinking.display: omitted``: answer thinking blocks with a signature and no text."""
    deferred_tools: list[ToolDefinition]


@records_ignored
def parse_messages(
    body: dict[str, Any],
    *,
    hints: bool = True,
    breakpoints: BreakpointMode = "prefix",
    resumer: Resumer | None = None,
) -> ParsedRequest:
    """A ``/v1/messages`` body -> ``ParsedRequest``; raises ``ClientError``.

    With ``hints=False`` (Anthropic hints turned off for the fleet) ``cache_control`` is not
    interpreted at all: accepted and ignored, as a server without prompt caching would. In
    ``prefix`` mode each block-level ``cache_control`` puts ``retain_ttl`` on the neutral element
    made from its block; ``reject`` refuses them (v1).
    """
    encoded = _encoded_messages(body, resumer=resumer)
    named = encoded
    if encoded is not None and resumer is not None:  # no scan of a message an earlier body held
        named = resumer.control_items(body["messages"], encoded)
    cache = hints_from_messages(body, breakpoints=breakpoints, encoded=named) if hints else NO_HINTS
    envelope = cache.envelope
    _check_fields(body, allowed=_HONOURED | NO_OPS.keys())
    model = F.required_str(body, "model")
    if "max_tokens" not in body:
        raise F.missing("max_tokens")
    max_tokens = F.opt_int(body, "max_tokens", minimum=1)
    marks = marks_of(cache, F.path)
    conversation = _conversation(
        body, max_tokens=max_tokens, marks=marks, resumer=resumer, encoded=encoded
    )
    sampling = SamplingParams(
        max_new_tokens=max_tokens,
        temperature=F.opt_number(body, "temperature", minimum=0, maximum=1),
        top_p=_top_p(body),
        top_k=F.opt_int(body, "top_k", minimum=0),
        stop=F.opt_stop(body, "stop_sequences", limit=_MAX_STOP_SEQUENCES),
    )
    return ParsedRequest(
        model=model,
        messages=conversation.messages,
        sampling=sampling,
        stream=F.opt_bool(body, "stream"),
        envelope=envelope,
        hint_param=CACHE_CONTROL if envelope is not None else None,
        include_usage=True,
        tools=conversation.tools,
        tool_choice=conversation.tool_choice,
        parallel_tool_calls=conversation.parallel_tool_calls,
        response_format=conversation.response_format,
        reasoning=conversation.reasoning,
        echo={OMIT_THINKING: True} if conversation.omit_thinking else {},
        client_controls=cache.client_controls,
        deferred_tools=conversation.deferred_tools,
    )


@records_ignored
def parse_count_tokens(
    body: dict[str, Any],
    *,
    hints: bool = True,
    breakpoints: BreakpointMode = "prefix",
    resumer: Resumer | None = None,
) -> ParsedRequest:
    """A ``/v1/messages/count_tokens`` body: the same checks, without ``max_tokens``.

    ``cache_control`` is validated as for ``/v1/messages`` but makes no hint: counting prefills
    nothing, so there is nothing to retain.
    """
    if hints:
        hints_from_messages(body, breakpoints=breakpoints)
    _check_fields(body, allowed=_COUNT_FIELDS)
    model = F.required_str(body, "model")
    conversation = _conversation(body, max_tokens=None, marks={}, resumer=resumer)
    return ParsedRequest(
        model=model,
        messages=conversation.messages,
        sampling=SamplingParams(max_new_tokens=0),
        stream=False,
        envelope=None,
        hint_param=None,
        tools=conversation.tools,
        tool_choice=conversation.tool_choice,
        parallel_tool_calls=conversation.parallel_tool_calls,
        response_format=conversation.response_format,
        reasoning=conversation.reasoning,
        deferred_tools=conversation.deferred_tools,
    )


def _check_fields(body: Mapping[str, Any], *, allowed: Collection[str]) -> None:
    """Refuse fields that would change the answer by name; no-ops and unknown keys are ignored
    and counted (``compat``); check the no-ops' shapes."""
    for key, value in body.items():
        if value is None:
            continue  # carries nothing
        if key in REFUSED:
            raise F.unsupported(key, f"'{key}' is not supported by this server: {REFUSED[key]}")
        if key not in allowed or (key in NO_OPS and key != "metadata"):
            compat.ignore(key)
    _check_no_ops(body)


def _keys(block: Mapping[str, Any], allowed: frozenset[str], *, where: str) -> None:
    """Keys of a known object outside ``allowed`` are ignored and counted (``compat``'s rule)."""
    known = _WITH_TYPE.get(allowed)
    if known is None:
        known = _WITH_TYPE[allowed] = allowed | {"type"}
    if isinstance(block, dict) and block.keys() <= known:
        return  # every key known: the common case, one set comparison per block
    compat.ignore_unknown(block, known=lambda key: key == "type" or key in allowed, where=where)


_WITH_TYPE: Final[dict[frozenset[str], frozenset[str]]] = {}


def _check_no_ops(body: Mapping[str, Any]) -> None:
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise F.invalid_type("metadata", metadata, expected="a valid dictionary")
        _keys(metadata, frozenset({"user_id"}), where="metadata")
        F.opt_str(metadata, "user_id", param="metadata.user_id")
    safeguards = body.get("safeguards")
    if safeguards is not None and not isinstance(safeguards, list):
        raise F.invalid_type("safeguards", safeguards, expected="a valid list")
    _literal(body, "service_tier", ("auto", "standard_only"))
    _literal(body, "speed", ("standard", "fast"))
    for key in ("inference_geo", "user_profile_id", "workspace_id"):
        F.opt_str(body, key)
    management = body.get("context_management")
    if management is not None:
        _context_management(management)


def _literal(body: Mapping[str, Any], key: str, values: tuple[str, ...], *, param: str = "") -> Any:
    value = body.get(key)
    if value is not None and value not in values:
        choices = " or ".join(f"'{v}'" for v in values)
        raise F.invalid_value(param or key, f"Input should be {choices}")
    return value


def _context_management(value: object) -> None:
    """Only ``clear_thinking_20251015`` keeping all turns (what Claude Code sends) changes nothing."""
    if not isinstance(value, dict):
        raise F.invalid_type("context_management", value, expected="a valid dictionary")
    _keys(value, frozenset({"edits"}), where="context_management")
    edits = value.get("edits") or []
    if not isinstance(edits, list):
        raise F.invalid_type("context_management.edits", edits, expected="a valid list")
    for i, edit in enumerate(edits):
        where = f"context_management.edits.{i}"
        if not (
            isinstance(edit, dict)
            and edit.get("type") == "clear_thinking_20251015"
            and edit.get("keep") in ("all", {"type": "all"})
            and set(edit) <= {"type", "keep"}
        ):
            raise F.unsupported(
                where,
                "context editing is not supported by this server; only "
                "{'type': 'clear_thinking_20251015', 'keep': 'all'} (which keeps everything) is",
            )


def _top_p(body: dict[str, Any]) -> float | None:
    top_p = F.opt_number(body, "top_p", minimum=0, maximum=1)
    if top_p == 0:
        raise F.invalid_value("top_p", "Input should be greater than 0")
    return top_p


# -- the conversation ---------------------------------------------------------------------------


def _encoded_messages(body: dict[str, Any], *, resumer: Resumer | None) -> list[bytes] | None:
    """The messages' encodings the resumer compares, made once for it and the hint normalizer."""
    raw = body.get("messages")
    return resumer.encode_items(raw) if resumer is not None and type(raw) is list else None


def _conversation(
    body: dict[str, Any],
    *,
    max_tokens: int | None,
    marks: Marks,
    resumer: Resumer | None,
    encoded: list[bytes] | None = None,
) -> _Conversation:
    if "messages" not in body:
        raise F.missing("messages")
    raw = body["messages"]
    if not isinstance(raw, list):
        raise F.invalid_type("messages", raw, expected="a valid list")
    if not raw:
        raise F.invalid_value("messages", "List should have at least 1 item after validation")
    tools, deferred = _tools(body.get("tools"), marks=marks)
    catalog = {t.name: t for t in (*tools, *deferred)}
    """Every tool the conversation may load; a ``tool_addition`` block adds to it."""
    messages: list[ChatMessage] = []
    system = body.get("system")
    if system is not None:
        content = _system_content(system, where="system", marks=marks)
        messages.append(trusted(ChatMessage, role="system", content=content))
    folded = _fold(
        raw,
        tools=body.get("tools"),
        marks=marks,
        catalog=catalog,
        resumer=resumer,
        encoded=encoded,
    )
    messages += folded.messages
    catalog = folded.catalog
    declared = {t.name for t in (*tools, *deferred)}
    deferred += [t for name, t in catalog.items() if name not in declared]  # added mid-way
    tool_choice, parallel = _tool_choice(body.get("tool_choice"), tools=[*tools, *deferred])
    effort, response_format = _output_config(body.get("output_config"))
    named = None if resumer is None or not encoded else resumer.names(raw, encoded, _OUTPUT_CONFIG)
    turn_effort, turn_format = _turn_output_config(raw, named=named)
    effort = turn_effort or effort
    response_format = turn_format or response_format
    thinking = body.get("thinking")
    reasoning = _thinking(thinking, max_tokens=max_tokens, effort=effort)
    omit = isinstance(thinking, dict) and thinking.get("display") == "omitted"
    return _Conversation(
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        reasoning=reasoning,
        response_format=response_format,
        omit_thinking=omit,
        deferred_tools=deferred,
    )


@dataclass(frozen=True)
class _Fold:
    """The message loop's state: the neutral messages so far, tool_use id -> tool name (so a tool
    result can name its tool), and every tool the conversation may load so far."""

    messages: list[ChatMessage]
    names: dict[str, str]
    catalog: dict[str, ToolDefinition]

    def copy(self) -> _Fold:
        return _Fold(list(self.messages), dict(self.names), dict(self.catalog))


def _fold(
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


_OUTPUT_CONFIG: Final = b'"output_config"'


def _turn_output_config(
    raw: list[Any], *, named: list[bool] | None = None
) -> tuple[Literal["low", "medium", "high"] | None, ResponseFormat | None]:
    """A message's ``output_config`` (checked like the top-level one): the last message's sets
    this turn's effort and format over the top-level ones; an earlier one is ignored (counted).

    ``named``: whether each message's encoding names the key (``Resumer.names``); when none but
    the last does, only the last is looked at."""
    found: tuple[Literal["low", "medium", "high"] | None, ResponseFormat | None] = (None, None)
    indices: range = range(len(raw))
    if named is not None and len(named) == len(raw) and True not in named[:-1]:
        indices = range(len(raw) - 1, len(raw))
    for i in indices:
        message = raw[i]
        if not isinstance(message, dict) or message.get("output_config") is None:
            continue
        where = F.path("messages", i, "output_config")
        parsed = _output_config(message["output_config"], where=where)
        if i == len(raw) - 1:
            found = parsed
        else:
            compat.ignore(where)
    return found


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
    _keys(raw, _MESSAGE_KEYS, where=where)
    content = raw["content"]
    param = f"{where}.content"
    if role == "system":
        system = _system_content(content, where=param, marks=marks, catalog=catalog)
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
            _keys(block, _THINKING_KEYS, where=param)
            thoughts.append(_str(block, "thinking", where=param))
            signature = _str(block, "signature", where=param)
        elif kind == "redacted_thinking":
            _keys(block, _REDACTED_KEYS, where=param)
            _str(block, "data", where=param)
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
        _keys(block, _TEXT_KEYS, where=where)
        return trusted(TextPart, text=_str(block, "text", where=where), retain_ttl=ttl)
    if kind == "image":
        _keys(block, _IMAGE_KEYS, where=where)
        url = _image_url(block.get("source"), where=f"{where}.source")
        return ImagePart(url=url, retain_ttl=ttl)
    if kind == "document":
        _keys(block, _DOCUMENT_KEYS, where=where)
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


def _str(block: Mapping[str, Any], key: str, *, where: str) -> str:
    if key not in block:
        raise F.missing(f"{where}.{key}")
    value = block[key]
    if not isinstance(value, str):
        raise F.invalid_type(f"{where}.{key}", value, expected="a valid string")
    return value


def _image_url(source: object, *, where: str) -> str:
    """A base64 source becomes a ``data:`` URL; a url source stays; file ids are refused."""
    if not isinstance(source, dict):
        raise F.invalid_type(where, source, expected="a valid dictionary")
    kind = source.get("type")
    if kind == "base64":
        _keys(source, frozenset({"media_type", "data"}), where=where)
        media = source.get("media_type")
        if media not in _IMAGE_TYPES:
            choices = ", ".join(f"'{t}'" for t in _IMAGE_TYPES)
            raise F.invalid_value(f"{where}.media_type", f"Input should be {choices}")
        data = _str(source, "data", where=where)
        if not data:
            raise F.invalid_value(f"{where}.data", "String should have at least 1 character")
        return f"data:{media};base64,{data}"
    if kind == "url":
        _keys(source, frozenset({"url"}), where=where)
        url = _str(source, "url", where=where)
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
    _keys(source, frozenset({"media_type", "data"}), where=param)
    if source.get("media_type") != "text/plain":
        raise F.invalid_value(f"{param}.media_type", "Input should be 'text/plain'")
    pieces = [
        block[k] for k in ("title", "context") if isinstance(block.get(k), str) and block.get(k)
    ]
    return "\n".join([*pieces, _str(source, "data", where=param)])


def _tool_use(block: dict[str, Any], *, where: str, ttl: int | None) -> ToolCall:
    _keys(block, _TOOL_USE_KEYS, where=where)
    compat.ignore_set(block, _BLOCK_NO_OPS["tool_use"], where=where)
    caller = block.get("caller")
    if caller is not None and not (isinstance(caller, dict) and caller.get("type") == "direct"):
        raise F.unsupported(f"{where}.caller", "only direct tool calls are supported")
    call_id = _str(block, "id", where=where)
    name = _str(block, "name", where=where)
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
    _keys(block, _TOOL_RESULT_KEYS, where=where)
    compat.ignore_set(block, _BLOCK_NO_OPS["tool_result"], where=where)
    call_id = _str(block, "tool_use_id", where=where)
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


def _tool_reference(
    block: dict[str, Any], *, where: str, catalog: Mapping[str, ToolDefinition], marks: Marks
) -> TextPart:
    """A ``tool_reference`` -> the referenced tool's definition (it must be in ``tools``)."""
    _keys(block, _TOOL_REFERENCE_KEYS, where=where)
    name = _str(block, "tool_name", where=where)
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
    _keys(block, frozenset({"tool", CACHE_CONTROL}), where=where)
    tool = block.get("tool")
    at = f"{where}.tool"
    if not isinstance(tool, dict):
        raise F.invalid_type(at, tool, expected="a valid dictionary")
    ref = tool.get("type")
    if kind == "tool_addition" and ref == "tool_definition":
        _keys(tool, frozenset({"definition"}), where=at)
        definition = _tool(tool.get("definition"), where=f"{at}.definition", ttl=None)
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
    _keys(tool, frozenset({"name"}), where=at)
    name = _str(tool, "name", where=at)
    if kind == "tool_removal":
        return trusted(
            TextPart, text=f"The tool {name} is no longer available.", retain_ttl=marks.get(where)
        )
    found = catalog.get(name)
    if found is None:
        raise F.invalid_value(f"{at}.name", f"Tool '{name}' not found in 'tools'")
    return trusted(TextPart, text=tool_definitions_text([found]), retain_ttl=marks.get(where))


def _system_content(
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


# -- tools, tool_choice, thinking, output_config ------------------------------------------------


def _tools(raw: object, *, marks: Marks) -> tuple[list[ToolDefinition], list[ToolDefinition]]:
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
        definition = _tool(tool, where=where, ttl=marks.get(where))
        if definition.name in seen:
            raise F.invalid_value(f"{where}.name", "Tool names must be unique.")
        seen.add(definition.name)
        if isinstance(tool, dict) and tool.get("defer_loading") is True:
            # not in the prompt until a tool_reference loads it: no breakpoint can end there
            deferred.append(definition.model_copy(update={"retain_ttl": None}))
        else:
            tools.append(definition)
    return tools, deferred


def _tool(raw: object, *, where: str, ttl: int | None) -> ToolDefinition:
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
    _keys(raw, _TOOL_KEYS, where=where)
    name = _str(raw, "name", where=where)
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


def _tool_choice(raw: object, *, tools: list[ToolDefinition]) -> tuple[ToolChoice, bool]:
    """Anthropic ``tool_choice`` -> the neutral choice and ``parallel_tool_calls``."""
    if raw is None:
        return ToolChoice(), True
    if not isinstance(raw, dict):
        raise F.invalid_type("tool_choice", raw, expected="a valid dictionary")
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in _TOOL_CHOICE_KEYS:
        raise F.invalid_value("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'")
    _keys(raw, _TOOL_CHOICE_KEYS[kind], where="tool_choice")
    disable = raw.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise F.invalid_type(
            "tool_choice.disable_parallel_tool_use", disable, expected="a valid boolean"
        )
    parallel = not disable
    if kind in ("any", "tool") and not tools:
        raise F.invalid_value(
            "tool_choice", f"tool_choice.type '{kind}' may only be specified while providing tools"
        )
    if kind != "tool":
        return ToolChoice(mode=_TOOL_CHOICE_MODES[kind]), parallel
    name = _str(raw, "name", where="tool_choice")
    if name not in {t.name for t in tools}:
        raise F.invalid_value("tool_choice.name", f"Tool '{name}' not found in 'tools'")
    return ToolChoice(mode="named", name=name), parallel


def _thinking(
    raw: object, *, max_tokens: int | None, effort: Literal["low", "medium", "high"] | None
) -> ReasoningControl | None:
    """``thinking`` (enabled / adaptive / disabled) plus ``output_config.effort``."""
    if raw is None:
        return ReasoningControl(effort=effort) if effort is not None else None
    if not isinstance(raw, dict):
        raise F.invalid_type("thinking", raw, expected="a valid dictionary")
    kind = raw.get("type")
    if kind == "disabled":
        _keys(raw, frozenset(), where="thinking")
        return ReasoningControl(enabled=False, effort=effort)
    if kind == "between_tools":
        raise F.unsupported("thinking.type", "thinking 'between_tools' is not supported")
    if kind not in ("enabled", "adaptive"):
        raise F.invalid_value(
            "thinking.type", "Input should be 'enabled', 'adaptive' or 'disabled'"
        )
    _literal(raw, "display", _THINKING_DISPLAYS, param=f"thinking.{kind}.display")
    if kind == "adaptive":
        _keys(raw, frozenset({"display"}), where="thinking.adaptive")
        return ReasoningControl(enabled=True, effort=effort)
    _keys(raw, frozenset({"budget_tokens", "display"}), where="thinking.enabled")
    if "budget_tokens" not in raw:
        raise F.missing("thinking.enabled.budget_tokens")
    budget = F.opt_int(
        raw, "budget_tokens", minimum=_MIN_THINKING_BUDGET, param="thinking.enabled.budget_tokens"
    )
    if budget is not None and max_tokens is not None and max_tokens <= budget:
        raise F.invalid_value(
            "max_tokens", "`max_tokens` must be greater than `thinking.budget_tokens`."
        )
    return ReasoningControl(enabled=True, budget_tokens=budget, effort=effort)


def _output_config(
    raw: object, *, where: str = "output_config"
) -> tuple[Literal["low", "medium", "high"] | None, ResponseFormat | None]:
    if raw is None:
        return None, None
    if not isinstance(raw, dict):
        raise F.invalid_type(where, raw, expected="a valid dictionary")
    _keys(raw, frozenset({"effort", "format"}), where=where)
    effort = _literal(raw, "effort", tuple(_EFFORT), param=f"{where}.effort")
    fmt = raw.get("format")
    response_format = None
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise F.invalid_type(f"{where}.format", fmt, expected="a valid dictionary")
        _keys(fmt, frozenset({"schema"}), where=f"{where}.format")
        if fmt.get("type") != "json_schema":
            raise F.invalid_value(f"{where}.format.type", "Input should be 'json_schema'")
        if "schema" not in fmt:
            raise F.missing(f"{where}.format.schema")
        schema = fmt["schema"]
        if not isinstance(schema, dict):
            raise F.invalid_type(f"{where}.format.schema", schema, expected="a valid dictionary")
        response_format = ResponseFormat(type="json_schema", json_schema=schema)
    return (_EFFORT[effort] if effort is not None else None), response_format


# -- the answer -----------------------------------------------------------------------------


def usage_object(usage: Usage, *, hinted: bool) -> dict[str, Any]:
    """Anthropic usage: ``input_tokens + cache_creation + cache_read`` is the whole prompt.

    ``cache_read`` is the prefix the engine found cached. With a retention hint, what the worker
    says it retained (``retained_tokens``: up to the last breakpoint, or the whole prompt for a
    top-level ``cache_control``) beyond the cached part is ``cache_creation``, and only the tokens
    after it are ``input_tokens``, as Anthropic counts them; a worker that does not say retains
    the whole prompt. Without a hint everything uncached is ``input_tokens``.
    """
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    fresh = usage.prompt_tokens - cached
    retained = usage.prompt_tokens if usage.retained_tokens is None else usage.retained_tokens
    written = max(0, min(retained, usage.prompt_tokens) - cached) if hinted else 0
    return {
        "input_tokens": fresh - written,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": written,
    }


def tool_use_id(call_id: str | None, *, request_id: str, index: int) -> str:
    """Anthropic-shaped, unique across turns: the engine's ids (``call_0``) may repeat."""
    if call_id and call_id.startswith("toolu_"):
        return call_id
    return f"toolu_{request_id}{index:02d}"


def thinking_signature(text: str) -> str:
    """An opaque signature for a thinking block; clients replay it and this server ignores it."""
    return "kvr-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's JSON arguments as the ``input`` object; text that is not an object is kept whole."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    log.warning("tool call arguments are not a JSON object; returned under 'raw_arguments'")
    return {"raw_arguments": arguments}


def _message_object(
    parsed: ParsedRequest,
    *,
    request_id: str,
    content: list[dict[str, Any]],
    stop_reason: str | None,
    usage: Usage,
) -> dict[str, Any]:
    return {
        "id": f"msg_{request_id}",
        "type": "message",
        "role": "assistant",
        "model": parsed.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage_object(usage, hinted=parsed.envelope is not None),
    }


def messages_response(
    parsed: ParsedRequest, result: Completion, *, request_id: str
) -> dict[str, Any]:
    """The non-streaming ``message`` object: thinking, text, then tool_use blocks."""
    content: list[dict[str, Any]] = []
    if result.reasoning:
        shown = "" if parsed.echo.get(OMIT_THINKING) else result.reasoning
        content.append(
            {
                "type": "thinking",
                "thinking": shown,
                "signature": thinking_signature(result.reasoning),
            }
        )
    if result.shown_text or not (content or result.tool_calls):
        content.append({"type": "text", "text": result.shown_text})
    for index, call in enumerate(result.tool_calls):
        content.append(
            {
                "type": "tool_use",
                "id": tool_use_id(call.id, request_id=request_id, index=index),
                "name": call.name,
                "input": tool_input(call.arguments),
            }
        )
    return _message_object(
        parsed,
        request_id=request_id,
        content=content,
        stop_reason=_STOP.get(result.finish_reason or "stop", "end_turn"),
        usage=result.usage,
    )


def count_tokens_response(usage: Usage) -> dict[str, Any]:
    return {"input_tokens": usage.prompt_tokens}


BlockKind = Literal["thinking", "text", "tool_use"]


class MessagesStream:
    """Anthropic's named SSE events; each thinking, text or tool_use run is its own block.

    ``message_start`` waits for the first chunk so its usage can carry the real prompt counts
    (``GenerateChunk.prompt_usage``, or ``usage`` when the first chunk is also the last).
    """

    def __init__(self, parsed: ParsedRequest, *, request_id: str) -> None:
        self._parsed = parsed
        self._rid = request_id
        self._hinted = parsed.envelope is not None
        self._omit_thinking = bool(parsed.echo.get(OMIT_THINKING))
        self._started = False
        self._finish: str | None = None
        self._usage = Usage()
        self._open: BlockKind | None = None
        self._index = -1
        self._thinking = ""
        self._tools: dict[int, int] = {}
        """engine tool-call index -> content block index"""

    def start(self) -> bytes:
        return b""

    def chunk(self, chunk: GenerateChunk) -> bytes:
        out: list[bytes] = []
        if not self._started:
            self._started = True
            out.append(self._message_start(chunk))
        if chunk.finish_reason is not None:
            self._finish = chunk.finish_reason
        if chunk.usage is not None:
            self._usage = chunk.usage
        if chunk.reasoning:
            out.append(self._open_block("thinking"))
            self._thinking += chunk.reasoning
            if not self._omit_thinking:
                out.append(self._delta({"type": "thinking_delta", "thinking": chunk.reasoning}))
        if chunk.text:
            out.append(self._open_block("text"))
            out.append(self._delta({"type": "text_delta", "text": chunk.text}))
        for call in chunk.tool_calls:
            if call.index not in self._tools:
                out.append(self._close_block())
                self._index += 1
                self._open = "tool_use"
                self._tools[call.index] = self._index
                block = {
                    "type": "tool_use",
                    "id": tool_use_id(call.id, request_id=self._rid, index=call.index),
                    "name": call.name or "",
                    "input": {},
                }
                out.append(
                    self._event("content_block_start", index=self._index, content_block=block)
                )
            if call.arguments:
                delta = {"type": "input_json_delta", "partial_json": call.arguments}
                out.append(
                    self._event("content_block_delta", index=self._tools[call.index], delta=delta)
                )
        return b"".join(out)

    def finish(self) -> bytes:
        out = [b"" if self._index >= 0 else self._open_block("text"), self._close_block()]
        delta = {
            "type": "message_delta",
            "delta": {
                "stop_reason": _STOP.get(self._finish or "stop", "end_turn"),
                "stop_sequence": None,
            },
            "usage": usage_object(self._usage, hinted=self._hinted),
        }
        out.append(sse.event(delta, name="message_delta"))
        out.append(sse.event({"type": "message_stop"}, name="message_stop"))
        return b"".join(out)

    def error(self, err: FrontendError) -> bytes:
        return sse.event(anthropic_error_body(err), name="error")

    # -- pieces ------------------------------------------------------------------------------

    def _message_start(self, first: GenerateChunk) -> bytes:
        usage = first.prompt_usage or first.usage or Usage()
        message = _message_object(
            self._parsed, request_id=self._rid, content=[], stop_reason=None, usage=usage
        )
        message["usage"]["output_tokens"] = 0
        return sse.event({"type": "message_start", "message": message}, name="message_start")

    def _event(self, name: str, **fields: Any) -> bytes:
        return sse.event({"type": name, **fields}, name=name)

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return self._event("content_block_delta", index=self._index, delta=delta)

    def _open_block(self, kind: Literal["thinking", "text"]) -> bytes:
        if self._open == kind:
            return b""
        closed = self._close_block()
        self._index += 1
        self._open = kind
        block: dict[str, Any] = (
            {"type": "thinking", "thinking": "", "signature": ""}
            if kind == "thinking"
            else {"type": "text", "text": ""}
        )
        return closed + self._event("content_block_start", index=self._index, content_block=block)

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open == "thinking":
            signature = thinking_signature(self._thinking)
            out = self._delta({"type": "signature_delta", "signature": signature})
            self._thinking = ""
        self._open = None
        return out + self._event("content_block_stop", index=self._index)

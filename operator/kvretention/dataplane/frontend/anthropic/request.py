"""Anthropic requests: a ``/v1/messages`` (or ``count_tokens``) body -> ``ParsedRequest``, with the
request-wide controls (``tool_choice``, ``thinking``, ``output_config``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from kvretention.dataplane.frontend import compat
from kvretention.dataplane.frontend.anthropic.conversation import fold_messages, system_content
from kvretention.dataplane.frontend.anthropic.fields import (
    COUNT_FIELDS,
    HONOURED,
    NO_OPS,
    OMIT_THINKING,
    F,
    check_fields,
    check_keys,
    literal,
    req_str,
)
from kvretention.dataplane.frontend.anthropic.tools import shared_tool_lists
from kvretention.dataplane.frontend.common import (
    Marks,
    Opener,
    Opening,
    ParsedRequest,
)
from kvretention.dataplane.frontend.resume import Resumer
from kvretention.dataplane.protocol import (
    ChatMessage,
    ReasoningControl,
    ResponseFormat,
    SamplingParams,
    ToolChoice,
    ToolDefinition,
    trusted,
)
from kvretention.hints.anthropic import CACHE_CONTROL, hints_from_messages

_MAX_STOP_SEQUENCES: Final = 8
_MIN_THINKING_BUDGET: Final = 1024
_EFFORT: Final[Mapping[str, Literal["low", "medium", "high"]]] = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}
"""``output_config.effort`` -> the neutral effort; ``xhigh`` and ``max`` are the highest we have."""
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

    def request(self, model: str, *, sampling: SamplingParams, stream: bool) -> ParsedRequest:
        """These messages and tool controls as a request without a hint: what ``count_tokens``
        answers; ``/v1/messages`` adds its hint and echo fields to it. A last message of the
        assistant's is a prefill: the answer continues it (Anthropic's rule)."""
        return ParsedRequest(
            model=model,
            messages=self.messages,
            sampling=sampling,
            stream=stream,
            envelope=None,
            hint_param=None,
            tools=self.tools,
            tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls,
            response_format=self.response_format,
            reasoning=self.reasoning,
            deferred_tools=self.deferred_tools,
            continue_final_message=bool(self.messages) and self.messages[-1].role == "assistant",
        )


_OPENER: Final = Opener(
    items="messages", read_hints=hints_from_messages, skips=Resumer.control_items, path=F.path
)
"""The hint walk skips what ``Resumer.control_items`` rules out: no scan of a message an earlier
body held."""


@_OPENER.parser
def parse_messages(
    body: dict[str, Any], opening: Opening, resumer: Resumer | None
) -> ParsedRequest:
    """A ``/v1/messages`` body -> ``ParsedRequest``; raises ``ClientError``.

    In ``prefix`` mode each block-level ``cache_control`` puts ``retain_ttl`` on the neutral
    element made from its block; ``reject`` refuses them (v1).
    """
    cache, marks, encoded = opening.cache, opening.marks, opening.encoded
    envelope = cache.envelope
    check_fields(body, allowed=HONOURED | NO_OPS.keys())
    model = F.required_str(body, "model")
    if "max_tokens" not in body:
        raise F.missing("max_tokens")
    max_tokens = F.opt_int(body, "max_tokens", minimum=1)
    conversation = _conversation(
        body, max_tokens=max_tokens, marks=marks, resumer=resumer, encoded=encoded
    )
    sampling = SamplingParams(
        max_new_tokens=max_tokens,
        temperature=F.opt_number(body, "temperature", minimum=0, maximum=1),
        top_p=_top_p(body),
        top_k=F.opt_int(body, "top_k", minimum=0) or None,  # 0: no top-k (SGLang refuses 0)
        stop=F.opt_stop(body, "stop_sequences", limit=_MAX_STOP_SEQUENCES),
    )
    return replace(
        conversation.request(model, sampling=sampling, stream=F.opt_bool(body, "stream")),
        envelope=envelope,
        hint_param=CACHE_CONTROL if envelope is not None else None,
        include_usage=True,
        echo={OMIT_THINKING: True} if conversation.omit_thinking else {},
        client_controls=cache.client_controls,
    )


@_OPENER.parser
def parse_count_tokens(
    body: dict[str, Any], opening: Opening, resumer: Resumer | None
) -> ParsedRequest:
    """A ``/v1/messages/count_tokens`` body: the same checks, without ``max_tokens``.

    ``cache_control`` is validated as for ``/v1/messages`` (the same opening) but makes no hint:
    counting prefills nothing, so there is nothing to retain.
    """
    check_fields(body, allowed=COUNT_FIELDS)
    model = F.required_str(body, "model")
    conversation = _conversation(
        body, max_tokens=None, marks={}, resumer=resumer, encoded=opening.encoded
    )
    return conversation.request(model, sampling=SamplingParams(max_new_tokens=0), stream=False)


def _top_p(body: dict[str, Any]) -> float | None:
    top_p = F.opt_number(body, "top_p", minimum=0, maximum=1)
    if top_p == 0:
        raise F.invalid_value("top_p", "Input should be greater than 0")
    return top_p


def _conversation(
    body: dict[str, Any],
    *,
    max_tokens: int | None,
    marks: Marks,
    resumer: Resumer | None,
    encoded: list[bytes] | None = None,
) -> _Conversation:
    raw = F.required_list(
        body,
        "messages",
        expected="a valid list",
        empty="List should have at least 1 item after validation",
    )
    tools, deferred = shared_tool_lists(body.get("tools"), marks=marks, resumer=resumer)
    catalog = {t.name: t for t in (*tools, *deferred)}
    """Every tool the conversation may load; a ``tool_addition`` block adds to it."""
    messages: list[ChatMessage] = []
    system = body.get("system")
    if system is not None:
        content = system_content(system, where="system", marks=marks)
        messages.append(trusted(ChatMessage, role="system", content=content))
    folded = fold_messages(
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
    thinks = isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
    if thinks and tool_choice.mode in ("required", "named"):
        # Anthropic's own rule: a forced call leaves the model no turn to think in.
        raise F.invalid_value(
            "tool_choice", "Thinking may not be enabled when tool_choice forces tool use."
        )
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


# -- tool_choice, thinking, output_config ------------------------------------------------------


def _tool_choice(raw: object, *, tools: list[ToolDefinition]) -> tuple[ToolChoice, bool]:
    """Anthropic ``tool_choice`` -> the neutral choice and ``parallel_tool_calls``."""
    if raw is None:
        return ToolChoice(), True
    if not isinstance(raw, dict):
        raise F.invalid_type("tool_choice", raw, expected="a valid dictionary")
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in _TOOL_CHOICE_KEYS:
        raise F.invalid_value("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'")
    check_keys(raw, _TOOL_CHOICE_KEYS[kind], where="tool_choice")
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
    name = req_str(raw, "name", where="tool_choice")
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
        check_keys(raw, frozenset(), where="thinking")
        return ReasoningControl(enabled=False, effort=effort)
    if kind == "between_tools":
        raise F.unsupported("thinking.type", "thinking 'between_tools' is not supported")
    if kind not in ("enabled", "adaptive"):
        raise F.invalid_value(
            "thinking.type", "Input should be 'enabled', 'adaptive' or 'disabled'"
        )
    literal(raw, "display", _THINKING_DISPLAYS, param=f"thinking.{kind}.display")
    if kind == "adaptive":
        check_keys(raw, frozenset({"display"}), where="thinking.adaptive")
        return ReasoningControl(enabled=True, effort=effort)
    check_keys(raw, frozenset({"budget_tokens", "display"}), where="thinking.enabled")
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
    check_keys(raw, frozenset({"effort", "format"}), where=where)
    effort = literal(raw, "effort", tuple(_EFFORT), param=f"{where}.effort")
    fmt = raw.get("format")
    response_format = None
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise F.invalid_type(f"{where}.format", fmt, expected="a valid dictionary")
        check_keys(fmt, frozenset({"schema"}), where=f"{where}.format")
        if fmt.get("type") != "json_schema":
            raise F.invalid_value(f"{where}.format.type", "Input should be 'json_schema'")
        if "schema" not in fmt:
            raise F.missing(f"{where}.format.schema")
        schema = fmt["schema"]
        if not isinstance(schema, dict):
            raise F.invalid_type(f"{where}.format.schema", schema, expected="a valid dictionary")
        response_format = ResponseFormat(type="json_schema", json_schema=schema)
    return (_EFFORT[effort] if effort is not None else None), response_format

"""The engine's text as text, reasoning and tool calls, parsed by SGLang's own parsers.

The worker runs the parsers SGLang's OpenAI server runs (``FunctionCallParser`` from
``sglang.srt.function_call.function_call_parser``, ``ReasoningParser`` from
``sglang.srt.parser.reasoning_parser``), selected by SGLang's own server flags
``--tool-call-parser`` / ``--reasoning-parser`` in the engine argv, so engine and worker agree.
The per-request decisions mirror ``serving_chat.py`` (0.5.23): ``tool_choice: none`` turns tool
parsing off; ``required`` / named choices are constrained with
``FunctionCallParser.get_structure_constraint`` (else SGLang's JSON-array schema, parsed back
with its ``JsonArrayParser``); ``response_format`` becomes ``json_schema``; reasoning is split
off first and only the answer text goes to the tool parser. SGLang is imported only when a parser
is configured (its modules import torch).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kvretention.dataplane.protocol import (
    PreprocessedRequest,
    ReasoningControl,
    ToolDefinition,
)
from kvretention.dataplane.template_input import build_tool_schema

TOOL_CALL_PARSER_FLAG: Final = "--tool-call-parser"
REASONING_PARSER_FLAG: Final = "--reasoning-parser"


class ParserConfigError(ValueError):
    """A parser name SGLang does not know, or SGLang's parser modules cannot be imported."""


class ConstraintConflict(ValueError):
    """The request asks for two output constraints that cannot both hold (SGLang refuses too)."""


@dataclass(frozen=True)
class ParserNames:
    """The SGLang parser names the worker runs; ``None`` leaves the text unparsed."""

    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    model_type: str | None = None
    """The served model's ``model_type`` (its ``config.json``): SGLang keeps special tokens in
    the text of some models' answers (``special_tokens_kept``)."""


SPECIAL_TOKEN_MODELS: Final = frozenset({"gpt_oss", "gemma4", "gemma4_unified"})
SPECIAL_TOKEN_REASONING: Final = frozenset({"apertus2509", "inkling", "kimi_k3", "muse"})


def special_tokens_kept(names: ParserNames, reasoning: ReasoningControl | None) -> bool:
    """Whether an answer's text keeps its special tokens with no tools offered, as SGLang's
    server decides it (0.5.23 ``serving_chat``): harmony's channels (gpt-oss) and Gemma 4's, and
    the reasoning formats whose markers are special tokens, would otherwise be decoded away and
    the reasoning could not be told from the answer. Mistral's ``[THINK]`` when the request
    thinks (SGLang: when it names a ``reasoning_effort``)."""
    if names.model_type in SPECIAL_TOKEN_MODELS:
        return True
    if names.reasoning_parser in SPECIAL_TOKEN_REASONING:
        return True
    return names.reasoning_parser == "mistral" and reasoning is not None and reasoning.enabled


def parser_names_from_argv(argv: Sequence[str]) -> ParserNames:
    """Read ``--tool-call-parser`` / ``--reasoning-parser`` (``--flag NAME`` or ``--flag=NAME``)."""
    found: dict[str, str] = {}
    args = list(argv)
    for i, arg in enumerate(args):
        for flag in (TOOL_CALL_PARSER_FLAG, REASONING_PARSER_FLAG):
            if arg == flag and i + 1 < len(args):
                found[flag] = args[i + 1]
            elif arg.startswith(flag + "="):
                found[flag] = arg.split("=", 1)[1]
    return ParserNames(
        tool_call_parser=found.get(TOOL_CALL_PARSER_FLAG) or None,
        reasoning_parser=found.get(REASONING_PARSER_FLAG) or None,
    )


def sglang_parsers() -> tuple[Any, Any]:
    try:
        from sglang.srt.function_call.function_call_parser import FunctionCallParser
        from sglang.srt.parser.reasoning_parser import ReasoningParser
    except Exception as exc:
        raise ParserConfigError(
            "--tool-call-parser / --reasoning-parser need SGLang's parser modules, which do not "
            f"import here: {type(exc).__name__}: {exc}"
        ) from exc
    return FunctionCallParser, ReasoningParser


def tool_call_parser_names() -> list[str]:
    return sorted(sglang_parsers()[0].ToolCallParserEnum)


def reasoning_parser_names() -> list[str]:
    return sorted(sglang_parsers()[1].DetectorMap)


def check_parser_names(names: ParserNames) -> None:
    """Fail at start for a name SGLang does not know, listing the ones it does."""
    if names.tool_call_parser is not None:
        valid = tool_call_parser_names()
        if names.tool_call_parser not in valid:
            raise ParserConfigError(
                f"unknown {TOOL_CALL_PARSER_FLAG} {names.tool_call_parser!r}; "
                f"SGLang knows: {', '.join(valid)}"
            )
    if names.reasoning_parser is not None:
        valid = reasoning_parser_names()
        if names.reasoning_parser.lower() not in valid:
            raise ParserConfigError(
                f"unknown {REASONING_PARSER_FLAG} {names.reasoning_parser!r}; "
                f"SGLang knows: {', '.join(valid)}"
            )


def sglang_tools(tools: Sequence[ToolDefinition]) -> list[Any]:
    """The request's tools as SGLang's ``Tool`` models (the same schema the template saw)."""
    from sglang.srt.entrypoints.openai.protocol import Tool

    return [Tool.model_validate(build_tool_schema(t)) for t in tools]


def _sglang_tool_choice(request: PreprocessedRequest) -> Any:
    choice = request.tool_choice
    if choice.mode == "named":
        from sglang.srt.entrypoints.openai.protocol import ToolChoice, ToolChoiceFuncName

        return ToolChoice(function=ToolChoiceFuncName(name=choice.name))
    return choice.mode


def thinking_requested(reasoning_default: str | None, reasoning: ReasoningControl | None) -> bool:
    """SGLang's ``_get_reasoning_from_request`` for a template without a reasoning config."""
    kwargs: dict[str, Any] = {}
    if reasoning is not None:
        kwargs = {"enable_thinking": reasoning.enabled, "thinking": reasoning.enabled}
    if reasoning_default in (None, "mistral"):
        return reasoning_default == "mistral" and reasoning is not None and reasoning.enabled
    if reasoning_default == "always":
        return True
    if reasoning_default in ("thinking", "enable_thinking"):
        return kwargs.get(reasoning_default) is not False
    if reasoning_default in ("explicit_thinking", "explicit_enable_thinking"):
        return kwargs.get(reasoning_default.removeprefix("explicit_")) is True
    return False


def _reasoning_detector(reasoning_parser: Any, name: str) -> Any:
    """A default detector of the named family, to read its defaults (think token, mode)."""
    try:
        return reasoning_parser.DetectorMap[name.lower()]()
    except Exception:  # a detector that needs arguments: no defaults to read
        return None


@dataclass
class OutputPlan:
    """What one request's output is constrained to and parsed with."""

    names: ParserNames
    tools: list[Any] = field(default_factory=list)
    """SGLang ``Tool`` models the parser may match (empty: tool parsing off)."""
    tool_kinds: dict[str, str] = field(default_factory=dict)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    read_whole: bool = False
    """The client reads the answer whole (``stream: false``) and takes every call it writes:
    parsed once at the end, by SGLang's non-streaming parsers, as its own server does."""
    constraint: tuple[str, Any] | None = None
    json_array: bool = False
    """Required / named choice constrained to SGLang's JSON array: parse it back as such."""
    thinking: bool = False
    """The request is in thinking mode (SGLang's ``require_reasoning``: its grammar backend then
    leaves the think section unconstrained and counts reasoning tokens)."""
    force_reasoning: bool = False
    """Parse from the start as reasoning (thinking mode, or the template opened the block)."""
    special_tokens: bool = False
    """The answer's text keeps its special tokens: the template was shown tools, or the model or
    the reasoning format needs them (``special_tokens_kept``), as SGLang's server decides."""
    parses_without_tools: bool = False
    """The tool-call format is parsed even with no tools declared (SGLang's rule per detector)."""
    separate_reasoning: bool = True
    """Split the reasoning off the answer (``False``: it stays in the text, as SGLang leaves it)."""
    stream_reasoning: bool = True
    """Send the reasoning as it comes (``False``: in one piece once it ends)."""

    @property
    def parses_tools(self) -> bool:
        with_tools = bool(self.tools) or self.parses_without_tools
        return (with_tools and self.names.tool_call_parser is not None) or self.json_array


def plan_output(
    request: PreprocessedRequest, names: ParserNames, *, prompt_text: str = ""
) -> OutputPlan:
    """Decide the structure constraint and parsers of one request, as SGLang's server does."""
    plan = OutputPlan(
        names=names,
        parallel_tool_calls=request.parallel_tool_calls,
        # one call at most is parsed as it streams: the engine stops once a second one begins
        read_whole=not request.stream and request.parallel_tool_calls,
        special_tokens=special_tokens_kept(names, request.reasoning),
        separate_reasoning=request.separate_reasoning,
        stream_reasoning=request.stream_reasoning,
    )
    # deferred tools are not in the prompt's tool list, but a tool search loaded them: their
    # calls are parsed like any other
    effective = (
        [] if request.tool_choice.mode == "none" else [*request.tools, *request.deferred_tools]
    )
    if request.tool_choice.mode == "named" and not any(
        t.name == request.tool_choice.name for t in effective
    ):
        raise ConstraintConflict(f"tool_choice names {request.tool_choice.name!r}, not a tool")
    if names.reasoning_parser is not None:
        _, reasoning_parser = sglang_parsers()
        detector = _reasoning_detector(reasoning_parser, names.reasoning_parser)
        default = getattr(detector, "reasoning_default", None)
        think_start = getattr(detector, "think_start_token", None)
        plan.thinking = thinking_requested(default, request.reasoning)
        plan.force_reasoning = plan.thinking or bool(
            think_start and prompt_text.rstrip().endswith(think_start)
        )
    if not effective:
        # Formats such as gpt-oss's channels are parsed even when no tool is declared.
        if names.tool_call_parser is not None:
            function_call_parser, _ = sglang_parsers()
            detector = function_call_parser.ToolCallParserEnum[names.tool_call_parser]
            plan.parses_without_tools = bool(detector.parses_without_tools())
        return plan
    plan.special_tokens = True  # the template was shown tools
    required = request.tool_choice.mode in ("required", "named")
    if names.tool_call_parser is None and not required:
        return plan  # as SGLang: without a tool-call parser, calls stay in the text
    plan.tool_kinds = {t.name: t.kind for t in effective}
    plan.tools = sglang_tools(effective)
    plan.tool_choice = _sglang_tool_choice(request)
    if names.tool_call_parser is not None:
        function_call_parser, _ = sglang_parsers()
        parser = function_call_parser(plan.tools, names.tool_call_parser)
        # The reasoning parser owns the think section when one is configured (SGLang's rule).
        plan.constraint = parser.get_structure_constraint(
            plan.tool_choice,
            parallel_tool_calls=request.parallel_tool_calls,
            thinking_mode=plan.force_reasoning and names.reasoning_parser is None,
        )
        if not request.parallel_tool_calls:
            plan.constraint = one_call_at_most(plan.constraint)
        if required:
            probe = function_call_parser(
                plan.tools, names.tool_call_parser, tool_choice=plan.tool_choice
            )
            plan.json_array = not probe.owns_tool_format()
    elif required:
        plan.json_array = True
    if plan.constraint is None and required:
        from sglang.srt.function_call.utils import get_json_schema_constraint

        schema = get_json_schema_constraint(
            plan.tools, plan.tool_choice, parallel_tool_calls=request.parallel_tool_calls
        )
        plan.constraint = ("json_schema", schema)
        plan.json_array = True
    return plan


def one_call_at_most(constraint: Any) -> Any:
    """The constraint with xgrammar's stop-after-first-call rule when it is SGLang's legacy
    structural tag: 0.5.23 builds that tag for formats without a native one (``qwen25``,
    ``mistral``...) with no count, so ``parallel_tool_calls: false`` still let a second call
    through; native tags and JSON arrays take the count from SGLang already."""
    if constraint is None or constraint[0] != "structural_tag":
        return constraint
    legacy = constraint[1]
    if getattr(legacy, "structures", None) is None:
        return constraint
    try:
        from xgrammar.structural_tag import (
            JSONSchemaFormat,
            StructuralTag,
            TagFormat,
            TriggeredTagsFormat,
        )
    except ImportError:  # no xgrammar, no grammar backend to compile either form: SGLang's as is
        return constraint

    tags = [
        TagFormat(begin=s.begin, content=JSONSchemaFormat(json_schema=s.schema_ or {}), end=s.end)
        for s in legacy.structures
    ]
    tag = StructuralTag(
        format=TriggeredTagsFormat(
            triggers=list(legacy.triggers),
            tags=tags,
            at_least_one=bool(legacy.at_least_one),
            stop_after_first=True,
        )
    )
    return ("structural_tag", tag)


def constrained_sampling(request: PreprocessedRequest, plan: OutputPlan | None) -> dict[str, Any]:
    """SGLang ``sampling_params``: the request's, plus ``response_format`` and the tool constraint
    (``ChatCompletionRequest.to_sampling_params``'s rules, including its conflict error)."""
    params = request.sampling.to_sglang()
    fmt = request.response_format
    if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        params["json_schema"] = json.dumps(fmt.json_schema)
    elif fmt is not None:
        params["json_schema"] = '{"type": "object"}'
    if plan is not None and plan.special_tokens:
        params["skip_special_tokens"] = False
    if plan is None or plan.constraint is None:
        return params
    existing = any(params.get(k) for k in ("regex", "ebnf", "structural_tag", "json_schema"))
    if existing:
        if request.tool_choice.mode in ("required", "named"):
            raise ConstraintConflict(
                "tool_choice 'required' or a named tool cannot be combined with "
                "response_format, regex, or ebnf: the tool-call constraint and the "
                "output constraint cannot both be honored"
            )
        return params
    kind, value = plan.constraint
    if kind == "structural_tag":
        params["structural_tag"] = json.dumps(value.model_dump(by_alias=True))
    elif kind == "json_schema":
        params["json_schema"] = json.dumps(value)
    elif kind == "full_assistant_ebnf":
        params["ebnf"] = value
        params["ebnf_full_assistant"] = True
    else:
        params[kind] = value
    return params

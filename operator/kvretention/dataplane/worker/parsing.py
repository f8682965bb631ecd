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
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kvretention.dataplane.chat_template import CUSTOM_INPUT, build_tool_schema
from kvretention.dataplane.protocol import (
    PreprocessedRequest,
    ReasoningControl,
    ToolCallDelta,
    ToolDefinition,
)

TOOL_CALL_PARSER_FLAG: Final = "--tool-call-parser"
REASONING_PARSER_FLAG: Final = "--reasoning-parser"
BATCH_AFTER_CHARS: Final = 512
ARGUMENT_BATCH_SHARE: Final = 4
"""Past its first 512 characters a call's arguments reach the detector in batches of a quarter
of what the call has had (see ``OutputParser._batched_arguments``)."""
MIN_DRAIN_CHARS: Final = 16
"""A chunk this long may hold several parser steps (several tokens coalesced)."""
WHOLE_SECTION_PARSERS: Final[dict[str, str]] = {
    "cohere_command4": "",
    "interns1": "",
    "mistral": "[",
}
"""Formats whose SGLang streaming detector gives other calls than its own whole parse of the
same text (0.5.23): ``mistral`` sends an array's second call as text (upstream
sgl-project/sglang PR #36692), ``cohere_command4`` joins both calls' arguments under one index,
``interns1`` loses the second call when it comes a token at a time. Their calls section is held
from its opening marker and parsed whole at the end (see ``OutputParser._held_section``) when
it begins as the value says after the marker: Mistral's newer ``[TOOL_CALLS]name[ARGS]{...}``
streams right, only its JSON array is held."""
MAX_DRAIN_STEPS: Final = 256
"""Empty increments one chunk may take to drain a detector's buffer (each step is a call's
name or its arguments; a bound, so a detector that reports progress forever cannot spin)."""


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


def _sglang_parsers() -> tuple[Any, Any]:
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
    return sorted(_sglang_parsers()[0].ToolCallParserEnum)


def reasoning_parser_names() -> list[str]:
    return sorted(_sglang_parsers()[1].DetectorMap)


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
        _, reasoning_parser = _sglang_parsers()
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
            function_call_parser, _ = _sglang_parsers()
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
        function_call_parser, _ = _sglang_parsers()
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


@dataclass
class ParsedDelta:
    """One step of parsed output."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


def new_tool_call_id() -> str:
    """A unique call id in the OpenAI shape (SGLang generates the same)."""
    return f"call_{uuid.uuid4().hex[:24]}"


class OutputParser:
    """Splits one answer's text into reasoning, text and tool-call deltas, streaming or whole.

    ``feed`` takes text deltas as the engine streams them; ``finish`` flushes what the parsers
    held back. ``parse_whole`` parses a complete answer with SGLang's non-streaming entry points.
    A custom tool's arguments (``{"input": ...}`` as the template showed it) are held until the
    call is complete and then sent as the free-form input text.
    """

    def __init__(self, plan: OutputPlan) -> None:
        self._plan = plan
        self._reasoning: Any = None
        self._tools: Any = None
        self._call_ids: dict[int, str] = {}
        self._index_of: dict[int, int] = {}
        """The detector's index of a call -> the client's (see :meth:`_client_index`)."""
        self._calls_begun = 0
        self._held_custom: dict[int, str] = {}
        self._held_space = ""
        """Whitespace-only answer text not sent yet: dropped when a tool call follows it (the
        template's ``"\n\n"`` before a call), sent with the next text otherwise."""
        self._held_arguments = ""
        """Text for the detector held while it streams a call's arguments (batched)."""
        self._call_chars = 0
        """How much of the current call the detector has been fed (the batch grows with it)."""
        self._answer = ""
        """The whole answer so far, when the plan reads it whole (parsed at :meth:`finish`)."""
        self._answer_text = ""
        """The answer's text past the reasoning, as the tool-call parser was fed it."""
        self._sent: list[ToolCallDelta] = []
        """Every call delta sent, for :meth:`_check_against_whole`."""
        self.differs_from_whole = False
        """The streamed calls are not the ones SGLang's whole parse reads (set by :meth:`finish`)."""
        self._held_thought = ""
        """Whitespace-only reasoning not sent yet (an empty ``<think>\n\n</think>``): sent with
        the next reasoning, dropped once the answer moves on without any."""
        self.called = False
        self.dropped_call = False
        """A call after the first began under ``parallel_tool_calls: false``: the answer the
        client gets is complete, the rest of the engine's output is not needed."""
        if plan.names.reasoning_parser is not None and plan.separate_reasoning:
            _, reasoning_parser = _sglang_parsers()
            self._reasoning = reasoning_parser(
                plan.names.reasoning_parser,
                stream_reasoning=plan.stream_reasoning,
                force_reasoning=plan.force_reasoning,
                tool_call_parser_active=plan.parses_tools,
            )
        think_end = getattr(getattr(self._reasoning, "detector", None), "think_end_token", "")
        self._think_end: str = think_end if isinstance(think_end, str) else ""
        if plan.json_array:
            from sglang.srt.function_call.json_array_parser import JsonArrayParser

            self._tools = JsonArrayParser()
        elif plan.parses_tools:
            self._tools = self._function_call_parser()
        self._detector: Any = (
            self._tools if plan.json_array else getattr(self._tools, "detector", None)
        )
        self._opening, self._call_markers = _call_markers(
            None if plan.json_array else self._detector
        )
        self._call_edges = (*self._call_markers, *_call_ends(self._detector))
        """Markers that end a call or open the next: held arguments go out when one shows."""
        starts = {m[0] for m in (*self._call_markers, self._opening) if m}
        self._marker_start = (
            re.compile(f"[{re.escape(''.join(sorted(starts)))}]") if starts else None
        )
        """Any character a marker starts with: a chunk without one is fed whole, at once."""
        holds = plan.names.tool_call_parser in WHOLE_SECTION_PARSERS and not plan.json_array
        self._section_marker = self._opening.split()[0] if holds and self._opening.strip() else ""
        """Where a calls section parsed whole at the end begins (``""``: calls stream)."""
        self._section_form = WHOLE_SECTION_PARSERS.get(plan.names.tool_call_parser or "", "")
        """How a held section begins after its marker; another beginning streams after all."""
        self._section: str | None = None
        """The calls section held since its marker showed."""
        self._section_lead = ""
        """Text that may be the start of the section's marker, held until the next chunk."""

    def feed(self, delta: str) -> ParsedDelta:
        if self._plan.read_whole:
            self._answer += delta
            return ParsedDelta()
        out = ParsedDelta()
        text = delta
        if self._reasoning is not None and delta:
            out.reasoning, text = self._split_reasoning(delta)
        out.text, out.tool_calls = self._feed_tools(text)
        return self._settle(out, final=False)

    def _split_reasoning(self, delta: str) -> tuple[str, str]:
        """Reasoning and answer text of one chunk. A chunk that goes on past the reasoning's end
        marker is fed as two increments, ending at the marker: some detectors drop what shares
        an increment with it (Cohere Command's lost the answer or the calls after
        ``<|END_THINKING|>``)."""
        reasoning, text = "", ""
        for piece in _after_each(delta, self._think_end):
            more_reasoning, more_text = self._reasoning.parse_stream_chunk(piece)
            reasoning, text = reasoning + (more_reasoning or ""), text + (more_text or "")
        return reasoning, text

    def _one_call_kept(self, calls: list[ToolCallDelta]) -> list[ToolCallDelta]:
        """``parallel_tool_calls: false``: the first call only. An automatic tool choice is not
        constrained (SGLang constrains it only for strict tools), so a model may still write a
        second call; the client asked for at most one and gets one."""
        kept = calls if self._plan.parallel_tool_calls else [c for c in calls if c.index == 0]
        self.dropped_call = self.dropped_call or len(kept) < len(calls)
        return kept

    def _settle(self, out: ParsedDelta, *, final: bool) -> ParsedDelta:
        """Hold whitespace-only text until it is known whether a tool call follows it, and
        whitespace-only reasoning until real reasoning follows it (clients would show either as
        an empty block or item of its own)."""
        thought = self._held_thought + out.reasoning
        self._held_thought = ""
        if thought and not thought.strip():
            moved_on = final or bool(out.text.strip()) or bool(out.tool_calls)
            self._held_thought, thought = ("", "") if moved_on else (thought, "")
        out.reasoning = thought
        self._sent += out.tool_calls
        text = self._held_space + out.text
        self._held_space = ""
        if not text.strip() and (out.tool_calls or (final and self.called)):
            text = ""  # it only led up to a tool call
        elif text and not text.strip() and not final:
            self._held_space, text = text, ""
        out.text = text
        return out

    def _feed_tools(self, text: str, *, drain: bool = False) -> tuple[str, list[ToolCallDelta]]:
        """Answer text (reasoning already split off) through the tool-call parser.

        SGLang's detectors take one step per increment (a call's name, then its arguments,
        then the next call), keep the rest in their buffer, and drop text that comes before a
        call in the same increment. The engine coalesces tokens into one chunk whenever its
        reader lags, so a chunk is fed in pieces that each start at a call's opening marker,
        and each piece is drained with empty increments while they make progress; else text
        before a call, a call's arguments or the next call would be lost or wait for text
        that may never come. A piece of a token or two holds one step at most and is not
        drained (a drain re-parses the call so far, which would double the cost of a long call
        streamed token by token). ``drain``: always, even with no new text (the stream's
        end)."""
        if self._tools is None or not (text or drain):
            return text, []
        self._answer_text += text
        if self._section_marker:
            text = self._held_section(text)
            if self._section_marker:
                return text, []
        if self._held_arguments or self._streaming_arguments():
            text = self._batched_arguments(text, drain=drain)
            if not (text or drain):
                return "", []
        else:
            self._call_chars = 0  # between calls: the next one starts short
        if not drain and len(text) < MIN_DRAIN_CHARS and self._whole(text):
            normal, found = self._step_tools(text)  # most chunks: a token of text
            return normal, self._one_call_kept(self._deltas(found)) if found else []
        normal = ""
        calls: list[Any] = []
        for piece in self._at_call_starts(text):
            more, more_calls = self._step_drained(
                piece, drain=drain or len(piece) >= MIN_DRAIN_CHARS
            )
            normal, calls = normal + more, calls + more_calls
        return normal, self._one_call_kept(self._deltas(calls))

    def _held_section(self, text: str) -> str:
        """The text before the calls section, to send now; the section from its marker on is
        held for :meth:`finish` (formats in ``WHOLE_SECTION_PARSERS``: their calls are sent
        whole at the end, as SGLang's non-streaming parse reads them). A section in a form the
        detector streams right is let go: the text then returned holds it, for the detector."""
        lead = ""
        if self._section is None:
            text, self._section_lead = self._section_lead + text, ""
            at = text.find(self._section_marker)
            if at < 0:
                partial = _partial_marker_at_end(text, self._section_marker)
                self._section_lead = text[len(text) - partial :]
                return text[: len(text) - partial]
            lead, text, self._section = text[:at], text[at:], ""
        self._section += text
        begins = self._section[len(self._section_marker) :].lstrip()
        if self._section_form and begins and not begins.startswith(self._section_form):
            section, self._section, self._section_marker = self._section, None, ""
            return lead + section
        return lead

    def _batched_arguments(self, text: str, *, drain: bool) -> str:
        """What to feed the detector now. While it streams a call's arguments it re-parses
        the whole call on every increment (a 2,000-token file written token by token cost
        ~1 ms per token, ~2 s of the worker's CPU for the call). Past ``BATCH_AFTER_CHARS``
        of a call, text is held until it is a quarter of what the call has had, so a long call
        costs a few re-parses of itself; a short one streams token by token as before (a
        model's malformed arguments then still stream up to where they break). ``drain``: the
        answer's end, all of it now."""
        held = self._held_arguments + text
        if drain or not self._streaming_arguments():
            self._held_arguments, self._call_chars = "", 0
            return held
        short = self._call_chars < BATCH_AFTER_CHARS
        ends = any(marker in held for marker in self._call_edges)  # the call may be over
        if short or ends or len(held) >= self._call_chars // ARGUMENT_BATCH_SHARE:
            self._held_arguments = ""
            self._call_chars += len(held)
            return held
        self._held_arguments = held
        return ""

    def _streaming_arguments(self) -> bool:
        """Whether the detector has named a call and is reading its arguments."""
        return getattr(self._detector, "current_tool_name_sent", False) is True

    def _whole(self, text: str) -> bool:
        """Whether ``text`` holds no character a call's marker starts with (fed as it is)."""
        return self._marker_start is None or self._marker_start.search(text) is None

    def _at_call_starts(self, text: str) -> list[str]:
        """``text`` cut before each call-opening marker of the detector after its start, and
        before a trailing start of its first one (a detector holds a partial marker with the
        text before it, and drops that text once the marker completes)."""
        if self._whole(text):
            return [text]
        markers = self._call_markers
        cuts = sorted({at for m in markers for at in _occurrences(text, m) if at > 0})
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        last = pieces[-1]
        partial = _partial_marker_at_end(last, self._opening)
        if 0 < partial < len(last):
            return [*pieces[:-1], last[:-partial], last[-partial:]]
        return pieces

    def _step_drained(self, text: str, *, drain: bool) -> tuple[str, list[Any]]:
        normal, calls = self._step_tools(text)
        progressed = drain and bool(normal or calls)
        for _ in range(MAX_DRAIN_STEPS):
            if not progressed:
                break
            more, more_calls = self._step_tools("")
            normal, calls = normal + more, [*calls, *more_calls]
            progressed = bool(more or more_calls)
        return normal, calls

    def _step_tools(self, text: str) -> tuple[str, list[Any]]:
        """One increment of SGLang's tool-call parser."""
        if self._plan.json_array:
            result = self._tools.parse_streaming_increment(text, self._plan.tools)
            return result.normal_text or "", list(result.calls)
        normal, calls = self._tools.parse_stream_chunk(text)
        return normal or "", list(calls)

    def finish(self) -> ParsedDelta:
        if self._plan.read_whole:
            return self.parse_whole(self._answer)
        out = ParsedDelta()
        tail = ""
        if self._reasoning is not None:
            reasoning, tail = self._reasoning.parse_stream_end()
            out.reasoning = reasoning or ""
            tail = tail or ""
        if self._tools is None:
            out.text = tail
            return self._settle(out, final=True)
        if self._section_marker:
            tail = self._held_section(tail)
        if self._section_marker:  # still held: parsed whole
            normal, out.tool_calls = self._calls_whole(self._section or "")
            out.text = tail + self._section_lead + normal
            out.tool_calls = self._one_call_kept(out.tool_calls)
            return self._settle(out, final=True)
        out.text, out.tool_calls = self._feed_tools(tail, drain=True)
        if self._plan.json_array:
            end = self._tools.finish(self._plan.tools)
            out.text += end.normal_text
            calls = list(end.calls)
        else:
            end_text, calls = self._tools.parse_stream_end()
            out.text += end_text or ""
        out.tool_calls += self._deltas(calls) + self._unstreamed_arguments()
        out.tool_calls += self._release_custom()
        out.tool_calls = self._one_call_kept(out.tool_calls)
        out = self._settle(out, final=True)
        self._check_against_whole()
        return out

    def parse_whole(self, text: str) -> ParsedDelta:
        """A complete answer through SGLang's non-streaming parsers."""
        out = ParsedDelta(text=text)
        if self._reasoning is not None:
            reasoning, normal = self._reasoning.parse_non_stream(text)
            out.reasoning, out.text = reasoning or "", normal or ""
            if not out.reasoning.strip():
                out.reasoning = ""  # an empty think block is no reasoning
        if self._tools is None:
            return out
        out.text, out.tool_calls = self._calls_whole(out.text)
        out.tool_calls = self._one_call_kept(out.tool_calls)
        return out

    def _calls_whole(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """Answer text (reasoning split off) through SGLang's non-streaming tool-call parser:
        the text around the calls, and each call whole."""
        text, calls = self._parsed_calls(text)
        deltas = []
        for index, (name, arguments) in enumerate(calls):
            self.called = True
            deltas.append(
                ToolCallDelta(
                    index=index,
                    id=new_tool_call_id(),
                    name=name,
                    arguments=arguments,
                    kind=self._kind(name),
                )
            )
        if deltas and not text.strip():
            text = ""  # the template's whitespace before the calls
        return text, deltas

    def _parsed_calls(self, text: str) -> tuple[str, list[tuple[str, str]]]:
        """SGLang's non-streaming reading of ``text``: the text around the calls and each call's
        name and arguments (a custom tool's as its free-form input)."""
        if self._plan.json_array:
            items = _json_array_calls(text)
            if items is None:
                return text, []
            text, calls = "", items
        else:
            parser = self._function_call_parser()
            if not parser.has_tool_call(text):
                return text, []
            text, found = parser.parse_non_stream(text)
            calls = [(c.name, c.parameters) for c in found]
        return text, [
            (name, _custom_input(args) if self._kind(name) == "custom" else args)
            for name, args in calls
        ]

    def _check_against_whole(self) -> None:
        """Whether the calls this answer streamed are the ones SGLang's non-streaming parse reads
        from the same text (``differs_from_whole``): a detector's streaming can lose, join or
        misplace calls where its whole parse does not (the formats found so far are worked
        around; this makes a new one visible). One whole parse per answer with a call in it;
        an answer of text with no call's marker in it is passed by the detector's own check."""
        has_call = getattr(self._detector, "has_tool_call", None)
        if not self._sent and callable(has_call) and not has_call(self._answer_text):
            return
        _, whole = self._parsed_calls(self._answer_text)
        if not self._plan.parallel_tool_calls:
            whole = whole[:1]
        streamed: dict[int, tuple[str, str]] = {}
        for delta in self._sent:
            name, arguments = streamed.get(delta.index, (delta.name or "", ""))
            streamed[delta.index] = (name, arguments + delta.arguments)
        calls = [streamed[i] for i in sorted(streamed)]
        self.differs_from_whole = [_call_key(c) for c in calls] != [_call_key(c) for c in whole]

    def _function_call_parser(self) -> Any:
        """SGLang's parser as its server builds it: with the tool choice when one is forced."""
        function_call_parser, _ = _sglang_parsers()
        choice = self._plan.tool_choice
        forced = choice if choice != "auto" else None
        return function_call_parser(
            self._plan.tools, self._plan.names.tool_call_parser, tool_choice=forced
        )

    def _kind(self, name: str | None) -> Any:
        return self._plan.tool_kinds.get(name or "", "function")

    def _deltas(self, calls: Sequence[Any]) -> list[ToolCallDelta]:
        out: list[ToolCallDelta] = []
        for call in calls:
            index = self._client_index(call)
            arguments = call.parameters or ""
            if call.name and index not in self._call_ids:
                self.called = True
                # A new call began: earlier ones are complete. What the detector parsed of the
                # previous one but has not streamed (a detector may finish a call's arguments
                # late) goes out first; the answer may end here (``parallel_tool_calls: false``).
                if index > 0:
                    out += self._unstreamed_arguments(index - 1)
                out += self._release_custom()
                self._call_ids[index] = new_tool_call_id()
                kind = self._kind(call.name)
                first = ToolCallDelta(
                    index=index, id=self._call_ids[index], name=call.name, kind=kind
                )
                if kind == "custom":
                    self._held_custom[index] = arguments
                    out.append(first)
                else:
                    out.append(first.model_copy(update={"arguments": arguments}))
            elif arguments and index in self._held_custom:
                self._held_custom[index] += arguments
            elif arguments:
                out.append(ToolCallDelta(index=index, arguments=arguments))
        return out

    def _client_index(self, call: Any) -> int:
        """The call's index for the client: calls numbered as they begin. Some detectors number
        a call by its tool's place in the request's list (Gemma 4's, LFM2's JSON form), so two
        calls of one tool share an index and a call of the second tool comes as index 1 first:
        a name on an index whose call is already named is a new call."""
        theirs = int(call.tool_index)
        ours = self._index_of.get(theirs)
        if ours is None or (call.name and ours in self._call_ids):
            ours = self._index_of[theirs] = self._calls_begun
            self._calls_begun += 1
        return ours

    def _release_custom(self) -> list[ToolCallDelta]:
        """Send held custom-tool inputs once their call is complete (a later call began, or the
        stream ended)."""
        out = []
        for index in sorted(self._held_custom):
            raw = self._held_custom.pop(index)
            out.append(ToolCallDelta(index=index, arguments=_custom_input(raw), kind="custom"))
        return out

    def _unstreamed_arguments(self, index: int | None = None) -> list[ToolCallDelta]:
        """Arguments the detector parsed but never streamed (SGLang's
        ``_check_for_unstreamed_tool_args``), of call ``index`` (default: the last)."""
        detector = getattr(self._tools, "detector", self._tools)
        prev = getattr(detector, "prev_tool_call_arr", None)
        streamed = getattr(detector, "streamed_args_for_tool", None)
        if not prev or not streamed:
            return []
        index = len(prev) - 1 if index is None else index
        if index < 0 or index >= len(prev) or index >= len(streamed):
            return []
        expected = prev[index].get("arguments", {})
        expected_text = (
            expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)
        )
        actual = streamed[index]
        remaining = expected_text[len(actual) :] if expected_text.startswith(actual) else ""
        if not remaining:
            return []
        streamed[index] = actual + remaining  # sent now: a later check must not send it again
        if index in self._held_custom:
            self._held_custom[index] += remaining
            return []
        return [ToolCallDelta(index=index, arguments=remaining)]


CALL_MARKER_ATTRIBUTES: Final = (
    "bot_token",
    "tool_call_start_token",
    "tool_call_begin",
    "invoke_start_token",
    "tool_call_prefix",
    "eot_token",
)
"""Where SGLang's detectors keep the markers that open a tool-call section or one call, and the
section's end (Step3 loses a call that shares an increment with it)."""
CALL_END_ATTRIBUTES: Final = ("eot_token", "tool_call_end_token", "invoke_end_token")
"""Where they keep the markers that end one call or the section."""


def _call_markers(detector: Any) -> tuple[str, tuple[str, ...]]:
    """The detector's section-opening marker (``""``: none) and every marker a chunk is cut
    before (``CALL_MARKER_ATTRIBUTES``), each cut at its first whitespace (Qwen's ``<tool_call>\\n`` may come without its
    newline); a ``func_call_regex``'s literal start counts too (DeepSeek's per-call marker)."""
    found = [getattr(detector, name, "") for name in CALL_MARKER_ATTRIBUTES]
    pattern = getattr(detector, "func_call_regex", "")
    if isinstance(pattern, str):
        found.append(re.split(r"[.\\(\[*+?{|^$]", pattern, maxsplit=1)[0])
    words = [m.split()[0] for m in found if isinstance(m, str) and m.strip()]
    words = [w for w in words if len(w) > 2]  # not Mistral's ``]``: text is full of them
    opening = getattr(detector, "bot_token", "")
    return (opening if isinstance(opening, str) else ""), tuple(dict.fromkeys(words))


def _call_ends(detector: Any) -> tuple[str, ...]:
    """The markers the detector keeps for the end of a call or of the tool-call section."""
    found = (getattr(detector, name, "") for name in CALL_END_ATTRIBUTES)
    return tuple(dict.fromkeys(m.strip() for m in found if isinstance(m, str) and m.strip()))


def _occurrences(text: str, marker: str) -> Iterator[int]:
    at = text.find(marker)
    while at != -1:
        yield at
        at = text.find(marker, at + 1)


def _after_each(text: str, marker: str) -> list[str]:
    """``text`` cut after each ``marker`` that has more text after it."""
    if not marker or marker not in text[: -len(marker)]:
        return [text]
    pieces = text.split(marker)
    return [piece + marker for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])


def _partial_marker_at_end(text: str, marker: str) -> int:
    """How many of ``text``'s last characters begin ``marker`` without completing it."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def _call_key(call: tuple[str, str]) -> tuple[str, Any]:
    """A call's name and arguments, compared as JSON where they are JSON."""
    name, arguments = call
    try:
        return name, json.loads(arguments)
    except ValueError:
        return name, arguments


def _custom_input(arguments: str) -> str:
    """The free-form input of a custom tool call from the ``{"input": ...}`` the model wrote."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(CUSTOM_INPUT), str):
        return str(value[CUSTOM_INPUT])
    return arguments


def _json_array_calls(text: str) -> list[tuple[str, str]] | None:
    """SGLang's non-streaming reading of a constrained JSON array of ``{name, parameters}``."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(d, dict) and "name" in d for d in data):
        return None
    return [(str(d["name"]), json.dumps(d.get("parameters", {}), ensure_ascii=False)) for d in data]

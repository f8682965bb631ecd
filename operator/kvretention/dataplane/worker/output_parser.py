"""One answer's text split into reasoning, text and tool-call deltas, as SGLang's server splits it.

:class:`OutputParser` runs the detectors :func:`~kvretention.dataplane.worker.parsing.plan_output`
chose (SGLang's own ``ReasoningParser`` and ``FunctionCallParser``), streaming or whole. Where it
departs from a plain detector loop (sections held and parsed whole, arguments batched, streamed
calls checked against the whole parse) the reason is written where it is done.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from msgspec.structs import replace

from kvretention.dataplane.protocol import ToolCallDelta
from kvretention.dataplane.template_input import CUSTOM_INPUT
from kvretention.dataplane.worker.parsing import OutputPlan, sglang_parsers

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
        self._held_custom: dict[int, list[str]] = {}
        """A custom tool's input, in pieces, until its call is complete."""
        self._held_space = ""
        """Whitespace-only answer text not sent yet: dropped when a tool call follows it (the
        template's ``"\n\n"`` before a call), sent with the next text otherwise."""
        self._held_arguments = ""
        """Text for the detector held while it streams a call's arguments (batched)."""
        self._call_chars = 0
        """How much of the current call the detector has been fed (the batch grows with it)."""
        self._answer: list[str] = []
        """The whole answer so far, when the plan reads it whole (parsed at :meth:`finish`). This
        and the texts below are kept in pieces and joined once: a string grown by ``+=`` is copied
        whole per token, the square of a long answer (an agent writing a file)."""
        self._answer_text: list[str] = []
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
            _, reasoning_parser = sglang_parsers()
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
            self._answer.append(delta)
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
        self._answer_text.append(text)
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
            return self.parse_whole("".join(self._answer))
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
        answer_text = "".join(self._answer_text)
        if not self._sent and callable(has_call) and not has_call(answer_text):
            return
        _, whole = self._parsed_calls(answer_text)
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
        function_call_parser, _ = sglang_parsers()
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
                    self._held_custom[index] = [arguments]
                    out.append(first)
                else:
                    out.append(replace(first, arguments=arguments))
            elif arguments and index in self._held_custom:
                self._held_custom[index].append(arguments)
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
            raw = "".join(self._held_custom.pop(index))
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
            self._held_custom[index].append(remaining)
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

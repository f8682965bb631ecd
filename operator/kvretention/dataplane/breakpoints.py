"""Breakpoints on the neutral conversation -> token offsets in the rendered prompt -> retain ranges.

The frontend marks breakpoints with ``retain_ttl`` on tools, messages, content parts and tool calls
("retain the rendered prompt up to the end of this element"). Only the worker holds the template
and the tokens, so it resolves each marker here, purely:

1. Render (same template call as the prompt, but **without** the generation prompt) the
   conversation cut right after the element, ``upto``, and the same cut with a sentinel right
   after the element, ``probe`` (a sentinel tool after a tool, a sentinel call after a call, else
   sentinel text after the part or at the end of the message's content). ``lcp(upto, probe)`` is
   where the element itself ends in the cut; ``lcp(upto, prompt)`` is how far the cut agrees with
   the prompt. A tool, a call or a part ends at the smaller of the two: the first alone would run
   on into whatever the template renders after the element from other parts of the conversation
   (the tools section after the last system block, the closing markup after the last part, the
   rest of the prompt after the last tool). A whole message ends at ``lcp(upto, prompt)``, its own
   closing markup included. Cuts: a message -> ``messages[:i+1]``; a content part -> that
   message's ``parts[:j+1]`` without its tool calls (they render after the content); a tool call
   -> ``tool_calls[:c+1]``; a tool -> ``tools[:k+1]`` with every message.
2. When the prompt parts from the cut *before* the element's own end, the template renders the
   cut conversation differently from the whole one (Qwen3-style templates replay reasoning only
   after the last user turn). A message or part then ends where its content ends in the whole
   conversation: the prompt against the whole conversation with sentinel text inserted right after
   the content (two sentinels with different first characters, so text that merely starts like a
   sentinel cannot stretch it). A tool call keeps what the cut and the prompt share.
3. Tools render where the template puts them (Qwen-style templates list them inside the system
   turn, after the system text), so a tool's offset is the end of that tool's rendering in the
   template's order and its prefix holds whatever the template renders before it (the system
   text, for Qwen). Anthropic's tools -> system -> messages order is not the rendered order, and
   a prefix can only be what the template renders first; likewise a breakpoint on the last system
   block ends before the tools section, not after it.
4. Map the character offset to tokens with the prompt's offset mapping: a token is kept only when
   it ends at or before the offset; a token straddling the boundary is left out.

Never widened into what the client wrote after the element. What can stay in is markup every
continuation shares: the separator joining two text parts, and characters the element's closing
markup and the next element's opening markup have in common when the tokenizer splits them (a
lone ``<`` where ``<tool_response>`` is not one token).

The newest message needs no probe when the prompt starts with the whole conversation's
rendering (it always does where the template writes the generation prompt last): it ends where
that rendering ends, and nothing the client wrote follows it.

A marker whose end cannot be told (the template renders nothing for the sentinel after it, e.g. a
tool hidden by ``tool_choice``; a cut the template refuses) or that ends before the first whole
token is dropped and reported, not widened. The prompt is tokenized once by the caller; the extra
renders are strings: two per marker, two more for a message or part the cut renders differently.

:func:`plan_retain_directives` turns resolved offsets into ``kv.retain`` directives: each token
keeps the longest TTL of the breakpoints at or after it, so ranges are disjoint, ordered, and their
durations strictly decrease along the token axis; at most one directive per distinct TTL.
"""

from __future__ import annotations

import operator
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from kvretention.common.kv_retain import MAX_DIRECTIVES as MAX_DIRECTIVES
from kvretention.common.kv_retain import MAX_DURATION_SECONDS as MAX_DURATION_SECONDS
from kvretention.common.kv_retain import MAX_PRIORITY
from kvretention.dataplane.protocol import (
    ChatMessage,
    ImagePart,
    TextPart,
    ToolCall,
    ToolDefinition,
)

Render = Callable[[Sequence[ChatMessage], Sequence[ToolDefinition]], str]
"""Render messages and tools exactly as the prompt was rendered (same conversion, tool choice and
template kwargs), except ``add_generation_prompt=False``; returns the text. A ``ValueError`` it
raises drops that one marker (reported), it does not fail the request."""

_SENTINEL: Final = "kvr-breakpoint-sentinel"
SENTINEL_TOOL: Final = ToolDefinition(
    name=_SENTINEL, description=_SENTINEL, parameters={"type": "object", "properties": {}}
)
SENTINEL_CALL: Final = ToolCall(id=_SENTINEL, name=_SENTINEL, arguments="{}")
_SENTINEL_TEXTS: Final = (_SENTINEL, f"#{_SENTINEL}")
"""Placed right after a marked element: where the rendering parts from the one without it is
where the element ends (so the element's end never runs on into what the template renders next)."""

ElementKind = Literal["tool", "message", "part", "call"]


class MarkerMismatch(ValueError):
    """The envelope announced a different number of breakpoints than the conversation carries."""


@dataclass(frozen=True, slots=True)
class Marker:
    """A ``retain_ttl`` found on the conversation: ``index`` is the tool or message index,
    ``sub`` the part or call index within that message (-1 for tools and whole messages)."""

    kind: ElementKind
    index: int
    sub: int
    ttl_seconds: int

    @property
    def element(self) -> str:
        """Where it is, in the neutral conversation's terms (for the trace)."""
        if self.kind == "tool":
            return f"tools[{self.index}]"
        if self.kind == "message":
            return f"messages[{self.index}]"
        field = "content" if self.kind == "part" else "tool_calls"
        return f"messages[{self.index}].{field}[{self.sub}]"


@dataclass(frozen=True, slots=True)
class ResolvedBreakpoint:
    """Retain tokens ``[0, token_end)`` for ``ttl_seconds``; ``char_end`` is the text offset."""

    element: str
    ttl_seconds: int
    char_end: int
    token_end: int


@dataclass(frozen=True, slots=True)
class DroppedBreakpoint:
    """A marker that could not be resolved without widening, and why."""

    element: str
    ttl_seconds: int
    reason: str


@dataclass(frozen=True, slots=True)
class Resolution:
    resolved: tuple[ResolvedBreakpoint, ...]
    dropped: tuple[DroppedBreakpoint, ...] = ()

    def to_trace(self) -> dict[str, Any]:
        """What the request trace records for replay attribution."""
        out: dict[str, Any] = {
            "breakpoints": [
                {"element": r.element, "ttl_seconds": r.ttl_seconds, "token_end": r.token_end}
                for r in self.resolved
            ]
        }
        if self.dropped:
            out["dropped"] = [
                {"element": d.element, "ttl_seconds": d.ttl_seconds, "reason": d.reason}
                for d in self.dropped
            ]
        return out


def find_markers(messages: Sequence[ChatMessage], tools: Sequence[ToolDefinition]) -> list[Marker]:
    """Every ``retain_ttl`` on the conversation (tools first, then messages in order)."""
    found = [
        Marker("tool", k, -1, tool.retain_ttl)
        for k, tool in enumerate(tools)
        if tool.retain_ttl is not None
    ]
    # plain loops, no generator per message: this runs over ~1,500 elements per agent turn
    for i, message in enumerate(messages):
        content = message.content
        if not isinstance(content, str):
            for j, part in enumerate(content):
                if part.retain_ttl is not None:
                    found.append(Marker("part", i, j, part.retain_ttl))
        for c, call in enumerate(message.tool_calls):
            if call.retain_ttl is not None:
                found.append(Marker("call", i, c, call.retain_ttl))
        if message.retain_ttl is not None:
            found.append(Marker("message", i, -1, message.retain_ttl))
    return found


def resolve_breakpoints(
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolDefinition],
    *,
    render: Render,
    prompt: str,
    offsets: Sequence[tuple[int, int]] = (),
    ends: Sequence[int] | None = None,
    ordered: bool | None = None,
    expected: int | None = None,
) -> Resolution:
    """Each marker's token offset in ``prompt`` (rendered with the generation prompt).

    ``offsets`` is the prompt's tokenization as ``(start, end)`` character spans, one per token
    (a fast tokenizer's ``return_offsets_mapping``); or ``ends``, each token's end alone, with
    ``ordered`` saying whether they never decrease (a worker that reused the previous turn's
    tokens has both, and skips an O(tokens) pass). ``expected`` is the envelope's announced
    breakpoint count; a different count raises :class:`MarkerMismatch`.
    """
    markers = find_markers(messages, tools)
    if expected is not None and expected != len(markers):
        raise MarkerMismatch(
            f"kv_hints announces {expected} prefix breakpoint(s) but the conversation carries "
            f"{len(markers)}"
        )
    if ends is None:
        ends = list(map(operator.itemgetter(1), offsets))
    if ordered is None:  # once per request: timsort checks sorted input in C
        ordered = (ends if isinstance(ends, list) else list(ends)) == sorted(ends)
    resolved: list[ResolvedBreakpoint] = []
    dropped: list[DroppedBreakpoint] = []
    for marker in markers:
        try:
            char_end, reason = _char_end(marker, messages, tools, render=render, prompt=prompt)
        except (
            ValueError
        ) as exc:  # the worker's render raises its TemplateInputError (a ValueError)
            char_end, reason = None, f"the chat template refused the cut conversation: {exc}"
        token_end = 0 if char_end is None else tokens_within(ends, char_end, ordered=ordered)
        if char_end is not None and token_end == 0:
            reason = "it ends before the first whole token"
        if reason is not None or char_end is None:
            dropped.append(DroppedBreakpoint(marker.element, marker.ttl_seconds, reason or ""))
            continue
        resolved.append(ResolvedBreakpoint(marker.element, marker.ttl_seconds, char_end, token_end))
    return Resolution(tuple(resolved), tuple(dropped))


def _char_end(
    marker: Marker,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolDefinition],
    *,
    render: Render,
    prompt: str,
) -> tuple[int | None, str | None]:
    """Where the element's rendering ends in the prompt (see the module docstring)."""
    if marker.kind == "tool":
        shown = tools[: marker.index + 1]
        upto = render(messages, shown)
        probe = render(messages, [*shown, SENTINEL_TOOL])
    else:
        head = messages[: marker.index]
        message = messages[marker.index]
        cut = message if marker.kind == "message" else _truncated(message, marker.kind, marker.sub)
        upto = render([*head, cut], tools)
        if marker.kind == "message" and marker.index == len(messages) - 1:
            ends_conversation = _newest_message_end(upto, prompt)
            if ends_conversation is not None:
                return ends_conversation, None
        probe = render([*head, _with_sentinel(cut, marker)], tools)
    if probe == upto:
        return None, (
            "the chat template renders nothing for an element placed after it, so where it ends "
            "cannot be told (e.g. a tool hidden by tool_choice)"
        )
    in_prompt = common_prefix(upto, prompt)
    in_cut = common_prefix(upto, probe)  # where the element itself ends in the cut's rendering
    if marker.kind == "message" and in_prompt >= in_cut:
        return in_prompt, None  # the message's own closing markup included
    if marker.kind in ("tool", "call") or in_prompt >= in_cut:
        return min(in_prompt, in_cut), None
    # The prompt parts from the cut before the element's content ends: the template renders the
    # cut conversation differently (e.g. reasoning replayed only after the last user turn). Find
    # the content's end in the whole conversation instead; both bounds are safe.
    return max(in_prompt, _content_end(marker, messages, tools, render=render, prompt=prompt)), None


def _newest_message_end(upto: str, prompt: str) -> int | None:
    """The newest message ends where the conversation's rendering does, when the prompt starts
    with that rendering: nothing the client wrote comes after it, so no probe (a second render
    of the whole conversation, the costliest step of an agent turn) is needed to tell where it
    ends. ``None`` where the prompt renders the conversation otherwise (then probe as usual)."""
    return len(upto) if upto and prompt.startswith(upto) else None


def _content_end(
    marker: Marker,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolDefinition],
    *,
    render: Render,
    prompt: str,
) -> int:
    """Where the element's content ends in the whole conversation's rendering: the prompt and
    the conversation with sentinel text inserted right after that content part from each other
    there. Two sentinels with different first characters keep text that merely starts like a
    sentinel from stretching it."""
    message = messages[marker.index]
    at = len(_parts(message)) if marker.kind == "message" else marker.sub + 1
    ends = []
    for text in _SENTINEL_TEXTS:
        inserted = [*messages]
        inserted[marker.index] = _insert_text(message, at, text)
        ends.append(common_prefix(prompt, render(inserted, tools)))
    return min(ends)


def _parts(message: ChatMessage) -> list[TextPart | ImagePart]:
    if isinstance(message.content, str):
        return [TextPart(text=message.content)] if message.content else []
    return list(message.content)


def _insert_text(message: ChatMessage, at: int, text: str) -> ChatMessage:
    parts = _parts(message)
    return message.model_copy(update={"content": [*parts[:at], TextPart(text=text), *parts[at:]]})


def _truncated(message: ChatMessage, kind: ElementKind, index: int) -> ChatMessage:
    """The message cut right after content part ``index`` (its tool calls dropped: they render
    after the content) or right after tool call ``index``."""
    if kind == "part":
        assert not isinstance(message.content, str)
        return message.model_copy(
            update={"content": message.content[: index + 1], "tool_calls": []}
        )
    return message.model_copy(update={"tool_calls": message.tool_calls[: index + 1]})


def _with_sentinel(cut: ChatMessage, marker: Marker) -> ChatMessage:
    """The cut message with a sentinel right after the element: a tool call after a call, else
    text after the content (a whole message's content end, or the part's)."""
    if marker.kind == "call":
        return cut.model_copy(update={"tool_calls": [*cut.tool_calls, SENTINEL_CALL]})
    return _insert_text(cut, len(_parts(cut)), _SENTINEL)


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix, by halving slices (C-speed compares on long text)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def tokens_within(ends: Sequence[int], char_end: int, *, ordered: bool | None = None) -> int:
    """How many leading tokens end at or before ``char_end`` (a straddling token is excluded).

    ``ordered``: whether ``ends`` never decrease (fast tokenizers' offsets do); computed when
    not given.
    """
    if ordered is None:
        ordered = list(ends) == sorted(ends)
    if ordered:
        return bisect_right(ends, char_end)
    for t, end in enumerate(ends):  # offsets out of order: the slow, still-exact scan
        if end > char_end:
            return t
    return len(ends)


@dataclass(frozen=True, slots=True)
class RetainDirective:
    """One ``kv.retain`` 1.0 directive: keep tokens ``[start, end)`` at ``priority`` for
    ``duration`` seconds."""

    start: int
    end: int
    priority: int
    duration: int

    def to_wire(self) -> dict[str, int]:
        return {
            "start": self.start,
            "end": self.end,
            "priority": self.priority,
            "duration": self.duration,
        }


def plan_retain_directives(
    prefixes: Iterable[tuple[int, int]], *, priority: int
) -> tuple[RetainDirective, ...]:
    """Retained prefixes ``(token_end, ttl_seconds)`` -> disjoint, ordered directives.

    A token is kept for the longest TTL of any prefix that contains it, i.e. of the breakpoints at
    or after it (a prefix cache can only serve a block whose predecessors survived). Durations
    thus never increase along the token axis, adjacent equal ones merge, and there is at most one
    directive per distinct TTL, far below :data:`MAX_DIRECTIVES`. One ``priority`` for all keeps
    priorities non-increasing.
    """
    if not 0 <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority must be within 0..{MAX_PRIORITY}, got {priority}")
    longest: dict[int, int] = {}
    for end, ttl in prefixes:
        if end <= 0 or ttl <= 0:
            raise ValueError(f"a retained prefix needs end > 0 and ttl > 0, got ({end}, {ttl})")
        longest[end] = max(ttl, longest.get(end, 0))
    directives: list[RetainDirective] = []
    keep = 0
    for end in sorted(longest, reverse=True):  # sweep from the end: the running max only grows
        keep = max(keep, longest[end])
        duration = min(keep, MAX_DURATION_SECONDS)
        if directives and directives[-1].duration == duration:
            continue  # the range from 0 already carries this duration
        if directives:  # the previous range now starts where this one ends
            last = directives[-1]
            directives[-1] = RetainDirective(end, last.end, priority, last.duration)
        directives.append(RetainDirective(0, end, priority, duration))
    directives.reverse()
    if len(directives) > MAX_DIRECTIVES:  # unreachable: one directive per distinct TTL
        raise ValueError(f"{len(directives)} directives exceed kv.retain's {MAX_DIRECTIVES}")
    return tuple(directives)

"""Breakpoint markers resolve to exact token offsets in a real template's rendering, never wider.

The tokenizer and the tool-aware template are real (``tests/support/retain_tokenizer.py``): each
case proves its offset token by token: the decoded tokens before it end with the element's
rendering, the tokens from it start with what follows, and a token straddling the boundary is
left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

from kvretention.dataplane.breakpoints import (
    MarkerMismatch,
    RetainDirective,
    common_prefix,
    find_markers,
    plan_retain_directives,
    resolve_breakpoints,
    tokens_within,
)
from kvretention.dataplane.protocol import (
    ChatMessage,
    ImagePart,
    Reasoning,
    TextPart,
    ToolCall,
    ToolDefinition,
)
from support import retain_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return retain_tokenizer.build_tokenizer()


READ = ToolDefinition(
    name="read",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)
BASH = ToolDefinition(name="bash", description="Run a command.")
TOOLS = [READ, BASH]


def conversation() -> list[ChatMessage]:
    """A Claude Code-shaped history: system blocks, a turn, a tool call, two results, a turn."""
    return [
        ChatMessage(
            role="system",
            content=[TextPart(text="You are terse."), TextPart(text="Be careful.")],
        ),
        ChatMessage(
            role="user", content=[TextPart(text="Fix the bug."), TextPart(text="Then test.")]
        ),
        ChatMessage(
            role="assistant",
            content="On it.",
            tool_calls=[
                ToolCall(id="c1", name="read", arguments='{"path": "a.py"}'),
                ToolCall(id="c2", name="bash", arguments='{"cmd": "ls"}'),
            ],
        ),
        ChatMessage(role="tool", content="print(1)", tool_call_id="c1"),
        ChatMessage(role="tool", content="a.py b.py", tool_call_id="c2"),
        ChatMessage(role="user", content=[TextPart(text="Go on, ok")]),
    ]


def mark(
    messages: list[ChatMessage], tools: list[ToolDefinition], where: tuple[Any, ...], ttl: int
) -> tuple[list[ChatMessage], list[ToolDefinition]]:
    """Set ``retain_ttl`` on the element at ``where`` (the frontend's job)."""
    if where[0] == "tools":
        tools = [*tools]
        tools[where[1]] = tools[where[1]].model_copy(update={"retain_ttl": ttl})
        return messages, tools
    messages = [*messages]
    i = where[1]
    message = messages[i]
    if len(where) == 2:
        messages[i] = message.model_copy(update={"retain_ttl": ttl})
    elif where[2] == "content":
        assert not isinstance(message.content, str)
        parts = [*message.content]
        parts[where[3]] = parts[where[3]].model_copy(update={"retain_ttl": ttl})
        messages[i] = message.model_copy(update={"content": parts})
    else:
        calls = [*message.tool_calls]
        calls[where[3]] = calls[where[3]].model_copy(update={"retain_ttl": ttl})
        messages[i] = message.model_copy(update={"tool_calls": calls})
    return messages, tools


@dataclass(frozen=True)
class Case:
    where: tuple[Any, ...]
    ends_with: str
    followed_by: str
    straddling: str = ""
    """The token left out because it crosses the element's end (empty: none crosses it)."""


# Every case: the decoded prefix ends with ``ends_with``; the rest starts with ``followed_by``.
CASES: dict[str, Case] = {
    "first_tool": Case(
        ("tools", 0),
        '"properties": {"path": {"type": "string"}}}}}\n',
        '{"type": "function", "function": {"name": "bash"',
    ),
    "last_tool_stops_at_the_tools_end": Case(("tools", 1), '"properties": {}}}}\n', "</tools>"),
    "first_system_block": Case(("messages", 0, "content", 0), "You are terse.\n", "Be careful."),
    "last_system_block_ends_before_the_tools": Case(
        ("messages", 0, "content", 1), "Be careful.\n", "\n# Tools"
    ),
    "middle_text_part_straddling_token_left_out": Case(
        ("messages", 1, "content", 0), "Fix the bug", ".\nThen test.", straddling=".\n"
    ),
    "whole_user_message": Case(
        ("messages", 1), "Then test.<|im_end|>\n", "<|im_start|>assistant\nOn it."
    ),
    "first_tool_call": Case(
        ("messages", 2, "tool_calls", 0),
        '{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>',
        "\n<tool_call>",
    ),
    "assistant_message": Case(
        ("messages", 2), '"arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>\n', "<|im_start|>user"
    ),
    # ``<tool_response>`` is not one token in this format (nor in Qwen 2.5's): the lone ``<`` the
    # closing ``<|im_end|>`` and the next result share stays in (the resolver's documented limit)
    "tool_result_followed_by_another": Case(
        ("messages", 3), "print(1)\n</tool_response>\n<", "tool_response>\na.py b.py"
    ),
    "last_tool_result_closes_the_turn": Case(
        ("messages", 4), "a.py b.py\n</tool_response>\n<|im_end|>\n", "<|im_start|>user\nGo on"
    ),
    "last_message_stops_before_the_generation_prompt": Case(
        ("messages", 5), "Go on, ok<|im_end|>\n", "<|im_start|>assistant\n"
    ),
    "last_part_of_the_last_message": Case(
        ("messages", 5, "content", 0), "Go on, ok", "<|im_end|>\n<|im_start|>assistant"
    ),
}


def _render(
    tokenizer: Any, messages: Sequence[ChatMessage], tools: Sequence[ToolDefinition]
) -> str:
    return retain_tokenizer.render(tokenizer, messages, tools, add_generation_prompt=False)


def _prompt(tokenizer: Any, messages: list[ChatMessage], tools: list[ToolDefinition]) -> Any:
    text = retain_tokenizer.render(tokenizer, messages, tools, add_generation_prompt=True)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return text, list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_offset_is_exact_token_by_token(tokenizer: Any, case: Case) -> None:
    messages, tools = mark(conversation(), TOOLS, case.where, 3600)
    text, ids, offsets = _prompt(tokenizer, messages, tools)
    resolution = resolve_breakpoints(
        messages,
        tools,
        render=partial(_render, tokenizer),
        prompt=text,
        offsets=offsets,
        expected=1,
    )
    assert resolution.dropped == ()
    (bp,) = resolution.resolved
    assert bp.ttl_seconds == 3600
    before = tokenizer.decode(ids[: bp.token_end])
    after = tokenizer.decode(ids[bp.token_end :])
    assert before + after == text
    assert before.endswith(case.ends_with), before[-80:]
    assert after.startswith(case.followed_by), after[:80]
    # never wider than the element's rendering: no token past the character offset is kept
    assert offsets[bp.token_end - 1][1] <= bp.char_end < offsets[bp.token_end][1]
    if case.straddling:
        start, end = offsets[bp.token_end]
        assert text[start:end] == case.straddling
        assert start < len(before) + 1 < end  # it holds the element's last character


def test_every_marker_of_a_claude_code_shaped_request_resolves_in_order(tokenizer: Any) -> None:
    messages, tools = conversation(), TOOLS
    for where, ttl in [
        (("tools", 1), 3600),
        (("messages", 0, "content", 1), 3600),
        (("messages", 4), 300),
        (("messages", 5, "content", 0), 300),
    ]:
        messages, tools = mark(messages, tools, where, ttl)
    text, _, offsets = _prompt(tokenizer, messages, tools)
    resolution = resolve_breakpoints(
        messages, tools, render=partial(_render, tokenizer), prompt=text, offsets=offsets
    )
    assert [r.element for r in resolution.resolved] == [
        "tools[1]",
        "messages[0].content[1]",
        "messages[4]",
        "messages[5].content[0]",
    ]
    # the system text renders before the tools in this template: the tool's prefix is the longer
    ends = {r.element: r.token_end for r in resolution.resolved}
    assert ends["messages[0].content[1]"] < ends["tools[1]"] < ends["messages[4]"]
    assert ends["messages[4]"] < ends["messages[5].content[0]"] < len(offsets)
    assert resolution.to_trace()["breakpoints"][0] == {
        "element": "tools[1]",
        "ttl_seconds": 3600,
        "token_end": ends["tools[1]"],
    }


def test_a_tool_the_template_does_not_show_is_dropped_not_widened(tokenizer: Any) -> None:
    messages, tools = mark(conversation(), TOOLS, ("tools", 1), 300)
    text, _, offsets = _prompt(tokenizer, messages, [])

    def hides_tools(ms: Sequence[ChatMessage], ts: Sequence[ToolDefinition]) -> str:
        return _render(tokenizer, ms, [])  # tool_choice "none": no tool is offered

    resolution = resolve_breakpoints(
        messages, tools, render=hides_tools, prompt=text, offsets=offsets
    )
    assert resolution.resolved == ()
    (dropped,) = resolution.dropped
    assert (dropped.element, dropped.ttl_seconds) == ("tools[1]", 300)
    assert "renders nothing for an element placed after it" in dropped.reason
    assert resolution.to_trace()["dropped"][0]["element"] == "tools[1]"


def test_the_last_tool_is_dropped_when_no_tool_can_follow_it(tokenizer: Any) -> None:
    """A named tool choice shows one tool: without a sentinel its end cannot be told apart."""
    messages, tools = mark(conversation(), [BASH], ("tools", 0), 300)
    text, _, offsets = _prompt(tokenizer, messages, tools)

    def only_bash(ms: Sequence[ChatMessage], ts: Sequence[ToolDefinition]) -> str:
        return _render(tokenizer, ms, [t for t in ts if t.name == "bash"])

    resolution = resolve_breakpoints(
        messages, tools, render=only_bash, prompt=text, offsets=offsets
    )
    assert resolution.resolved == ()
    assert "renders nothing for an element placed after it" in resolution.dropped[0].reason


def test_a_cut_the_template_refuses_drops_only_that_marker(tokenizer: Any) -> None:
    messages, tools = mark(conversation(), TOOLS, ("messages", 2), 300)
    messages, tools = mark(messages, tools, ("messages", 5), 60)
    text, _, offsets = _prompt(tokenizer, messages, tools)

    def must_end_with_a_user_turn(ms: Sequence[ChatMessage], ts: Sequence[ToolDefinition]) -> str:
        if ms[-1].role == "assistant":
            raise ValueError("conversation must end with a user turn")
        return _render(tokenizer, ms, ts)

    resolution = resolve_breakpoints(
        messages, tools, render=must_end_with_a_user_turn, prompt=text, offsets=offsets
    )
    assert [r.element for r in resolution.resolved] == ["messages[5]"]
    (dropped,) = resolution.dropped
    assert dropped.element == "messages[2]"
    assert "must end with a user turn" in dropped.reason


REASONING_CASES: dict[str, Case] = {
    # the text joiner and the closing markup share a newline: it is the element's own markup
    "tool_result": Case(("messages", 4), "a.py b.py\n", "</tool_response>\n<|im_end|>"),
    "tool_result_followed_by_another": Case(
        ("messages", 3), "print(1)\n", "</tool_response>\n<tool_response>"
    ),
    "assistant_message_content": Case(("messages", 2), "On it.\n", "<tool_call>"),
    "tool_call_falls_back_to_the_shared_prefix": Case(
        ("messages", 2, "tool_calls", 0), "Then test.<|im_end|>\n<|im_start|>assistant\n", "On it."
    ),
}


@pytest.mark.parametrize("case", REASONING_CASES.values(), ids=REASONING_CASES.keys())
def test_a_template_that_renders_the_cut_differently_never_widens(
    tokenizer: Any, case: Case
) -> None:
    """Qwen3-style templates replay reasoning only after the last user turn: cut before the final
    user message, the assistant turn renders with its reasoning, unlike in the prompt. A message
    or part then resolves to the end of its content in the whole conversation (its closing markup
    left out); a tool call to where the cut and the prompt still agree. Never past the element."""
    messages = conversation()
    messages[2] = messages[2].model_copy(update={"reasoning": Reasoning(text="Check a.py first.")})
    messages, tools = mark(messages, TOOLS, case.where, 300)
    text, ids, offsets = _prompt(tokenizer, messages, tools)
    assert (
        "Check a.py first." not in text
    )  # dropped from the prompt: it precedes the last user turn
    resolution = resolve_breakpoints(
        messages, tools, render=partial(_render, tokenizer), prompt=text, offsets=offsets
    )
    (bp,) = resolution.resolved
    before = tokenizer.decode(ids[: bp.token_end])
    after = tokenizer.decode(ids[bp.token_end :])
    assert before.endswith(case.ends_with), before[-60:]
    assert after.startswith(case.followed_by), after[:60]


@pytest.mark.parametrize(
    ("where", "renders"),
    [
        (("messages", 5), 1),  # the newest message: the conversation's rendering, no probe
        (("messages", 4), 2),  # any earlier message: the cut and its probe
        (("messages", 5, "content", 0), 2),  # a part ends before its closing markup: probed
    ],
    ids=["newest_message", "earlier_message", "newest_part"],
)
def test_only_the_newest_message_resolves_without_a_probe(
    tokenizer: Any, where: tuple[Any, ...], renders: int
) -> None:
    """The probe is a second render of the whole conversation on an agent turn (the newest
    message carries Claude Code's moving breakpoint): the newest message ends where the
    conversation's rendering ends, so it is not rendered again."""
    messages, tools = mark(conversation(), TOOLS, where, 300)
    text, _, offsets = _prompt(tokenizer, messages, tools)
    seen: list[int] = []

    def counting(ms: Sequence[ChatMessage], ts: Sequence[ToolDefinition]) -> str:
        seen.append(len(ms))
        return _render(tokenizer, ms, ts)

    resolution = resolve_breakpoints(
        messages, tools, render=counting, prompt=text, offsets=offsets, expected=1
    )
    (bp,) = resolution.resolved
    assert len(seen) == renders, seen
    if renders == 1:  # the same end the probe found (test_offset_is_exact_token_by_token)
        assert bp.char_end == len(_render(tokenizer, messages, tools))


def test_an_image_part_resolves_after_its_placeholder(tokenizer: Any) -> None:
    messages = [
        ChatMessage(
            role="user",
            content=[
                ImagePart(url="data:image/png;base64,AA==", retain_ttl=300),
                TextPart(text="What is it?"),
            ],
        )
    ]
    text, ids, offsets = _prompt(tokenizer, messages, [])
    resolution = resolve_breakpoints(
        messages, [], render=partial(_render, tokenizer), prompt=text, offsets=offsets
    )
    (bp,) = resolution.resolved
    assert tokenizer.decode(ids[: bp.token_end]).endswith(
        "<|vision_start|><|image_pad|><|vision_end|>"
    )
    assert tokenizer.decode(ids[bp.token_end :]).startswith("What is it?")


def test_announced_count_must_match_the_markers(tokenizer: Any) -> None:
    messages, tools = mark(conversation(), TOOLS, ("messages", 1), 300)
    with pytest.raises(MarkerMismatch, match="announces 2"):
        resolve_breakpoints(
            messages, tools, render=partial(_render, tokenizer), prompt="", offsets=[], expected=2
        )


def test_find_markers_in_prompt_order_of_kinds() -> None:
    messages, tools = conversation(), TOOLS
    for where in [("messages", 2), ("messages", 2, "tool_calls", 1), ("tools", 0)]:
        messages, tools = mark(messages, tools, where, 60)
    messages, tools = mark(messages, tools, ("messages", 1, "content", 1), 60)
    assert [m.element for m in find_markers(messages, tools)] == [
        "tools[0]",
        "messages[1].content[1]",
        "messages[2].tool_calls[1]",
        "messages[2]",
    ]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("", "", 0),
        ("abc", "abc", 3),
        ("abc", "abd", 2),
        ("abc", "ab", 2),
        ("x" * 999 + "a", "x" * 999 + "b", 999),
        ("a", "b", 0),
    ],
)
def test_common_prefix(a: str, b: str, expected: int) -> None:
    assert common_prefix(a, b) == expected


@pytest.mark.parametrize(
    ("ends", "char_end", "expected"),
    [
        ([2, 4, 6], 4, 2),  # a token ending exactly at the offset is kept
        ([2, 5, 6], 4, 1),  # the token spanning 2..5 straddles 4: left out
        ([2, 4, 6], 0, 0),
        ([2, 4, 6], 9, 3),
        ([2, 5, 3, 6], 4, 1),  # out of order: the exact scan stops at the first long token
    ],
)
def test_tokens_within(ends: list[int], char_end: int, expected: int) -> None:
    assert tokens_within(ends, char_end) == expected


D = RetainDirective

PLAN_ROWS: dict[str, tuple[list[tuple[int, int]], list[RetainDirective]]] = {
    "one_prefix": ([(100, 300)], [D(0, 100, 50, 300)]),
    "longer_ttl_first": ([(40, 3600), (100, 300)], [D(0, 40, 50, 3600), D(40, 100, 50, 300)]),
    "shorter_ttl_first_is_covered_by_the_longer": ([(40, 300), (100, 3600)], [D(0, 100, 50, 3600)]),
    "same_offset_keeps_the_longest": ([(40, 300), (40, 3600)], [D(0, 40, 50, 3600)]),
    "three_tiers_merge_equal_neighbours": (
        [(20, 3600), (60, 300), (100, 1800), (140, 1800)],
        [D(0, 20, 50, 3600), D(20, 140, 50, 1800)],
    ),
    "order_of_input_does_not_matter": (
        [(100, 300), (40, 3600)],
        [D(0, 40, 50, 3600), D(40, 100, 50, 300)],
    ),
    "duration_capped_at_30_days": ([(10, 9_999_999)], [D(0, 10, 50, 2_592_000)]),
}


@pytest.mark.parametrize(("prefixes", "expected"), PLAN_ROWS.values(), ids=PLAN_ROWS.keys())
def test_plan_retain_directives(
    prefixes: list[tuple[int, int]], expected: list[RetainDirective]
) -> None:
    assert list(plan_retain_directives(prefixes, priority=50)) == expected


@pytest.mark.parametrize(
    ("prefixes", "priority"), [([(0, 300)], 50), ([(10, 0)], 50), ([(10, 300)], 101)]
)
def test_plan_refuses_empty_ranges_and_bad_priority(
    prefixes: list[tuple[int, int]], priority: int
) -> None:
    with pytest.raises(ValueError):
        plan_retain_directives(prefixes, priority=priority)

"""Reusing the previous turn's tokens gives exactly a full render's tokens, or does not reuse.

Every turn of every case is prepared twice with real chat templates and fast tokenizers (a
byte-per-token one and one whose BPE merges cross block ends): once through the worker's render
cache, once rendered and tokenized whole. Token ids, token ends and resolved breakpoints must be
equal; the case says how much may be reused (an edit moves the cut before it, another
conversation or changed tools reuse nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kvretention.dataplane.breakpoints import find_markers
from kvretention.dataplane.frontend.affinity import prefix_chain
from kvretention.dataplane.protocol import (
    ChatMessage,
    ImagePart,
    PreprocessedRequest,
    Reasoning,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolDefinition,
)
from kvretention.dataplane.worker.call import (
    EnginePrompt,
    build_engine_prompt,
    resolve_prompt_breakpoints,
)
from kvretention.dataplane.worker.render_cache import RenderCache, cut_tokens
from support import chat_tokenizer, retain_tokenizer

TOKENIZERS: dict[str, Callable[[], Any]] = {
    "byte-level": chat_tokenizer.build_tokenizer,
    "bpe-merges": retain_tokenizer.build_tokenizer,
}
TOOLS = [
    ToolDefinition(
        name="Bash",
        description="Runs a command.",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    )
]

AUTO = ToolChoice()


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return TOKENIZERS[request.param]()


def conversation(
    turns: int, *, edit: int | None = None, image: bool = False, text: str = ""
) -> list[ChatMessage]:
    """A Claude Code-like conversation: a marked system prompt, a task, then ``turns`` tool
    rounds with replayed reasoning; the newest block is marked too. ``edit`` changes that round's
    tool result; ``image`` puts a screenshot in the task; ``text`` ends every tool result."""
    task: list[TextPart | ImagePart] = [TextPart(text="Fix the failing test.")]
    if image:
        task.append(ImagePart(url="data:image/png;base64,iVBORw0KGgo="))
    messages = [
        ChatMessage(
            role="system",
            content=[
                TextPart(text="You are a coding agent."),
                TextPart(text="Keep diffs small.", retain_ttl=3600),
            ],
        ),
        ChatMessage(role="user", content=task),
    ]
    for t in range(turns):
        messages.append(
            ChatMessage(
                role="assistant",
                content=f"Step {t}: run the tests.",
                reasoning=Reasoning(text=f"I should run step {t}."),
                tool_calls=[ToolCall(id=f"c{t}", name="Bash", arguments='{"command": "pytest"}')],
            )
        )
        result = f"FAILED test_{t}.\n" * 3 + ("(edited)" if t == edit else "") + text
        messages.append(ChatMessage(role="tool", tool_call_id=f"c{t}", content=result))
    last = messages[-1]
    messages[-1] = last.model_copy(update={"retain_ttl": 300})
    return messages


@dataclass(frozen=True)
class Turn:
    messages: list[ChatMessage]
    session: str | None = "s1"
    tools: tuple[ToolDefinition, ...] = tuple(TOOLS)
    tool_choice: ToolChoice = AUTO
    chain: bool = False
    """Send the frontend's prefix-hash chain (``x-kvr-prefix``) too."""
    extends: int = -1
    """The earlier turn (index into the case's turns before this one) this turn continues."""


def with_user(messages: list[ChatMessage]) -> list[ChatMessage]:
    return [*messages, ChatMessage(role="user", content="Now also update the docs.")]


EXTRA_TOOL = ToolDefinition(name="Read", description="Reads a file.")
# (case, turns, what the last turn may reuse: "all" of the previous prompt but its generation
#  prompt, "some" (a cut before the change), or "none")
CASES: list[tuple[str, list[Turn], str]] = [
    ("extend", [Turn(conversation(2)), Turn(conversation(3))], "all"),
    ("extend twice", [Turn(conversation(1)), Turn(conversation(2)), Turn(conversation(3))], "all"),
    ("edit an earlier message", [Turn(conversation(3)), Turn(conversation(4, edit=1))], "some"),
    ("a new user turn drops replayed reasoning", [Turn(conversation(3)), Turn(with_user(conversation(3)))], "some"),
    ("different session", [Turn(conversation(2)), Turn(conversation(3), session="s2")], "none"),
    ("tools changed", [Turn(conversation(2)), Turn(conversation(3), tools=(*TOOLS, EXTRA_TOOL))], "none"),
    ("tool choice hides the tools", [Turn(conversation(2)), Turn(conversation(3), tool_choice=ToolChoice(mode="none"))], "none"),
    ("non-ASCII text", [Turn(conversation(2, text="é 漢字 🙂")), Turn(conversation(3, text="é 漢字 🙂"))], "all"),
    ("images", [Turn(conversation(2, image=True)), Turn(conversation(3, image=True))], "all"),
    ("no session: found by the prefix chain", [Turn(conversation(2), session=None, chain=True), Turn(conversation(3), session=None, chain=True)], "all"),
    ("no session and no chain", [Turn(conversation(2), session=None), Turn(conversation(3), session=None)], "none"),
    (
        "a side call under the same session",
        [Turn(conversation(2), chain=True), Turn([ChatMessage(role="user", content="Title?")], chain=True), Turn(conversation(3), chain=True, extends=0)],
        "all",
    ),
]  # fmt: skip


def request_for(turn: Turn) -> PreprocessedRequest:
    return PreprocessedRequest(
        request_id="r",
        model="m",
        messages=turn.messages,
        tools=list(turn.tools),
        tool_choice=turn.tool_choice,
        session_id=turn.session,
    )


def ends_of(prompt: EnginePrompt) -> list[int]:
    if prompt.token_ends is not None:
        return list(prompt.token_ends)
    assert prompt.offsets is not None
    return [end for _, end in prompt.offsets]


def token_ids(prompt: EnginePrompt, tokenizer: Any) -> list[int]:
    if prompt.input_ids is not None:
        return prompt.input_ids
    assert prompt.text is not None  # images: the engine gets text; the count must still agree
    return list(tokenizer(prompt.text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize(("turns", "reuse"), [pytest.param(t, r, id=c) for c, t, r in CASES])
def test_reused_tokens_equal_a_full_render(tokenizer: Any, turns: list[Turn], reuse: str) -> None:
    cache = RenderCache(tokenizer, verify_every=0)  # the test compares every turn itself
    prompts: list[EnginePrompt] = []
    for turn in turns:
        request = request_for(turn)
        chain = prefix_chain(turn.messages, list(turn.tools)) if turn.chain else ()
        got = build_engine_prompt(request, tokenizer=tokenizer, cache=cache, chain=chain)
        whole = build_engine_prompt(request, tokenizer=tokenizer, with_offsets=True)
        assert got.rendered == whole.rendered
        assert token_ids(got, tokenizer) == token_ids(whole, tokenizer)
        # ... which are also the ids of the path without offsets (requests without breakpoints)
        assert token_ids(whole, tokenizer) == tokenizer.encode(
            whole.rendered, add_special_tokens=False
        )
        assert got.prompt_tokens == whole.prompt_tokens
        if whole.input_ids is not None:  # breakpoints resolve to the same offsets
            assert ends_of(got) == ends_of(whole)
            markers = len(find_markers(turn.messages, list(turn.tools)))
            resolved = [
                resolve_prompt_breakpoints(request, p, tokenizer=tokenizer, expected=markers)
                for p in (got, whole)
            ]
            assert resolved[0] == resolved[1]
            assert len(resolved[0].resolved) == markers
        if turn is turns[-1]:
            previous = prompts[turn.extends]
            before_generation = previous.rendered.rindex("<|im_start|>assistant")
            reusable = len(tokenizer(previous.rendered[:before_generation])["input_ids"])
            if reuse == "all":
                assert got.reused_tokens == reusable
            elif reuse == "some":
                assert 0 < got.reused_tokens < reusable
            else:
                assert got.reused_tokens == 0
        prompts.append(got)
    assert cache.enabled


def test_a_tokenizer_that_splits_differently_at_a_cut_stops_reusing(tokenizer: Any) -> None:
    """The self-check and the sampled verification: a cut that does not hold disables reuse and
    serves the full encode."""

    class Shifted:
        """Encodes like ``tokenizer`` but the first token of any text differs: text encoded
        apart at a cut is then not the whole text's encoding."""

        def __init__(self, inner: Any) -> None:
            self._tokenizer = inner._tokenizer
            self.inner = inner

        def __call__(self, text: str, **kwargs: Any) -> Any:
            encoded = dict(self.inner(text, **kwargs))
            ids = list(encoded["input_ids"])
            encoded["input_ids"] = [ids[0] + 1, *ids[1:]] if ids else ids
            return encoded

    cache = RenderCache(Shifted(tokenizer), verify_every=1)
    text = build_engine_prompt(
        request_for(Turn(conversation(2))), tokenizer=tokenizer, with_offsets=True
    ).rendered
    cache.encode(text, session="s")
    assert not cache.enabled and len(cache) == 0


def test_memory_is_bounded_least_recently_used_first(tokenizer: Any) -> None:
    text = build_engine_prompt(
        request_for(Turn(conversation(3))), tokenizer=tokenizer, with_offsets=True
    ).rendered
    one = RenderCache(tokenizer)
    one.encode(text, session="probe")
    cap = one.nbytes * 2 + one.nbytes // 2  # room for two conversations, not three
    cache = RenderCache(tokenizer, max_bytes=cap)
    for session in ("a", "b", "a", "c"):  # "a" used again before "c" arrives: "b" goes
        cache.encode(text, session=session)
    assert len(cache) == 2 and cache.nbytes <= cap
    assert cache.encode(text, session="a").reused > 0
    assert cache.encode(text, session="b").reused == 0


def test_cut_tokens_are_the_special_tokens_that_split_cleanly() -> None:
    from tokenizers import AddedToken

    tokenizer = chat_tokenizer.build_tokenizer()
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [AddedToken("<|strip|>", lstrip=True, special=True)]}
    )
    cuts = set(cut_tokens(tokenizer).values())
    assert {"<|im_start|>", "<|im_end|>"} <= cuts
    assert "<tool_call>" not in cuts  # added but not special: the model writes it
    assert "<|strip|>" not in cuts  # eats the whitespace before it
    assert cut_tokens(object()) == {}  # no fast tokenizer: nothing is ever reused


def test_the_previous_ids_are_extended_in_place_only_when_nothing_else_holds_them(
    tokenizer: Any,
) -> None:
    """An entry's ids list is reused for the next prompt only when the entry is the list's one
    holder: a prompt still in flight (its ids held) is never changed under it."""
    from kvretention.dataplane.chat_template import render_prompt

    texts = [render_prompt(tokenizer, conversation(n), tools=TOOLS)[0] for n in (1, 2, 3)]

    def whole(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    cache = RenderCache(tokenizer, verify_every=0)
    held = cache.encode(texts[0], session="s")
    before = list(held.ids)
    second = cache.encode(texts[1], session="s")  # the first prompt's ids are still held
    assert held.ids == before
    assert second.reused > 0 and second.ids == whole(texts[1])
    reusable = id(second.ids)
    del second  # served: only the cache holds its ids now
    third = cache.encode(texts[2], session="s")
    assert id(third.ids) == reusable  # extended in place
    assert third.reused > 0 and third.ids == whole(texts[2])
    assert list(third.ends) == [
        e
        for _, e in tokenizer(texts[2], return_offsets_mapping=True, add_special_tokens=False)[
            "offset_mapping"
        ]
    ]
    assert held.ids == before
    assert len(cache) == 1 and cache.nbytes == next(iter(cache._entries.values())).nbytes

"""Pure translation between the router's protocol and ``Engine.async_generate``.

``build_engine_prompt`` renders and tokenizes the conversation once (or takes the frontend's token
ids), tokenizing only what is new since the conversation's previous prompt when given a
:class:`~kvretention.dataplane.worker.render_cache.RenderCache`; ``resolve_prompt_breakpoints`` finds where each breakpoint's block ends in those tokens;
``build_generate_kwargs`` decides exactly what the engine is called with (an unhinted request
gets no ``kv_hints`` key at all); ``StreamAdapter`` turns SGLang's stream outputs into parsed
:class:`GenerateChunk` deltas.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Final, Literal

from kvretention.dataplane.breakpoints import (
    DroppedBreakpoint,
    MarkerMismatch,
    Resolution,
    find_markers,
    resolve_breakpoints,
)
from kvretention.dataplane.chat_template import (
    OffsetsUnavailable,
    Rendering,
    breakpoint_renderer,
    encode_prompt,
    has_chat_template,
    render_and_encode,
    render_template_traced,
    template_options,
)
from kvretention.dataplane.protocol import (
    ChatMessage,
    ContextOverflow,
    FinishReason,
    GenerateChunk,
    PreprocessedRequest,
    Usage,
)
from kvretention.dataplane.template_input import (
    ConvertedMessages,
    build_template_input,
    template_has_developer_role,
)
from kvretention.dataplane.worker.output_parser import OutputParser, ParsedDelta
from kvretention.dataplane.worker.render_cache import RenderCache
from kvretention.dataplane.worker.wire import ConversationMemo


@dataclass(frozen=True)
class Bootstrap:
    """Where a prefill/decode pair meets to move KV: the prefill worker's bootstrap server."""

    host: str
    port: int
    room: int


def render_chat_fallback(messages: Sequence[ChatMessage]) -> str:
    """The prompt for an engine without a chat template: one ``<|role|>`` block per message.

    Only used when the engine has no tokenizer with a chat template (the stand-in without
    ``--model-path``); a real SGLang engine renders with its model's template.
    """
    blocks = [f"<|{m.role}|>\n{m.text()}\n" for m in messages]
    return "".join(blocks) + "<|assistant|>\n"


@dataclass(frozen=True)
class EnginePrompt:
    """The prompt as the engine gets it: token ids, or text when the engine must tokenize."""

    input_ids: list[int] | None
    text: str | None
    """Sent as ``prompt``: with images (SGLang's multimodal processor expands the image
    placeholders from the text, as its OpenAI server sends text for them) or without a template."""
    image_urls: list[str]
    rendered: str
    """The rendered prompt text ("" when the frontend sent token ids)."""
    prompt_tokens: int
    offsets: list[tuple[int, int]] | None = None
    """Each token's character span in ``rendered`` (asked for when there are breakpoints)."""
    no_offsets: str = "the prompt was not rendered with token offsets"
    """Why ``offsets`` is ``None``: every breakpoint is then dropped with this reason."""
    token_ends: Sequence[int] | None = None
    """Each token's end in ``rendered``, in place of ``offsets`` when tokens were reused."""
    ends_ordered: bool | None = None
    reused_tokens: int = 0
    """Leading tokens taken from the conversation's previous prompt instead of tokenized again."""
    converted: ConvertedMessages | None = None
    """The messages as the template got them, for the breakpoints' cut renders to reuse."""
    rendering: Rendering | None = None
    """The prompt as minijinja rendered it, for the breakpoints' cut renders to derive from."""

    @property
    def has_offsets(self) -> bool:
        return self.offsets is not None or self.token_ends is not None


def build_engine_prompt(
    request: PreprocessedRequest,
    *,
    tokenizer: Any,
    with_offsets: bool = False,
    cache: RenderCache | None = None,
    chain: Sequence[str] = (),
    memo: ConversationMemo | None = None,
) -> EnginePrompt:
    """Render and tokenize once, or take the frontend's token ids (pure but for the tokenizer and
    the cache). With ``cache``, the conversation's previous prompt (found by session id, else by
    the prefix-hash ``chain``) lends the tokens the new prompt shares with it, and ``memo`` (what
    :func:`~kvretention.dataplane.worker.wire.decode_request` filled) its converted messages; the
    memo is kept with the prompt for the next turn."""
    prefix = continued_text(request)
    if prefix is not None:
        head = request.model_copy(
            update={"messages": (request.messages or [])[:-1], "continue_final_message": False}
        )
        prompt = build_engine_prompt(
            head,
            tokenizer=tokenizer,
            with_offsets=with_offsets,
            cache=cache,
            chain=chain,
            memo=memo,
        )
        return _continued(prompt, prefix, tokenizer=tokenizer)
    messages = request.messages or []
    if request.token_ids is not None:
        images = [part.url for m in messages for part in m.images()]
        return EnginePrompt(
            input_ids=list(request.token_ids),
            text=None,
            image_urls=images,
            rendered="",
            prompt_tokens=len(request.token_ids),
            no_offsets="the prompt arrived as token ids, not as a conversation to render",
        )
    if has_chat_template(tokenizer):
        if cache is not None and cache.enabled:
            return _reused_prompt(request, tokenizer=tokenizer, cache=cache, chain=chain, memo=memo)
        return _templated_prompt(request, tokenizer=tokenizer, with_offsets=with_offsets)
    text = render_chat_fallback(messages)
    count = len(tokenizer.encode(text)) if hasattr(tokenizer, "encode") else len(text.split())
    return EnginePrompt(
        input_ids=None,
        text=text,
        image_urls=[part.url for m in messages for part in m.images()],
        rendered=text,
        prompt_tokens=count,
        no_offsets="the engine has no chat template to find the blocks' ends in",
    )


def continued_text(request: PreprocessedRequest) -> str | None:
    """The assistant text the answer continues (``continue_final_message``), or ``None`` when the
    request does not continue one: the last message must be the assistant's, without tool calls
    or images. Its replayed reasoning is not shown, as SGLang's server continues only the text."""
    messages = request.messages or []
    if not request.continue_final_message or not messages or request.token_ids is not None:
        return None
    last = messages[-1]
    if last.role != "assistant" or last.tool_calls or last.images():
        return None
    return last.text()


def _continued(prompt: EnginePrompt, prefix: str, *, tokenizer: Any) -> EnginePrompt:
    """The prompt of the conversation before the assistant's text, with that text after its
    generation prompt: tokenized on its own and appended, as SGLang's server does, so the
    model's answer continues it. The token offsets still cover the conversation before it."""
    if prompt.input_ids is None:
        text = (prompt.text or "") + prefix
        return replace(prompt, text=text, rendered=prompt.rendered + prefix)
    ids = encode_prompt(tokenizer, prefix) if hasattr(tokenizer, "encode") else []
    return replace(
        prompt,
        input_ids=[*prompt.input_ids, *ids],
        rendered=prompt.rendered + prefix,
        prompt_tokens=prompt.prompt_tokens + len(ids),
    )


def _templated_prompt(
    request: PreprocessedRequest, *, tokenizer: Any, with_offsets: bool
) -> EnginePrompt:
    messages = request.messages or []
    no_offsets = EnginePrompt.no_offsets
    render = partial(
        render_and_encode,
        tokenizer,
        messages,
        **template_options(request),
    )
    try:
        rendered = render(with_offsets=with_offsets)
    except OffsetsUnavailable as exc:
        rendered, no_offsets = render(), str(exc)
    with_images = bool(rendered.image_urls)
    if with_images:
        # SGLang's multimodal processor expands each image into a count of tokens only it knows
        no_offsets = "the prompt has images, whose token counts only the engine knows"
    return EnginePrompt(
        input_ids=None if with_images else rendered.token_ids,
        text=rendered.text if with_images else None,
        image_urls=rendered.image_urls,
        rendered=rendered.text,
        prompt_tokens=len(rendered.token_ids),
        offsets=None if with_images else rendered.offsets,
        no_offsets=no_offsets,
    )


def _reused_prompt(
    request: PreprocessedRequest,
    *,
    tokenizer: Any,
    cache: RenderCache,
    chain: Sequence[str],
    memo: ConversationMemo | None,
) -> EnginePrompt:
    """Render the whole conversation (the text is what proves the reuse exact), then tokenize
    only what follows the longest prefix it shares with the conversation's previous prompt."""
    converted = memo.converted if memo is not None else ConvertedMessages()
    template_input = build_template_input(
        request.messages or [],
        developer_role=template_has_developer_role(getattr(tokenizer, "chat_template", None)),
        converted=converted,
        **template_options(request),
    )
    text, compiled = render_template_traced(tokenizer, template_input)
    images = template_input.image_urls
    encoded = cache.encode(text, session=request.session_id, chain=chain, memo=memo)
    return EnginePrompt(
        input_ids=None if images else encoded.ids,
        text=text if images else None,
        image_urls=images,
        rendered=text,
        prompt_tokens=len(encoded.ids),
        no_offsets=(
            "the prompt has images, whose token counts only the engine knows"
            if images
            else EnginePrompt.no_offsets
        ),
        token_ends=None if images else encoded.ends,
        ends_ordered=encoded.ordered,
        reused_tokens=encoded.reused,
        converted=converted,
        rendering=None if compiled is None else Rendering(text, template_input, compiled),
    )


def resolve_prompt_breakpoints(
    request: PreprocessedRequest, prompt: EnginePrompt, *, tokenizer: Any, expected: int
) -> Resolution:
    """Each breakpoint's token offset in ``prompt``; dropped (with why) when the prompt has no
    offsets. Raises :class:`MarkerMismatch` when the conversation carries a different count."""
    messages = request.messages or []
    held: list[DroppedBreakpoint] = []
    if continued_text(request) is not None:
        # the answer continues the last message, which is not in the prompt as a message
        last = len(messages) - 1
        held = [
            DroppedBreakpoint(m.element, m.ttl_seconds, "the answer continues this message")
            for m in find_markers(messages, ())
            if m.kind != "tool" and m.index == last
        ]
        messages, expected = messages[:-1], expected - len(held)
    if not prompt.has_offsets:
        markers = find_markers(messages, request.tools)
        if len(markers) != expected:
            raise MarkerMismatch(
                f"kv_hints announces {expected} prefix breakpoint(s) but the conversation "
                f"carries {len(markers)}"
            )
        dropped = (DroppedBreakpoint(m.element, m.ttl_seconds, prompt.no_offsets) for m in markers)
        return Resolution(resolved=(), dropped=(*dropped, *held))
    render = breakpoint_renderer(
        tokenizer,
        tool_choice=request.tool_choice,
        reasoning=request.reasoning,
        template_kwargs=request.template_kwargs,
        converted=prompt.converted,
        prompt=prompt.rendering,
    )
    resolution = resolve_breakpoints(
        messages,
        request.tools,
        render=render,
        prompt=prompt.rendered,
        offsets=prompt.offsets or (),
        ends=prompt.token_ends,
        ordered=prompt.ends_ordered if prompt.token_ends is not None else None,
        expected=expected,
    )
    return replace(resolution, dropped=(*resolution.dropped, *held)) if held else resolution


def build_generate_kwargs(
    request: PreprocessedRequest,
    *,
    prompt: EnginePrompt,
    sampling_params: dict[str, Any] | None = None,
    kv_hints: dict[str, Any] | None,
    bootstrap: Bootstrap | None,
    require_reasoning: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for ``Engine.async_generate``; ``kv_hints`` only when there is a hint,
    ``require_reasoning`` only in thinking mode (as SGLang's OpenAI server passes it)."""
    kwargs: dict[str, Any] = {
        "sampling_params": (
            request.sampling.to_sglang() if sampling_params is None else sampling_params
        ),
        "stream": True,
        "rid": request.request_id,
    }
    if prompt.input_ids is not None:
        # Not copied (200k ids on an agent prompt): the engine only reads it.
        kwargs["input_ids"] = prompt.input_ids
    else:
        kwargs["prompt"] = prompt.text
    if prompt.image_urls:
        kwargs["image_data"] = list(prompt.image_urls)
    if require_reasoning:
        kwargs["require_reasoning"] = True
    if bootstrap is not None:
        kwargs["bootstrap_host"] = bootstrap.host
        kwargs["bootstrap_port"] = bootstrap.port
        kwargs["bootstrap_room"] = bootstrap.room
    if kv_hints is not None:
        kwargs["kv_hints"] = kv_hints
    return kwargs


def fit_max_new_tokens(
    sampling: dict[str, Any], *, prompt_tokens: int, context_length: int | None
) -> dict[str, Any]:
    """``max_new_tokens`` cut to the room the context leaves after the prompt.

    The engine stops there anyway; SGLang instead refuses a request whose prompt and
    ``max_new_tokens`` together pass its context length, and agents ask for their model's whole
    output budget (Claude Code: 128,000 tokens) whatever the fleet's context. A prompt that alone
    fills the context is left for SGLang to refuse ("longer than the model's context length")."""
    wanted = sampling.get("max_new_tokens")
    if context_length is None or not isinstance(wanted, int):
        return sampling
    room = context_length - prompt_tokens
    if room <= 0 or wanted <= room:
        return sampling
    return {**sampling, "max_new_tokens": room}


_SGLANG_OVERFLOW: Final = re.compile(
    r"The input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)"
)
"""SGLang 0.5.23's refusal of a prompt the context cannot hold (``TokenizerManager``)."""


def engine_overflow(message: str) -> ContextOverflow | None:
    """The counts in SGLang's own refusal of a too-long prompt (one the worker could not count
    itself: images), for the providers' context-length errors; None for any other refusal."""
    found = _SGLANG_OVERFLOW.search(message)
    if found is None:
        return None
    return ContextOverflow(prompt_tokens=int(found[1]), context_length=int(found[2]))


EngineFinish = Literal["stop", "length", "abort"]


def finish_reason_of(meta_info: dict[str, Any]) -> EngineFinish | None:
    """SGLang's ``{"type": "stop"|"length"|"abort", ...}`` (or a bare string) as our literal."""
    reason = meta_info.get("finish_reason")
    if reason is None:
        return None
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind in ("length", "abort"):
        return "length" if kind == "length" else "abort"
    return "stop"


def usage_of(meta: dict[str, Any]) -> Usage:
    """Usage from SGLang's ``meta_info`` (prompt, completion, cached and reasoning tokens)."""
    return Usage(
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        completion_tokens=int(meta.get("completion_tokens") or 0),
        cached_tokens=int(meta.get("cached_tokens") or 0),
        reasoning_tokens=int(meta.get("reasoning_tokens") or 0),
    )


class StreamAdapter:
    """Turns SGLang stream outputs (cumulative by default, deltas when incremental) into parsed
    :class:`GenerateChunk` deltas: text, reasoning and tool calls, the finish reason
    ``tool_calls`` when the answer called a tool (and the engine stopped by itself, or a second
    call began that ``parallel_tool_calls: false`` leaves out: :attr:`stopped`)."""

    def __init__(self, *, incremental: bool = False, parser: OutputParser | None = None) -> None:
        self._incremental = incremental
        self._parser = parser
        self._text = ""
        self._ids = 0
        self._fed = False
        self._first = True
        self.stopped = False
        """The answer ended before the engine did (a second tool call began under
        ``parallel_tool_calls: false``): the caller aborts the engine request."""

    def chunk(self, output: dict[str, Any]) -> GenerateChunk:
        text = output.get("text") or ""
        ids = output.get("output_ids") or ()  # cumulative: not copied whole for every token
        if self._incremental:
            delta_text, delta_ids = text, list(ids)
        else:
            delta_text = text[len(self._text) :] if text.startswith(self._text) else text
            delta_ids = list(ids[self._ids :])
            self._text, self._ids = text, len(ids)
        meta = output.get("meta_info") or {}
        finish = finish_reason_of(meta)
        usage = usage_of(meta) if finish is not None else None
        prompt_usage = self._prompt_usage(meta) if usage is None else None
        parsed = self._parse(delta_text, final=finish is not None and finish != "abort")
        reason: FinishReason | None = finish
        if finish == "stop" and self._parser is not None and self._parser.called:
            reason = "tool_calls"
        elif finish is None and self._parser is not None and self._parser.dropped_call:
            # the client's one call is complete: what the engine writes next is not sent
            reason, usage, self.stopped = "tool_calls", usage_of(meta), True
        return GenerateChunk(
            text=parsed.text,
            reasoning=parsed.reasoning,
            tool_calls=parsed.tool_calls,
            token_ids=delta_ids,
            finish_reason=reason,
            usage=usage,
            prompt_usage=prompt_usage,
        )

    def _prompt_usage(self, meta: dict[str, Any]) -> Usage | None:
        """The first chunk's prompt-side counts, which SGLang reports from its first output on
        (Anthropic's ``message_start`` carries them before any text)."""
        if not self._first:
            return None
        self._first = False
        if "prompt_tokens" not in meta:
            return None
        return Usage(
            prompt_tokens=int(meta.get("prompt_tokens") or 0),
            cached_tokens=int(meta.get("cached_tokens") or 0),
        )

    def _parse(self, delta: str, *, final: bool) -> ParsedDelta:
        if self._parser is None:
            return ParsedDelta(text=delta)
        if final and not self._fed:
            # The whole answer arrived at once: SGLang's non-streaming parse.
            self._fed = True
            return self._parser.parse_whole(delta)
        self._fed = True
        step = self._parser.feed(delta)
        if final:
            tail = self._parser.finish()
            step.text += tail.text
            step.reasoning += tail.reasoning
            step.tool_calls += tail.tool_calls
        return step

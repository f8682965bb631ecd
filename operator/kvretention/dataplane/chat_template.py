"""The neutral conversation rendered with the model's chat template and tokenized once.

Shared by the worker and the frontend's optional ``--tokenizer`` so both produce the same tokens;
the template's input is :mod:`kvretention.dataplane.template_input`'s.

Rendering is ``apply_chat_template(..., tokenize=False, add_generation_prompt=True)``, or the same
template compiled by minijinja where it was shown to render identically
(:mod:`kvretention.dataplane.compiled_template`; a template input holding a number minijinja
formats unlike Python goes to ``apply_chat_template``), and the text
is encoded once with ``add_special_tokens=False`` (the template already wrote the special tokens),
as SGLang does; with breakpoints to resolve, that one encoding also returns each token's
character span (:func:`encode_with_offsets`), and :func:`breakpoint_renderer` renders cut
conversations the same way without the generation prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from kvretention.dataplane.compiled_template import (
    CompiledTemplate,
    compiled_template_for,
)
from kvretention.dataplane.protocol import (
    ChatMessage,
    PreprocessedRequest,
    ReasoningControl,
    ToolChoice,
    ToolDefinition,
)
from kvretention.dataplane.template_input import (
    ConvertedMessages,
    TemplateInput,
    TemplateInputError,
    build_template_input,
    template_has_developer_role,
)


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered prompt and its token ids (tokenized once)."""

    text: str
    token_ids: list[int]
    image_urls: list[str]
    offsets: list[tuple[int, int]] | None = None
    """Each token's ``(start, end)`` character span in ``text``, when asked for."""


@dataclass(frozen=True)
class Rendering:
    """A prompt minijinja rendered (with the generation prompt), and its input."""

    text: str
    template_input: TemplateInput
    compiled: CompiledTemplate


def render_template(
    tokenizer: Any, template_input: TemplateInput, *, add_generation_prompt: bool = True
) -> str:
    """Render with the tokenizer's own chat template (text, not tokens): compiled by minijinja
    where that is exact (see the module docstring), else ``apply_chat_template``."""
    return render_template_traced(
        tokenizer, template_input, add_generation_prompt=add_generation_prompt
    )[0]


def render_template_traced(
    tokenizer: Any, template_input: TemplateInput, *, add_generation_prompt: bool = True
) -> tuple[str, CompiledTemplate | None]:
    """:func:`render_template`, and the compiled template when minijinja's text was served."""
    compiled = None if template_input.odd_numbers else compiled_template_for(tokenizer)
    if compiled is not None:
        text = compiled.render(
            template_input.messages,
            template_input.tools,
            add_generation_prompt=add_generation_prompt,
            kwargs=template_input.template_kwargs,
            json_memo=template_input.json_memo,
        )
        if text is not None:
            return text, compiled if compiled.enabled else None
    try:
        rendered = tokenizer.apply_chat_template(
            template_input.messages,
            tools=template_input.tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **template_input.template_kwargs,
        )
    except TemplateInputError:
        raise
    except Exception as exc:  # jinja's raise_exception, TypeError on odd input: the request's
        raise TemplateInputError(f"the model's chat template refused the request: {exc}") from exc
    if not isinstance(rendered, str):
        raise TemplateInputError("the model's chat template did not render text")
    return rendered, None


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Tokenize a rendered prompt once; the template already wrote the special tokens."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return [int(i) for i in ids]


class OffsetsUnavailable(ValueError):
    """The tokenizer cannot say where its tokens lie in the text (not a fast tokenizer)."""


def encode_with_offsets(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """The same ids as :func:`encode_prompt`, with each token's character span."""
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, TypeError, ValueError) as exc:
        raise OffsetsUnavailable(f"the tokenizer gives no token offsets: {exc}") from exc
    ids = [int(i) for i in encoded["input_ids"]]
    offsets = [(int(start), int(end)) for start, end in encoded["offset_mapping"]]
    return ids, offsets


def breakpoint_renderer(
    tokenizer: Any,
    *,
    tool_choice: ToolChoice | None = None,
    reasoning: ReasoningControl | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    converted: ConvertedMessages | None = None,
    prompt: Rendering | None = None,
) -> Callable[[Sequence[ChatMessage], Sequence[ToolDefinition]], str]:
    """Renders a cut conversation as the prompt was rendered, without the generation prompt
    (what :func:`kvretention.dataplane.breakpoints.resolve_breakpoints` compares). ``converted``:
    the prompt's converted messages, reused (the cut's own copies are not kept). ``prompt``:
    the prompt as minijinja rendered it; a cut equal to the whole conversation (a breakpoint on
    the newest message) is then the prompt less its generation prompt, where the template
    provably writes that last (:meth:`CompiledTemplate.without_generation_prompt`)."""
    developer_role = template_has_developer_role(getattr(tokenizer, "chat_template", None))

    def render(messages: Sequence[ChatMessage], tools: Sequence[ToolDefinition]) -> str:
        template_input = build_template_input(
            messages,
            tools=tools,
            tool_choice=tool_choice,
            reasoning=reasoning,
            template_kwargs=template_kwargs,
            developer_role=developer_role,
            converted=converted,
            keep=False,
        )
        if prompt is not None and same_input(template_input, prompt.template_input):
            text = prompt.compiled.without_generation_prompt(
                prompt.text,
                template_input.messages,
                template_input.tools,
                kwargs=template_input.template_kwargs,
            )
            if text is not None:
                return text
        return render_template(tokenizer, template_input, add_generation_prompt=False)

    return render


def same_input(a: TemplateInput, b: TemplateInput) -> bool:
    """Whether two template inputs are equal (the same converted objects, mostly: cheap)."""
    return (
        len(a.messages) == len(b.messages)
        and all(x is y or x == y for x, y in zip(a.messages, b.messages, strict=True))
        and a.tools == b.tools
        and a.template_kwargs == b.template_kwargs
        and a.odd_numbers == b.odd_numbers
    )


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None)) and hasattr(
        tokenizer, "apply_chat_template"
    )


class TemplateOptions(TypedDict, total=False):
    """What a request adds to its messages for the template: :func:`build_template_input`'s
    keywords of the same names, and their defaults there."""

    tools: Sequence[ToolDefinition]
    tool_choice: ToolChoice | None
    reasoning: ReasoningControl | None
    template_kwargs: Mapping[str, Any] | None


def template_options(request: PreprocessedRequest) -> TemplateOptions:
    """The request's own template options (its tools, tool choice, reasoning and kwargs)."""
    return TemplateOptions(
        tools=request.tools,
        tool_choice=request.tool_choice,
        reasoning=request.reasoning,
        template_kwargs=request.template_kwargs,
    )


def render_prompt(
    tokenizer: Any,
    messages: Sequence[ChatMessage],
    *,
    converted: ConvertedMessages | None = None,
    **options: Unpack[TemplateOptions],
) -> tuple[str, list[str]]:
    """Convert and render with the model's template: the prompt text and its image URLs
    (``converted``: messages converted before, see :class:`ConvertedMessages`)."""
    template_input = build_template_input(
        messages,
        developer_role=template_has_developer_role(getattr(tokenizer, "chat_template", None)),
        converted=converted,
        **options,
    )
    return render_template(tokenizer, template_input), template_input.image_urls


def render_and_encode(
    tokenizer: Any,
    messages: Sequence[ChatMessage],
    *,
    with_offsets: bool = False,
    **options: Unpack[TemplateOptions],
) -> RenderedPrompt:
    """Convert, render with the model's template, and tokenize once (with token offsets when
    asked: raises :class:`OffsetsUnavailable` if the tokenizer has none)."""
    text, images = render_prompt(tokenizer, messages, **options)
    if with_offsets:
        ids, offsets = encode_with_offsets(tokenizer, text)
        return RenderedPrompt(text=text, token_ids=ids, image_urls=images, offsets=offsets)
    return RenderedPrompt(text=text, token_ids=encode_prompt(tokenizer, text), image_urls=images)

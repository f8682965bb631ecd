"""An Anthropic Messages request gets the prompt and sampling SGLang's own Anthropic adapter
would give it.

Each body goes through this fleet (the Anthropic frontend, the wire, the worker's ``plan_call``)
and through SGLang 0.5.23's ``AnthropicServing`` conversion and its chat serving, over each
template of ``support.real_templates``. Equal, but where the fleet follows Anthropic's API
where SGLang's adapter does not (docs/frontend.md): those rows name the difference.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest

from kvretention.dataplane.frontend.anthropic import parse_messages
from support.sglang_serving import (
    EngineCall,
    outcome,
    planned,
    processed,
    served_fixtures,
    tools_as_the_client_wrote_them,
)

USER = {"role": "user", "content": "Weather in Paris?"}


served, tiny = served_fixtures()


ANTHROPIC_WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
USE = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}


def _messages(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 16, "messages": list(messages or [USER]), **fields}


def _answered(content: Any, **result: Any) -> dict[str, Any]:
    """A tool loop: the question, a call, and ``content`` as its result."""
    return _messages(
        USER,
        {"role": "assistant", "content": [{"type": "text", "text": "Let me see."}, USE]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": content, **result}]},
        tools=[ANTHROPIC_WEATHER],
    )  # fmt: skip


THINKING = {"type": "enabled", "budget_tokens": 2048}
ANTHROPIC_SAME: dict[str, dict[str, Any]] = {
    "plain": _messages(),
    "system": _messages(system="Be brief."),
    "system blocks": _messages(system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]),
    "tools": _messages(tools=[ANTHROPIC_WEATHER]),
    "any tool": _messages(tools=[ANTHROPIC_WEATHER], tool_choice={"type": "any"}),
    "a named tool": _messages(tools=[ANTHROPIC_WEATHER], tool_choice={"type": "tool", "name": "get_weather"}),
    "no tool": _messages(tools=[ANTHROPIC_WEATHER], tool_choice={"type": "none"}),
    "a call and its result": _answered("sunny"),
    "a result in blocks": _answered([{"type": "text", "text": "sunny"}]),
    "thinking on": _messages(thinking=THINKING, max_tokens=4096),
    "thinking off": _messages(thinking={"type": "disabled"}),
    "sampling": _messages(temperature=0.5, top_p=0.9, top_k=20, stop_sequences=["END"]),
    "effort": _messages(output_config={"effort": "low"}),
    "format": _messages(output_config={"format": {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False}}}),
}  # fmt: skip


def _ours_anthropic(tokenizer: Any, body: dict[str, Any]) -> EngineCall:
    return planned(tokenizer, parse_messages(copy.deepcopy(body)))


def _sglang_anthropic(server: Any, body: dict[str, Any]) -> EngineCall:
    from sglang.srt.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from sglang.srt.entrypoints.anthropic.serving import AnthropicServing

    request = AnthropicMessagesRequest.model_validate(copy.deepcopy(body))
    with warnings.catch_warnings(), tools_as_the_client_wrote_them(strict_false=True):
        warnings.simplefilter("ignore")
        chat = AnthropicServing(server)._convert_to_chat_completion_request(request)
        return processed(server, chat)


@pytest.mark.parametrize("name", sorted(ANTHROPIC_SAME))
def test_anthropic_prompts_and_sampling_are_sglangs(served: tuple[Any, Any], name: str) -> None:
    tokenizer, server = served
    body = ANTHROPIC_SAME[name]
    ours = outcome(_ours_anthropic, tokenizer, body)
    assert ours == outcome(_sglang_anthropic, server, body)


ANTHROPIC_DIFFERENT: dict[str, tuple[dict[str, Any], str, str]] = {
    # our body -> the end of our prompt, the end of SGLang's (the tiny model's format)
    "a prefill is continued (SGLang's adapter makes it a user turn)": (
        _messages(USER, {"role": "assistant", "content": "{"}),
        "Paris?<|im_end|>\n<|im_start|>assistant\n{",
        "Paris?<|im_end|>\n<|im_start|>user\n{<|im_end|>\n<|im_start|>assistant\n",
    ),
    "a failed tool's result says so (SGLang drops is_error)": (
        _answered("boom", is_error=True),
        "<tool_response>\nError: boom\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n",
        "<tool_response>\nboom\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n",
    ),
    "earlier thinking is left to the template (SGLang writes it into the text)": (
        _messages(
            USER,
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "x"}, {"type": "text", "text": "Sunny."}]},
            {"role": "user", "content": "And Rome?"},
            thinking=THINKING,
            max_tokens=4096,
        ),
        "assistant\nSunny.<|im_end|>\n<|im_start|>user\nAnd Rome?<|im_end|>\n<|im_start|>assistant\n",
        "assistant\n<think>hmm\n</think> Sunny.<|im_end|>\n<|im_start|>user\nAnd Rome?<|im_end|>\n<|im_start|>assistant\n",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ANTHROPIC_DIFFERENT))
def test_where_anthropic_prompts_differ_from_sglangs_adapter_on_purpose(
    tiny: tuple[Any, Any], name: str
) -> None:
    tokenizer, sglang_server = tiny
    body, our_end, their_end = ANTHROPIC_DIFFERENT[name]
    ours, theirs = _ours_anthropic(tokenizer, body), _sglang_anthropic(sglang_server, body)
    assert tokenizer.decode(ours[0]).endswith(our_end)
    assert tokenizer.decode(theirs[0]).endswith(their_end)


def test_top_k_zero_is_no_top_k(tiny: tuple[Any, Any]) -> None:
    """Anthropic takes ``top_k`` from 0; SGLang's sampling refuses 0 ("-1 or at least 1"), which
    its adapter passes on, so its engine would fail the request. Here 0 means no top-k."""
    tokenizer, sglang_server = tiny
    ours = _ours_anthropic(tokenizer, _messages(top_k=0))
    assert ours == _ours_anthropic(tokenizer, _messages())
    from sglang.srt.sampling.sampling_params import SamplingParams

    assert _sglang_anthropic(sglang_server, _messages(top_k=0))[1]["top_k"] == 0
    with pytest.raises(ValueError, match="top_k must be -1"):
        SamplingParams(top_k=0).verify(vocab_size=len(tokenizer))

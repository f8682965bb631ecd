"""A Chat Completions request gets the prompt and sampling SGLang's own server would give it.

Each body goes through this fleet (the frontend's ``parse_chat``, the wire, the worker's
``plan_call``) and through SGLang 0.5.23's ``OpenAIServingChat._process_messages`` and
``to_sampling_params``, with the same tokenizer and parsers, over each template of
``support.real_templates``. The prompt token ids must be equal (or both sides refuse the
conversation), and the sampling parameters must be equal once SGLang's ``SamplingParams`` has
filled in its defaults (what the engine computes with). Where the fleet renders unlike SGLang's server
on purpose (docs/frontend.md, "OpenAI Chat Completions fields"), the difference is named and
must stay exactly that.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from kvretention.dataplane.frontend.openai import parse_chat
from support.real_templates import TEMPLATES
from support.sglang_serving import (
    EngineCall,
    outcome,
    planned,
    processed,
    served_fixtures,
    template_served,
    tools_as_the_client_wrote_them,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
ROME = {
    "id": "c2",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
}
USER = {"role": "user", "content": "Weather in Paris?"}
AGAIN = {"role": "user", "content": "And Rome?"}
SYSTEM = {"role": "system", "content": "Be brief."}
STRICT = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}  # type: ignore[dict-item]


def _body(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages or [USER]), **fields}


SAME: dict[str, dict[str, Any]] = {
    "plain": _body(),
    "system": _body({"role": "system", "content": "Be brief."}, USER),
    "empty content": _body({"role": "user", "content": ""}),
    "a participant name": _body({"role": "user", "content": "hi", "name": "bob"}),
    "reasoning replayed": _body(
        USER,
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "Look it up."},
        {"role": "user", "content": "And Rome?"},
    ),
    "thinking off by template kwargs": _body(chat_template_kwargs={"enable_thinking": False}),
    "thinking on by template kwargs": _body(chat_template_kwargs={"enable_thinking": True}),
    "a template kwarg the template does not read": _body(chat_template_kwargs={"house": "x"}),
    "thinking off by effort": _body(reasoning_effort="none"),
    "sampling, OpenAI's": _body(
        temperature=0.3,
        top_p=0.9,
        frequency_penalty=0.5,
        presence_penalty=-0.5,
        seed=7,
        max_tokens=12,
        stop=["END", "STOP"],
        logit_bias={"17": 5},
    ),
    "sampling, SGLang's": _body(
        top_k=20,
        min_p=0.05,
        repetition_penalty=1.1,
        min_tokens=3,
        max_tokens=30,
        stop_token_ids=[5, 6],
        ignore_eos=True,
        no_stop_trim=True,
    ),
    "top_k -1 is every token": _body(top_k=-1),
    "special tokens kept": _body(skip_special_tokens=False),
    "regex": _body(regex="(yes|no)"),
    "ebnf": _body(ebnf='root ::= "yes" | "no"'),
    "json_schema": _body(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        }
    ),
    "json_object": _body(response_format={"type": "json_object"}),
    "continue the last assistant message": _body(
        USER, {"role": "assistant", "content": "It is"}, continue_final_message=True
    ),
    "continue with thinking off": _body(
        USER,
        {"role": "assistant", "content": "{"},
        continue_final_message=True,
        chat_template_kwargs={"enable_thinking": False},
    ),
    "continue without an assistant message": _body(continue_final_message=True),
    "continue a message with reasoning (the text alone)": _body(
        USER,
        {"role": "assistant", "content": "It is", "reasoning_content": "Look it up."},
        continue_final_message=True,
    ),
    "tool_choice none": _body(tools=[WEATHER], tool_choice="none"),
    "assistant text in parts": _body(
        USER, {"role": "assistant", "content": [{"type": "text", "text": "Sunny."}]}, AGAIN
    ),
    "a system message mid-way": _body(
        USER, {"role": "assistant", "content": "Sunny."}, {"role": "system", "content": "S"}, AGAIN
    ),
    "two system messages": _body({"role": "system", "content": "A"}, SYSTEM, USER),
    "non-ASCII": _body({"role": "user", "content": "é 漢字 🙂 \u2028 <b>&amp;</b>"}),
    "max_completion_tokens": _body(max_completion_tokens=7),
    "a template kwarg that is an object": _body(
        chat_template_kwargs={"thinking": {"type": "enabled"}}
    ),
}

DEFER_LOADING = ', "defer_loading": null'
"""SGLang's server dumps each tool with its ``defer_loading`` field, set or not; the fleet shows
the model the tool as the client wrote it."""
WITH_TOOLS: dict[str, dict[str, Any]] = {
    "tools": _body(tools=[WEATHER]),
    "tools required": _body(tools=[WEATHER], tool_choice="required"),
    "a named tool": _body(
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    ),
    "one call at most": _body(tools=[WEATHER], parallel_tool_calls=False),
    "a call and its result": _body(
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        tools=[WEATHER],
    ),
    "two calls, two results": _body(
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL, ROME]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        tools=[WEATHER],
    ),
    "results in another order than the calls": _body(
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL, ROME]},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        tools=[WEATHER],
    ),
    "a strict tool": _body(tools=[STRICT]),
    "a strict tool required": _body(tools=[STRICT], tool_choice="required"),
    "json_object with tools": _body(tools=[WEATHER], response_format={"type": "json_object"}),
    "text, a call, a result in parts": _body(
        USER,
        {"role": "assistant", "content": "Let me see.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
        tools=[WEATHER],
    ),
}


served, tiny = served_fixtures()


def _sglang(server: Any, body: dict[str, Any]) -> EngineCall:
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    return processed(server, ChatCompletionRequest.model_validate(copy.deepcopy(body)))


def _ours(tokenizer: Any, body: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    return planned(tokenizer, parse_chat(copy.deepcopy(body)))


HELPERS_NAME = "helpers: macros, loop, break, dictsort, items, unique"
KNOWN: dict[tuple[str, str], str] = {
    ("thinking off by effort", HELPERS_NAME): (
        "reasoning_effort none is a thinking switch here, not a template variable"
    ),
}
"""(row, template) pairs that differ on purpose; each has its own test below."""


@pytest.mark.parametrize("name", sorted(SAME))
def test_the_prompt_and_sampling_are_sglangs(served: tuple[Any, Any], name: str) -> None:
    tokenizer, server = served
    ours = outcome(_ours, tokenizer, SAME[name])
    theirs = outcome(_sglang, server, SAME[name])
    if (name, _template_of(tokenizer)) in KNOWN:
        assert ours != theirs
        return
    if isinstance(ours, tuple) and isinstance(theirs, tuple):
        assert tokenizer.decode(ours[0]) == tokenizer.decode(theirs[0])
    assert ours == theirs


def _template_of(tokenizer: Any) -> str:
    return next(name for name, source in TEMPLATES.items() if source() == tokenizer.chat_template)


@pytest.mark.parametrize("name", sorted(WITH_TOOLS))
def test_with_tools_the_prompt_and_sampling_are_sglangs_but_for_defer_loading(
    served: tuple[Any, Any], name: str
) -> None:
    tokenizer, server = served
    with tools_as_the_client_wrote_them():
        theirs = outcome(_sglang, server, WITH_TOOLS[name])
    assert outcome(_ours, tokenizer, WITH_TOOLS[name]) == theirs


@pytest.mark.parametrize("name", sorted(WITH_TOOLS))
def test_sglang_shows_the_model_each_tools_defer_loading(tiny: tuple[Any, Any], name: str) -> None:
    tokenizer, sglang_server = tiny
    body = WITH_TOOLS[name]
    (ours, our_params), (theirs, their_params) = (
        _ours(tokenizer, body),
        _sglang(sglang_server, body),
    )
    their_text = tokenizer.decode(theirs)
    assert DEFER_LOADING in their_text
    assert tokenizer.decode(ours) == their_text.replace(DEFER_LOADING, "")
    assert our_params == their_params


def test_reasoning_effort_none_switches_thinking_off_without_naming_an_effort() -> None:
    tokenizer, server = template_served(HELPERS_NAME)
    body = _body(reasoning_effort="none")
    ours, theirs = _ours(tokenizer, body), _sglang(server, body)
    assert tokenizer.decode(ours[0]).endswith("<assistant>")
    assert tokenizer.decode(theirs[0]).endswith("<assistant>none")


DIFFERENT: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # our body -> the body SGLang renders as we render ours
    "developer is system where the template has no developer role": (
        _body({"role": "developer", "content": "Be brief."}, USER),
        _body(SYSTEM, USER),
    ),
    "text parts joined by newlines": (
        _body({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        _body({"role": "user", "content": "a\nb"}),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(DIFFERENT))
def test_where_the_fleet_renders_unlike_sglang_on_purpose(tiny: tuple[Any, Any], name: str) -> None:
    tokenizer, sglang_server = tiny
    body, equivalent = DIFFERENT[name]
    ours = _ours(tokenizer, body)
    assert ours != _sglang(sglang_server, body)
    assert ours == _sglang(sglang_server, equivalent)


def test_a_last_assistant_message_is_history_not_a_user_turn(
    tiny: tuple[Any, Any],
) -> None:
    tokenizer, sglang_server = tiny
    body = _body(USER, {"role": "assistant", "content": "It is"})
    ours, theirs = _ours(tokenizer, body), _sglang(sglang_server, body)
    assert tokenizer.decode(ours[0]).endswith(
        "<|im_start|>assistant\nIt is<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "<|im_start|>user\nIt is<|im_end|>" in tokenizer.decode(theirs[0])
    assert ours[1] == theirs[1]


QWEN3_GENERATION = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
"""Qwen3's ``generation_config.json`` sampling, which SGLang's server applies by default
(``--sampling-defaults model``) and its engine does not."""


@pytest.mark.parametrize(
    "fields",
    [{}, {"temperature": 1.0}, {"top_k": 5, "min_p": 0.2}, {"temperature": 0}, {"top_p": 0.5}],
    ids=str,
)
def test_the_models_generation_config_fills_what_the_request_leaves_unset(
    tiny: tuple[Any, Any], fields: dict[str, Any]
) -> None:
    tokenizer, sglang_server = tiny
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    body = _body(**fields)
    ours = planned(tokenizer, parse_chat(copy.deepcopy(body)), QWEN3_GENERATION)
    request = ChatCompletionRequest.model_validate(copy.deepcopy(body))
    assert ours == processed(sglang_server, request, QWEN3_GENERATION)
    assert ours[1] != _ours(tokenizer, body)[1] or fields.keys() >= QWEN3_GENERATION.keys()


def test_one_call_at_most_is_held_by_the_grammar_here(tiny: tuple[Any, Any]) -> None:
    """``parallel_tool_calls: false`` with a required choice: the grammar stops after the first
    call here (docs/frontend.md); SGLang's server asks only for at least one."""
    tokenizer, sglang_server = tiny
    body = _body(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    with tools_as_the_client_wrote_them():
        theirs = _sglang(sglang_server, body)
    ours = _ours(tokenizer, body)
    assert ours[0] == theirs[0]
    assert ours[1]["structural_tag"]["format"]["stop_after_first"] is True
    assert "stop_after_first" not in json.dumps(theirs[1]["structural_tag"])

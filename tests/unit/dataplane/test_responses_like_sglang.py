"""A Responses request (Codex's API) gets the prompt and sampling SGLang's own Responses server
would give it.

Each body goes through this fleet (the Responses frontend, the wire, the worker's ``plan_call``)
and through SGLang 0.5.23's ``OpenAIServingResponses._make_request`` and ``to_sampling_params``,
over each template of ``support.real_templates``. The bodies set ``temperature``: SGLang's
Responses server alone defaults it to 0.7 (see the differences below).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvretention.dataplane.frontend.openai import parse_responses
from support.real_templates import HELPERS
from support.sglang_serving import (
    EngineCall,
    outcome,
    planned,
    responses_processed,
    served_fixtures,
)

SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Run a command.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        "required": ["command"],
    },
    "strict": False,  # as Codex sends its function tools
}
LIST = {
    "type": "message",
    "role": "user",
    "content": [{"type": "input_text", "text": "List files."}],
}
CALL = {
    "type": "function_call",
    "call_id": "c1",
    "name": "shell",
    "arguments": '{"command": ["ls"]}',
}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "a.txt"}
SURE = {
    "type": "message",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Sure."}],
}
MORE = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "More."}]}


def _body(input_: Any = "hi", **fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": input_, "temperature": 1.0, **fields}


SAME: dict[str, dict[str, Any]] = {
    "a string": _body(),
    "instructions": _body(instructions="Be brief."),
    "a message item": _body([LIST]),
    "history": _body([LIST, SURE, MORE]),
    "reasoning replayed": _body([LIST, {"type": "reasoning", "id": "r1", "summary": [{"type": "summary_text", "text": "think"}]}, SURE, MORE]),
    "effort": _body(reasoning={"effort": "low"}),
    "thinking off": _body(reasoning={"effort": "none"}),
    "structured output": _body(text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}),
    "sampling": _body(temperature=0.4, top_p=0.9),
    "SGLang's own fields": _body(top_k=5, min_p=0.1, repetition_penalty=1.2, stop=["X"], chat_template_kwargs={"enable_thinking": False}),
}  # fmt: skip
WITH_TOOLS: dict[str, dict[str, Any]] = {
    "tools": _body([LIST], tools=[SHELL]),
    "tools required": _body([LIST], tools=[SHELL], tool_choice="required"),
    "a call and its output": _body([LIST, CALL, OUTPUT], tools=[SHELL]),
    "text, a call, its output": _body([LIST, SURE, CALL, OUTPUT], tools=[SHELL]),
}


served, tiny = served_fixtures(responses=True)


def _ours(tokenizer: Any, body: dict[str, Any]) -> EngineCall:
    return planned(tokenizer, parse_responses(copy.deepcopy(body)))


EFFORT_NONE_SHOWN = ("thinking off", HELPERS)
"""The one template here that prints ``reasoning_effort``: SGLang passes ``none`` on to it, this
fleet turns thinking off instead (``test_prompt_like_sglang``'s effort test)."""


@pytest.mark.parametrize("name", sorted(SAME))
def test_the_prompt_and_sampling_are_sglangs(served: tuple[Any, Any], name: str) -> None:
    tokenizer, server = served
    ours = outcome(_ours, tokenizer, SAME[name])
    theirs = outcome(responses_processed, server, SAME[name])
    assert (ours != theirs) == ((name, tokenizer.chat_template) == EFFORT_NONE_SHOWN)


@pytest.mark.parametrize("name", sorted(WITH_TOOLS))
def test_with_tools_the_prompt_and_sampling_are_sglangs(served: tuple[Any, Any], name: str) -> None:
    tokenizer, server = served
    ours = outcome(_ours, tokenizer, WITH_TOOLS[name])
    assert ours == outcome(responses_processed, server, WITH_TOOLS[name])


def test_a_tool_that_does_not_say_is_strict_as_openai_documents(tiny: tuple[Any, Any]) -> None:
    """OpenAI's Responses function tools are strict unless they say ``strict: false``; SGLang's
    Responses server takes them as not strict, so it neither says so to the model nor holds the
    arguments to the schema."""
    tokenizer, server = tiny
    unsaid = {k: v for k, v in SHELL.items() if k != "strict"}
    body = _body([LIST], tools=[unsaid], tool_choice="required")
    ours, theirs = _ours(tokenizer, body), responses_processed(server, body)
    assert '"strict": true' in tokenizer.decode(ours[0])
    assert '"strict": false' in tokenizer.decode(theirs[0])
    (structure,) = ours[1]["structural_tag"]["structures"]
    (unchecked,) = theirs[1]["structural_tag"]["structures"]
    assert (structure["schema"], unchecked["schema"]) == (SHELL["parameters"], {})


@pytest.mark.parametrize(
    ("fields", "ours", "theirs"),
    [
        ({"temperature": None}, {"temperature": 1.0}, {"temperature": 0.7}),
        ({"max_output_tokens": 20}, {"max_new_tokens": 20}, {"max_new_tokens": 18}),
    ],
    ids=["temperature: OpenAI's default 1", "max_output_tokens: as asked"],
)
def test_sampling_where_sglangs_responses_server_departs_from_openais(
    tiny: tuple[Any, Any], fields: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any]
) -> None:
    tokenizer, server = tiny
    body = {k: v for k, v in _body(**fields).items() if v is not None}
    ours_call, theirs_call = _ours(tokenizer, body), responses_processed(server, body)
    assert ours_call[0] == theirs_call[0]
    assert {k: ours_call[1][k] for k in ours} == ours
    assert {k: theirs_call[1][k] for k in theirs} == theirs


def test_a_developer_message_is_a_system_message_as_written(tiny: tuple[Any, Any]) -> None:
    tokenizer, server = tiny
    rules = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]}  # fmt: skip
    body = _body([rules, LIST])
    ours, theirs = _ours(tokenizer, body), responses_processed(server, body)
    assert tokenizer.decode(ours[0]).startswith("<|im_start|>system\nRules.<|im_end|>")
    assert tokenizer.decode(theirs[0]).startswith(
        "<|im_start|>system\nDeveloper instructions:\nRules.<|im_end|>"
    )

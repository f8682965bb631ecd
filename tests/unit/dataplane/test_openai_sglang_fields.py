"""SGLang's own Chat Completions extensions: honoured, a counted no-op, or a 400 naming the field
(pure: ``parse_chat``). What they do to the prompt and the sampling is compared with SGLang's
own server in ``test_prompt_like_sglang.py``."""

from __future__ import annotations

from typing import Any

import pytest

from kvretention.dataplane.frontend.openai import parse_chat, parse_responses
from kvretention.dataplane.frontend.openai.chat_request import FIELDS
from kvretention.dataplane.frontend.openai.responses_request import FIELDS as RESPONSES_ALL
from kvretention.dataplane.frontend.openai.sglang_fields import (
    HONOURED,
    NO_OP,
    REFUSED,
    RESPONSES_NO_OP,
)
from kvretention.dataplane.protocol import ReasoningControl
from support.client_refusals import assert_refused, refusal_cases


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_every_sglang_field_is_in_exactly_one_table_and_known() -> None:
    tables = [HONOURED, NO_OP, frozenset(REFUSED)]
    assert sum(len(t) for t in tables) == len(HONOURED | NO_OP | frozenset(REFUSED))
    assert HONOURED | NO_OP | frozenset(REFUSED) <= FIELDS


def test_the_tables_cover_sglangs_own_request_model() -> None:
    """Every field SGLang's ``ChatCompletionRequest`` takes beyond OpenAI's is in a table: a new
    SGLang field fails here until it is honoured, a no-op or refused."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    assert set(ChatCompletionRequest.model_fields) - FIELDS == set()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"top_k": 20}, {"top_k": 20}),
        ({"top_k": -1}, {"top_k": -1}),
        ({"min_p": 0.05}, {"min_p": 0.05}),
        ({"repetition_penalty": 1.1}, {"repetition_penalty": 1.1}),
        ({"min_tokens": 4, "max_tokens": 8}, {"min_new_tokens": 4, "max_new_tokens": 8}),
        ({"min_tokens": 0}, {}),
        ({"stop_token_ids": [7, 9]}, {"stop_token_ids": [7, 9]}),
        ({"stop_token_ids": []}, {}),
        ({"ignore_eos": True, "no_stop_trim": True}, {"ignore_eos": True, "no_stop_trim": True}),
        ({"ignore_eos": False, "no_stop_trim": False}, {}),
        ({"skip_special_tokens": False}, {"skip_special_tokens": False}),
        ({"skip_special_tokens": True}, {}),
        ({"regex": "a+"}, {"regex": "a+"}),
        ({"ebnf": 'root ::= "a"'}, {"ebnf": 'root ::= "a"'}),
        ({"regex": ""}, {}),
    ],
)
def test_sampling_extensions_reach_sglangs_sampling_params(
    extra: dict[str, Any], expected: dict[str, Any]
) -> None:
    parsed = parse_chat(body(**extra))
    assert parsed.sampling.to_sglang() == expected
    assert parsed.ignored == ()


@pytest.mark.parametrize(
    ("extra", "reasoning", "kwargs"),
    [
        ({}, None, None),
        (
            {"chat_template_kwargs": {"enable_thinking": False}},
            ReasoningControl(enabled=False),
            {"enable_thinking": False},
        ),
        (
            {"chat_template_kwargs": {"thinking": True}, "reasoning_effort": "low"},
            ReasoningControl(enabled=True, effort="low"),
            {"thinking": True},
        ),
        (
            {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "none"},
            ReasoningControl(enabled=True),
            {"enable_thinking": True},
        ),
        (
            {"chat_template_kwargs": {"enable_thinking": "no", "house": [1]}},
            None,
            {"enable_thinking": "no", "house": [1]},
        ),
        ({"chat_template_kwargs": {}}, None, None),
    ],
)
def test_template_kwargs_pass_and_their_thinking_switch_is_read(
    extra: dict[str, Any], reasoning: ReasoningControl | None, kwargs: dict[str, Any] | None
) -> None:
    parsed = parse_chat(body(**extra))
    assert (parsed.reasoning, parsed.template_kwargs) == (reasoning, kwargs)


def test_continue_final_message_and_the_reasoning_switches_are_carried() -> None:
    assert parse_chat(body(continue_final_message=True)).continue_final_message
    parsed = parse_chat(body(separate_reasoning=False, stream_reasoning=False))
    assert (parsed.separate_reasoning, parsed.stream_reasoning) == (False, False)
    default = parse_chat(body())
    assert not default.continue_final_message
    assert (default.separate_reasoning, default.stream_reasoning) == (True, True)


REFUSALS = [
    *(({key: 1}, key, "unsupported_parameter") for key in sorted(REFUSED)),
    ({"top_k": 0}, "top_k", "invalid_value"),
    ({"top_k": -2}, "top_k", "invalid_value"),
    ({"top_k": 1.5}, "top_k", "invalid_type"),
    ({"min_p": 1.5}, "min_p", "invalid_value"),
    ({"repetition_penalty": 0}, "repetition_penalty", "invalid_value"),
    ({"repetition_penalty": 2.5}, "repetition_penalty", "invalid_value"),
    ({"min_tokens": 9, "max_tokens": 8}, "min_tokens", "invalid_value"),
    ({"min_tokens": -1}, "min_tokens", "invalid_value"),
    ({"stop_token_ids": 5}, "stop_token_ids", "invalid_type"),
    ({"stop_token_ids": [1, "2"]}, "stop_token_ids[1]", "invalid_type"),
    ({"stop_token_ids": [-1]}, "stop_token_ids[0]", "invalid_type"),
    ({"stop_token_ids": list(range(65))}, "stop_token_ids", "invalid_value"),
    ({"ignore_eos": "yes"}, "ignore_eos", "invalid_type"),
    ({"regex": 5}, "regex", "invalid_type"),
    ({"regex": "a", "ebnf": "b"}, "ebnf", "invalid_value"),
    ({"regex": "a", "response_format": {"type": "json_object"}}, "regex", "invalid_value"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs", "invalid_type"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools", "invalid_value"),
    (
        {"chat_template_kwargs": {"add_generation_prompt": False}},
        "chat_template_kwargs.add_generation_prompt",
        "invalid_value",
    ),
    ({"continue_final_message": "yes"}, "continue_final_message", "invalid_type"),
    ({"separate_reasoning": "no"}, "separate_reasoning", "invalid_type"),
    ({"stream_reasoning": 0}, "stream_reasoning", "invalid_type"),
]


@pytest.mark.parametrize(("extra", "param", "code"), refusal_cases(REFUSALS))
def test_refusals_name_the_field(extra: dict[str, Any], param: str, code: str) -> None:
    assert_refused(lambda: parse_chat(body(**extra)), param=param, code=code)


@pytest.mark.parametrize(
    "extra",
    [
        {"return_hidden_states": False},
        {"lora_path": None},
        {"custom_params": {}},
        {"use_audio_in_video": False},
    ],
)
def test_a_refused_field_that_asks_for_nothing_is_accepted(extra: dict[str, Any]) -> None:
    assert parse_chat(body(**extra)).messages


@pytest.mark.parametrize("key", sorted(NO_OP))
def test_no_ops_are_accepted_and_counted(key: str) -> None:
    parsed = parse_chat(body(**{key: 1}))
    assert parsed.ignored == (key,)
    assert parsed.sampling.to_sglang() == {}


# -- Responses: the subset SGLang's ResponsesRequest takes -------------------------------------


def responses_body(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hi", **extra}


def test_the_responses_tables_cover_sglangs_own_request_model() -> None:
    from sglang.srt.entrypoints.openai.protocol import ResponsesRequest

    assert set(ResponsesRequest.model_fields) - RESPONSES_ALL == set()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"top_k": 20, "min_p": 0.1}, {"top_k": 20, "min_p": 0.1}),
        ({"repetition_penalty": 1.05}, {"repetition_penalty": 1.05}),
        (
            {"frequency_penalty": 0.5, "presence_penalty": 0.25, "seed": 3},
            {"frequency_penalty": 0.5, "presence_penalty": 0.25, "sampling_seed": 3},
        ),
        ({"stop": "END"}, {"stop": ["END"]}),
    ],
)
def test_responses_sampling_extensions_are_honoured_not_ignored(
    extra: dict[str, Any], expected: dict[str, Any]
) -> None:
    parsed = parse_responses(responses_body(**extra))
    assert parsed.sampling.to_sglang() == expected
    assert parsed.ignored == ()


def test_responses_template_kwargs_switch_thinking() -> None:
    parsed = parse_responses(
        responses_body(chat_template_kwargs={"enable_thinking": False, "house": 1})
    )
    assert parsed.reasoning == ReasoningControl(enabled=False)
    assert parsed.template_kwargs == {"enable_thinking": False, "house": 1}


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    refusal_cases(
        [
            ({"cache_salt": "s"}, "cache_salt", "unsupported_parameter"),
            ({"top_k": 0}, "top_k", "invalid_value"),
            (
                {"chat_template_kwargs": {"messages": []}},
                "chat_template_kwargs.messages",
                "invalid_value",
            ),
        ]
    ),
)
def test_responses_refusals_name_the_field(extra: dict[str, Any], param: str, code: str) -> None:
    assert_refused(lambda: parse_responses(responses_body(**extra)), param=param, code=code)


@pytest.mark.parametrize("key", sorted(RESPONSES_NO_OP))
def test_responses_no_ops_are_accepted_and_counted(key: str) -> None:
    assert parse_responses(responses_body(**{key: 1})).ignored == (key,)

"""Responses parsing and formatting (pure): a Codex-shaped body in, output items and events out.

Formatted objects and every stream event are validated with the official SDK's own pydantic
models (``Response``, the ``ResponseStreamEvent`` union), so a missing required field or an
unknown literal fails here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from kvretention.dataplane.frontend.common import Completion
from kvretention.dataplane.frontend.errors import FrontendError
from kvretention.dataplane.frontend.openai import (
    ResponsesStream,
    parse_responses,
    responses_response,
)
from kvretention.dataplane.frontend.openai.responses_request import FIELDS, NO_OP, REFUSED
from kvretention.dataplane.protocol import (
    ChatMessage,
    GenerateChunk,
    ImagePart,
    Reasoning,
    ReasoningControl,
    ResponseFormat,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    Usage,
)
from support.client_refusals import assert_refused, refusal_cases
from support.openai_shapes import (
    APPLY_PATCH,
    CODEX_MESSAGES,
    CODEX_TOOLS,
    PATCH,
    SHELL,
    codex_body,
)

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def test_codex_turn_converts_exactly() -> None:
    parsed = parse_responses(codex_body())
    assert parsed.messages == CODEX_MESSAGES
    assert parsed.tools == CODEX_TOOLS
    assert parsed.tool_choice == ToolChoice(mode="auto")
    assert parsed.parallel_tool_calls is False
    assert parsed.reasoning == ReasoningControl(enabled=True, effort="medium")
    assert parsed.response_format is None
    assert parsed.envelope is None  # Codex sends no prompt_cache_options: no hint
    assert parsed.stream is True
    assert parsed.echo["text"] == {"format": {"type": "text"}, "verbosity": "low"}
    assert parsed.echo["reasoning"] == {"effort": "medium", "summary": "auto"}
    assert parsed.echo["store"] is False and parsed.echo["tools"] == [SHELL, APPLY_PATCH]
    assert parsed.echo["prompt_cache_key"] == "019a2b3c-conversation"


def test_reasoning_text_content_is_preferred_to_the_summary() -> None:
    body = {
        "model": "m",
        "input": [
            {
                "type": "reasoning",
                "id": "rs",
                "summary": [{"type": "summary_text", "text": "short"}],
                "content": [
                    {"type": "reasoning_text", "text": "long a"},
                    {"type": "text", "text": "long b"},
                ],
            },
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "next"},
        ],
    }
    parsed = parse_responses(body)
    assert parsed.messages[0] == ChatMessage(
        role="assistant", content="done", reasoning=Reasoning(text="long a\n\nlong b")
    )


def test_images_structured_output_and_named_custom_choice() -> None:
    png = "data:image/png;base64,iVBORw0KGgo="
    parsed = parse_responses(
        {
            "model": "m",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "what is this?"},
                        {"type": "input_image", "image_url": png, "detail": "high"},
                    ],
                }
            ],
            "tools": [SHELL, APPLY_PATCH],
            "tool_choice": {"type": "custom", "name": "apply_patch"},
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "answer",
                    "schema": {"type": "object"},
                    "strict": True,
                }
            },
        }
    )
    assert parsed.messages[0].content == [
        TextPart(text="what is this?"),
        ImagePart(url=png, detail="high"),
    ]
    assert parsed.tool_choice == ToolChoice(mode="named", name="apply_patch")
    assert parsed.response_format == ResponseFormat(
        type="json_schema", json_schema={"type": "object"}, name="answer", strict=True
    )


@pytest.mark.parametrize(
    ("choice", "expected", "names"),
    [
        ("none", ToolChoice(mode="none"), ["shell", "apply_patch"]),
        ("required", ToolChoice(mode="required"), ["shell", "apply_patch"]),
        (
            {"type": "function", "name": "shell"},
            ToolChoice(mode="named", name="shell"),
            ["shell", "apply_patch"],
        ),
        (
            {
                "type": "allowed_tools",
                "mode": "auto",
                "tools": [{"type": "function", "name": "shell"}],
            },
            ToolChoice(mode="auto"),
            ["shell"],
        ),
    ],
)
def test_tool_choice(choice: Any, expected: ToolChoice, names: list[str]) -> None:
    parsed = parse_responses(
        {"model": "m", "input": "x", "tools": [SHELL, APPLY_PATCH], "tool_choice": choice}
    )
    assert parsed.tool_choice == expected
    assert [t.name for t in parsed.tools] == names
    assert parsed.echo["tool_choice"] == choice


@pytest.mark.parametrize("key", sorted(NO_OP))
def test_documented_no_ops_are_accepted(key: str) -> None:
    values: dict[str, Any] = {
        "store": True,
        "include": ["reasoning.encrypted_content", "message.output_text.logprobs"],
        "metadata": {"k": "v"},
        "stream_options": {"include_obfuscation": False},
        "truncation": "disabled",
        "max_tool_calls": 3,
        "client_metadata": {"turn": "1"},
    }
    parsed = parse_responses({"model": "m", "input": "x", key: values.get(key, "x")})
    assert parsed.echo["store"] is False  # nothing is stored, whatever was asked


def test_every_refused_field_is_known() -> None:
    assert set(REFUSED) <= FIELDS


def _call(**fields: Any) -> dict[str, Any]:
    return {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}", **fields}


REFUSALS = [
    # (extra body, param, code)
    ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
    ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
    ({"prompt": {"id": "p"}}, "prompt", "unsupported_parameter"),
    ({"background": True}, "background", "unsupported_parameter"),
    ({"top_logprobs": 3}, "top_logprobs", "unsupported_parameter"),
    (
        {"context_management": [{"type": "compaction"}]},
        "context_management",
        "unsupported_parameter",
    ),
    ({"truncation": "auto"}, "truncation", "unsupported_parameter"),
    ({"include": "reasoning.encrypted_content"}, "include", "invalid_type"),
    ({"store": "no"}, "store", "invalid_type"),
    (
        {"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]},
        "tools[0].type",
        "unsupported_parameter",
    ),
    ({"tools": [{"type": "local_shell"}]}, "tools[0].type", "unsupported_parameter"),
    (
        {"tools": [{**SHELL, "allowed_callers": ["programmatic"]}]},
        "tools[0].allowed_callers",
        "unsupported_parameter",
    ),
    (
        {"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
        "tool_choice.type",
        "unsupported_parameter",
    ),
    ({"tools": [SHELL, SHELL]}, "tools[1].name", "invalid_value"),
    ({"tools": [{"type": "function"}]}, "tools[0].name", "missing_required_parameter"),
    (
        {
            "tools": [
                {**APPLY_PATCH, "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}
            ]
        },
        "tools[0].format.syntax",
        "invalid_value",
    ),
    (
        {"tools": [{**APPLY_PATCH, "format": {"type": "grammar", "syntax": "lark"}}]},
        "tools[0].format.definition",
        "missing_required_parameter",
    ),
    (
        {"tools": [{**APPLY_PATCH, "format": {"type": "yaml"}}]},
        "tools[0].format.type",
        "invalid_value",
    ),
    ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
    ({"tool_choice": "maybe"}, "tool_choice", "invalid_value"),
    (
        {"tools": [SHELL], "tool_choice": {"type": "function", "name": "nope"}},
        "tool_choice.name",
        "invalid_value",
    ),
    (
        {"tools": [SHELL], "tool_choice": {"type": "custom", "name": "shell"}},
        "tool_choice.name",
        "invalid_value",
    ),
    (
        {"tools": [SHELL], "tool_choice": {"type": "file_search"}},
        "tool_choice.type",
        "unsupported_parameter",
    ),
    (
        {"tools": [SHELL], "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}},
        "tool_choice.tools",
        "invalid_type",
    ),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "invalid_value"),
    (
        {"text": {"format": {"type": "json_schema", "name": "a"}}},
        "text.format.schema",
        "missing_required_parameter",
    ),
    ({"text": {"verbosity": "chatty"}}, "text.verbosity", "invalid_value"),
    ({"reasoning": {"effort": "huge"}}, "reasoning.effort", "invalid_value"),
    ({"reasoning": {"summary": "always"}}, "reasoning.summary", "invalid_value"),
    ({"reasoning": {"mode": "pro"}}, "reasoning.mode", "unsupported_parameter"),
    ({"reasoning": {"context": "some_turns"}}, "reasoning.context", "invalid_value"),
    (
        {"tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}]},
        "tools[0].tools[0].type",
        "unsupported_parameter",
    ),
    (
        {"tools": [{"type": "namespace", "name": "ns", "tools": []}]},
        "tools[0].tools",
        "invalid_type",
    ),
    (
        {"tools": [SHELL, {"type": "namespace", "name": "ns", "tools": [SHELL, SHELL]}]},
        "tools[1].tools[1].name",
        "invalid_value",
    ),
    (
        {"input": [{"type": "additional_tools", "tools": "x"}, "x"]},
        "input[0].tools",
        "invalid_type",
    ),
    (
        {"input": [{"type": "item_reference", "id": "msg_1"}]},
        "input[0].type",
        "unsupported_parameter",
    ),
    (
        {"input": [{"type": "web_search_call", "id": "ws"}]},
        "input[0].type",
        "unsupported_parameter",
    ),
    (
        {"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]},
        "input[0].call_id",
        "invalid_value",
    ),
    (
        {"input": [_call(), {"type": "function_call_output", "call_id": "c1"}]},
        "input[1].output",
        "missing_required_parameter",
    ),
    ({"input": [_call(arguments=None)]}, "input[0].arguments", "invalid_type"),
    (
        {"input": [_call(caller={"type": "program", "caller_id": "p1"})]},
        "input[0].caller.type",
        "unsupported_parameter",
    ),
    (
        {"input": [{"type": "reasoning", "summary": [{"type": "text", "text": "x"}]}]},
        "input[0].summary[0].type",
        "invalid_value",
    ),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value"),
    (
        {"input": [{"role": "assistant", "content": "x", "phase": "draft"}]},
        "input[0].phase",
        "invalid_value",
    ),
    ({"client_metadata": {"a": 1}}, "client_metadata.a", "invalid_type"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        "input[0].content[0].type",
        "unsupported_parameter",
    ),
    (
        {
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "file_id": "f", "detail": "auto"}],
                }
            ]
        },
        "input[0].content[0].file_id",
        "unsupported_parameter",
    ),
    (
        {
            "input": [
                {
                    "role": "system",
                    "content": [{"type": "input_image", "image_url": "https://x/a.png"}],
                }
            ]
        },
        "input[0].content[0].type",
        "unsupported_parameter",
    ),
    (
        {
            "input": [
                {"role": "user", "content": [{"type": "input_image", "image_url": "file:///a.png"}]}
            ]
        },
        "input[0].content[0].image_url",
        "invalid_value",
    ),
]


@pytest.mark.parametrize(("extra", "param", "code"), refusal_cases(REFUSALS))
def test_refusals_name_the_field(extra: dict[str, Any], param: str, code: str) -> None:
    assert_refused(
        lambda: parse_responses({"model": "m", "input": "x", **extra}), param=param, code=code
    )


# -- formatting --------------------------------------------------------------------------------

USAGE = Usage(prompt_tokens=100, completion_tokens=20, cached_tokens=64, reasoning_tokens=5)


def _events(chunks: list[GenerateChunk]) -> list[dict[str, Any]]:
    stream = ResponsesStream(parse_responses(codex_body()), request_id="r7")
    raw = stream.start() + b"".join(stream.chunk(c) for c in chunks) + stream.finish()
    events: list[dict[str, Any]] = []
    for frame in raw.decode().split("\n\n")[:-1]:
        name, data = frame.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENTS.validate_python(event)
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_stream_of_reasoning_then_two_calls() -> None:
    events = _events(
        [
            GenerateChunk(reasoning="Let me "),
            GenerateChunk(reasoning="look."),
            GenerateChunk(tool_calls=[ToolCallDelta(index=0, id="call_a", name="shell")]),
            GenerateChunk(tool_calls=[ToolCallDelta(index=0, arguments='{"command":')]),
            GenerateChunk(tool_calls=[ToolCallDelta(index=0, arguments='["ls"]}')]),
            GenerateChunk(
                tool_calls=[ToolCallDelta(index=1, id="call_b", name="apply_patch", kind="custom")]
            ),
            GenerateChunk(tool_calls=[ToolCallDelta(index=1, arguments=PATCH)]),
            GenerateChunk(finish_reason="tool_calls", usage=USAGE),
        ]
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = Response.model_validate(events[-1]["response"])
    reasoning, call, patch = final.output
    assert reasoning.type == "reasoning" and [s.text for s in reasoning.summary] == ["Let me look."]
    assert call.type == "function_call"
    assert (call.call_id, call.name, call.arguments, call.status) == (
        "call_a",
        "shell",
        '{"command":["ls"]}',
        "completed",
    )
    assert patch.type == "custom_tool_call"
    assert (patch.call_id, patch.name, patch.input) == ("call_b", "apply_patch", PATCH)
    assert events[12]["arguments"] == '{"command":["ls"]}'
    assert len({item.id for item in final.output}) == 3
    assert final.usage is not None
    assert final.usage.input_tokens_details.cached_tokens == 64
    assert final.usage.output_tokens_details.reasoning_tokens == 5
    assert final.tools[1].type == "custom" and final.parallel_tool_calls is False
    assert final.text is not None and final.text.verbosity == "low"
    assert final.reasoning is not None and final.reasoning.effort == "medium"


def test_stream_of_text_only_keeps_the_message_grammar() -> None:
    events = _events([GenerateChunk(text="Hel"), GenerateChunk(text="lo", finish_reason="stop")])
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert Response.model_validate(events[-1]["response"]).output_text == "Hello"


def test_stream_of_reasoning_only_still_ends_with_a_message() -> None:
    events = _events([GenerateChunk(reasoning="hmm", finish_reason="length")])
    final = Response.model_validate(events[-1]["response"])
    assert events[-1]["type"] == "response.incomplete"
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == ""


def test_non_streaming_response_orders_reasoning_text_then_calls() -> None:
    result = Completion(
        text="Running it.",
        reasoning="plan",
        tool_calls=[ToolCall(id="call_a", name="shell", arguments="{}")],
        finish_reason="tool_calls",
        usage=USAGE,
    )
    raw = responses_response(parse_responses(codex_body()), result, request_id="r8")
    final = Response.model_validate(raw)
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.status == "completed" and final.output_text == "Running it."
    call = final.output[2]
    assert call.type == "function_call" and call.call_id == "call_a"


def test_a_late_fragment_of_a_closed_call_still_lands_in_the_final_item() -> None:
    events = _events(
        [
            GenerateChunk(tool_calls=[ToolCallDelta(index=0, id="a", name="shell", arguments="{")]),
            GenerateChunk(
                tool_calls=[ToolCallDelta(index=1, id="b", name="shell", arguments="{}")]
            ),
            GenerateChunk(tool_calls=[ToolCallDelta(index=0, arguments="}")]),
            GenerateChunk(finish_reason="tool_calls"),
        ]
    )
    final = Response.model_validate(events[-1]["response"])
    assert [getattr(item, "arguments", None) for item in final.output] == ["{}", "{}"]


def test_a_failure_mid_item_is_an_error_event_then_a_failed_response() -> None:
    stream = ResponsesStream(parse_responses(codex_body()), request_id="r5")
    raw = (
        stream.start()
        + stream.chunk(GenerateChunk(text="par"))
        + stream.error(FrontendError(status=502, code="upstream_disconnected", message="gone"))
    )
    events = [
        json.loads(f.split("\n")[1].removeprefix("data: ")) for f in raw.decode().split("\n\n")[:-1]
    ]
    for event in events:
        EVENTS.validate_python(event)
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    failed = Response.model_validate(events[-1]["response"])
    assert failed.status == "failed" and failed.error is not None
    assert failed.output[0].type == "message" and failed.output[0].status == "incomplete"


RESPONSES_IGNORED = [
    # (extra body, labels): accepted, counted, and otherwise the same request
    ({"bogus": 1}, ("bogus",)),
    ({"tools": [{"type": "web_search", "bogus": 1}]}, ("tools[*].bogus", "tools[*]:web_search")),
    ({"text": {"other": 1}}, ("text.other",)),
    ({"reasoning": {"effort": "low", "context": "all_turns"}}, ("reasoning.context",)),
    ({"tools": [{**SHELL, "defer_loading": True}]}, ("tools[*].defer_loading",)),
    ({"tools": [SHELL, {"type": "tool_search", "execution": "client"}]}, ("tools[*]:tool_search",)),
    ({"store": False, "include": ["reasoning.encrypted_content"]}, ("store", "include")),
    ({"client_metadata": {"session_id": "s"}}, ()),  # a session source: read, not ignored
    ({"tools": [{**SHELL, "output_schema": {"type": "object"}}]}, ("tools[*].output_schema",)),
    (
        {
            "input": [
                {"role": "assistant", "content": "hi", "phase": "final_answer"},
                {"role": "user", "content": "x"},
            ]
        },
        ("input[*].phase",),
    ),
]


@pytest.mark.parametrize(
    ("extra", "labels"), [pytest.param(e, lb, id=str(lb)) for e, lb in RESPONSES_IGNORED]
)
def test_unknown_keys_and_no_ops_are_ignored_and_counted(
    extra: dict[str, Any], labels: tuple[str, ...]
) -> None:
    parsed = parse_responses({"model": "m", "input": "x", **extra})
    assert parsed.ignored == labels


def _namespace(name: str, *tools: dict[str, Any], description: str | None = None) -> dict[str, Any]:
    ns: dict[str, Any] = {"type": "namespace", "name": name, "tools": list(tools)}
    if description is not None:
        ns["description"] = description
    return ns


def test_namespaces_are_offered_flat_and_answered_with_their_namespace() -> None:
    """Codex's code mode: every tool in an ``additional_tools`` item, grouped in namespaces."""
    wait = {**SHELL, "name": "wait"}
    body = {
        "model": "m",
        "input": [
            {
                "type": "additional_tools",
                "id": "at_1",
                "role": "developer",
                "tools": [
                    _namespace("functions", APPLY_PATCH, wait),
                    _namespace(
                        "collaboration", {**SHELL, "name": "spawn_agent"}, description="Agents."
                    ),
                    _namespace("other", {**SHELL, "name": "wait"}),
                ],
            },
            {"type": "message", "role": "user", "content": "go"},
            _call(name="spawn_agent", namespace="collaboration", call_id="c1"),
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": "ok",
                "namespace": "collaboration",
            },
        ],
    }
    parsed = parse_responses(body)
    assert [t.name for t in parsed.tools] == [
        "apply_patch",
        "functionswait",
        "spawn_agent",
        "otherwait",
    ]
    assert parsed.tools[0].kind == "custom"
    assert parsed.tools[2].description == "Agents.\n\n" + str(SHELL["description"])
    assert parsed.messages[-2].tool_calls[0].name == "spawn_agent"
    assert parsed.tool_origin["otherwait"] == ("other", "wait")
    assert "functionswait" not in parsed.tool_origin  # the default namespace: called by name
    calls = [
        ToolCall(id="call_a", name="spawn_agent", arguments="{}"),
        ToolCall(id="call_b", name="apply_patch", arguments="*** Begin Patch", kind="custom"),
    ]
    result = Completion(text="\n\n", tool_calls=calls, finish_reason="tool_calls", usage=USAGE)
    raw = responses_response(parsed, result, request_id="r9")
    final = Response.model_validate(raw)
    # no whitespace-only message before the calls; each call names its namespace and own name
    assert [item.type for item in final.output] == ["function_call", "custom_tool_call"]
    assert (
        raw["output"][0]["namespace"] == "collaboration"
        and raw["output"][0]["name"] == "spawn_agent"
    )
    # code mode's plain tools sit in the default namespace and are called by name alone
    assert "namespace" not in raw["output"][1] and raw["output"][1]["name"] == "apply_patch"


def test_metric_labels_are_bounded_and_keep_tool_types() -> None:
    from kvretention.dataplane.frontend.compat import LabelBudget, field_label

    budget = LabelBudget(limit=2)
    assert field_label("input[12].tools[3]:tool_search") == "input[*].tools[*]:tool_search"
    assert field_label("messages.3.content.10.extra") == "messages.*.content.*.extra"
    assert budget.label("tools[*]:tool_search") == "tools[*]:tool_search"
    assert budget.label("a b") == "other"  # not a field path
    assert budget.label("store") == "store"
    assert budget.label("third") == "other"  # past the limit
    assert budget.label("store") == "store"  # a known one stays itself


@pytest.mark.parametrize(
    ("given", "strict"),
    [
        pytest.param({}, True, id="omitted"),
        pytest.param({"strict": None}, True, id="null"),
        pytest.param({"strict": True}, True, id="true"),
        pytest.param({"strict": False}, False, id="opted-out"),
    ],
)
def test_function_tools_are_strict_unless_they_opt_out(given: dict[str, Any], strict: bool) -> None:
    """OpenAI's rule for Responses (Chat Completions tools stay non-strict by default)."""
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}, **given}
    parsed = parse_responses({"model": "m", "input": "hi", "tools": [tool]})
    assert [t.strict for t in parsed.tools] == [strict]

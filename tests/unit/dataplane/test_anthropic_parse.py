"""Anthropic Messages bodies -> the neutral conversation: what is converted, and what is refused."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from kvretention.dataplane.breakpoints import find_markers
from kvretention.dataplane.frontend.anthropic import (
    NO_OPS,
    REFUSED,
    parse_count_tokens,
    parse_messages,
)
from kvretention.dataplane.protocol import (
    ChatMessage,
    ImagePart,
    Reasoning,
    ReasoningControl,
    ResponseFormat,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolDefinition,
)
from kvretention.hints.errors import ClientError, ClientErrorCode
from support.client_refusals import refused
from support.messages_body import messages_body

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "Weather now", "input_schema": SCHEMA}
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


def body(**extra: Any) -> dict[str, Any]:
    return messages_body(4096, **extra)


def test_a_tool_loop_converts_exactly() -> None:
    parsed = parse_messages(
        body(
            system=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            tools=[WEATHER],
            messages=[
                {"role": "user", "content": "weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "call it", "signature": "sig=="},
                        {"type": "text", "text": "Checking."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        },
                        {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "is_error": True,
                            "content": [
                                {"type": "text", "text": "no city"},
                                {"type": "image", "source": PNG},
                            ],
                        },
                        {"type": "text", "text": "and now?"},
                    ],
                },
            ],
        )
    )
    assert parsed.messages == [
        ChatMessage(role="system", content="a\nb"),
        ChatMessage(role="user", content="weather in Paris?"),
        ChatMessage(
            role="assistant",
            content="Checking.",
            reasoning=Reasoning(text="call it", signature="sig=="),
            tool_calls=[
                ToolCall(id="toolu_1", name="get_weather", arguments='{"city": "Paris"}'),
                ToolCall(id="toolu_2", name="get_weather", arguments="{}"),
            ],
        ),
        ChatMessage(role="tool", content="sunny", tool_call_id="toolu_1", name="get_weather"),
        ChatMessage(
            role="tool",
            content=[
                TextPart(text="no city"),
                ImagePart(url="data:image/png;base64,iVBORw0KGgo="),
            ],
            tool_call_id="toolu_2",
            name="get_weather",
            is_error=True,
        ),
        ChatMessage(role="user", content="and now?"),
    ]
    assert parsed.tools == [
        ToolDefinition(name="get_weather", description="Weather now", parameters=SCHEMA)
    ]
    assert parsed.tool_choice == ToolChoice(mode="auto")
    assert parsed.parallel_tool_calls is True


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        pytest.param({"type": "auto"}, ToolChoice(mode="auto"), True, id="auto"),
        pytest.param({"type": "any"}, ToolChoice(mode="required"), True, id="any"),
        pytest.param(
            {"type": "tool", "name": "get_weather"},
            ToolChoice(mode="named", name="get_weather"),
            True,
            id="tool",
        ),
        pytest.param({"type": "none"}, ToolChoice(mode="none"), True, id="none"),
        pytest.param(
            {"type": "any", "disable_parallel_tool_use": True},
            ToolChoice(mode="required"),
            False,
            id="any_single",
        ),
        pytest.param(
            {"type": "auto", "disable_parallel_tool_use": True},
            ToolChoice(mode="auto"),
            False,
            id="auto_single",
        ),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: ToolChoice, parallel: bool) -> None:
    parsed = parse_messages(body(tools=[WEATHER], tool_choice=choice))
    assert parsed.tool_choice == expected
    assert parsed.parallel_tool_calls is parallel


def _after_tool_use(*blocks: dict[str, Any]) -> dict[str, Any]:
    """Fields of a turn that answers the assistant's ``TOOL_USE`` with a user message of ``blocks``."""
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [TOOL_USE]},
        {"role": "user", "content": list(blocks)},
    ]
    return {"tools": [READ_TOOL], "messages": messages}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({}, None, id="absent"),
        pytest.param(
            {"thinking": {"type": "enabled", "budget_tokens": 2048}},
            ReasoningControl(enabled=True, budget_tokens=2048),
            id="enabled",
        ),
        pytest.param(
            {"thinking": {"type": "adaptive"}}, ReasoningControl(enabled=True), id="adaptive"
        ),
        pytest.param(
            {"thinking": {"type": "disabled"}}, ReasoningControl(enabled=False), id="disabled"
        ),
        pytest.param(
            {"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}},
            ReasoningControl(enabled=True, effort="high"),
            id="adaptive_max_effort",
        ),
        pytest.param(
            {"output_config": {"effort": "low"}},
            ReasoningControl(effort="low"),
            id="effort_only",
        ),
    ],
)
def test_thinking_and_effort(fields: dict[str, Any], expected: ReasoningControl | None) -> None:
    assert parse_messages(body(**fields)).reasoning == expected


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param(
            {"thinking": {"type": "adaptive"}, "tool_choice": {"type": "auto"}}, id="thinking-auto"
        ),
        pytest.param(
            {"thinking": {"type": "disabled"}, "tool_choice": {"type": "any"}}, id="disabled-any"
        ),
        pytest.param(
            {"output_config": {"effort": "low"}, "tool_choice": {"type": "any"}}, id="effort-any"
        ),
    ],
)
def test_a_forced_tool_call_is_refused_only_with_thinking_on(fields: dict[str, Any]) -> None:
    """Anthropic refuses thinking with a forced call; effort alone or thinking off is fine."""
    parsed = parse_messages(body(tools=[WEATHER], **fields))
    assert parsed.tool_choice.mode in ("auto", "required")


def test_structured_output_and_images() -> None:
    parsed = parse_messages(
        body(
            output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}},
                        {"type": "image", "source": PNG},
                        {
                            "type": "document",
                            "title": "T",
                            "source": {"type": "text", "media_type": "text/plain", "data": "doc"},
                        },
                    ],
                }
            ],
        )
    )
    assert parsed.response_format == ResponseFormat(type="json_schema", json_schema=SCHEMA)
    assert parsed.messages == [
        ChatMessage(
            role="user",
            content=[
                ImagePart(url="https://x/a.png"),
                ImagePart(url="data:image/png;base64,iVBORw0KGgo="),
                TextPart(text="T\ndoc"),
            ],
        )
    ]


def test_redacted_thinking_and_system_role_messages() -> None:
    parsed = parse_messages(
        body(
            messages=[
                {"role": "system", "content": "late system"},
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [{"type": "redacted_thinking", "data": "opaque"}],
                },
                {"role": "user", "content": "q2"},
            ]
        )
    )
    assert parsed.messages[0] == ChatMessage(role="system", content="late system")
    assert parsed.messages[2].reasoning == Reasoning(encrypted=True)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"metadata": {"user_id": "u-1"}}, id="metadata"),
        pytest.param({"service_tier": "auto"}, id="service_tier"),
        pytest.param({"speed": "fast"}, id="speed"),
        pytest.param({"inference_geo": "us"}, id="inference_geo"),
        pytest.param(
            {"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}},
            id="context_management_keep_all",
        ),
    ],
)
def test_documented_no_ops_change_nothing(fields: dict[str, Any]) -> None:
    assert set(fields) <= set(NO_OPS)
    plain = parse_messages(body())
    parsed = parse_messages(body(**fields))
    assert dataclasses.replace(parsed, ignored=()) == plain
    # counted as ignored, except metadata, which the frontend reads for the session
    assert parsed.ignored == tuple(k for k in fields if k != "metadata")


_TEXT = {"type": "text", "text": "hi"}
IGNORED = [
    # (fields, the ignored field's label): accepted, counted, and the request is otherwise the same
    ({"frobnicate": 1}, "frobnicate"),
    ({"diagnostics": {"cache_miss": True}}, "diagnostics"),
    ({"fallbacks": [{"model": "other"}]}, "fallbacks"),
    ({"tools": [{**WEATHER, "nope": 1}]}, "tools.*.nope"),
    ({"tools": [{**WEATHER, "input_examples": [{"city": "Paris"}]}]}, "tools.*.input_examples"),
    ({"metadata": {"user_id": "u", "email": "x"}}, "metadata.email"),
    ({"tools": [{**WEATHER, "allowed_callers": ["direct"]}]}, "tools.*.allowed_callers"),
    (
        {"messages": [{"role": "user", "content": [{**_TEXT, "citations": [{"type": "x"}]}]}]},
        "messages.*.content.*.citations",
    ),
    (
        {"messages": [{"role": "user", "content": [{**_TEXT, "extra": 1}]}]},
        "messages.*.content.*.extra",
    ),
    ({"messages": [{"role": "user", "content": "hi", "name": "n"}]}, "messages.*.name"),
    (
        {
            "messages": [
                {"role": "user", "content": "hi", "output_config": {"effort": "low"}},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "hi"},
            ]
        },
        "messages.*.output_config",
    ),
]


@pytest.mark.parametrize(
    ("fields", "label"), [pytest.param(f, label, id=label) for f, label in IGNORED]
)
def test_unknown_keys_are_ignored_and_counted(fields: dict[str, Any], label: str) -> None:
    """Keys are open (compat's rule): an unknown key changes nothing and is named once."""
    parsed = parse_messages(body(**fields))
    assert parsed.ignored == (label,)
    without = {
        k: v for k, v in fields.items() if k not in ("frobnicate", "diagnostics", "fallbacks")
    }
    plain = parse_messages(body(**without)) if without != fields else None
    if plain is not None and "output_config" not in label:
        assert dataclasses.replace(parsed, ignored=()).messages == plain.messages


def test_null_unknown_keys_carry_nothing() -> None:
    assert parse_messages(body(frobnicate=None)).ignored == ()


def test_the_last_messages_output_config_sets_the_turns_effort() -> None:
    """Claude Code puts the turn's effort on a trailing system message."""
    turn = {"role": "system", "content": "s", "output_config": {"effort": "low"}}
    parsed = parse_messages(
        body(output_config={"effort": "high"}, messages=[{"role": "user", "content": "hi"}, turn])
    )
    assert parsed.reasoning == ReasoningControl(effort="low")
    assert parsed.ignored == ()
    with pytest.raises(ClientError) as info:
        parse_messages(body(messages=[{**turn, "output_config": {"effort": "extreme"}}]))
    assert info.value.param == "messages.0.output_config.effort"


def _refused(fields: dict[str, Any], *, count: bool = False) -> ClientError:
    return refused(lambda: (parse_count_tokens if count else parse_messages)(body(**fields)))


def _msgs(*content: Any, role: str = "user") -> dict[str, Any]:
    return {"messages": [{"role": role, "content": list(content)}]}


REFUSALS = [
    # (fields, param, code)
    ({"output_format": {"type": "json_schema"}}, "output_format", "unsupported_parameter"),
    ({"container": "c"}, "container", "unsupported_parameter"),
    ({"mcp_servers": []}, "mcp_servers", "unsupported_parameter"),
    (
        {"tools": [{"type": "bash_20250124", "name": "bash"}]},
        "tools.0.type",
        "unsupported_parameter",
    ),
    (
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "tools.0.type",
        "unsupported_parameter",
    ),
    ({"tools": [{"name": "t"}]}, "tools.0.input_schema", "missing_required_parameter"),
    (
        {"tools": [{"name": "t", "input_schema": {"type": "array"}}]},
        "tools.0.input_schema.type",
        "invalid_value",
    ),
    ({"tools": [WEATHER, WEATHER]}, "tools.1.name", "invalid_value"),
    ({"tool_choice": {"type": "any"}}, "tool_choice", "invalid_value"),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"}},
        "tool_choice.name",
        "invalid_value",
    ),
    ({"tools": [WEATHER], "tool_choice": {"type": "maybe"}}, "tool_choice.type", "invalid_value"),
    (
        {"thinking": {"type": "enabled", "budget_tokens": 512}},
        "thinking.enabled.budget_tokens",
        "invalid_value",
    ),
    ({"thinking": {"type": "enabled", "budget_tokens": 4096}}, "max_tokens", "invalid_value"),
    (
        {"thinking": {"type": "enabled"}},
        "thinking.enabled.budget_tokens",
        "missing_required_parameter",
    ),
    ({"thinking": {"type": "between_tools"}}, "thinking.type", "unsupported_parameter"),
    (
        {
            "max_tokens": 2048,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "tools": [WEATHER],
            "tool_choice": {"type": "any"},
        },
        "tool_choice",
        "invalid_value",
    ),
    (
        {
            "thinking": {"type": "adaptive"},
            "tools": [WEATHER],
            "tool_choice": {"type": "tool", "name": WEATHER["name"]},
        },
        "tool_choice",
        "invalid_value",
    ),
    ({"thinking": {"type": "sometimes"}}, "thinking.type", "invalid_value"),
    (
        {"output_config": {"format": {"type": "json_object"}}},
        "output_config.format.type",
        "invalid_value",
    ),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort", "invalid_value"),
    ({"service_tier": "priority"}, "service_tier", "invalid_value"),
    (
        {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
        "context_management.edits.0",
        "unsupported_parameter",
    ),
    (
        _msgs(
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": "x"},
            }
        ),
        "messages.0.content.0.source.type",
        "unsupported_parameter",
    ),
    (
        _msgs({"type": "image", "source": {"type": "file", "file_id": "f"}}),
        "messages.0.content.0.source.type",
        "unsupported_parameter",
    ),
    (
        _msgs({"type": "image", "source": {**PNG, "media_type": "image/tiff"}}),
        "messages.0.content.0.source.media_type",
        "invalid_value",
    ),
    (_msgs({"type": "search_result"}), "messages.0.content.0.type", "unsupported_parameter"),
    (
        _msgs({"type": "tool_use", "id": "t", "name": "n", "input": {}}),
        "messages.0.content.0.type",
        "unsupported_parameter",
    ),
    (
        _msgs({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "search_result"}]}),
        "messages.0.content.0.content.0.type",
        "unsupported_parameter",
    ),
    (
        _msgs(
            {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
            role="assistant",
        ),
        "messages.0.content.0.type",
        "unsupported_parameter",
    ),
    (
        _msgs({"type": "tool_use", "id": "t", "name": "n", "input": "{}"}, role="assistant"),
        "messages.0.content.0.input",
        "invalid_type",
    ),
    (
        _msgs({"type": "thinking", "thinking": "x"}, role="assistant"),
        "messages.0.content.0.signature",
        "missing_required_parameter",
    ),
    ({"system": [{"type": "image", "source": PNG}]}, "system.0.type", "unsupported_parameter"),
]


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [pytest.param(f, p, c, id=p + "-" + c) for f, p, c in REFUSALS],
)
def test_refusals_name_the_field(fields: dict[str, Any], param: str, code: str) -> None:
    err = _refused(fields)
    assert err.param == param
    assert err.code == ClientErrorCode(code)
    assert err.message.startswith(f"{param}: ")


def test_every_refused_top_level_field_is_named() -> None:
    for key in REFUSED:
        err = _refused({key: {}})
        assert err.param == key and key in err.message


def test_count_tokens_takes_the_prompt_fields_only() -> None:
    parsed = parse_count_tokens(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [WEATHER],
            "thinking": {"type": "enabled", "budget_tokens": 100_000},
            "cache_control": {"type": "ephemeral"},
        }
    )
    assert parsed.tools[0].name == "get_weather"
    assert parsed.envelope is None  # counting prefills nothing, so nothing is retained
    assert parsed.reasoning == ReasoningControl(enabled=True, budget_tokens=100_000)
    not_counted: dict[str, Any] = {"max_tokens": 1, "stream": True, "metadata": {"user_id": "u"}}
    for field, value in not_counted.items():  # not count parameters: ignored
        counted = parse_count_tokens(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], field: value}
        )
        assert counted.ignored == (field,)
    with pytest.raises(ClientError) as info:
        parse_count_tokens(
            {"model": "m", "messages": [{"role": "user", "content": "x", "cache_control": {}}]}
        )
    assert info.value.param == "messages.0.cache_control"


def test_block_level_cache_control_is_refused_first_in_reject_mode() -> None:
    """``breakpoints: reject`` (v1): the hint normalizer refuses a block's control before anything."""
    with pytest.raises(ClientError) as info:
        parse_messages(
            body(system=[{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]),
            breakpoints="reject",
        )
    assert info.value.param == "system.0.cache_control"


EPH = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
DOC = {"type": "text", "media_type": "text/plain", "data": "notes"}
BP_IMAGE = {"type": "base64", "media_type": "image/png", "data": "AA=="}
TOOL_USE = {"type": "tool_use", "id": "tu1", "name": "Read", "input": {"p": "a"}}
READ_TOOL = {"name": "Read", "input_schema": {"type": "object"}}


def _marked(parsed: Any) -> list[tuple[str, int]]:
    """``(element, ttl)`` for every ``retain_ttl`` on the neutral conversation, in order."""
    return [(m.element, m.ttl_seconds) for m in find_markers(parsed.messages, parsed.tools)]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param(
            {
                "system": [
                    {"type": "text", "text": "a"},
                    {"type": "text", "text": "b", "cache_control": HOUR},
                ]
            },
            [("messages[0].content[1]", 3600)],
            id="system_block",
        ),
        pytest.param(
            {"tools": [{**READ_TOOL, "cache_control": EPH}]},
            [("tools[0]", 300)],
            id="tool_definition",
        ),
        pytest.param(
            _msgs(
                {"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": EPH}
            ),
            [("messages[0].content[1]", 300)],
            id="text_block",
        ),
        pytest.param(
            _msgs({"type": "image", "source": BP_IMAGE, "cache_control": EPH}),
            [("messages[0].content[0]", 300)],
            id="image_block",
        ),
        pytest.param(
            _msgs({"type": "document", "source": DOC, "cache_control": EPH}),
            [("messages[0].content[0]", 300)],
            id="document_block",
        ),
        pytest.param(
            {
                "tools": [READ_TOOL],
                "messages": [
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": [{**TOOL_USE, "cache_control": EPH}]},
                ],
            },
            [("messages[1].tool_calls[0]", 300)],
            id="tool_use_block",
        ),
        pytest.param(
            _after_tool_use(
                {
                    "type": "tool_result",
                    "tool_use_id": "tu1",
                    "content": "x",
                    "cache_control": HOUR,
                },
                {"type": "text", "text": "next", "cache_control": EPH},
            ),
            [("messages[2]", 3600), ("messages[3].content[0]", 300)],
            id="tool_result_then_text",
        ),
        pytest.param(
            _after_tool_use(
                {
                    "type": "tool_result",
                    "tool_use_id": "tu1",
                    "content": [
                        {"type": "text", "text": "a", "cache_control": EPH},
                        {"type": "text", "text": "b"},
                    ],
                }
            ),
            [("messages[2].content[0]", 300)],
            id="nested_tool_result_block",
        ),
        pytest.param(
            {"cache_control": EPH},
            [],
            id="top_level_only",
        ),
    ],
)
def test_prefix_mode_marks_the_element_made_from_each_block(
    fields: dict[str, Any], expected: list[tuple[str, int]]
) -> None:
    """Each block-level breakpoint lands on exactly the neutral element made from its block, and
    the envelope announces as many as the conversation carries."""
    parsed = parse_messages(body(**fields))
    assert _marked(parsed) == expected
    assert parsed.envelope is not None
    assert parsed.envelope.prefix_count == len(expected)


def test_marked_text_blocks_render_as_the_joined_string_would() -> None:
    """A block kept as a separate part for its breakpoint renders exactly as the joined text, so a
    marker never changes the prompt (the next turn, marked elsewhere, shares the prefix)."""
    blocks = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    plain = parse_messages(body(system=blocks))
    marked = parse_messages(body(system=[blocks[0], {**blocks[1], "cache_control": EPH}]))
    assert plain.messages[0].content == "a\nb"
    assert marked.messages[0].text() == plain.messages[0].content
    assert isinstance(marked.messages[0].content, list)


def test_tool_use_arguments_keep_unicode() -> None:
    parsed = parse_messages(
        body(
            messages=[
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {"q": "é"}}],
                }
            ]
        )
    )
    assert json.loads(parsed.messages[0].tool_calls[0].arguments) == {"q": "é"}
    assert "é" in parsed.messages[0].tool_calls[0].arguments


def test_deferred_tools_stay_out_of_the_prompt_until_a_tool_reference_loads_them() -> None:
    """Claude Code's tool search: ToolSearch is its own tool; a ``tool_reference`` in its result
    brings the deferred tool's definition into the conversation, where the model reads it."""
    cron = {"name": "CronCreate", "description": "Schedule", "input_schema": SCHEMA}
    placeholder = {"name": "DeferredToolPlaceholder", "input_schema": {"type": "object"}}
    search = {"name": "ToolSearch", "input_schema": {"type": "object"}}
    ref = {"type": "tool_reference", "tool_name": "CronCreate"}
    parsed = parse_messages(
        body(
            tools=[search, {**placeholder, "defer_loading": True}, {**cron, "defer_loading": True}],
            messages=[
                {"role": "user", "content": "schedule it"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "t1", "name": "ToolSearch", "input": {}}
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [ref]}],
                },
            ],
        )
    )
    assert [t.name for t in parsed.tools] == ["ToolSearch"]
    assert [t.name for t in parsed.deferred_tools] == ["DeferredToolPlaceholder", "CronCreate"]
    loaded = parsed.messages[-1]
    assert loaded.role == "tool" and loaded.content == (
        "<functions>\n<function>"
        + json.dumps({"description": "Schedule", "name": "CronCreate", "parameters": SCHEMA})
        + "</function>\n</functions>"
    )
    with pytest.raises(ClientError) as info:
        parse_messages(
            body(
                tools=[search],
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [ref]}],
                    }
                ],
            )
        )
    assert info.value.param == "messages.0.content.0.content.0.tool_name"


def test_thinking_display_updates_returns_the_thinking() -> None:
    parsed = parse_messages(body(thinking={"type": "adaptive", "display": "updates"}))
    assert parsed.reasoning == ReasoningControl(enabled=True)
    assert "omit_thinking" not in parsed.echo


def test_mid_conversation_tool_changes_load_and_retire_tools() -> None:
    """The ``mid-conversation-tool-changes`` beta Claude Code 2.1.328 announces: a system message
    of ``tool_addition`` / ``tool_removal`` blocks (the Anthropic SDK's tool runner shape)."""
    cron = {"name": "CronCreate", "description": "Schedule", "input_schema": SCHEMA}
    change = {
        "role": "system",
        "content": [
            {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": cron}},
            {
                "type": "tool_addition",
                "tool": {"type": "tool_reference", "name": "get_weather"},
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "Old"}},
        ],
    }
    parsed = parse_messages(
        body(
            tools=[{**WEATHER, "defer_loading": True}],
            messages=[{"role": "user", "content": "hi"}, change, {"role": "user", "content": "go"}],
        )
    )
    assert [t.name for t in parsed.deferred_tools] == ["get_weather", "CronCreate"]
    system = parsed.messages[1]
    assert system.role == "system" and isinstance(system.content, list)
    texts = [p.text for p in system.content if isinstance(p, TextPart)]
    assert texts[0].startswith("<functions>\n<function>") and '"name": "CronCreate"' in texts[0]
    assert '"name": "get_weather"' in texts[1] and system.content[1].retain_ttl == 300
    assert texts[2] == "The tool Old is no longer available."
    with pytest.raises(ClientError) as info:
        parse_messages(
            body(
                messages=[
                    {
                        "role": "system",
                        "content": [
                            {
                                "type": "tool_addition",
                                "tool": {"type": "tool_reference", "name": "x"},
                            }
                        ],
                    }
                ]
            )
        )
    assert info.value.param == "messages.0.content.0.tool.name"

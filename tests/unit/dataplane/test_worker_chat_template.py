"""The neutral conversation as chat-template input (pure), and rendered with a real template."""

from __future__ import annotations

from typing import Any

import pytest

from kvretention.dataplane.chat_template import render_and_encode
from kvretention.dataplane.protocol import (
    ChatMessage,
    ReasoningControl,
    ToolChoice,
    ToolDefinition,
)
from kvretention.dataplane.template_input import (
    TemplateInputError,
    build_template_input,
    build_template_kwargs,
    build_template_message,
    build_tool_schema,
    offered_tools,
    template_has_developer_role,
)

WEATHER = ToolDefinition(
    name="get_weather",
    description="Weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
PATCH = ToolDefinition(kind="custom", name="apply_patch", description="Apply a patch.")


def _msg(**fields: Any) -> ChatMessage:
    return ChatMessage.model_validate(fields)


@pytest.mark.parametrize(
    ("message", "developer_role", "expected", "images"),
    [
        ({"role": "user", "content": "hi"}, False, {"role": "user", "content": "hi"}, []),
        (
            {"role": "developer", "content": "rules"},
            False,
            {"role": "system", "content": "rules"},
            [],
        ),
        (
            {"role": "developer", "content": "rules"},
            True,
            {"role": "developer", "content": "rules"},
            [],
        ),
        (
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            False,
            {"role": "user", "content": "a\nb"},
            [],
        ),
        (
            {
                "role": "user",
                "content": [
                    {"type": "image", "url": "data:image/png;base64,AAAA"},
                    {"type": "text", "text": "what is it?"},
                ],
            },
            False,
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "text", "text": "what is it?"}],
            },
            ["data:image/png;base64,AAAA"],
        ),
        (
            {
                "role": "assistant",
                "content": "Checking.",
                "reasoning": {"text": "need weather", "signature": "sig"},
                "tool_calls": [
                    {"id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
                ],
            },
            False,
            {
                "role": "assistant",
                "content": "Checking.",
                "reasoning_content": "need weather",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    }
                ],
            },
            [],
        ),
        (
            {"role": "assistant", "reasoning": {"encrypted": True}, "content": "ok"},
            False,
            {"role": "assistant", "content": "ok"},
            [],
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c2",
                        "name": "apply_patch",
                        "arguments": "*** Begin Patch",
                        "kind": "custom",
                    },
                    {"id": "c3", "name": "get_weather", "arguments": ""},
                ],
            },
            False,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {
                            "name": "apply_patch",
                            "arguments": {"input": "*** Begin Patch"},
                        },
                    },
                    {
                        "id": "c3",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {}},
                    },
                ],
            },
            [],
        ),
        (
            {
                "role": "tool",
                "tool_call_id": "c1",
                "name": "get_weather",
                "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "21C"}],
            },
            False,
            {"role": "tool", "content": "sunny\n21C", "tool_call_id": "c1", "name": "get_weather"},
            [],
        ),
        (
            {"role": "tool", "tool_call_id": "c1", "content": "no such city", "is_error": True},
            False,
            {"role": "tool", "content": "Error: no such city", "tool_call_id": "c1"},
            [],
        ),
        (
            {
                "role": "tool",
                "tool_call_id": "c9",
                "content": [{"type": "image", "url": "https://example.test/a.png"}],
            },
            False,
            {"role": "tool", "content": [{"type": "image"}], "tool_call_id": "c9"},
            ["https://example.test/a.png"],
        ),
    ],
)
def test_message_conversion(
    message: dict[str, Any], developer_role: bool, expected: dict[str, Any], images: list[str]
) -> None:
    found: list[str] = []
    out = build_template_message(_msg(**message), found, index=0, developer_role=developer_role)
    assert out == expected
    assert found == images


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ("{not json", "valid JSON"),
        ("[1, 2]", "JSON object"),
        ('"text"', "JSON object"),
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "too deeply"),  # a RecursionError
    ],
)
def test_history_arguments_that_are_not_a_json_object_are_refused(
    arguments: str, error: str
) -> None:
    msg = _msg(role="assistant", tool_calls=[{"id": "c1", "name": "f", "arguments": arguments}])
    with pytest.raises(TemplateInputError, match=error) as info:
        build_template_input([msg])
    assert info.value.param == "messages.0.tool_calls.0.arguments"


@pytest.mark.parametrize(
    ("choice", "names"),
    [
        (ToolChoice(), ["get_weather", "apply_patch"]),
        (ToolChoice(mode="required"), ["get_weather", "apply_patch"]),
        (ToolChoice(mode="none"), []),
        (ToolChoice(mode="named", name="apply_patch"), ["apply_patch"]),
    ],
)
def test_offered_tools_follow_tool_choice(choice: ToolChoice, names: list[str]) -> None:
    assert [t.name for t in offered_tools([WEATHER, PATCH], choice)] == names
    tools = build_template_input([], tools=[WEATHER, PATCH], tool_choice=choice).tools
    assert [t["function"]["name"] for t in tools or []] == names


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        (
            WEATHER,
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather for a city.",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            },
        ),
        (
            ToolDefinition(name="noop", strict=True),
            {
                "type": "function",
                "function": {
                    "name": "noop",
                    "parameters": {"type": "object", "properties": {}},
                    "strict": True,
                },
            },
        ),
        (
            PATCH,
            {
                "type": "function",
                "function": {
                    "name": "apply_patch",
                    "description": "Apply a patch.",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "input": {
                                "type": "string",
                                "description": "The tool's free-form input.",
                            }
                        },
                        "required": ["input"],
                    },
                },
            },
        ),
    ],
)
def test_tool_schema(tool: ToolDefinition, expected: dict[str, Any]) -> None:
    assert build_tool_schema(tool) == expected


def test_custom_tool_grammar_is_described_in_its_input() -> None:
    tool = ToolDefinition.model_validate(
        {"kind": "custom", "name": "p", "grammar": {"syntax": "lark", "definition": "start: X"}}
    )
    described = build_tool_schema(tool)["function"]["parameters"]["properties"]["input"]
    assert "lark grammar" in described["description"]
    assert "start: X" in described["description"]


@pytest.mark.parametrize(
    ("reasoning", "expected"),
    [
        (None, {}),
        (ReasoningControl(), {"enable_thinking": True, "thinking": True}),
        (ReasoningControl(enabled=False), {"enable_thinking": False, "thinking": False}),
        (
            ReasoningControl(effort="high", budget_tokens=1024),
            {"enable_thinking": True, "thinking": True, "reasoning_effort": "high"},
        ),
    ],
)
def test_reasoning_becomes_template_kwargs(
    reasoning: ReasoningControl | None, expected: dict[str, Any]
) -> None:
    assert build_template_kwargs(reasoning) == expected


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (None, False),
        ("{{ messages }}", False),
        ("{% if message.role == 'developer' %}", True),
        ('{% if m.role == "developer" %}', True),
    ],
)
def test_developer_role_detection(template: str | None, expected: bool) -> None:
    assert template_has_developer_role(template) is expected


# -- rendered with a real tokenizer and a real tool-aware template --------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from support.chat_tokenizer import build_tokenizer

    return build_tokenizer()


def test_tools_history_and_results_render_with_the_models_template(tokenizer: Any) -> None:
    conversation = [
        _msg(role="developer", content="Be brief."),
        _msg(role="user", content="Weather in Paris?"),
        _msg(
            role="assistant",
            content="",
            tool_calls=[{"id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'}],
        ),
        _msg(role="tool", tool_call_id="c1", content="sunny"),
    ]
    rendered = render_and_encode(tokenizer, conversation, tools=[WEATHER])
    assert rendered.text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '"name": "get_weather"' in rendered.text.split("\n</tools>")[0]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in (
        rendered.text
    )
    assert "<tool_response>\nsunny\n</tool_response>" in rendered.text
    assert rendered.text.endswith("<|im_start|>assistant\n")
    assert rendered.token_ids == tokenizer.encode(rendered.text, add_special_tokens=False)
    assert tokenizer.decode(rendered.token_ids) == rendered.text


def test_thinking_off_closes_an_empty_think_block(tokenizer: Any) -> None:
    conversation = [_msg(role="user", content="hi")]
    off = render_and_encode(tokenizer, conversation, reasoning=ReasoningControl(enabled=False))
    default = render_and_encode(tokenizer, conversation)
    assert off.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert default.text.endswith("<|im_start|>assistant\n")


def test_images_become_template_placeholders_and_image_urls(tokenizer: Any) -> None:
    conversation = [
        _msg(
            role="user",
            content=[
                {"type": "image", "url": "data:image/png;base64,AAAA"},
                {"type": "text", "text": "what is it?"},
            ],
        )
    ]
    rendered = render_and_encode(tokenizer, conversation)
    assert "<|vision_start|><|image_pad|><|vision_end|>what is it?" in rendered.text
    assert rendered.image_urls == ["data:image/png;base64,AAAA"]


def test_a_template_error_is_the_requests_fault() -> None:
    class Raising:
        chat_template = "x"

        def apply_chat_template(self, *args: Any, **kwargs: Any) -> str:
            raise RuntimeError("Conversation roles must alternate")

    with pytest.raises(TemplateInputError, match="roles must alternate"):
        render_and_encode(Raising(), [_msg(role="user", content="a")])


def test_frontend_tokenizer_gives_the_worker_the_same_tokens(tokenizer: Any) -> None:
    from kvretention.dataplane.frontend.tokenizer import HfChatTokenizer
    from kvretention.dataplane.protocol import PreprocessedRequest
    from kvretention.dataplane.worker.call import build_engine_prompt

    request = PreprocessedRequest.model_validate(
        {
            "request_id": "r",
            "model": "m",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "hi"},
            ],
            "tools": [WEATHER.model_dump()],
            "tool_choice": {"mode": "required"},
            "reasoning": {"enabled": False},
        }
    )
    frontend = HfChatTokenizer(tokenizer)
    ids = frontend.encode_request(request)
    assert ids == build_engine_prompt(request, tokenizer=tokenizer).input_ids
    assert ids is not None and '"get_weather"' in tokenizer.decode(ids)
    assert frontend.encode_chat(request.messages or []) != ids  # no tools, no thinking switch
    with_image = request.model_copy(
        update={
            "messages": [
                ChatMessage.model_validate(
                    {
                        "role": "user",
                        "content": [{"type": "image", "url": "https://example.test/i.png"}],
                    }
                )
            ]
        }
    )
    assert frontend.encode_request(with_image) is None

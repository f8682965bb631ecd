"""The parser surface the worker relies on is the one sglang 0.5.23 ships.

The worker imports SGLang's own ``FunctionCallParser`` and ``ReasoningParser`` (never copies of
them) and calls a handful of their entry points; these tests pin those names and signatures, and
that the parser families the operator exposes (``spec.model.toolCallParser`` /
``reasoningParser``) are accepted at worker start.
"""

from __future__ import annotations

import inspect

import pytest

from kvretention.dataplane.worker.parsing import (
    ParserNames,
    check_parser_names,
    reasoning_parser_names,
    tool_call_parser_names,
)

pytestmark = pytest.mark.engine

TOOL_PARSERS = ["qwen25", "qwen3_coder", "llama3", "deepseekv3", "kimi_k2", "glm45", "gpt-oss"]
REASONING_PARSERS = ["qwen3", "deepseek-r1", "gpt-oss", "kimi_k2", "glm45"]


@pytest.mark.parametrize("name", TOOL_PARSERS)
def test_documented_tool_call_parsers_are_accepted(name: str) -> None:
    assert name in tool_call_parser_names()
    check_parser_names(ParserNames(tool_call_parser=name))


@pytest.mark.parametrize("name", REASONING_PARSERS)
def test_documented_reasoning_parsers_are_accepted(name: str) -> None:
    assert name in reasoning_parser_names()
    check_parser_names(ParserNames(reasoning_parser=name))


def _params(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def test_function_call_parser_entry_points() -> None:
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    assert _params(FunctionCallParser.__init__)[:3] == ["self", "tools", "tool_call_parser"]
    assert "tool_choice" in _params(FunctionCallParser.__init__)
    assert _params(FunctionCallParser.get_structure_constraint) == [
        "self",
        "tool_choice",
        "parallel_tool_calls",
        "thinking_mode",
    ]
    for method in ("parse_stream_chunk", "parse_stream_end", "parse_non_stream", "has_tool_call"):
        assert callable(getattr(FunctionCallParser, method))
    assert callable(FunctionCallParser.owns_tool_format)


def test_reasoning_parser_entry_points() -> None:
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    params = _params(ReasoningParser.__init__)
    for name in ("model_type", "stream_reasoning", "force_reasoning", "tool_call_parser_active"):
        assert name in params
    for method in ("parse_stream_chunk", "parse_stream_end", "parse_non_stream"):
        assert callable(getattr(ReasoningParser, method))


def test_required_choice_helpers() -> None:
    from sglang.srt.function_call.json_array_parser import JsonArrayParser
    from sglang.srt.function_call.utils import get_json_schema_constraint

    assert _params(get_json_schema_constraint) == ["tools", "tool_choice", "parallel_tool_calls"]
    assert callable(JsonArrayParser().parse_streaming_increment)
    assert callable(JsonArrayParser.finish)


def test_async_generate_takes_image_data() -> None:
    from kvretention.dataplane.worker.sglang_source import async_generate_params, locate_sglang

    root = locate_sglang()
    assert root is not None
    params = async_generate_params(root)
    assert params is not None
    assert "image_data" in [p.name for p in params]

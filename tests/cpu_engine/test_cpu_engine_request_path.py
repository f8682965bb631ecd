"""The whole request path on SGLang's real engine: official SDKs -> frontend -> router -> worker ->
``sglang.Engine`` on CPU with the project's tiny model.

The model's text is noise, so each test asserts what the engine must get right whatever it says:
the providers' shapes, token counts, SGLang's own ``cached_tokens`` for a repeated prefix, tool calls
that SGLang's constraint forced and its ``qwen25`` parser parsed, and that no ``sgl_kernel`` shim
function was called while serving.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest

from support.cpu_engine import SERVED_NAME, CpuWorker, start_cpu_worker
from support.processes import KvrProcess, StartKvretention

pytestmark = pytest.mark.cpu_engine

SYSTEM = (
    "You are a helpful assistant. Read the file, answer the question, tell me what the cache "
    "prefix token retention radix tree engine server request reply model is. "
) * 3
OPENING = 8
"""Tokens every prompt shares whatever it says (the chat format's opening ``<|im_start|>system``)."""
WEATHER_TOOL: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
}


@dataclass
class Fleet:
    worker: CpuWorker
    router: KvrProcess
    frontend: KvrProcess
    openai: openai.OpenAI
    anthropic: anthropic.Anthropic


@pytest.fixture(scope="module")
def fleet(start: StartKvretention, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("cpu-fleet")
    worker = start_cpu_worker(
        start, tmp, sglang_args=["--max-total-tokens", "16384", "--context-length", "8192"]
    )
    router = start(["router", "--worker", worker.base_url, "--health-interval", "0.3"])
    frontend = start(["frontend", "--router-url", router.base_url, "--model", SERVED_NAME])
    yield Fleet(
        worker=worker,
        router=router,
        frontend=frontend,
        openai=openai.OpenAI(
            base_url=frontend.base_url + "/v1", api_key="unused", max_retries=0, timeout=120
        ),
        anthropic=anthropic.Anthropic(
            base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=120
        ),
    )
    assert worker.shim_functions_called() == [], "serving called an sgl_kernel shim function"


def nonce() -> str:
    return f"question {uuid.uuid4().hex[:12]}"


def test_the_worker_serves_sglangs_real_engine_on_cpu(fleet: Fleet) -> None:
    with urllib.request.urlopen(fleet.worker.base_url + "/v1/info", timeout=5) as resp:
        info = json.load(resp)
    assert info["engine"] == "sglang-0.5.23"
    assert info["device"] == "cpu"
    assert info["dialect"] == "versioned"
    assert fleet.worker.shim_functions_called() == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_openai_chat_second_turn_reads_its_prefix_from_sglangs_radix_cache(
    fleet: Fleet, stream: bool
) -> None:
    system = nonce() + " " + SYSTEM
    cached: list[int] = []
    for turn in ("first turn", "second turn"):
        kwargs: dict[str, Any] = {
            "model": SERVED_NAME,
            "max_tokens": 4,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": turn},
            ],
            "prompt_cache_options": {"mode": "implicit"},
        }
        if stream:
            chunks = list(
                fleet.openai.chat.completions.create(
                    stream=True, stream_options={"include_usage": True}, **kwargs
                )
            )
            usage = chunks[-1].usage
            assert chunks[-1].choices == [] and any(c.choices for c in chunks)
        else:
            completion = fleet.openai.chat.completions.create(**kwargs)
            usage = completion.usage
            assert completion.choices[0].finish_reason in ("length", "stop")
        assert usage is not None and usage.completion_tokens <= 4
        details = usage.prompt_tokens_details
        cached.append(details.cached_tokens or 0 if details else 0)
        prompt_tokens = usage.prompt_tokens
    assert cached[0] <= OPENING
    # The system prompt is shared, the user turn is not.
    assert 60 <= cached[1] < prompt_tokens, cached


def test_openai_responses_is_served_with_usage(fleet: Fleet) -> None:
    instructions = nonce() + " " + SYSTEM
    cached = []
    for turn in ("one", "two"):
        response = fleet.openai.responses.create(
            model=SERVED_NAME, instructions=instructions, input=turn, max_output_tokens=4
        )
        assert response.status in ("completed", "incomplete")
        assert response.usage is not None and response.usage.output_tokens <= 4
        cached.append(response.usage.input_tokens_details.cached_tokens)
    assert cached[0] <= OPENING and cached[1] >= 60, cached


def test_anthropic_messages_stream_and_cache_read(fleet: Fleet) -> None:
    system = nonce() + " " + SYSTEM
    reads = []
    for turn in ("one", "two"):
        with fleet.anthropic.messages.stream(
            model=SERVED_NAME,
            max_tokens=4,
            system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
            messages=[{"role": "user", "content": turn}],
        ) as stream:
            message = stream.get_final_message()
        assert message.stop_reason in ("max_tokens", "end_turn")
        assert message.usage.output_tokens <= 4
        reads.append(message.usage.cache_read_input_tokens or 0)
    assert reads[0] <= OPENING and reads[1] >= 60, reads


def test_a_forced_tool_call_comes_back_parsed_by_sglang_openai(fleet: Fleet) -> None:
    completion = fleet.openai.chat.completions.create(
        model=SERVED_NAME,
        max_tokens=48,
        messages=[{"role": "user", "content": "What is the weather in Paris? " + nonce()}],
        tools=[
            {
                "type": "function",
                "function": {"name": "get_weather", "parameters": WEATHER_TOOL},
            }
        ],
        tool_choice="required",
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]  # type: ignore[union-attr]
    assert all(c.id.startswith("call_") for c in calls)


def test_a_forced_tool_call_comes_back_as_tool_use_anthropic(fleet: Fleet) -> None:
    message = fleet.anthropic.messages.create(
        model=SERVED_NAME,
        max_tokens=48,
        messages=[{"role": "user", "content": "What is the weather in Paris? " + nonce()}],
        tools=[{"name": "get_weather", "input_schema": WEATHER_TOOL}],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    uses = [b for b in message.content if b.type == "tool_use"]
    assert [u.name for u in uses] == ["get_weather"]
    assert all(u.id.startswith("toolu_") for u in uses)


def test_responses_function_call_item_from_a_forced_tool(fleet: Fleet) -> None:
    response = fleet.openai.responses.create(
        model=SERVED_NAME,
        input="What is the weather in Paris? " + nonce(),
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL}],
        tool_choice="required",
        max_output_tokens=48,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"]

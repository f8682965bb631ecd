"""An answer that continues the conversation's last assistant text (Anthropic's prefill, SGLang's
``continue_final_message``), and the client's template kwargs, as the worker plans them (pure but
for a real chat template and fast tokenizer)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from kvretention.dataplane.chat_template import render_and_encode
from kvretention.dataplane.frontend.anthropic import parse_messages
from kvretention.dataplane.frontend.prepare import build_preprocessed
from kvretention.dataplane.protocol import ChatMessage
from kvretention.dataplane.worker.app import PlannedCall, plan_call
from kvretention.dataplane.worker.dialect import Dialect
from kvretention.dataplane.worker.engine import LoadedEngine
from kvretention.dataplane.worker.render_cache import RenderCache
from support import chat_tokenizer

QUESTION = {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}
PREFILL = {"role": "assistant", "content": [{"type": "text", "text": '{"city": "'}]}
HOUR = {"type": "ephemeral", "ttl": "1h"}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return chat_tokenizer.build_tokenizer()


def _plan(tokenizer: Any, body: dict[str, Any], cache: RenderCache | None = None) -> PlannedCall:
    parsed = parse_messages({"model": "m", "max_tokens": 16, **body})
    wire = parsed.envelope.to_wire() if parsed.envelope is not None else None
    request = build_preprocessed(
        parsed, request_id="r", session_id="s", tokenizer=None, kv_hints=wire
    )
    engine = LoadedEngine(
        engine=types.SimpleNamespace(tokenizer_manager=types.SimpleNamespace(tokenizer=tokenizer)),
        name="test",
        dialect=Dialect.VERSIONED,
    )
    return plan_call(
        request.to_json_bytes(), headers={}, state_role="aggregated", engine=engine, cache=cache
    )


def _text(tokenizer: Any, planned: PlannedCall) -> str:
    return str(tokenizer.decode(planned.kwargs["input_ids"]))


@pytest.mark.parametrize("cached", [False, True])
def test_a_last_assistant_message_is_continued(tokenizer: Any, cached: bool) -> None:
    cache = RenderCache(tokenizer, verify_every=0) if cached else None
    planned = _plan(tokenizer, {"messages": [QUESTION, PREFILL]}, cache)
    head = render_and_encode(tokenizer, [ChatMessage(role="user", content="Weather in Paris?")])
    prefix = tokenizer.encode('{"city": "', add_special_tokens=False)
    assert planned.kwargs["input_ids"] == [*head.token_ids, *prefix]
    assert _text(tokenizer, planned).endswith('<|im_start|>assistant\n{"city": "')
    assert planned.prompt_tokens == len(head.token_ids) + len(prefix)


def test_a_last_user_message_starts_a_turn(tokenizer: Any) -> None:
    planned = _plan(tokenizer, {"messages": [QUESTION]})
    assert _text(tokenizer, planned).endswith(
        "Weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_last_assistant_tool_call_is_history(tokenizer: Any) -> None:
    call = {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}
    tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    planned = _plan(
        tokenizer,
        {"messages": [QUESTION, {"role": "assistant", "content": [call]}], "tools": tools},
    )
    assert _text(tokenizer, planned).endswith("</tool_call><|im_end|>\n<|im_start|>assistant\n")


def test_a_breakpoint_on_the_continued_text_is_dropped_and_earlier_ones_resolve(
    tokenizer: Any,
) -> None:
    marked_question = {
        "role": "user",
        "content": [{"type": "text", "text": "Weather in Paris?", "cache_control": HOUR}],
    }
    marked_prefill = {
        "role": "assistant",
        "content": [{"type": "text", "text": '{"city": "', "cache_control": HOUR}],
    }
    planned = _plan(tokenizer, {"messages": [marked_question, marked_prefill]})
    resolution = planned.breakpoints
    assert resolution is not None
    assert [d.reason for d in resolution.dropped] == ["the answer continues this message"]
    (resolved,) = resolution.resolved
    ids = planned.kwargs["input_ids"]
    assert tokenizer.decode(ids[: resolved.token_end]).endswith("Weather in Paris?")


def test_the_clients_template_kwargs_reach_the_template() -> None:
    from kvretention.dataplane.frontend.openai import parse_chat

    tokenizer = chat_tokenizer.build_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}no thinking\n{% endif %}"
        "house: {{ house | default('none') }}"
    )
    parsed = parse_chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "chat_template_kwargs": {"enable_thinking": False, "house": "blue"},
        }
    )
    request = build_preprocessed(parsed, request_id="r", session_id="s", tokenizer=None)
    engine = LoadedEngine(
        engine=types.SimpleNamespace(tokenizer_manager=types.SimpleNamespace(tokenizer=tokenizer)),
        name="test",
        dialect=Dialect.FLAT,
    )
    for cache in (None, RenderCache(tokenizer, verify_every=0)):
        planned = plan_call(
            request.to_json_bytes(),
            headers={},
            state_role="aggregated",
            engine=engine,
            cache=cache,
        )
        assert _text(tokenizer, planned) == "user: hi\nno thinking\nhouse: blue"


def test_the_frontends_tokenizer_leaves_a_continued_answer_to_the_worker(tokenizer: Any) -> None:
    from kvretention.dataplane.frontend.tokenizer import HfChatTokenizer

    parsed = parse_messages({"model": "m", "max_tokens": 16, "messages": [QUESTION, PREFILL]})
    frontend = HfChatTokenizer(tokenizer)
    assert parsed.continue_final_message
    assert (
        build_preprocessed(parsed, request_id="r", session_id=None, tokenizer=frontend).token_ids
        is None
    )
    turn = parse_messages({"model": "m", "max_tokens": 16, "messages": [QUESTION]})
    assert not turn.continue_final_message
    assert build_preprocessed(turn, request_id="r", session_id=None, tokenizer=frontend).token_ids

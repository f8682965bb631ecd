"""Breakpoints from a client's request to the engine's ``kv.retain`` directives, in process.

The frontend's own parser, normalisation and envelope policy build the router request; the
worker's ``plan_call`` renders it with a real tokenizer and tool-aware template
(``tests/support/retain_tokenizer.py``, BPE merges that straddle block ends) and resolves each
breakpoint. Every offset is checked two ways: against an independent resolution with the test
support's own conversion of the conversation, and token by token (the tokens before the offset
end with the marked block, the tokens after it start with what the template renders next).
"""

from __future__ import annotations

import dataclasses
import json
import types
from typing import Any

import pytest

from kvretention.dataplane.breakpoints import plan_retain_directives, resolve_breakpoints
from kvretention.dataplane.frontend.affinity import drop_billing_header
from kvretention.dataplane.frontend.anthropic import parse_messages
from kvretention.dataplane.frontend.config import FrontendConfig
from kvretention.dataplane.frontend.openai.chat_request import parse_chat
from kvretention.dataplane.frontend.prepare import apply_hint_policy, build_preprocessed
from kvretention.dataplane.protocol import ErrorCode
from kvretention.dataplane.worker.app import PlannedCall, RequestRejected, plan_call
from kvretention.dataplane.worker.dialect import Dialect
from kvretention.dataplane.worker.engine import LoadedEngine
from kvretention.replay.sessions import claude_code_session
from support import retain_tokenizer
from support.kv_retain_rules import check_envelope


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return retain_tokenizer.build_tokenizer()


def engine(tokenizer: Any, dialect: Dialect = Dialect.VERSIONED) -> LoadedEngine:
    """A multimodal model's engine (some cases carry images)."""
    manager = types.SimpleNamespace(tokenizer=tokenizer, mm_processor=object())
    return LoadedEngine(
        engine=types.SimpleNamespace(tokenizer_manager=manager), name="t", dialect=dialect
    )


def router_body(parsed: Any, *, config: FrontendConfig | None = None) -> bytes:
    """What the frontend forwards for a parsed request (normalised, fleet policy applied)."""
    messages, _ = drop_billing_header(parsed.messages)
    parsed = dataclasses.replace(parsed, messages=messages)
    parsed = apply_hint_policy(parsed, config=config or FrontendConfig(router_url="http://r"))
    request = build_preprocessed(parsed, request_id="r1", session_id=None, tokenizer=None)
    return request.model_dump_json(exclude_none=True).encode()


def plan(body: bytes, eng: LoadedEngine) -> PlannedCall:
    return plan_call(body, headers={}, state_role="aggregated", engine=eng)


def directives(planned: PlannedCall) -> list[dict[str, int]]:
    assert planned.kv_hints is not None
    check_envelope(planned.kv_hints)
    (action,) = planned.kv_hints["actions"]
    return list(action["payload"]["directives"])


@pytest.mark.parametrize("turn", [1, 3, 6])
def test_claude_code_turn_reaches_the_engine_with_exact_prefix_directives(
    tokenizer: Any, turn: int
) -> None:
    _, body = claude_code_session(turns=6)[turn]
    planned = plan(router_body(parse_messages(body)), engine(tokenizer))
    ids = planned.kwargs["input_ids"]
    assert planned.breakpoints is not None and not planned.breakpoints.dropped
    resolved = planned.breakpoints.resolved
    newest_is_text = body["messages"][-1]["content"][-1]["type"] == "text"
    last = len(planned.request.messages or []) - 1
    assert [r.element for r in resolved] == [
        "messages[0].content[1]",  # the last system block (the billing header was dropped)
        f"messages[{last}].content[1]" if newest_is_text else f"messages[{last}]",
    ]

    # Independent resolution: the test support's conversion and rendering of the same request.
    request = planned.request
    prompt = retain_tokenizer.render(
        tokenizer, request.messages or [], request.tools, add_generation_prompt=True
    )
    assert tokenizer.decode(ids) == prompt
    encoded = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
    independent = resolve_breakpoints(
        request.messages or [],
        request.tools,
        render=lambda m, t: retain_tokenizer.render(tokenizer, m, t, add_generation_prompt=False),
        prompt=prompt,
        offsets=encoded["offset_mapping"],
        expected=len(resolved),
    )
    assert independent.resolved == resolved

    # Token by token: the system block ends right before the tools section, never after it.
    system_end = resolved[0].token_end
    system_text = body["system"][-1]["text"]
    assert tokenizer.decode(ids[:system_end]).endswith(system_text)
    assert tokenizer.decode(ids[system_end:]).startswith("\n\n# Tools")
    # The newest block ends before the generation prompt: nothing the model writes is retained.
    newest_end = resolved[-1].token_end
    closing = "" if not newest_is_text else "<|im_end|>\n"  # a part ends inside its turn
    assert tokenizer.decode(ids[newest_end:]) == closing + "<|im_start|>assistant\n"
    newest = body["messages"][-1]["content"][-1]
    newest_text = newest.get("text") or newest.get("content")
    assert isinstance(newest_text, str) and newest_text in tokenizer.decode(ids[:newest_end])

    expected = plan_retain_directives([(r.token_end, r.ttl_seconds) for r in resolved], priority=50)
    assert directives(planned) == [d.to_wire() for d in expected]


def test_directives_follow_ttls_down_the_token_axis(tokenizer: Any) -> None:
    """A 1h system breakpoint and a 5m newest one: two directives, the longer TTL first."""
    _, body = claude_code_session(turns=2, ttl=None)[2]
    body["system"][-1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    planned = plan(router_body(parse_messages(body)), engine(tokenizer))
    assert planned.breakpoints is not None
    system, newest = planned.breakpoints.resolved
    assert directives(planned) == [
        {"start": 0, "end": system.token_end, "priority": 50, "duration": 3600},
        {"start": system.token_end, "end": newest.token_end, "priority": 50, "duration": 300},
    ]


def test_fleet_priority_and_full_prompt_share_the_envelope(tokenizer: Any) -> None:
    """Top-level ``cache_control`` with a block breakpoint: the block's prefix and the full
    prompt, at the fleet's priority."""
    body = {
        "model": "m",
        "max_tokens": 8,
        "cache_control": {"type": "ephemeral"},
        "system": [
            {"type": "text", "text": "Rules.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
        ],
        "messages": [{"role": "user", "content": "hello there"}],
    }
    config = FrontendConfig(router_url="http://r", hint_priority=80)
    planned = plan(router_body(parse_messages(body), config=config), engine(tokenizer))
    ids = planned.kwargs["input_ids"]
    assert planned.breakpoints is not None
    (system,) = planned.breakpoints.resolved
    assert tokenizer.decode(ids[: system.token_end]).endswith("Rules.")
    assert directives(planned) == [
        {"start": 0, "end": system.token_end, "priority": 80, "duration": 3600},
        {"start": system.token_end, "end": len(ids), "priority": 80, "duration": 300},
    ]


def test_openai_part_breakpoint_resolves_to_that_part(tokenizer: Any) -> None:
    body = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Long shared context."},
                    {
                        "type": "text",
                        "text": "Question?",
                        "prompt_cache_breakpoint": {"mode": "explicit"},
                    },
                    {"type": "text", "text": "Tail."},
                ],
            }
        ],
        "prompt_cache_options": {"mode": "explicit"},
    }
    planned = plan(router_body(parse_chat(body)), engine(tokenizer))
    ids = planned.kwargs["input_ids"]
    assert planned.breakpoints is not None
    (part,) = planned.breakpoints.resolved
    assert tokenizer.decode(ids[: part.token_end]).endswith("Long shared context.\nQuestion?")
    assert "Tail." not in tokenizer.decode(ids[: part.token_end])
    assert directives(planned) == [
        {"start": 0, "end": part.token_end, "priority": 50, "duration": 1800}
    ]


def _marked_body() -> bytes:
    body = {
        "model": "m",
        "max_tokens": 8,
        "system": [{"type": "text", "text": "Rules.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    return router_body(parse_messages(body))


def test_flat_dialect_refuses_prefix_retention_visibly(tokenizer: Any) -> None:
    with pytest.raises(RequestRejected) as info:
        plan(_marked_body(), engine(tokenizer, Dialect.FLAT))
    assert info.value.code is ErrorCode.KV_HINTS_UNSUPPORTED
    assert "full prompt" in str(info.value) and "token ranges" in str(info.value)


def test_an_envelope_announcing_other_markers_is_refused(tokenizer: Any) -> None:
    raw = json.loads(_marked_body())
    raw["kv_hints"]["retain_prefixes"]["breakpoints"] = 2
    with pytest.raises(RequestRejected) as info:
        plan(json.dumps(raw).encode(), engine(tokenizer))
    assert info.value.code is ErrorCode.INVALID_REQUEST
    assert "announces 2 prefix breakpoint(s) but the conversation carries 1" in str(info.value)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("no_template", "no chat template"),
        ("images", "images, whose token counts only the engine knows"),
    ],
)
def test_unresolvable_breakpoints_are_dropped_with_why_never_widened(
    tokenizer: Any, case: str, reason: str
) -> None:
    content: Any = "hi"
    if case == "images":
        png = {"type": "base64", "media_type": "image/png", "data": "AA=="}
        content = [{"type": "image", "source": png}, {"type": "text", "text": "see"}]
    body = {
        "model": "m",
        "max_tokens": 8,
        "system": [{"type": "text", "text": "Rules.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": content}],
    }
    eng = engine(None if case == "no_template" else tokenizer)
    planned = plan(router_body(parse_messages(body)), eng)
    assert planned.kv_hints is None  # a prefix-only hint with nothing resolvable retains nothing
    assert planned.breakpoints is not None
    (dropped,) = planned.breakpoints.dropped
    assert reason in dropped.reason
    assert planned.breakpoints.to_trace()["dropped"][0]["element"] == "messages[0].content[0]"

"""What the worker sends for prefix retention passes SGLang 0.5.23's own decoder and kv.retain 1.0.

Built end to end from a Claude Code-shaped request: the Anthropic normalizer (prefix mode) finds
the breakpoints, they are marked on a neutral conversation, resolved against a real tokenizer and
tool-aware template, and built into the versioned envelope; SGLang's ``decode_kv_hints_envelope``
(the real 0.5.23 source, installed with ``--no-deps``) and the published rules judge it.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import pytest

from kvretention.dataplane.breakpoints import resolve_breakpoints
from kvretention.dataplane.protocol import ChatMessage, TextPart, ToolDefinition
from kvretention.dataplane.worker.dialect import Dialect, build_kv_hints
from kvretention.dataplane.worker.sglang_source import load_kv_hints_module, locate_sglang
from kvretention.hints import KvHintEnvelope, build_envelope, hints_from_messages
from support import retain_tokenizer
from support.kv_retain_rules import check_envelope

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(
        locate_sglang() is None and not os.environ.get("CI"),
        reason="sglang 0.5.23 is not installed",
    ),
]

EPHEMERAL_1H = {"type": "ephemeral", "ttl": "1h", "scope": "global"}
BODY: dict[str, Any] = {
    "model": "m",
    "max_tokens": 64,
    "tools": [
        {"name": "read", "description": "Read a file.", "input_schema": {"type": "object"}},
        {"name": "bash", "description": "Run.", "input_schema": {"type": "object"}},
    ],
    "system": [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "Be careful.", "cache_control": EPHEMERAL_1H},
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "On it."}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Go on.", "cache_control": {"type": "ephemeral"}}],
        },
    ],
}


@pytest.fixture(scope="module")
def decoder() -> Any:
    module = load_kv_hints_module()
    assert module is not None, "sglang/srt/managers/kv_hints.py could not be loaded"
    return module.decode_kv_hints_envelope


def neutral_conversation(body: dict[str, Any]) -> tuple[list[ChatMessage], list[ToolDefinition]]:
    """What the frontend's Anthropic parser makes of ``BODY``, markers set from the hints."""
    hints = hints_from_messages(body)
    tools = [
        ToolDefinition(
            name=t["name"],
            description=t["description"],
            parameters=t["input_schema"],
            retain_ttl=hints.ttl_at("tools", k),
        )
        for k, t in enumerate(body["tools"])
    ]
    system = ChatMessage(
        role="system",
        content=[
            TextPart(text=b["text"], retain_ttl=hints.ttl_at("system", j))
            for j, b in enumerate(body["system"])
        ],
    )
    messages = [system] + [
        ChatMessage(
            role=m["role"],
            content=[
                TextPart(text=b["text"], retain_ttl=hints.ttl_at("messages", i, "content", j))
                for j, b in enumerate(m["content"])
            ],
        )
        for i, m in enumerate(body["messages"])
    ]
    return messages, tools


def _hints_for(body: dict[str, Any], *, priority: int = 50) -> tuple[dict[str, Any] | None, int]:
    envelope = build_envelope(hints_from_messages(body), priority=priority)
    assert envelope is not None
    wire = KvHintEnvelope.from_wire(envelope.to_wire())  # what the worker receives
    messages, tools = neutral_conversation(body)
    tokenizer = retain_tokenizer.build_tokenizer()
    prompt = retain_tokenizer.render(tokenizer, messages, tools, add_generation_prompt=True)
    enc = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
    resolution = resolve_breakpoints(
        messages,
        tools,
        render=partial(retain_tokenizer.render, tokenizer, add_generation_prompt=False),
        prompt=prompt,
        offsets=enc["offset_mapping"],
        expected=wire.prefix_count,
    )
    assert resolution.dropped == ()
    n = len(enc["input_ids"])
    hints = build_kv_hints(
        wire,
        Dialect.VERSIONED,
        request_id="req-cc-1",
        prompt_tokens=n,
        prefixes=resolution.resolved,
    )
    return hints, n


def test_claude_code_prefix_directives_pass_sglangs_decoder_and_the_rules(decoder: Any) -> None:
    hints, _ = _hints_for(BODY, priority=80)
    directives = check_envelope(hints)
    decoded = decoder(hints)
    assert decoded.message_id == "req-cc-1"
    (action,) = decoded.actions
    assert (action.action_type, action.action_version) == ("kv.retain", "1.0")
    assert action.payload["directives"] == directives
    # 1h up to the end of the last system block, then 5m up to the end of "Go on."
    assert [(d["start"], d["duration"], d["priority"]) for d in directives] == [
        (0, 3600, 80),
        (directives[0]["end"], 300, 80),
    ]


def test_top_level_and_block_breakpoints_together(decoder: Any) -> None:
    body = {**BODY, "cache_control": {"type": "ephemeral"}}
    hints, prompt_tokens = _hints_for(body)
    directives = check_envelope(hints)
    decoder(hints)
    assert directives[-1]["end"] == prompt_tokens  # the automatic breakpoint: the whole prompt
    assert [d["duration"] for d in directives] == [3600, 300]

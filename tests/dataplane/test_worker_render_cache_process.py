"""The render cache wired end to end: router -> worker processes, a conversation turn after turn.

Two workers render with the same real chat template; one keeps the previous turn's tokens (the
default), the other has ``--render-cache-mb 0``. The conversation carries no session id, so the
worker behind the router can only find its previous prompt by the ``x-kvr-prefix`` chain the
router passes on. The engine must get the very same token ids from both, and the trace must say
the later turns reused the earlier ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvretention.dataplane.frontend.affinity import prefix_chain
from kvretention.dataplane.protocol import HEADER_PREFIX, ChatMessage, ToolCall, ToolDefinition
from support.chat_tokenizer import save
from support.processes import StartKvretention
from support.worker_client import calls, post, wait_for

TOOLS = [
    ToolDefinition(
        name="Bash",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    )
]


def turn_messages(turns: int) -> list[ChatMessage]:
    messages = [
        ChatMessage(role="system", content="You are a coding agent."),
        ChatMessage(role="user", content="Fix the failing test."),
    ]
    for t in range(turns):
        messages.append(
            ChatMessage(
                role="assistant",
                content=f"Step {t}.",
                tool_calls=[ToolCall(id=f"c{t}", name="Bash", arguments='{"command": "pytest"}')],
            )
        )
        messages.append(ChatMessage(role="tool", tool_call_id=f"c{t}", content=f"FAILED {t}\n"))
    return messages


def body(rid: str, messages: list[ChatMessage]) -> bytes:
    return json.dumps(
        {
            "request_id": rid,
            "model": "m",
            "messages": [m.model_dump(exclude_none=True) for m in messages],
            "tools": [t.model_dump(exclude_none=True) for t in TOOLS],
        }
    ).encode()


def traced(trace: Path, rid: str) -> dict[str, Any]:
    def entry() -> dict[str, Any] | None:
        for line in trace.read_text().splitlines() if trace.exists() else []:
            if (found := json.loads(line))["request_id"] == rid:
                return dict(found)
        return None

    found: dict[str, Any] = wait_for(entry)
    return found


def test_later_turns_reuse_the_earlier_ones_and_the_engine_gets_the_same_ids(
    kvretention_process: StartKvretention, tmp_path: Path
) -> None:
    tokenizer = save(tmp_path / "tokenizer")
    records = {name: tmp_path / f"{name}.jsonl" for name in ("cached", "whole")}
    traces = {name: tmp_path / f"{name}-trace.jsonl" for name in records}
    workers = {
        name: kvretention_process(
            [
                *("worker", "--engine", "standin:versioned", "--trace-file", str(traces[name])),
                *(["--render-cache-mb", "0"] if name == "whole" else []),
                *("--model-path", str(tokenizer)),
            ],
            env={"KVR_STANDIN_RECORD": str(records[name])},
            timeout=90.0,
        )
        for name in records
    }
    router = kvretention_process(["router", "--worker", workers["cached"].base_url])
    for turn in range(1, 5):
        messages = turn_messages(turn)
        rid = f"turn{turn}"
        chain = ",".join(prefix_chain(messages, TOOLS))
        status, _ = post(router.base_url, body(rid, messages), {HEADER_PREFIX: chain})
        assert status == 200
        status, _ = post(workers["whole"].base_url, body(rid, messages))
        assert status == 200
        (cached,) = wait_for(lambda rid=rid: calls(records["cached"], rid))
        (whole,) = wait_for(lambda rid=rid: calls(records["whole"], rid))
        assert cached["kwargs"]["input_ids"] == whole["kwargs"]["input_ids"]
        reused = traced(traces["cached"], rid)["prompt_tokens_reused"]
        assert traced(traces["whole"], rid)["prompt_tokens_reused"] == 0
        if turn == 1:
            assert reused == 0
        else:
            assert 0 < reused < len(cached["kwargs"]["input_ids"])

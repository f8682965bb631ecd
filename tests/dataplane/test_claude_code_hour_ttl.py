"""``CLAUDE_CODE_PROMPT_CACHE_TTL=1h`` end to end: Claude Code's one-hour ``cache_control`` goes
through the frontend, the router and the worker as real processes (engine stand-in, the test
tokenizer) and reaches the engine as ``kv.retain`` directives of 3600 s.

The pieces are tested on their own elsewhere (the frontend's parse in
``tests/unit/dataplane/test_anthropic_parse.py``, what the router gets in
``test_frontend_anthropic.py``, the worker's resolution in ``test_worker_parsers_process.py``);
this is the chain, with the request shaped as Claude Code 2.1.332 sends it under that setting.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from support.processes import StartKvretention
from support.standin_chain import start_standin_chain
from support.worker_client import calls, wait_for

HOUR: dict[str, Any] = {"type": "ephemeral", "ttl": "1h"}
BILLING = "x-anthropic-billing-header: cc_version=2.1.332.abc; cc_entrypoint=cli; cch=0a1b2;"
TOOL: dict[str, Any] = {
    "name": "Bash",
    "description": "Run a shell command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


def claude_code_turn(**changes: Any) -> dict[str, Any]:
    """A Claude Code turn with ``CLAUDE_CODE_PROMPT_CACHE_TTL=1h``: the billing block, two system
    blocks and the newest message block marked ``{ttl: 1h}`` (``scope`` on the system's)."""
    body: dict[str, Any] = {
        "model": "m",
        "max_tokens": 4,
        "system": [
            {"type": "text", "text": BILLING},
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {**HOUR, "scope": "global"},
            },
            {"type": "text", "text": "Work in /repo.", "cache_control": HOUR},
        ],
        "tools": [TOOL],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Running ls."}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Go on.", "cache_control": HOUR}],
            },
        ],
        "metadata": {"user_id": json.dumps({"session_id": "hour-session"})},
        "stream": False,
    }
    body.update(changes)
    return body


@pytest.fixture(scope="module")
def plane(
    kvretention_process: StartKvretention, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, Path]:
    d = tmp_path_factory.mktemp("hour-ttl")
    trace = d / "worker-trace.jsonl"
    chain = start_standin_chain(
        kvretention_process,
        d,
        trace=trace,
        frontend_args=["--model", "m"],
    )
    return chain.frontend, chain.record, trace


def send(base_url: str, body: dict[str, Any]) -> str:
    """POST /v1/messages as Claude Code does; the request id the engine saw."""
    request = urllib.request.Request(
        base_url + "/v1/messages?beta=true",
        data=json.dumps(body).encode(),
        headers={
            "content-type": "application/json",
            "x-api-key": "sk-any",
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "claude-code-20250219,prompt-caching-scope-2026-01-05",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        answer = json.load(resp)
        request_id: str = resp.headers["x-request-id"]
    assert answer["type"] == "message", answer
    return request_id


def directives_of(record: Path, request_id: str) -> list[dict[str, Any]]:
    (call,) = wait_for(lambda: calls(record, request_id))
    (action,) = call["kwargs"]["kv_hints"]["actions"]
    assert (action["action_type"], action["action_version"]) == ("kv.retain", "1.0")
    directives: list[dict[str, Any]] = action["payload"]["directives"]
    return directives


def traced(trace: Path, request_id: str) -> list[dict[str, Any]]:
    """The worker's trace records of ``request_id`` (written after it answers)."""
    if not trace.exists():
        return []
    entries = [json.loads(line) for line in trace.read_text().splitlines()]
    return [e for e in entries if e.get("request_id") == request_id]


def test_block_level_hour_breakpoints_reach_the_engine_as_3600_s_holds(
    plane: tuple[str, Path, Path],
) -> None:
    base_url, record, trace = plane
    request_id = send(base_url, claude_code_turn())
    directives = directives_of(record, request_id)
    assert directives and {d["duration"] for d in directives} == {3600}
    (entry,) = wait_for(lambda: traced(trace, request_id))
    ends = {b["element"]: b["token_end"] for b in entry["breakpoints"]}
    # the billing block is dropped before templating; the two system blocks and the newest
    # user block are the breakpoints, and the hold reaches the end of the newest one
    assert set(ends) == {
        "messages[0].content[0]",
        "messages[0].content[1]",
        "messages[3].content[0]",
    }
    assert directives[0]["start"] == 0
    assert max(d["end"] for d in directives) == ends["messages[3].content[0]"]


def test_top_level_hour_cache_control_holds_the_whole_prompt_3600_s(
    plane: tuple[str, Path, Path],
) -> None:
    base_url, record, _ = plane
    body = claude_code_turn(cache_control=HOUR)
    for block in [*body["system"], *body["messages"][-1]["content"]]:
        block.pop("cache_control", None)
    request_id = send(base_url, body)
    (call,) = calls(record, request_id)
    (directive,) = directives_of(record, request_id)
    assert directive["duration"] == 3600
    assert (directive["start"], directive["end"]) == (0, len(call["kwargs"]["input_ids"]))

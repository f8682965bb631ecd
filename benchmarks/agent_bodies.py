"""Agent-shaped request bodies for the benchmarks, about 200 KB each, from the tests' agent sessions.

``operator/kvretention/replay/sessions.py`` writes Codex- and Claude Code-shaped sessions from those
clients' public request shapes, scaled down. Here the history is scaled back up by turns until the
last request of the session is about ``target_bytes``: the same tools, reasoning / thinking history,
tool calls and results, and (Claude Code) the block-level ``cache_control`` breakpoints on the last
system block and on the newest message block, just more turns of them. Every turn's tool output is
short, so a 200 KB body holds many small items and blocks: the worst case for a per-block scan.

- :func:`codex_body`: the last ``POST /v1/responses`` body of a Codex CLI session (``tools`` with
  the ``apply_patch`` custom tool, ``reasoning`` items with ``encrypted_content``,
  ``function_call`` / ``custom_tool_call`` history and their outputs, ``prompt_cache_key``).
- :func:`claude_code_body`: the last ``POST /v1/messages`` body of a Claude Code session (17 tools,
  the billing-header system block, ``thinking`` / ``tool_use`` / ``tool_result`` history, two
  ``1h`` breakpoints).
- :func:`chat_agent_body`: the Claude Code conversation as an OpenAI Chat Completions body (tools,
  assistant ``tool_calls``, ``role: tool`` results), for peers that only proxy Chat Completions.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parent.parent
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

from kvretention.replay.sessions import claude_code_session, codex_session  # noqa: E402

TARGET_BYTES: Final = 200_000

Body = dict[str, Any]


def _size(body: Body) -> int:
    return len(json.dumps(body).encode())


def _scaled(last_body: Callable[[int], Body], target_bytes: int) -> Body:
    """The session's last body with enough turns to reach ``target_bytes``."""
    return last_body(_turns(last_body, target_bytes))


def _turns(last_body: Callable[[int], Body], target_bytes: int) -> int:
    """How many turns make the session's last body reach ``target_bytes`` (sizes grow linearly
    with turns, so two small sessions give the slope; one more turn until it is reached)."""
    small, large = 8, 24
    s_small, s_large = _size(last_body(small)), _size(last_body(large))
    per_turn = (s_large - s_small) / (large - small)
    turns = max(1, large + math.ceil((target_bytes - s_large) / per_turn))
    while _size(last_body(turns)) < target_bytes:
        turns += 1
    return turns


def session_turns(make_session: Callable[..., list[Any]], target_bytes: int) -> int:
    """How many turns make a ``make_session`` (``replay.sessions``) session's last body reach
    ``target_bytes``."""
    return _turns(lambda turns: make_session(turns=turns)[-1][1], target_bytes)


def claude_code_turns(target_bytes: int = TARGET_BYTES) -> tuple[Body, Body]:
    """The last two requests of the Claude Code session whose last one is :func:`claude_code_body`:
    the turn before, and the turn that extends it (what a frontend sees one after the other)."""
    turns = _turns(lambda t: claude_code_session(turns=t)[-1][1], target_bytes)
    session = claude_code_session(turns=turns)
    return session[-2][1], session[-1][1]


def codex_turns(target_bytes: int = TARGET_BYTES) -> tuple[Body, Body]:
    """The last two requests of the Codex session whose last one is :func:`codex_body`."""
    turns = _turns(lambda t: codex_session(turns=t)[-1][1], target_bytes)
    session = codex_session(turns=turns)
    return session[-2][1], session[-1][1]


def codex_body(target_bytes: int = TARGET_BYTES) -> Body:
    """The last Codex request of a session scaled to ``target_bytes``, exactly as Codex sends it
    (``prompt_cache_key`` only: no retention control, so only the fleet's default TTL applies)."""
    return _scaled(lambda turns: codex_session(turns=turns)[-1][1], target_bytes)


def claude_code_body(target_bytes: int = TARGET_BYTES) -> Body:
    """The last Claude Code request of a session scaled to ``target_bytes``, as Claude Code sends it."""
    return _scaled(lambda turns: claude_code_session(turns=turns)[-1][1], target_bytes)


def codex_headers() -> dict[str, str]:
    """The headers Codex sends with each request (``session_id`` is the sticky-session key)."""
    return codex_session(turns=1)[-1][0]


def claude_code_headers() -> dict[str, str]:
    return claude_code_session(turns=1)[-1][0]


def with_responses_hints(body: Body) -> Body:
    """``body`` plus the retention controls a Responses client may add: ``prompt_cache_options``
    (implicit, 30m: the full prompt) and a ``prompt_cache_breakpoint`` on the first user part (the
    stable head of the session), so the whole hint path runs."""
    out: Body = json.loads(json.dumps(body))
    out["prompt_cache_options"] = {"ttl": "30m"}
    for item in out["input"]:
        if item.get("type") == "message" and item.get("role") == "user":
            item["content"][0]["prompt_cache_breakpoint"] = {"mode": "explicit"}
            break
    return out


def chat_agent_body(messages_body: Body) -> Body:
    """A Claude Code Messages body as the same conversation in Chat Completions shape: system text,
    tools as functions, thinking as ``reasoning_content``, ``tool_use`` as ``tool_calls`` and
    ``tool_result`` as ``role: tool`` messages. No cache controls (Chat Completions has no
    block-level ones in the peers' dialect) and no billing-header line: that per-request system
    block is Claude Code's, on Messages only; a Chat client's system prompt stays put."""
    system = "\n".join(
        b["text"]
        for b in messages_body["system"]
        if not b["text"].startswith("x-anthropic-billing-header:")
    )
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for message in messages_body["messages"]:
        content = message["content"]
        if isinstance(content, str):
            messages.append({"role": message["role"], "content": content})
            continue
        if message["role"] == "assistant":
            text = "\n".join(b["text"] for b in content if b["type"] == "text")
            calls = [
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": json.dumps(b["input"])},
                }
                for b in content
                if b["type"] == "tool_use"
            ]
            out: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                out["tool_calls"] = calls
            messages.append(out)
            continue
        texts = [b["text"] for b in content if b["type"] == "text"]
        for block in content:
            if block["type"] == "tool_result":
                result = block["content"]
                if not isinstance(result, str):
                    result = "\n".join(p["text"] for p in result if p.get("type") == "text")
                messages.append(
                    {"role": "tool", "tool_call_id": block["tool_use_id"], "content": result}
                )
        if texts:
            messages.append({"role": "user", "content": "\n".join(texts)})
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t["description"],
                "parameters": t["input_schema"],
            },
        }
        for t in messages_body["tools"]
    ]
    return {
        "model": messages_body["model"],
        "messages": messages,
        "tools": tools,
        "tool_choice": "auto",
        "max_tokens": messages_body["max_tokens"],
        "stream": messages_body.get("stream", False),
    }


_TRACEBACK: Final = (
    "    def test_case_{turn}():\n        tokens = tokenize(load('case_{turn}.txt'))\n"
    ">       assert len(tokens) == {turn}\nE       assert {turn} == {turn} + 1\n"
    "E        +  where tokens = tokenize('...')\ntests/test_parser.py:{turn}: AssertionError\n"
    "---------------------------- Captured stdout call ----------------------------\n"
    "parsing case_{turn}.txt (412 bytes)\n"
)


def small_turns_body(
    turns: int,
    *,
    tag: str = "",
    branch: str = "",
    billing: int | None = None,
    model: str = "claude-sonnet-4-5",
) -> Body:
    """A Claude Code ``/v1/messages`` body of ``turns`` small tool rounds (an assistant ``tool_use``
    and a user ``tool_result``, a few hundred bytes each) after the task message, with one
    block-level ``cache_control`` on the newest block (the shape of issue 32: ~400 messages,
    ~192 KB at 200 turns). ``tag`` goes into the task message, so each tag is its own
    conversation; ``small_turns_body(n + 1)`` is ``small_turns_body(n)`` plus one round, with the
    breakpoint moved to the new last block, as Claude Code moves it. ``branch`` goes into every
    tool result (conversations of one task that diverge from its first round); ``billing`` adds
    Claude Code's billing header as the first system block, its value changing with the number
    (Claude Code's changes on every request)."""
    tools = claude_code_session(turns=1)[-1][1]["tools"]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": f"Fix the failing tests {tag}"}]}
    ]
    for turn in range(turns):
        call_id = f"toolu_{turn:04d}{'x' * 18}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": call_id,
                        "name": "Bash",
                        "input": {
                            "command": f"pytest tests/test_parser.py -k case_{turn} -q",
                            "description": f"Run parser case {turn} to check the tokenizer "
                            "still splits quoted strings, escapes and nested brackets",
                        },
                    }
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call_id,
                        "content": f"F.. [100%]\nFAILED tests/test_parser.py::test_case_{turn} - "
                        f"AssertionError: expected {turn} tokens, got {turn + 1}\n"
                        + _TRACEBACK.format(turn=turn)
                        + "1 failed, 2 passed in 0.31s"
                        + (f" ({branch})" if branch else ""),
                    }
                ],
            }
        )
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    system = [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."}]
    if billing is not None:
        header = f"x-anthropic-billing-header: cc_version=2.0.14.{billing}; cch={billing:05x};"
        system.insert(0, {"type": "text", "text": header})
    return {
        "model": model,
        "max_tokens": 32000,
        "system": system,
        "messages": messages,
        "tools": tools,
        "stream": True,
    }

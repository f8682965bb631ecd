"""Codex- and Claude Code-shaped sessions, written from the clients' public request shapes: what
``kvretention replay`` sends a fleet, and what the tests and benchmarks replay.

Each session is a list of ``(headers, body)`` requests exactly as the client sends them turn after
turn: the history grows, tool calls are answered with tool results, and the per-request fields
(Codex's ``session_id`` header and ``prompt_cache_key``; Claude Code's ``metadata.user_id``, its
billing-header system block that changes every request, block-level ``cache_control`` on the last
system block and the newest message block) are where those clients put them. Sizes are scaled down;
the shapes are not. No client code is copied; docs/frontend.md lists what the pinned CLIs send.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Final

Request = tuple[dict[str, str], dict[str, Any]]

CODEX_MODEL: Final = "gpt-5-codex"
CLAUDE_MODEL: Final = "claude-sonnet-4-5"
CLAUDE_SMALL_MODEL: Final = "claude-haiku-4-5"

APPLY_PATCH_GRAMMAR: Final = r"""start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?
hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change?
filename: /(.+)/
add_line: "+" /(.*)/ LF -> line
change: (change_context | change_line)+
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
%import common.LF
"""


def _codex_tools() -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": "shell",
            "description": "Runs a shell command and returns its output.",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "array", "items": {"type": "string"}},
                    "workdir": {"type": "string"},
                    "timeout_ms": {"type": "number"},
                },
                "required": ["command"],
                "additionalProperties": False,
            },
        },
        {
            "type": "function",
            "name": "update_plan",
            "description": "Updates the task plan.",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {
                    "explanation": {"type": "string"},
                    "plan": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "step": {"type": "string"},
                                "status": {"type": "string"},
                            },
                            "required": ["step", "status"],
                            "additionalProperties": False,
                        },
                    },
                },
                "required": ["plan"],
                "additionalProperties": False,
            },
        },
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Use the `apply_patch` tool to edit files.",
            "format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH_GRAMMAR},
        },
    ]


def codex_session(*, turns: int = 12, marker: str = "", result_marker: str = "") -> list[Request]:
    """A Codex CLI conversation on ``/v1/responses``: one request per model call.

    ``marker`` ends the task message and ``result_marker`` every tool output (the engine
    stand-in reads markers in the newest user turn, so a replay can ask for a tool call each turn).
    """
    conversation = str(uuid.uuid4())
    headers = {
        "session_id": conversation,
        "originator": "codex_cli_rs",
        "openai-beta": "responses=experimental",
        "accept": "text/event-stream",
    }
    instructions = "You are Codex, a coding agent based on GPT-5. " * 30
    items = _codex_opening(marker)
    requests: list[Request] = []
    for turn in range(turns):
        requests.append((dict(headers), _codex_body(instructions, list(items), conversation)))
        items += _codex_round(turn, f"call_{turn:02d}_{conversation[:8]}", result_marker)
    return requests


def _codex_opening(marker: str) -> list[dict[str, Any]]:
    """The developer and environment messages Codex opens with, and the task ending in ``marker``."""

    def message(role: str, text: str) -> dict[str, Any]:
        return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}

    return [
        message("developer", "<permissions>sandbox: workspace-write</permissions>"),
        message("user", "<environment_context><cwd>/repo</cwd></environment_context>"),
        message("user", f"Fix the failing test in parser.py {marker}"),
    ]


def _codex_round(turn: int, call_id: str, result_marker: str) -> list[dict[str, Any]]:
    """One model call's output items: its reasoning, a tool call (every third an ``apply_patch``
    custom tool, else ``shell``) and the tool's output ending in ``result_marker``."""
    reasoning = {
        "type": "reasoning",
        "id": f"rs_{turn:02d}",
        "summary": [{"type": "summary_text", "text": f"Looking at step {turn}."}],
        "content": None,
        "encrypted_content": "gAAAAB" + "x" * 64,
    }
    if turn % 3 == 2:
        patch = "*** Begin Patch\n*** Update File: parser.py\n@@\n-    return None\n+    return node\n*** End Patch\n"
        return [
            reasoning,
            {"type": "custom_tool_call", "call_id": call_id, "name": "apply_patch", "input": patch},
            {
                "type": "custom_tool_call_output",
                "call_id": call_id,
                "output": "Success. Updated the following files:\nM parser.py\n" + result_marker,
            },
        ]
    arguments = json.dumps(
        {"command": ["bash", "-lc", f"rg -n parse src {turn}"], "workdir": "/repo"}
    )
    output = {
        "output": f"src/parser.py:{turn}: def parse()\n" * 5 + result_marker,
        "metadata": {"exit_code": 0},
    }
    return [
        reasoning,
        {"type": "function_call", "call_id": call_id, "name": "shell", "arguments": arguments},
        {"type": "function_call_output", "call_id": call_id, "output": json.dumps(output)},
    ]


def _codex_body(
    instructions: str, items: list[dict[str, Any]], conversation: str
) -> dict[str, Any]:
    return {
        "model": CODEX_MODEL,
        "instructions": instructions,
        "input": items,
        "tools": _codex_tools(),
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": conversation,
        "text": {"verbosity": "medium"},
    }


_CLAUDE_TOOL_NAMES: Final = (
    "Task", "Bash", "Glob", "Grep", "ExitPlanMode", "Read", "Edit", "MultiEdit", "Write",
    "NotebookEdit", "WebFetch", "TodoWrite", "WebSearch", "BashOutput", "KillShell",
    "SlashCommand", "ListMcpResources",
)  # fmt: skip


def _claude_tools() -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "description": f"{name}: a Claude Code tool. " * 8,
            "input_schema": {
                "type": "object",
                "properties": {
                    "command" if name == "Bash" else "input": {"type": "string"},
                    "description": {"type": "string"},
                },
                "required": ["command" if name == "Bash" else "input"],
                "additionalProperties": False,
                "$schema": "http://json-schema.org/draft-07/schema#",
            },
        }
        for name in _CLAUDE_TOOL_NAMES
    ]


def _billing_header(n: int) -> dict[str, Any]:
    return {
        "type": "text",
        "text": f"x-anthropic-billing-header: cc_version=2.0.14.{n:03d}; cch={uuid.uuid4().hex[:5]};",
    }


def claude_code_session(
    *,
    turns: int = 14,
    marker: str = "",
    result_marker: str = "",
    cache_control: bool = True,
    ttl: str | None = "1h",
) -> list[Request]:
    """A Claude Code conversation on ``/v1/messages?beta=true``: a title side call on the small
    model, then one request per model call; block-level ``cache_control`` as Claude Code marks it.
    ``marker`` / ``result_marker`` end the task message and every tool result (see
    :func:`codex_session`)."""
    session = str(uuid.uuid4())
    user_id = f"user_{uuid.uuid4().hex}_account__session_{session}"
    headers = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
        "x-app": "cli",
        "x-claude-code-session-id": session,
    }
    control: dict[str, Any] = {"type": "ephemeral"}
    if ttl is not None:
        control["ttl"] = ttl
    requests: list[Request] = [(dict(headers), _title_call(user_id))]
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "<system-reminder>CLAUDE.md: use pytest</system-reminder>",
                },
                {"type": "text", "text": f"Fix the failing test in parser.py {marker}"},
            ],
        }
    ]
    for turn in range(turns):
        system = _claude_system(turn)
        body_messages = json.loads(json.dumps(messages))
        if cache_control:
            system[-1]["cache_control"] = dict(control)
            last = body_messages[-1]["content"]
            last[-1]["cache_control"] = dict(control)
        body = {
            "model": CLAUDE_MODEL,
            "max_tokens": 32000,
            "system": system,
            "messages": body_messages,
            "tools": _claude_tools(),
            "metadata": {"user_id": user_id},
            "thinking": {"type": "enabled", "budget_tokens": 4000},
            "stream": True,
        }
        requests.append((dict(headers), body))
        tool_id = f"toolu_{turn:02d}{session[:10].replace('-', '')}"
        messages += _claude_round(turn, tool_id, result_marker)
    return requests


def _title_call(user_id: str) -> dict[str, Any]:
    """Claude Code's side call on the small model that names the conversation."""
    return {
        "model": CLAUDE_SMALL_MODEL,
        "max_tokens": 512,
        "system": [
            _billing_header(0),
            {"type": "text", "text": "Summarize this coding conversation in a short title."},
        ],
        "messages": [{"role": "user", "content": "fix the parser bug"}],
        "metadata": {"user_id": user_id},
        "stream": True,
    }


def _claude_system(turn: int) -> list[dict[str, Any]]:
    """The system blocks of a model call: the billing header that changes every request first."""
    return [
        _billing_header(turn + 1),
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {
            "type": "text",
            "text": "You are an interactive CLI tool that helps users with software engineering tasks. "
            * 20,
        },
    ]


def _claude_round(turn: int, tool_id: str, result_marker: str) -> list[dict[str, Any]]:
    """The assistant's thinking, text and ``Bash`` tool use, and the tool result answering it."""
    tool_use = {
        "type": "tool_use",
        "id": tool_id,
        "name": "Bash",
        "input": {
            "command": f"pytest -q tests/test_parser.py -k {turn}",
            "description": "Run the test",
        },
    }
    thinking = {
        "type": "thinking",
        "thinking": f"I should look at step {turn}.",
        "signature": "EqQBCkYIBxgCKkB" + "a" * 40,
    }
    result = {
        "type": "tool_result",
        "tool_use_id": tool_id,
        "content": f"FAILED tests/test_parser.py::test_{turn}\n" * 4 + result_marker,
        "is_error": turn % 4 == 3,
    }
    return [
        {
            "role": "assistant",
            "content": [thinking, {"type": "text", "text": "Let me check."}, tool_use],
        },
        {"role": "user", "content": [result]},
    ]

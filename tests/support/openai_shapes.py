"""A Codex CLI session's request shapes (public: FACTS.md, 'What coding agents send'), shared by the
unit tests of the Responses parser and the process-level tests with the official SDK."""

from __future__ import annotations

from typing import Any

from kvretention.dataplane.protocol import (
    ChatMessage,
    Reasoning,
    ToolCall,
    ToolDefinition,
    ToolGrammar,
)

LARK = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\nend_patch: "*** End Patch" LF?\n'
SHELL_PARAMS = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}},
        "workdir": {"type": "string"},
        "timeout_ms": {"type": "number"},
    },
    "required": ["command"],
    "additionalProperties": False,
}
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Runs a shell command and returns its output.",
    "strict": False,
    "parameters": SHELL_PARAMS,
}
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": LARK},
}
PATCH = "*** Begin Patch\n*** Update File: src/a.py\n@@\n-x = 1\n+x = 2\n*** End Patch\n"


def codex_body() -> dict[str, Any]:
    """A Codex CLI turn, shaped as the CLI sends it (FACTS.md, 'What coding agents send')."""
    return {
        "model": "m",
        "instructions": "You are Codex, a coding agent.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [
                    {"type": "input_text", "text": "<permissions>workspace-write</permissions>"}
                ],
            },
            {
                "type": "message",
                "role": "user",
                "content": [
                    {
                        "type": "input_text",
                        "text": "<environment_context>cwd=/repo</environment_context>",
                    }
                ],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "fix the bug"}],
            },
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "**Looking at files**"}],
                "content": None,
                "encrypted_content": "gAAAAopaque1",
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "name": "shell",
                "arguments": '{"command":["ls"]}',
                "call_id": "call_1",
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "README.md\nsrc"},
            {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAAAopaque2"},
            {
                "type": "custom_tool_call",
                "id": "ctc_1",
                "status": "completed",
                "call_id": "call_2",
                "name": "apply_patch",
                "input": PATCH,
            },
            {
                "type": "custom_tool_call_output",
                "call_id": "call_2",
                "output": "Success. Updated the following files:\nM src/a.py",
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Fixed."}],
                "phase": "final_answer",
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "now run the tests"}],
            },
        ],
        "tools": [SHELL, APPLY_PATCH],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "019a2b3c-conversation",
        "text": {"verbosity": "low"},
        "client_metadata": {"x-codex-turn": "2"},
    }


CODEX_MESSAGES = [
    ChatMessage(role="system", content="You are Codex, a coding agent."),
    ChatMessage(role="developer", content="<permissions>workspace-write</permissions>"),
    ChatMessage(role="user", content="<environment_context>cwd=/repo</environment_context>"),
    ChatMessage(role="user", content="fix the bug"),
    ChatMessage(
        role="assistant",
        reasoning=Reasoning(text="**Looking at files**", encrypted=True),
        tool_calls=[ToolCall(id="call_1", name="shell", arguments='{"command":["ls"]}')],
    ),
    ChatMessage(role="tool", content="README.md\nsrc", tool_call_id="call_1", name="shell"),
    ChatMessage(
        role="assistant",
        reasoning=Reasoning(text="", encrypted=True),
        tool_calls=[ToolCall(id="call_2", name="apply_patch", arguments=PATCH, kind="custom")],
    ),
    ChatMessage(
        role="tool",
        content="Success. Updated the following files:\nM src/a.py",
        tool_call_id="call_2",
        name="apply_patch",
    ),
    ChatMessage(role="assistant", content="Fixed."),
    ChatMessage(role="user", content="now run the tests"),
]
CODEX_TOOLS = [
    ToolDefinition(
        name="shell",
        description="Runs a shell command and returns its output.",
        parameters=SHELL_PARAMS,
        strict=False,
    ),
    ToolDefinition(
        kind="custom",
        name="apply_patch",
        description="Use the `apply_patch` tool to edit files.",
        grammar=ToolGrammar(syntax="lark", definition=LARK),
    ),
]

"""The engine stand-in's answer markers the real-CLI tier relies on: a tool call with the arguments
the prompt names (so Claude Code and Codex run a real command), then text after the tool result."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvretention.dataplane.worker.standin_reply import markers_of, plan_reply

BASH = {"name": "Bash", "parameters": {"type": "object", "required": ["command"]}}
TOOLS = f"<tools>\n{json.dumps({'type': 'function', 'function': BASH})}\n</tools>"


def _calls(prompt: str) -> list[dict[str, Any]]:
    text = "".join(plan_reply(prompt, sampling={}, tool_format="qwen25").pieces)
    return [json.loads(part.split("</tool_call>")[0]) for part in text.split("<tool_call>")[1:]]


@pytest.mark.parametrize(
    ("user", "arguments"),
    [
        pytest.param(
            '[[standin:tool_call:Bash]] [[standin:tool_args:{"command": "echo hi"}]]',
            {"command": "echo hi"},
            id="given",
        ),
        pytest.param(
            '[[standin:tool_call:Bash]] [[standin:tool_args:{"command": ["bash", "-lc", "ls"]}]]',
            {"command": ["bash", "-lc", "ls"]},
            id="brackets-inside",
        ),
        pytest.param("[[standin:tool_call:Bash]]", {"command": "stand-in"}, id="schema-filled"),
        pytest.param(
            "[[standin:tool_call:Bash]] [[standin:tool_args:not json]]",
            {"command": "stand-in"},
            id="unreadable-falls-back",
        ),
    ],
)
def test_tool_args_marker_sets_the_calls_arguments(user: str, arguments: dict[str, Any]) -> None:
    assert _calls(f"{TOOLS}<|im_start|>user\n{user}<|im_end|>\n") == [
        {"name": "Bash", "arguments": arguments}
    ]


def test_after_a_tool_result_the_stand_in_answers_with_text() -> None:
    """The tool result is the last user turn and carries no marker: the turn ends in text."""
    prompt = (
        f"{TOOLS}<|im_start|>user\n[[standin:tool_call:Bash]]<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>...</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nhi\n</tool_response><|im_end|>\n"
    )
    assert _calls(prompt) == []
    assert markers_of(prompt) == {}
    assert "".join(plan_reply(prompt, sampling={}, tool_format="qwen25").pieces) == (
        "Hello from the kvretention stand-in."
    )

"""Agent sessions as the frontend parses them turn by turn, for the tests that compare a
remembered parse with a full one: the replayed Claude Code and Codex bodies, each with its
provider's parser, and the ``output_config`` variation both kinds of test run."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from kvretention.dataplane.frontend.anthropic import parse_messages
from kvretention.dataplane.frontend.common import ParsedRequest
from kvretention.dataplane.frontend.openai import parse_responses
from kvretention.replay.sessions import claude_code_session, codex_session

Body = dict[str, Any]
Parse = Callable[..., ParsedRequest]
Session = tuple[Parse, Callable[[], list[Body]]]
"""A parser and the session's bodies, oldest turn first (built when called)."""


def claude_code_bodies(turns: int) -> list[Body]:
    return [body for _, body in claude_code_session(turns=turns)]


def codex_bodies(turns: int) -> list[Body]:
    return [body for _, body in codex_session(turns=turns)]


def with_output_config(bodies: list[Body], *, early: bool) -> list[Body]:
    """An ``output_config`` on the last message (this turn's effort) and, with ``early``, on the
    first (ignored, counted): the parse looks only at messages whose bytes name it."""
    out = []
    for body in bodies:
        body = copy.deepcopy(body)
        if early:
            body["messages"][0]["output_config"] = {"effort": "low"}
        body["messages"][-1]["output_config"] = {"effort": "high"}
        out.append(body)
    return out


def agent_sessions(turns: int) -> dict[str, Session]:
    """Claude Code (as sent, and with an early ``output_config``) and Codex, ``turns`` long."""
    return {
        "claude-code": (parse_messages, lambda: claude_code_bodies(turns)),
        "claude-code-early-output-config": (
            parse_messages,
            lambda: with_output_config(claude_code_bodies(turns), early=True),
        ),
        "codex": (parse_responses, lambda: codex_bodies(turns)),
    }

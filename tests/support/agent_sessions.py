"""The agent sessions moved into the package (``kvretention replay`` sends them); kept under this
name until every test imports them from there."""

from kvretention.replay.sessions import (
    CLAUDE_MODEL,
    CLAUDE_SMALL_MODEL,
    CODEX_MODEL,
    Request,
    claude_code_session,
    codex_session,
)

__all__ = [
    "CLAUDE_MODEL",
    "CLAUDE_SMALL_MODEL",
    "CODEX_MODEL",
    "Request",
    "claude_code_session",
    "codex_session",
]

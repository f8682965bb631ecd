"""Where a request names its session: one home for the keys the frontend reads and the API's
``spec.router.sessionKeys`` defaults to."""

from __future__ import annotations

from typing import Final

HEADER_SESSION: Final = "x-session-id"
"""Client-facing sticky-session header (the frontend copies it into ``session_id``)."""
DEFAULT_SESSION_KEYS: Final[tuple[str, ...]] = (
    HEADER_SESSION,
    "x-dynamo-session-id",
    "thread-id",
    "session-id",
    "session_id",
    "x-claude-code-session-id",
    "client_metadata.session_id",
    "metadata.user_id",
)
"""Where the frontend looks for a session, in order: header names, or ``metadata.<field>`` /
``client_metadata.<field>`` of the body. Explicit keys first (``x-session-id``, and
``X-Dynamo-Session-ID`` that Dynamo-style gateways set); then Codex 0.169's ``thread-id`` (one
conversation: a sub-agent has its own) and ``session-id`` headers, older Codex's ``session_id``;
Claude Code's ``X-Claude-Code-Session-Id``; Codex's body ``client_metadata.session_id``; Claude
Code's ``metadata.user_id`` (a JSON string that holds its session id). ``spec.router.sessionKeys``
overrides it per fleet."""

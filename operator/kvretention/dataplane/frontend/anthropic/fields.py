"""Anthropic Messages fields: which top-level fields exist and what happens to each, and the
field checks in the Messages API's (pydantic) wording that every part of the parser uses."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

from kvretention.dataplane.frontend import compat
from kvretention.dataplane.frontend.validate import Fields
from kvretention.hints.anthropic import CACHE_CONTROL

F: Final = Fields(anthropic=True)
OMIT_THINKING: Final = "omit_thinking"
"""``ParsedRequest.echo`` key: the client asked for ``thinking.display: omitted``."""
HONOURED: Final = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "stream",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        CACHE_CONTROL,
    }
)
NO_OPS: Final[Mapping[str, str]] = {
    "metadata": "validated (user_id); a session source, never forwarded to the engine",
    "service_tier": "validated ('auto' or 'standard_only'); one tier here",
    "inference_geo": "validated (a string); one location here",
    "speed": "validated ('standard' or 'fast'); one speed here",
    "user_profile_id": "validated (a string); no accounts here",
    "workspace_id": "validated (a string); no workspaces here",
    "context_management": "only the no-op edit clear_thinking_20251015 with keep 'all' is accepted",
    "diagnostics": "cache-miss diagnostics are not reported here",
    "fallbacks": "one model here: nothing to fall back to",
    "fallback_credit_token": "one model here: nothing to fall back to",
    "billing_policy": "no billing here",
}
"""Accepted, checked where they have a shape, and without effect on what the model computes
(listed in docs/frontend.md); each is counted as ignored except ``metadata``, which the frontend
reads for the session."""
REFUSED: Final[Mapping[str, str]] = {
    "container": "code-execution containers are not available on this server",
    "mcp_servers": "MCP connectors are not available on this server",
    "compaction": "server-side compaction is not available on this server",
    "thread": "threads are not available on this server",
    "output_format": "use output_config.format for structured output",
    "safeguards": "auto mode's safety classifier does not run on this server; send the request "
    "without 'safeguards' and run the check on the client (Claude Code retries so by itself)",
}
"""Real Messages fields that would change the answer and are not implemented: a 400 naming them,
never a silent drop. ``safeguards`` asks the server to run Claude Code's auto-mode safety check
and return ``safeguard_results``; Claude Code's gateway contract (``claude gateway``'s
``/protocol``) says a server that cannot must answer this 400, after which the client runs the
check itself, so accepting it silently would skip the check."""
COUNT_FIELDS: Final = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        CACHE_CONTROL,
        "speed",
        "user_profile_id",
        "workspace_id",
        "context_management",
    }
)
"""``/v1/messages/count_tokens`` takes the prompt-shaping fields (as Anthropic's does); others are
ignored and counted."""


def check_fields(body: Mapping[str, Any], *, allowed: Collection[str]) -> None:
    """Refuse fields that would change the answer by name; no-ops and unknown keys are ignored
    and counted (``compat``); check the no-ops' shapes."""
    for key, value in body.items():
        if value is None:
            continue  # carries nothing
        if key in REFUSED:
            raise F.unsupported(key, f"'{key}' is not supported by this server: {REFUSED[key]}")
        if key not in allowed or (key in NO_OPS and key != "metadata"):
            compat.ignore(key)
    _check_no_ops(body)


def check_keys(block: Mapping[str, Any], allowed: frozenset[str], *, where: str) -> None:
    """Keys of a known object outside ``allowed`` are ignored and counted (``compat``'s rule)."""
    known = _WITH_TYPE.get(allowed)
    if known is None:
        known = _WITH_TYPE[allowed] = allowed | {"type"}
    if isinstance(block, dict) and block.keys() <= known:
        return  # every key known: the common case, one set comparison per block
    compat.ignore_unknown(block, known=lambda key: key == "type" or key in allowed, where=where)


_WITH_TYPE: Final[dict[frozenset[str], frozenset[str]]] = {}


def _check_no_ops(body: Mapping[str, Any]) -> None:
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise F.invalid_type("metadata", metadata, expected="a valid dictionary")
        check_keys(metadata, frozenset({"user_id"}), where="metadata")
        F.opt_str(metadata, "user_id", param="metadata.user_id")
    literal(body, "service_tier", ("auto", "standard_only"))
    literal(body, "speed", ("standard", "fast"))
    for key in ("inference_geo", "user_profile_id", "workspace_id"):
        F.opt_str(body, key)
    management = body.get("context_management")
    if management is not None:
        _context_management(management)


def literal(body: Mapping[str, Any], key: str, values: tuple[str, ...], *, param: str = "") -> Any:
    value = body.get(key)
    if value is not None and value not in values:
        choices = " or ".join(f"'{v}'" for v in values)
        raise F.invalid_value(param or key, f"Input should be {choices}")
    return value


def _context_management(value: object) -> None:
    """Only ``clear_thinking_20251015`` keeping all turns (what Claude Code sends) changes nothing."""
    if not isinstance(value, dict):
        raise F.invalid_type("context_management", value, expected="a valid dictionary")
    check_keys(value, frozenset({"edits"}), where="context_management")
    edits = value.get("edits") or []
    if not isinstance(edits, list):
        raise F.invalid_type("context_management.edits", edits, expected="a valid list")
    for i, edit in enumerate(edits):
        where = f"context_management.edits.{i}"
        if not (
            isinstance(edit, dict)
            and edit.get("type") == "clear_thinking_20251015"
            and edit.get("keep") in ("all", {"type": "all"})
            and set(edit) <= {"type", "keep"}
        ):
            raise F.unsupported(
                where,
                "context editing is not supported by this server; only "
                "{'type': 'clear_thinking_20251015', 'keep': 'all'} (which keeps everything) is",
            )


def req_str(block: Mapping[str, Any], key: str, *, where: str) -> str:
    if key not in block:
        raise F.missing(f"{where}.{key}")
    value = block[key]
    if not isinstance(value, str):
        raise F.invalid_type(f"{where}.{key}", value, expected="a valid string")
    return value

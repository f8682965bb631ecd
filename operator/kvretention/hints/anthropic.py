"""Anthropic Messages prompt-cache controls -> the KV-hint envelope.

Only the top-level (automatic) ``cache_control`` becomes a hint: ``ephemeral`` with ttl ``5m``
(the default) is 300 s, ``1h`` is 3,600 s. A ``cache_control`` on any block (system, tools, message
content of any type, nested tool results) marks a prefix breakpoint; v1 refuses it rather than
widen it to the whole prompt, also when a top-level one is present, so no partial hint is ever made.
Messages follow Anthropic's ``<path>: <reason>`` wording.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kvretention.hints.envelope import KvHintEnvelope
from kvretention.hints.errors import CacheControlError, ClientErrorCode, json_type

CACHE_CONTROL: Final = "cache_control"

TTLS: Final[Mapping[str, int]] = {"5m": 300, "1h": 3_600}
DEFAULT_TTL: Final = "5m"
_KEYS: Final = frozenset({"type", "ttl"})
_ENVELOPES: Final = {name: KvHintEnvelope.retain(seconds) for name, seconds in TTLS.items()}
"""Built once: the envelope is frozen, and pydantic construction would dominate a small request."""


def normalize_messages(body: Mapping[str, Any]) -> KvHintEnvelope | None:
    """A parsed ``POST /v1/messages`` body -> envelope, ``None``, or :class:`CacheControlError`."""
    envelope = _top_level_envelope(body.get(CACHE_CONTROL))
    system = body.get("system")
    if type(system) is list:
        found = _find_in_blocks(system)
        if found is not None:
            raise _block_error("system", *found)
    tools = body.get("tools")
    if type(tools) is list:
        for i, tool in enumerate(tools):
            if type(tool) is dict and tool.get(CACHE_CONTROL) is not None:
                raise _block_error("tools", i)
    messages = body.get("messages")
    if type(messages) is list:
        for i, message in enumerate(messages):
            if type(message) is not dict:
                continue
            if message.get(CACHE_CONTROL) is not None:
                raise _block_error("messages", i)
            content = message.get("content")
            if type(content) is list:
                found = _find_in_blocks(content)
                if found is not None:
                    raise _block_error("messages", i, "content", *found)
    return envelope


def _top_level_envelope(control: object) -> KvHintEnvelope | None:
    if control is None:  # absent or null: no automatic caching requested
        return None
    if not isinstance(control, dict):
        raise CacheControlError(
            f"{CACHE_CONTROL}: Input should be an object, got {json_type(control)}",
            param=CACHE_CONTROL,
            code=ClientErrorCode.INVALID_TYPE,
        )
    for key in control:
        if key not in _KEYS:
            raise CacheControlError(
                f"{CACHE_CONTROL}.{key}: Extra inputs are not permitted",
                param=f"{CACHE_CONTROL}.{key}",
                code=ClientErrorCode.UNKNOWN_PARAMETER,
            )
    if "type" not in control:
        raise CacheControlError(
            f"{CACHE_CONTROL}.type: Field required",
            param=f"{CACHE_CONTROL}.type",
            code=ClientErrorCode.MISSING_REQUIRED_PARAMETER,
        )
    kind = control["type"]
    if kind != "ephemeral":
        raise _error(f"{CACHE_CONTROL}.type", "Input should be 'ephemeral'", value=kind)
    ttl = control.get("ttl")
    if ttl is None:  # Anthropic treats a null optional field as absent
        ttl = DEFAULT_TTL
    if not isinstance(ttl, str) or ttl not in TTLS:
        raise _error(f"{CACHE_CONTROL}.ttl", "Input should be '5m' or '1h'", value=ttl)
    return _ENVELOPES[ttl]


def _find_in_blocks(blocks: list[Any]) -> list[str | int] | None:
    """The relative path of the first block carrying a non-null ``cache_control``, else ``None``.

    Only block structure is walked (``content`` lists and a document's ``source.content``); tool
    inputs and schemas are user data and may legitimately hold a key named ``cache_control``.
    Paths are built only on a hit, so the common, clean request pays for lookups alone.
    """
    for j, block in enumerate(blocks):
        if type(block) is not dict:
            continue
        if block.get(CACHE_CONTROL) is not None:
            return [j]
        nested = block.get("content")
        if type(nested) is list:
            found = _find_in_blocks(nested)
            if found is not None:
                return [j, "content", *found]
        source = block.get("source")
        if type(source) is dict and type(source.get("content")) is list:
            found = _find_in_blocks(source["content"])
            if found is not None:
                return [j, "source", "content", *found]
    return None


def _block_error(*path: str | int) -> CacheControlError:
    param = ".".join(str(p) for p in (*path, CACHE_CONTROL))
    return CacheControlError(
        f"{param}: block-level cache_control breakpoints are not supported by this server; "
        "remove it and set the top-level 'cache_control' to retain the full prompt",
        param=param,
        code=ClientErrorCode.UNSUPPORTED_PARAMETER,
    )


def _error(param: str, reason: str, *, value: object) -> CacheControlError:
    """``type`` and ``ttl`` are string enums: a non-string is a type error, anything else a value."""
    code = ClientErrorCode.INVALID_VALUE if isinstance(value, str) else ClientErrorCode.INVALID_TYPE
    return CacheControlError(f"{param}: {reason}", param=param, code=code)

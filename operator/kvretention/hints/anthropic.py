"""Anthropic Messages prompt-cache controls -> :class:`~kvretention.hints.intent.CacheHints`.

The top-level (automatic) ``cache_control`` retains the full prompt: ``ephemeral`` with ttl
``5m`` (the default) is 300 s, ``1h`` is 3,600 s. A ``cache_control`` on a block (tool definition,
system block, message content block of any cacheable type, blocks nested in a ``tool_result`` or a
``document``'s content source) is a breakpoint:

- ``prefix`` mode (v2): retain the prompt up to the end of that block, with Anthropic's rules: at
  most 4 breakpoints counting the automatic one, and in processing order (``tools``, ``system``,
  ``messages``; nested blocks before the block that holds them; the automatic one last) a ``1h``
  breakpoint may not follow a ``5m`` one. Keys other than ``type`` and ``ttl`` inside any
  ``cache_control`` (Claude Code's ``scope``) are accepted and ignored. ``thinking`` /
  ``redacted_thinking`` blocks and message objects have no ``cache_control`` field in Anthropic's
  API, so one there is an extra input, as Anthropic answers.
- ``reject`` mode (v1): any block-level ``cache_control`` is refused, also beside a top-level one,
  so no partial hint is ever made; extra keys in the top-level ``cache_control`` are refused.

Messages follow Anthropic's ``<path>: <reason>`` wording.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import compress, count
from typing import Any, Final

from kvretention.hints.envelope import KvHintEnvelope
from kvretention.hints.errors import CacheControlError, ClientErrorCode, json_type
from kvretention.hints.intent import (
    NO_HINTS,
    Breakpoint,
    BreakpointMode,
    CacheHints,
    Position,
    build_hints,
)

CACHE_CONTROL: Final = "cache_control"
_NAMED: Final = b'"cache_control"'
"""How a compact JSON encoding of a message that holds the key (at any depth) names it."""

TTLS: Final[Mapping[str, int]] = {"5m": 300, "1h": 3_600}
DEFAULT_TTL: Final = "5m"
MAX_BREAKPOINTS: Final = 4
"""Anthropic's limit on blocks with ``cache_control`` per request, the automatic one included."""
NOT_CACHEABLE: Final = frozenset({"thinking", "redacted_thinking"})
"""Block types whose Anthropic schema has no ``cache_control`` field."""
_KEYS: Final = frozenset({"type", "ttl"})
_ENVELOPES: Final = {name: KvHintEnvelope.retain(seconds) for name, seconds in TTLS.items()}
"""Built once: the envelope is frozen, and pydantic construction would dominate a small request."""
_FULL_PROMPT: Final = {
    name: CacheHints(envelope=env, client_controls=True) for name, env in _ENVELOPES.items()
}
_ORDER_NOTE: Final = (
    "Note that blocks are processed in the following order: `tools`, `system`, `messages`."
)


def hints_from_messages(
    body: Mapping[str, Any],
    *,
    breakpoints: BreakpointMode = "prefix",
    encoded: Sequence[bytes] | None = None,
) -> CacheHints:
    """A parsed ``POST /v1/messages`` body -> :class:`CacheHints`, or :class:`CacheControlError`.

    ``encoded`` is each message's compact JSON encoding, when the caller has it (the frontend's
    resumer does): a message whose bytes never name ``"cache_control"`` holds no control at any
    depth, so its blocks are not walked. An encoder that writes keys as themselves (msgspec,
    ``json.dumps``) makes this exact; the client's own bytes would not (a key may come ``\\u``-escaped).
    """
    if breakpoints == "reject":
        envelope = normalize_messages(body)
        return CacheHints(envelope=envelope, client_controls=envelope is not None)
    top = body.get(CACHE_CONTROL)
    top_ttl = None if top is None else _ttl_name(top, where=CACHE_CONTROL, strict=False)
    found = [
        (path, _ttl_name(control, where=_param(path), strict=False))
        for path, control in _block_controls(body, encoded=encoded)
    ]
    if not found:
        return NO_HINTS if top_ttl is None else _FULL_PROMPT[top_ttl]
    order: list[tuple[Position | None, str]] = list(found)
    if top_ttl is not None and not _shares_target(body, found, top_ttl):
        order.append((None, top_ttl))  # the automatic breakpoint: the last cacheable block
    _check_count(order)
    _check_ttl_order(order)
    return build_hints(
        full_prompt_ttl=None if top_ttl is None else TTLS[top_ttl],
        breakpoints=tuple(Breakpoint(path, TTLS[name]) for path, name in found),
        client_controls=True,
    )


def normalize_messages(body: Mapping[str, Any]) -> KvHintEnvelope | None:
    """v1 (``reject`` mode): a ``POST /v1/messages`` body -> envelope, ``None``, or an error."""
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
    return _ENVELOPES[_ttl_name(control, where=CACHE_CONTROL, strict=True)]


def _ttl_name(control: object, *, where: str, strict: bool) -> str:
    """Validate one ``cache_control`` object; its TTL name. ``strict`` refuses extra keys (v1)."""
    if not isinstance(control, dict):
        raise CacheControlError(
            f"{where}: Input should be an object, got {json_type(control)}",
            param=where,
            code=ClientErrorCode.INVALID_TYPE,
        )
    if strict:
        for key in control:
            if key not in _KEYS:
                raise _extra_input(f"{where}.{key}")
    if "type" not in control:
        raise CacheControlError(
            f"{where}.type: Field required",
            param=f"{where}.type",
            code=ClientErrorCode.MISSING_REQUIRED_PARAMETER,
        )
    kind = control["type"]
    if kind != "ephemeral":
        raise _error(f"{where}.type", "Input should be 'ephemeral'", value=kind)
    ttl = control.get("ttl")
    if ttl is None:  # Anthropic treats a null optional field as absent
        ttl = DEFAULT_TTL
    if not isinstance(ttl, str) or ttl not in TTLS:
        raise _error(f"{where}.ttl", "Input should be '5m' or '1h'", value=ttl)
    return ttl


def _block_controls(
    body: Mapping[str, Any], *, encoded: Sequence[bytes] | None = None
) -> list[tuple[Position, object]]:
    """Every non-null block-level ``cache_control``, in Anthropic's processing order (messages
    whose ``encoded`` bytes lack the key skipped: see :func:`hints_from_messages`)."""
    found: list[tuple[Position, object]] = []
    tools = body.get("tools")
    if type(tools) is list:
        for i, tool in enumerate(tools):
            if type(tool) is dict and tool.get(CACHE_CONTROL) is not None:
                found.append((("tools", i), tool[CACHE_CONTROL]))
    system = body.get("system")
    if type(system) is list:
        _walk_blocks(system, ("system",), found)
    messages = body.get("messages")
    if type(messages) is list:
        if encoded is not None and len(encoded) != len(messages):
            encoded = None
        # an empty encoding never names the key: those positions are skipped in C
        positions = range(len(messages)) if encoded is None else compress(count(), encoded)
        for i in positions:
            message = messages[i]
            if type(message) is not dict or (encoded is not None and _NAMED not in encoded[i]):
                continue
            if message.get(CACHE_CONTROL) is not None:
                raise _extra_input(_param(("messages", i)))
            content = message.get("content")
            if type(content) is list:
                _walk_blocks(content, ("messages", i, "content"), found)
    return found


def _walk_blocks(blocks: list[Any], at: Position, found: list[tuple[Position, object]]) -> None:
    """Append the controls of ``blocks``; nested blocks come before the block that holds them
    (they end first in the prompt).

    Only block structure is walked (``content`` lists and a document's ``source.content``); tool
    inputs and schemas are user data and may hold a key named ``cache_control``. A loop of plain
    lookups: paths are built only for nested lists and hits.
    """
    for j, block in enumerate(blocks):
        if type(block) is not dict:
            continue
        nested = block.get("content")
        if type(nested) is list and nested:
            _walk_blocks(nested, (*at, j, "content"), found)
        source = block.get("source")
        if type(source) is dict and type(source.get("content")) is list:
            _walk_blocks(source["content"], (*at, j, "source", "content"), found)
        control = block.get(CACHE_CONTROL)
        if control is not None:
            kind = block.get("type")
            if isinstance(kind, str) and kind in NOT_CACHEABLE:
                raise _extra_input(_param((*at, j)))
            found.append(((*at, j), control))


def _shares_target(body: Mapping[str, Any], found: list[tuple[Position, str]], top: str) -> bool:
    """Whether the automatic breakpoint lands on a block that already has one (same slot).

    The automatic breakpoint goes on the last block of the last message; a block-level
    ``cache_control`` there must then agree on the TTL, as Anthropic requires.
    """
    messages = body.get("messages")
    if type(messages) is not list or not messages or type(messages[-1]) is not dict:
        return False
    content = messages[-1].get("content")
    if type(content) is not list or not content:
        return False
    target: Position = ("messages", len(messages) - 1, "content", len(content) - 1)
    for path, name in found:
        if path == target:
            if name != top:
                raise CacheControlError(
                    f"{CACHE_CONTROL}.ttl: Top-level cache_control has ttl='{top}' but the "
                    f"target block already has cache_control with ttl='{name}'",
                    param=f"{CACHE_CONTROL}.ttl",
                    code=ClientErrorCode.INVALID_VALUE,
                )
            return True
    return False


def _check_count(order: list[tuple[Position | None, str]]) -> None:
    if len(order) <= MAX_BREAKPOINTS:
        return
    path = order[MAX_BREAKPOINTS][0]
    param = CACHE_CONTROL if path is None else _param(path)
    raise CacheControlError(
        f"{param}: A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
        f"Found {len(order)}.",
        param=param,
        code=ClientErrorCode.INVALID_VALUE,
    )


def _check_ttl_order(order: list[tuple[Position | None, str]]) -> None:
    """A longer TTL may not follow a shorter one in processing order."""
    shortest: str | None = None
    for path, name in order:
        if shortest is not None and TTLS[name] > TTLS[shortest]:
            param = f"{CACHE_CONTROL if path is None else _param(path)}.ttl"
            raise CacheControlError(
                f"{param}: a ttl='{name}' cache_control block must not come after a "
                f"ttl='{shortest}' cache_control block. {_ORDER_NOTE}",
                param=param,
                code=ClientErrorCode.INVALID_VALUE,
            )
        if shortest is None or TTLS[name] < TTLS[shortest]:
            shortest = name


def _param(path: Position) -> str:
    return ".".join(str(p) for p in (*path, CACHE_CONTROL))


def _extra_input(param: str) -> CacheControlError:
    return CacheControlError(
        f"{param}: Extra inputs are not permitted",
        param=param,
        code=ClientErrorCode.UNKNOWN_PARAMETER,
    )


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

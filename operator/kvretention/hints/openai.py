"""OpenAI prompt-cache controls (Chat Completions and Responses) -> :class:`CacheHints`.

``prompt_cache_options`` in implicit mode retains the full prompt (the implicit breakpoint).
Part-level ``prompt_cache_breakpoint: {"mode": "explicit", "ttl"?}`` markers are breakpoints:

- ``prefix`` mode (v2): retain the prompt up to the end of that part for the breakpoint's TTL
  (default: the request's ``prompt_cache_options.ttl``, else ``30m``). As OpenAI does, explicit
  mode drops the implicit breakpoint (no breakpoints there: nothing is retained), and a request
  writes at most the latest 3 explicit breakpoints beside the implicit one, or the latest 4 in
  explicit mode; earlier ones are not written (not an error). Only the part types OpenAI defines
  the field on carry one (chat ``text``, ``image_url``, ``input_audio``, ``file``; Responses
  ``input_text``, ``input_image``, ``input_file``).
- ``reject`` mode (v1): explicit mode and every breakpoint are refused (widening a prefix to the
  whole prompt would be a lie).

``prompt_cache_key`` and the legacy ``prompt_cache_retention`` are type-checked and otherwise left
alone: they never make, widen or shorten a hint. Messages follow OpenAI's own wording.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
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

OPTIONS: Final = "prompt_cache_options"
BREAKPOINT: Final = "prompt_cache_breakpoint"
BREAKPOINT_KEY: Final = b'"prompt_cache_breakpoint"'
"""How a compact JSON encoding of an item that holds the key (at any depth) names it."""

CHAT_TTLS: Final[Mapping[str, int]] = {"30m": 1_800}
"""Chat Completions publishes one TTL."""

RESPONSES_TTLS: Final[Mapping[str, int]] = {"30m": 1_800, "12h": 43_200}
"""The Responses API also publishes ``12h``; it maps to its own typed TTL, never to 30 minutes."""

CHAT_BREAKPOINT_PARTS: Final = frozenset({"text", "image_url", "input_audio", "file"})
RESPONSES_BREAKPOINT_PARTS: Final = frozenset({"input_text", "input_image", "input_file"})
WRITTEN_BREAKPOINTS: Final[Mapping[str, int]] = {"implicit": 3, "explicit": 4}
"""How many of the latest explicit breakpoints a request writes, per mode (4 in all)."""

_MODES: Final = ("implicit", "explicit")
_LEGACY_RETENTION: Final = ("in_memory", "24h")
_CHAT_OPTION_KEYS: Final = frozenset({"mode", "ttl"})
_RESPONSES_OPTION_KEYS: Final = frozenset({"mode", "ttl", "prewarm", "comparison_response_id"})


def hints_from_chat_completions(
    body: Mapping[str, Any],
    *,
    breakpoints: BreakpointMode = "prefix",
    encoded: Sequence[bytes] | None = None,
) -> CacheHints:
    """A parsed ``POST /v1/chat/completions`` body -> :class:`CacheHints`, or an error
    (``encoded``: each message's, as for :func:`hints_from_responses`)."""
    if breakpoints == "reject":
        return _v1_hints(normalize_chat_completions(body), body)
    _check_pass_through(body)
    options = _options(body, ttls=CHAT_TTLS, allowed=_CHAT_OPTION_KEYS, explicit=True)
    found = _chat_parts(body, encoded=encoded)
    return _prefix_hints(options, found, ttls=CHAT_TTLS, parts=CHAT_BREAKPOINT_PARTS)


def hints_from_responses(
    body: Mapping[str, Any],
    *,
    breakpoints: BreakpointMode = "prefix",
    encoded: Sequence[bytes] | None = None,
) -> CacheHints:
    """A parsed ``POST /v1/responses`` body -> :class:`CacheHints`, or an error.

    ``encoded`` is each ``input`` item's compact JSON encoding, when the caller has it: an item
    whose bytes never name ``"prompt_cache_breakpoint"`` is not walked (exact for an encoder that
    writes keys as themselves: msgspec, ``json.dumps``). It pays where the caller knows most
    items' answer already (the frontend's resumer remembers it per repeated item); scanning
    every item's bytes costs more than this walk."""
    if breakpoints == "reject":
        return _v1_hints(normalize_responses(body), body)
    _check_pass_through(body)
    options = _options(body, ttls=RESPONSES_TTLS, allowed=_RESPONSES_OPTION_KEYS, explicit=True)
    return _prefix_hints(
        options,
        _responses_parts(body, encoded=encoded),
        ttls=RESPONSES_TTLS,
        parts=RESPONSES_BREAKPOINT_PARTS,
    )


def _v1_hints(envelope: KvHintEnvelope | None, body: Mapping[str, Any]) -> CacheHints:
    return CacheHints(envelope=envelope, client_controls=OPTIONS in body)


def _prefix_hints(
    options: tuple[str, str] | None,
    found: list[tuple[Position, dict[str, Any]]],
    *,
    ttls: Mapping[str, int],
    parts: frozenset[str],
) -> CacheHints:
    mode, ttl = options if options is not None else ("implicit", "30m")
    marked = [
        Breakpoint(path, _breakpoint_seconds(part, path=path, ttls=ttls, default=ttl, parts=parts))
        for path, part in found
    ]
    full = ttls[ttl] if options is not None and mode == "implicit" else None
    if not marked:
        if full is not None:
            return _full_prompt(full)
        return _EXPLICIT_NOTHING if options is not None else NO_HINTS
    kept = tuple(marked[-WRITTEN_BREAKPOINTS[mode] :]) if marked else ()
    return build_hints(full_prompt_ttl=full, breakpoints=kept, client_controls=True)


def normalize_chat_completions(body: Mapping[str, Any]) -> KvHintEnvelope | None:
    """v1 (``reject`` mode): a ``POST /v1/chat/completions`` body -> envelope, ``None``, or error."""
    _check_pass_through(body)
    envelope = _options_envelope(body, ttls=CHAT_TTLS, allowed=_CHAT_OPTION_KEYS)
    for i, message in _maybe_marked(body.get("messages")):
        j = _breakpoint_index(message.get("content"))
        if j is not None:
            raise _breakpoint_error(f"messages[{i}].content[{j}].{BREAKPOINT}")
    return envelope


def normalize_responses(body: Mapping[str, Any]) -> KvHintEnvelope | None:
    """v1 (``reject`` mode): a ``POST /v1/responses`` body -> envelope, ``None``, or an error."""
    _check_pass_through(body)
    envelope = _options_envelope(body, ttls=RESPONSES_TTLS, allowed=_RESPONSES_OPTION_KEYS)
    for i, item in _maybe_marked(body.get("input")):
        if item.get(BREAKPOINT) is not None:  # a bare input_text/... part used as an item
            raise _breakpoint_error(f"input[{i}].{BREAKPOINT}")
        # message items hold parts in "content", function_call_output items in "output"
        for key in ("content", "output"):
            j = _breakpoint_index(item.get(key))
            if j is not None:
                raise _breakpoint_error(f"input[{i}].{key}[{j}].{BREAKPOINT}")
    return envelope


def _options_envelope(
    body: Mapping[str, Any], *, ttls: Mapping[str, int], allowed: frozenset[str]
) -> KvHintEnvelope | None:
    if OPTIONS not in body:
        return None
    fast = _fast_path(body[OPTIONS], ttls=ttls, allowed=allowed)
    if fast is not None:
        return _envelope(ttls[fast])
    options = _options(body, ttls=ttls, allowed=allowed, explicit=False)
    return None if options is None else _envelope(ttls[options[1]])


def _options(
    body: Mapping[str, Any], *, ttls: Mapping[str, int], allowed: frozenset[str], explicit: bool
) -> tuple[str, str] | None:
    """``(mode, ttl)`` of a valid ``prompt_cache_options``; ``None`` when absent.

    ``explicit=False`` (v1) refuses explicit mode.
    """
    if OPTIONS not in body:
        return None
    options = body[OPTIONS]
    fast = _fast_path(options, ttls=ttls, allowed=allowed)
    if fast is not None:
        return "implicit", fast
    if not isinstance(options, dict):
        raise _invalid_type(OPTIONS, options, expected="an object")
    for key in options:
        if key not in allowed:
            raise _unknown(f"{OPTIONS}.{key}")
    mode = _enum(options, "mode", default="implicit", values=_MODES)
    if mode == "explicit" and not explicit:
        raise CacheControlError(
            f"Unsupported value for '{OPTIONS}.mode': 'explicit' prompt caching is not supported "
            "by this server; only implicit full-prompt retention is. Omit it or use 'implicit'.",
            param=f"{OPTIONS}.mode",
            code=ClientErrorCode.UNSUPPORTED_VALUE,
        )
    ttl = _enum(options, "ttl", default="30m", values=tuple(ttls))
    prewarm = options.get("prewarm", False)
    if not isinstance(prewarm, bool):
        raise _invalid_type(f"{OPTIONS}.prewarm", prewarm, expected="a boolean")
    if prewarm:
        raise CacheControlError(
            f"Unsupported value for '{OPTIONS}.prewarm': prompt cache prewarming is not supported "
            "by this server.",
            param=f"{OPTIONS}.prewarm",
            code=ClientErrorCode.UNSUPPORTED_VALUE,
        )
    comparison = options.get("comparison_response_id")
    if comparison is not None and not isinstance(comparison, str):
        raise _invalid_type(f"{OPTIONS}.comparison_response_id", comparison, expected="a string")
    return mode, ttl


def _fast_path(options: object, *, ttls: Mapping[str, int], allowed: frozenset[str]) -> str | None:
    """The common valid implicit case's TTL in a few lookups; else the checked path decides."""
    if type(options) is not dict or not options.keys() <= allowed:
        return None
    ttl = options.get("ttl", "30m")
    if (
        options.get("mode", "implicit") == "implicit"
        and type(ttl) is str
        and ttl in ttls
        and options.get("prewarm", False) is False
        and type(options.get("comparison_response_id", "")) is str
    ):
        return ttl
    return None


def _maybe_marked(
    items: object, *, encoded: Sequence[bytes] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The object items of a ``messages`` or ``input`` array, with their index, that may hold a
    breakpoint: every one, or with ``encoded`` (each item's compact JSON, when there is one per
    item) only those whose encoding names the key, so a request without markers is not walked."""
    if type(items) is not list:
        return
    if encoded is None or len(encoded) != len(items):
        for i, item in enumerate(items):
            if type(item) is dict:
                yield i, item
        return
    # an empty encoding never names the key: those positions are skipped in C (a Python test of
    # each item's bytes costs more than walking the item)
    for i in compress(count(), encoded):
        item = items[i]
        if type(item) is dict and BREAKPOINT_KEY in encoded[i]:
            yield i, item


def _chat_parts(
    body: Mapping[str, Any], *, encoded: Sequence[bytes] | None = None
) -> list[tuple[Position, dict[str, Any]]]:
    """Parts carrying a non-null ``prompt_cache_breakpoint``, in prompt order."""
    found: list[tuple[Position, dict[str, Any]]] = []
    for i, message in _maybe_marked(body.get("messages"), encoded=encoded):
        _marked(message.get("content"), "messages", i, "content", found)
    return found


def _responses_parts(
    body: Mapping[str, Any], *, encoded: Sequence[bytes] | None = None
) -> list[tuple[Position, dict[str, Any]]]:
    found: list[tuple[Position, dict[str, Any]]] = []
    for i, item in _maybe_marked(body.get("input"), encoded=encoded):
        if item.get(BREAKPOINT) is not None:  # a bare input_text/... part used as an item
            found.append((("input", i), item))
        # message items hold parts in "content", function_call_output items in "output"
        _marked(item.get("content"), "input", i, "content", found)
        _marked(item.get("output"), "input", i, "output", found)
    return found


def _marked(
    parts: object, where: str, i: int, key: str, found: list[tuple[Position, dict[str, Any]]]
) -> None:
    """Paths are built only on a hit, so a clean request pays for lookups alone."""
    if type(parts) is list:
        for j, part in enumerate(parts):
            if type(part) is dict and part.get(BREAKPOINT) is not None:
                found.append(((where, i, key, j), part))


def _breakpoint_seconds(
    part: dict[str, Any],
    *,
    path: Position,
    ttls: Mapping[str, int],
    default: str,
    parts: frozenset[str],
) -> int:
    """Validate one part's breakpoint as OpenAI does; its TTL in seconds."""
    param = _param(path)
    kind = part.get("type")
    if not isinstance(kind, str) or kind not in parts:  # the part's schema has no such field
        raise _unknown(param)
    marker = part[BREAKPOINT]
    if not isinstance(marker, dict):
        raise _invalid_type(param, marker, expected="an object")
    for key in marker:
        if key not in ("mode", "ttl"):
            raise _unknown(f"{param}.{key}")
    if "mode" not in marker:
        raise CacheControlError(
            f"Missing required parameter: '{param}.mode'.",
            param=f"{param}.mode",
            code=ClientErrorCode.MISSING_REQUIRED_PARAMETER,
        )
    _check_enum(marker["mode"], param=f"{param}.mode", values=("explicit",))
    ttl = marker.get("ttl", default)
    return ttls[_check_enum(ttl, param=f"{param}.ttl", values=tuple(ttls))]


def _param(path: Position) -> str:
    """OpenAI's path style: ``messages[1].content[0].prompt_cache_breakpoint``."""
    out = str(path[0])
    for p in path[1:]:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return f"{out}.{BREAKPOINT}"


def _unknown(param: str) -> CacheControlError:
    return CacheControlError(
        f"Unknown parameter: '{param}'.", param=param, code=ClientErrorCode.UNKNOWN_PARAMETER
    )


_ENVELOPES: Final[dict[int, KvHintEnvelope]] = {}
_FULL_PROMPT: Final[dict[int, CacheHints]] = {}
_EXPLICIT_NOTHING: Final = CacheHints(client_controls=True)
"""Explicit mode without breakpoints: the client asked for no caching (never the fleet default)."""


def _full_prompt(seconds: int) -> CacheHints:
    hints = _FULL_PROMPT.get(seconds)
    if hints is None:
        hints = _FULL_PROMPT[seconds] = CacheHints(
            envelope=_envelope(seconds), client_controls=True
        )
    return hints


def _envelope(seconds: int) -> KvHintEnvelope:
    """Envelopes are frozen, so one per TTL is built once; pydantic would dominate small requests."""
    envelope = _ENVELOPES.get(seconds)
    if envelope is None:
        envelope = _ENVELOPES[seconds] = KvHintEnvelope.retain(seconds)
    return envelope


def _enum(options: Mapping[str, Any], key: str, *, default: str, values: Sequence[str]) -> str:
    return _check_enum(options.get(key, default), param=f"{OPTIONS}.{key}", values=values)


def _check_enum(value: object, *, param: str, values: Sequence[str]) -> str:
    if not isinstance(value, str):
        raise _invalid_type(param, value, expected="a string")
    if value not in values:
        supported = ", ".join(f"'{v}'" for v in values)
        raise CacheControlError(
            f"Invalid value for '{param}': '{value}'. Supported values are: {supported}.",
            param=param,
            code=ClientErrorCode.INVALID_VALUE,
        )
    return value


def _check_pass_through(body: Mapping[str, Any]) -> None:
    """``prompt_cache_key`` and ``prompt_cache_retention`` are never hints, but must be well typed."""
    key = body.get("prompt_cache_key")
    if key is not None and not isinstance(key, str):
        raise _invalid_type("prompt_cache_key", key, expected="a string")
    retention = body.get("prompt_cache_retention")
    if retention is None:
        return
    if not isinstance(retention, str):
        raise _invalid_type("prompt_cache_retention", retention, expected="a string")
    if retention not in _LEGACY_RETENTION:
        raise CacheControlError(
            f"Invalid value for 'prompt_cache_retention': '{retention}'. "
            "Supported values are: 'in_memory', '24h'.",
            param="prompt_cache_retention",
            code=ClientErrorCode.INVALID_VALUE,
        )


def _breakpoint_index(parts: object) -> int | None:
    """Index of the first part with a non-null ``prompt_cache_breakpoint`` (of any part type).

    Paths are formatted only on a hit, so a clean request pays for dict lookups alone.
    """
    if type(parts) is not list:
        return None
    for j, part in enumerate(parts):
        if type(part) is dict and part.get(BREAKPOINT) is not None:
            return j
    return None


def _breakpoint_error(param: str) -> CacheControlError:
    return CacheControlError(
        f"Unsupported parameter: '{param}'. Explicit prompt cache breakpoints are not supported "
        f"by this server; remove it (implicit '{OPTIONS}' retains the full prompt).",
        param=param,
        code=ClientErrorCode.UNSUPPORTED_PARAMETER,
    )


def _invalid_type(param: str, value: object, *, expected: str) -> CacheControlError:
    got = json_type(value)
    article = "an" if got[0] in "aeiou" else "a"
    return CacheControlError(
        f"Invalid type for '{param}': expected {expected}, but got {article} {got} instead.",
        param=param,
        code=ClientErrorCode.INVALID_TYPE,
    )

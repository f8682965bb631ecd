"""OpenAI prompt-cache controls (Chat Completions and Responses) -> the KV-hint envelope.

Only ``prompt_cache_options`` in implicit mode becomes a hint. Explicit mode and part-level
``prompt_cache_breakpoint`` markers are refused (a breakpoint scopes retention to a prefix; widening
it to the whole prompt would be a lie). ``prompt_cache_key`` and the legacy
``prompt_cache_retention`` are type-checked and otherwise left alone: they never make, widen or
shorten a hint. Messages follow OpenAI's own wording so clients see familiar errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from kvretention.hints.envelope import KvHintEnvelope
from kvretention.hints.errors import CacheControlError, ClientErrorCode, json_type

OPTIONS: Final = "prompt_cache_options"
BREAKPOINT: Final = "prompt_cache_breakpoint"

CHAT_TTLS: Final[Mapping[str, int]] = {"30m": 1_800}
"""Chat Completions publishes one TTL."""

RESPONSES_TTLS: Final[Mapping[str, int]] = {"30m": 1_800, "12h": 43_200}
"""The Responses API also publishes ``12h``; it maps to its own typed TTL, never to 30 minutes."""

_MODES: Final = ("implicit", "explicit")
_LEGACY_RETENTION: Final = ("in_memory", "24h")
_CHAT_OPTION_KEYS: Final = frozenset({"mode", "ttl"})
_RESPONSES_OPTION_KEYS: Final = frozenset({"mode", "ttl", "prewarm", "comparison_response_id"})


def normalize_chat_completions(body: Mapping[str, Any]) -> KvHintEnvelope | None:
    """A parsed ``POST /v1/chat/completions`` body -> envelope, ``None``, or :class:`CacheControlError`."""
    _check_pass_through(body)
    envelope = _options_envelope(body, ttls=CHAT_TTLS, allowed=_CHAT_OPTION_KEYS)
    messages = body.get("messages")
    if type(messages) is list:
        for i, message in enumerate(messages):
            if type(message) is dict:
                j = _breakpoint_index(message.get("content"))
                if j is not None:
                    raise _breakpoint_error(f"messages[{i}].content[{j}].{BREAKPOINT}")
    return envelope


def normalize_responses(body: Mapping[str, Any]) -> KvHintEnvelope | None:
    """A parsed ``POST /v1/responses`` body -> envelope, ``None``, or :class:`CacheControlError`."""
    _check_pass_through(body)
    envelope = _options_envelope(body, ttls=RESPONSES_TTLS, allowed=_RESPONSES_OPTION_KEYS)
    items = body.get("input")
    if type(items) is list:
        for i, item in enumerate(items):
            if type(item) is not dict:
                continue
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
    options = body[OPTIONS]
    fast = _fast_path(options, ttls=ttls, allowed=allowed)
    if fast is not None:
        return fast
    if not isinstance(options, dict):
        raise _invalid_type(OPTIONS, options, expected="an object")
    for key in options:
        if key not in allowed:
            raise CacheControlError(
                f"Unknown parameter: '{OPTIONS}.{key}'.",
                param=f"{OPTIONS}.{key}",
                code=ClientErrorCode.UNKNOWN_PARAMETER,
            )
    mode = _enum(options, "mode", default="implicit", values=_MODES)
    if mode == "explicit":
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
    return _envelope(ttls[ttl])


def _fast_path(
    options: object, *, ttls: Mapping[str, int], allowed: frozenset[str]
) -> KvHintEnvelope | None:
    """The common valid case in a few lookups; anything else takes the checked path (same result)."""
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
        return _envelope(ttls[ttl])
    return None


_ENVELOPES: Final[dict[int, KvHintEnvelope]] = {}


def _envelope(seconds: int) -> KvHintEnvelope:
    """Envelopes are frozen, so one per TTL is built once; pydantic would dominate small requests."""
    envelope = _ENVELOPES.get(seconds)
    if envelope is None:
        envelope = _ENVELOPES[seconds] = KvHintEnvelope.retain(seconds)
    return envelope


def _enum(options: Mapping[str, Any], key: str, *, default: str, values: Sequence[str]) -> str:
    param = f"{OPTIONS}.{key}"
    value = options.get(key, default)
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

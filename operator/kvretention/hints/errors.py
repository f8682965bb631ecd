"""Typed client errors raised by the provider normalizers.

Provider-neutral on purpose: a normalizer names the offending parameter in its provider's own path
style (OpenAI ``messages[0].content[1].prompt_cache_breakpoint``, Anthropic
``messages.0.content.1.cache_control``) and the frontend renders the provider's error body from it.
"""

from __future__ import annotations

from enum import StrEnum


class ClientErrorCode(StrEnum):
    """Why a request was refused; OpenAI's ``error.code`` values, reused for every provider."""

    INVALID_TYPE = "invalid_type"
    INVALID_VALUE = "invalid_value"
    UNKNOWN_PARAMETER = "unknown_parameter"
    MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
    UNSUPPORTED_VALUE = "unsupported_value"
    UNSUPPORTED_PARAMETER = "unsupported_parameter"


class ClientError(ValueError):
    """A request the client must change: always a 400, never forwarded upstream."""

    status = 400

    def __init__(self, message: str, *, param: str | None, code: ClientErrorCode) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def __repr__(self) -> str:
        return f"{type(self).__name__}(param={self.param!r}, code={self.code.value!r})"


class CacheControlError(ClientError):
    """A prompt-cache control that is malformed or that v1 does not support (never widened)."""


def json_type(value: object) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__

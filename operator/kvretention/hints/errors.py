"""Typed client errors raised by the provider normalizers.

Provider-neutral on purpose: a normalizer names the offending parameter in its provider's own path
style (OpenAI ``messages[0].content[1].prompt_cache_breakpoint``, Anthropic
``messages.0.content.1.cache_control``) and the frontend renders the provider's error body from it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


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


_JSON_TYPES: Final = (
    (type(None), "null"),
    (bool, "boolean"),  # before int: a bool is an int to isinstance
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def json_type(value: object) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    for kind, name in _JSON_TYPES:
        if isinstance(value, kind):
            return name
    return type(value).__name__

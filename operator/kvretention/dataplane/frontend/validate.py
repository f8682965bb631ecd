"""Small typed field checks for request bodies, raising ``ClientError`` in the provider's wording.

OpenAI says ``Invalid type for 'messages[0].content': expected ...``; Anthropic (pydantic) says
``messages.0.content: Input should be ...``. A ``Fields`` instance knows which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from kvretention.hints.errors import ClientError, ClientErrorCode, json_type

_ARTICLE = {"array": "an", "integer": "an", "object": "an"}
_T = TypeVar("_T")


MAX_INT32: Final = 2**31 - 1
MAX_INT64: Final = 2**63 - 1


@dataclass(frozen=True)
class Fields:
    """Field checks for one provider's path and message style."""

    anthropic: bool = False

    def path(self, *parts: str | int) -> str:
        if self.anthropic:
            return ".".join(map(str, parts))
        out = ""
        for part in parts:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out

    def error(self, param: str, reason: str, *, code: ClientErrorCode) -> ClientError:
        message = f"{param}: {reason}" if self.anthropic else reason
        return ClientError(message, param=param, code=code)

    def invalid_type(self, param: str, value: object, *, expected: str) -> ClientError:
        got = json_type(value)
        if self.anthropic:
            reason = f"Input should be {expected}, got {got}"
        else:
            reason = (
                f"Invalid type for '{param}': expected {expected}, "
                f"but got {_ARTICLE.get(got, 'a')} {got} instead."
            )
        return self.error(param, reason, code=ClientErrorCode.INVALID_TYPE)

    def invalid_value(self, param: str, reason: str) -> ClientError:
        text = reason if self.anthropic else f"Invalid value for '{param}': {reason}"
        return self.error(param, text, code=ClientErrorCode.INVALID_VALUE)

    def missing(self, param: str) -> ClientError:
        reason = "Field required" if self.anthropic else f"Missing required parameter: '{param}'."
        return self.error(param, reason, code=ClientErrorCode.MISSING_REQUIRED_PARAMETER)

    def unsupported(self, param: str, reason: str) -> ClientError:
        text = reason if self.anthropic else f"Unsupported parameter: '{param}': {reason}"
        return self.error(param, text, code=ClientErrorCode.UNSUPPORTED_PARAMETER)

    # -- typed getters -------------------------------------------------------------------------

    def required_str(self, body: Mapping[str, Any], key: str, *, param: str | None = None) -> str:
        name = param or key
        if key not in body:
            raise self.missing(name)
        value = body[key]
        if not isinstance(value, str):
            raise self.invalid_type(name, value, expected="a string")
        return value

    def required_list(
        self, body: Mapping[str, Any], key: str, *, expected: str, empty: str
    ) -> list[Any]:
        """A required, non-empty array: ``expected`` names the type in the provider's words,
        ``empty`` is why an empty one is refused."""
        if key not in body:
            raise self.missing(key)
        value = body[key]
        if not isinstance(value, list):
            raise self.invalid_type(key, value, expected=expected)
        if not value:
            raise self.invalid_value(key, empty)
        return value

    def _optional(
        self, body: Mapping[str, Any], key: str, kind: type[_T], *, expected: str, param: str | None
    ) -> _T | None:
        """``body[key]`` when it is a ``kind``, ``None`` when absent or null."""
        value = body.get(key)
        if value is not None and not isinstance(value, kind):
            raise self.invalid_type(param or key, value, expected=expected)
        return value

    def opt_str(self, body: Mapping[str, Any], key: str, *, param: str | None = None) -> str | None:
        return self._optional(body, key, str, expected="a string", param=param)

    def opt_bool(
        self, body: Mapping[str, Any], key: str, *, default: bool = False, param: str | None = None
    ) -> bool:
        value = self._optional(body, key, bool, expected="a boolean", param=param)
        return default if value is None else value

    def opt_int(
        self,
        body: Mapping[str, Any],
        key: str,
        *,
        minimum: int,
        maximum: int = MAX_INT32,
        param: str | None = None,
    ) -> int | None:
        """An optional integer in ``[minimum, maximum]``; the engine takes 32-bit counts, so a
        larger one (``max_tokens`` of 2^64) is the client's error, not the engine's."""
        name = param or key
        value = body.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.invalid_type(name, value, expected="an integer")
        if value < minimum:
            raise self.invalid_value(name, f"{value} is below the minimum of {minimum}.")
        if value > maximum:
            raise self.invalid_value(name, f"{value} is above the maximum of {maximum}.")
        return value

    def opt_number(
        self, body: Mapping[str, Any], key: str, *, minimum: float, maximum: float
    ) -> float | None:
        value = body.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.invalid_type(key, value, expected="a number")
        if not minimum <= value <= maximum:
            raise self.invalid_value(
                key, f"{value} is outside the range [{minimum:g}, {maximum:g}]."
            )
        return float(value)

    def opt_stop(self, body: Mapping[str, Any], key: str, *, limit: int) -> list[str] | None:
        """A stop string or a list of at most ``limit`` stop strings."""
        value = body.get(key)
        if value is None:
            return None
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.invalid_type(key, value, expected="a string or an array of strings")
        if len(value) > limit:
            raise self.invalid_value(key, f"at most {limit} stop sequences are allowed.")
        return list(value)

"""Checks and conversions both OpenAI endpoints share: field sets, sampling, images, schemas.

Every known top-level field of either endpoint is in exactly one table of its module (honoured, a
documented no-op, or refused); the OpenAI sections of ``docs/frontend.md`` list the same tables.
A key in none of them is accepted, ignored and counted (``compat``'s rule: keys are open, types are
closed); a known field that would change the answer and is not implemented is a 400 naming it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any, Final, Literal

from kvretention.dataplane.frontend import compat
from kvretention.dataplane.frontend.resume import Resumer
from kvretention.dataplane.frontend.validate import MAX_INT64, Fields
from kvretention.dataplane.protocol import (
    ImagePart,
    ReasoningControl,
    ResponseFormat,
    SamplingParams,
    ToolChoice,
)
from kvretention.hints.errors import ClientError
from kvretention.hints.openai import BREAKPOINT_KEY

F: Final = Fields(anthropic=False)
MAX_STOP: Final = 4
TOOL_NAME: Final = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
CHAT_IMAGE_DETAILS: Final = ("auto", "low", "high")
_TOOL_CHOICES: Final = ("none", "auto", "required")
RESPONSES_IMAGE_DETAILS: Final = (*CHAT_IMAGE_DETAILS, "original")
"""Responses images also take ``original`` (no downscaling), which Codex sends for screenshots; the
neutral part records it as ``high``, the most detail it names."""
_EFFORTS: Final = ("none", "minimal", "low", "medium", "high", "xhigh", "max")

Effort = Literal["minimal", "low", "medium", "high"]
_EFFORT_MAP: Final[dict[str, Effort]] = {
    "minimal": "minimal",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}
"""OpenAI's efforts above ``high`` ask for the most the chat templates know: ``high``."""


def only_keys(obj: Mapping[str, Any], *, where: str, allowed: Collection[str]) -> None:
    """Record each key of ``obj`` outside ``allowed`` as ignored (``where`` prefixes its path).

    A ``null`` value carries nothing, so it is not even counted: the SDK sends its own objects
    back with such keys (a streamed message's ``parsed: null``, ``parsed_arguments: null``).
    """
    if isinstance(obj, dict) and obj.keys() <= _known(allowed):
        return  # every key known: the common case, one set comparison per item
    compat.ignore_unknown(obj, known=lambda key: key in allowed, where=where)


def _known(allowed: Collection[str]) -> frozenset[str] | set[str]:
    if isinstance(allowed, frozenset | set):
        return allowed
    if not isinstance(allowed, tuple):
        return frozenset(allowed)
    known = _KNOWN.get(allowed)
    if known is None:
        known = _KNOWN[allowed] = frozenset(allowed)
    return known


_KNOWN: Final[dict[tuple[str, ...], frozenset[str]]] = {}


def ignore_present(body: Mapping[str, Any], keys: Collection[str], *, where: str = "") -> None:
    """Record the documented no-ops ``body`` sets (not ``null``) as ignored, in the body's order."""
    compat.ignore_set(body, keys, where=where)


def refuse_set(
    body: Mapping[str, Any],
    refused: Mapping[str, str],
    *,
    where: str = "",
    asked_by_empty: frozenset[str] = frozenset(),
) -> None:
    """Fields this server cannot honour: a 400 naming the field when it is set to anything (an
    empty object or list, or ``false``, asks for nothing, except for the ``asked_by_empty``
    fields, whose ``{}`` turns the feature on with its defaults)."""
    for key, why in refused.items():
        value = body.get(key)
        if value is None:
            continue
        if key in asked_by_empty or (value is not False and value != [] and value != {}):
            raise F.unsupported(f"{where}.{key}" if where else key, why)


def obj(value: object, *, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise F.invalid_type(where, value, expected="an object")
    return value


def req_str(raw: Mapping[str, Any], key: str, *, where: str) -> str:
    return F.required_str(raw, key, param=f"{where}.{key}")


MAX_ARGUMENTS_DEPTH: Final = 128
"""The deepest JSON nesting a tool call's ``arguments`` may have: the worker parses them to render
the template, and a thousand levels would exhaust its recursion (a 502, not the client's 400)."""
_JSON_STRING: Final = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS: Final = re.compile(r"[\[\]{}]")


def req_arguments(raw: Mapping[str, Any], key: str, *, where: str) -> str:
    """A tool call's ``arguments`` string, refused when its JSON nests past
    :data:`MAX_ARGUMENTS_DEPTH` (counted outside strings; whether it is JSON is the worker's
    check). Arguments with fewer brackets than the limit are not scanned."""
    arguments = req_str(raw, key, where=where)
    if arguments.count("{") + arguments.count("[") <= MAX_ARGUMENTS_DEPTH:
        return arguments
    depth = 0
    for bracket in _BRACKETS.findall(_JSON_STRING.sub("", arguments)):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_ARGUMENTS_DEPTH:
            raise F.invalid_value(
                f"{where}.{key}", f"the JSON nests deeper than {MAX_ARGUMENTS_DEPTH} levels."
            )
    return arguments


def opt_str(raw: Mapping[str, Any], key: str, *, where: str) -> str | None:
    return F.opt_str(raw, key, param=f"{where}.{key}")


def enum(raw: Mapping[str, Any], key: str, *, where: str, values: Collection[str]) -> str | None:
    """An optional string field limited to ``values``; OpenAI's wording when it is not one."""
    param = f"{where}.{key}" if where else key
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise F.invalid_type(param, value, expected="a string")
    if value not in values:
        supported = ", ".join(f"'{v}'" for v in values)
        raise F.invalid_value(param, f"'{value}'. Supported values are: {supported}.")
    return value


def metadata(body: Mapping[str, Any]) -> dict[str, str]:
    """Type-checked (string keys to string values, as the SDK types it); never acted on."""
    value = body.get("metadata")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise F.invalid_type("metadata", value, expected="an object")
    for key, item in value.items():
        if not isinstance(item, str):
            raise F.invalid_type(f"metadata.{key}", item, expected="a string")
    return value


def sampling(
    body: Mapping[str, Any],
    *,
    max_tokens: int | None,
    stop_key: str | None = "stop",
    logit_bias: dict[str, float] | None = None,
) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=max_tokens,
        temperature=F.opt_number(body, "temperature", minimum=0, maximum=2),
        top_p=_top_p(body),
        frequency_penalty=F.opt_number(body, "frequency_penalty", minimum=-2, maximum=2),
        presence_penalty=F.opt_number(body, "presence_penalty", minimum=-2, maximum=2),
        stop=F.opt_stop(body, stop_key, limit=MAX_STOP) if stop_key else None,
        sampling_seed=F.opt_int(body, "seed", minimum=-(2**63), maximum=MAX_INT64),
        logit_bias=logit_bias,
    )


def _top_p(body: Mapping[str, Any]) -> float | None:
    top_p = F.opt_number(body, "top_p", minimum=0, maximum=1)
    if top_p == 0:
        raise F.invalid_value("top_p", "0 is below the exclusive minimum of 0.")
    return top_p


def logit_bias(body: Mapping[str, Any]) -> dict[str, float] | None:
    """Token id (a decimal string) -> bias in [-100, 100], passed to SGLang as it takes it."""
    value = body.get("logit_bias")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise F.invalid_type("logit_bias", value, expected="an object")
    out: dict[str, float] = {}
    for key, bias in value.items():
        if not key.isdigit() or not key.isascii():
            raise F.invalid_value("logit_bias", f"'{key}' is not a token id.")
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise F.invalid_type(f"logit_bias.{key}", bias, expected="a number")
        if not -100 <= bias <= 100:
            raise F.invalid_value(f"logit_bias.{key}", f"{bias} is outside the range [-100, 100].")
        out[str(int(key))] = float(bias)
    return out or None


def reasoning_effort(value: object, *, param: str) -> ReasoningControl | None:
    """``reasoning_effort`` / ``reasoning.effort`` -> thinking switches (``none`` turns it off)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise F.invalid_type(param, value, expected="a string")
    if value == "none":
        return ReasoningControl(enabled=False)
    if value not in _EFFORT_MAP:
        supported = ", ".join(f"'{v}'" for v in _EFFORTS)
        raise F.invalid_value(param, f"'{value}'. Supported values are: {supported}.")
    return ReasoningControl(enabled=True, effort=_EFFORT_MAP[value])


def image(
    url: object,
    *,
    detail: object,
    where: str,
    url_param: str,
    details: tuple[str, ...] = CHAT_IMAGE_DETAILS,
) -> ImagePart:
    """A ``data:image/...;base64,`` URL or an ``http(s)`` URL; the worker fetches or decodes it."""
    if not isinstance(url, str):
        raise F.invalid_type(url_param, url, expected="a string")
    lowered = url[:16].lower()
    if lowered.startswith("data:"):
        head, sep, data = url.partition(",")
        if not head.lower().startswith("data:image/") or not head.endswith(";base64") or not sep:
            raise F.invalid_value(
                url_param, "a data URL must be 'data:image/<type>;base64,<data>'."
            )
        if not data:
            raise F.invalid_value(url_param, "the data URL holds no image data.")
    elif not lowered.startswith(("http://", "https://")):
        raise F.invalid_value(url_param, "expected an http(s) URL or a base64 data URL.")
    if detail is not None and detail not in details:
        supported = ", ".join(f"'{d}'" for d in details)
        raise F.invalid_value(f"{where}.detail", f"{detail!r}. Supported values are: {supported}.")
    return ImagePart(url=url, detail="high" if detail == "original" else detail)


def json_schema_format(raw: Mapping[str, Any], *, where: str) -> ResponseFormat:
    """``{name, schema, strict?, description?}`` -> ``ResponseFormat`` (the schema is required here)."""
    name = req_str(raw, "name", where=where)
    if not TOOL_NAME.fullmatch(name):
        raise F.invalid_value(
            f"{where}.name", "must match ^[a-zA-Z0-9_-]{1,64}$ (letters, digits, _ and -)."
        )
    opt_str(raw, "description", where=where)
    if "schema" not in raw or raw["schema"] is None:
        raise F.missing(f"{where}.schema")
    schema = obj(raw["schema"], where=f"{where}.schema")
    strict = raw.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise F.invalid_type(f"{where}.strict", strict, expected="a boolean")
    return ResponseFormat(type="json_schema", json_schema=schema, name=name, strict=strict)


def parameters_schema(raw: Mapping[str, Any], *, where: str) -> dict[str, Any] | None:
    value = raw.get("parameters")
    if value is None:
        return None
    schema = obj(value, where=f"{where}.parameters")
    kind = schema.get("type", "object")
    if kind != "object":
        raise F.invalid_value(
            f"{where}.parameters", "a function's parameters schema must have type 'object'."
        )
    return schema


def tool_name(raw: Mapping[str, Any], *, where: str) -> str:
    name = req_str(raw, "name", where=where)
    if not TOOL_NAME.fullmatch(name):
        raise F.invalid_value(
            f"{where}.name",
            f"'{name}' does not match '^[a-zA-Z0-9_-]{{1,64}}$'.",
        )
    return name


def opt_strict(raw: Mapping[str, Any], *, where: str) -> bool | None:
    value = raw.get("strict")
    if value is not None and not isinstance(value, bool):
        raise F.invalid_type(f"{where}.strict", value, expected="a boolean")
    return value


def string_tool_choice(raw: str) -> ToolChoice:
    """A ``tool_choice`` given as a string: ``none``, ``auto`` or ``required`` on both endpoints."""
    if raw not in _TOOL_CHOICES:
        supported = ", ".join(f"'{c}'" for c in _TOOL_CHOICES)
        raise F.invalid_value("tool_choice", f"'{raw}'. Supported values are: {supported}.")
    return ToolChoice(mode=raw)


def no_tools(param: str) -> ClientError:
    return F.invalid_value(param, f"'{param}' is only allowed when 'tools' are specified.")


def unknown_tool(param: str, name: str) -> ClientError:
    return F.invalid_value(param, f"no tool named '{name}' is in 'tools'.")


def breakpoint_encodings(
    resumer: Resumer, items: list[Any], encoded: list[bytes]
) -> list[bytes] | None:
    """What the OpenAI hint walks skip items by: each item's encoding where it names
    ``prompt_cache_breakpoint``, ``b""`` where not, when the resumer remembers that for the
    conversation's repeated items (``Resumer.named_encodings``); otherwise ``None`` (walking
    every item costs less than scanning every item's bytes)."""
    return resumer.named_encodings(items, encoded, BREAKPOINT_KEY)

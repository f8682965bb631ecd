"""A request body in: its bytes read (bounded, timed), decoded as a JSON object, and the session
key found in its headers or fields."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec
from aiohttp import web

from kvretention.dataplane.frontend import errors
from kvretention.dataplane.frontend.affinity import session_key
from kvretention.dataplane.frontend.config import DEFAULT_BODY_TIMEOUT
from kvretention.dataplane.frontend.errors import FrontendError
from kvretention.dataplane.frontend.resume import Resumer

log = logging.getLogger("kvretention.frontend")


async def read_body(
    request: web.Request, *, limit: int, stall_s: float = DEFAULT_BODY_TIMEOUT
) -> bytes:
    """The body's bytes, or a ``FrontendError`` (413 before reading when possible, 408 when the
    body stalls past ``stall_s`` seconds)."""
    if request.content_length is not None and request.content_length > limit:
        raise errors.body_too_large(limit)
    try:
        async with asyncio.timeout(stall_s):
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise errors.body_too_large(limit) from None
    except web.RequestPayloadError:
        # aiohttp could not decode the body (not gzip under content-encoding: gzip, broken
        # chunked framing); the exception's text is aiohttp's, not for the client
        if "content-encoding" in request.headers:
            raise errors.invalid_content_encoding() from None
        raise errors.unreadable_body() from None
    except TimeoutError:
        log.info("request body on %s stalled past %gs", request.path, stall_s)
        raise errors.body_timeout(stall_s) from None
    return raw


def decode_json_body(raw: bytes, *, resumer: Resumer | None = None) -> dict[str, Any]:
    """The bytes as a JSON object (strict UTF-8, no lone surrogates), or a 400 ``FrontendError``.

    With ``resumer``, a large body's message items that its conversation's last body holds
    byte for byte are that body's decoded values (``Resumer.decode``; the same values), and so
    are its tools when an earlier body of the resumer's tenant held their bytes."""
    try:
        text = raw.decode("utf-8-sig")  # strict: invalid UTF-8 and encoded surrogates are refused
    except UnicodeDecodeError:
        raise errors.invalid_json("the body is not valid UTF-8") from None
    try:
        body = resumer.decode(text) if resumer is not None and len(raw) >= ITEMWISE_BYTES else None
        by_json = False
        if body is None:
            body, by_json = _loads(text)
    except json.JSONDecodeError as exc:
        raise errors.invalid_json(str(exc)) from None
    except RecursionError:
        raise errors.invalid_json("the body is nested too deeply") from None
    except ValueError:  # Python refuses integers of more than sys.get_int_max_str_digits() digits
        raise errors.invalid_json("a number in the body has too many digits") from None
    if by_json and _SURROGATE_ESCAPE.search(text) is not None and _has_lone_surrogate(body):
        # json.loads turns an unpaired "\ud800" escape into a str that cannot be encoded as UTF-8
        # (msgspec refuses one: what it decoded needs no scan, ~60 µs per 200 KB)
        raise errors.invalid_json(
            "a string holds an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)"
        )
    if not isinstance(body, dict):
        raise FrontendError(
            status=400,
            code="invalid_type",
            message="The request body must be a JSON object.",
        )
    return body


_DECODE: Final = msgspec.json.Decoder().decode
ITEMWISE_BYTES: Final = 16 * 1024
"""Bodies from this size are decoded item by item against their conversation's last body;
smaller ones cost less decoded whole than looked up."""


def _loads(text: str) -> tuple[Any, bool]:
    """``json.loads(text)`` in half the CPU (~0.6 ms for a 200 KB agent body instead of ~1.2),
    and whether ``json`` decoded it: msgspec gives the same values wherever it accepts the text;
    what it refuses (``NaN``, ``1e400``, a lone surrogate escape, a number of 5,000 digits,
    invalid JSON) ``json`` decides, with its own values and errors."""
    try:
        return _DECODE(text), False
    except (msgspec.DecodeError, RecursionError):
        return json.loads(text), True


_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _has_lone_surrogate(value: object) -> bool:
    """Whether any key or string in a parsed body holds a lone surrogate (iterative: no recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item) is not None:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def session_of(request: web.Request, body: Mapping[str, Any], *, keys: Sequence[str]) -> str | None:
    """The sticky-session key from the configured sources; aiohttp keeps non-UTF-8 header bytes
    as surrogates, refused here."""
    for key in keys:
        value = request.headers.get(key)
        if value is not None and _SURROGATE.search(value) is not None:
            raise errors.invalid_header(key)
    return session_key(keys, headers=request.headers, body=body)

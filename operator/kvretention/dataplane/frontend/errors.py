"""Every failure the frontend can return, and its rendering as each provider's error body.

One table (``FrontendError`` factories below, documented in ``docs/contract.md``) maps a situation to
an HTTP status plus an OpenAI ``type``/``code`` and an Anthropic ``type``; the renderers are pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import Any, Final

from kvretention.dataplane.protocol import ContextOverflow, ErrorBody, ErrorCode
from kvretention.hints.errors import ClientError


class Provider(StrEnum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


_ANTHROPIC_TYPE: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


_OPENAI_TYPE: Final[dict[int, str]] = {429: "requests"}
"""OpenAI's ``type`` where it is not ``invalid_request_error`` / ``server_error``."""


DETERMINISTIC_STATUSES: Final = frozenset({400, 401, 404, 405, 413, 422, 501})
"""The same request gets the same answer: sent with ``x-should-retry: false``."""


@dataclass(eq=False)
class FrontendError(Exception):
    """A failure with a status, a machine code and a client-safe message (never a traceback)."""

    status: int
    code: str
    message: str
    param: str | None = None
    retry_after: int | None = None
    """Seconds for the ``retry-after`` header (a 429)."""
    final: bool = False
    """The same request would fail the same way although the status is not one of
    :data:`DETERMINISTIC_STATUSES` (the router refused it as malformed)."""
    overflow: ContextOverflow | None = None
    """The prompt does not fit the context: each provider words it its own way, which agents
    read (Codex the code ``context_length_exceeded``, Claude Code ``prompt is too long``)."""

    @property
    def openai_type(self) -> str:
        if self.status in _OPENAI_TYPE:
            return _OPENAI_TYPE[self.status]
        return "invalid_request_error" if self.status < 500 else "server_error"

    @property
    def anthropic_type(self) -> str:
        return _ANTHROPIC_TYPE.get(
            self.status, "invalid_request_error" if self.status < 500 else "api_error"
        )

    @property
    def retryable(self) -> bool:
        """Whether the same request could succeed later; the SDKs skip retries when not."""
        return not self.final and self.status not in DETERMINISTIC_STATUSES

    @property
    def reason(self) -> str:
        """The label used for rejection metrics and the trace outcome."""
        return self.code


def from_client_error(err: ClientError) -> FrontendError:
    return FrontendError(
        status=err.status, code=err.code.value, message=err.message, param=err.param
    )


def invalid_json(detail: str) -> FrontendError:
    return FrontendError(
        status=400,
        code="invalid_json",
        message=f"We could not parse the JSON body of your request: {detail}",
    )


def _fixed(
    status: int, code: str, message: str, *, param: str | None = None
) -> Callable[[], FrontendError]:
    """The factory of a failure that says the same every time (a new exception each call)."""
    return partial(FrontendError, status=status, code=code, message=message, param=param)


malformed_head: Final = _fixed(
    400,
    "malformed_request",
    "The request's HTTP head could not be parsed: a header line is malformed (a control "
    "character, folding, a space before the colon, bare LF line endings) or too long.",
)
"""aiohttp's parser refused the request line or a header (the line is never echoed: it may
hold an API key)."""
invalid_content_encoding: Final = _fixed(
    400,
    "invalid_content_encoding",
    "The request body could not be decoded as its content-encoding header says.",
    param="content-encoding",
)
unreadable_body: Final = _fixed(
    400,
    "invalid_body",
    "The request body could not be read: its framing (chunked encoding) is invalid.",
)
internal_error: Final = _fixed(
    500, "internal_error", "The server had an error processing the request."
)
router_unavailable: Final = _fixed(
    503, "router_unavailable", "The request router is unavailable; try again shortly."
)
"""The detail (address, exception) is logged, never sent: it names internal endpoints."""
upstream_disconnected: Final = _fixed(
    502,
    "upstream_disconnected",
    "The router closed the connection before the response finished.",
)
"""The detail is logged, never sent."""


def invalid_header(name: str) -> FrontendError:
    return FrontendError(
        status=400,
        code="invalid_header",
        message=f"The {name} header is not valid UTF-8.",
        param=name,
    )


def unknown_model(model: str, *, served: tuple[str, ...]) -> FrontendError:
    return FrontendError(
        status=404,
        code="model_not_found",
        message=f"The model '{model}' does not exist on this server; served: {', '.join(served)}.",
        param="model",
    )


def body_too_large(limit: int) -> FrontendError:
    return FrontendError(
        status=413,
        code="request_too_large",
        message=f"Request body exceeds the maximum of {limit} bytes.",
    )


def not_found(path: str) -> FrontendError:
    return FrontendError(status=404, code="not_found", message=f"No endpoint at {path}.")


def method_not_allowed(method: str, path: str) -> FrontendError:
    return FrontendError(
        status=405, code="method_not_allowed", message=f"{method} is not allowed on {path}."
    )


def missing_api_key(provider: Provider) -> FrontendError:
    """No key at all; each provider's own wording (the key is never echoed)."""
    if provider is Provider.ANTHROPIC:
        message = "x-api-key header is required"
    else:
        message = (
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    return FrontendError(status=401, code="missing_api_key", message=message)


def invalid_api_key(provider: Provider) -> FrontendError:
    message = (
        "invalid x-api-key" if provider is Provider.ANTHROPIC else "Incorrect API key provided."
    )
    return FrontendError(status=401, code="invalid_api_key", message=message)


def rate_limited(*, tenant: str, kind: str, retry_after: int) -> FrontendError:
    """A tenant past its requests per second or its requests in flight (``kind``)."""
    what = "requests per second" if kind == "rate" else "concurrent requests"
    return FrontendError(
        status=429,
        code="rate_limit_exceeded",
        message=f"Rate limit reached for tenant {tenant} on {what}; try again in {retry_after}s.",
        retry_after=retry_after,
    )


def _too_slow(status: int, code: str, what: str, seconds: float) -> FrontendError:
    """``what`` did not happen within ``seconds``."""
    return FrontendError(status=status, code=code, message=f"{what} within {seconds:g} seconds.")


def upstream_timeout(seconds: float) -> FrontendError:
    return _too_slow(504, "upstream_timeout", "The router did not answer", seconds)


def upstream_refused(status: int) -> FrontendError:
    """The router answered a client error without its own error body (its HTTP parser refused
    what the frontend sent): the frontend's fault, and the same request would be refused again."""
    return FrontendError(
        status=502,
        code="bad_gateway",
        message=f"The router answered HTTP {status}.",
        final=400 <= status < 500 and status not in RETRYABLE_CLIENT_STATUSES,
    )


def router_malformed(what: str) -> FrontendError:
    """A stream line, error line or chunk from the router that does not parse."""
    return FrontendError(
        status=502, code="bad_gateway", message=f"The router sent a malformed {what}."
    )


RETRYABLE_CLIENT_STATUSES: Final = frozenset({408, 409, 429})
"""Client-error statuses the SDKs retry (a timeout, a conflict, a rate limit)."""


def body_timeout(seconds: float) -> FrontendError:
    return _too_slow(
        408, "request_body_timeout", "The request body did not finish arriving", seconds
    )


def from_upstream(body: ErrorBody, *, hint_param: str | None) -> FrontendError:
    """An ``{"error": ...}`` from the router or worker, passed on visibly with its own status.

    ``kv_hints_unsupported`` keeps its code and names both ``kv_hints`` and the client parameter
    that produced the hint, so the client knows which field to drop to run without retention.
    """
    code = body.code
    if code is ErrorCode.KV_HINTS_UNSUPPORTED:
        drop = (
            f" Remove '{hint_param}' to send the request without KV retention."
            if hint_param
            else ""
        )
        return FrontendError(
            status=501,
            code=code.value,
            message=f"kv_hints unsupported by the serving engine: {body.message}.{drop}",
            param=hint_param,
        )
    status = UPSTREAM_STATUS.get(code, 502)
    if code is ErrorCode.INVALID_REQUEST and body.overflow is not None:
        return context_length_exceeded(body.overflow)
    return FrontendError(status=status, code=code.value, message=body.message, param=body.param)


def context_length_exceeded(overflow: ContextOverflow) -> FrontendError:
    """OpenAI's context-length error (its code and wording); Anthropic's is made from
    ``overflow`` when the body is written."""
    return FrontendError(
        status=400,
        code="context_length_exceeded",
        message=(
            f"This model's maximum context length is {overflow.context_length} tokens. However,"
            f" your messages resulted in {overflow.prompt_tokens} tokens. Please reduce the"
            " length of the messages."
        ),
        overflow=overflow,
    )


UPSTREAM_STATUS: Final[dict[ErrorCode, int]] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.KV_HINTS_UNSUPPORTED: 501,
    ErrorCode.NO_WORKERS: 503,
    ErrorCode.DRAINING: 503,
    ErrorCode.WORKER_OUTDATED: 503,
    ErrorCode.WORKER_UNAVAILABLE: 502,
    ErrorCode.UPSTREAM_TIMEOUT: 504,
    ErrorCode.ENGINE_ERROR: 500,
}
"""Status the client sees for each upstream error code."""


def openai_error_body(err: FrontendError) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}`` as the OpenAI API returns it."""
    return {
        "error": {
            "message": err.message,
            "type": err.openai_type,
            "param": err.param,
            "code": err.code,
        }
    }


def anthropic_error_body(err: FrontendError) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``; the code leads the message when useful."""
    message = err.message
    if err.overflow is not None:
        tokens, limit = err.overflow.prompt_tokens, err.overflow.context_length
        message = f"prompt is too long: {tokens} tokens > {limit} maximum"
    elif err.status >= 500 and not message.startswith(err.code):
        message = f"{err.code}: {message}"
    return {"type": "error", "error": {"type": err.anthropic_type, "message": message}}


def error_body(err: FrontendError, provider: Provider) -> dict[str, Any]:
    if provider is Provider.ANTHROPIC:
        return anthropic_error_body(err)
    return openai_error_body(err)

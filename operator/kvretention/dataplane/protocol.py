"""The internal request protocol: frontend -> router -> worker, and the stream that comes back.

A ``PreprocessedRequest`` is provider-neutral. Its top-level ``kv_hints`` key carries the KV-hint
envelope's wire form and is absent when there is no hint. The router forwards request bodies as
the bytes it received; per-hop placement data (role, bootstrap room) travels in headers so the body,
and with it the envelope, is never rewritten.

Responses are NDJSON (one JSON object per line): ``GenerateChunk`` objects, or a single final
``{"error": {...}}`` line when something fails after the stream has started. Failures before the
stream starts are a non-2xx status with the same ``{"error": {...}}`` body.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

GENERATE_PATH: Final = "/v1/generate"
NDJSON: Final = "application/x-ndjson"

# Per-hop placement headers set by the router; the body is never changed.
HEADER_ROLE: Final = "x-kvr-role"  # "aggregated" | "prefill" | "decode"
HEADER_BOOTSTRAP_HOST: Final = "x-kvr-bootstrap-host"
HEADER_BOOTSTRAP_PORT: Final = "x-kvr-bootstrap-port"
HEADER_BOOTSTRAP_ROOM: Final = "x-kvr-bootstrap-room"
HEADER_SESSION: Final = "x-session-id"
"""Client-facing sticky-session header (the frontend copies it into ``session_id``)."""

Role = Literal["aggregated", "prefill", "decode"]


class ErrorCode(StrEnum):
    """Typed failures that cross process boundaries; the frontend maps each to a provider error."""

    INVALID_REQUEST = "invalid_request"
    KV_HINTS_UNSUPPORTED = "kv_hints_unsupported"
    NO_WORKERS = "no_workers"
    WORKER_UNAVAILABLE = "worker_unavailable"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    ENGINE_ERROR = "engine_error"
    DRAINING = "draining"


ERROR_STATUS: Final[dict[ErrorCode, int]] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.KV_HINTS_UNSUPPORTED: 501,
    ErrorCode.NO_WORKERS: 503,
    ErrorCode.WORKER_UNAVAILABLE: 502,
    ErrorCode.UPSTREAM_TIMEOUT: 504,
    ErrorCode.ENGINE_ERROR: 500,
    ErrorCode.DRAINING: 503,
}
"""HTTP status used between our own processes for each error code."""


class ErrorBody(BaseModel):
    """The ``error`` object of a failure line or a non-2xx body."""

    model_config = ConfigDict(extra="ignore")

    code: ErrorCode
    message: str
    param: str | None = None


class ErrorLine(BaseModel):
    """``{"error": {...}}``: a failure, before or during a stream."""

    error: ErrorBody


class SamplingParams(BaseModel):
    """Sampling parameters, named as SGLang's ``sampling_params`` dict names them."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    stop: list[str] | None = None
    seed: int | None = Field(default=None, alias="sampling_seed")

    def to_sglang(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True, by_alias=True)


class ChatMessage(BaseModel):
    """A chat message after provider normalization: role plus plain text content."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str


class PreprocessedRequest(BaseModel):
    """What the frontend sends the router: provider-neutral, hint attached at top level."""

    model_config = ConfigDict(extra="ignore")

    request_id: str = Field(min_length=1)
    model: str
    token_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    session_id: str | None = None
    kv_hints: dict[str, Any] | None = None
    """The envelope's wire form, opaque to the router; absent when there is no hint."""

    def to_json_bytes(self) -> bytes:
        """Serialize with absent optional keys omitted (so no ``"kv_hints": null``)."""
        return self.model_dump_json(exclude_none=True, by_alias=True).encode()


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class GenerateChunk(BaseModel):
    """One streamed piece of the answer: a text delta, and on the last chunk the finish reason."""

    model_config = ConfigDict(extra="ignore")

    text: str = ""
    token_ids: list[int] = Field(default_factory=list)
    finish_reason: Literal["stop", "length", "abort"] | None = None
    usage: Usage | None = None

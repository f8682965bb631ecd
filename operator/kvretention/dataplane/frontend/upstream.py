"""The frontend's only network client: POST ``PreprocessedRequest`` to the router, read NDJSON back.

Every failure becomes a ``FrontendError`` with its documented status: router unreachable (503),
connection dropped (502), no answer within ``--upstream-timeout`` (504, applied to connecting and
to each read, so a long healthy stream is never cut), and the router's own ``{"error": ...}`` lines
passed on with their code (``kv_hints_unsupported`` -> 501).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final, Protocol

import aiohttp
import msgspec
from pydantic import ValidationError

from kvretention.api.names import READY_PATH
from kvretention.dataplane.frontend import errors
from kvretention.dataplane.frontend.errors import FrontendError
from kvretention.dataplane.frontend.repeats import router_messages
from kvretention.dataplane.hop_client import HopClient, HopConnectError, HopResponse
from kvretention.dataplane.protocol import (
    GENERATE_PATH,
    ErrorLine,
    GenerateChunk,
    PreprocessedRequest,
    ToolDefinition,
    read_chunk,
)

log = logging.getLogger("kvretention.frontend")

_MAX_ERROR_BODY: Final = 64 * 1024
_DRAIN_LIMIT_S: Final = 1.0
WORKERS_PATH: Final = "/v1/workers"
ROUTER_SLOW: Final = "the router did not answer in time"
"""The router's readiness poll timed out: a loaded node, not a verdict (see ``frontend.app``)."""


class Upstream(Protocol):
    """Where the frontend's requests go: the router (:class:`RouterClient`), or the worker the
    frontend places them on itself (:class:`~kvretention.dataplane.frontend.placing.PlacingClient`)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def ready(self, *, within: float = 1.0) -> str | None: ...

    async def worker_reports(self) -> list[Mapping[str, object]]:
        """What each healthy worker reports of its model (``input_modalities``,
        ``context_length``; a key is absent where a worker does not say)."""
        ...

    def generate(
        self,
        request: PreprocessedRequest,
        *,
        hint_param: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> AbstractAsyncContextManager[AsyncIterator[GenerateChunk]]: ...


class RouterClient:
    """Pooled connections to one router base URL."""

    def __init__(self, base_url: str, *, timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._session: HopClient | None = None

    async def start(self) -> None:
        self._session = HopClient(connect_timeout=self.timeout, read_timeout=self.timeout)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> HopClient:
        if self._session is None:
            raise RuntimeError("RouterClient.start() was not awaited")
        return self._session

    async def ready(self, *, within: float = 1.0) -> str | None:
        """``None`` when the router's ``GET /readyz`` is 2xx (it is when a worker is ready),
        :data:`ROUTER_SLOW` when it did not answer within ``within`` seconds, else why not, in
        words that name no internal address."""
        try:
            async with asyncio.timeout(within):
                resp = await self.session.get(f"{self.base_url}{READY_PATH}", limit_s=within)
                try:
                    status = resp.status
                    await resp.read()
                finally:
                    resp.release()  # closes the connection unless the answer was read whole
            if status < 300:
                return None
            log.warning("router readiness: HTTP %d from %s", status, self.base_url)
            return "the router reports no ready worker"
        except TimeoutError:
            log.warning("router readiness: %s did not answer within %.1fs", self.base_url, within)
            return ROUTER_SLOW
        except aiohttp.ClientError as exc:
            log.warning("router readiness: %s unreachable: %s", self.base_url, _describe(exc))
            return "the router is unreachable"

    async def worker_reports(self, *, within: float = 1.0) -> list[Mapping[str, object]]:
        """Each healthy worker's report from the router's ``/v1/workers``; none when the router
        does not answer in time (the catalog then says what it says without reports)."""
        try:
            async with asyncio.timeout(within):
                resp = await self.session.get(f"{self.base_url}{WORKERS_PATH}", limit_s=within)
                try:
                    workers = await resp.json() if resp.status == 200 else []
                finally:
                    resp.release()
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("router workers: %s", _describe(exc))
            return []
        if not isinstance(workers, list):
            return []
        return [w for w in workers if isinstance(w, dict) and w.get("healthy")]

    @asynccontextmanager
    async def generate(
        self,
        request: PreprocessedRequest,
        *,
        hint_param: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[AsyncIterator[GenerateChunk]]:
        """Open the stream; raises ``FrontendError`` before yielding if the router refuses it.

        ``headers`` carry placement data for the router (the prefix chain), never the body's."""
        try:
            resp = await self.session.post(
                f"{self.base_url}{GENERATE_PATH}",
                data=router_body(request),
                headers=hop_headers(request, headers),
            )
        except TimeoutError:
            raise errors.upstream_timeout(self.timeout) from None
        except HopConnectError as exc:
            log.warning("router %s unavailable: %s", self.base_url, _describe(exc))
            raise errors.router_unavailable() from None
        except aiohttp.ClientError as exc:
            log.warning("router %s dropped the request: %s", self.base_url, _describe(exc))
            raise errors.upstream_disconnected() from None
        try:
            if resp.status != 200:
                raise await error_from_status(resp, hint_param=hint_param, limit_s=self.timeout)
            yield chunks_of(resp, hint_param=hint_param, limit_s=self.timeout)
        finally:
            end_answer(resp)


def hop_headers(request: PreprocessedRequest, headers: Mapping[str, str] | None) -> dict[str, str]:
    """A generate hop's headers, to the router or straight to a worker: the body's type, the
    request id, then the caller's placement data (the prefix chain)."""
    return {
        "content-type": "application/json",
        "x-request-id": request.request_id,
        **(headers or {}),
    }


def end_answer(resp: HopResponse) -> None:
    """Done with a generate answer: one read to its end keeps the pooled connection; anything else
    (the client went away, a count that stopped at its first chunk) closes it, which is how the
    router or the worker learns to abort the generation."""
    if resp.content.is_eof():
        resp.release()
    else:
        resp.close()


def router_body(request: PreprocessedRequest) -> bytes:
    """The router request's bytes: an agent's next turn takes its repeated messages' JSON from
    its last turn (``repeats.router_messages``) and its tools' from the same tool objects
    (:func:`tool_dumps`); the same bytes as ``to_json_bytes()``."""
    tools = tool_dumps(request.tools)
    if request.messages is None:
        return request.to_json_bytes(tools_json=tools)
    return request.to_json_bytes(messages_json=router_messages(request.messages), tools_json=tools)


def tool_dumps(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """Each tool's router JSON, kept by the tool object: the frontend shares one definition
    between the turns that resend its bytes (``Resumer.derived``). A ``ToolDefinition`` is
    frozen and nothing changes its ``parameters`` in place; the dump is only encoded."""
    out = []
    for tool in tools:
        known = _DUMPS.get(id(tool))
        if known is None or known[0] is not tool:
            known = _DUMPS[id(tool)] = (tool, tool.model_dump(exclude_none=True, by_alias=True))
            while len(_DUMPS) > MAX_TOOL_DUMPS:  # the entry holds the tool: its id stays its own
                _DUMPS.pop(next(iter(_DUMPS)), None)
        out.append(known[1])
    return out


MAX_TOOL_DUMPS: Final = 1024
_DUMPS: Final[dict[int, tuple[ToolDefinition, dict[str, Any]]]] = {}


async def error_from_status(
    resp: HopResponse, *, hint_param: str | None, limit_s: float
) -> FrontendError:
    try:
        raw = await resp.content.read(_MAX_ERROR_BODY)
    except TimeoutError:
        return errors.upstream_timeout(limit_s)
    except aiohttp.ClientError as exc:
        log.warning("router error body unreadable: %s", _describe(exc))
        return errors.upstream_disconnected()
    try:
        line = ErrorLine.model_validate_json(raw)
    except ValidationError:
        return errors.upstream_refused(resp.status)
    return errors.from_upstream(line.error, hint_param=hint_param)


async def chunks_of(
    resp: HopResponse, *, hint_param: str | None, limit_s: float
) -> AsyncIterator[GenerateChunk]:
    """Parse NDJSON lines until a chunk carries a finish reason; errors raise ``FrontendError``."""
    buffer = b""
    while True:
        try:
            data = await resp.content.readany()
        except TimeoutError:
            raise errors.upstream_timeout(limit_s) from None
        except aiohttp.ClientError as exc:
            log.warning("router stream dropped: %s", _describe(exc))
            raise errors.upstream_disconnected() from None
        if not data:
            log.warning("router stream ended without a finish reason")
            raise errors.upstream_disconnected()
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            chunk = _parse_line(line, hint_param=hint_param)
            if chunk.finish_reason is not None:
                await _drain(resp)
                yield chunk
                return
            yield chunk


async def _drain(resp: HopResponse) -> None:
    """Read to the end of the body so the connection is pooled again instead of closed.

    After the finish line only the chunked terminator is left; a router that sends it late costs
    a new connection on the next request, never a wait of more than ``_DRAIN_LIMIT_S``.
    """
    with contextlib.suppress(TimeoutError, aiohttp.ClientError):
        async with asyncio.timeout(_DRAIN_LIMIT_S):
            while await resp.content.readany():
                pass


def _parse_line(line: bytes, *, hint_param: str | None) -> GenerateChunk:
    if b'"error"' not in line and b"\\u" not in line:  # a chunk: one typed decode, no dict
        # (an escaped key could spell "error" unseen: those lines take the path below)
        try:
            chunk = read_chunk(line)
        except msgspec.MsgspecError:
            pass  # said below, in the words the slow path picks
        else:
            return _checked(chunk)
    try:
        obj = json.loads(line)
    except ValueError:
        raise errors.router_malformed("stream line") from None
    if isinstance(obj, dict) and "error" in obj:
        try:
            error = ErrorLine.model_validate(obj).error
        except ValidationError:
            raise errors.router_malformed("error line") from None
        raise errors.from_upstream(error, hint_param=hint_param)
    try:
        chunk = msgspec.convert(obj, GenerateChunk)
    except msgspec.ValidationError:
        raise errors.router_malformed("chunk") from None
    return _checked(chunk)


def _checked(chunk: GenerateChunk) -> GenerateChunk:
    if chunk.finish_reason == "abort":
        raise FrontendError(
            status=500, code="engine_error", message="The engine aborted the generation."
        )
    return chunk


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

"""The keep-alive HTTP/1.1 client of the hops between our own processes: frontend -> router,
frontend or router -> worker.

aiohttp's client spends ~0.4 ms of CPU on one small POST here, against ~0.1 ms for this one
(benchmarks/README.md, "A leaner client for the hops"): its per-request machinery (URL objects,
multidicts, tracing hooks, cookie jar, timers) serves the open web. These hops talk to our own
servers: ``http(s)://host:port`` URLs, bodies in bytes, answers framed by ``Content-Length`` or
chunked. A response offers the part of ``aiohttp.ClientResponse`` the data plane reads
(``status``, ``content.readany/read/at_eof/is_eof``, ``read``, ``json``, ``release``, ``close``),
and failures are aiohttp's exception types, so callers read the same either way.

Timeouts follow aiohttp's ``connect``/``sock_read``: opening a connection, and each wait for
bytes of the answer (its head, then every read), each have their own limit; a long stream that
keeps sending is never cut. A connection goes back to the pool only once its answer was read to
the end; anything else closes it, which is how a worker learns to abort a generation.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, cast
from urllib.parse import urlsplit

import aiohttp

MAX_HEAD: Final = 64 * 1024
"""An answer's status line and headers must fit in this many bytes."""
HIGH_WATER: Final = 4 * 1024 * 1024
"""Unread body bytes above which the socket stops reading until the caller catches up."""
IDLE_S: Final = 15.0
"""A pooled connection idle longer than this is closed, not reused (aiohttp's default; our
servers close idle connections after 75 s, so a reused one is never one they are closing)."""
MAX_IDLE: Final = 64
"""Idle connections kept per peer; more are closed (a burst does not pin its sockets open)."""


class HopError(aiohttp.ClientError):
    """The peer broke the exchange off, or answered with something that is not HTTP/1.1."""


class HopConnectError(aiohttp.ClientConnectionError):
    """Nothing reached the peer: the connection could not be opened (``os_error`` says why)."""

    def __init__(self, peer: str, os_error: OSError) -> None:
        super().__init__(f"cannot connect to {peer}: {os_error}")
        self.os_error = os_error


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    tls: bool
    authority: str
    path: str


@lru_cache(maxsize=1024)
def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return _Target(parts.hostname, port, tls, parts.netloc, path)


def _head(method: str, target: _Target, headers: Mapping[str, str], length: int | None) -> bytes:
    lines = [f"{method} {target.path} HTTP/1.1\r\nHost: {target.authority}\r\n"]
    if length is not None:
        lines.append(f"Content-Length: {length}\r\n")
    for name, value in headers.items():
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name or ":" in name:
            raise ValueError(f"header {name!r} holds a line break or a colon")
        if name.lower() not in ("content-length", "host", "transfer-encoding"):
            lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode()


class _Connection(asyncio.Protocol):
    """One socket; feeds the answer in flight, if any."""

    def __init__(self, key: tuple[str, int, bool], open_set: set[_Connection]) -> None:
        self.key = key
        self._open = open_set
        self.transport: asyncio.Transport | None = None
        self.answer: HopResponse | None = None
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a socket transport (uvloop's is one without asyncio.Transport as its base)
        self.transport = cast(asyncio.Transport, transport)
        self._open.add(self)

    def data_received(self, data: bytes) -> None:
        if self.answer is None:  # bytes nobody asked for: this connection cannot be trusted
            self.close()
            return
        self.answer._feed(data)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._open.discard(self)
        if self.answer is not None:
            self.answer._lost(exc)

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


_HEX_DIGITS: Final = b"0123456789abcdefABCDEF"
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


class HopResponse:
    """An answer: its status and headers, then its body as it arrives."""

    def __init__(self, client: HopClient, conn: _Connection, *, read_timeout: float | None) -> None:
        self._client = client
        self._conn = conn
        self._read_timeout = read_timeout
        self._raw = bytearray()  # bytes not parsed yet
        self._body = bytearray()  # body bytes not read yet
        self._phase = _HEAD
        self._left = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        self._keep_alive = True

    @property
    def content(self) -> HopResponse:
        """aiohttp's ``resp.content``: the same object here."""
        return self

    # --- fed by the connection ---------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self._raw += data
        try:
            self._parse()
        except HopError as exc:
            self._fail(exc)
            self._conn.close()
            return
        if len(self._body) > HIGH_WATER and not self._paused:
            self._paused = True
            self._conn.pause_reading()
        self._wake()

    def _lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        if self._phase == _UNTIL_CLOSE:
            self._phase = _DONE
        elif self._phase != _DONE:
            detail = f": {exc}" if exc else ""
            self._fail(HopError(f"the connection closed before the answer ended{detail}"))
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _parse(self) -> None:
        """Move what ``_raw`` holds into the head, the body and the framing state. Reads along
        ``_raw`` and cuts what it read once at the end: a stream brings a chunk per token, and
        a cut per framing step moved the rest of the buffer each time."""
        raw = self._raw
        pos, size = 0, len(raw)
        try:
            while pos < size:
                phase = self._phase
                if phase == _CHUNK_SIZE:
                    end = raw.find(b"\r\n", pos)
                    if end < 0:
                        if size - pos > 1024:
                            raise HopError("a chunk size line is too long")
                        return
                    size_text = bytes(raw[pos:end]).split(b";", 1)[0].strip()
                    pos = end + 2
                    if not size_text or size_text.strip(_HEX_DIGITS):  # int() takes 0x, +, _
                        raise HopError(f"bad chunk size {size_text[:20]!r}")
                    left = int(size_text, 16)
                    stop = pos + left
                    if left and stop + 2 <= size:  # the whole chunk is here: one step, not three
                        if raw[stop : stop + 2] != b"\r\n":
                            raise HopError("a chunk does not end with CRLF")
                        self._body += raw[pos:stop]
                        pos = stop + 2
                        continue
                    self._left = left
                    self._phase = _CHUNK_DATA if left else _TRAILER
                elif phase in (_CHUNK_DATA, _LENGTH):  # ``_left`` body bytes
                    take = min(self._left, size - pos)
                    self._body += raw[pos : pos + take]
                    pos += take
                    self._left -= take
                    if self._left == 0:
                        self._phase = _DONE if phase == _LENGTH else _CHUNK_END
                elif phase == _CHUNK_END:
                    if size - pos < 2:
                        return
                    if raw[pos : pos + 2] != b"\r\n":
                        raise HopError("a chunk does not end with CRLF")
                    pos += 2
                    self._phase = _CHUNK_SIZE
                elif phase == _HEAD:
                    end = raw.find(b"\r\n\r\n", pos)
                    if end < 0:
                        if size - pos > MAX_HEAD:
                            raise HopError("the answer's head is too large")
                        return
                    head = bytes(raw[pos:end])
                    pos = end + 4
                    self._read_head(head)
                elif phase == _TRAILER:
                    end = raw.find(b"\r\n", pos)
                    if end < 0:
                        return
                    if end == pos:  # the empty line that ends the trailer
                        self._phase = _DONE
                    pos = end + 2
                elif phase == _UNTIL_CLOSE:
                    self._body += raw[pos:]
                    pos = size
                else:  # _DONE: bytes after the answer; it stands, the connection is not reused
                    self._keep_alive = False
                    pos = size
        finally:
            del raw[:pos]

    def _read_head(self, head: bytes) -> None:
        try:
            text = head.decode("latin-1")
            status_line, *header_lines = text.split("\r\n")
            version, status_text, *reason = status_line.split(" ", 2)
            status = int(status_text)
        except ValueError:
            raise HopError("the answer's status line is not HTTP/1.1") from None
        if not version.startswith("HTTP/1.") or not 100 <= status <= 999:
            raise HopError("the answer's status line is not HTTP/1.1")
        if 100 <= status < 200:
            return  # an interim answer: the real one follows
        headers: dict[str, str] = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise HopError("a header line of the answer is malformed")
            headers[name.lower()] = value.strip()
        self.status, self.reason, self.headers = status, reason[0] if reason else "", headers
        connection = headers.get("connection", "").lower()
        self._keep_alive = version == "HTTP/1.1" and "close" not in connection
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._phase = _CHUNK_SIZE
        elif "content-length" in headers:
            try:
                self._left = int(headers["content-length"])
            except ValueError:
                raise HopError("the answer's Content-Length is not a number") from None
            if self._left < 0:
                raise HopError("the answer's Content-Length is negative")
            self._phase = _LENGTH if self._left else _DONE
        elif status in (204, 304):
            self._phase = _DONE
        else:
            self._phase, self._keep_alive = _UNTIL_CLOSE, False

    # --- read by the caller ------------------------------------------------------------------

    async def _wait(self) -> None:
        """Until the connection brings anything (bytes, the end, an error), or the read timeout.

        One timer per answer, not one per wait: a stream waits once per token, and scheduling
        and cancelling a timer each time cost more than the rest of the wait. Each wait moves
        the deadline; the timer, when it fires early, sets itself again for the deadline."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        if self._read_timeout is not None:
            self._deadline = loop.time() + self._read_timeout
            if self._timer is None:
                self._timer = loop.call_at(self._deadline, self._on_timer)
        try:
            await waiter
        finally:
            self._waiter = None
            if self._phase == _DONE or self._error is not None:
                self._stop_timer()  # no wait follows: the timer must not hold this answer

    def _on_timer(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody is waiting: the next wait sets the timer again
        loop = waiter.get_loop()
        if loop.time() >= self._deadline:
            waiter.set_exception(TimeoutError("no answer within the read timeout"))
        else:
            self._timer = loop.call_at(self._deadline, self._on_timer)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _head_ready(self) -> None:
        while self._phase == _HEAD:
            if self._error is not None:
                raise self._error
            await self._wait()
        if self._error is not None and self.status == 0:
            raise self._error

    def is_eof(self) -> bool:
        """The whole answer has arrived (it may not all be read yet)."""
        return self._phase == _DONE

    def at_eof(self) -> bool:
        """The whole answer has arrived and has been read."""
        return self._phase == _DONE and not self._body

    async def readany(self) -> bytes:
        """What body bytes have arrived, waiting for some; ``b""`` at the end."""
        while not self._body:
            if self._error is not None:
                raise self._error
            if self._phase == _DONE:
                return b""
            await self._wait()
        data = bytes(self._body)
        self._body.clear()
        if self._paused:
            self._paused = False
            self._conn.resume_reading()
        return data

    async def read(self, n: int = -1) -> bytes:
        """The body to its end, or its first ``n`` bytes when ``n`` >= 0."""
        out = bytearray()
        while n < 0 or len(out) < n:
            data = await self.readany()
            if not data:
                break
            out += data
        if 0 <= n < len(out):
            self._body[:0] = out[n:]
            del out[n:]
        return bytes(out)

    def unread(self, data: bytes) -> None:
        """Put ``data`` back before what is not read yet: a body looked at, then passed on whole."""
        self._body[:0] = data

    async def json(self, *, content_type: str | None = None) -> Any:
        """The body, decoded as JSON (the content type is not checked)."""
        return json.loads(await self.read())

    def release(self) -> None:
        """Done with the answer: a connection whose answer was read whole is pooled again."""
        self._stop_timer()
        conn = self._conn
        if conn.answer is not self:
            return
        conn.answer = None
        if self._phase == _DONE and self._keep_alive and self._error is None and not conn.closed:
            self._client._pool(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Done with the answer and its connection: the peer sees the connection go. After
        :meth:`release` it does nothing (the connection may carry another answer by then)."""
        self._stop_timer()
        if self._conn.answer is self:
            self._conn.answer = None
            self._conn.close()


class HopClient:
    """Pooled keep-alive connections to each peer; one request at a time on each."""

    def __init__(
        self, *, connect_timeout: float | None, read_timeout: float | None, idle_s: float = IDLE_S
    ) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.idle_s = idle_s
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._tls: ssl.SSLContext | None = None

    async def post(
        self, url: str, *, data: bytes, headers: Mapping[str, str], limit_s: float | None = None
    ) -> HopResponse:
        """Send ``data`` and return once the answer's head arrived; ``limit_s`` replaces both
        limits for this request."""
        return await self.request("POST", url, data=data, headers=headers, limit_s=limit_s)

    async def get(
        self, url: str, *, headers: Mapping[str, str] | None = None, limit_s: float | None = None
    ) -> HopResponse:
        return await self.request("GET", url, data=None, headers=headers or {}, limit_s=limit_s)

    async def request(
        self,
        method: str,
        url: str,
        *,
        data: bytes | None,
        headers: Mapping[str, str],
        limit_s: float | None = None,
    ) -> HopResponse:
        target = _target(url)
        head = _head(method, target, headers, None if data is None else len(data))
        conn = await self._connect(target, limit_s=limit_s)
        answer = HopResponse(self, conn, read_timeout=limit_s or self.read_timeout)
        conn.answer = answer
        try:
            assert conn.transport is not None
            conn.transport.write(head + data if data else head)
            await answer._head_ready()
        except BaseException:
            answer.close()
            raise
        return answer

    async def _connect(self, target: _Target, *, limit_s: float | None) -> _Connection:
        key = (target.host, target.port, target.tls)
        loop = asyncio.get_running_loop()
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and loop.time() - conn.idle_since < self.idle_s:
                return conn
            conn.close()
        limit = limit_s or self.connect_timeout
        try:
            async with asyncio.timeout(limit):
                _, conn = await loop.create_connection(
                    lambda: _Connection(key, self._open),
                    target.host,
                    target.port,
                    ssl=self._context() if target.tls else None,
                )
        except TimeoutError:
            raise TimeoutError(f"no connection to {target.authority} within {limit}s") from None
        except OSError as exc:
            raise HopConnectError(target.authority, exc) from None
        return conn

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def _pool(self, conn: _Connection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= MAX_IDLE:
            conn.close()
            return
        conn.idle_since = asyncio.get_running_loop().time()
        idle.append(conn)

    async def close(self) -> None:
        """Close every connection, pooled or in use."""
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()

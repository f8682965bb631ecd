"""The hops' HTTP/1.1 client: every framing our servers use, split anywhere, and the pool, the
timeouts and the failures a router or frontend acts on, against a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import pytest
import uvloop

from kvretention.dataplane.hop_client import (
    HIGH_WATER,
    HopClient,
    HopConnectError,
    HopError,
    HopResponse,
    _Connection,
    _head,
    _target,
)
from kvretention.dataplane.router.state import connect_evidence

NDJSON = b'{"text": "a"}\n{"text": "b", "finish_reason": "stop"}\n'

FRAMINGS = [
    pytest.param(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n"
        % len(NDJSON)
        + NDJSON,
        NDJSON,
        True,
        id="content-length",
    ),
    pytest.param(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"e\r\n" + NDJSON[:14] + b"\r\n"
        b"%x;ext=1\r\n" % (len(NDJSON) - 14) + NDJSON[14:] + b"\r\n0\r\n\r\n",
        NDJSON,
        True,
        id="chunked-with-extension",
    ),
    pytest.param(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n",
        b"abc",
        True,
        id="chunked-with-trailer",
    ),
    pytest.param(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"ok",
        True,
        id="interim-answer-first",
    ),
    pytest.param(b"HTTP/1.1 204 No Content\r\n\r\n", b"", True, id="no-content"),
    pytest.param(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
        b"ok",
        False,
        id="connection-close",
    ),
    pytest.param(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok", False, id="http-1.0"),
]


class _Pool(HopClient):
    """Records what :meth:`release` hands back to the pool."""

    def __init__(self) -> None:
        super().__init__(connect_timeout=1.0, read_timeout=1.0)
        self.pooled: list[_Connection] = []

    def _pool(self, conn: _Connection) -> None:
        self.pooled.append(conn)


def fed(pieces: Sequence[bytes]) -> tuple[HopResponse, _Pool]:
    pool = _Pool()
    conn = _Connection(("peer", 1, False), set())
    answer = HopResponse(pool, conn, read_timeout=1.0)
    conn.answer = answer
    for piece in pieces:
        conn.data_received(piece)
    return answer, pool


def split_every(raw: bytes, size: int) -> list[bytes]:
    return [raw[i : i + size] for i in range(0, len(raw), size)]


@pytest.mark.parametrize(("raw", "body", "reusable"), FRAMINGS)
@pytest.mark.parametrize("piece", [1, 2, 7, 10_000])
async def test_every_framing_reads_the_same_body_however_it_is_split(
    raw: bytes, body: bytes, reusable: bool, piece: int
) -> None:
    answer, pool = fed(split_every(raw, piece))
    assert answer.status in (200, 204)
    assert answer.is_eof()
    assert await answer.read() == body
    assert answer.at_eof()
    answer.release()
    assert len(pool.pooled) == (1 if reusable else 0)


async def test_a_body_until_close_ends_with_the_connection() -> None:
    answer, pool = fed([b"HTTP/1.1 200 OK\r\n\r\npart one, ", b"part two"])
    assert not answer.is_eof()
    assert await answer.readany() == b"part one, part two"
    answer._conn.connection_lost(None)
    assert await answer.readany() == b""
    answer.release()
    assert pool.pooled == []


async def test_read_n_leaves_the_rest_for_the_next_read() -> None:
    answer, _ = fed([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789"])
    assert await answer.read(4) == b"0123"
    assert await answer.read() == b"456789"


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"HTP/1.1 200 OK\r\n\r\n", id="not-http"),
        pytest.param(b"HTTP/1.1 OK 200\r\n\r\n", id="status-not-a-number"),
        pytest.param(b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", id="header-without-colon"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", id="bad-length"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", id="negative-length"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", id="bad-chunk-size"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n",
            id="chunk-size-with-0x",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", id="negative-chunk"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
            id="chunk-longer-than-its-size",
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nX: " + b"y" * (70 * 1024), id="head-too-large"),
    ],
)
async def test_what_is_not_http_fails_the_answer_and_closes_the_connection(raw: bytes) -> None:
    answer, pool = fed([raw])
    with pytest.raises(HopError):
        await (answer._head_ready() if answer.status == 0 else answer.read())
    assert isinstance(HopError("x"), aiohttp.ClientError)  # callers catch aiohttp's base
    assert answer._conn.closed
    answer.release()
    assert pool.pooled == []


async def test_a_connection_that_ends_mid_body_fails_the_read() -> None:
    answer, pool = fed([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234"])
    assert await answer.readany() == b"01234"
    answer._conn.connection_lost(ConnectionResetError("reset"))
    with pytest.raises(HopError, match="closed before the answer ended"):
        await answer.readany()
    answer.release()
    assert pool.pooled == []


async def test_bytes_after_the_answer_keep_it_but_not_its_connection() -> None:
    answer, pool = fed([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"])
    assert await answer.read() == b"ok"
    answer.release()
    assert pool.pooled == []


@pytest.mark.parametrize(
    ("name", "value"),
    [("x-session", "a\r\nX-Injected: 1"), ("x-session", "a\nb"), ("x-a\r\nb", "v"), ("x:y", "v")],
)
def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(
    name: str, value: str
) -> None:
    with pytest.raises(ValueError, match="line break"):
        _head("POST", _target("http://127.0.0.1:1/generate"), {name: value}, 0)


# --- against a real socket ------------------------------------------------------------------


@dataclass
class Server:
    """A scripted HTTP/1.1 peer: each request's head and body, the connections it accepted."""

    answer: Callable[[bytes], bytes | None]
    url: str = ""
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    closed_by_client: asyncio.Event = field(default_factory=asyncio.Event)


@asynccontextmanager
async def serving(answer: Callable[[bytes], bytes | None]) -> AsyncIterator[Server]:
    """``answer(request head + body)`` is written back; ``None`` answers nothing."""
    server = Server(answer)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + await reader.readexactly(length)
                server.requests.append(request)
                reply = server.answer(request)
                if reply is None:
                    await reader.read()  # until the client gives up
                    break
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        server.closed_by_client.set()
        writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    server.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    async with listener:
        yield server


def ok(body: bytes = b"ok") -> Callable[[bytes], bytes]:
    return lambda _: b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def post(client: HopClient, server: Server) -> Awaitable[HopResponse]:
    return client.post(server.url + "/generate", data=b"{}", headers={})


async def exchange(client: HopClient, server: Server) -> tuple[int, bytes]:
    """One request read whole and released (its connection pooled again)."""
    resp = await post(client, server)
    answer = (resp.status, await resp.read())
    resp.release()
    return answer


async def test_answers_read_whole_share_one_connection_and_the_request_goes_out_exact() -> None:
    client = HopClient(connect_timeout=1.0, read_timeout=1.0)
    async with serving(ok()) as server:
        for _ in range(3):
            resp = await client.post(
                server.url + "/generate", data=b'{"a": 1}', headers={"x-request-id": "r1"}
            )
            assert (resp.status, await resp.read()) == (200, b"ok")
            resp.release()
        assert server.connections == 1
        head, _, body = server.requests[0].partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        assert lines[0] == b"POST /generate HTTP/1.1"
        assert b"Content-Length: 8" in lines and b"x-request-id: r1" in lines
        assert body == b'{"a": 1}'
    await client.close()


async def test_an_answer_not_read_whole_closes_its_connection_and_the_peer_sees_it() -> None:
    client = HopClient(connect_timeout=1.0, read_timeout=1.0)
    stream = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"  # no end
    async with serving(lambda _: stream) as server:
        resp = await post(client, server)
        assert await resp.readany() == b"abc"
        assert not resp.content.is_eof()
        resp.close()
        await asyncio.wait_for(server.closed_by_client.wait(), 2.0)
        resp = await post(client, server)
        resp.close()
        assert server.connections == 2
    await client.close()


async def test_a_connection_the_peer_closed_while_idle_is_not_reused() -> None:
    client = HopClient(connect_timeout=1.0, read_timeout=1.0)
    async with serving(ok()) as server:
        resp = await post(client, server)
        await resp.read()
        conn = resp._conn
        resp.release()
        assert conn.transport is not None
        conn.transport.close()  # as if the peer had gone: the socket is closed under the pool
        await asyncio.sleep(0.05)
        assert await exchange(client, server) == (200, b"ok")
        assert server.connections == 2
    await client.close()


async def test_an_idle_connection_older_than_the_limit_is_not_reused() -> None:
    client = HopClient(connect_timeout=1.0, read_timeout=1.0, idle_s=0.0)
    async with serving(ok()) as server:
        for _ in range(2):
            await exchange(client, server)
        assert server.connections == 2
    await client.close()


async def test_nothing_listening_is_a_connect_error_the_router_reads_as_refused() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = HopClient(connect_timeout=1.0, read_timeout=1.0)
    with pytest.raises(HopConnectError) as caught:
        await client.post(f"http://127.0.0.1:{port}/generate", data=b"{}", headers={})
    assert isinstance(caught.value, aiohttp.ClientError)
    assert connect_evidence(caught.value) == "refused"
    await client.close()


async def test_a_peer_that_never_answers_times_out_and_loses_the_connection() -> None:
    client = HopClient(connect_timeout=1.0, read_timeout=0.2)
    async with serving(lambda _: None) as server:
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await post(client, server)
        assert asyncio.get_running_loop().time() - started < 1.0
        await asyncio.wait_for(server.closed_by_client.wait(), 2.0)
    await client.close()


async def test_a_stream_that_stalls_times_out_on_the_read_not_before() -> None:
    client = HopClient(connect_timeout=1.0, read_timeout=0.2)
    stream = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    async with serving(lambda _: stream) as server:
        resp = await post(client, server)
        assert await resp.readany() == b"abc"
        with pytest.raises(TimeoutError):
            await resp.readany()
        resp.close()
    await client.close()


@asynccontextmanager
async def trickling(gaps: Sequence[float]) -> AsyncIterator[str]:
    """A peer whose chunked answer sends one chunk after each of ``gaps`` (seconds), then stalls."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)  # the client's ``{}``
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            writer.write(b"1\r\n%d\r\n" % (i % 10))
            await writer.drain()
        with contextlib.suppress(ConnectionError):
            await reader.read()  # until the client gives up
        writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with listener:
        yield f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"


async def test_a_stream_runs_past_the_read_limit_while_it_sends_then_stalls_out() -> None:
    """Each gap is under the read limit and all of them together are five times it: nothing is
    cut until the stall, which is, no sooner than the limit after the last read began."""
    limit = 0.2
    client = HopClient(connect_timeout=1.0, read_timeout=limit)
    async with trickling([0.12] * 8) as url:
        resp = await client.post(url + "/generate", data=b"{}", headers={})
        loop = asyncio.get_running_loop()
        got = b""
        while len(got) < 8:
            got += await resp.readany()
        assert got == b"01234567"
        stalled = loop.time()
        with pytest.raises(TimeoutError):
            await resp.readany()
        assert limit <= loop.time() - stalled < limit + 0.5
        resp.close()
    await client.close()


async def test_an_answer_done_with_is_not_held_by_its_read_timer() -> None:
    """The read timer lives as long as the answer is read: released, the answer can go (a timer
    left for the read limit would keep every streamed answer for minutes)."""
    client = HopClient(connect_timeout=1.0, read_timeout=300.0)
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    async with serving(lambda _: chunked) as server:
        for done in ("release", "close"):
            resp = await post(client, server)
            assert await resp.read() == b"abc"
            getattr(resp, done)()
            gone = weakref.ref(resp)
            del resp
            gc.collect()
            assert gone() is None, done
    async with trickling([0.0, 60.0]) as url:  # one chunk, then the client gives up mid-stream
        resp = await client.post(url + "/generate", data=b"{}", headers={})
        assert await resp.readany() == b"0"
        resp.close()
        gone = weakref.ref(resp)
        del resp
        gc.collect()
        assert gone() is None, "closed mid-stream"
    await client.close()


async def test_a_body_larger_than_the_high_water_mark_arrives_whole() -> None:
    body = bytes(range(256)) * (HIGH_WATER // 256 + 4096)
    client = HopClient(connect_timeout=1.0, read_timeout=2.0)
    async with serving(ok(body)) as server:
        resp = await post(client, server)
        await asyncio.sleep(0.2)  # let the socket fill the buffer past the mark
        assert await resp.read() == body
        resp.release()
    await client.close()


async def test_close_closes_the_pooled_connections() -> None:
    client = HopClient(connect_timeout=1.0, read_timeout=1.0)
    async with serving(ok()) as server:
        await exchange(client, server)
        await client.close()
        await asyncio.wait_for(server.closed_by_client.wait(), 2.0)


def test_the_client_runs_on_uvloop_too() -> None:
    """SGLang's processes install uvloop; its transports are not ``asyncio.Transport``s."""

    async def run() -> tuple[int, bytes, int]:
        client = HopClient(connect_timeout=1.0, read_timeout=1.0)
        async with serving(ok()) as server:
            for _ in range(2):
                status, body = await exchange(client, server)
            await client.close()
            return status, body, server.connections

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(run()) == (200, b"ok", 1)


async def test_close_after_release_leaves_the_pooled_connection_alone() -> None:
    client = HopClient(connect_timeout=1.0, read_timeout=1.0)
    async with serving(ok()) as server:
        first = await post(client, server)
        await first.read()
        first.release()
        second = await post(client, server)
        first.close()  # late, from a cleanup path: the connection is the second answer's now
        assert await second.read() == b"ok"
        second.release()
        assert await exchange(client, server) == (200, b"ok")  # on the same connection
        assert server.connections == 1
    await client.close()

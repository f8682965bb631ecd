"""A bare upstream for the request-path benchmarks: as little CPU per request as Python allows.

Pure standard library (an ``asyncio.Protocol`` HTTP/1.1 server with keep-alive), so it runs in any
venv and costs the same behind every proxy being compared. It speaks three dialects:

- OpenAI ``POST /v1/chat/completions`` (``"stream": true`` -> SSE chunks, else one JSON body):
  what a client calls directly, and what LiteLLM's proxy and ``sglang-router`` forward to;
- SGLang's ``POST /generate`` plus the info/health GETs a router polls (``/health``,
  ``/get_model_info``, ``/get_server_info``, ...), so ``sglang-router`` accepts it as a worker;
- our worker protocol ``POST /v1/generate`` (NDJSON ``GenerateChunk`` lines), so it can stand in
  for the router (frontend alone) or for a worker (frontend + router without the engine stand-in).

The answer is the engine stand-in's: the same pieces, one per token; ``max_tokens`` /
``max_new_tokens`` asks for more (pieces repeat), bounded by ``MAX_PIECES``. Short answers are
written in one go (the upstream is instant); streams longer than ``--pace-above`` pieces (64) are
paced one piece per ``--pace-ms`` (1 ms), as a decoding engine would send them.

    python benchmarks/stub_openai.py --port 18000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

REPLY_PIECES: Final = ("Hello", " from", " the", " kvretention", " stand-in", ".")
MAX_PIECES: Final = 4096
MODEL: Final = "stub-model"
MAX_HEADER_BYTES: Final = 64 * 1024
MAX_BODY_BYTES: Final = 64 * 1024 * 1024

_INFO: Final[dict[str, Any]] = {
    "status": "ok",
    # Replaced by --model-dir: routers that load the served model's tokenizer must find it locally
    # and never reach out to a model hub.
    "model_path": MODEL,
    "tokenizer_path": MODEL,
    "served_model_name": MODEL,
    "is_generation": True,
    "preferred_sampling_params": None,
    "weight_version": "default",
    "version": "0.5.23",
    "role": "aggregated",
    "engine": "stub",
    "dialect": "versioned",
    "bootstrap_host": None,
    "bootstrap_port": None,
    "draining": False,
    "disaggregation_mode": "null",
    "dp_size": 1,
    "tp_size": 1,
    "internal_states": [{"last_gen_throughput": 0.0}],
}


TOKENIZER_JSON: Final[dict[str, Any]] = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [],
    "normalizer": None,
    "pre_tokenizer": {"type": "Whitespace"},
    "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hi": 1}, "unk_token": "[UNK]"},
}
"""A minimal Hugging Face ``tokenizer.json`` (word level), enough for a router to load locally."""


def write_model_dir(path: Path) -> Path:
    """Create a local "model" folder holding only :data:`TOKENIZER_JSON`; returns ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(json.dumps(TOKENIZER_JSON))
    return path


@dataclass
class Pacing:
    """Streams longer than ``above`` pieces send one piece every ``pace_s`` seconds."""

    above: int = 64
    pace_s: float = 0.001


PACING: Final = Pacing()


def piece_count(body: dict[str, Any]) -> int:
    """How many pieces to answer with: the request's token limit, else the stand-in's answer."""
    sampling = body.get("sampling_params") or body.get("sampling") or {}
    limit = (
        body.get("max_completion_tokens")
        or body.get("max_tokens")
        or (sampling.get("max_new_tokens") if isinstance(sampling, dict) else None)
    )
    if not isinstance(limit, int) or limit <= 0:
        return len(REPLY_PIECES)
    return min(limit, MAX_PIECES)


def piece(i: int) -> str:
    return REPLY_PIECES[i % len(REPLY_PIECES)]


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def openai_completion(*, rid: str, count: int, created: int) -> bytes:
    text = "".join(piece(i) for i in range(count))
    return _json(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": count, "total_tokens": count + 1},
        }
    )


def openai_sse(*, rid: str, count: int, created: int) -> list[bytes]:
    """SSE events, pre-rendered cheaply: a template with the per-chunk text spliced in."""
    head = (
        b'data: {"id":"'
        + rid.encode()
        + b'","object":"chat.completion.chunk","created":'
        + str(created).encode()
        + b',"model":"'
        + MODEL.encode()
        + b'","choices":[{"index":0,'
    )
    events = [head + b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n']
    for i in range(count):
        events.append(
            head + b'"delta":{"content":' + _json(piece(i)) + b'},"finish_reason":null}]}\n\n'
        )
    events.append(
        head + b'"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,'
        b'"completion_tokens":'
        + str(count).encode()
        + b',"total_tokens":'
        + str(count + 1).encode()
        + b"}}\n\n"
    )
    events.append(b"data: [DONE]\n\n")
    return events


def ndjson_chunks(count: int) -> list[bytes]:
    """Our worker protocol's ``GenerateChunk`` lines (text deltas; usage on the last)."""
    lines = []
    for i in range(count):
        last = i == count - 1
        chunk: dict[str, Any] = {"text": piece(i), "token_ids": [1000 + i]}
        if last:
            chunk["finish_reason"] = "stop"
            chunk["usage"] = {"prompt_tokens": 1, "completion_tokens": count, "cached_tokens": 0}
        lines.append(_json(chunk) + b"\n")
    return lines or [b'{"text":"","finish_reason":"length"}\n']


def sglang_generate(*, count: int, stream: bool) -> list[bytes]:
    """SGLang's native ``/generate``: cumulative text; SSE when streaming."""
    outs = []
    text = ""
    for i in range(count):
        text += piece(i)
        last = i == count - 1
        meta = {
            "id": "stub",
            "finish_reason": {"type": "stop"} if last else None,
            "prompt_tokens": 1,
            "completion_tokens": i + 1,
        }
        outs.append({"text": text, "meta_info": meta})
    if not stream:
        return [_json(outs[-1] if outs else {"text": "", "meta_info": {}})]
    return [b"data: " + _json(o) + b"\n\n" for o in outs] + [b"data: [DONE]\n\n"]


class StubProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection: parse requests as they arrive, answer in order."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.transport is not None and not self.transport.is_closing():
            if not self._one_request():
                return

    def _one_request(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEADER_BYTES:
                self._close_with(431, b"{}")
            return False
        head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        try:
            method, path, _version = head[0].split(" ", 2)
        except ValueError:
            self._close_with(400, b"{}")
            return False
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        start = end + 4
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parsed = _dechunk(self.buf, start)
            if parsed is None:
                return False
            body, consumed = parsed
        else:
            length = int(headers.get("content-length") or 0)
            if length > MAX_BODY_BYTES:
                self._close_with(413, b"{}")
                return False
            if len(self.buf) - start < length:
                return False
            body, consumed = bytes(self.buf[start : start + length]), start + length
        del self.buf[:consumed]
        keep_alive = headers.get("connection", "").lower() != "close"
        self._answer(method, path.split("?", 1)[0], body, keep_alive=keep_alive)
        return True

    def _answer(self, method: str, path: str, body: bytes, *, keep_alive: bool) -> None:
        if method == "GET":
            if path == "/v1/models":
                payload = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                self._send(200, _json(payload), keep_alive=keep_alive)
            elif path == "/metrics":
                self._send(200, b"", keep_alive=keep_alive, ctype=b"text/plain")
            else:  # every health/info probe a router might make
                self._send(200, _json(_INFO), keep_alive=keep_alive)
            return
        if method != "POST":
            self._send(405, b"{}", keep_alive=keep_alive)
            return
        try:
            req = json.loads(body) if body else {}
        except ValueError:
            self._send(400, b'{"error":{"message":"bad json"}}', keep_alive=keep_alive)
            return
        if not isinstance(req, dict):
            req = {}
        count = piece_count(req)
        created = int(time.time())
        rid = "chatcmpl-" + os.urandom(6).hex()
        if path in ("/v1/chat/completions", "/chat/completions", "/v1/completions"):
            if req.get("stream"):
                self._stream(
                    openai_sse(rid=rid, count=count, created=created),
                    b"text/event-stream",
                    keep_alive=keep_alive,
                )
            else:
                self._send(
                    200,
                    openai_completion(rid=rid, count=count, created=created),
                    keep_alive=keep_alive,
                )
        elif path == "/v1/generate":
            lines = ndjson_chunks(count)
            if req.get("stream") is False and count > PACING.above:
                self._whole(lines, keep_alive=keep_alive)
            else:
                self._stream(lines, b"application/x-ndjson", keep_alive=keep_alive)
        elif path == "/generate":
            stream = bool(req.get("stream"))
            parts = sglang_generate(count=count, stream=stream)
            if stream:
                self._stream(parts, b"text/event-stream", keep_alive=keep_alive)
            else:
                self._send(200, parts[0], keep_alive=keep_alive)
        else:
            self._send(404, b'{"error":{"message":"not found"}}', keep_alive=keep_alive)

    def _send(
        self, status: int, body: bytes, *, keep_alive: bool, ctype: bytes = b"application/json"
    ) -> None:
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
            % (status, ctype, len(body), b"" if keep_alive else b"Connection: close\r\n")
            + body
        )
        if not keep_alive:
            self.transport.close()

    def _stream(self, parts: list[bytes], ctype: bytes, *, keep_alive: bool) -> None:
        """Chunked transfer, one HTTP chunk per event, written in one go (the upstream is instant)."""
        assert self.transport is not None
        out = [
            b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n"
            b"Cache-Control: no-cache\r\n%s\r\n"
            % (ctype, b"" if keep_alive else b"Connection: close\r\n")
        ]
        framed = [b"%x\r\n%s\r\n" % (len(part), part) for part in parts] + [b"0\r\n\r\n"]
        if PACING.pace_s <= 0 or len(parts) <= PACING.above:
            self.transport.writelines(out + framed)
            if not keep_alive:
                self.transport.close()
            return
        # A long stream arrives like a real decode: one piece at a time, so a proxy pays its
        # per-chunk cost (a read, a parse, a write) for every piece instead of one batched read.
        self.transport.writelines(out)
        self._paced(framed, 0, keep_alive)

    def _whole(self, lines: list[bytes], *, keep_alive: bool) -> None:
        """A paced answer its client reads whole, as our worker sends it
        (``kvretention.dataplane.worker.whole_answer``): the first line at once, the rest as one
        merged line when the last piece would have come (these streams are shorter than its
        ``WHOLE_ANSWER_FLUSH_S``)."""
        assert self.transport is not None
        rest = [json.loads(line) for line in lines[1:]]
        merged = dict(rest[-1], text="".join(c["text"] for c in rest))
        merged["token_ids"] = [t for c in rest for t in c["token_ids"]]
        framed = [b"%x\r\n%s\r\n" % (len(p), p) for p in (lines[0], _json(merged) + b"\n")]
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
            b"Transfer-Encoding: chunked\r\n%s\r\n%s"
            % (b"" if keep_alive else b"Connection: close\r\n", framed[0])
        )
        delay = PACING.pace_s * len(rest)
        asyncio.get_running_loop().call_later(
            delay, self._paced, [framed[1] + b"0\r\n\r\n"], 0, keep_alive
        )

    def _paced(self, framed: list[bytes], i: int, keep_alive: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(framed[i])
        if i + 1 < len(framed):
            loop = asyncio.get_running_loop()
            loop.call_later(PACING.pace_s, self._paced, framed, i + 1, keep_alive)
        elif not keep_alive:
            self.transport.close()

    def _close_with(self, status: int, body: bytes) -> None:
        self._send(status, body, keep_alive=False)


def _dechunk(buf: bytearray, start: int) -> tuple[bytes, int] | None:
    """Decode a chunked request body starting at ``start``; None until it has fully arrived."""
    pos = start
    body = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
        pos = eol + 2
        if size == 0:
            trailer_end = buf.find(b"\r\n", pos)
            if trailer_end < 0:
                return None
            return bytes(body), trailer_end + 2
        if len(buf) < pos + size + 2:
            return None
        body += buf[pos : pos + size]
        pos += size + 2


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(StubProtocol, host, port, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"stub listening on {host}:{port}", flush=True)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18000)
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="advertise this local folder (created, with a minimal tokenizer.json) as model_path",
    )
    parser.add_argument(
        "--pace-above",
        type=int,
        default=PACING.above,
        help="streams longer than this many pieces are paced (short ones are written at once)",
    )
    parser.add_argument(
        "--pace-ms", type=float, default=PACING.pace_s * 1e3, help="gap between paced pieces"
    )
    args = parser.parse_args()
    PACING.above, PACING.pace_s = args.pace_above, args.pace_ms / 1e3
    if args.model_dir is not None:
        where = str(write_model_dir(args.model_dir).resolve())
        _INFO["model_path"] = _INFO["tokenizer_path"] = where
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()

"""A client for the worker's and router's ``POST /v1/generate``, a frontend's Claude Code path and
the engine stand-in's record, shared by the data-plane tests (and benchmarks) that run them as
processes."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HINT = {"retain_full_prompt": {"ttl_seconds": 1800}}
STANDIN_ANSWER = "Hello from the kvretention stand-in."
"""What the engine stand-in answers a request with no marker."""


def post(
    base_url: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, list[Any]]:
    """POST /v1/generate; (status, parsed NDJSON lines or the error body)."""
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=15)
    try:
        conn.request("POST", "/v1/generate", body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read().decode()
    finally:
        conn.close()
    return resp.status, [json.loads(line) for line in raw.splitlines() if line.strip()]


def leave_after_first_chunk(port: int, body: bytes) -> None:
    """POST ``body`` to /v1/generate on 127.0.0.1:``port`` by hand, read until the stand-in's first
    chunk (``Hello``) arrives, then close the connection: a client that walks away mid-stream."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        received = b""
        while b"Hello" not in received:
            data = sock.recv(4096)
            assert data, "closed before the first chunk"
            received += data


def post_messages(
    port: int, headers: Mapping[str, str], body: bytes, *, timeout: float
) -> tuple[int, str]:
    """POST a Claude Code turn to the frontend on 127.0.0.1:``port`` as Claude Code sends it
    (``/v1/messages?beta=true``, ``headers`` and a JSON ``body``); (status, answer text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "POST",
            "/v1/messages?beta=true",
            body=body,
            headers={**headers, "content-type": "application/json"},
        )
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def request_body(rid: str, *, hint: Any = None, **fields: Any) -> bytes:
    """A ``/v1/generate`` body with token ids (no template needed), hinted when ``hint`` is set."""
    body: dict[str, Any] = {"request_id": rid, "model": "m", "token_ids": [1, 2, 3], **fields}
    if hint is not None:
        body["kv_hints"] = hint
    return json.dumps(body).encode()


def calls(record: Path, rid: str, *, event: str = "generate") -> list[dict[str, Any]]:
    """The stand-in's recorded ``event`` entries for request ``rid``."""
    if not record.exists():
        return []
    entries = [json.loads(line) for line in record.read_text().splitlines()]
    return [e for e in entries if e["rid"] == rid and e["event"] == event]


def wait_for(predicate: Any, *, timeout: float = 10.0) -> Any:
    """``predicate()`` once it is truthy (bounded): processes write records and traces after
    they answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")

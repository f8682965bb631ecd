"""Every documented failure of the real frontend process, in each provider's error shape.

Raw HTTP (urllib / http.client) so malformed bodies, chunked uploads and plain endpoints are sent
exactly as written; the router stand-in is told to hang, drop, or refuse through message markers.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiohttp import web

from kvretention.dataplane.frontend.errors import Provider
from support.router_standin import RouterStandIn, parse_sse
from support.threaded_app import ThreadedApp

MAX_BODY = 4096
BODY_TIMEOUT_S = 1.0
PATHS = {Provider.OPENAI: "/v1/chat/completions", Provider.ANTHROPIC: "/v1/messages"}


@pytest.fixture(scope="module")
def frontend(router_standin: RouterStandIn, kvretention_process: Any) -> Any:
    args = ["frontend", "--router-url", router_standin.base_url, "--model", "m", "--model", "m2"]
    return kvretention_process(
        [
            *args,
            *["--upstream-timeout", "1", "--max-body-bytes", str(MAX_BODY)],
            *["--body-timeout", str(BODY_TIMEOUT_S), "--remembered-conversations", "7"],
        ]
    )


@pytest.fixture(scope="module")
def orphan(kvretention_process: Any) -> Any:
    """A frontend whose router does not exist."""
    from support.processes import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    return kvretention_process(["frontend", "--router-url", dead, "--upstream-timeout", "1"])


def request(
    url: str,
    *,
    body: bytes | None = None,
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(
        url,
        data=body,
        method=method,
        headers={"content-type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            return resp.status, _lower(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, _lower(err.headers.items()), err.read()


def _lower(items: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in items}


def body_for(provider: Provider, text: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": text}]}
    if provider is Provider.ANTHROPIC:
        base["max_tokens"] = 8
    return {**base, **extra}


def assert_error(provider: Provider, raw: bytes, *, status: int, code: str) -> dict[str, Any]:
    """The provider's own error body; OpenAI carries ``code``, Anthropic names it in the message."""
    text = raw.decode()
    assert "Traceback" not in text
    body: dict[str, Any] = json.loads(text)
    if provider is Provider.OPENAI:
        assert set(body) == {"error"}
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == code
        assert body["error"]["type"] == (
            "invalid_request_error" if status < 500 else "server_error"
        )
        return dict(body["error"])
    assert body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    if status >= 500:
        assert body["error"]["message"].startswith(code)
    return dict(body["error"])


BOTH = pytest.mark.parametrize("provider", list(Provider), ids=[p.value for p in Provider])


@BOTH
@pytest.mark.parametrize(
    ("raw", "code"),
    [
        pytest.param(b"{not json", "invalid_json", id="broken"),
        pytest.param(b"", "invalid_json", id="empty"),
        pytest.param(b"\xff\xfe", "invalid_json", id="not_utf8"),
        pytest.param(b"[1, 2]", "invalid_type", id="array"),
        pytest.param(b'"text"', "invalid_type", id="string"),
    ],
)
def test_malformed_bodies_are_400(frontend: Any, provider: Provider, raw: bytes, code: str) -> None:
    status, headers, body = request(frontend.base_url + PATHS[provider], body=raw)
    assert status == 400
    assert headers["content-type"].startswith("application/json")
    assert_error(provider, body, status=400, code=code)


@BOTH
@pytest.mark.parametrize(
    ("encoding", "raw"),
    [
        pytest.param("gzip", b'{"model": "m"}', id="gzip_not_gzip"),
        pytest.param("deflate", b"\x00\x01not deflate", id="deflate_not_deflate"),
        pytest.param("br", b"\x00\x01not brotli", id="br"),
    ],
)
def test_a_body_not_in_its_content_encoding_is_400(
    frontend: Any, provider: Provider, encoding: str, raw: bytes
) -> None:
    status, headers, body = request(
        frontend.base_url + PATHS[provider], body=raw, headers={"content-encoding": encoding}
    )
    assert status == 400
    assert headers["content-type"].startswith("application/json")
    assert headers["x-should-retry"] == "false"
    assert_error(provider, body, status=400, code="invalid_content_encoding")


DEEP_ARGUMENTS = "[" * 1_000 + "]" * 1_000


def _chat_call(arguments: str) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {
        "model": "m",
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ],
    }


def _responses_call(arguments: str) -> dict[str, Any]:
    return {
        "model": "m",
        "input": [
            {"role": "user", "content": "go"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
        ],
    }


def _tag(body: dict[str, Any]) -> str:
    """Put a fresh word where the router stand-in looks for it (the last message's text)."""
    word = uuid.uuid4().hex
    last = body["messages"][-1] if "messages" in body else body["input"][-1]
    last["output" if "output" in last else "content"] = word
    return word


def _out_of_range(path: str, body: dict[str, Any], field: str, value: int) -> Any:
    """A row: ``body`` with ``field`` set to an integer no engine takes; the 400 names ``field``."""
    endpoint = path.split("/")[2]  # chat, responses or messages
    return pytest.param(path, {**body, field: value}, field, id=f"{endpoint}_{field}")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        pytest.param(
            "/v1/chat/completions",
            _chat_call(DEEP_ARGUMENTS),
            "messages[1].tool_calls[0].function.arguments",
            id="chat_deep_arguments",
        ),
        pytest.param(
            "/v1/chat/completions",
            _chat_call('{"a": ' * 200 + "1" + "}" * 200),
            "messages[1].tool_calls[0].function.arguments",
            id="chat_deep_objects",
        ),
        pytest.param(
            "/v1/responses", _responses_call(DEEP_ARGUMENTS), "input[1].arguments", id="responses"
        ),
        _out_of_range("/v1/chat/completions", _chat_call("{}"), "max_tokens", 2**64 + 1),
        _out_of_range("/v1/chat/completions", _chat_call("{}"), "max_completion_tokens", 2**31),
        _out_of_range("/v1/responses", _responses_call("{}"), "max_output_tokens", 2**64 + 1),
        _out_of_range("/v1/messages", body_for(Provider.ANTHROPIC, "hi"), "max_tokens", 2**64 + 1),
        _out_of_range("/v1/chat/completions", _chat_call("{}"), "seed", 2**64 + 1),
    ],
)
def test_out_of_range_fields_are_400_naming_the_field(
    frontend: Any, router_standin: RouterStandIn, path: str, body: dict[str, Any], param: str
) -> None:
    """Nesting a worker's parser cannot take (it answered 502) and integers no engine takes
    (they reached it unchanged) are the client's 400, never forwarded."""
    word = _tag(body)
    status, headers, raw = request(frontend.base_url + path, body=json.dumps(body).encode())
    provider = Provider.ANTHROPIC if path == "/v1/messages" else Provider.OPENAI
    assert status == 400, raw
    assert headers["x-should-retry"] == "false"
    error = assert_error(provider, raw, status=400, code="invalid_value")
    if provider is Provider.OPENAI:
        assert error["param"] == param
    else:
        assert param in error["message"]
    assert router_standin.bodies_for(word) == []


def test_reasonable_arguments_and_brackets_in_strings_are_forwarded(
    frontend: Any, router_standin: RouterStandIn
) -> None:
    arguments = json.dumps({"code": "[" * 500, "deep": json.loads("[" * 100 + "]" * 100)})
    body = _chat_call(arguments)
    word = _tag(body)
    status, _, raw = request(
        frontend.base_url + "/v1/chat/completions", body=json.dumps(body).encode()
    )
    assert status == 200, raw
    assert len(router_standin.bodies_for(word)) == 1


@BOTH
@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        pytest.param({"model": None}, "invalid_type", "model", id="model_null"),
        pytest.param({"messages": "hi"}, "invalid_type", "messages", id="messages_string"),
        pytest.param({"messages": []}, "invalid_value", "messages", id="messages_empty"),
        pytest.param({"temperature": "hot"}, "invalid_type", "temperature", id="temperature_type"),
        pytest.param({"stream": "yes"}, "invalid_type", "stream", id="stream_type"),
    ],
)
def test_schema_violations_are_400_and_not_forwarded(
    frontend: Any,
    router_standin: RouterStandIn,
    provider: Provider,
    fields: dict[str, Any],
    code: str,
    param: str,
) -> None:
    word = uuid.uuid4().hex
    payload = body_for(provider, word, **fields)
    status, _, raw = request(frontend.base_url + PATHS[provider], body=json.dumps(payload).encode())
    assert status == 400
    error = assert_error(provider, raw, status=400, code=code)
    if provider is Provider.OPENAI:
        assert error["param"] == param
    else:
        assert error["message"].startswith(f"{param}: ")
    assert router_standin.bodies_for(word) == []


@BOTH
def test_missing_max_tokens_is_anthropic_only(frontend: Any, provider: Provider) -> None:
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    status, _, raw = request(frontend.base_url + PATHS[provider], body=json.dumps(payload).encode())
    if provider is Provider.OPENAI:
        assert status == 200
    else:
        assert status == 400
        assert json.loads(raw)["error"]["message"] == "max_tokens: Field required"


@BOTH
@pytest.mark.parametrize("chunked", [False, True], ids=["content_length", "chunked"])
def test_oversize_body_is_413(
    frontend: Any, router_standin: RouterStandIn, provider: Provider, chunked: bool
) -> None:
    word = uuid.uuid4().hex
    payload = json.dumps(body_for(provider, word + "x" * MAX_BODY)).encode()
    if not chunked:
        status, _, raw = request(frontend.base_url + PATHS[provider], body=payload)
    else:
        parts = urlsplit(frontend.base_url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=15)
        pieces = [payload[i : i + 1024] for i in range(0, len(payload), 1024)]
        conn.request(
            "POST",
            PATHS[provider],
            body=iter(pieces),
            headers={"content-type": "application/json"},
            encode_chunked=True,
        )
        resp = conn.getresponse()
        status, raw = resp.status, resp.read()
        conn.close()
    assert status == 413
    error = assert_error(provider, raw, status=413, code="request_too_large")
    if provider is Provider.ANTHROPIC:
        assert error["type"] == "request_too_large"
    assert router_standin.bodies_for(word) == []


@BOTH
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("marker", "status", "code"),
    [
        pytest.param("[[hang]]", 504, "upstream_timeout", id="timeout"),
        pytest.param("[[drop]]", 502, "upstream_disconnected", id="dropped"),
        pytest.param("[[garbage]]", 502, "bad_gateway", id="garbage"),
        pytest.param("[[no_workers]]", 503, "no_workers", id="no_workers"),
        pytest.param("[[kv_unsupported]]", 501, "kv_hints_unsupported", id="kv_unsupported"),
    ],
)
def test_upstream_failures_before_the_stream(
    frontend: Any, provider: Provider, marker: str, status: int, code: str, stream: bool
) -> None:
    hint = (
        {"prompt_cache_options": {}}
        if provider is Provider.OPENAI
        else {"cache_control": {"type": "ephemeral"}}
    )
    payload = body_for(provider, f"{uuid.uuid4().hex} {marker}", stream=stream, **hint)
    got, headers, raw = request(
        frontend.base_url + PATHS[provider], body=json.dumps(payload).encode()
    )
    assert got == status
    assert headers["content-type"].startswith("application/json")
    error = assert_error(provider, raw, status=status, code=code)
    if code == "kv_hints_unsupported":
        assert "kv_hints" in error["message"]


@BOTH
@pytest.mark.parametrize(
    ("marker", "code"),
    [
        pytest.param("[[hang_midstream]]", "upstream_timeout", id="timeout"),
        pytest.param("[[drop_midstream]]", "upstream_disconnected", id="dropped"),
        pytest.param("[[kv_unsupported_midstream]]", "kv_hints_unsupported", id="kv_unsupported"),
    ],
)
def test_upstream_failures_mid_stream_are_sse_errors(
    frontend: Any, provider: Provider, marker: str, code: str
) -> None:
    payload = body_for(provider, f"{uuid.uuid4().hex} {marker}", stream=True)
    status, headers, raw = request(
        frontend.base_url + PATHS[provider], body=json.dumps(payload).encode()
    )
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert b"Traceback" not in raw
    name, data = parse_sse(raw)[-1]
    error = json.loads(data)
    if provider is Provider.OPENAI:
        assert name is None and error["error"]["code"] == code
    else:
        assert name == "error" and error["type"] == "error"
        assert error["error"]["message"].startswith(code)


@pytest.mark.parametrize(
    ("path", "method", "status", "provider"),
    [
        pytest.param("/v1/nope", "GET", 404, Provider.OPENAI, id="unknown_path"),
        pytest.param("/v1/messages", "GET", 405, Provider.ANTHROPIC, id="wrong_method_anthropic"),
        pytest.param("/v1/chat/completions", "GET", 405, Provider.OPENAI, id="wrong_method_openai"),
    ],
)
def test_routing_errors_use_provider_shapes(
    frontend: Any, path: str, method: str, status: int, provider: Provider
) -> None:
    got, _, raw = request(frontend.base_url + path, method=method)
    assert got == status
    code = "not_found" if status == 404 else "method_not_allowed"
    assert_error(provider, raw, status=status, code=code)


def test_router_unavailable_is_503_and_not_ready(orphan: Any) -> None:
    status, _, raw = request(
        orphan.base_url + "/v1/chat/completions",
        body=json.dumps(body_for(Provider.OPENAI, "hi", prompt_cache_options={})).encode(),
    )
    assert status == 503
    assert_error(Provider.OPENAI, raw, status=503, code="router_unavailable")
    status, _, raw = request(
        orphan.base_url + "/v1/messages",
        body=json.dumps(body_for(Provider.ANTHROPIC, "hi")).encode(),
    )
    assert status == 503
    assert json.loads(raw)["error"]["type"] == "overloaded_error"
    assert request(orphan.base_url + "/healthz", method="GET")[0] == 200
    status, _, raw = request(orphan.base_url + "/readyz", method="GET")
    assert status == 503 and json.loads(raw)["status"] == "not_ready"


def test_probes_models_and_metrics(frontend: Any) -> None:
    assert request(frontend.base_url + "/healthz", method="GET")[0] == 200

    _, _, raw = request(frontend.base_url + "/v1/models", method="GET")
    assert [m["id"] for m in json.loads(raw)["data"]] == ["m", "m2"]
    _, _, raw = request(
        frontend.base_url + "/v1/models", method="GET", headers={"anthropic-version": "2023-06-01"}
    )
    listed = json.loads(raw)
    assert listed["data"][0]["type"] == "model" and listed["has_more"] is False

    hinted = body_for(Provider.ANTHROPIC, "hi", cache_control={"type": "ephemeral", "ttl": "1h"})
    request(frontend.base_url + "/v1/messages", body=json.dumps(hinted).encode())
    bad_ttl = body_for(Provider.OPENAI, "hi", prompt_cache_options={"ttl": "12h"})
    request(frontend.base_url + "/v1/chat/completions", body=json.dumps(bad_ttl).encode())

    status, headers, raw = request(frontend.base_url + "/metrics", method="GET")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    text = raw.decode()
    assert 'kvretention_frontend_kv_hints_total{endpoint="messages",ttl_seconds="3600"}' in text
    assert (
        'kvretention_frontend_rejections_total{endpoint="chat.completions",reason="invalid_value"}'
        in text
    )
    assert 'kvretention_frontend_requests_total{endpoint="messages",outcome="ok"}' in text
    assert (
        'kvretention_frontend_upstream_latency_seconds_count{endpoint="messages",phase="total"}'
        in text
    )
    assert "kvretention_frontend_remembered_conversations_capacity 7.0" in text
    parsed = re.search(r'conversation_items_total\{outcome="parsed"\} (\S+)', text)
    assert parsed is not None and float(parsed.group(1)) >= 1  # the hinted message at least
    assert 'kvretention_frontend_conversation_items_total{outcome="resumed"}' in text


# -- retries, readiness, disconnects, stalled bodies, leaks (issue 10) -------------------------


@BOTH
@pytest.mark.parametrize(
    ("send", "status", "retry"),
    [
        pytest.param({"raw": b"{nope"}, 400, "false", id="400_bad_json"),
        pytest.param({"fields": {"model": "nope"}}, 404, "false", id="404_unknown_model"),
        pytest.param({"path": "/v1/nope"}, 404, "false", id="404_unknown_path"),
        pytest.param({"method": "GET"}, 405, "false", id="405_method"),
        pytest.param({"fields": {"pad": "x" * MAX_BODY}}, 413, "false", id="413_too_large"),
        pytest.param({"marker": "[[kv_unsupported]]"}, 501, "false", id="501_kv_hints"),
        pytest.param({"marker": "[[no_workers]]"}, 503, None, id="503_no_workers"),
        pytest.param({"marker": "[[hang]]"}, 504, None, id="504_timeout"),
        pytest.param({"marker": "[[drop]]"}, 502, None, id="502_dropped"),
    ],
)
def test_deterministic_errors_say_do_not_retry(
    frontend: Any, provider: Provider, send: dict[str, Any], status: int, retry: str | None
) -> None:
    """``x-should-retry: false`` stops the SDKs' three retries of an answer that cannot change."""
    text = f"{uuid.uuid4().hex} {send.get('marker', '')}"
    payload = json.dumps(body_for(provider, text, **send.get("fields", {}))).encode()
    got, headers, _ = request(
        frontend.base_url + send.get("path", PATHS[provider]),
        body=None if send.get("method") == "GET" else send.get("raw", payload),
        method=send.get("method", "POST"),
    )
    assert got == status
    assert headers.get("x-should-retry") == retry


class RouterDouble(ThreadedApp):
    """A router for readiness and abort tests: ``/readyz`` answers as told, and ``/v1/generate``
    sends its headers, then waits, recording whether the frontend hung up (the router's handler is
    cancelled, as the real router's is, when its client disconnects)."""

    handler_cancellation = True

    def __init__(self) -> None:
        super().__init__()
        self.ready = True
        self.readyz_delay = 0.0
        """Seconds ``/readyz`` takes to answer (a router on a busy node)."""
        self.started = threading.Event()
        self.cancelled = threading.Event()

    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/readyz", self._readyz)
        app.router.add_post("/v1/generate", self._generate)
        return app

    async def _readyz(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.readyz_delay)
        status = 200 if self.ready else 503
        return web.json_response({"status": "ready" if self.ready else "no_workers"}, status=status)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "application/x-ndjson"})
        await response.prepare(request)
        await response.write(b'{"text": "Hel", "token_ids": [1]}\n')
        self.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return response


@pytest.fixture(scope="module")
def router_double() -> Iterator[RouterDouble]:
    with RouterDouble() as double:
        yield double


@pytest.fixture(scope="module")
def fronted_double(router_double: RouterDouble, kvretention_process: Any) -> Any:
    return kvretention_process(["frontend", "--router-url", router_double.base_url])


def test_readyz_follows_the_routers_workers(
    router_double: RouterDouble, fronted_double: Any
) -> None:
    router_double.ready = True
    status, _, raw = request(fronted_double.base_url + "/readyz", method="GET")
    assert (status, json.loads(raw)) == (200, {"status": "ready"})
    router_double.ready = False
    try:
        status, _, raw = request(fronted_double.base_url + "/readyz", method="GET")
    finally:
        router_double.ready = True
    assert status == 503
    assert json.loads(raw) == {
        "status": "not_ready",
        "reason": "the router reports no ready worker",
    }
    assert router_double.base_url.split("//")[1] not in raw.decode()


SLOW_S = 2.0
"""Longer than the frontend's 1 s readiness poll of the router."""


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([(True, 0.0), (True, SLOW_S)], [200, 200], id="slow_after_ready_stays_ready"),
        pytest.param([(True, 0.0), (False, SLOW_S)], [200, 200], id="slow_no_is_no_verdict"),
        pytest.param([(False, 0.0), (True, SLOW_S)], [503, 503], id="slow_after_not_ready_stays"),
        pytest.param([(True, SLOW_S)], [503], id="slow_before_any_answer_is_not_ready"),
        pytest.param([(True, 0.0), (False, 0.0)], [200, 503], id="a_prompt_no_takes_it_out"),
    ],
)
def test_a_slow_router_keeps_the_frontends_last_readiness(
    router_double: RouterDouble,
    kvretention_process: Any,
    steps: list[tuple[bool, float]],
    expected: list[int],
) -> None:
    """A router that answers its readiness poll late (a node busy prefilling) is no verdict: the
    frontend keeps the last one rather than leave its Service and refuse clients' connections."""
    frontend = kvretention_process(["frontend", "--router-url", router_double.base_url])
    seen = []
    try:
        for ready, delay in steps:
            router_double.ready, router_double.readyz_delay = ready, delay
            status, _, _ = request(frontend.base_url + "/readyz", method="GET")
            seen.append(status)
    finally:
        router_double.ready, router_double.readyz_delay = True, 0.0
        frontend.stop()
    assert seen == expected


@BOTH
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_client_that_hangs_up_aborts_the_generation(
    router_double: RouterDouble, fronted_double: Any, provider: Provider, stream: bool
) -> None:
    router_double.started.clear()
    router_double.cancelled.clear()
    parts = urlsplit(fronted_double.base_url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=15)
    payload = json.dumps(body_for(provider, "abort me", stream=stream)).encode()
    conn.request(
        "POST", PATHS[provider], body=payload, headers={"content-type": "application/json"}
    )
    assert router_double.started.wait(10), "the request never reached the router"
    conn.close()
    assert router_double.cancelled.wait(10), "the router's generation was not aborted"


def _read_response(sock: socket.socket) -> bytes:
    """One HTTP response with a content-length (the server may linger before it closes)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        raw += sock.recv(65536)
    head, _, body = raw.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


@BOTH
def test_a_stalled_body_is_timed_out(
    frontend: Any, router_standin: RouterStandIn, provider: Provider
) -> None:
    word = uuid.uuid4().hex
    payload = json.dumps(body_for(provider, word)).encode()
    parts = urlsplit(frontend.base_url)
    started = time.monotonic()
    with socket.create_connection((parts.hostname or "", parts.port or 80), timeout=15) as sock:
        head = (
            f"POST {PATHS[provider]} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n"
        ).encode()
        sock.sendall(head + payload[:10])  # and then nothing more
        raw = _read_response(sock)
    elapsed = time.monotonic() - started
    head_text, _, body = raw.partition(b"\r\n\r\n")
    assert head_text.startswith(b"HTTP/1.1 408 ")
    assert b"connection: close" in head_text.lower()
    assert BODY_TIMEOUT_S <= elapsed < BODY_TIMEOUT_S + 5
    error = assert_error(provider, body, status=408, code="request_body_timeout")
    assert "did not finish arriving" in error["message"]
    assert router_standin.bodies_for(word) == []


@BOTH
@pytest.mark.parametrize(
    ("target", "marker"),
    [
        pytest.param("orphan", "", id="router_unreachable"),
        pytest.param("frontend", "[[drop]]", id="router_dropped"),
    ],
)
def test_errors_never_leak_internal_addresses_or_exceptions(
    request_fixture: pytest.FixtureRequest, provider: Provider, target: str, marker: str
) -> None:
    app = request_fixture.getfixturevalue(target)
    payload = json.dumps(body_for(provider, f"{uuid.uuid4().hex} {marker}")).encode()
    status, _, raw = request(app.base_url + PATHS[provider], body=payload)
    assert status in (502, 503)
    text = raw.decode()
    router_url = next(a for a in app.args if a.startswith("http://"))
    for secret in (router_url, router_url.split("//")[1], "127.0.0.1", "Error", "Errno"):
        assert secret not in text, (secret, text)
    if target == "orphan":
        status, _, raw = request(app.base_url + "/readyz", method="GET")
        assert status == 503
        assert json.loads(raw) == {"status": "not_ready", "reason": "the router is unreachable"}


@pytest.fixture
def request_fixture(request: pytest.FixtureRequest) -> pytest.FixtureRequest:
    return request


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        pytest.param(["--model-alias", "fast"], {}, "is not ALIAS=SERVED", id="no_equals"),
        pytest.param(["--model-alias", "fast=other"], {}, "is not a served model", id="unknown"),
        pytest.param(["--model-alias", "m=m2"], {}, "already a served model", id="shadowing"),
        pytest.param([], {"KVR_MODEL_ALIASES": "a=m b=nope"}, "'nope'", id="env_unknown"),
    ],
)
def test_bad_model_aliases_stop_the_frontend_at_startup(
    args: list[str], env: dict[str, str], message: str
) -> None:
    from click.testing import CliRunner

    from kvretention.dataplane.frontend.cli import frontend_cmd

    base = ["--router-url", "http://127.0.0.1:1", "--model", "m", "--model", "m2"]
    result = CliRunner().invoke(frontend_cmd, [*base, *args], env=env)
    assert result.exit_code == 2
    assert message in result.output


def test_model_aliases_from_the_environment() -> None:
    from kvretention.dataplane.frontend.cli import parse_aliases

    assert parse_aliases(("fast=m", "codex-mini = m2"), served=("m", "m2")) == {
        "fast": "m",
        "codex-mini": "m2",
    }
    assert parse_aliases(("any=whatever",), served=()) == {"any": "whatever"}

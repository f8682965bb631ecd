"""Bad input at the frontend's HTTP boundary, in-process against a router stand-in.

Properties, for Hypothesis-built bodies and raw bytes (invalid UTF-8, truncated JSON, huge numbers,
deep nesting, lone surrogates, NaN) sent to all three generate endpoints:

- the status is never 5xx while the router is up (and only the router's own 502/503 when it is not);
- every error body has the provider's shape: OpenAI ``{"error": {...}}``, Anthropic
  ``{"type": "error", "error": {...}}``;
- a request answered 4xx never reached the router.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pydantic
import pytest
from aiohttp.test_utils import TestClient, TestServer
from anthropic.types import Message
from fuzz_strategies import (
    budget,
    chat_parser_bodies,
    json_objects,
    messages_parser_bodies,
    outcome,
    responses_parser_bodies,
)
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from kvretention.dataplane.frontend.app import create_app
from kvretention.dataplane.frontend.config import FrontendConfig
from kvretention.dataplane.frontend.errors import Provider
from kvretention.hints import (
    KvHintEnvelope,
    normalize_chat_completions,
    normalize_messages,
    normalize_responses,
)
from support.router_standin import RouterStandIn, parse_sse

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
PATHS = (CHAT, RESPONSES, MESSAGES)
JSON = {"content-type": "application/json"}
VALID: dict[str, dict[str, Any]] = {
    CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    RESPONSES: {"model": "m", "input": "hi"},
    MESSAGES: {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
}


SDK_MODELS: dict[str, Any] = {CHAT: ChatCompletion, RESPONSES: Response, MESSAGES: Message}
"""The official SDKs' response models: a 200 must be an object the client can parse."""


@dataclass
class Answer:
    status: int
    body: bytes
    forwarded: int
    """How many requests the router stand-in received while this one ran."""


class Frontend:
    """The frontend app on a private event loop, so synchronous Hypothesis tests can drive it."""

    def __init__(
        self,
        router_url: str,
        standin: RouterStandIn | None,
        *,
        hint_providers: frozenset[Provider] = frozenset(Provider),
    ) -> None:
        self.standin = standin
        self.loop = asyncio.new_event_loop()
        config = FrontendConfig(
            router_url=router_url, upstream_timeout=5.0, hint_providers=hint_providers
        )
        self.client: TestClient[Any, Any] = self.loop.run_until_complete(self._start(config))

    async def _start(self, config: FrontendConfig) -> TestClient[Any, Any]:
        app = create_app(config)
        client: TestClient[Any, Any] = TestClient(TestServer(app))
        await client.start_server()
        return client

    def post(self, path: str, data: bytes) -> Answer:
        before = len(self.standin.received) if self.standin else 0
        status, body = self.loop.run_until_complete(self._post(path, data))
        after = len(self.standin.received) if self.standin else 0
        return Answer(status=status, body=body, forwarded=after - before)

    async def _post(self, path: str, data: bytes) -> tuple[int, bytes]:
        async with self.client.post(path, data=data, headers=JSON) as resp:
            return resp.status, await resp.read()

    def post_raw_header(self, path: str, data: bytes, *, header: bytes) -> Answer:
        """POST with an ``x-session-id`` of arbitrary bytes (no HTTP client lets one send those)."""
        before = len(self.standin.received) if self.standin else 0
        status, body = self.loop.run_until_complete(self._post_raw(path, data, header))
        after = len(self.standin.received) if self.standin else 0
        return Answer(status=status, body=body, forwarded=after - before)

    async def _post_raw(self, path: str, data: bytes, header: bytes) -> tuple[int, bytes]:
        port = self.client.server.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n"
        ).encode()
        writer.write(head + b"x-session-id: " + header + b"\r\n\r\n" + data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout=10)
        writer.close()
        await writer.wait_closed()
        status_line, _, rest = raw.partition(b"\r\n")
        _, _, body = rest.partition(b"\r\n\r\n")
        return int(status_line.split()[1]), body

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@pytest.fixture(scope="module")
def standin() -> Iterator[RouterStandIn]:
    with RouterStandIn() as router:
        yield router


@pytest.fixture(scope="module")
def frontend(standin: RouterStandIn) -> Iterator[Frontend]:
    app = Frontend(standin.base_url, standin)
    yield app
    app.close()


@pytest.fixture(scope="module")
def frontend_without_hints(standin: RouterStandIn) -> Iterator[Frontend]:
    """Hints turned off for both providers: cache controls are accepted and ignored."""
    app = Frontend(standin.base_url, standin, hint_providers=frozenset())
    yield app
    app.close()


@pytest.fixture(scope="module")
def frontend_without_router() -> Iterator[Frontend]:
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = Frontend(f"http://127.0.0.1:{port}", None)
    yield app
    app.close()


def check_error_shape(path: str, answer: Answer) -> dict[str, Any]:
    """The provider's error body: parsed, with its required keys typed."""
    body = json.loads(answer.body)
    assert isinstance(body, dict), answer.body
    if path == MESSAGES:
        assert body.get("type") == "error", body
        error = body["error"]
        assert isinstance(error, dict) and set(error) == {"type", "message"}, body
        assert isinstance(error["type"], str) and isinstance(error["message"], str)
    else:
        assert set(body) == {"error"}, body
        error = body["error"]
        assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}, body
        assert isinstance(error["message"], str) and isinstance(error["code"], str)
    return error


def check_sdk_shape(path: str, body: dict[str, Any]) -> None:
    """What the client echoed back must fit the SDK's response model.

    Usage is left out: newer SDKs add required usage details (``cache_write_tokens``) that no
    request can influence, so they are not what this bad-input test is about.
    """
    try:
        SDK_MODELS[path].model_validate(body)
    except pydantic.ValidationError as exc:
        errors = [e for e in exc.errors() if e["loc"][:1] != ("usage",)]
        assert not errors, errors


def check_answer(path: str, answer: Answer, *, router_up: bool = True) -> None:
    outcome(f"status {answer.status}")
    if router_up:
        assert answer.status < 500, answer.body[:500]
    else:
        assert answer.status < 500 or answer.status in (502, 503), answer.body[:500]
    if answer.status >= 400:
        check_error_shape(path, answer)
        if answer.status < 500:
            assert answer.forwarded == 0, "a refused request must not reach the router"
    else:
        assert answer.status == 200
        assert answer.forwarded == 1
        if answer.body.startswith((b"data:", b"event:")):  # a stream: well framed, JSON frames
            frames = parse_sse(answer.body)
            assert frames
            for _, data in frames:
                if data != "[DONE]":
                    assert "error" not in json.loads(data), data
        else:
            check_sdk_shape(path, json.loads(answer.body))


# -- byte strategies -------------------------------------------------------------------------------

paths = st.sampled_from(PATHS)


def _valid_bytes(path: str) -> bytes:
    return json.dumps(VALID[path]).encode()


@st.composite
def raw_bodies(draw: st.DrawFn, path: str) -> bytes:
    """Malformed or hostile bytes around a valid body of the endpoint."""
    valid = _valid_bytes(path)
    kind = draw(st.sampled_from(["binary", "truncated", "bad_utf8", "big_int", "deep", "escape"]))
    if kind == "binary":
        return draw(st.binary(max_size=64))
    if kind == "truncated":
        return valid[: draw(st.integers(min_value=0, max_value=len(valid) - 1))]
    if kind == "bad_utf8":
        at = valid.index(b'"hi"') + 2
        junk = draw(
            st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x00"])
        )
        return valid[:at] + junk + valid[at:]
    if kind == "big_int":
        digits = draw(st.integers(min_value=1, max_value=6000))
        field = b'"max_tokens"' if path == MESSAGES else b'"temperature"'
        body = dict(VALID[path])
        body.pop("max_tokens", None)
        head = json.dumps(body).encode()[:-1]
        return head + b", " + field + b": " + b"9" * digits + b"}"
    if kind == "deep":
        depth = draw(st.integers(min_value=1, max_value=200_000))
        key = draw(st.sampled_from([b"messages", b"metadata", b"user", b"model"]))
        if draw(st.booleans()):  # lists, or objects in a valid body
            return b'{"' + key + b'": ' + b"[" * depth + b"]" * depth + b"}"
        nested = b'{"a": ' * depth + b"1" + b"}" * depth
        return valid[:-1] + b', "' + key + b'": ' + nested + b"}"
    escape = draw(st.sampled_from(["\\ud800", "\\udfff", "\\ud83d", "\\ud83d\\ude00", "\\u0000"]))
    constant = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-0"]))
    body = _valid_bytes(path).decode().replace('"hi"', f'"hi{escape}"')
    return body.replace("{", '{"temperature": ' + constant + ", ", 1).encode()


# -- properties ------------------------------------------------------------------------------------


NORMALIZERS: dict[str, Callable[[dict[str, Any]], KvHintEnvelope | None]] = {
    CHAT: normalize_chat_completions,
    RESPONSES: normalize_responses,
    MESSAGES: normalize_messages,
}


def check_round_trip(frontend: Frontend, path: str, body: dict[str, Any]) -> None:
    """Any body: the checks above; a forwarded one carries exactly the normalizer's envelope."""
    answer = frontend.post(path, json.dumps(body).encode())
    check_answer(path, answer)
    if answer.forwarded:
        assert frontend.standin is not None
        envelope = NORMALIZERS[path](body)
        sent = frontend.standin.received[-1].body.get("kv_hints")
        assert sent == (envelope.to_wire() if envelope is not None else None)


@budget(60)
@given(body=chat_parser_bodies)
def test_chat_bodies(frontend: Frontend, body: dict[str, Any]) -> None:
    check_round_trip(frontend, CHAT, body)


@budget(60)
@given(body=responses_parser_bodies)
def test_responses_bodies(frontend: Frontend, body: dict[str, Any]) -> None:
    check_round_trip(frontend, RESPONSES, body)


@budget(60)
@given(body=messages_parser_bodies)
def test_messages_bodies(frontend: Frontend, body: dict[str, Any]) -> None:
    check_round_trip(frontend, MESSAGES, body)


ENDPOINT_BODIES = {
    CHAT: chat_parser_bodies,
    RESPONSES: responses_parser_bodies,
    MESSAGES: messages_parser_bodies,
}


@budget(60)
@given(request=paths.flatmap(lambda p: st.tuples(st.just(p), ENDPOINT_BODIES[p])))
def test_bodies_with_hints_off(
    frontend_without_hints: Frontend, request: tuple[str, dict[str, Any]]
) -> None:
    path, body = request
    answer = frontend_without_hints.post(path, json.dumps(body).encode())
    check_answer(path, answer)
    if answer.forwarded:
        assert frontend_without_hints.standin is not None
        assert "kv_hints" not in frontend_without_hints.standin.received[-1].body


@budget(40)
@given(path=paths, body=json_objects | st.lists(st.integers()) | st.text(max_size=8))
def test_arbitrary_json(frontend: Frontend, path: str, body: Any) -> None:
    check_answer(path, frontend.post(path, json.dumps(body).encode()))


@budget(100)
@given(request=paths.flatmap(lambda path: st.tuples(st.just(path), raw_bodies(path))))
def test_raw_bytes(frontend: Frontend, request: tuple[str, bytes]) -> None:
    path, data = request
    check_answer(path, frontend.post(path, data))


@budget(20)
@given(path=paths, body=json_objects)
def test_router_unavailable_is_the_only_5xx(
    frontend_without_router: Frontend, path: str, body: dict[str, Any]
) -> None:
    check_answer(
        path, frontend_without_router.post(path, json.dumps(body).encode()), router_up=False
    )


_CONTROL = bytes([*range(0x20), 0x7F])
header_bytes = st.binary(min_size=1, max_size=24).map(
    lambda b: b.translate(None, _CONTROL).strip() or b"s"
)
"""Any bytes but controls, which RFC 9110 forbids in a field value: aiohttp's HTTP parser refuses
those with its own plain-text 400 before the app (and its error layer) ever sees the request."""


@budget(60)
@given(path=paths, header=header_bytes)
def test_session_header_bytes(frontend: Frontend, path: str, header: bytes) -> None:
    answer = frontend.post_raw_header(path, _valid_bytes(path), header=header)
    if answer.status == 400:
        assert check_error_shape(path, answer)
        assert answer.forwarded == 0
    else:
        assert (answer.status, answer.forwarded) == (200, 1), answer.body


@pytest.mark.parametrize("path", PATHS)
def test_router_unavailable_answers_503_in_the_provider_shape(
    frontend_without_router: Frontend, path: str
) -> None:
    answer = frontend_without_router.post(path, _valid_bytes(path))
    assert answer.status == 503
    error = check_error_shape(path, answer)
    assert "router" in error["message"]


@pytest.mark.parametrize("path", PATHS)
def test_valid_body_reaches_the_router(frontend: Frontend, path: str) -> None:
    """The harness itself: a good request is forwarded once and answered 200."""
    answer = frontend.post(path, _valid_bytes(path))
    assert (answer.status, answer.forwarded) == (200, 1), answer.body


# -- regressions: shrunk examples the properties above found ---------------------------------------

SURROGATE_BYTES = b'{"model": "m", "messages": [{"role": "user", "content": "h\xed\xa0\x80i"}]}'
"""Shrunk by test_raw_bytes: UTF-8-encoded surrogate; json.loads(bytes) let it through (500)."""


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(SURROGATE_BYTES, id="utf8_encoded_surrogate_was_500"),
        pytest.param(b'{"model": "m", "x": "\\ud800"}', id="lone_surrogate_escape_was_500"),
        pytest.param(b'{"model": "m", "x": "\\udfff\\ud800"}', id="reversed_pair_was_500"),
        pytest.param(
            b'{"model": "m", "max_tokens": ' + b"9" * 5000 + b"}", id="5000_digits_was_500"
        ),
        pytest.param(b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", id="deep_was_500"),
    ],
)
def test_regression_hostile_bytes_are_400_invalid_json(
    frontend: Frontend, path: str, raw: bytes
) -> None:
    answer = frontend.post(path, raw)
    assert answer.status == 400, answer.body
    assert answer.forwarded == 0
    error = check_error_shape(path, answer)
    if path != MESSAGES:
        assert error["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        pytest.param('"hi \\ud83d\\ude00"', "hi \U0001f600", id="escaped_pair"),
        pytest.param('"hi \U0001f600"', "hi \U0001f600", id="literal_astral"),
        pytest.param('"a\\\\ud800"', "a\\ud800", id="escaped_backslash_not_a_surrogate"),
    ],
)
def test_valid_unicode_still_reaches_the_router(frontend: Frontend, raw: str, text: str) -> None:
    body = '{"model": "m", "messages": [{"role": "user", "content": ' + raw + "}]}"
    assert frontend.standin is not None
    frontend.standin.clear()
    answer = frontend.post(CHAT, body.encode())
    assert answer.status == 200, answer.body
    [received] = frontend.standin.received
    assert received.body["messages"][-1]["content"] == text


def test_utf8_bom_is_still_accepted(frontend: Frontend) -> None:
    answer = frontend.post(CHAT, b"\xef\xbb\xbf" + _valid_bytes(CHAT))
    assert answer.status == 200, answer.body


@pytest.mark.parametrize(
    ("body", "param"),
    [
        pytest.param({"metadata": {"a": 1}}, "metadata.a", id="metadata_int_value_was_echoed"),
        pytest.param({"metadata": {"a": None}}, "metadata.a", id="metadata_null_value_was_echoed"),
        pytest.param({"metadata": [1]}, "metadata", id="metadata_list_was_dropped_silently"),
        pytest.param({"user": 5}, "user", id="user_int_was_echoed"),
    ],
)
def test_regression_responses_echo_fields_are_typed(
    frontend: Frontend, body: dict[str, Any], param: str
) -> None:
    answer = frontend.post(RESPONSES, json.dumps({**VALID[RESPONSES], **body}).encode())
    assert answer.status == 400, answer.body
    assert answer.forwarded == 0
    assert check_error_shape(RESPONSES, answer)["param"] == param


def test_regression_hints_off_echoes_only_a_string_cache_key(
    frontend_without_hints: Frontend,
) -> None:
    body = {**VALID[RESPONSES], "prompt_cache_key": {"a": 1}}
    answer = frontend_without_hints.post(RESPONSES, json.dumps(body).encode())
    assert answer.status == 200, answer.body
    assert json.loads(answer.body)["prompt_cache_key"] is None


@pytest.mark.parametrize("header", [b"\xff\xfe", b"\xed\xa0\x80", b"\xe9"])
@pytest.mark.parametrize("path", PATHS)
def test_regression_non_utf8_session_header_is_400(
    frontend: Frontend, path: str, header: bytes
) -> None:
    """Was a 500: aiohttp keeps the bytes as surrogates, which the router request cannot encode."""
    answer = frontend.post_raw_header(path, _valid_bytes(path), header=header)
    assert answer.status == 400, answer.body
    assert answer.forwarded == 0
    error = check_error_shape(path, answer)
    if path != MESSAGES:
        assert (error["code"], error["param"]) == ("invalid_header", "x-session-id")


def test_utf8_session_header_still_reaches_the_router(frontend: Frontend) -> None:
    assert frontend.standin is not None
    frontend.standin.clear()
    answer = frontend.post_raw_header(CHAT, _valid_bytes(CHAT), header="sess-é".encode())
    assert answer.status == 200, answer.body
    [received] = frontend.standin.received
    assert received.body["session_id"] == "sess-é"

"""The frontend app in-process: the tokenizer path and the catch-all error layer."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Sequence
from typing import Any, Final

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kvretention.dataplane.frontend import app as frontend_app
from kvretention.dataplane.frontend.app import create_app
from kvretention.dataplane.frontend.config import FrontendConfig
from kvretention.dataplane.frontend.errors import Provider
from kvretention.dataplane.frontend.resume import Resumer
from kvretention.dataplane.protocol import ChatMessage, PreprocessedRequest
from support.router_standin import Received, RouterStandIn, parse_sse


class FakeTokenizer:
    def encode_request(self, request: PreprocessedRequest) -> list[int] | None:
        return self.encode_chat(request.messages or [])

    """Stands in for a HF chat template: one token per character of each message, role-tagged."""

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        ids: list[int] = []
        for message in messages:
            ids.append({"system": 1, "user": 2, "assistant": 3, "tool": 4}[message.role])
            ids.extend(ord(c) for c in message.content)
        return ids


async def _client(app: web.Application) -> TestClient[Any, Any]:
    client: TestClient[Any, Any] = TestClient(TestServer(app))
    await client.start_server()
    return client


async def _forwarded(
    app: web.Application,
    router_standin: RouterStandIn,
    path: str,
    body: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
) -> Received:
    """POST ``body`` to the frontend ``app``, which must answer 200; the one request the router
    got (clear the stand-in first)."""
    client = await _client(app)
    try:
        resp = await client.post(path, json=body, headers=headers)
        assert resp.status == 200, await resp.text()
    finally:
        await client.close()
    [received] = router_standin.received
    return received


async def _scripted_router(
    lines: list[dict[str, Any]], *, seen: list[dict[str, Any]] | None = None
) -> TestServer:
    """A started router whose ``/v1/generate`` streams ``lines`` as NDJSON to every request,
    appending each request's body to ``seen``."""

    async def generate(request: web.Request) -> web.StreamResponse:
        if seen is not None:
            seen.append(await request.json())
        response = web.StreamResponse(headers={"content-type": "application/x-ndjson"})
        await response.prepare(request)
        for line in lines:
            await response.write(json.dumps(line).encode() + b"\n")
        await response.write_eof()
        return response

    router = web.Application()
    router.router.add_post("/v1/generate", generate)
    server = TestServer(router)
    await server.start_server()
    return server


@pytest.mark.parametrize(
    ("path", "body", "hint"),
    [
        pytest.param(
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [{"role": "user", "content": "tok-chat"}],
                "prompt_cache_options": {},
            },
            {"retain_full_prompt": {"ttl_seconds": 1800}},
            id="chat",
        ),
        pytest.param(
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "tok-msg"}],
                "cache_control": {"type": "ephemeral", "ttl": "1h"},
            },
            {"retain_full_prompt": {"ttl_seconds": 3600}},
            id="messages",
        ),
        pytest.param(
            "/v1/responses",
            {"model": "m", "input": "tok-resp"},
            None,
            id="responses_unhinted",
        ),
    ],
)
async def test_tokenizer_path_sends_token_ids_with_the_same_envelope(
    router_standin: RouterStandIn, path: str, body: dict[str, Any], hint: dict[str, Any] | None
) -> None:
    router_standin.clear()
    app = create_app(FrontendConfig(router_url=router_standin.base_url), tokenizer=FakeTokenizer())
    received = (await _forwarded(app, router_standin, path, body)).body
    text = body.get("messages", [{"content": body.get("input")}])[-1]["content"]
    # The conversation travels beside the ids: the worker parses tool calls against its tools.
    assert received["messages"][-1] == {"role": "user", "content": text}
    assert received["token_ids"][0] == 2
    assert received["token_ids"][1:] == [ord(c) for c in text]
    assert received.get("kv_hints") == hint
    assert ("kv_hints" in received) == (hint is not None)


async def test_unexpected_exception_is_a_generic_provider_500(
    router_standin: RouterStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(FrontendConfig(router_url=router_standin.base_url))

    async def boom(request: web.Request) -> web.Response:
        raise RuntimeError("secret internal detail")

    app.router.add_post("/v1/messages/boom", boom)
    app.router.add_post("/v1/boom", boom)
    client = await _client(app)
    try:
        with caplog.at_level(logging.ERROR, logger="kvretention.frontend"):
            anthropic_resp = await client.post("/v1/messages/boom", json={})
            openai_resp = await client.post("/v1/boom", json={})
        anthropic_body = await anthropic_resp.json()
        openai_body = await openai_resp.json()
    finally:
        await client.close()
    assert anthropic_resp.status == openai_resp.status == 500
    assert anthropic_body["type"] == "error"
    assert anthropic_body["error"]["type"] == "api_error"
    assert openai_body["error"]["code"] == "internal_error"
    for body in (anthropic_body, openai_body):
        assert "secret" not in str(body) and "Traceback" not in str(body)
    assert "secret internal detail" in caplog.text


_BLOCK_CC = {"type": "ephemeral"}


@pytest.mark.parametrize(
    ("disabled", "path", "body"),
    [
        pytest.param(
            "openai",
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "text",
                                "text": "off-chat",
                                "prompt_cache_breakpoint": {"mode": "explicit"},
                            }
                        ],
                    }
                ],
                "prompt_cache_options": {"mode": "explicit"},
            },
            id="openai-off-explicit-mode-and-breakpoint-ignored",
        ),
        pytest.param(
            "openai",
            "/v1/responses",
            {"model": "m", "input": "off-resp", "prompt_cache_options": {"ttl": "30m"}},
            id="openai-off-responses-no-hint",
        ),
        pytest.param(
            "anthropic",
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 4,
                "system": [{"type": "text", "text": "sys", "cache_control": _BLOCK_CC}],
                "messages": [{"role": "user", "content": "off-msg"}],
                "cache_control": {"type": "ephemeral", "ttl": "1h"},
            },
            id="anthropic-off-block-and-top-level-ignored",
        ),
    ],
)
async def test_a_provider_turned_off_has_its_cache_controls_accepted_and_ignored(
    router_standin: RouterStandIn, disabled: str, path: str, body: dict[str, Any]
) -> None:
    """``--no-<provider>-hints``: no hint and no rejection, as a server without prompt caching."""
    router_standin.clear()
    enabled = frozenset(p for p in Provider if p.value != disabled)
    app = create_app(FrontendConfig(router_url=router_standin.base_url, hint_providers=enabled))
    received = (await _forwarded(app, router_standin, path, body)).body
    assert "kv_hints" not in received


async def test_the_other_provider_still_hints_when_one_is_off(
    router_standin: RouterStandIn,
) -> None:
    router_standin.clear()
    app = create_app(
        FrontendConfig(
            router_url=router_standin.base_url, hint_providers=frozenset({Provider.ANTHROPIC})
        )
    )
    body = {
        "model": "m",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "on-msg"}],
        "cache_control": {"type": "ephemeral"},
    }
    received = (await _forwarded(app, router_standin, "/v1/messages", body)).body
    assert received["kv_hints"] == {"retain_full_prompt": {"ttl_seconds": 300}}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_the_router_connection_is_pooled_across_requests(
    router_standin: RouterStandIn, stream: bool
) -> None:
    """Finished answers are read to the end, so one connection serves request after request."""
    router_standin.clear()
    app = create_app(FrontendConfig(router_url=router_standin.base_url))
    client = await _client(app)
    try:
        for i in range(4):
            resp = await client.post(
                "/v1/chat/completions",
                json={
                    "model": "m",
                    "stream": stream,
                    "messages": [{"role": "user", "content": f"pooled-{i} [[late_eof]]"}],
                },
            )
            assert resp.status == 200, await resp.text()
            await resp.read()
    finally:
        await client.close()
    peers = {r.peer for r in router_standin.received}
    assert len(router_standin.received) == 4
    assert len(peers) == 1, peers


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"input": "hi"}),
        ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    ],
    ids=["chat", "responses", "messages"],
)
async def test_the_worker_is_told_whether_the_client_streams(
    router_standin: RouterStandIn, path: str, body: dict[str, Any], stream: bool
) -> None:
    """A client that reads its answer whole lets the worker send it in a few merged chunks."""
    router_standin.clear()
    app = create_app(FrontendConfig(router_url=router_standin.base_url))
    received = await _forwarded(app, router_standin, path, {"model": "m", "stream": stream, **body})
    assert received.body["stream"] is stream


async def test_tool_conversations_get_token_ids_and_keep_their_tools(
    router_standin: RouterStandIn,
) -> None:
    """The frontend tokenizer renders the whole request as the worker would (encode_request);
    the tools still travel, since the worker parses the answer against them."""
    router_standin.clear()
    app = create_app(FrontendConfig(router_url=router_standin.base_url), tokenizer=FakeTokenizer())
    body = {
        "model": "m",
        "max_tokens": 4,
        "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "tool-msg"}],
    }
    received = (await _forwarded(app, router_standin, "/v1/messages", body)).body
    assert received["token_ids"][1:] == [ord(c) for c in "tool-msg"]
    assert received["tools"] == [
        {"kind": "function", "name": "Read", "parameters": {"type": "object"}}
    ]


async def test_message_start_carries_the_workers_prompt_usage() -> None:
    """A router that reports prompt counts on its first chunk: ``message_start`` shows them."""

    first = {"text": "Hi", "prompt_usage": {"prompt_tokens": 120, "cached_tokens": 100}}
    last = {
        "text": "",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 120, "completion_tokens": 2, "cached_tokens": 100},
    }
    router_server = await _scripted_router([first, last])
    app = create_app(FrontendConfig(router_url=str(router_server.make_url(""))))
    client = await _client(app)
    try:
        resp = await client.post(
            "/v1/messages",
            json={
                "model": "m",
                "max_tokens": 4,
                "stream": True,
                "messages": [{"role": "user", "content": "usage"}],
            },
        )
        raw = await resp.read()
    finally:
        await client.close()
        await router_server.close()
    events = [json.loads(data) for _, data in parse_sse(raw)]
    assert events[0]["type"] == "message_start"
    assert events[0]["message"]["usage"] == {
        "input_tokens": 20,
        "output_tokens": 0,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 0,
    }
    assert events[-2]["usage"]["output_tokens"] == 2


async def test_count_tokens_stops_at_the_first_usage_and_closes_the_stream() -> None:
    """The worker answers a ``count_only`` request with one usage chunk; nothing else is read."""
    seen: list[dict[str, Any]] = []
    line = {"finish_reason": "stop", "usage": {"prompt_tokens": 42, "completion_tokens": 0}}
    router_server = await _scripted_router([line], seen=seen)
    app = create_app(
        FrontendConfig(
            router_url=str(router_server.make_url("")),
            served_models=("served",),
            model_aliases={"alias": "served"},
        )
    )
    client = await _client(app)
    try:
        resp = await client.post(
            "/v1/messages/count_tokens?beta=true",
            json={"model": "alias", "messages": [{"role": "user", "content": "count me"}]},
        )
        body = await resp.json()
    finally:
        await client.close()
        await router_server.close()
    assert (resp.status, body) == (200, {"input_tokens": 42})
    [sent] = seen
    assert sent["count_only"] is True
    assert sent["model"] == "served"
    assert sent["sampling"] == {"max_new_tokens": 0}


# -- placement data for the router, and client normalisation -----------------------------------

CODEX_BODY: dict[str, Any] = {
    "model": "m",
    "instructions": "You are Codex.",
    "input": [{"type": "message", "role": "user", "content": "affinity-codex"}],
    "prompt_cache_key": "conv-1",
}
CLAUDE_BODY: dict[str, Any] = {
    "model": "m",
    "max_tokens": 16,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0.14; cch=ab12;"},
        {"type": "text", "text": "You are Claude Code."},
    ],
    "messages": [{"role": "user", "content": "affinity-claude"}],
    "metadata": {"user_id": "user_abc_account__session_42"},
}


@pytest.mark.parametrize(
    ("path", "body", "headers", "config", "session", "prefix_blocks"),
    [
        pytest.param(
            "/v1/responses", CODEX_BODY, {"session_id": "conv-1"}, {}, "conv-1", 2, id="codex"
        ),
        pytest.param(
            "/v1/messages",
            CLAUDE_BODY,
            {},
            {},
            "user_abc_account__session_42",
            2,
            id="claude-code",
        ),
        pytest.param(
            "/v1/messages",
            CLAUDE_BODY,
            {"x-claude-code-session-id": "cc-7"},
            {},
            "cc-7",
            2,
            id="claude-code-header-first",
        ),
        # prompt_cache_key alone is not affinity
        pytest.param("/v1/responses", CODEX_BODY, {}, {}, None, 2, id="prompt-cache-key-only"),
        pytest.param(
            "/v1/responses",
            CODEX_BODY,
            {"session_id": "conv-1"},
            {"session_keys": (), "prefix_routing": False},
            None,
            0,
            id="affinity-off",
        ),
    ],
)
async def test_router_gets_session_and_prefix_chain_in_headers(
    router_standin: RouterStandIn,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    config: dict[str, Any],
    session: str | None,
    prefix_blocks: int,
) -> None:
    router_standin.clear()
    app = create_app(FrontendConfig(router_url=router_standin.base_url, **config))
    received = await _forwarded(app, router_standin, path, body, headers=headers)
    sent = {k.lower(): v for k, v in received.headers.items()}
    assert sent.get("x-session-id") == session
    assert received.body.get("session_id") == session
    chain = [h for h in sent.get("x-kvr-prefix", "").split(",") if h]
    assert len(chain) == prefix_blocks
    assert all(len(h) == 16 for h in chain)


async def test_billing_header_is_dropped_counted_and_traced(
    router_standin: RouterStandIn, tmp_path: Any
) -> None:
    from kvretention.common.trace import RequestTrace

    router_standin.clear()
    trace_path = tmp_path / "trace.jsonl"
    trace = RequestTrace(str(trace_path), component="frontend")
    for normalize in (True, False):
        app = create_app(
            FrontendConfig(router_url=router_standin.base_url, normalize_clients=normalize),
            trace=trace if normalize else None,
        )
        client = await _client(app)
        try:
            assert (await client.post("/v1/messages", json=CLAUDE_BODY)).status == 200
            metrics = await (await client.get("/metrics")).text()
        finally:
            await client.close()
        system = router_standin.received[-1].body["messages"][0]
        if normalize:
            assert system == {"role": "system", "content": "You are Claude Code."}
            assert (
                'kvretention_frontend_normalized_total{endpoint="messages",kind="billing_header"} 1.0'
                in metrics
            )
        else:
            assert system["content"].startswith("x-anthropic-billing-header:")
            assert "kvretention_frontend_normalized_total{" not in metrics
    [record] = [json.loads(line) for line in trace_path.read_text().splitlines()]
    assert record["normalized"] == ["billing_header"]


@pytest.mark.parametrize("tokenizer", [None, FakeTokenizer()], ids=["messages", "token-ids"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "prompt_cache_options": {},
            },
            id="chat",
        ),
        pytest.param(
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 4,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                            {"type": "text", "text": "b"},
                        ],
                    }
                ],
            },
            id="messages-breakpoint",
        ),
        pytest.param("/v1/responses", {"model": "m", "input": "hi"}, id="responses-unhinted"),
    ],
)
async def test_the_trace_records_the_hint_the_router_gets(
    router_standin: RouterStandIn,
    tmp_path: Any,
    path: str,
    body: dict[str, Any],
    tokenizer: FakeTokenizer | None,
) -> None:
    """The envelope's wire form is made once per request: the trace's ``kv_hints`` is the
    router request's, hinted or not, with or without token ids."""
    from kvretention.common.trace import RequestTrace

    router_standin.clear()
    trace_path = tmp_path / "trace.jsonl"
    trace = RequestTrace(str(trace_path), component="frontend")
    app = create_app(
        FrontendConfig(router_url=router_standin.base_url), trace=trace, tokenizer=tokenizer
    )
    client = await _client(app)
    try:
        assert (await client.post(path, json=body)).status == 200
    finally:
        await client.close()
    [record] = [json.loads(line) for line in trace_path.read_text().splitlines()]
    sent = router_standin.received[-1].body.get("kv_hints")
    assert record.get("kv_hints") == sent
    assert (sent is None) == (path == "/v1/responses")


@pytest.mark.parametrize(
    ("padding", "thread"),
    [
        pytest.param(100, "MainThread", id="small-on-the-loop"),
        pytest.param(200_000, "kvr-parse", id="agent-sized-off-it"),
    ],
)
async def test_large_bodies_are_parsed_off_the_event_loop(
    router_standin: RouterStandIn, monkeypatch: pytest.MonkeyPatch, padding: int, thread: str
) -> None:
    """A 200 KB agent body takes 10-20 ms to parse; while it does, the probes still answer. The
    large body's parse is held until the probe has answered: on the event loop it could not be."""
    real, threads = frontend_app.decode_json_body, []
    parsing, release = threading.Event(), threading.Event()
    large = padding > frontend_app.OFF_LOOP_BYTES
    waited: list[bool] = []

    def held(raw: bytes, **kwargs: Any) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        if large:
            parsing.set()
            waited.append(release.wait(timeout=10))  # False: nothing could answer meanwhile
        return real(raw, **kwargs)

    monkeypatch.setattr(frontend_app, "decode_json_body", held)
    client = await _client(create_app(FrontendConfig(router_url=router_standin.base_url)))
    try:
        body = {
            "model": "m",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "x" * padding}],
        }
        pending = asyncio.create_task(client.post("/v1/messages", json=body))
        if large:
            assert await asyncio.to_thread(parsing.wait, 10)
            health = await asyncio.wait_for(client.get("/healthz"), timeout=5)
            assert health.status == 200 and not pending.done()
            release.set()
        assert (await pending).status == 200
    finally:
        release.set()
        await client.close()
    (ran_on,) = threads
    assert ran_on.startswith(thread)
    assert waited == ([True] if large else [])


ROLES: Final = ("assistant", "user")


async def test_a_new_conversation_that_opens_like_another_is_parsed_off_the_loop(
    router_standin: RouterStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every Codex or Chat agent session opens with the agent's own instructions, so a new one
    looks like a conversation parsed lately. Its decode takes what repeats (here, right on the
    loop); its parse follows what is new: 100 KB of new messages go to the parse thread, the
    conversation's next turn stays on the loop."""
    decoded: list[str] = []
    parsed: list[str] = []
    real_decode, real_parsed = frontend_app.decode_json_body, Resumer.parsed

    def decode(raw: bytes, **kwargs: Any) -> dict[str, Any]:
        decoded.append(threading.current_thread().name)
        return real_decode(raw, **kwargs)

    def note(self: Resumer, raw: bytes) -> None:  # the parse's last step, in its thread
        parsed.append(threading.current_thread().name)
        real_parsed(self, raw)

    monkeypatch.setattr(frontend_app, "decode_json_body", decode)
    monkeypatch.setattr(Resumer, "parsed", note)
    client = await _client(create_app(FrontendConfig(router_url=router_standin.base_url)))
    instructions = {"role": "user", "content": "the agent's instructions " * 4_000}
    sessions = [
        [
            instructions,
            *({"role": role, "content": f"{name} {i}"} for i in range(3) for role in ROLES),
            {"role": "user", "content": f"{name} " * 40_000},
        ]
        for name in ("first", "second")
    ]
    try:
        for turn in range(2):
            for history in sessions:
                body = {"model": "m", "max_tokens": 4, "messages": history}
                assert (await client.post("/v1/messages", json=body)).status == 200
                history += [
                    {"role": "assistant", "content": f"answer {turn}"},
                    {"role": "user", "content": f"turn {turn}"},
                ]
    finally:
        await client.close()
    on_loop = "MainThread"
    # first: new, all in the thread; second: decoded on the loop, its 200 KB parse in the
    # thread; then each one's next turn entirely on the loop
    assert [t == on_loop for t in decoded] == [False, True, True, True]
    assert [t == on_loop for t in parsed] == [False, False, True, True]


async def test_a_conversations_next_large_body_is_parsed_on_the_loop(
    router_standin: RouterStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first 200 KB body of a conversation is parsed off the loop; its next one, which
    resumes that parse (about a millisecond), right on the loop, without the hand-off."""
    real, threads = frontend_app.decode_json_body, []

    def recorded(raw: bytes, **kwargs: Any) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        return real(raw, **kwargs)

    monkeypatch.setattr(frontend_app, "decode_json_body", recorded)
    app = create_app(FrontendConfig(router_url=router_standin.base_url))
    client = await _client(app)
    history = [
        {"role": "user", "content": "x" * 100_000},
        {"role": "assistant", "content": "y" * 100_000},
    ]
    try:
        for turn in range(2):
            messages = [*history, {"role": "user", "content": f"turn {turn}"}]
            body = {"model": "m", "max_tokens": 4, "messages": messages}
            assert (await client.post("/v1/messages", json=body)).status == 200
            history = [*messages, {"role": "assistant", "content": f"answer {turn}"}]
    finally:
        await client.close()
    assert threads[0].startswith("kvr-parse") and threads[1] == "MainThread"
    assert app[frontend_app.STATE].resumer.resumed_items == 3  # turn 0 whole
    assert app[frontend_app.STATE].resumer.reused_items == 3  # and not decoded again

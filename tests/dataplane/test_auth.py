"""Auth in the frontend app, in-process against the router stand-in: keys from a directory laid
out as a mounted Secret, each provider's 401, rotation without a restart, per-tenant limits."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kvretention.common.tenancy import HEADER_TENANT
from kvretention.common.trace import RequestTrace
from kvretention.dataplane.frontend.app import create_app
from kvretention.dataplane.frontend.auth import Gate, KeyStore
from kvretention.dataplane.frontend.config import FrontendConfig
from kvretention.dataplane.frontend.limits import LimitPolicy, Limits
from kvretention.dataplane.http import serve_until_signal
from support.processes import free_port
from support.router_standin import RouterStandIn
from support.secret_mount import write_secret

KEY_A = "sk-tenant-a-0123456789abcdef"
KEY_A2 = "sk-tenant-a-rotated-fedcba9876"
KEY_B = "sk-tenant-b-0123456789abcdef"

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"


def chat(word: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": f"hello {word}"}]}


def responses(word: str) -> dict[str, Any]:
    return {"model": "m", "input": f"hello {word}"}


def messages(word: str) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": f"hello {word}"}],
    }


BODIES = {CHAT: chat, RESPONSES: responses, MESSAGES: messages}


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    root = tmp_path / "team-keys"
    write_secret(root, {"team-a": f"# team a\n{KEY_A}\n", "team-b": f"{KEY_B}\n"})
    return root


async def _client(app: web.Application) -> TestClient[Any, Any]:
    client: TestClient[Any, Any] = TestClient(TestServer(app))
    await client.start_server()
    return client


def _app(router: RouterStandIn, gate: Gate | None) -> web.Application:
    return create_app(FrontendConfig(router_url=router.base_url), gate=gate)


def _gate(keys_dir: Path, limits: LimitPolicy | None = None, **kw: Any) -> Gate:
    return Gate(keys=KeyStore([keys_dir], reload_s=0.05), limits=limits or LimitPolicy(), **kw)


OPENAI_401 = {"type": "invalid_request_error", "param": None}


@pytest.mark.parametrize(
    ("path", "headers", "code"),
    [
        pytest.param(CHAT, {}, "missing_api_key", id="chat-missing"),
        pytest.param(
            CHAT,
            {"authorization": "Bearer sk-wrong-000000000000"},
            "invalid_api_key",
            id="chat-wrong",
        ),
        pytest.param(
            CHAT, {"authorization": f"Basic {KEY_A}"}, "missing_api_key", id="chat-not-bearer"
        ),
        pytest.param(RESPONSES, {}, "missing_api_key", id="responses-missing"),
        pytest.param(
            RESPONSES, {"authorization": "Bearer x"}, "invalid_api_key", id="responses-wrong"
        ),
        pytest.param(MESSAGES, {}, "missing_api_key", id="messages-missing"),
        pytest.param(
            MESSAGES, {"x-api-key": "sk-wrong-000000000000"}, "invalid_api_key", id="messages-wrong"
        ),
        pytest.param("/v1/messages/count_tokens", {}, "missing_api_key", id="count-missing"),
        pytest.param("/v1/models", {}, "missing_api_key", id="models-missing"),
        pytest.param("/v1/nowhere", {}, "missing_api_key", id="unknown-route-missing"),
    ],
)
async def test_a_request_without_a_valid_key_gets_its_providers_401_and_is_never_forwarded(
    router_standin: RouterStandIn,
    keys_dir: Path,
    path: str,
    headers: dict[str, str],
    code: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    router_standin.clear()
    caplog.set_level(logging.DEBUG)
    client = await _client(_app(router_standin, _gate(keys_dir)))
    try:
        body = BODIES.get(path, messages)("refused")
        if path == "/v1/models":
            resp = await client.get(path, headers=headers)
        else:
            resp = await client.post(path, json=body, headers=headers)
        assert resp.status == 401
        assert resp.headers["x-should-retry"] == "false"
        payload = await resp.json()
    finally:
        await client.close()
    if path.startswith("/v1/messages"):
        assert payload["type"] == "error"
        assert payload["error"]["type"] == "authentication_error"
        assert set(payload["error"]) == {"type", "message"}
    else:
        assert payload["error"] | OPENAI_401 == payload["error"]
        assert payload["error"]["code"] == code
    assert router_standin.received == []
    for secret in (KEY_A, KEY_B, "sk-wrong-000000000000"):
        assert secret not in caplog.text
        assert secret not in str(payload)


@pytest.mark.parametrize(
    ("path", "headers", "tenant"),
    [
        pytest.param(CHAT, {"authorization": f"Bearer {KEY_A}"}, "team-a", id="openai-bearer"),
        pytest.param(RESPONSES, {"authorization": f"bearer {KEY_B}"}, "team-b", id="codex-bearer"),
        pytest.param(MESSAGES, {"x-api-key": KEY_A}, "team-a", id="anthropic-x-api-key"),
        pytest.param(
            MESSAGES, {"authorization": f"Bearer {KEY_B}"}, "team-b", id="anthropic-auth-token"
        ),
        pytest.param(
            MESSAGES,
            {"x-api-key": KEY_A, "authorization": "Bearer sk-other-000000000000"},
            "team-a",
            id="anthropic-own-header-first",
        ),
    ],
)
async def test_a_valid_key_names_its_tenant_to_the_router(
    router_standin: RouterStandIn,
    keys_dir: Path,
    path: str,
    headers: dict[str, str],
    tenant: str,
) -> None:
    router_standin.clear()
    client = await _client(_app(router_standin, _gate(keys_dir)))
    try:
        resp = await client.post(
            path, json=BODIES[path]("ok"), headers={**headers, HEADER_TENANT: "team-evil"}
        )
        assert resp.status == 200, await resp.text()
        metrics = await (await client.get("/metrics", headers={"x-api-key": KEY_A})).text()
    finally:
        await client.close()
    [received] = router_standin.received
    assert received.headers[HEADER_TENANT] == tenant
    assert (
        f'kvretention_frontend_tenant_requests_total{{status="200",tenant="{tenant}"}} 1.0'
        in metrics
    )
    for secret in (KEY_A, KEY_B):
        assert secret not in str(received.headers) and secret not in str(received.body)


async def test_without_auth_nothing_is_checked_and_no_tenant_travels(
    router_standin: RouterStandIn,
) -> None:
    router_standin.clear()
    client = await _client(_app(router_standin, None))
    try:
        resp = await client.post(CHAT, json=chat("open"), headers={HEADER_TENANT: "team-a"})
        assert resp.status == 200
    finally:
        await client.close()
    [received] = router_standin.received
    assert HEADER_TENANT not in {k.lower() for k in received.headers}


async def test_probes_need_no_key_and_metrics_do(
    router_standin: RouterStandIn, keys_dir: Path
) -> None:
    """``/metrics`` names every tenant and its traffic: a client without a key must not read it."""
    client = await _client(_app(router_standin, _gate(keys_dir)))
    try:
        await client.post(CHAT, json=chat("counted"), headers={"x-api-key": KEY_A})
        for path in ("/healthz", "/readyz"):
            assert (await client.get(path)).status == 200, path
        refused = await client.get("/metrics")
        refused_text = await refused.text()
        keyed = await client.get("/metrics", headers={"authorization": f"Bearer {KEY_A}"})
        keyed_text = await keyed.text()
    finally:
        await client.close()
    assert refused.status == 401
    assert "team-a" not in refused_text
    assert keyed.status == 200
    assert 'tenant="team-a"' in keyed_text


async def test_the_metrics_port_needs_no_key_and_serves_no_api(
    router_standin: RouterStandIn, keys_dir: Path
) -> None:
    """With auth on, scrapers read ``--metrics-port`` without a key (the port a NetworkPolicy's
    ``metricsFrom`` opens, and nothing else); ``/metrics`` on the client port still needs one."""
    port, metrics_port = free_port(), free_port()
    listening = asyncio.Event()
    server = asyncio.create_task(
        serve_until_signal(
            _app(router_standin, _gate(keys_dir)),
            host="127.0.0.1",
            port=port,
            metrics_port=metrics_port,
            shutdown_timeout=1.0,
            on_listening=listening.set,
        )
    )
    try:
        await asyncio.wait_for(listening.wait(), timeout=5)
        client, scraper = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}"
        async with aiohttp.ClientSession() as http:
            keyed = {"x-api-key": KEY_A}
            async with http.post(client + CHAT, json=chat("counted"), headers=keyed) as resp:
                assert resp.status == 200, await resp.text()
            async with http.get(scraper + "/metrics") as scraped:
                scraped_text = await scraped.text()
            async with http.get(client + "/metrics") as refused:
                refused_text = await refused.text()
            async with http.post(scraper + CHAT, json=chat("x"), headers=keyed) as api:
                api_status = api.status
    finally:
        if listening.is_set():  # the stop-signal handler is in place from then on
            signal.raise_signal(signal.SIGTERM)
        else:
            server.cancel()
        await asyncio.wait_for(server, timeout=5)
    assert scraped.status == 200
    assert 'tenant="team-a"' in scraped_text
    assert refused.status == 401
    assert "team-a" not in refused_text
    assert api_status == 404


async def _wait_until(check: Any) -> None:
    async with asyncio.timeout(5.0):
        while not await check():  # noqa: ASYNC110 - the reload is another task's timer
            await asyncio.sleep(0.05)


async def test_a_rotated_key_takes_effect_without_a_restart(
    router_standin: RouterStandIn, keys_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    client = await _client(_app(router_standin, _gate(keys_dir)))

    async def status(key: str) -> int:
        resp = await client.post(CHAT, json=chat("rot"), headers={"authorization": f"Bearer {key}"})
        return resp.status

    try:
        assert await status(KEY_A) == 200
        assert await status(KEY_A2) == 401
        # the overlap: both keys of team-a in force
        write_secret(keys_dir, {"team-a": f"{KEY_A}\n{KEY_A2}\n", "team-b": KEY_B})
        await _wait_until(lambda: _is(status(KEY_A2), 200))
        assert await status(KEY_A) == 200
        # the old key retired
        write_secret(keys_dir, {"team-a": KEY_A2, "team-b": KEY_B})
        await _wait_until(lambda: _is(status(KEY_A), 401))
        assert await status(KEY_A2) == 200
        assert await status(KEY_B) == 200
        # team-b's file gone while a line of team-a's is malformed: the removal applies
        write_secret(keys_dir, {"team-a": f"{KEY_A2}\nnot a key\n"})
        await _wait_until(lambda: _is(status(KEY_B), 401))
        assert await status(KEY_A2) == 200
        assert "team-a line 2" in caplog.text
        # a garbled set (no usable key) keeps the keys in force
        write_secret(keys_dir, {"team-a": "garbled whole\n"})
        await _wait_until(lambda: _logged(caplog, "auth keys not reloaded"))
        assert await status(KEY_A2) == 200
    finally:
        await client.close()
    for secret in (KEY_A, KEY_A2, KEY_B):
        assert secret not in caplog.text


async def _is(coro: Any, value: int) -> bool:
    return bool(await coro == value)


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return text in caplog.text


class FrozenClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("path", "error_type"),
    [(CHAT, "requests"), (MESSAGES, "rate_limit_error")],
)
async def test_one_tenants_burst_is_limited_and_the_others_error_rate_stays_zero(
    router_standin: RouterStandIn, keys_dir: Path, path: str, error_type: str
) -> None:
    """Both tenants: 1 request/s, a burst of 3. With the clock still, team-a's burst of 10 gets
    3 through and 7 429s; team-b's 3 all pass (its own bucket). One shared bucket would fail it."""
    clock = FrozenClock()
    limits = LimitPolicy(default=Limits(requests_per_second=1, burst=3))
    client = await _client(_app(router_standin, _gate(keys_dir, limits, clock=clock)))
    headers = {
        "team-a": {"authorization": f"Bearer {KEY_A}", "x-api-key": KEY_A},
        "team-b": {"authorization": f"Bearer {KEY_B}", "x-api-key": KEY_B},
    }
    try:
        burst = await asyncio.gather(
            *(
                client.post(path, json=BODIES[path](f"a{i}"), headers=headers["team-a"])
                for i in range(10)
            )
        )
        statuses_a = sorted(r.status for r in burst)
        limited = next(r for r in burst if r.status == 429)
        limited_body = await limited.json()
        others = [
            await client.post(path, json=BODIES[path](f"b{i}"), headers=headers["team-b"])
            for i in range(3)
        ]
        statuses_b = [r.status for r in others]
        clock.now += 1.0
        after = await client.post(path, json=BODIES[path]("a-later"), headers=headers["team-a"])
    finally:
        await client.close()
    assert statuses_a == [200] * 3 + [429] * 7
    assert statuses_b == [200, 200, 200]
    assert after.status == 200
    assert limited.headers["retry-after"] == "1"
    assert "x-should-retry" not in limited.headers
    if path == MESSAGES:
        assert limited_body["error"]["type"] == error_type
    else:
        assert limited_body["error"]["type"] == error_type
        assert limited_body["error"]["code"] == "rate_limit_exceeded"


async def test_concurrent_requests_are_limited_per_tenant(
    router_standin: RouterStandIn, keys_dir: Path
) -> None:
    """team-a may have 2 in flight: two hanging requests hold its slots, its third gets a 429,
    team-b is served meanwhile, and team-a is served again once its slots are free."""
    limits = LimitPolicy(default=Limits(concurrency=2), tenants={"team-b": Limits(concurrency=1)})
    gate = _gate(keys_dir, limits)
    client = await _client(_app(router_standin, gate))
    a = {"authorization": f"Bearer {KEY_A}"}
    b = {"authorization": f"Bearer {KEY_B}"}
    try:
        hangs = [
            asyncio.create_task(client.post(CHAT, json=chat("[[hang]]"), headers=a))
            for _ in range(2)
        ]
        deadline = asyncio.get_running_loop().time() + 5
        while gate.limiter.in_flight("team-a") < 2:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)
        third = await client.post(CHAT, json=chat("third"), headers=a)
        other = await client.post(CHAT, json=chat("other"), headers=b)
        third_body = await third.json()
        for task in hangs:
            task.cancel()
        await asyncio.gather(*hangs, return_exceptions=True)
        while gate.limiter.in_flight("team-a") > 0:
            assert asyncio.get_running_loop().time() < deadline + 10
            await asyncio.sleep(0.02)
        again = await client.post(CHAT, json=chat("again"), headers=a)
    finally:
        await client.close()
    assert third.status == 429
    assert "concurrent requests" in third_body["error"]["message"]
    assert third.headers["retry-after"] == "1"
    assert other.status == 200
    assert again.status == 200


async def test_the_trace_names_tenants_never_keys(
    router_standin: RouterStandIn, keys_dir: Path, tmp_path: Path
) -> None:
    """Served, refused (401) and limited (429) requests each leave one trace record: the tenant
    where it is known, the status and the code; no record holds a key."""
    trace = RequestTrace(tmp_path / "trace.jsonl", component="frontend")
    limits = LimitPolicy(tenants={"team-b": Limits(requests_per_second=1, burst=1)})
    gate = _gate(keys_dir, limits, clock=FrozenClock())
    app = create_app(FrontendConfig(router_url=router_standin.base_url), gate=gate, trace=trace)
    client = await _client(app)
    try:
        for headers, want in [
            ({"authorization": f"Bearer {KEY_A}"}, 200),
            ({"authorization": "Bearer sk-wrong-000000000000"}, 401),
            ({"authorization": f"Bearer {KEY_B}"}, 200),
            ({"authorization": f"Bearer {KEY_B}"}, 429),
        ]:
            resp = await client.post(CHAT, json=chat("traced"), headers=headers)
            assert resp.status == want
    finally:
        await client.close()
    text = (tmp_path / "trace.jsonl").read_text()
    records = [json.loads(line) for line in text.splitlines()]
    got = [(r.get("tenant"), r["status"], r.get("error_code")) for r in records]
    assert got == [
        ("team-a", 200, None),
        (None, 401, "invalid_api_key"),
        ("team-b", 200, None),
        ("team-b", 429, "rate_limit_exceeded"),
    ]
    for secret in (KEY_A, KEY_B, "sk-wrong-000000000000"):
        assert secret not in text


async def test_a_client_that_hangs_up_is_counted_499_for_its_tenant(
    router_standin: RouterStandIn, keys_dir: Path, tmp_path: Path
) -> None:
    """The per-tenant counter and the trace agree: a request its client abandoned is a 499."""
    import aiohttp

    from kvretention.dataplane.http import start_site

    trace = RequestTrace(tmp_path / "trace.jsonl", component="frontend")
    gate = _gate(keys_dir)
    app = create_app(FrontendConfig(router_url=router_standin.base_url), gate=gate, trace=trace)
    runner = await start_site(
        app, host="127.0.0.1", port=0, shutdown_timeout=0.5, handler_cancellation=True
    )
    url = f"http://127.0.0.1:{runner.addresses[0][1]}{CHAT}"
    try:
        async with aiohttp.ClientSession() as session:
            call = asyncio.create_task(
                session.post(url, json=chat("[[hang]]"), headers={"x-api-key": KEY_A})
            )
            async with asyncio.timeout(5):
                while gate.limiter.in_flight("team-a") < 1:  # noqa: ASYNC110 - another task's
                    await asyncio.sleep(0.02)
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
        async with asyncio.timeout(5):
            while gate.limiter.in_flight("team-a") > 0:  # noqa: ASYNC110 - another task's
                await asyncio.sleep(0.02)
    finally:
        await runner.cleanup()
    assert gate.metrics is not None
    counted = {
        sample.labels["status"]: sample.value
        for metric in gate.metrics.requests.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels["tenant"] == "team-a"
    }
    assert counted == {"499": 1.0}
    [record] = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert record["status"] == 499


async def test_one_tenants_parse_memory_never_serves_another(
    router_standin: RouterStandIn, keys_dir: Path
) -> None:
    """Finding 2 of issue 31: the frontend remembered parses by bytes alone, so tenant B sending
    tenant A's recent conversation was served faster, confirming a guess of it. Now B's identical
    body misses every memory: nothing resumed, nothing reused, no head or tools remembered."""
    from kvretention.dataplane.frontend import affinity
    from kvretention.dataplane.frontend.app import STATE

    app = create_app(
        FrontendConfig(router_url=router_standin.base_url, prefix_routing=True),
        gate=_gate(keys_dir),
    )
    client = await _client(app)
    resumer = app[STATE].resumer
    tools = [{"name": "edit", "input_schema": {"type": "object", "properties": {}}}]
    history = [
        {"role": "user", "content": "x" * 100_000},
        {"role": "assistant", "content": "y" * 100_000},
        {"role": "user", "content": "the secret question"},
    ]
    body = {"model": "m", "max_tokens": 4, "system": "s", "tools": tools, "messages": history}

    async def send(key: str) -> None:
        resp = await client.post(MESSAGES, json=body, headers={"x-api-key": key})
        assert resp.status == 200

    try:
        await send(KEY_A)
        await send(KEY_A)
        assert resumer.resumed_items > 0 and resumer.reused_items > 0  # A's own memory works
        before = (resumer.resumed_items, resumer.reused_items)
        await send(KEY_B)
        assert (resumer.resumed_items, resumer.reused_items) == before
        assert not resumer.scoped("team-c").resumes(json.dumps(body).encode())
        await send(KEY_B)  # B's own next turn does find B's memory
        assert resumer.resumed_items > before[0]
    finally:
        await client.close()
    heads = {key[0] for key in affinity._HEADS}
    assert {"team-a", "team-b"} <= heads


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(1024):
                pass
    except TimeoutError:
        return False
    return True


async def test_silent_and_half_sent_connections_are_closed_and_keyed_clients_still_served(
    router_standin: RouterStandIn, keys_dir: Path
) -> None:
    """Finding 3 of issue 31: connections that send nothing, or half a head, stayed open for an
    hour (aiohttp's idle timeout) and could use up the open files; now they are closed within the
    bound, whatever they trickle, and a client with a key is served meanwhile."""
    from kvretention.dataplane.http import start_site

    app = create_app(FrontendConfig(router_url=router_standin.base_url), gate=_gate(keys_dir))
    runner = await start_site(
        app, host="127.0.0.1", port=0, shutdown_timeout=0.5, idle_timeout=0.6, head_timeout=0.6
    )
    port = runner.addresses[0][1]
    try:
        silent = await asyncio.open_connection("127.0.0.1", port)
        half = await asyncio.open_connection("127.0.0.1", port)
        half[1].write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        slow = await asyncio.open_connection("127.0.0.1", port)

        async def trickle() -> None:
            for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200:
                slow[1].write(bytes([byte]))
                await asyncio.sleep(0.05)

        trickling = asyncio.create_task(trickle())
        async with aiohttp.ClientSession() as session:
            resp = await session.post(
                f"http://127.0.0.1:{port}{CHAT}", json=chat("ok"), headers={"x-api-key": KEY_A}
            )
            assert resp.status == 200
        closed = await asyncio.gather(
            *(_closed_within(reader, 3.0) for reader, _ in (silent, half, slow))
        )
        trickling.cancel()
        await asyncio.gather(trickling, return_exceptions=True)
        assert closed == [True, True, True]
        # a keep-alive connection is served for as many requests as it sends in time
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                resp = await session.post(
                    f"http://127.0.0.1:{port}{CHAT}", json=chat("ok"), headers={"x-api-key": KEY_B}
                )
                assert resp.status == 200
                await asyncio.sleep(0.3)
    finally:
        for _, writer in (silent, half, slow):
            writer.close()
        await runner.cleanup()

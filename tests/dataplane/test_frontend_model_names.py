"""Model names at the frontend: alias patterns take the names agents send by default, the model is
checked before the body (one 404, in the provider's shape, not a 400 per field first), and the
model lists show what a client can pick."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kvretention.dataplane.frontend.app import create_app
from kvretention.dataplane.frontend.config import FrontendConfig
from support.router_standin import RouterStandIn

SERVED = "qwen3-0.6b"
ALIASES = {"claude-haiku-4-5": SERVED, "claude-*": SERVED, "gpt-*": SERVED}

USER = [{"role": "user", "content": "model-names"}]
BODIES: dict[str, dict[str, Any]] = {
    "/v1/messages": {"max_tokens": 8, "messages": USER},
    "/v1/messages/count_tokens": {"messages": USER},
    "/v1/chat/completions": {"messages": USER},
    "/v1/responses": {"input": "model-names"},
}
INVALID: dict[str, dict[str, Any]] = {
    "/v1/messages": {"max_tokens": 8, "messages": "not a list"},
    "/v1/messages/count_tokens": {"messages": "not a list"},
    "/v1/chat/completions": {"messages": 5},
    "/v1/responses": {"input": 5},
}
"""Bodies no frontend accepts, whatever it learns to ignore."""
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")


@pytest.fixture
async def client(router_standin: RouterStandIn) -> AsyncIterator[TestClient[Any, Any]]:
    router_standin.clear()
    config = FrontendConfig(
        router_url=router_standin.base_url, served_models=(SERVED,), model_aliases=ALIASES
    )
    client: TestClient[Any, Any] = TestClient(TestServer(create_app(config)))
    await client.start_server()
    yield client
    await client.close()


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions", "/v1/responses"])
@pytest.mark.parametrize("model", ["claude-opus-5-5", "gpt-6.1-sol", "claude-haiku-4-5", SERVED])
async def test_a_name_a_pattern_matches_is_served_and_echoed(
    client: TestClient[Any, Any], router_standin: RouterStandIn, path: str, model: str
) -> None:
    resp = await client.post(path, json={"model": model, **BODIES[path]})
    answer = await resp.json()
    assert resp.status == 200, answer
    assert answer["model"] == model
    [sent] = router_standin.received
    assert sent.body["model"] == SERVED


def _not_found(path: str, answer: dict[str, Any]) -> str:
    """The message of a 404 for the model, asserting the provider's own error shape."""
    if path in ANTHROPIC:
        assert answer["type"] == "error" and answer["error"]["type"] == "not_found_error"
        return str(answer["error"]["message"])
    error = answer["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "model_not_found",
        "model",
        "invalid_request_error",
    )
    return str(error["message"])


@pytest.mark.parametrize("path", list(BODIES))
async def test_an_unserved_model_is_a_404_naming_the_patterns(
    client: TestClient[Any, Any], router_standin: RouterStandIn, path: str
) -> None:
    resp = await client.post(path, json={"model": "llama-4", **BODIES[path]})
    message = _not_found(path, await resp.json())
    assert resp.status == 404
    assert "'llama-4'" in message and "claude-*" in message and SERVED in message
    assert router_standin.received == []


@pytest.mark.parametrize("path", list(INVALID))
async def test_the_model_is_checked_before_the_body(
    client: TestClient[Any, Any], router_standin: RouterStandIn, path: str
) -> None:
    """The same invalid body: a 400 with a served name, the 404 first with a name nothing serves."""
    served = await client.post(path, json={"model": "claude-opus-5-5", **INVALID[path]})
    unserved = await client.post(path, json={"model": "llama-4", **INVALID[path]})
    assert served.status == 400, await served.text()
    assert unserved.status == 404
    _not_found(path, await unserved.json())
    assert router_standin.received == []


async def test_model_lists_show_served_names_and_exact_aliases_never_a_pattern(
    client: TestClient[Any, Any],
) -> None:
    openai = await (await client.get("/v1/models")).json()
    anthropic = await (
        await client.get("/v1/models", headers={"anthropic-version": "2023-06-01"})
    ).json()
    expected = [SERVED, "claude-haiku-4-5"]
    assert [m["id"] for m in openai["data"]] == expected
    assert [m["id"] for m in anthropic["data"]] == expected
    assert anthropic["first_id"] == SERVED and anthropic["last_id"] == "claude-haiku-4-5"

"""The agent CLIs' gateway requests at the frontend, as the pinned releases send them: Claude Code's
gateway model discovery, Codex's ``model_catalog_url`` catalog, and Codex's remote compaction,
each answered in the client's own shape (the requests were read from Claude Code 2.1.332 and
Codex 0.171.0; docs/frontend.md, "Model discovery")."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

from kvretention.dataplane.frontend.app import create_app
from kvretention.dataplane.frontend.cli import frontend_cmd
from kvretention.dataplane.frontend.config import FrontendConfig
from support.router_standin import RouterStandIn

SERVED = "qwen3-coder"
ALIASES = {"claude-sonnet-4-5": SERVED, "claude-haiku-4-5": SERVED, "claude-*": SERVED}
INSTRUCTIONS = "You are a coding agent on the fleet."

CLAUDE_CODE_DISCOVERY: dict[str, Any] = {
    "path": "/v1/models",
    "params": {"limit": "1000"},
    "headers": {
        "x-api-key": "sk-any",
        "anthropic-version": "2023-06-01",
        "user-agent": "claude-cli/2.1.332 (external, cli)",
    },
}
"""``GET ${ANTHROPIC_BASE_URL}/v1/models?limit=1000`` with the key, ``anthropic-version`` and any
``ANTHROPIC_CUSTOM_HEADERS``, sent when ``CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY`` is set."""

CODEX_CATALOG: dict[str, Any] = {
    "path": "/v1/models",
    "params": {"client_version": "0.171.0"},
    "headers": {"authorization": "Bearer sk-any", "originator": "codex_cli_rs"},
}
"""``GET <model_catalog_url>?client_version=0.171.0`` (recorded from the binary), sent when the
provider sets ``model_catalog_url`` and ``[features] api_key_model_discovery = true``."""


async def _client(config: FrontendConfig) -> TestClient[Any, Any]:
    client: TestClient[Any, Any] = TestClient(TestServer(create_app(config)))
    await client.start_server()
    return client


@pytest.fixture
async def client(router_standin: RouterStandIn) -> AsyncIterator[TestClient[Any, Any]]:
    config = FrontendConfig(
        router_url=router_standin.base_url,
        served_models=(SERVED,),
        model_aliases=ALIASES,
        codex_instructions=INSTRUCTIONS,
    )
    client = await _client(config)
    yield client
    await client.close()


def claude_code_reads(body: Any) -> list[str]:
    """What Claude Code 2.1.332 takes from the answer: it validates ``{data: [{id: string,
    display_name?: string, description?: string | null}]}`` (one bad entry drops them all), keeps
    ids naming ``claude`` or ``anthropic``, and cuts descriptions at 100 characters."""
    assert isinstance(body["data"], list)
    for entry in body["data"]:
        assert isinstance(entry["id"], str)
        assert isinstance(entry.get("display_name", ""), str)  # optional, never null
        assert entry.get("description") is None or isinstance(entry["description"], str)
    return [e["id"] for e in body["data"] if re.search("(claude|anthropic)", e["id"], re.I)]


async def test_claude_code_gateway_discovery_gets_every_name_on_one_page(
    client: TestClient[Any, Any],
) -> None:
    resp = await client.get(
        CLAUDE_CODE_DISCOVERY["path"],
        params=CLAUDE_CODE_DISCOVERY["params"],
        headers=CLAUDE_CODE_DISCOVERY["headers"],
    )
    body = await resp.json()
    assert resp.status == 200, body
    assert [m["id"] for m in body["data"]] == [SERVED, "claude-sonnet-4-5", "claude-haiku-4-5"]
    assert body["has_more"] is False  # Claude Code reads the first page only
    assert claude_code_reads(body) == ["claude-sonnet-4-5", "claude-haiku-4-5"]
    descriptions = {m["id"]: m["description"] for m in body["data"]}
    assert descriptions[SERVED] == "Served by this fleet; also answers claude-*."
    assert descriptions["claude-haiku-4-5"] == f"Alias of {SERVED}."


async def test_the_anthropic_sdk_pages_through_the_list(client: TestClient[Any, Any]) -> None:
    headers = {"anthropic-version": "2023-06-01"}
    first = await (await client.get("/v1/models", params={"limit": "2"}, headers=headers)).json()
    assert [m["id"] for m in first["data"]] == [SERVED, "claude-sonnet-4-5"]
    assert first["has_more"] is True
    params = {"limit": "2", "after_id": first["last_id"]}
    rest = await (await client.get("/v1/models", params=params, headers=headers)).json()
    assert [m["id"] for m in rest["data"]] == ["claude-haiku-4-5"] and rest["has_more"] is False


async def test_a_bad_limit_is_anthropics_400(client: TestClient[Any, Any]) -> None:
    resp = await client.get(
        "/v1/models", params={"limit": "5000"}, headers={"anthropic-version": "2023-06-01"}
    )
    body = await resp.json()
    assert resp.status == 400 and resp.headers["x-should-retry"] == "false"
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("limit: ")


async def test_codex_gets_its_catalog_with_the_fleets_instructions(
    client: TestClient[Any, Any],
) -> None:
    resp = await client.get(
        CODEX_CATALOG["path"], params=CODEX_CATALOG["params"], headers=CODEX_CATALOG["headers"]
    )
    body = await resp.json()
    assert resp.status == 200, body
    assert list(body) == ["models"]
    assert [m["slug"] for m in body["models"]] == [SERVED, "claude-sonnet-4-5", "claude-haiku-4-5"]
    assert {m["base_instructions"] for m in body["models"]} == {INSTRUCTIONS}
    assert all(m["visibility"] == "list" and m["supported_in_api"] for m in body["models"])


async def test_openai_clients_still_get_openais_list(client: TestClient[Any, Any]) -> None:
    body = await (await client.get("/v1/models")).json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [SERVED, "claude-sonnet-4-5", "claude-haiku-4-5"]
    assert {m["object"] for m in body["data"]} == {"model"}


async def test_without_instructions_codex_gets_openais_404_and_keeps_its_own(
    router_standin: RouterStandIn,
) -> None:
    """Codex 0.171.0 logs the 404 and runs with its built-in metadata and prompt (checked)."""
    client = await _client(
        FrontendConfig(router_url=router_standin.base_url, served_models=(SERVED,))
    )
    try:
        resp = await client.get(
            CODEX_CATALOG["path"], params=CODEX_CATALOG["params"], headers=CODEX_CATALOG["headers"]
        )
        body = await resp.json()
    finally:
        await client.close()
    assert resp.status == 404 and resp.headers["x-should-retry"] == "false"
    error = body["error"]
    assert (error["type"], error["code"]) == (
        "invalid_request_error",
        "codex_catalog_not_configured",
    )
    assert "--codex-instructions-file" in error["message"]


CODEX_COMPACT = {
    "model": SERVED,
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    ],
    "instructions": "Summarize.",
    "tools": [],
    "parallel_tool_calls": False,
}


async def test_remote_compaction_is_refused_in_openais_shape_without_reaching_the_router(
    client: TestClient[Any, Any], router_standin: RouterStandIn
) -> None:
    router_standin.clear()
    resp = await client.post("/v1/responses/compact", json=CODEX_COMPACT)
    body = await resp.json()
    assert resp.status == 501
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.headers["x-should-retry"] == "false" and resp.headers["x-request-id"]
    error = body["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "server_error",
        "unsupported_endpoint",
        None,
    )
    assert "compaction" in error["message"] and "Traceback" not in error["message"]
    assert router_standin.received == []
    metrics = await (await client.get("/metrics")).text()
    assert (
        'kvretention_frontend_rejections_total{endpoint="responses.compact",'
        'reason="unsupported_endpoint"} 1.0'
    ) in metrics


async def test_other_methods_on_compact_are_openais_405(client: TestClient[Any, Any]) -> None:
    resp = await client.get("/v1/responses/compact")
    body = await resp.json()
    assert resp.status == 405 and body["error"]["type"] == "invalid_request_error"


def test_a_missing_instructions_file_stops_the_frontend_at_startup(tmp_path: Path) -> None:
    missing = tmp_path / "codex-prompt.md"
    args = ["--router-url", "http://127.0.0.1:1", "--codex-instructions-file", str(missing)]
    result = CliRunner().invoke(frontend_cmd, args)
    assert result.exit_code == 2
    assert "--codex-instructions-file" in result.output

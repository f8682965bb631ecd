"""Claude Code and Codex with their own API-key headers, against the agents fleet with auth on.

The plane is rendered from ``examples/agents.yaml`` plus ``frontend.auth`` naming one Secret; a
local directory stands for its mount (one file per tenant, as the kubelet lays a Secret out).
Claude Code sends ``ANTHROPIC_API_KEY`` as ``x-api-key``, Codex its provider's ``env_key`` as
``Authorization: Bearer``: each finishes with its key, every request it made is served as its own
tenant (the frontend's trace) and reaches the engine with that tenant's ``cache_salt``; with a
wrong key Claude Code's requests are refused with Anthropic's 401 and nothing reaches an engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kvretention.common.tenancy import cache_salt_for
from support.processes import StartKvretention
from support.real_clients import (
    AGENTS_EXAMPLE,
    Client,
    Exchange,
    Fleet,
    Recorder,
    run_claude,
    run_codex,
    run_task,
)
from support.rendered_plane import start_rendered_plane
from support.standin_chain import write_key_files
from support.worker_client import STANDIN_ANSWER

pytestmark = pytest.mark.clients

SECRET = "agent-keys"
KEYS = {
    "claude-team": "sk-claude-team-5c1e0b7d2a4c68f9",
    "codex-team": "sk-codex-team-8a71d2c4e9f05b36",
}
PROMPT = "Say hello."


@pytest.fixture(scope="module")
def fleet(start: StartKvretention, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("auth-plane")
    doc = yaml.safe_load(AGENTS_EXAMPLE.read_text())
    doc["spec"].setdefault("frontend", {})["auth"] = {"secretRefs": [{"name": SECRET}]}
    example = tmp / "agents-auth.yaml"
    example.write_text(yaml.safe_dump(doc))
    mount = write_key_files(tmp / "secret", KEYS)
    plane = start_rendered_plane(example, start=start, tmp=tmp, secrets={SECRET: mount})
    assert f"--auth-keys-dir=/etc/kvretention/auth/{SECRET}" in plane.commands["frontend"]
    with Recorder(plane.frontend.base_url) as recorder:
        yield Fleet(plane, recorder)


def _generations(exchanges: list[Exchange]) -> list[Exchange]:
    return [e for e in exchanges if e.is_generation]


@pytest.mark.parametrize(
    ("name", "tenant", "header"),
    [("claude", "claude-team", "x-api-key"), ("codex", "codex-team", "authorization")],
)
def test_each_cli_works_with_its_own_key_header_as_its_own_tenant(
    fleet: Fleet,
    clients: dict[str, Client],
    tmp_path: Path,
    name: str,
    tenant: str,
    header: str,
) -> None:
    launch = run_claude if name == "claude" else run_codex
    run = run_task(fleet, clients[name], launch, PROMPT, tmp_path, key=KEYS[tenant])
    assert run.result.returncode == 0, run.failure()
    assert STANDIN_ANSWER in run.result.stdout, run.failure()
    generations = _generations(run.exchanges)
    assert generations and not any(e.refused for e in generations), run.failure()
    for e in generations:
        sent = {k.lower(): v for k, v in e.headers.items()}[header]
        assert KEYS[tenant] in sent
    assert run.trace and {e.get("tenant") for e in run.trace} == {tenant}
    assert run.calls and {c["kwargs"].get("cache_salt") for _, c in run.calls} == {
        cache_salt_for(tenant)
    }
    for entry in run.trace:
        assert KEYS[tenant] not in str(entry)


def test_claude_code_with_a_wrong_key_is_refused_with_anthropics_401(
    fleet: Fleet, clients: dict[str, Client], tmp_path: Path
) -> None:
    wrong_key = "sk-not-a-fleet-key-00000000"
    run = run_task(fleet, clients["claude"], run_claude, PROMPT, tmp_path, key=wrong_key)
    assert run.result.returncode != 0, run.failure()
    generations = _generations(run.exchanges)
    assert generations, run.failure()
    assert {e.status for e in generations} == {401}
    assert all('"authentication_error"' in e.answer for e in generations)
    assert run.calls == []

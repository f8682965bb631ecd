"""Tenants kept apart on the data plane, as real processes with the engine stand-in.

Two tables. Placement: the router's prefix index and session pins are per tenant, so the same
prompt (or session id) from another tenant does not follow the first tenant's worker, and the
same tenant's does. Cache: through the frontend with auth on, the engine gets each tenant's own
``cache_salt`` and reports a cached prefix only for a prompt the same tenant sent before (the
stand-in keeps its prompts per salt, as SGLang's radix tree keys them by ``RadixKey.cache_salt``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvretention.common.tenancy import HEADER_TENANT, cache_salt_for
from kvretention.dataplane.protocol import HEADER_PREFIX, HEADER_SESSION
from support.processes import StartKvretention
from support.standin_chain import (
    post_chat,
    start_recorded_workers,
    start_standin_chain,
    worker_flags,
    write_key_files,
)
from support.worker_client import calls, post, request_body, wait_for

KEYS = {"team-a": "sk-team-a-0123456789abcdef", "team-b": "sk-team-b-0123456789abcdef"}
CHAIN = "aaaa1111,bbbb2222,cccc3333"


class Pool:
    def __init__(self, records: list[Path], router: str) -> None:
        self.records, self.router = records, router

    def owner(self, rid: str) -> int:
        (index,) = wait_for(lambda: [i for i, r in enumerate(self.records) if calls(r, rid)])
        return index

    def salt(self, rid: str) -> str | None:
        (call,) = calls(self.records[self.owner(rid)], rid)
        salt: str | None = call["kwargs"].get("cache_salt")
        return salt


@pytest.fixture(scope="module")
def pool(kvretention_process: StartKvretention, tmp_path_factory: pytest.TempPathFactory) -> Pool:
    d = tmp_path_factory.mktemp("tenant-placement")
    records = [d / f"w{i}.jsonl" for i in range(2)]
    urls = start_recorded_workers(kvretention_process, records)
    router = kvretention_process(["router", *worker_flags(urls)])
    return Pool(records, router.base_url)


def send(pool: Pool, rid: str, *, tenant: str | None, session: str | None = None) -> None:
    headers = {HEADER_PREFIX: CHAIN}
    if tenant is not None:
        headers[HEADER_TENANT] = tenant
    if session is not None:
        headers[HEADER_SESSION] = session
    status, lines = post(pool.router, request_body(rid), headers)
    assert status == 200, lines


# (rid, tenant, session, same worker as rid / other worker than rid)
PLACEMENT: list[tuple[str, str, str | None, str | None, str | None]] = [
    ("a1", "team-a", None, None, None),
    ("b1", "team-b", None, None, "a1"),  # the same prompt: no match in team-b's index
    ("a2", "team-a", None, "a1", None),  # team-a's own match
    ("b2", "team-b", None, "b1", None),
    ("a3", "team-a", "s", None, None),  # both workers served 2: the pin goes by URL
    ("b3", "team-b", "s", None, "a3"),  # the same session id is team-b's own session
    ("a4", "team-a", "s", "a3", None),
    ("b4", "team-b", "s", "b3", None),
]


def test_prefix_index_and_session_pins_are_per_tenant(pool: Pool) -> None:
    for rid, tenant, session, same, other in PLACEMENT:
        send(pool, rid, tenant=tenant, session=session)
        if same is not None:
            assert pool.owner(rid) == pool.owner(same), rid
        if other is not None:
            assert pool.owner(rid) != pool.owner(other), rid
        assert pool.salt(rid) == cache_salt_for(tenant), rid


def test_without_a_tenant_the_engine_gets_no_salt(pool: Pool) -> None:
    send(pool, "open-1", tenant=None)
    (call,) = calls(pool.records[pool.owner("open-1")], "open-1")
    assert "cache_salt" not in call["kwargs"]


@pytest.mark.parametrize("tenant", ["Team-A", "a/b", "x" * 70, "-a"])
def test_a_malformed_tenant_header_is_refused(pool: Pool, tenant: str) -> None:
    status, lines = post(pool.router, request_body("bad"), {HEADER_TENANT: tenant})
    assert status == 400
    assert lines[0]["error"]["code"] == "invalid_request"


# -- through the frontend, auth on -------------------------------------------------------------


@pytest.fixture(scope="module")
def plane(kvretention_process: StartKvretention, tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("tenant-cache")
    keys = write_key_files(d / "keys", KEYS)
    chain = start_standin_chain(
        kvretention_process,
        d,
        trace=d / "worker-trace.jsonl",
        frontend_args=["--auth-keys-dir", str(keys)],
    )
    return chain.frontend, chain.record


def chat(
    base_url: str,
    tenant: str,
    prompt: str,
    *,
    history: list[dict[str, str]] | None = None,
    system: str = "You are a careful assistant. " * 8,
) -> dict[str, Any]:
    body = {
        "model": "m",
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": system},
            *(history or []),
            {"role": "user", "content": prompt},
        ],
    }
    return post_chat(base_url, body, api_key=KEYS[tenant])


# (tenant, prompt, cached: whether the engine found the prompt's prefix in that tenant's cache)
CACHE: list[tuple[str, str, bool]] = [
    ("team-a", "Summarize the design document.", False),
    ("team-b", "Summarize the design document.", False),  # separate entry
    ("team-a", "Summarize the design document.", True),  # the same tenant shares it
    ("team-b", "Summarize the design document.", True),
    ("team-b", "Another question entirely.", True),  # its system prompt only
    ("team-a", "Another question entirely.", True),
]


def test_two_tenants_same_prompt_get_separate_cache_entries_and_each_shares_its_own(
    plane: Any,
) -> None:
    base_url, record = plane
    prompt_tokens = []
    for i, (tenant, prompt, cached) in enumerate(CACHE):
        usage = chat(base_url, tenant, prompt)["usage"]
        hit = usage["prompt_tokens_details"]["cached_tokens"]
        assert (hit > 0) is cached, (i, tenant, prompt, usage)
        prompt_tokens.append(usage["prompt_tokens"])
    engine = [json.loads(line) for line in record.read_text().splitlines()]
    salts = [c["kwargs"].get("cache_salt") for c in engine if c["event"] == "generate"]
    assert salts == [cache_salt_for(t) for t, _, _ in CACHE]
    for entry in engine:
        assert not any(key in json.dumps(entry) for key in KEYS.values())


# (tenant, turns of the conversation, whether the worker reused an earlier prompt's tokens)
RENDER: list[tuple[str, int, bool]] = [
    ("team-a", 1, False),
    ("team-b", 2, False),  # team-a's first turn is a prefix of it, but not team-b's
    ("team-a", 2, True),  # its own first turn
    ("team-b", 3, True),
]


def test_the_workers_render_cache_is_per_tenant(plane: Any) -> None:
    """The worker tokenizes only what is new since a conversation's previous prompt; another
    tenant's prompt must not lend it tokens (the time saved would tell that it was sent)."""
    base_url, record = plane
    trace = record.parent / "worker-trace.jsonl"
    turns = [("Plan the release.", "Step one."), ("Go on.", "Step two."), ("Finish.", "Done.")]
    for tenant, count, reused in RENDER:
        history = [
            message
            for question, answer in turns[: count - 1]
            for message in (
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer},
            )
        ]
        mark = len(trace.read_text().splitlines()) if trace.exists() else 0
        chat(base_url, tenant, turns[count - 1][0], history=history, system="Release manager.")
        (entry,) = wait_for(lambda mark=mark: trace.read_text().splitlines()[mark:] or None)
        found = json.loads(entry)
        assert found["tenant"] == tenant
        assert (found["prompt_tokens_reused"] > 0) is reused, (tenant, count, found)

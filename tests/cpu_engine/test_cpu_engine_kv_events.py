"""SGLang's own KV events, as the worker indexes them (``kvretention worker --kv-events``).

One real engine on CPU with a small KV pool (2,048 tokens) publishes what its radix cache stores and
evicts; the worker subscribes and serves ``GET /kv/residency``. Two turns of one tenant's session show
that session's prompt resident under the tenant's salt; another tenant's identical prompt is indexed
under its own salt. SGLang's plain radix cache names no session in its events, so the worker
attributes stored blocks to the sessions of the prompts it sent. Unsalted prompts that fill the pool twice over evict the first tenant's blocks.
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from kvretention.common.tenancy import HEADER_TENANT, cache_salt_for, scoped_session
from kvretention.dataplane.protocol import RESIDENCY_PATH
from support.cpu_engine import CpuWorker, StartCpuWorker, generate_tokens

pytestmark = pytest.mark.cpu_engine

POOL_TOKENS = 2048
PROMPT_TOKENS = 400
NEXT_TURN_TOKENS = 16
FILLERS = 10
PAGE = 1
"""SGLang's CPU engine pages one token at a time (the default ``--page-size``)."""
VOCAB_TOP = 800
ENGINE_ARGS = ("--max-total-tokens", str(POOL_TOKENS), "--context-length", "1024")
ACME = cache_salt_for("acme")
GLOBEX = cache_salt_for("globex")
S1 = scoped_session("acme", "s1")
G1 = scoped_session("globex", "g1")
"""Sessions as the worker files them: within their tenant."""


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, VOCAB_TOP) for _ in range(n)]


def generate(
    worker: CpuWorker, ids: Sequence[int], *, tenant: str | None = None, session: str | None = None
) -> dict[str, Any]:
    fields = {"session_id": session} if session is not None else {}
    headers = {HEADER_TENANT: tenant} if tenant is not None else {}
    return generate_tokens(worker, ids, headers=headers, **fields)


def residency(worker: CpuWorker) -> dict[str, Any]:
    with urllib.request.urlopen(worker.base_url + RESIDENCY_PATH, timeout=5) as resp:
        body: dict[str, Any] = json.load(resp)
    return body


def resident_tokens(summary: dict[str, Any], salt: str, session: str | None = None) -> int:
    """The salt's resident tokens (of ``session`` only, when given)."""
    return sum(
        e["tokens"]
        for e in summary["entries"]
        if e["cache_salt"] == salt and (session is None or e["session_id"] == session)
    )


def settled(worker: CpuWorker, until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The summary once ``until`` holds (events reach the worker a moment after the answer)."""
    deadline = time.monotonic() + 10
    summary = residency(worker)
    while not until(summary) and time.monotonic() < deadline:
        time.sleep(0.1)
        summary = residency(worker)
    return summary


@pytest.fixture(scope="module")
def worker(cpu_worker: StartCpuWorker) -> CpuWorker:
    return cpu_worker("kv-events", sglang_args=list(ENGINE_ARGS), worker_args=["--kv-events"])


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return tokens(random.Random(7), PROMPT_TOKENS)


def test_a_sessions_two_turns_are_resident_under_its_tenants_salt(
    worker: CpuWorker, prompt: list[int]
) -> None:
    generate(worker, prompt, tenant="acme", session="s1")
    turn = prompt + tokens(random.Random(8), NEXT_TURN_TOKENS)
    second = generate(worker, turn, tenant="acme", session="s1")
    assert second.get("cached_tokens", 0) >= PROMPT_TOKENS - PAGE  # the engine reused turn one
    floor = (len(turn) // PAGE) * PAGE - PAGE  # the last token's KV is stored after decoding
    summary = settled(worker, lambda s: resident_tokens(s, ACME, S1) >= floor)
    # SGLang's plain radix cache publishes no session: the worker attributes the blocks from the
    # prompts it sent (kv_events.PromptLedger).
    assert resident_tokens(summary, ACME, S1) >= floor
    assert resident_tokens(summary, ACME) <= len(turn) + 2  # nothing counted twice
    assert summary["missed"] == 0
    assert summary["malformed"] == 0
    assert summary["seq"] is not None


def test_another_tenants_identical_prompt_is_indexed_under_its_own_salt(
    worker: CpuWorker, prompt: list[int]
) -> None:
    before = resident_tokens(residency(worker), ACME)
    first = generate(worker, prompt, tenant="globex", session="g1")
    assert first.get("cached_tokens", 0) == 0  # salts never share a radix path
    summary = settled(worker, lambda s: resident_tokens(s, GLOBEX, G1) >= PROMPT_TOKENS - PAGE)
    assert resident_tokens(summary, GLOBEX, G1) >= PROMPT_TOKENS - PAGE
    assert resident_tokens(summary, ACME) == before
    assert resident_tokens(summary, ACME, G1) == 0


def test_filling_the_pool_evicts_the_tenants_blocks(worker: CpuWorker) -> None:
    before = resident_tokens(residency(worker), ACME)
    assert before >= PROMPT_TOKENS - PAGE
    rng = random.Random(9)
    for _ in range(FILLERS):
        generate(worker, tokens(rng, PROMPT_TOKENS))
    summary = settled(worker, lambda s: resident_tokens(s, ACME) < before)
    assert resident_tokens(summary, ACME) < before // 2
    everything = sum(e["tokens"] for e in summary["entries"])
    assert everything <= POOL_TOKENS  # the index holds no more than the pool can
    assert summary["missed"] == 0
    assert summary["unknown_removals"] == 0

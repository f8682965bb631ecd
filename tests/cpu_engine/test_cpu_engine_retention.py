"""Retention through SGLang's real scheduler: ``kv.retain`` holds a prefix in the radix cache.

Two real engines on CPU with a small KV pool (2,048 tokens), one with the retention plugin's
``kvretain`` policy and one with SGLang's default LRU, get the same workload straight from the
router's protocol (token ids, as the frontend sends when it tokenizes): a prompt, then unhinted
prompts that fill the pool twice over, then the prompt's next turn. SGLang's own ``cached_tokens``
on that turn says whether the prompt's KV survived. The hint travels as the frontend builds it
(``retain_full_prompt``); the worker turns it into SGLang's ``kv.retain`` envelope, the scheduler's
``Req`` carries it, and the plugin holds the tree nodes it covers.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from support.cpu_engine import CpuWorker, StartCpuWorker, generate_tokens

pytestmark = pytest.mark.cpu_engine

POOL_TOKENS = 2048
PROMPT_TOKENS = 400
FILLERS = 10
"""Unhinted prompts of ``PROMPT_TOKENS`` each: twice the pool."""
NEXT_TURN_TOKENS = 16
KEPT = PROMPT_TOKENS - 8
"""A kept prompt is read back whole, less at most a page's rounding."""
LOST = 64
VOCAB_TOP = 800
"""Token ids below the tokenizer's special and added tokens."""
ENGINE_ARGS = ("--max-total-tokens", str(POOL_TOKENS), "--context-length", "1024")


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, VOCAB_TOP) for _ in range(n)]


def generate(worker: CpuWorker, ids: Sequence[int], *, ttl: int | None = None) -> dict[str, Any]:
    """One request straight to the worker; the last stream line's usage."""
    hint = {"kv_hints": {"retain_full_prompt": {"ttl_seconds": ttl}}} if ttl is not None else {}
    return generate_tokens(worker, ids, **hint)


def next_turn_cached(
    worker: CpuWorker, rng: random.Random, *, ttl: int | None, wait_s: float = 0.0
) -> int:
    """Serve a prompt (hinted with ``ttl`` or not), fill the pool twice with unhinted prompts,
    then serve the prompt's next turn: SGLang's ``cached_tokens`` for it."""
    prompt = tokens(rng, PROMPT_TOKENS)
    first = generate(worker, prompt, ttl=ttl)
    assert first["prompt_tokens"] == PROMPT_TOKENS
    time.sleep(wait_s)
    for _ in range(FILLERS):
        generate(worker, tokens(rng, PROMPT_TOKENS))
    cached: int = generate(worker, prompt + tokens(rng, NEXT_TURN_TOKENS)).get("cached_tokens", 0)
    return cached


@pytest.fixture(scope="module")
def retaining(cpu_worker: StartCpuWorker) -> CpuWorker:
    return cpu_worker("kvretain", sglang_args=[*ENGINE_ARGS, "--radix-eviction-policy", "kvretain"])


@pytest.fixture(scope="module")
def lru(cpu_worker: StartCpuWorker) -> CpuWorker:
    return cpu_worker("lru", sglang_args=list(ENGINE_ARGS))


def test_the_pool_is_small_enough_that_unhinted_prompts_are_evicted(retaining: CpuWorker) -> None:
    assert next_turn_cached(retaining, random.Random(1), ttl=None) <= LOST


def test_a_retained_prompt_survives_the_pressure_whole(retaining: CpuWorker) -> None:
    assert next_turn_cached(retaining, random.Random(2), ttl=600) >= KEPT
    assert retaining.shim_functions_called() == []


def test_an_expired_hold_is_evicted_like_any_other_prompt(retaining: CpuWorker) -> None:
    assert next_turn_cached(retaining, random.Random(3), ttl=1, wait_s=1.5) <= LOST


def test_the_same_workload_on_sglangs_lru_loses_the_prompt(lru: CpuWorker) -> None:
    assert next_turn_cached(lru, random.Random(2), ttl=600) <= LOST


def test_the_retaining_worker_keeps_sglangs_rust_tree_core(retaining: CpuWorker) -> None:
    """kvretain's holds are pins on SGLang's default core: the scheduler built that core (not a
    fallback to the Python one), as the worker's own metric says."""
    generate(retaining, tokens(random.Random(4), 32))
    text = httpx.get(retaining.base_url + "/metrics", timeout=10).text
    assert 'kvretention_worker_radix_core_info{core="rust",policy="kvretain"} 1.0' in text, text
    assert 'core="python"' not in text
    # The pins' budget: half the 2,048-token pool, which leaves the 1,024-token context its room;
    # the retained prompt held (600 s) fits it, nothing was left out.
    budget = 'kvretention_worker_radix_pinned_tokens{kind="budget"} 1024.0'
    assert budget in text, text
    pinned = re.search(r'kvretention_worker_radix_pinned_tokens\{kind="pinned"\} (\S+)', text)
    assert pinned is not None and KEPT <= float(pinned.group(1)) <= 1024, text
    assert "kvretention_worker_radix_pins_dropped_total 0.0" in text

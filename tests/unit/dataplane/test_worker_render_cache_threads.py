"""The render cache shared by the worker's planning threads stays exact.

Conversations grow turn by turn while other threads encode other conversations and the same
conversation's side calls (the same turn twice at once, both wanting to extend the previous
prompt in place). Every encoding must equal the tokenizer's own, and the cache's byte count
must match the entries it keeps. Token offsets are read in slices (so other threads get the GIL
between them), with the same ends and order as read at once.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from kvretention.dataplane.worker import render_cache
from kvretention.dataplane.worker.render_cache import RenderCache, token_ends
from support import chat_tokenizer

SESSIONS = 6
TURNS = 5
BLOCK = "line of an agent's tool output, fairly long so tokenizing takes a while\n" * 120


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return chat_tokenizer.build_tokenizer()


def prompt(session: int, turn: int) -> str:
    """Session ``session``'s prompt at ``turn``: the previous turn's blocks plus one more."""
    blocks = [f"<|im_start|>system\nsession {session}<|im_end|>\n"]
    for t in range(turn + 1):
        blocks.append(f"<|im_start|>user\nturn {t}\n{BLOCK}<|im_end|>\n")
    return "".join(blocks) + "<|im_start|>assistant\n"


def whole(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(encoded["input_ids"]), [end for _, end in encoded["offset_mapping"]]


def test_concurrent_turns_encode_exactly(tokenizer: Any) -> None:
    cache = RenderCache(tokenizer, verify_every=3)
    assert cache.enabled

    def encode(session: int, turn: int) -> tuple[int, int, list[int], list[int], int]:
        encoded = cache.encode(prompt(session, turn), session=f"s{session}")
        return session, turn, list(encoded.ids), list(encoded.ends), encoded.reused

    results = []
    with ThreadPoolExecutor(max_workers=4) as pool:
        for turn in range(TURNS):
            # each turn twice at once: a conversation's side call races its main call
            jobs = [(s, turn) for s in range(SESSIONS) for _ in range(2)]
            results += list(pool.map(lambda job: encode(*job), jobs))
    for session, turn, ids, ends, _ in results:
        assert (ids, ends) == whole(tokenizer, prompt(session, turn)), (session, turn)
    assert cache.enabled, "a reuse differed from the full encode"
    assert sum(reused for *_, reused in results) > 0, "nothing was reused"
    assert cache.hits + cache.misses == len(results)
    assert cache.nbytes == sum(entry.size for entry in cache._entries.values())


@pytest.mark.parametrize(
    ("offsets", "ordered"),
    [
        ([], True),
        ([(0, 1)], True),
        ([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)], True),
        ([(0, 1), (1, 2), (2, 2), (2, 2), (2, 3)], True),  # equal ends across a slice's edge
        ([(0, 1), (1, 3), (2, 2), (3, 4), (4, 5)], False),  # a decrease inside a slice
        ([(0, 1), (1, 4), (2, 3), (3, 5), (4, 6)], False),  # a decrease at a slice's edge
        ([(0, 1), (1, 2), (2, 3), (3, 4), (0, 0)], False),  # in the last, short slice
    ],
)
def test_token_ends_read_in_slices(
    offsets: list[tuple[int, int]], ordered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(render_cache, "SLICE_TOKENS", 2)
    held = list(offsets)
    ends, found = token_ends(held)
    assert list(ends) == [end for _, end in offsets]
    assert found == ordered == all(a[1] <= b[1] for a, b in itertools.pairwise(offsets))
    assert held == []  # freed as read

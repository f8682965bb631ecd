"""The residency index, fed SGLang's KV event batches as the engine publishes them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

from kvretention.dataplane.worker.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KVEventBatch,
    PromptLedger,
    ResidencyEntry,
    ResidencyIndex,
    decode_batch,
    decode_seq,
)

SALT_A = "kvr-tenant:acme"
SALT_B = "kvr-tenant:globex"


def stored(
    hashes: Sequence[int],
    *,
    salt: str | None = SALT_A,
    session: str | None = None,
    page: int = 4,
    tokens: int | None = None,
    medium: str | None = "GPU",
) -> BlockStored:
    count = len(hashes) * page if tokens is None else tokens
    return BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=None,
        token_ids=list(range(count)),
        block_size=page,
        lora_id=None,
        medium=medium,
        cache_salt=salt,
        session_id=session,
    )


def removed(hashes: Sequence[int], *, medium: str | None = "GPU") -> BlockRemoved:
    return BlockRemoved(block_hashes=list(hashes), medium=medium)


def entry(salt: str | None, session: str | None, blocks: int, tokens: int) -> ResidencyEntry:
    return ResidencyEntry(cache_salt=salt, session_id=session, blocks=blocks, tokens=tokens)


CASES: list[tuple[str, list[list[KvEvent]], list[ResidencyEntry], int]] = [
    ("stored", [[stored([1, 2, 3], session="s1")]], [entry(SALT_A, "s1", 3, 12)], 0),
    ("partial last page", [[stored([1, 2], tokens=6)]], [entry(SALT_A, None, 2, 6)], 0),
    (
        "two salts apart",
        [[stored([1, 2]), stored([7, 8, 9], salt=SALT_B)]],
        [entry(SALT_A, None, 2, 8), entry(SALT_B, None, 3, 12)],
        0,
    ),
    ("unsalted", [[stored([1], salt=None)]], [entry(None, None, 1, 4)], 0),
    ("removed", [[stored([1, 2, 3])], [removed([2, 3])]], [entry(SALT_A, None, 1, 4)], 0),
    ("all removed drops the owner", [[stored([1, 2])], [removed([1, 2])]], [], 0),
    (
        "removed twice",
        [[stored([1, 2])], [removed([1])], [removed([1])]],
        [entry(SALT_A, None, 1, 4)],
        1,
    ),
    ("removal before store", [[removed([5])], [stored([5])]], [entry(SALT_A, None, 1, 4)], 1),
    ("stored twice counts once", [[stored([1]), stored([1])]], [entry(SALT_A, None, 1, 4)], 0),
    (
        "still on the host tier",
        [[stored([1]), stored([1], medium="CPU_PINNED")], [removed([1])]],
        [entry(SALT_A, None, 1, 4)],
        0,
    ),
    (
        "removed from the other tier only",
        [[stored([1])], [removed([1], medium="CPU_PINNED")]],
        [entry(SALT_A, None, 1, 4)],
        1,
    ),
    ("cleared", [[stored([1, 2]), stored([3], salt=SALT_B)], [AllBlocksCleared()]], [], 0),
    (
        "stored after clear",
        [[stored([1])], [AllBlocksCleared(), stored([2, 3])]],
        [entry(SALT_A, None, 2, 8)],
        0,
    ),
]


@pytest.mark.parametrize(
    ("batches", "expected", "unknown"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_index_follows_the_events(
    batches: list[list[KvEvent]], expected: list[ResidencyEntry], unknown: int
) -> None:
    index = ResidencyIndex()
    for seq, events in enumerate(batches):
        index.apply(seq, KVEventBatch(ts=100.0 + seq, events=events))
    summary = index.summary()
    assert list(summary.entries) == expected
    assert summary.unknown_removals == unknown
    assert (summary.seq, summary.batches, summary.last_ts) == (
        len(batches) - 1,
        len(batches),
        100.0 + len(batches) - 1,
    )


@pytest.mark.parametrize(("seqs", "missed"), [([0, 1, 2], 0), ([0, 3], 2), ([5, 6, 9], 2)])
def test_sequence_gaps_are_counted(seqs: list[int], missed: int) -> None:
    index = ResidencyIndex()
    for seq in seqs:
        index.apply(seq, KVEventBatch(ts=1.0, events=[]))
    assert index.summary().missed == missed


def test_a_fresh_index_says_it_saw_nothing() -> None:
    summary = ResidencyIndex().summary()
    assert (summary.entries, summary.seq, summary.batches, summary.last_ts) == ((), None, 0, None)


def test_decodes_what_sglang_itself_encodes() -> None:
    """The schema is a copy of SGLang's: encoded with its classes, decoded with ours."""
    theirs: Any = pytest.importorskip("sglang.srt.disaggregation.kv_events")
    batch = theirs.KVEventBatch(
        ts=12.5,
        events=[
            theirs.BlockStored(
                block_hashes=[-3, 4],
                parent_block_hash=9,
                token_ids=[1, 2, 3, 4, 5],
                block_size=4,
                lora_id=None,
                medium=theirs.StorageMedium.GPU,
                cache_salt=SALT_A,
                session_id="s1",
            ),
            theirs.BlockRemoved(block_hashes=[-3], medium=theirs.StorageMedium.GPU),
            theirs.AllBlocksCleared(),
        ],
    )
    ours = decode_batch(msgspec.msgpack.Encoder().encode(batch))
    assert ours.ts == 12.5
    assert ours.attn_dp_rank is None
    assert ours.events == [
        BlockStored(
            block_hashes=[-3, 4],
            parent_block_hash=9,
            token_ids=[1, 2, 3, 4, 5],
            block_size=4,
            lora_id=None,
            medium="GPU",
            cache_salt=SALT_A,
            session_id="s1",
        ),
        BlockRemoved(block_hashes=[-3], medium="GPU"),
        AllBlocksCleared(),
    ]
    assert decode_seq((41).to_bytes(8, "big")) == 41


def test_a_malformed_payload_raises() -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_batch(msgspec.msgpack.encode([1.0, [{"type": "Nope"}]]))


def chained(
    hashes: Sequence[int], tokens: Sequence[int], *, parent: int | None, salt: str | None = SALT_A
) -> BlockStored:
    return BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=parent,
        token_ids=list(tokens),
        block_size=4,
        lora_id=None,
        medium="GPU",
        cache_salt=salt,
    )


Note = tuple[str | None, str, list[int]]
SHARED = [1, 2, 3, 4]

ATTRIBUTIONS: list[tuple[str, list[Note], list[BlockStored], dict[int, str | None]]] = [
    (
        "a noted prompt's blocks are its session's",
        [(SALT_A, "a", [*SHARED, 5, 6, 7, 8])],
        [chained([10, 11], [*SHARED, 5, 6, 7, 8], parent=None)],
        {10: "a", 11: "a"},
    ),
    (
        "a shared prefix stays with the first; the new tail is the second session's",
        [(SALT_A, "a", [*SHARED, 5, 6, 7, 8]), (SALT_A, "b", [*SHARED, 20, 21, 22, 23])],
        [
            chained([10, 11], [*SHARED, 5, 6, 7, 8], parent=None),
            chained([12], [20, 21, 22, 23], parent=10),
        ],
        {10: "a", 11: "a", 12: "b"},
    ),
    (
        "the answer's tokens follow their parent",
        [(SALT_A, "a", SHARED)],
        [chained([10], SHARED, parent=None), chained([11], [50, 51, 52, 53], parent=10)],
        {10: "a", 11: "a"},
    ),
    (
        "tokens at another position do not match",
        [(SALT_A, "a", [9, 9, 9, 9, *SHARED])],
        [chained([10], SHARED, parent=None)],
        {10: None},
    ),
    (
        "another salt's prompt does not match",
        [(SALT_B, "a", SHARED)],
        [chained([10], SHARED, parent=None)],
        {10: None},
    ),
    (
        "the latest matching prompt wins",
        [(SALT_A, "a", SHARED), (SALT_A, "b", SHARED)],
        [chained([10], SHARED, parent=None)],
        {10: "b"},
    ),
    (
        "an unknown parent: no position, no parent to follow",
        [(SALT_A, "a", SHARED)],
        [chained([10], SHARED, parent=99)],
        {10: None},
    ),
]


@pytest.mark.parametrize(
    ("notes", "events", "sessions"),
    [a[1:] for a in ATTRIBUTIONS],
    ids=[a[0] for a in ATTRIBUTIONS],
)
def test_blocks_are_attributed_to_noted_sessions(
    notes: list[Note], events: list[BlockStored], sessions: dict[int, str | None]
) -> None:
    index = ResidencyIndex()
    for salt, session, ids in notes:
        index.prompts.note(salt=salt, session=session, ids=ids)
    index.apply(0, KVEventBatch(ts=1.0, events=list(events)))
    owners = {(e.cache_salt, e.session_id): e.blocks for e in index.summary().entries}
    expected: dict[tuple[str | None, str | None], int] = {}
    for session in sessions.values():
        expected[(SALT_A, session)] = expected.get((SALT_A, session), 0) + 1
    assert owners == expected


def test_sglangs_own_session_wins_over_the_ledger() -> None:
    index = ResidencyIndex()
    index.prompts.note(salt=SALT_A, session="noted", ids=SHARED)
    index.apply(0, KVEventBatch(ts=1.0, events=[stored([10], session="engine")]))
    assert [e.session_id for e in index.summary().entries] == ["engine"]


def test_the_ledger_forgets_the_oldest_prompts_past_its_bound() -> None:
    index = ResidencyIndex(prompts=PromptLedger(max_tokens=6))
    index.prompts.note(salt=SALT_A, session="old", ids=SHARED)
    index.prompts.note(salt=SALT_A, session="new", ids=[7, 7, 7, 7])
    index.apply(0, KVEventBatch(ts=1.0, events=[chained([10], SHARED, parent=None)]))
    assert [e.session_id for e in index.summary().entries] == [None]

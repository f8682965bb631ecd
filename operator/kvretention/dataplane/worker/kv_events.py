"""Pure: SGLang's KV events decoded, and the residency index they feed.

SGLang publishes what its radix cache stores and evicts (``--kv-events-config``) as msgpack
``KVEventBatch`` messages. The schema here mirrors SGLang's own classes field for field
(``sglang.srt.disaggregation.kv_events``; a unit test encodes with those and decodes with these), so
the worker decodes without importing SGLang. The index keeps, per ``(cache_salt, session_id)``, the
block hashes resident in the engine: ``BlockStored`` adds, ``BlockRemoved`` removes by hash (a salted
block's hash is namespaced by its salt, so a hash names one tenant's block), ``AllBlocksCleared``
empties it.

A block belongs to the session whose request stored it (a block another session reuses stays with
the first). SGLang names that session only from its unified radix cache; the CPU engine's plain radix
cache (and SGLang's default) publishes ``session_id`` empty. So the worker notes each prompt it sends
(:class:`PromptLedger`: salt, session, token ids), and the index attributes a stored block without a
session to the most recent noted prompt of the same salt holding the block's tokens at the block's
position (its offset from the root, known from its parent's chain); failing that, to its parent's
session (the answer's tokens, stored after the prompt's).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import msgspec

SEQ_BYTES: Final = 8
"""The publisher's multipart message is ``(topic, seq as 8 big-endian bytes, payload)``."""
DEFAULT_LEDGER_TOKENS: Final = 4_000_000
"""Prompt tokens the ledger keeps (4 bytes each), most recent prompts first."""


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int | tuple[int, int]]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[KvEvent]
    attn_dp_rank: int | None = None


_DECODER: Final = msgspec.msgpack.Decoder(KVEventBatch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """One published payload; raises ``msgspec.DecodeError`` on a malformed one."""
    return _DECODER.decode(payload)


def decode_seq(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)


Owner = tuple[str | None, str | None]
"""``(cache_salt, session_id)``: whom a block was stored for."""


@dataclass
class _Block:
    owner: Owner
    tokens: int
    media: set[str | None]
    end: int | None
    """Tokens from the root to this block's end (None: its chain's start is unknown)."""


class PromptLedger:
    """The prompts the worker sent most recently, per salt and session, bounded by tokens."""

    def __init__(self, *, max_tokens: int = DEFAULT_LEDGER_TOKENS) -> None:
        self._max = max_tokens
        self._held = 0
        self._prompts: deque[tuple[str | None, str, array[int]]] = deque()

    def note(self, *, salt: str | None, session: str, ids: Sequence[int]) -> None:
        prompt = array("q", ids)
        self._prompts.append((salt, session, prompt))
        self._held += len(prompt)
        while self._held > self._max and len(self._prompts) > 1:
            self._held -= len(self._prompts.popleft()[2])

    def session_of(self, salt: str | None, start: int, token_ids: Sequence[object]) -> str | None:
        """The most recent session of ``salt`` whose prompt holds ``token_ids`` at ``start``."""
        ints = [t for t in token_ids if type(t) is int]
        if not ints or len(ints) != len(token_ids):  # empty, or bigram pages
            return None
        wanted = array("q", ints)
        end = start + len(wanted)
        for prompt_salt, session, prompt in reversed(self._prompts):
            if prompt_salt == salt and len(prompt) >= end and prompt[start:end] == wanted:
                return session
        return None


@dataclass(frozen=True)
class ResidencyEntry:
    cache_salt: str | None
    session_id: str | None
    blocks: int
    tokens: int


@dataclass(frozen=True)
class ResidencySummary:
    """What ``GET /kv/residency`` serves (``idle_s`` is added by the endpoint)."""

    entries: tuple[ResidencyEntry, ...]
    seq: int | None
    """The last batch's sequence number (``None``: no batch yet)."""
    batches: int
    missed: int
    """Batches the sequence numbers skipped (the SUB socket dropped them): the index may hold
    blocks the engine evicted since."""
    unknown_removals: int
    """Removed hashes the index did not hold (stored before it subscribed, or removed twice)."""
    last_ts: float | None
    """The engine's timestamp of the last batch."""


@dataclass
class ResidencyIndex:
    """Resident blocks per owner, fed one batch at a time in publish order."""

    prompts: PromptLedger = field(default_factory=PromptLedger)
    _blocks: dict[int, _Block] = field(default_factory=dict)
    _totals: dict[Owner, list[int]] = field(default_factory=dict)
    seq: int | None = None
    batches: int = 0
    missed: int = 0
    unknown_removals: int = 0
    last_ts: float | None = None

    def apply(self, seq: int, batch: KVEventBatch) -> None:
        if self.seq is not None and seq > self.seq + 1:
            self.missed += seq - self.seq - 1
        self.seq = seq
        self.batches += 1
        self.last_ts = batch.ts
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._store(event)
            elif isinstance(event, BlockRemoved):
                self._remove(event)
            else:
                self._blocks.clear()
                self._totals.clear()

    def _store(self, event: BlockStored) -> None:
        parent = (
            self._blocks.get(event.parent_block_hash)
            if event.parent_block_hash is not None
            else None
        )
        start = 0 if event.parent_block_hash is None else parent.end if parent else None
        owner: Owner = (event.cache_salt, self._session_of(event, parent=parent, start=start))
        per_block = _tokens_per_block(event)
        end = start
        for block_hash, tokens in zip(event.block_hashes, per_block, strict=True):
            end = None if end is None else end + tokens
            known = self._blocks.get(block_hash)
            if known is not None:
                known.media.add(event.medium)  # the same block on another tier
                continue
            self._blocks[block_hash] = _Block(
                owner=owner, tokens=tokens, media={event.medium}, end=end
            )
            total = self._totals.setdefault(owner, [0, 0])
            total[0] += 1
            total[1] += tokens

    def _session_of(
        self, event: BlockStored, *, parent: _Block | None, start: int | None
    ) -> str | None:
        if event.session_id is not None:
            return event.session_id
        if start is not None:
            noted = self.prompts.session_of(event.cache_salt, start, event.token_ids)
            if noted is not None:
                return noted
        if parent is not None and parent.owner[0] == event.cache_salt:
            return parent.owner[1]
        return None

    def _remove(self, event: BlockRemoved) -> None:
        for block_hash in event.block_hashes:
            known = self._blocks.get(block_hash)
            if known is None or event.medium not in known.media:
                self.unknown_removals += 1
                continue
            known.media.discard(event.medium)
            if known.media:
                continue  # still on another tier
            del self._blocks[block_hash]
            total = self._totals[known.owner]
            total[0] -= 1
            total[1] -= known.tokens
            if total[0] == 0:
                del self._totals[known.owner]

    def summary(self) -> ResidencySummary:
        entries = tuple(
            ResidencyEntry(cache_salt=salt, session_id=session, blocks=blocks, tokens=tokens)
            for (salt, session), (blocks, tokens) in sorted(
                self._totals.items(), key=lambda item: (item[0][0] or "", item[0][1] or "")
            )
        )
        return ResidencySummary(
            entries=entries,
            seq=self.seq,
            batches=self.batches,
            missed=self.missed,
            unknown_removals=self.unknown_removals,
            last_ts=self.last_ts,
        )


def _tokens_per_block(event: BlockStored) -> list[int]:
    """Tokens each stored block holds: full pages of ``block_size``, the last one what is left
    (SGLang coalesces consecutive pages of one chain into one event)."""
    left = len(event.token_ids)
    sizes = []
    for _ in event.block_hashes:
        size = min(event.block_size, left) if event.block_size > 0 else 0
        sizes.append(size)
        left -= size
    return sizes

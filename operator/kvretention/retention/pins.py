"""``kv.retain`` on SGLang's Rust tree core: each hold pins its prefix, within a budget.

SGLang 0.5.23's Rust core takes eviction policies by name and never lowers a node's priority, but
it does let a caller pin a prefix and unpin it later: ``match_full_device_prefix(key)`` names the
node where a key ends, ``inc_full_pin(node)`` keeps the FULL device KV on the path from the root
to it out of eviction, ``dec_full_pin(node)`` lets it go (SGLang's own HiCache buffer pipeline
pins its prefetch anchors with these calls, under a cap of the pool). A hold is expressed as such
a pin, and the tree otherwise evicts by LRU in its native order:

- a hold pins ``[0, end)``: a radix prefix is only usable from the root, so what a hold keeps is
  the path down to its end (the Python core's holds rank the same path, leaf first);
- the tree is split at each hold's end (SGLang's own split, as the Python core's holds do), so a
  pin ends where its hold does; a request's holds of different ranges are pins of their own;
- a scope's newer pin replaces its pins on the same path that it outlasts (a conversation's earlier
  turn); one that outranks it (a longer-lived hold on the system prompt) stays; pins on other
  paths stay until they expire or are released;
- a release (priority 0) over ``[start, end)`` drops the scope's pins on this path that end
  inside it;
- an expired pin is dropped before the next checkpoint or eviction pass, after which its prefix
  is evicted as LRU evicts any unretained one;
- the pins may keep at most :attr:`PinTable.cap_tokens` protected: the union of their paths
  (each node once, the whole deepest node included, as SGLang pins it; a prefix many scopes share
  counts once). A pin that would pass the cap takes the place of lower-ranked ones (lowest
  priority first, then the soonest to expire, then the oldest); with none left to take, it is not
  set. The cap leaves room for the longest request the engine admits, as SGLang's anchor cap
  (half the pool by default, like this one) does.

Pure bookkeeping over a duck-typed core (those three calls and ``collect_path_info``, which
lists the node ids from the root to a node): no SGLang
import, so the unit tests drive it with a fake core and the retention tier with SGLang's own.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from kvretention.retention.directives import Hold

logger = logging.getLogger(__name__)

ATTR: Final = "kvr_pins"
"""Attribute of a Rust tree core that carries holds as pins: its :class:`PinTable`."""
RATIO_ENV: Final = "KVR_RADIX_PIN_RATIO"
"""Share of the device KV pool pins may keep protected (default :data:`DEFAULT_RATIO`)."""
DEFAULT_RATIO: Final = 0.5

KeyFor = Callable[[int], Any]
"""``end -> RadixKey`` of the request's first ``end`` tokens (its namespace included)."""


@dataclass(slots=True, eq=False)
class Pin:
    """One pin: ``node`` (the core's node id) keeps tokens ``[0, end)`` of a scope's path."""

    scope: str | None
    node: int
    end: int
    path: tuple[tuple[int, int], ...]
    """``(node id, tokens)`` of each node from the root to ``node`` when it was pinned: what it
    protects (the whole deepest node included, as SGLang pins it)."""
    priority: int
    until: float | None
    seq: int
    live: bool = True

    def rank(self) -> tuple[float, float, int]:
        """Lowest first when the budget sheds: priority, then expiry (none: last), then age."""
        return (self.priority, math.inf if self.until is None else self.until, self.seq)


def _covers(new: Pin, old: Pin) -> bool:
    """Whether ``new`` keeps ``old``'s tokens at least as high and as long."""
    outlasts = new.until is None or (old.until is not None and new.until >= old.until)
    return new.priority >= old.priority and outlasts


def pin_cap(pool_tokens: int, context_tokens: int, ratio: float = DEFAULT_RATIO) -> int:
    """Tokens pins may keep protected: ``ratio`` of the pool, and never so much that the longest
    request the engine admits (``context_tokens``; 0 unknown) would find no room."""
    headroom = pool_tokens - context_tokens if context_tokens > 0 else pool_tokens
    return max(0, min(int(ratio * pool_tokens), headroom))


class PinTable:
    """The pins of one tree, by scope and node; ``core`` is SGLang's Rust tree core.

    Every step costs what it touches, not the number of pins: pins are found by ``(scope,
    node)`` along the request's path (one ``collect_path_info`` call), expire from a heap by
    expiry, and are shed from a heap by rank (stale heap entries are skipped when popped).
    """

    def __init__(self, core: Any, *, cap_tokens: int) -> None:
        self.core = core
        self.cap_tokens = cap_tokens
        self.pinned_tokens = 0
        self.shed = 0
        """Pins dropped or not set for the budget so far."""
        self.agreed_now: float | None = None
        """On a tree spread over ranks: the time they last agreed on (None: never asked)."""
        self._at: dict[tuple[str | None, int], Pin] = {}
        self._covers: dict[int, int] = {}
        """Per node id: how many pins' paths hold it (a node counts once in ``pinned_tokens``)."""
        self._lengths: dict[int, int] = {}
        self._expiry: list[tuple[float, int, Pin]] = []
        self._ranked: list[tuple[tuple[float, float, int], Pin]] = []
        self._seq = 0

    def pins(self) -> Iterable[Pin]:
        return self._at.values()

    def __len__(self) -> int:
        return len(self._at)

    def hold(self, scope: str | None, holds: Iterable[Hold], key_for: KeyFor) -> int:
        """Apply one request's holds (already page-aligned, ``until`` set) to the path its KV
        occupies; ``key_for(end)`` is the key of its first ``end`` tokens (the tree split at each
        hold's end, so a pin ends where its hold does). The pins added."""
        ordered = sorted(holds, key=lambda h: h.end)
        for release in (h for h in ordered if h.releases):
            _matched, node, _ = self.core.match_full_device_prefix(key_for(release.end))
            for pin in self._on_path(scope, node):
                if release.start < pin.end <= release.end:
                    self._unpin(pin)
        mine: set[int] = set()
        return sum(self._pin(scope, h, key_for, mine) for h in ordered if not h.releases)

    def _path(self, node: int) -> tuple[tuple[int, int], ...]:
        """``(node id, tokens)`` from the root to ``node``, ``node`` included."""
        (path,) = self.core.collect_path_info([node])
        return tuple((int(i.node_id), int(i.path_end) - int(i.path_start)) for i in path)

    def _on_path(self, scope: str | None, node: int) -> list[Pin]:
        """The scope's pins on the path from the root to ``node``, ``node`` included."""
        found = (self._at.get((scope, n)) for n, _ in self._path(node))
        return [p for p in found if p is not None]

    def _pin(self, scope: str | None, hold: Hold, key_for: KeyFor, mine: set[int]) -> int:
        """Pin one hold; ``mine``: the nodes this request pinned already (two of its holds that
        end in one node keep the stronger, where a later request's hold replaces the pin)."""
        matched, node, _tokens = self.core.match_full_device_prefix(key_for(hold.end))
        end = min(hold.end, int(matched))
        if end <= 0:
            return 0
        same = self._at.get((scope, node))
        if same is not None:
            if node in mine:
                longest = (
                    None
                    if same.until is None or hold.until is None
                    else max(same.until, hold.until)
                )
                same.priority, same.until = max(same.priority, hold.priority), longest
            else:
                same.end, same.priority, same.until = end, hold.priority, hold.until
            mine.add(node)
            self._track(same)
            return 0
        self._seq += 1
        path = self._path(node)
        pin = Pin(scope, node, end, path, hold.priority, hold.until, self._seq)
        on_path = (self._at.get((scope, n)) for n, _ in path)
        # The scope's pins this one outlasts on its path (a conversation's earlier turns) go; one
        # that outranks it (a system prompt's longer hold) stays.
        older = [p for p in on_path if p is not None and p.end < end and _covers(pin, p)]
        if not self._make_room(pin):
            self._count_shed(1)
            return 0  # the scope's older pins on this path stay
        self.core.inc_full_pin(node)
        self._cover(pin, +1)
        self._at[(scope, node)] = pin
        mine.add(node)
        self._track(pin)
        for p in older:
            self._unpin(p)  # the new pin keeps their path and more
        return 1

    def _added(self, pin: Pin) -> int:
        """Tokens ``pin`` would add to ``pinned_tokens``: its path's nodes no pin holds yet."""
        return sum(length for n, length in pin.path if n not in self._covers)

    def _cover(self, pin: Pin, step: int) -> None:
        for n, length in pin.path:
            count = self._covers.get(n, 0) + step
            if count > 0:
                if n not in self._covers:
                    self._lengths[n] = length
                    self.pinned_tokens += length
                self._covers[n] = count
            else:
                del self._covers[n]
                self.pinned_tokens -= self._lengths.pop(n)

    def _track(self, pin: Pin) -> None:
        """(Re)file ``pin`` in the expiry and rank heaps; older entries go stale, and the heaps
        are rebuilt from the live pins once stale entries outnumber them."""
        if len(self._ranked) > 4 * len(self._at) + 64:
            others = [p for p in self._at.values() if p is not pin]
            self._ranked = [(p.rank(), p) for p in others]
            self._expiry = [(p.until, p.seq, p) for p in others if p.until is not None]
            heapq.heapify(self._ranked)
            heapq.heapify(self._expiry)
        if pin.until is not None:
            heapq.heappush(self._expiry, (pin.until, pin.seq, pin))
        heapq.heappush(self._ranked, (pin.rank(), pin))

    def _make_room(self, pin: Pin) -> bool:
        """Drop lower-ranked pins, lowest first, until ``pin`` fits the cap; False when it cannot
        fit: alone (nothing is dropped then), or once every lower-ranked pin is gone."""
        if self._added(pin) > self.cap_tokens:
            return False
        dropped = 0
        while self.pinned_tokens + self._added(pin) > self.cap_tokens:
            lowest = self._lowest_below(pin.rank())
            if lowest is None:
                self._count_shed(dropped)
                return False
            self._unpin(lowest)
            dropped += 1
        self._count_shed(dropped)
        return True

    def _lowest_below(self, rank: tuple[float, float, int]) -> Pin | None:
        """The live pin of lowest rank, if it ranks below ``rank`` (stale entries are skipped)."""
        while self._ranked:
            entry_rank, lowest = self._ranked[0]
            if not lowest.live or entry_rank != lowest.rank():
                heapq.heappop(self._ranked)
                continue
            return lowest if entry_rank < rank else None
        return None

    def _unpin(self, pin: Pin) -> None:
        if not pin.live:
            return
        pin.live = False
        del self._at[(pin.scope, pin.node)]
        self._cover(pin, -1)
        self.core.dec_full_pin(pin.node)

    def forget(self) -> None:
        """Drop every pin without unpinning: the tree was reset (SGLang's ``flush_cache``), its
        nodes and their pins are gone, and a node id may name a new node."""
        self._at.clear()
        self._covers.clear()
        self._lengths.clear()
        self._expiry.clear()
        self._ranked.clear()
        self.pinned_tokens = 0

    def expire(self, now: float) -> int:
        """Drop every pin whose hold has expired at ``now``; how many."""
        dropped = 0
        while self._expiry and self._expiry[0][0] <= now:
            until, _seq, pin = heapq.heappop(self._expiry)
            if pin.live and pin.until == until:
                self._unpin(pin)
                dropped += 1
        return dropped

    def _count_shed(self, count: int) -> None:
        if count == 0:
            return
        before, self.shed = self.shed, self.shed + count
        if before == 0 or before // 1000 != self.shed // 1000:
            logger.warning(
                "kvretention: %d radix pin(s) left out over the budget of %d tokens (%d so far); "
                "those prefixes are evicted as LRU evicts them",
                count,
                self.cap_tokens,
                self.shed,
            )


__all__ = ["ATTR", "DEFAULT_RATIO", "RATIO_ENV", "Pin", "PinTable", "pin_cap"]

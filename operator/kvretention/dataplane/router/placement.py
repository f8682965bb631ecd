"""Pure placement decisions: which worker (or prefill/decode pair) serves a request.

A sticky session stays authoritative: while its pinned worker is healthy the session goes there,
however busy it is. Without a pin, a session some healthy worker's engine reports resident (its KV
events, :mod:`kvretention.dataplane.router.residency`) goes to the worker holding most of its
tokens: what a pin would have said had this router placed the session before (another router
replica did, or this one restarted). Otherwise, the ``cache-aware`` policy sends a request to the worker
most likely to hold its longest prompt prefix: the frontend sends a chain of prefix hashes (one
per conversation block, each covering every block before it) in ``x-kvr-prefix``, and a bounded
per-worker index remembers which chains each worker was sent, as SGLang's own router keeps an
approximate radix tree of what it placed. A load guard overrides the match when the system is
imbalanced. Otherwise (and under ``least-outstanding``) the healthy worker with the fewest
outstanding requests wins, ties broken by the fewest requests served so far (so sequential
traffic spreads too), then by URL. ``prompt_cache_key`` is not an affinity key: the router never
sees provider fields.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from kvretention.dataplane.protocol import HEADER_PREFIX, HEADER_SESSION, MAX_PREFIX_HASHES

DEFAULT_MAX_SESSIONS: Final = 100_000
DEFAULT_MAX_PREFIXES: Final = 1_000_000
"""Prefix hashes remembered across all workers (about 100 bytes each)."""

MIN_MATCH_BLOCKS: Final = 2
"""A match must reach past the first block (tools and system prompt): every conversation of an
agent shares that block, and it soon sits on every worker, so it must not pull all new
conversations onto the first worker that saw it."""

Policy = Literal["cache-aware", "least-outstanding"]
POLICIES: Final[tuple[Policy, ...]] = ("cache-aware", "least-outstanding")


@dataclass(frozen=True)
class Balance:
    """The load guard: a prefix match is overridden when the chosen worker has more than
    ``absolute`` outstanding requests above the least loaded one AND more than ``relative`` times
    its load (SGLang's router uses the same two-threshold test)."""

    absolute: int = 4
    relative: float = 1.5

    def overloaded(self, candidate: int, least: int) -> bool:
        return candidate - least > self.absolute and candidate > self.relative * least


@dataclass(frozen=True)
class WorkerView:
    """What placement needs to know about one worker."""

    url: str
    healthy: bool
    outstanding: int = 0
    served: int = 0


@dataclass(frozen=True)
class Choice:
    url: str
    sticky: bool
    """True when the session's pin decided, False when a prefix match or load did."""
    matched: int = 0
    """Prefix blocks the chosen worker was already sent (0: load decided)."""
    resident: int = 0
    """The session's tokens the chosen worker's engine reported resident (0: it did not decide)."""


@dataclass(frozen=True)
class PairChoice:
    prefill: Choice
    decode: Choice


def plan_worker(
    workers: Sequence[WorkerView],
    *,
    pinned: str | None,
    matched: Mapping[str, int] | None = None,
    resident: Mapping[str, int] | None = None,
    balance: Balance = Balance(),
) -> Choice | None:
    """The pinned worker if it is healthy; else the healthy worker whose engine holds the most of
    the session's tokens (``resident``: URL -> tokens); else the healthy worker with the longest
    prefix match (``matched``: URL -> matched blocks) unless the load guard says no; else the least
    loaded healthy one; None if none is healthy."""
    healthy = [w for w in workers if w.healthy]
    if not healthy:
        return None
    if pinned is not None and any(w.url == pinned for w in healthy):
        return Choice(url=pinned, sticky=True)
    holding = [w for w in healthy if resident and resident.get(w.url, 0) > 0]
    if resident and holding:
        best = min(holding, key=lambda w: (-resident[w.url], w.outstanding, w.served, w.url))
        return Choice(url=best.url, sticky=False, resident=resident[best.url])
    least = min(healthy, key=lambda w: (w.outstanding, w.served, w.url))
    if matched:
        best = max(healthy, key=lambda w: (matched.get(w.url, 0), -w.outstanding, -w.served))
        depth = matched.get(best.url, 0)
        if depth >= MIN_MATCH_BLOCKS and not balance.overloaded(
            best.outstanding, least.outstanding
        ):
            return Choice(url=best.url, sticky=False, matched=depth)
    return Choice(url=least.url, sticky=False)


def plan_pair(
    prefill: Sequence[WorkerView],
    decode: Sequence[WorkerView],
    *,
    pinned_prefill: str | None,
    pinned_decode: str | None,
    matched_prefill: Mapping[str, int] | None = None,
    resident_prefill: Mapping[str, int] | None = None,
    balance: Balance = Balance(),
) -> PairChoice | None:
    """A prefill and a decode worker, each chosen like :func:`plan_worker`; None unless both exist."""
    p = plan_worker(
        prefill,
        pinned=pinned_prefill,
        matched=matched_prefill,
        resident=resident_prefill,
        balance=balance,
    )
    d = plan_worker(decode, pinned=pinned_decode)
    return None if p is None or d is None else PairChoice(prefill=p, decode=d)


_SESSION_KEY: Final = b'"session_id"'


def session_of(body: bytes, headers: Mapping[str, str]) -> str | None:
    """The sticky-session key: the ``x-session-id`` header (our frontend always sets it), else the
    body's ``session_id`` field (other senders).

    The body is parsed only when there is no header and the key is in the bytes at all (the
    frontend writes keys unescaped), so a 200 KB agent prompt is never parsed here; the
    forwarded bytes are untouched. A request with our frontend's prefix chain
    (``x-kvr-prefix``) came from our frontend, which sends the session in the header whenever
    it has one: its body is not even searched (~50 µs per 200 KB).
    """
    header = headers.get(HEADER_SESSION)
    if header:
        return header
    if HEADER_PREFIX in headers:
        return None
    raw = None
    if _SESSION_KEY in body:
        try:
            raw = json.loads(body)
        except ValueError:
            raw = None
    value = raw.get("session_id") if isinstance(raw, dict) else None
    return value if isinstance(value, str) and value else None


class SessionPins:
    """session -> worker URL, one table per role, bounded (least recently used pins go first)."""

    def __init__(self, *, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self._max = max_sessions
        self._pins: OrderedDict[tuple[str, str], str] = OrderedDict()

    def get(self, role: str, session: str | None) -> str | None:
        if session is None:
            return None
        key = (role, session)
        url = self._pins.get(key)
        if url is not None:
            self._pins.move_to_end(key)
        return url

    def set(self, role: str, session: str | None, url: str) -> None:
        if session is None:
            return
        self._pins[(role, session)] = url
        self._pins.move_to_end((role, session))
        while len(self._pins) > self._max:
            self._pins.popitem(last=False)

    def __len__(self) -> int:
        return len(self._pins)


def parse_prefix_header(value: str | None, *, limit: int = MAX_PREFIX_HASHES) -> list[str]:
    """The ``x-kvr-prefix`` chain: comma-separated hashes, shortest prefix first (bounded)."""
    if not value:
        return []
    return [h for h in (part.strip() for part in value.split(",", limit)[:limit]) if h]


class PrefixIndex:
    """hash of a prompt prefix -> the workers it was sent to; bounded, least recently used first.

    Approximate on purpose: it records what the router placed, not what the engine kept, so an
    engine eviction is only noticed as a cache miss (as in SGLang's router).
    """

    def __init__(self, *, max_prefixes: int = DEFAULT_MAX_PREFIXES) -> None:
        self._max = max_prefixes
        self._where: OrderedDict[str, set[str]] = OrderedDict()

    def match(self, chain: Sequence[str]) -> dict[str, int]:
        """URL -> how many leading blocks of ``chain`` that worker was sent (longest first)."""
        depth: dict[str, int] = {}
        for i in range(len(chain) - 1, -1, -1):
            urls = self._where.get(chain[i])
            if urls:
                for url in urls:
                    depth.setdefault(url, i + 1)
        return depth

    def record(self, chain: Sequence[str], url: str) -> None:
        for h in chain:
            urls = self._where.get(h)
            if urls is None:
                self._where[h] = {url}
            else:
                urls.add(url)
                self._where.move_to_end(h)
        while len(self._where) > self._max:
            self._where.popitem(last=False)

    def forget(self, url: str) -> None:
        """Drop a worker that left the fleet (its cache went with it)."""
        for h in [h for h, urls in self._where.items() if url in urls]:
            urls = self._where[h]
            urls.discard(url)
            if not urls:
                del self._where[h]

    def __len__(self) -> int:
        return len(self._where)

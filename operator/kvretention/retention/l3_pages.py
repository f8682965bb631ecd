"""The L3 (Mooncake) half of the retention plugin: which stored pages a request's ``kv.retain``
holds cover, and until when (:class:`RetainedPages`, the index the put hook reads)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from kvretention.retention.directives import Hold, holds_for, read_retain

MAX_TRACKED_PAGES: Final = 200_000
"""Retained page keys remembered per process (about 500 bytes each, so about 100 MB at most;
12.8 M tokens at 64-token pages); the least recently recorded go first."""


@dataclass(frozen=True, slots=True)
class PageHold:
    """What holds one stored page: the latest expiry (``time.time()``; None: none) among its
    scopes' unexpired holds, and the request that set it (for the trace)."""

    until: float | None
    rid: str | None
    tenant: str | None = None
    """Whose namespace the page is in (its key is seeded by the tenant's ``cache_salt``)."""


def page_holds(holds: Sequence[Hold], *, pages: int, page_size: int) -> list[Hold | None]:
    """Per page ``i`` (tokens ``[i*page_size, (i+1)*page_size)``) of one request: its merged hold
    (highest priority, latest expiry), a release (priority 0) when only releases cover it, or None
    when no hold covers it whole. Holds are page-aligned already (``holds_for``)."""
    out: list[Hold | None] = []
    for i in range(pages):
        start, end = i * page_size, (i + 1) * page_size
        covering = [h for h in holds if h.start <= start and end <= h.end]
        if not covering:
            out.append(None)
            continue
        kept = [h for h in covering if not h.releases]
        if not kept:
            out.append(Hold(start, end, 0, None))
            continue
        untils = [h.until for h in kept]
        until = None if None in untils else max(u for u in untils if u is not None)
        out.append(Hold(start, end, max(h.priority for h in kept), until))
    return out


def _outlasts(until: float | None, other: float | None) -> bool:
    """Whether a hold ending at ``until`` (None: never) lasts at least as long as ``other``."""
    return until is None or (other is not None and until >= other)


@dataclass
class RetainedPages:
    """Storage keys of retained pages -> per-scope ``(until, rid)``: what the put hook pins.

    Shared by the scheduler thread (which records holds) and HiCache's backup thread (which
    reads them); a lock keeps the two consistent. Bounded: the least recently recorded keys go
    first past ``capacity``, and expired holds are dropped as they are read.
    """

    capacity: int = MAX_TRACKED_PAGES
    _pages: OrderedDict[str, dict[str | None, tuple[float | None, str | None]]] = field(
        default_factory=OrderedDict
    )
    _tenants: dict[str, str] = field(default_factory=dict)
    """Page key -> its tenant (a key is in one tenant's namespace: its chain's seed says whose)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(
        self,
        keys: Sequence[str],
        holds: Sequence[Hold | None],
        *,
        scope: str | None,
        rid: str | None,
        tenant: str | None = None,
    ) -> int:
        """Set (or release, for priority 0) ``scope``'s hold on each key; the number changed. A
        named scope's new hold replaces its earlier one; an unscoped one only ever extends."""
        changed = 0
        with self._lock:
            for key, hold in zip(keys, holds, strict=True):
                if hold is None:
                    continue
                if tenant is not None:
                    self._tenants[key] = tenant
                scopes = self._pages.get(key)
                if hold.releases:
                    if scopes is not None and scopes.pop(scope, None) is not None:
                        changed += 1
                        if not scopes:
                            self._drop(key)
                    continue
                if scopes is None:
                    scopes = self._pages[key] = {}
                earlier = scopes.get(scope)
                if scope is None and earlier is not None and _outlasts(earlier[0], hold.until):
                    # Unscoped holds come from unrelated requests (the worker sends scope null):
                    # one never shortens another's, as on the radix tree.
                    self._pages.move_to_end(key)
                    continue
                scopes[scope] = (hold.until, rid)
                self._pages.move_to_end(key)
                changed += 1
            while len(self._pages) > self.capacity:
                oldest, _ = self._pages.popitem(last=False)
                self._tenants.pop(oldest, None)
            for key in [k for k in self._tenants if k not in self._pages]:
                del self._tenants[key]  # a release of a key never held
        return changed

    def _drop(self, key: str) -> None:
        del self._pages[key]
        self._tenants.pop(key, None)

    def hold(self, key: str, now: float) -> PageHold | None:
        """The unexpired hold on ``key`` at ``now`` (latest expiry across scopes), or None."""
        with self._lock:
            scopes = self._pages.get(key)
            if not scopes:
                return None
            live = {s: h for s, h in scopes.items() if h[0] is None or h[0] > now}
            if not live:
                self._drop(key)
                return None
            if len(live) != len(scopes):
                self._pages[key] = live
            tenant = self._tenants.get(key)
        forever = [h for h in live.values() if h[0] is None]
        if forever:
            return PageHold(None, forever[0][1], tenant)
        until, rid = max(live.values(), key=lambda h: h[0] or 0.0)
        return PageHold(until, rid, tenant)

    def __len__(self) -> int:
        return len(self._pages)


def page_keys(
    tokens: Sequence[int],
    *,
    pages: int,
    page_size: int,
    seed: str | None,
    hash_pages: Callable[[Sequence[int], str | None, int], list[str]],
) -> list[str]:
    """The storage keys of the first ``pages`` whole pages of ``tokens``: HiCache's chain, each
    page's key hashing its tokens and the key before it, the first seeded by ``seed``."""
    if pages <= 0:
        return []
    keys = hash_pages(tokens[: pages * page_size], seed, page_size)
    if len(keys) != pages:
        raise ValueError(f"the page hash gave {len(keys)} keys for {pages} pages")
    return list(keys)


def record_request(
    index: RetainedPages,
    *,
    kv_hints: object,
    tokens: Sequence[int],
    prompt_len: int,
    page_size: int,
    seed: str | None,
    rid: str | None,
    now: float,
    hash_pages: Callable[[Sequence[int], str | None, int], list[str]],
    tenant: str | None = None,
) -> int:
    """Remember the storage keys of the pages ``kv_hints`` retains in ``tokens`` (``seed``:
    the request's namespace, its tenant's when it has one); the number of keys changed (0 for
    an unhinted request, and nothing is hashed then)."""
    plan = read_retain(kv_hints)
    if plan is None:
        return 0
    holds = holds_for(
        plan, seq_len=len(tokens), page_size=page_size, now=now, prompt_len=prompt_len
    )
    if not holds:
        return 0
    pages = max(h.end for h in holds) // page_size
    per_page = page_holds(holds, pages=pages, page_size=page_size)
    keys = page_keys(tokens, pages=pages, page_size=page_size, seed=seed, hash_pages=hash_pages)
    return index.record(keys, per_page, scope=plan.scope, rid=rid, tenant=tenant)

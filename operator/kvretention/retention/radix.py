"""Holds on radix-tree nodes: which nodes a request's retained ranges cover, and how they rank.

Works on SGLang's tree nodes by duck typing (``parent``, ``key``, ``priority``, ``last_access_time``:
both ``radix_cache.TreeNode`` and the unified cache's ``UnifiedTreeNode`` have them) and imports
no SGLang, so the Mooncake storage hook and the tests can read holds too. Each node keeps one hold
per ``kv.retain`` scope in :data:`HOLDS_ATTR`; SGLang's own ``node.priority`` and
:data:`~kvretention.retention.HOLD_UNTIL_ATTR` summarise them for readers that do not care about
scopes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from kvretention.retention import HOLD_UNTIL_ATTR
from kvretention.retention.directives import Hold

HOLDS_ATTR: Final = "kvr_holds"
"""Per-node ``{scope: (priority, until)}`` of the holds that cover the node (absent: none)."""

RANK_ATTR: Final = "kvr_rank"
"""Per-node ``((priority, until), ...)`` of the same holds, highest priority first (``until`` inf:
no expiry; absent: none), written with :data:`HOLDS_ATTR`. What the eviction order reads: an
eviction pass ranks every evictable leaf, so ranking a node nothing holds is one attribute read,
and a held one stops at its first unexpired hold."""

clock: Callable[[], float] = time.monotonic
"""The clock holds are set and expire by: monotonic, so a wall-clock step (NTP, a VM resumed)
neither expires every hold at once nor keeps one past its duration. Holds never leave the
process (the L3 pins carry TTLs, not times), so no other process needs to read it. Tests put a
fake one here."""

Holds = dict[str | None, tuple[int, float | None]]


def _active(holds: Holds | None, now: float) -> Iterable[tuple[int, float | None]]:
    return (h for h in (holds or {}).values() if h[1] is None or h[1] > now)


def retained_priority(node: Any, now: float) -> int:
    """The highest priority of the node's unexpired holds; 0 when none holds it."""
    ranked: tuple[tuple[int, float], ...] = getattr(node, RANK_ATTR, ())
    for priority, until in ranked:
        if until > now:
            return priority
    return 0


def active_hold(node: Any, now: float) -> tuple[int, float | None] | None:
    """``(priority, until)`` of what holds ``node`` at ``now`` (``until`` None: no expiry), the
    latest expiry among its unexpired holds; None when nothing holds it. What the L3 soft pin and
    the eviction order read."""
    active = list(_active(getattr(node, HOLDS_ATTR, None), now))
    if not active:
        return None
    untils = [u for _, u in active]
    until = None if None in untils else max(u for u in untils if u is not None)
    return max(p for p, _ in active), until


RANK_STEP: Final = 2.0**45
"""One hold priority in :func:`eviction_key`: above any ``last_access_time`` SGLang's trees write
(the unified tree's is a float counter bumped per access, the classic tree's monotonic seconds),
and small enough that ``MAX_PRIORITY * RANK_STEP`` plus a counter stays exact in a float."""


def eviction_key(node: Any, now: float) -> float:
    """What the ``kvretain`` policy evicts by, lowest first: unretained and expired nodes (0)
    before held ones, by hold priority, and by recency among equals; the order of
    ``(retained_priority, last_access_time)`` as one float, so an eviction pass ranks an unheld
    leaf as cheaply as LRU does (its ``last_access_time``, nothing allocated)."""
    last_access: float = node.last_access_time
    return retained_priority(node, now) * RANK_STEP + last_access


def path_spans(leaf: Any) -> list[tuple[Any, int, int]]:
    """``(node, start, end)`` key offsets of each node from the root down to ``leaf``."""
    chain = []
    node = leaf
    while node is not None and node.parent is not None:  # the root has no parent
        chain.append(node)
        node = node.parent
    spans, offset = [], 0
    for node in reversed(chain):
        spans.append((node, offset, offset + len(node.key)))
        offset += len(node.key)
    return spans


def boundaries(holds: Sequence[Hold], spans: Sequence[tuple[Any, int, int]]) -> list[int]:
    """Hold edges that fall strictly inside a node: the tree must be split there so a hold covers
    whole nodes and no node is half retained."""
    edges = {edge for h in holds for edge in (h.start, h.end)}
    return sorted(e for e in edges if any(start < e < end for _, start, end in spans))


def _merge(covering: Sequence[Hold]) -> tuple[int, float | None] | None:
    """One scope's hold from the directives of one request that cover a node; None = release."""
    kept = [h for h in covering if not h.releases]
    if not kept:
        return None
    untils = [h.until for h in kept]
    until = None if None in untils else max(u for u in untils if u is not None)
    return max(h.priority for h in kept), until


def apply_holds(
    spans: Sequence[tuple[Any, int, int]],
    holds: Sequence[Hold],
    *,
    scope: str | None,
    now: float | None = None,
) -> int:
    """Set (or, for priority 0, release) ``scope``'s hold on each node a hold covers whole.

    A node no hold covers is left alone, and so are other scopes' live holds. A named scope's new
    hold replaces its earlier one (its latest intent); the null scope's holds come from unrelated
    requests (the worker sends ``scope: null``), so a new one only ever raises the priority and
    extends the expiry, and a null-scope release releases them all. Holds expired by ``now`` are
    dropped from the nodes written (a shared prefix would otherwise collect every scope that ever
    held it). Returns the number of nodes changed.
    """
    changed = 0
    for node, start, end in spans:
        covering = [h for h in holds if h.start <= start and end <= h.end]
        if not covering:
            continue
        node_holds: Holds = {
            s: h
            for s, h in (getattr(node, HOLDS_ATTR, None) or {}).items()
            if now is None or h[1] is None or h[1] > now
        }
        merged = _merge(covering)
        if merged is None:
            node_holds.pop(scope, None)
        elif scope is None and None in node_holds:
            # Unscoped holds come from unrelated requests: one never shortens another's.
            node_holds[None] = _longest(node_holds[None], merged)
        else:
            node_holds[scope] = merged  # a scope's latest directive is its intent
        _store(node, node_holds)
        changed += 1
    return changed


def _longest(a: tuple[int, float | None], b: tuple[int, float | None]) -> tuple[int, float | None]:
    """The higher priority and the later expiry (None: none) of two holds."""
    until = None if a[1] is None or b[1] is None else max(a[1], b[1])
    return max(a[0], b[0]), until


def _ranked(holds: Holds) -> tuple[tuple[int, float], ...]:
    """:data:`RANK_ATTR` of ``holds``: ``(priority, until)`` highest priority first."""
    return tuple(
        sorted(((p, math.inf if u is None else u) for p, u in holds.values()), reverse=True)
    )


def _store(node: Any, holds: Holds) -> None:
    """Write the scope holds and their summary: SGLang's ``node.priority`` (raised to the highest
    hold, so the stock ``priority`` order agrees) and :data:`HOLD_UNTIL_ATTR` (latest expiry)."""
    if not holds:
        for attr in (HOLDS_ATTR, RANK_ATTR, HOLD_UNTIL_ATTR):
            if hasattr(node, attr):
                delattr(node, attr)
        return
    setattr(node, HOLDS_ATTR, holds)
    setattr(node, RANK_ATTR, _ranked(holds))
    node.priority = max(node.priority, *(p for p, _ in holds.values()))
    untils = [u for _, u in holds.values()]
    setattr(
        node, HOLD_UNTIL_ATTR, None if None in untils else max(u for u in untils if u is not None)
    )


def copy_holds(source: Any, target: Any) -> None:
    """A node split in two: the new parent is a prefix of ``source`` and keeps its holds."""
    holds = getattr(source, HOLDS_ATTR, None)
    if holds:
        setattr(target, HOLDS_ATTR, dict(holds))
        setattr(target, RANK_ATTR, _ranked(holds))
        setattr(target, HOLD_UNTIL_ATTR, getattr(source, HOLD_UNTIL_ATTR, None))

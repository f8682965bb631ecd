"""The L3 (Mooncake) half of the retention plugin: the pin budget of one store client
(:class:`PinLedger`) and the decision for each page it puts (:func:`plan_puts`)."""

from __future__ import annotations

import heapq
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from kvretention.retention.l3_pages import RetainedPages
from kvretention.retention.l3_settings import L3Settings

Outcome = Literal[
    "pinned", "unretained", "over_budget", "over_tenant_budget", "expired", "pin_refused"
]
OUTCOMES: Final[tuple[Outcome, ...]] = (
    "pinned",
    "unretained",
    "over_budget",
    "over_tenant_budget",
    "expired",
    "pin_refused",
)


# -- the budget ------------------------------------------------------------------------------


@dataclass
class PinLedger:
    """The pins one store client has written and when each ends: its share of the budget.

    ``capacity_bytes`` None means no budget. Counts a pin from its write to its TTL's end, whether
    or not the master still holds it (a pin evicted early stays counted until then), so the count
    is an upper bound and the budget is never overrun. A master restart seen in its ``/metrics``
    is the one exception: :meth:`drop_written_before` stops counting the pins it took with it.

    A reservation stands for pins an earlier process of the same worker wrote (which this ledger
    never saw): :meth:`reserve_share` reserves the whole share until the longest pin has passed,
    :meth:`observe_pool` lowers it to the pool's pinned objects (the master counts objects, not
    bytes) times the largest object this client puts (:meth:`note_objects`; one model and layout,
    so the earlier process's objects were no larger). It only ever shrinks.
    """

    capacity_bytes: int | None
    reserved_keys: int | None = 0
    """Pinned objects held back for an earlier process; None: the whole share (no reading yet)."""
    reserved_until: float = 0.0
    """``time.time()`` when every pin an earlier process wrote has ended (its TTLs were capped)."""
    object_bytes: int = 0
    """The largest object this client has put."""
    tenant_share: float | None = None
    """Share of ``capacity_bytes`` one tenant may hold; None: no per-tenant cap."""
    _live: dict[str, tuple[float, int]] = field(default_factory=dict)
    _written: dict[str, float] = field(default_factory=dict)
    """Page key -> when the put of its live pin returned (:meth:`confirm_written`)."""
    _owners: dict[str, str] = field(default_factory=dict)
    _tenant_bytes: dict[str, int] = field(default_factory=dict)
    _ends: list[tuple[float, str]] = field(default_factory=list)
    _bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def pinned_bytes(self) -> int:
        return self._bytes

    def tenant_bytes(self) -> dict[str, int]:
        """Bytes each tenant holds pinned (0 for one whose pins have all ended)."""
        with self._lock:
            return dict(self._tenant_bytes)

    def tenant_capacity(self) -> int | None:
        """What one tenant may hold: ``tenant_share`` of the client's share."""
        if self.capacity_bytes is None or self.tenant_share is None:
            return None
        return math.floor(self.tenant_share * self.capacity_bytes)

    def reserve_share(self, *, until: float) -> None:
        """Hold the whole share back until ``until`` or a reading of the pool shows less."""
        with self._lock:
            self.reserved_keys, self.reserved_until = None, until

    def observe_pool(self, pinned_keys: int) -> None:
        """The pool holds ``pinned_keys`` pinned objects now; an earlier process's pins are among
        them and only end from here on, so the reservation never needs to be larger."""
        with self._lock:
            count = max(0, pinned_keys)
            self.reserved_keys = (
                count if self.reserved_keys is None else min(self.reserved_keys, count)
            )

    def note_objects(self, sizes: Iterable[int]) -> None:
        """Objects this client is about to put: the size the reservation counts pins in."""
        self.object_bytes = max(self.object_bytes, *sizes, 0)

    def reserved(self, now: float) -> int:
        """The bytes reserved at ``now`` (0 once the longest pin has passed, or without a budget)."""
        if self.capacity_bytes is None or self.reserved_keys == 0 or now >= self.reserved_until:
            return 0
        if self.reserved_keys is None:
            return self.capacity_bytes
        return min(self.reserved_keys * self.object_bytes, self.capacity_bytes)

    def reservation_settled(self, now: float) -> bool:
        """Whether the reservation is over for good (nothing left to read the pool for)."""
        return self.reserved_keys == 0 or now >= self.reserved_until

    def _expire(self, now: float) -> None:
        while self._ends and self._ends[0][0] <= now:
            end, key = heapq.heappop(self._ends)
            entry = self._live.get(key)
            if entry is not None and entry[0] == end:
                del self._live[key]
                self._bytes -= entry[1]
                self._unown(key, entry[1])

    def _unown(self, key: str, nbytes: int) -> None:
        self._written.pop(key, None)
        tenant = self._owners.pop(key, None)
        if tenant is not None:
            self._tenant_bytes[tenant] -= nbytes

    def forget(self, key: str) -> None:
        """A pin that was not written after all (the master refused it): no longer counted."""
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is not None:
                self._bytes -= entry[1]
                self._unown(key, entry[1])

    def confirm_written(self, keys: Iterable[str], *, at: float) -> None:
        """The puts of these pins returned at ``at``: the master that answered holds them."""
        with self._lock:
            for key in keys:
                if key in self._live:
                    self._written[key] = at

    def drop_written_before(self, before: float) -> tuple[int, int]:
        """The master restarted after ``before``: the pins whose puts returned before it are gone
        with the old master, so they no longer count against the share (a page pinned again later
        is admitted anew); a pin whose put had not returned may be on the new one and stays
        counted. The pins and bytes dropped."""
        with self._lock:
            gone = [key for key, at in self._written.items() if at < before]
            dropped = 0
            for key in gone:
                entry = self._live.pop(key, None)
                if entry is not None:
                    self._bytes -= entry[1]
                    dropped += entry[1]
                    self._unown(key, entry[1])
            return len(gone), dropped

    def admit(
        self, key: str, nbytes: int, *, ends: float, now: float, tenant: str | None = None
    ) -> bool:
        """Count a pin of ``nbytes`` on ``key`` until ``ends`` if it fits the share (and its
        tenant's); False (and nothing counted) when it would pass it."""
        return self.place(key, nbytes, ends=ends, now=now, tenant=tenant) == "pinned"

    def place(
        self, key: str, nbytes: int, *, ends: float, now: float, tenant: str | None = None
    ) -> Literal["pinned", "over_budget", "over_tenant_budget"]:
        """:meth:`admit`, saying which budget refused: the client's, or the tenant's part."""
        with self._lock:
            self._expire(now)
            previous = self._live.get(key)
            held = self._bytes - (previous[1] if previous else 0)
            if (
                self.capacity_bytes is not None
                and held + self.reserved(now) + nbytes > self.capacity_bytes
            ):
                return "over_budget"
            cap = self.tenant_capacity()
            if tenant is not None and cap is not None:
                own = self._tenant_bytes.get(tenant, 0)
                if previous is not None and self._owners.get(key) == tenant:
                    own -= previous[1]
                if own + nbytes > cap:
                    return "over_tenant_budget"
            if previous is not None:
                self._unown(key, previous[1])
            self._live[key] = (ends, nbytes)
            self._bytes = held + nbytes
            if tenant is not None:
                self._owners[key] = tenant
                self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + nbytes
            heapq.heappush(self._ends, (ends, key))
            return "pinned"


# -- deciding each put -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PagePut:
    """How one page's objects are put: pinned for ``ttl_ms``, or unpinned and why."""

    page: str
    outcome: Outcome
    ttl_ms: int | None = None
    rid: str | None = None
    tenant: str | None = None


MIN_PIN_TTL_MS: Final = 1_000
"""A hold with less than a second left is written unpinned (``expired``): not worth a pin."""


def page_of(key_str: str, prefix: str | None) -> str:
    """The page key inside a Mooncake object key: ``[prefix_]<page>_<rank suffix>_<k|v>``
    (MooncakeStore's ``_tag_keys`` and buffer-meta naming); page keys are hex, with no ``_``."""
    if prefix is not None and key_str.startswith(prefix + "_"):
        key_str = key_str[len(prefix) + 1 :]
    return key_str.split("_", 1)[0]


def plan_puts(
    key_strs: Sequence[str],
    sizes: Sequence[int],
    *,
    prefix: str | None,
    index: RetainedPages,
    ledger: PinLedger,
    settings: L3Settings,
    now: float,
) -> list[PagePut]:
    """One decision per object key (the objects of one page share it): pin a retained page for
    its hold's remaining time capped by the master's maximum, whole seconds, if the client's
    budget share has room for all of the page's objects; otherwise unpinned, with the reason."""
    page_bytes: dict[str, int] = {}
    pages = [page_of(k, prefix) for k in key_strs]
    for page, size in zip(pages, sizes, strict=True):
        page_bytes[page] = page_bytes.get(page, 0) + size
    decided: dict[str, PagePut] = {}
    for page in pages:
        if page in decided:
            continue
        hold = index.hold(page, now)
        if hold is None:
            decided[page] = PagePut(page, "unretained")
            continue
        remaining = settings.max_pin_ttl_ms if hold.until is None else (hold.until - now) * 1000
        ttl_ms = int(min(remaining, settings.max_pin_ttl_ms)) // 1000 * 1000
        if ttl_ms < MIN_PIN_TTL_MS:
            decided[page] = PagePut(page, "expired", rid=hold.rid, tenant=hold.tenant)
            continue
        placed = ledger.place(
            page, page_bytes[page], ends=now + ttl_ms / 1000, now=now, tenant=hold.tenant
        )
        if placed == "pinned":
            decided[page] = PagePut(page, "pinned", ttl_ms, hold.rid, hold.tenant)
        else:
            decided[page] = PagePut(page, placed, rid=hold.rid, tenant=hold.tenant)
    return [decided[p] for p in pages]


def client_budget_bytes(settings: L3Settings, segment_bytes: int) -> int | None:
    """This client's share of the budget: ``budget_ratio`` x the segment it contributes."""
    if settings.budget_ratio is None:
        return None
    return math.floor(settings.budget_ratio * segment_bytes)

"""The Mooncake (L3) half of the retention plugin: soft pins on retained pages, within a budget.

SGLang 0.5.23 writes HiCache pages to Mooncake unpinned. Two hooks (through SGLang's own
``HookRegistry``, see :func:`register_l3_hooks`) change that:

- when a request's KV enters the unified tree (``checkpoint_into_tree``), the storage keys of the
  pages its ``kv.retain`` holds cover are computed exactly as HiCache computes them (SGLang's
  ``get_hash_str`` chain over whole pages, seeded by ``storage_namespace_seed(extra_key,
  cache_salt)``) and remembered with the hold's expiry (:class:`RetainedPages`);
- when ``MooncakeStore`` puts pages (``_put_batch_zero_copy_impl``, the one sink of its
  ``batch_set_v1``/``batch_set``/``set``), a page with an unexpired hold is put with a soft pin
  for the hold's remaining time, capped by the master's ``max_kv_soft_pin_ttl``; every other
  page is put unpinned, as before.

The retention budget is enforced here, per store client (:class:`PinLedger`): a client may hold
live pins up to ``budget_ratio`` x the segment it contributes to the pool, so a fleet's pins stay
within ``budgetRatio`` x the capacity its workers contribute. A retained page past that share is
written unpinned, counted (``kvretention_l3_pages_total{outcome="over_budget"}``) and named in
the request trace; the request never fails. With tenants (the frontend's API keys, which reach
SGLang as each request's ``cache_salt``, the seed of its page keys), each tenant may hold at most
``tenant_pin_share`` of that share (``outcome="over_tenant_budget"`` past it), so one tenant's
long pins cannot take the budget from the others. The settings come from the ``kvretention`` section
of the Mooncake config file the operator renders (:data:`SETTINGS_KEY`).

A restarted worker's ledger is new, but the pins its earlier self wrote stay until their TTLs
end; so a new ledger starts with its whole share *reserved* for them, and a thread off the write
path reads the managed master's ``/metrics`` to shrink the reservation to the pool's pinned
objects (an upper bound of what an earlier self can still hold) until it reaches 0, or the
longest pin has passed since the start (:func:`client_state`).

Import-light above the SGLang glue: the pure parts run in the unit and L3 tests without SGLang.
"""

from __future__ import annotations

import heapq
import json
import logging
import math
import os
import threading
import time
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from kvretention.dataplane.tenancy import tenant_of_salt
from kvretention.retention.contract import HookTarget
from kvretention.retention.directives import Hold, holds_for, read_retain

logger = logging.getLogger(__name__)

SETTINGS_KEY: Final = "kvretention"
"""Section of the worker's Mooncake config file (``mooncake.json``) the plugin reads; SGLang's
``MooncakeStoreConfig.from_file`` ignores keys it does not know."""
CONFIG_PATH_ENV: Final = "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"
DEFAULT_MAX_PIN_TTL_MS: Final = 86_400_000
"""``mooncake_master``'s own default ``--max_kv_soft_pin_ttl`` (24 h)."""
MAX_TRACKED_PAGES: Final = 200_000
"""Retained page keys remembered per process (about 500 bytes each, so about 100 MB at most;
12.8 M tokens at 64-token pages); the least recently recorded go first."""

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

L3_HOOK_TARGETS: Final = (
    HookTarget(
        "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.checkpoint_into_tree",
        ("self", "req", "up_to", "kwargs"),
        "_before_unified_checkpoint",
        "BEFORE",
        "remembers the storage keys of a request's retained pages before HiCache writes them",
    ),
    HookTarget(
        "sglang.srt.mem_cache.storage.mooncake_store.mooncake_store.MooncakeStore"
        "._put_batch_zero_copy_impl",
        ("self", "key_strs", "buffer_ptrs", "buffer_sizes", "group_ids", "session_ids"),
        "_put_with_pins",
        "AROUND",
        "the one place MooncakeStore puts pages: retained ones get a soft pin",
    ),
)
"""What the L3 hooks rely on in SGLang 0.5.23 (checked by the contract test)."""


# -- settings --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class L3Settings:
    """What the operator renders for the plugin beside SGLang's Mooncake config."""

    budget_ratio: float | None = None
    """Share of its own segment a store client may hold pinned; None: no budget."""
    max_pin_ttl_ms: int = DEFAULT_MAX_PIN_TTL_MS
    """The master's ``--max_kv_soft_pin_ttl``: a longer pin would be refused, so pins are capped."""
    metrics_url: str | None = None
    """The managed master's ``/metrics`` (from the file's ``master_server_address`` host and
    ``master_metrics_port``); None for an external master without ``external.metricsPort``."""
    tenant_share: float | None = None
    """Share of the client's budget one tenant may hold pinned; None: no per-tenant cap."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> L3Settings:
        """From a parsed ``mooncake.json``; a missing or malformed section keeps the defaults (the
        plugin must never stop a worker from serving)."""
        url = master_metrics_url(config)
        section = config.get(SETTINGS_KEY)
        if not isinstance(section, Mapping):
            return cls(metrics_url=url)
        ratio = section.get("pin_budget_ratio")
        ttl = section.get("max_pin_ttl_ms")
        share = section.get("tenant_pin_share")
        budget = float(ratio) if isinstance(ratio, int | float) and 0 <= ratio <= 1 else None
        max_ttl = ttl if isinstance(ttl, int) and ttl > 0 else DEFAULT_MAX_PIN_TTL_MS
        tenant_share = float(share) if isinstance(share, int | float) and 0 < share <= 1 else None
        return cls(
            budget_ratio=budget, max_pin_ttl_ms=max_ttl, metrics_url=url, tenant_share=tenant_share
        )

    def to_config(self) -> dict[str, Any]:
        """The ``kvretention`` section as the operator renders it."""
        out: dict[str, Any] = {"max_pin_ttl_ms": self.max_pin_ttl_ms}
        if self.budget_ratio is not None:
            out["pin_budget_ratio"] = self.budget_ratio
        if self.tenant_share is not None:
            out["tenant_pin_share"] = self.tenant_share
        return out


def master_metrics_url(config: Mapping[str, Any]) -> str | None:
    """``http://<master host>:<master_metrics_port>/metrics``, as the operator renders a managed
    master's client config; None when either is missing or malformed."""
    address = config.get("master_server_address")
    port = config.get("master_metrics_port")
    if not isinstance(address, str) or not isinstance(port, int) or isinstance(port, bool):
        return None
    host = address.rsplit(":", 1)[0] if ":" in address else address
    if not host or not 0 < port < 65536:
        return None
    return f"http://{host}:{port}/metrics"


def read_settings(environ: Mapping[str, str] | None = None) -> L3Settings:
    """The settings from the file SGLang's Mooncake backend reads (``CONFIG_PATH_ENV``)."""
    path = (os.environ if environ is None else environ).get(CONFIG_PATH_ENV)
    if not path:
        return L3Settings()
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        logger.warning("kvretention: cannot read %s (%s); L3 pins use defaults", path, err)
        return L3Settings()
    return L3Settings.from_config(config if isinstance(config, Mapping) else {})


# -- retained pages --------------------------------------------------------------------------


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


# -- the budget ------------------------------------------------------------------------------


@dataclass
class PinLedger:
    """The pins one store client has written and when each ends: its share of the budget.

    ``capacity_bytes`` None means no budget. Counts a pin from its write to its TTL's end, whether
    or not the master still holds it (a pin evicted early or dropped by a master restart stays
    counted until then), so the count is an upper bound and the budget is never overrun.

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


# -- accounting: metrics and trace ---------------------------------------------------------


class L3Stats:
    """Counters of what the put hook decided (also exported as ``kvretention_l3_*`` metrics in
    the worker's Prometheus registry when ``prometheus_client`` is importable)."""

    def __init__(self) -> None:
        self.pages: dict[Outcome, int] = dict.fromkeys(OUTCOMES, 0)
        self.hook_failures = 0
        self._lock = threading.Lock()
        self._pages_metric: Any = None
        self._failures_metric: Any = None
        self._pinned_metric: Any = None
        self._budget_metric: Any = None
        self._tenant_metric: Any = None
        try:
            from prometheus_client import Counter, Gauge

            self._pages_metric = Counter(
                "kvretention_l3_pages",
                "Pages put to Mooncake by the retention plugin, by outcome "
                "(pinned, unretained, over_budget: retained but written unpinned past the pin "
                "budget, expired: the hold ended before the write, pin_refused: the master "
                "refused the pin and the page was written unpinned).",
                ["outcome"],
            )
            self._failures_metric = Counter(
                "kvretention_l3_hook_failures",
                "Put batches the retention plugin's L3 hook failed on and handed to SGLang's own "
                "unpinned put (the worker log has the exception).",
            )
            self._pinned_metric = Gauge(
                "kvretention_l3_pinned_bytes",
                "Bytes this worker's Mooncake client holds soft-pinned (pins counted to their TTL).",
                multiprocess_mode="livesum",
            )
            self._budget_metric = Gauge(
                "kvretention_l3_pin_budget_bytes",
                "This worker's pin budget: softPin.budgetRatio x its Mooncake segment.",
                multiprocess_mode="livesum",
            )
            self._tenant_metric = Gauge(
                "kvretention_l3_tenant_pinned_bytes",
                "Bytes this worker's Mooncake client holds soft-pinned per tenant.",
                ["tenant"],
                multiprocess_mode="livesum",
            )
        except (ImportError, ValueError):  # no client, or registered twice in one process
            pass

    def count(self, outcome: Outcome, pages: int = 1) -> None:
        with self._lock:
            self.pages[outcome] += pages
        if self._pages_metric is not None:
            self._pages_metric.labels(outcome=outcome).inc(pages)

    def failed(self) -> None:
        with self._lock:
            self.hook_failures += 1
        if self._failures_metric is not None:
            self._failures_metric.inc()

    def set_pinned(
        self, pinned: int, budget: int | None, tenants: Mapping[str, int] | None = None
    ) -> None:
        if self._tenant_metric is not None:
            for tenant, held in (tenants or {}).items():
                self._tenant_metric.labels(tenant=tenant).set(held)
        if self._pinned_metric is not None:
            self._pinned_metric.set(pinned)
        if self._budget_metric is not None and budget is not None:
            self._budget_metric.set(budget)


STATS: Final = L3Stats()
INDEX: Final = RetainedPages()


def _trace(record: Mapping[str, Any]) -> None:
    """One line in the request trace (``KVR_REQUEST_TRACE``), when the worker keeps one."""
    from kvretention.dataplane.trace import TRACE_ENV

    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    line = json.dumps({"ts": round(time.time(), 6), **record}, separators=(",", ":"))
    try:
        with open(path, "a", encoding="utf-8") as f:  # one short O_APPEND write per line
            f.write(line + "\n")
    except OSError as err:
        logger.warning("kvretention: cannot append to the trace %s: %s", path, err)


_OVER_BUDGET_LOGGED = [0]
"""Over-budget batches seen by this process: the first and every thousandth is logged."""


def report_over_budget(puts: Iterable[PagePut], *, ledger: PinLedger) -> None:
    """Name the retained pages written unpinned past the budget, per request: one trace record
    each (the request id and its page keys) and, at most every thousandth time, a warning."""
    by_request: dict[tuple[str | None, str | None, str], list[str]] = {}
    for put in puts:
        if put.outcome in ("over_budget", "over_tenant_budget"):
            by_request.setdefault((put.rid, put.tenant, put.outcome), []).append(put.page)
    for (rid, tenant, outcome), pages in by_request.items():
        if _OVER_BUDGET_LOGGED[0] % 1000 == 0:
            logger.warning(
                "kvretention: L3 pin budget full (%d of %s bytes pinned, %d reserved for pins an "
                "earlier process may have left): %d retained pages of "
                "request %s written unpinned (logged once per 1000 times; all counted in "
                "kvretention_l3_pages_total and traced)",
                ledger.pinned_bytes,
                ledger.capacity_bytes,
                ledger.reserved(time.time()),
                len(pages),
                rid,
            )
        _OVER_BUDGET_LOGGED[0] += 1
        record: dict[str, Any] = {
            "component": "engine",
            "request_id": rid,
            "outcome": f"l3_pin_{outcome}",
            "pages": pages,
            "pinned_bytes": ledger.pinned_bytes,
            "reserved_bytes": ledger.reserved(time.time()),
            "budget_bytes": ledger.capacity_bytes,
        }
        if tenant is not None:
            record.update(
                tenant=tenant,
                tenant_pinned_bytes=ledger.tenant_bytes().get(tenant, 0),
                tenant_budget_bytes=ledger.tenant_capacity(),
            )
        _trace(record)


# -- SGLang glue -----------------------------------------------------------------------------


def _hash_pages(tokens: Sequence[int], seed: str | None, page_size: int) -> list[str]:
    """SGLang's own page-key chain (``mem_cache/utils.get_hash_str``)."""
    from sglang.srt.mem_cache.utils import get_hash_str

    keys = get_hash_str(list(tokens), seed, page_size=page_size)
    return [keys] if isinstance(keys, str) else list(keys)


def namespace_seed(extra_key: str | None, cache_salt: str | None) -> str | None:
    """SGLang's seed of a request's storage chain (``storage_namespace_seed``)."""
    from sglang.srt.mem_cache.utils import storage_namespace_seed

    seed: str | None = storage_namespace_seed(extra_key, cache_salt)
    return seed


KEYS_ATTR: Final = "kvr_l3_page_keys"
"""Attribute on SGLang's ``Req``: the storage keys of its pages hashed so far. A request is
checkpointed once per prefill chunk and again at its end; the chain is extended, never redone."""


def _request_hasher(req: Any) -> Callable[[Sequence[int], str | None, int], list[str]]:
    """SGLang's page-key chain for ``req``, extending the keys it already has (its tokens only
    ever grow at the end, so their prefix keys never change)."""

    def hash_pages(tokens: Sequence[int], seed: str | None, page_size: int) -> list[str]:
        known: list[str] = list(getattr(req, KEYS_ATTR, None) or [])
        pages = len(tokens) // page_size
        if len(known) < pages:
            prior = known[-1] if known else seed
            known += _hash_pages(
                tokens[len(known) * page_size : pages * page_size], prior, page_size
            )
            setattr(req, KEYS_ATTR, known)
        return known[:pages]

    return hash_pages


def remember_request(req: Any, *, up_to: int, page_size: int, now: float | None = None) -> int:
    """Record ``req``'s retained page keys in :data:`INDEX` (what the checkpoint hook does)."""
    tokens = req.full_untruncated_fill_ids[:up_to]
    return record_request(
        INDEX,
        kv_hints=getattr(req, "kv_hints", None),
        tokens=tokens,
        prompt_len=len(req.origin_input_ids),
        page_size=page_size,
        seed=namespace_seed(getattr(req, "extra_key", None), getattr(req, "cache_salt", None)),
        rid=getattr(req, "rid", None),
        now=time.time() if now is None else now,
        hash_pages=_request_hasher(req),
        tenant=tenant_of_salt(getattr(req, "cache_salt", None)),
    )


MOONCAKE_BACKENDS: Final = frozenset({"mooncake", "dynamic"})
"""``--hicache-storage-backend`` values whose pages may reach ``MooncakeStore`` (``dynamic`` names
any class, which may be it or extend it)."""


def _writes_to_mooncake(cache: Any) -> bool:
    if not getattr(cache, "enable_storage", False):
        return False
    backend = getattr(getattr(cache, "cache_controller", None), "storage_backend_type", None)
    return backend is None or str(backend) in MOONCAKE_BACKENDS


def _before_unified_checkpoint(cache: Any, req: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``UnifiedRadixCache.checkpoint_into_tree``: only a tree that writes pages to
    Mooncake, only hinted requests, and never EAGLE's bigram keys (their hash input differs)."""
    if getattr(req, "kv_hints", None) is None or not _writes_to_mooncake(cache):
        return
    if getattr(getattr(cache, "tree_core", None), "is_eagle", False):
        return
    try:
        remember_request(req, up_to=int(kwargs["up_to"]), page_size=int(cache.page_size))
    except Exception:  # a hint must never fail a request
        logger.exception("kvretention: could not record the L3 holds of request %s", req.rid)


SETTINGS_REFRESH_S: Final = 30.0
"""How often a store client re-reads its settings: the kubelet updates the mounted ConfigMap in
place, so a new ``budgetRatio`` reaches running workers without a restart."""


POOL_READ_S: Final = 5.0
"""How often a new ledger reads the master's ``/metrics`` while part of its share is reserved."""
POOL_READ_TIMEOUT_S: Final = 2.0
POOL_READ_MAX_BYTES: Final = 4 * 1024 * 1024


def pool_pinned_keys(metrics_text: str) -> int:
    """The objects the pool holds soft-pinned (``master_soft_pin_key_count``), through the
    operator's own parser; raises on text that is not a master's metrics."""
    from kvretention.controller.kvstore_metrics import parse_usage

    return parse_usage(metrics_text).pinned_keys


def _read_metrics(url: str) -> str:
    with urllib.request.urlopen(url, timeout=POOL_READ_TIMEOUT_S) as response:
        body: bytes = response.read(POOL_READ_MAX_BYTES)
    return body.decode("utf-8", errors="replace")


@dataclass
class _ClientState:
    """Per ``MooncakeStore`` instance: its settings and its share of the budget."""

    settings: L3Settings
    ledger: PinLedger
    segment_bytes: int
    read_at: float
    pool_read: threading.Event = field(default_factory=threading.Event)
    """Set once the pool's pinned objects have been read (tests wait on it)."""


def _watch_pool(state: _ClientState, url: str) -> None:
    """Off the write path: read the pool's pinned objects every :data:`POOL_READ_S` into the
    ledger's reservation until it is settled. An unreadable master keeps the reservation (the
    budget holds; pins wait), logged once."""
    warned = False
    while not state.ledger.reservation_settled(time.time()):
        try:
            pinned = pool_pinned_keys(_read_metrics(url))
        except Exception as err:  # any failure keeps the reservation; never raise in a thread
            if not warned:
                logger.warning(
                    "kvretention: cannot read the master's pinned objects at %s (%s); this "
                    "worker's L3 pin share stays reserved until it can",
                    url,
                    err,
                )
                warned = True
        else:
            state.ledger.observe_pool(pinned)
            state.pool_read.set()
        time.sleep(POOL_READ_S)
    state.pool_read.set()


_CLIENTS: dict[int, _ClientState] = {}
_CLIENTS_LOCK = threading.Lock()


def client_state(store: Any, *, now: float | None = None) -> _ClientState:
    """The settings and ledger of one ``MooncakeStore`` (made on its first put, settings re-read
    every :data:`SETTINGS_REFRESH_S`; the pins already counted stay counted).

    A new ledger cannot tell a first start from a restart, so with a managed master it reserves
    its whole share for pins an earlier process may have left, and :func:`_watch_pool` shrinks
    the reservation from the master's count; it ends anyway once the longest pin has passed."""
    at = time.monotonic() if now is None else now
    with _CLIENTS_LOCK:
        state = _CLIENTS.get(id(store))
        if state is None:
            storage = getattr(store, "storage_config", None)
            ranks = int(getattr(storage, "tp_size", 1)) * int(getattr(storage, "pp_size", 1))
            segment = int(store.config.global_segment_size) // max(1, ranks)
            settings = read_settings()
            ledger = PinLedger(
                client_budget_bytes(settings, segment), tenant_share=settings.tenant_share
            )
            state = _CLIENTS[id(store)] = _ClientState(settings, ledger, segment, at)
            if settings.metrics_url is not None:
                ledger.reserve_share(until=time.time() + settings.max_pin_ttl_ms / 1000)
                threading.Thread(
                    target=_watch_pool,
                    args=(state, settings.metrics_url),
                    name="kvretention-l3-pool",
                    daemon=True,
                ).start()
        elif at - state.read_at >= SETTINGS_REFRESH_S:
            state.settings = read_settings()
            state.ledger.capacity_bytes = client_budget_bytes(state.settings, state.segment_bytes)
            state.ledger.tenant_share = state.settings.tenant_share
            state.read_at = at
        return state


def put_with_pins(
    store: Any,
    original: Callable[..., list[int]],
    key_strs: list[str],
    buffer_ptrs: list[Any],
    buffer_sizes: list[Any],
    group_ids: list[str] | None = None,
    session_ids: list[str] | None = None,
    *,
    now: float | None = None,
) -> list[int]:
    """Put unretained pages through SGLang's own code; retained ones in batches per pin TTL with
    a soft-pinned ``ReplicateConfig`` (same group and session ids, same put call SGLang picks)."""
    state = client_state(store)
    sizes = [sum(s) if isinstance(s, list | tuple) else int(s) for s in buffer_sizes]
    state.ledger.note_objects(sizes)
    puts = plan_puts(
        key_strs,
        sizes,
        prefix=getattr(store, "config_prefix", None),
        index=INDEX,
        ledger=state.ledger,
        settings=state.settings,
        now=time.time() if now is None else now,
    )
    results: list[int] = [0] * len(key_strs)
    groups: dict[int | None, list[int]] = {}
    for i, put in enumerate(puts):
        groups.setdefault(put.ttl_ms, []).append(i)
    for ttl_ms, idx in groups.items():
        keys = [key_strs[i] for i in idx]
        ptrs = [buffer_ptrs[i] for i in idx]
        bsizes = [buffer_sizes[i] for i in idx]
        gids = None if group_ids is None else [group_ids[i] for i in idx]
        sids = None if session_ids is None else [session_ids[i] for i in idx]
        if ttl_ms is None:
            got = original(store, keys, ptrs, bsizes, gids, sids)
        else:
            pinned = _put_pinned(store, keys, ptrs, bsizes, gids, sids, ttl_ms=ttl_ms)
            got = _unpinned_where_refused(store, original, pinned, keys, ptrs, bsizes, gids, sids)
            for i, rc in zip(idx, pinned, strict=True):
                if int(rc) == INVALID_PARAMS:
                    puts[i] = replace(puts[i], outcome="pin_refused", ttl_ms=None)
                    state.ledger.forget(puts[i].page)
        for i, rc in zip(idx, got, strict=True):
            results[i] = int(rc)
    pages: dict[str, PagePut] = {}
    for put, rc in zip(puts, results, strict=True):
        if rc == 0:
            pages.setdefault(put.page, put)
    for put in pages.values():
        STATS.count(put.outcome)
    STATS.set_pinned(
        state.ledger.pinned_bytes, state.ledger.capacity_bytes, state.ledger.tenant_bytes()
    )
    report_over_budget(pages.values(), ledger=state.ledger)
    return results


INVALID_PARAMS: Final = -600
"""Mooncake's answer to a pin it will not take (a TTL past ``--max_kv_soft_pin_ttl``)."""


def _unpinned_where_refused(
    store: Any,
    original: Callable[..., list[int]],
    got: list[int],
    keys: list[str],
    ptrs: list[Any],
    sizes: list[Any],
    group_ids: list[str] | None,
    session_ids: list[str] | None,
) -> list[int]:
    """Objects whose pin the master refused (a smaller maximum TTL than rendered, say) are put
    again unpinned: a refused pin must not leave a page unwritten."""
    again = [i for i, rc in enumerate(got) if int(rc) == INVALID_PARAMS]
    if not again:
        return got
    logger.warning(
        "kvretention: the master refused %d soft pins; writing them unpinned", len(again)
    )
    retried = original(
        store,
        [keys[i] for i in again],
        [ptrs[i] for i in again],
        [sizes[i] for i in again],
        None if group_ids is None else [group_ids[i] for i in again],
        None if session_ids is None else [session_ids[i] for i in again],
    )
    out = list(got)
    for i, rc in zip(again, retried, strict=True):
        out[i] = int(rc)
    return out


def _put_pinned(
    store: Any,
    keys: list[str],
    ptrs: list[Any],
    sizes: list[Any],
    group_ids: list[str] | None,
    session_ids: list[str] | None,
    *,
    ttl_ms: int,
) -> list[int]:
    from mooncake.store import ReplicateConfig, SoftPinAction

    config = ReplicateConfig()
    config.soft_pin_action = SoftPinAction.ENABLE
    config.soft_pin_ttl_ms = ttl_ms
    if group_ids is not None and store._can_use_group_semantics():
        config.group_ids = group_ids
    if session_ids is not None:
        config.session_ids = session_ids
    if store._uses_multi_buffer(ptrs):
        result: list[int] = store.store.batch_put_from_multi_buffers(keys, ptrs, sizes, config)
    else:
        result = store.store.batch_put_from(keys, ptrs, sizes, config)
    return result


def _put_with_pins(
    original: Callable[..., list[int]], store: Any, *args: Any, **kwargs: Any
) -> list[int]:
    """AROUND ``MooncakeStore._put_batch_zero_copy_impl``; any failure of the plugin's own logic
    falls back to SGLang's unpinned put (a hint must never fail a write)."""
    try:
        return put_with_pins(store, original, *args, **kwargs)
    except Exception:
        logger.exception("kvretention: L3 pin hook failed; writing these pages unpinned")
        STATS.failed()
        return original(store, *args, **kwargs)


def register_l3_hooks(registry: Any = None) -> None:
    """Register the L3 hooks on SGLang's ``HookRegistry`` (or ``registry``, which has the same
    ``register(target, hook, hook_type)``); call from the plugin's ``register``."""
    if registry is None:
        from sglang.srt.plugins.hook_registry import HookRegistry

        registry = HookRegistry
    from sglang.srt.plugins.hook_registry import HookType

    hooks = {
        "_before_unified_checkpoint": _before_unified_checkpoint,
        "_put_with_pins": _put_with_pins,
    }
    for target in L3_HOOK_TARGETS:
        registry.register(target.target, hooks[target.hook], HookType[target.kind])

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

The same thread keeps reading the master (every :data:`MASTER_READ_S`) to see it restart: the
master keeps objects and pins in memory only, so a restart loses them all and tells no one. A
counter lower than at the previous reading is the sign (:mod:`~kvretention.retention.l3_master`);
the ledger then stops counting the pins written before (:meth:`PinLedger.drop_written_before`),
the restart is counted (``kvretention_l3_master_restarts_total``, ``kvretention_l3_pins_lost_total``),
logged once as a WARNING and traced (``l3_master_restart``). Pins are re-established only where
SGLang writes the page again: the retained pages stay in :class:`RetainedPages`, and the put hook
pins a page whose hold is live whenever it is put. SGLang 0.5.23 does not write them again by
itself: ``UnifiedRadixCache.write_backup_storage`` (a node's one backup to storage) has a single
caller, ``_finish_write_through_ack``, i.e. a node is backed up once, when its KV is first written
through to host memory; and ``MooncakeStore``'s set path asks ``_batch_exist`` first. So a
retained prefix still held in GPU or host memory stays unpinned and absent from Mooncake after a
master restart; it is written (and pinned) again only after the tree has evicted it from host
memory and a later request computes it anew (its L3 lookup now misses). The plugin cannot re-put
the pages itself: the put hook sees keys and buffers only while SGLang writes them.

This module is the SGLang glue and names the whole half. The pure parts are import-light and run in
the unit and L3 tests without SGLang: the settings (:mod:`~kvretention.retention.l3_settings`), the
retained pages (:mod:`~kvretention.retention.l3_pages`), the budget and each put's decision
(:mod:`~kvretention.retention.l3_budget`), and the metrics and trace
(:mod:`~kvretention.retention.l3_stats`).
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from kvretention.common.kvstore_metrics import parse_usage
from kvretention.common.tenancy import tenant_of_salt
from kvretention.retention.contract import L3_HOOK_TARGETS
from kvretention.retention.failures import COUNTS
from kvretention.retention.l3_budget import (
    OUTCOMES,
    Outcome,
    PagePut,
    PinLedger,
    client_budget_bytes,
    page_of,
    plan_puts,
)
from kvretention.retention.l3_master import MasterReading, detect_restart, read_master
from kvretention.retention.l3_pages import (
    MAX_TRACKED_PAGES,
    PageHold,
    RetainedPages,
    page_holds,
    page_keys,
    record_request,
)
from kvretention.retention.l3_settings import (
    CONFIG_PATH_ENV,
    DEFAULT_MAX_PIN_TTL_MS,
    SETTINGS_KEY,
    L3Settings,
    master_metrics_url,
    read_settings,
)
from kvretention.retention.l3_stats import (
    INDEX,
    STATS,
    L3Stats,
    report_master_restart,
    report_over_budget,
)

__all__ = [
    "CONFIG_PATH_ENV",
    "DEFAULT_MAX_PIN_TTL_MS",
    "INDEX",
    "L3_HOOK_TARGETS",
    "MAX_TRACKED_PAGES",
    "OUTCOMES",
    "SETTINGS_KEY",
    "STATS",
    "L3Settings",
    "L3Stats",
    "Outcome",
    "PageHold",
    "PagePut",
    "PinLedger",
    "RetainedPages",
    "client_budget_bytes",
    "client_state",
    "master_metrics_url",
    "namespace_seed",
    "page_holds",
    "page_keys",
    "page_of",
    "plan_puts",
    "pool_pinned_keys",
    "put_with_pins",
    "read_settings",
    "record_request",
    "register_l3_hooks",
    "remember_request",
    "report_over_budget",
]


logger = logging.getLogger(__name__)


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
        COUNTS.count("l3_record")
        logger.exception("kvretention: could not record the L3 holds of request %s", req.rid)


SETTINGS_REFRESH_S: Final = 30.0
"""How often a store client re-reads its settings: the kubelet updates the mounted ConfigMap in
place, so a new ``budgetRatio`` reaches running workers without a restart."""


POOL_READ_S: Final = 5.0
"""How often a new ledger reads the master's ``/metrics`` while part of its share is reserved."""
MASTER_READ_S: Final = 10.0
"""How often a store client reads the master's ``/metrics`` after that: the watch for a restart."""
POOL_READ_TIMEOUT_S: Final = 2.0
POOL_READ_MAX_BYTES: Final = 4 * 1024 * 1024


def pool_pinned_keys(metrics_text: str) -> int:
    """The objects the pool holds soft-pinned (``master_soft_pin_key_count``), through the
    ground floor's parser (the operator reads the master through it too); raises on text that is not a master's metrics."""
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
    closed: threading.Event = field(default_factory=threading.Event)
    """Set to end the master watch (tests; a worker's watch lives as long as its process)."""
    master_reads: int = 0
    """Readings of the master so far (tests wait on it)."""


def _watch_pool(state: _ClientState, url: str) -> None:
    """Off the write path, for the client's life: read the master's ``/metrics`` every
    :data:`POOL_READ_S` while part of the share is reserved (into the ledger's reservation),
    every :data:`MASTER_READ_S` after, and on a restart (:func:`detect_restart`) stop counting
    the pins it dropped. An unreadable master keeps the reservation (the budget holds; pins
    wait), logged once per outage."""
    warned = False
    last: MasterReading | None = None
    while not state.closed.is_set():
        at = time.time()
        try:
            reading = read_master(_read_metrics(url), at=at)
        except Exception as err:  # any failure keeps the reservation; never raise in a thread
            if not warned:
                logger.warning(
                    "kvretention: cannot read the master's metrics at %s (%s); %s",
                    url,
                    err,
                    "a restart is seen once it can"
                    if state.ledger.reservation_settled(time.time())
                    else "this worker's L3 pin share stays reserved until it can",
                )
                warned = True
        else:
            warned = False
            restart = None if last is None else detect_restart(last, reading)
            if restart is not None:
                pins, nbytes = state.ledger.drop_written_before(restart.lost_before)
                report_master_restart(
                    restart, url=url, pins=pins, nbytes=nbytes, ledger=state.ledger
                )
            last = reading
            state.ledger.observe_pool(reading.pinned_keys)
            state.master_reads += 1
            state.pool_read.set()
        STATS.publish(force=True)  # what the write path's last batches left for the worker
        settled = state.ledger.reservation_settled(time.time())
        if settled:
            state.pool_read.set()
        state.closed.wait(MASTER_READ_S if settled else POOL_READ_S)


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
    state.ledger.confirm_written(
        [put.page for put in pages.values() if put.outcome == "pinned"], at=time.time()
    )
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
        COUNTS.count("l3_put")  # what the worker's /metrics exports, across processes
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

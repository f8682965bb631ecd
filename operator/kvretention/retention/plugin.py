"""The SGLang plugin that applies ``kv.retain`` in the radix tree (device and HiCache host tiers).

SGLang's plugin loader calls :func:`register` (entry point ``kvretention`` in ``sglang.srt.plugins``)
in every process before server args are parsed. It adds the ``kvretain`` choice to
``--radix-eviction-policy`` and registers hooks through ``HookRegistry`` only:

- the ``kvretain`` eviction strategy: unretained and expired nodes go first, then by hold
  priority, recency among equals (both trees rank nodes through this one strategy, the unified
  tree for its device *and* host leaves);
- after a request's KV enters the tree (``checkpoint``), the nodes covering its retained ranges
  get its scope's hold (priority, ``now + duration``); priority 0 releases it; the tree is split
  at hold edges so no node is half retained;
- a node split copies the holds to the new parent;
- where SGLang builds its default Rust TreeCore, ``kvretain`` keeps it (LRU order) and carries the
  holds as pins instead (:mod:`kvretention.retention.pins`: the calls the core has for that, within
  a budget of the pool); the holds above rank nodes only where SGLang resolves to its Python core
  (its own fallbacks, ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python``, EAGLE's bigram keys)
  (docs/retention.md, "Which tree core"); the core each tree resolves to is recorded for the
  worker's ``/metrics`` (:mod:`kvretention.retention.tree_core`);
- and :func:`kvretention.retention.l3.register_l3_hooks`: HiCache's Mooncake writes of retained
  pages carry a soft pin, within the budget.

Radix holds apply only on a tree whose policy is ``kvretain``; anything else is left as SGLang has
it. The checkpoint hook fails open: whatever it raises is logged, counted in
:data:`kvretention.retention.failures.COUNTS` (the worker's ``/metrics`` exports it as
``kvretention_retention_hook_failures_total``) and the request is served unretained.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from kvretention.retention import EVICTION_POLICY, PLUGIN_NAME, pin_stats, pins, radix, tree_core
from kvretention.retention.contract import HOOK_TARGETS
from kvretention.retention.directives import Hold, holds_for, read_retain
from kvretention.retention.failures import COUNTS

logger = logging.getLogger(__name__)


class RetainStrategy:
    """SGLang eviction strategy for ``--radix-eviction-policy kvretain`` (duck-typed like
    ``evict_policy.EvictionStrategy``: only ``get_priority`` is called).

    Holds expire by the monotonic clock (:data:`radix.clock`); a tree spread over several ranks
    (tensor or pipeline parallel) expires them by ``agreed_now`` instead, the time all ranks agreed
    on at the last checkpoint that had a hold at stake, so every rank evicts the same nodes.
    """

    def __init__(self) -> None:
        self.agreed_now: float | None = None
        self.held_until: float | None = None
        """The latest expiry of any hold set on this tree (``inf``: one never expires); None
        before the first. Every rank sets the same holds at the same agreed time, so every rank
        reads the same value here."""

    def now(self) -> float:
        return radix.clock() if self.agreed_now is None else self.agreed_now

    def note(self, holds: tuple[Hold, ...]) -> None:
        """Holds about to be set: what :meth:`at_stake` reads later."""
        untils = [float("inf") if h.until is None else h.until for h in holds if not h.releases]
        if untils:
            self.held_until = max(self.held_until or 0.0, *untils)

    def at_stake(self, *, hinted: bool) -> bool:
        """Whether a checkpoint needs the ranks' agreed time: a hinted request may set holds, and
        holds set earlier may still be live (by :meth:`now`: on several ranks, the last agreed
        time, set by the hinted request that set the first hold). Same answer on every rank: the
        requests, the holds and the agreed time are the same everywhere."""
        return hinted or (self.held_until is not None and self.held_until > self.now())

    def get_priority(self, node: Any) -> float:
        # An eviction pass ranks every evictable leaf, most of them held by nothing: those cost
        # one attribute read more than LRU, and no clock read.
        if not hasattr(node, radix.RANK_ATTR):
            return node.last_access_time  # type: ignore[no-any-return]
        return radix.eviction_key(node, self.now())


def _eviction_strategy(original: Any, eviction_policy: str, config: Any = None) -> Any:
    if eviction_policy.lower() != EVICTION_POLICY:
        return original(eviction_policy, config)
    if config:
        raise ValueError(
            f"--radix-eviction-policy-config: the {EVICTION_POLICY} policy takes no parameters, "
            f"got {sorted(config)}"
        )
    return RetainStrategy()


def _tree_core_backend(original: Any, name: str, params: Any) -> Any:
    policy = str(params.eviction_policy)
    resolved = str(original(name, params))  # SGLang's own fallbacks first
    backend = tree_core.plan_tree_core(policy, default=resolved)
    if backend == tree_core.PINNED and getattr(params, "is_eagle", False):
        backend = tree_core.PYTHON  # bigram keys: the pins' prefix match reads token keys
    if backend != resolved:
        _register_pinned_backend()
        logger.info("kvretention: %s on SGLang's %s TreeCore", EVICTION_POLICY, backend)
    # For the worker's /metrics (kvretention_worker_radix_core_info): the core this tree runs.
    tree_core.record_tree_core(core=tree_core.core_label(backend), policy=policy.lower())
    return backend


def _register_pinned_backend() -> None:
    """Register :data:`tree_core.PINNED` with SGLang's tree-core registry, once per process."""
    from sglang.srt.mem_cache.unified_cache import tree_core_registry as registry

    if tree_core.PINNED not in registry.registered_tree_core_backends():
        registry.register_tree_core_backend(tree_core.PINNED, _pinned_rust_core)


def _pinned_rust_core(params: Any, _components: Any) -> Any:
    """SGLang's Rust TreeCore in LRU order, with a :class:`pins.PinTable` for the holds."""
    from dataclasses import replace

    from sglang.srt.mem_cache.rust_tree_core.adapter import RustUnifiedTreeCore

    core = RustUnifiedTreeCore(replace(params, eviction_policy="lru", eviction_policy_config=None))
    cap = pins.pin_cap(_pool_tokens(params), _context_tokens(), _pin_ratio())
    table = pins.PinTable(core, cap_tokens=cap)
    setattr(core, pins.ATTR, table)
    reset = core.reset

    def reset_and_forget() -> None:  # a reset tree (flush_cache) has no pins left to release
        reset()
        table.forget()

    core.reset = reset_and_forget
    logger.info("kvretention: radix pins may keep %d tokens of the device pool protected", cap)
    return core


def _pool_tokens(params: Any) -> int:
    allocator = getattr(params, "token_to_kv_pool_allocator", None)
    return int(getattr(allocator, "size", 0) or 0)


def _context_tokens() -> int:
    """The longest request the engine admits (SGLang's model context), 0 when unknown."""
    try:
        from sglang.srt.runtime_context import get_model

        return int(get_model().context_length or 0)
    except Exception:  # no model context in this process (a test's bare tree)
        return 0


def _pin_ratio() -> float:
    raw = os.environ.get(pins.RATIO_ENV, "")
    try:
        ratio = float(raw) if raw else pins.DEFAULT_RATIO
    except ValueError:
        ratio = -1.0
    if not 0 < ratio <= 1:
        logger.warning(
            "kvretention: %s=%r is not in (0, 1]; using %s", pins.RATIO_ENV, raw, pins.DEFAULT_RATIO
        )
        return pins.DEFAULT_RATIO
    return ratio


def _bigram(holds: tuple[Hold, ...], page_size: int) -> tuple[Hold, ...]:
    """EAGLE keys are token pairs: key position ``i`` spans tokens ``i, i+1``, so exact token
    holds ``[start, end)`` become key positions ``[start, end - 1)``, then whole pages inwards."""
    out = []
    for h in holds:
        start = -(-h.start // page_size) * page_size
        end = (h.end - 1) // page_size * page_size
        if end > start:
            out.append(Hold(start, end, h.priority, h.until))
    return tuple(out)


def _multi_rank(cache: Any) -> bool:
    """Whether the unified tree is mirrored on other ranks that must evict in step with it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    groups = [
        g for g in (cache.tp_group, cache.attn_cp_group, cache.attn_tp_group) if g is not None
    ]
    return cache.pp_size > 1 or any(dist.get_world_size(group=g) > 1 for g in groups)


def agree_on_now(cache: Any, strategy: RetainStrategy) -> float:
    """The time this checkpoint sets holds by and later evictions expire them by.

    One rank: its monotonic clock. Several ranks: the earliest of their clocks, reduced with
    SGLang's own ``UnifiedRadixCache._all_reduce`` (every rank checkpoints the same requests in
    the same order and asks :meth:`RetainStrategy.at_stake` the same question, so every rank
    reaches this reduction or none does), so a hold expires on the same pass everywhere.

    The clocks are monotonic, and the minimum still compares like with like: ranks on one host
    read one ``CLOCK_MONOTONIC``; ranks on several hosts (multinode) read clocks with different
    origins, but each is ``t + c_host``, so their minimum is ``t + min(c)``, itself a monotonic
    clock that ticks in seconds. Holds are set and expired by that one agreed value only, never
    by a rank's own reading, so the origin never shows.
    """
    if not _multi_rank(cache):
        return radix.clock()
    strategy.agreed_now = _earliest_clock(cache)
    return strategy.agreed_now


def _earliest_clock(cache: Any) -> float:
    """The earliest of the ranks' clocks (every rank must call it, in the same order)."""
    import torch

    now = torch.tensor([radix.clock()], dtype=torch.float64)
    cache._all_reduce(now, torch.distributed.ReduceOp.MIN)
    return float(now.item())


def _pins_now(cache: Any, table: pins.PinTable, *, hinted: bool) -> float:
    """The time pins are set and expired by: the ranks' earliest clock when a pin is at stake on
    a tree spread over ranks (the same question on every rank: same requests, same pins)."""
    at_stake = hinted or len(table) > 0
    if at_stake and _multi_rank(cache):
        table.agreed_now = _earliest_clock(cache)
        return table.agreed_now
    return radix.clock()


def hold_request(
    cache: Any,
    req: Any,
    *,
    tokens: Any,
    leaf: Any,
    is_bigram: bool,
    now: float,
    strategy: RetainStrategy | None = None,
) -> int:
    """Apply ``req``'s ``kv.retain`` holds to the path its KV occupies in ``cache``; the number
    of nodes changed (0 for an unhinted request). ``strategy`` notes the holds set."""
    plan = read_retain(getattr(req, "kv_hints", None))
    if plan is None:
        return 0
    page_size = int(cache.page_size)
    holds = holds_for(
        plan,
        seq_len=len(tokens),
        page_size=1 if is_bigram else page_size,  # bigram keys round after the shift
        now=now,
        prompt_len=len(req.origin_input_ids),
    )
    if is_bigram:
        holds = _bigram(holds, page_size)
    if not holds:
        return 0
    if strategy is not None:
        strategy.note(holds)
    from sglang.srt.mem_cache.radix_cache import RadixKey

    extra = 1 if is_bigram else 0
    for edge in radix.boundaries(holds, radix.path_spans(leaf())):
        # A prefix match that ends inside a node splits it there (SGLang's own split).
        cache.touch_prefix(
            RadixKey(tokens[: edge + extra], req.extra_key, cache_salt=req.cache_salt)
        )
    return radix.apply_holds(radix.path_spans(leaf()), holds, scope=plan.scope, now=now)


def _count_failure(hook: str, message: str, *args: Any) -> None:
    """Count a fail-open fallback of ``hook`` (a :data:`~kvretention.retention.failures.FALLBACKS`
    key) for the worker's ``/metrics`` and log it with its traceback, the first and every
    thousandth time (a hook failing on every request must not flood the log). Call it inside the
    ``except``; ``message`` takes ``args`` and then this process's count (``%d``)."""
    failures = COUNTS.count(hook)
    if failures == 1 or failures % 1000 == 0:
        logger.exception("%s: " + message, PLUGIN_NAME, *args, failures)


def _hold_or_log(cache: Any, req: Any, *, now: Callable[[], float], **kwargs: Any) -> bool:
    """Apply the holds, failing open: a retention bug must never take the scheduler down. The
    time (``now``: the ranks' agreement included) is taken inside the guard. False when the holds
    were not applied: the failure is counted for the worker's ``/metrics`` and logged (the first
    and every thousandth time)."""
    try:
        hold_request(cache, req, now=now(), **kwargs)
    except Exception:
        _count_failure(
            "checkpoint",
            "kv.retain not applied to request %s (%d so far); serving goes on",
            getattr(req, "rid", "?"),
        )
        return False
    return True


def _unified_now(cache: Any, req: Any, strategy: RetainStrategy) -> float:
    """The checkpoint's time: the ranks agree on it only when a hold is at stake (no all-reduce
    for an unhinted request on a tree with no live hold)."""
    hinted = getattr(req, "kv_hints", None) is not None
    if strategy.at_stake(hinted=hinted):
        return agree_on_now(cache, strategy)
    return strategy.now()  # unhinted: read by no hold


def pin_request(cache: Any, req: Any, table: pins.PinTable, *, up_to: int) -> int:
    """Expire due pins, then pin ``req``'s holds on the path its KV occupies (within the budget);
    the pins added (0 for an unhinted request)."""
    now = _pins_now(cache, table, hinted=getattr(req, "kv_hints", None) is not None)
    table.expire(now)
    plan = read_retain(getattr(req, "kv_hints", None))
    added = 0
    if plan is not None:
        tokens = req.full_untruncated_fill_ids[:up_to]
        holds = holds_for(
            plan,
            seq_len=len(tokens),
            page_size=int(cache.page_size),
            now=now,
            prompt_len=len(req.origin_input_ids),
        )
        from sglang.srt.mem_cache.radix_cache import RadixKey

        def key_for(end: int) -> Any:
            return RadixKey(tokens[:end], req.extra_key, cache_salt=req.cache_salt)

        for end in sorted({h.end for h in holds if not h.releases}):
            cache.touch_prefix(key_for(end))  # split there: a pin ends where its hold does
        added = table.hold(plan.scope, holds, key_for)
    pin_stats.record_pins(table)
    return added


def _pin_or_log(cache: Any, req: Any, table: pins.PinTable, *, up_to: int) -> bool:
    """:func:`pin_request`, failing open as :func:`_hold_or_log` does."""
    try:
        pin_request(cache, req, table, up_to=up_to)
    except Exception:
        _count_failure(
            "checkpoint",
            "kv.retain not pinned for request %s (%d so far); serving goes on",
            getattr(req, "rid", "?"),
        )
        return False
    return True


def _after_unified_checkpoint(_result: Any, cache: Any, req: Any, *, up_to: int, **_: Any) -> None:
    core = cache.tree_core
    table = getattr(core, pins.ATTR, None)
    if isinstance(table, pins.PinTable):
        if not cache.disable:
            _pin_or_log(cache, req, table, up_to=up_to)
        return
    strategy = getattr(core, "eviction_strategy", None)
    if cache.disable or not isinstance(strategy, RetainStrategy):
        return
    _hold_or_log(
        cache,
        req,
        tokens=req.full_untruncated_fill_ids[:up_to],
        leaf=lambda: cache.resolve_node_handle(req.last_node),
        is_bigram=bool(core.is_eagle),
        now=lambda: _unified_now(cache, req, strategy),
        strategy=strategy,
    )


def _before_unified_evict(cache: Any, *_: Any, **__: Any) -> None:
    """BEFORE an eviction pass of a tree spread over ranks: agree on the time again while a hold
    may still be live. Between checkpoints the ranks' last agreed time stands still, so after an
    idle spell a hold that has expired would still rank as live in the first pass. Every rank
    enters the pass in step (SGLang checks ``evict`` and ``evict_for_alloc`` for rank consensus)
    and asks the same question of the same state, so every rank reaches the reduction or none
    does. One rank (no agreed time) reads its own clock in the pass and skips this. Fails open:
    the pass then ranks by the last agreed time, as before."""
    table = getattr(cache.tree_core, pins.ATTR, None)
    if isinstance(table, pins.PinTable):
        _unpin_due_or_log(cache, table)
        return
    strategy = getattr(cache.tree_core, "eviction_strategy", None)
    if cache.disable or not isinstance(strategy, RetainStrategy) or strategy.agreed_now is None:
        return
    if not strategy.at_stake(hinted=False):
        return
    try:
        agree_on_now(cache, strategy)
    except Exception:
        _count_failure(
            "evict",
            "ranks could not agree on the time before an eviction (%d so far); the pass ranks "
            "holds by the last agreed time",
        )


def _unpin_due_or_log(cache: Any, table: pins.PinTable) -> None:
    """Before an eviction pass on the pinned Rust core: drop expired pins, so the pass can take
    what they kept. Fails open: the pass then runs with the pins as they are."""
    if cache.disable or len(table) == 0:
        return
    try:
        table.expire(_pins_now(cache, table, hinted=False))
        pin_stats.record_pins(table)
    except Exception:
        _count_failure("evict", "expired radix pins not dropped before an eviction (%d so far)")


def _after_radix_checkpoint(_result: Any, cache: Any, req: Any, *, up_to: int) -> None:
    if cache.disable or not isinstance(cache.eviction_strategy, RetainStrategy):
        return
    _hold_or_log(
        cache,
        req,
        tokens=req.full_untruncated_fill_ids[:up_to],
        leaf=lambda: req.last_node,
        is_bigram=bool(cache.is_eagle),
        now=radix.clock,  # the classic tree has no ranks to agree with
        strategy=cache.eviction_strategy,
    )


# Hook parameters carry SGLang's own names: HookRegistry passes its call's arguments through.
def _after_unified_split(result: Any, _core: Any, key: Any, child: Any, split_len: int) -> None:
    new_parent, _action = result
    radix.copy_holds(child, new_parent)


def _after_radix_split(result: Any, _cache: Any, key: Any, child: Any, split_len: int) -> None:
    radix.copy_holds(child, result)


def hooks() -> dict[str, tuple[Any, str]]:
    """Each hook target and ``(plugin function, HookType name)``, from :data:`HOOK_TARGETS`."""
    return {t.target: (globals()[t.hook], t.kind) for t in HOOK_TARGETS}


def register() -> None:
    """Entry point for SGLang's plugin loader (``sglang.srt.plugins``: ``kvretention``)."""
    from sglang.srt.arg_groups.choices import (
        RADIX_EVICTION_POLICY_CHOICES,
        add_radix_eviction_policy_choices,
    )
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if EVICTION_POLICY not in RADIX_EVICTION_POLICY_CHOICES:
        add_radix_eviction_policy_choices([EVICTION_POLICY])
    for target, (hook, kind) in hooks().items():
        HookRegistry.register(target, hook, HookType[kind])
    from kvretention.retention.l3 import register_l3_hooks

    register_l3_hooks(HookRegistry)  # the Mooncake tier: soft pins within the budget
    logger.info(
        "%s: --radix-eviction-policy %s and %d hooks",
        PLUGIN_NAME,
        EVICTION_POLICY,
        len(HOOK_TARGETS),
    )


__all__ = ["RetainStrategy", "agree_on_now", "hold_request", "hooks", "pin_request", "register"]

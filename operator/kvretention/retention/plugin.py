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
- ``kvretain`` runs on SGLang's Python TreeCore (the Rust core keeps nodes out of reach);
- and :func:`kvretention.retention.l3.register_l3_hooks`: HiCache's Mooncake writes of retained
  pages carry a soft pin, within the budget.

Radix holds apply only on a tree whose policy is ``kvretain``; anything else is left as SGLang has
it.
"""

from __future__ import annotations

import logging
from typing import Any

from kvretention.retention import EVICTION_POLICY, PLUGIN_NAME, radix
from kvretention.retention.contract import HOOK_TARGETS
from kvretention.retention.directives import Hold, holds_for, read_retain

logger = logging.getLogger(__name__)


class RetainStrategy:
    """SGLang eviction strategy for ``--radix-eviction-policy kvretain`` (duck-typed like
    ``evict_policy.EvictionStrategy``: only ``get_priority`` is called).

    Holds expire by the wall clock; a tree spread over several ranks (tensor or pipeline
    parallel) expires them by ``agreed_now`` instead, the time all ranks agreed on at the last
    checkpoint, so every rank evicts the same nodes.
    """

    def __init__(self) -> None:
        self.agreed_now: float | None = None

    def now(self) -> float:
        return radix.clock() if self.agreed_now is None else self.agreed_now

    def get_priority(self, node: Any) -> tuple[int, float]:
        return radix.eviction_rank(node, self.now())


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
    if name == "rust" and str(params.eviction_policy).lower() == EVICTION_POLICY:
        logger.info("kvretention: %s runs on SGLang's Python TreeCore", EVICTION_POLICY)
        return "python"
    return original(name, params)


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

    One rank: the wall clock. Several ranks: the earliest of their clocks, reduced with SGLang's
    own ``UnifiedRadixCache._all_reduce`` (every rank checkpoints the same requests in the same
    order, so every rank reaches this reduction), so a hold expires on the same pass everywhere.
    """
    if not _multi_rank(cache):
        return radix.clock()
    import torch

    now = torch.tensor([radix.clock()], dtype=torch.float64)
    cache._all_reduce(now, torch.distributed.ReduceOp.MIN)
    strategy.agreed_now = float(now.item())
    return strategy.agreed_now


def hold_request(
    cache: Any, req: Any, *, tokens: Any, leaf: Any, is_bigram: bool, now: float
) -> int:
    """Apply ``req``'s ``kv.retain`` holds to the path its KV occupies in ``cache``; the number
    of nodes changed (0 for an unhinted request)."""
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
    from sglang.srt.mem_cache.radix_cache import RadixKey

    extra = 1 if is_bigram else 0
    for edge in radix.boundaries(holds, radix.path_spans(leaf())):
        # A prefix match that ends inside a node splits it there (SGLang's own split).
        cache.touch_prefix(
            RadixKey(tokens[: edge + extra], req.extra_key, cache_salt=req.cache_salt)
        )
    return radix.apply_holds(radix.path_spans(leaf()), holds, scope=plan.scope, now=now)


hold_failures = 0
"""Checkpoints whose holds could not be applied (logged; the request is served regardless)."""


def _hold_or_log(cache: Any, req: Any, **kwargs: Any) -> None:
    """Apply the holds, failing open: a retention bug must never take the scheduler down."""
    global hold_failures
    try:
        hold_request(cache, req, **kwargs)
    except Exception:
        hold_failures += 1
        if hold_failures == 1 or hold_failures % 1000 == 0:
            logger.exception(
                "%s: kv.retain not applied to request %s (%d so far); serving goes on",
                PLUGIN_NAME,
                getattr(req, "rid", "?"),
                hold_failures,
            )


def _after_unified_checkpoint(_result: Any, cache: Any, req: Any, *, up_to: int, **_: Any) -> None:
    core = cache.tree_core
    strategy = getattr(core, "eviction_strategy", None)
    if cache.disable or not isinstance(strategy, RetainStrategy):
        return
    now = agree_on_now(cache, strategy)  # on every checkpoint, hinted or not: time moves on
    _hold_or_log(
        cache,
        req,
        tokens=req.full_untruncated_fill_ids[:up_to],
        leaf=lambda: cache.resolve_node_handle(req.last_node),
        is_bigram=bool(core.is_eagle),
        now=now,
    )


def _after_radix_checkpoint(_result: Any, cache: Any, req: Any, *, up_to: int) -> None:
    if cache.disable or not isinstance(cache.eviction_strategy, RetainStrategy):
        return
    _hold_or_log(
        cache,
        req,
        tokens=req.full_untruncated_fill_ids[:up_to],
        leaf=lambda: req.last_node,
        is_bigram=bool(cache.is_eagle),
        now=radix.clock(),  # the classic tree has no ranks to agree with
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


__all__ = ["RetainStrategy", "agree_on_now", "hold_request", "hooks", "register"]

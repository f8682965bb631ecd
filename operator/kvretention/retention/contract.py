"""The SGLang 0.5.23 targets the retention plugin hooks, with the parameters it relies on.

Import-light: the probe and the contract test read :data:`HOOK_TARGETS` and run :func:`check_targets`
against whatever SGLang is installed. A target that moved, vanished or changed its parameters is a
finding (the plugin would silently do nothing), never a crash.
"""

from __future__ import annotations

import inspect
import pkgutil
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class HookTarget:
    """A dotted SGLang target, the parameter names (in order) the hook relies on, and the
    plugin function hooked on it (``kind``: SGLang's ``HookType`` name)."""

    target: str
    parameters: tuple[str, ...]
    hook: str
    kind: str
    why: str


EVICTION_CHOICES: Final = "sglang.srt.arg_groups.choices.add_radix_eviction_policy_choices"
"""SGLang's own way to add a ``--radix-eviction-policy`` choice (called, not hooked)."""

HOOK_TARGETS: Final = (  # the radix tiers'; L3_HOOK_TARGETS has the Mooncake tier's
    HookTarget(
        "sglang.srt.mem_cache.utils.get_eviction_strategy",
        ("eviction_policy", "config"),
        "_eviction_strategy",
        "AROUND",
        "builds the kvretain eviction strategy for both radix trees",
    ),
    HookTarget(
        "sglang.srt.mem_cache.unified_cache.tree_core_registry.resolve_tree_core_backend",
        ("name", "params"),
        "_tree_core_backend",
        "AROUND",
        "puts kvretain on SGLang's Rust TreeCore with holds as pins (Python where SGLang falls back)",
    ),
    HookTarget(
        "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.checkpoint_into_tree",
        ("self", "req", "up_to", "kwargs"),
        "_after_unified_checkpoint",
        "AFTER",
        "where a request's KV enters the unified tree (device and HiCache host tiers)",
    ),
    HookTarget(
        "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.evict",
        ("self", "params"),
        "_before_unified_evict",
        "BEFORE",
        "ranks agree on the time again before an eviction pass while a hold may be live",
    ),
    HookTarget(
        "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.evict_for_alloc",
        ("self", "params", "allocation_reclaim_satisfied"),
        "_before_unified_evict",
        "BEFORE",
        "the same for the allocator's eviction passes",
    ),
    HookTarget(
        "sglang.srt.mem_cache.unified_cache.unified_tree_core.UnifiedTreeCore._split_node",
        ("self", "key", "child", "split_len"),
        "_after_unified_split",
        "AFTER",
        "a split keeps the holds on the new parent",
    ),
    HookTarget(
        "sglang.srt.mem_cache.radix_cache.RadixCache.checkpoint",
        ("self", "req", "up_to"),
        "_after_radix_checkpoint",
        "AFTER",
        "where a request's KV enters the classic radix tree",
    ),
    HookTarget(
        "sglang.srt.mem_cache.radix_cache.RadixCache._split_node",
        ("self", "key", "child", "split_len"),
        "_after_radix_split",
        "AFTER",
        "a split keeps the holds on the new parent",
    ),
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
"""What the L3 hooks (:mod:`kvretention.retention.l3`) rely on in SGLang 0.5.23 (checked by the
contract test)."""


CALLED_TARGETS: Final = (
    HookTarget(
        "sglang.srt.mem_cache.unified_cache.tree_core_registry.register_tree_core_backend",
        ("name", "factory"),
        "",
        "CALL",
        "registers kvretain's backend: the Rust TreeCore with holds as pins",
    ),
    HookTarget(
        "sglang.srt.mem_cache.rust_tree_core.adapter.RustUnifiedTreeCore",
        ("params",),
        "",
        "CALL",
        "the Rust TreeCore the pinned backend builds (in LRU order)",
    ),
    HookTarget(
        "sglang.srt.mem_cache.rust_tree_core.adapter.RustUnifiedTreeCore.match_full_device_prefix",
        ("self", "key"),
        "",
        "CALL",
        "the node where a hold's prefix ends (read-only)",
    ),
    HookTarget(
        "sglang.srt.mem_cache.rust_tree_core.adapter.RustUnifiedTreeCore.inc_full_pin",
        ("self", "node_id"),
        "",
        "CALL",
        "pins a hold's prefix",
    ),
    HookTarget(
        "sglang.srt.mem_cache.rust_tree_core.adapter.RustUnifiedTreeCore.dec_full_pin",
        ("self", "node_id"),
        "",
        "CALL",
        "unpins it (expiry, release, budget)",
    ),
    HookTarget(
        "sglang.srt.mem_cache.rust_tree_core.adapter.RustUnifiedTreeCore.collect_path_info",
        ("self", "end_node_ids"),
        "",
        "CALL",
        "the node ids on a pin's path (older pins it replaces, the budget's union)",
    ),
    HookTarget(
        "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.touch_prefix",
        ("self", "key"),
        "",
        "CALL",
        "splits the tree at a hold's edge (a prefix walk that ends inside a node splits it)",
    ),
    HookTarget(
        "sglang.srt.mem_cache.radix_cache.RadixCache.touch_prefix",
        ("self", "key"),
        "",
        "CALL",
        "the same on the classic tree",
    ),
    HookTarget(
        "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.resolve_node_handle",
        ("self", "node_handle"),
        "",
        "CALL",
        "the node a request's ``last_node`` id names",
    ),
    HookTarget(
        "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache._all_reduce",
        ("self", "data", "tp_reduce_op"),
        "",
        "CALL",
        "ranks agree on the time holds expire by",
    ),
)
"""SGLang methods the plugin calls (not hooks): checked like the hook targets."""


def _original(obj: object) -> object:
    """Behind SGLang's hook wrappers (``__wrapped__``) to the function itself."""
    return inspect.unwrap(obj)  # type: ignore[arg-type]


def check_target(target: HookTarget) -> str | None:
    """What is wrong with one target in the installed SGLang; None when it is as expected."""
    try:
        obj = pkgutil.resolve_name(target.target)
    except (ImportError, AttributeError, ValueError) as error:
        return f"{target.target}: not found ({error})"
    if not callable(obj):
        return f"{target.target}: not callable"
    found = tuple(inspect.signature(_original(obj)).parameters)  # type: ignore[arg-type]
    if found != target.parameters:
        return f"{target.target}: parameters {found}, the plugin expects {target.parameters}"
    return None


def plugin_targets() -> tuple[HookTarget, ...]:
    """Everything the plugin hooks: the radix tiers' targets and the L3 (Mooncake) ones."""
    return (*HOOK_TARGETS, *L3_HOOK_TARGETS)


def check_targets() -> list[str]:
    """Every problem with the plugin's hook targets (radix and L3) and the choices extension;
    empty when all match. What the probe reports as "finds its hook targets"."""
    targets = (*plugin_targets(), *CALLED_TARGETS)
    problems = [p for t in targets if (p := check_target(t)) is not None]
    try:
        pkgutil.resolve_name(EVICTION_CHOICES)
    except (ImportError, AttributeError, ValueError) as error:
        problems.append(f"{EVICTION_CHOICES}: not found ({error})")
    return problems

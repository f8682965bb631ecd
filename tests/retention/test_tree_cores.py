"""Why ``kvretain`` carries its holds as pins on SGLang's default (Rust) TreeCore: what that core
of the installed SGLang offers a plugin (docs/retention.md, "Which tree core"). Each test pins one
fact; when an SGLang upgrade changes it, the test fails and the plugin's use of the core is worth
revisiting.
"""

from __future__ import annotations

import pytest

from kvretention.retention import EVICTION_POLICY, tree_core
from support.sglang_radix import RadixTree, TreeSpec

pytestmark = pytest.mark.retention

PAGE = 4
BLOCK = 16


def _tokens(i: int, n: int = BLOCK) -> list[int]:
    return list(range(1000 * (i + 1), 1000 * (i + 1) + n))


def test_sglangs_default_core_is_rust_and_kvretain_keeps_it() -> None:
    stock = RadixTree(TreeSpec(kind="unified", policy="priority", page_size=PAGE))
    assert stock.cache._tree_core_backend == "rust"
    assert type(stock.cache.tree_core).__name__ == "RustUnifiedTreeCore"
    kept = RadixTree(TreeSpec(kind="unified", policy=EVICTION_POLICY, page_size=PAGE))
    assert kept.cache._tree_core_backend == tree_core.PINNED
    assert type(kept.cache.tree_core).__name__ == "RustUnifiedTreeCore"


def test_the_rust_core_pins_a_prefix_and_lets_it_go() -> None:
    """What the pins stand on: ``inc_full_pin`` on the node where a prefix ends keeps it through
    pressure that evicts everything else; ``dec_full_pin`` makes it evictable again, LRU's oldest."""
    tree = RadixTree(TreeSpec(kind="unified", policy="lru", page_size=PAGE, tokens=3 * BLOCK))
    core = tree.cache.tree_core
    tree.run(_tokens(0))
    matched, node, pinned = core.match_full_device_prefix(tree.key(_tokens(0)))
    assert (matched, pinned) == (BLOCK, BLOCK)
    core.inc_full_pin(node)
    tree.run(_tokens(1, 2 * BLOCK))  # fills the pool
    tree.run(_tokens(2, 2 * BLOCK))  # pressure: all but the pinned block must go
    assert core.match_full_device_prefix(tree.key(_tokens(0)))[0] == BLOCK  # read-only match
    assert core.match_full_device_prefix(tree.key(_tokens(1, 2 * BLOCK)))[0] == 0
    core.dec_full_pin(node)
    tree.run(_tokens(3, BLOCK))  # one block must go: the unpinned one, now LRU's oldest
    assert [tree.cached(_tokens(0)), tree.cached(_tokens(2, 2 * BLOCK))] == [0, 2 * BLOCK]


def test_the_rust_core_takes_policy_names_only() -> None:
    from sglang.srt.mem_cache.rust_tree_core.extension import bindings

    params = bindings.TreeCoreInitParamsBinding(
        eviction_policy=EVICTION_POLICY,
        slru_protected_threshold=2,
        tlru_tail_budget=0,
        tlru_float_config=None,
        page_size=PAGE,
        is_write_back=False,
        enable_hicache=False,
        write_through_threshold=256,
        device="cpu",
        swa_sliding_window_size=None,
        swa_req_ring=False,
        enable_kv_cache_events=False,
        dynamo_kv_event_format=False,
        mamba_cache_chunk_size=None,
        mamba_max_states_per_path=None,
    )
    with pytest.raises(ValueError, match="Unknown eviction policy: kvretain"):
        bindings.RustUnifiedTreeCoreBinding(params, [0])


def test_the_rust_core_keeps_its_nodes_and_their_priorities_out_of_reach() -> None:
    from sglang.srt.mem_cache.rust_tree_core.extension import bindings

    tree = RadixTree(TreeSpec(kind="unified", policy="priority", page_size=PAGE))
    with pytest.raises(NotImplementedError):
        tree.cache.tree_core.node_by_id(0)
    methods = [m for m in dir(bindings.RustUnifiedTreeCoreBinding) if "priorit" in m.lower()]
    assert methods == []  # nothing reads or sets a node's priority


def test_a_priority_set_at_insert_is_never_lowered_on_the_rust_core() -> None:
    """What expiry and release would need: inserting the same prefix at priority 0 leaves it at
    50, so it still outlives a prefix at 10 when one of them must go."""
    tree = RadixTree(TreeSpec(kind="unified", policy="priority", page_size=PAGE, tokens=3 * BLOCK))
    tree.run(_tokens(0), priority=50)
    tree.run(_tokens(1), priority=10)
    tree.run(_tokens(0), priority=0)
    tree.run(_tokens(2, 2 * BLOCK))  # pressure: one of the two goes
    assert [tree.cached(_tokens(i)) for i in range(2)] == [BLOCK, 0]

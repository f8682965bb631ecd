"""kv.retain applied inside SGLang's radix trees (device tier, and HiCache's host tier).

Each test builds SGLang's own cache over CPU pools (``UnifiedRadixCache``, what 0.5.23 builds
with or without ``--enable-hierarchical-cache``, and the classic ``RadixCache``), with the plugin
that SGLang's plugin loader found through its entry point, and runs requests the way SGLang's
scheduler does. What is asserted is what SGLang itself reports: the cached prefix a later request
matches (``device_prefix_len`` / ``host_hit_length``).
"""

from __future__ import annotations

import inspect
import pkgutil
from typing import Any

import pytest

from kvretention.retention import EVICTION_POLICY, HOLD_UNTIL_ATTR, pins, radix, tree_core
from kvretention.retention.contract import HOOK_TARGETS
from kvretention.retention.plugin import RetainStrategy
from support.sglang_radix import FakeClock, RadixTree, TreeSpec, retain, retain_hints

pytestmark = pytest.mark.retention

KINDS = ["unified", "radix"]
"""Trees whose nodes carry the holds: the unified cache on SGLang's Python core, the classic one."""
PINNED = "pinned"
"""The unified cache on SGLang's default (Rust) core, where ``kvretain`` holds are pins."""
ORDER_KINDS = [*KINDS, PINNED]
"""Kinds for the tests that read what SGLang evicts, not the holds on nodes."""
PAGE = 4
BLOCK = 16  # tokens per request in the pressure tables: four pages


def _tokens(i: int, n: int = BLOCK) -> list[int]:
    return list(range(1000 * (i + 1), 1000 * (i + 1) + n))


def _tree(kind: str, *, policy: str = EVICTION_POLICY, tokens: int = 4 * BLOCK) -> RadixTree:
    core = {"unified": "python", PINNED: None}.get(kind)
    spec = TreeSpec(
        kind="radix" if kind == "radix" else "unified",
        policy=policy,
        page_size=PAGE,
        tokens=tokens,
        tree_core=core,
    )
    return RadixTree(spec)


@pytest.fixture(params=KINDS)
def tree(request: pytest.FixtureRequest) -> RadixTree:
    """Each kind of tree, with room for eight requests' blocks (a test that needs another size or
    policy builds its own)."""
    return _tree(request.param, tokens=8 * BLOCK)


def _held(
    tree: RadixTree, tokens: list[int], salt: str | None = None
) -> list[tuple[int, int, int | None]]:
    """``(start, end, hold priority or None)`` of each node on the path of ``tokens``."""
    now = radix.clock()
    out = []
    for node, start, end in radix.path_spans(tree.leaf(tokens, salt)):
        hold = radix.active_hold(node, now)
        out.append((start, end, None if hold is None else hold[0]))
    return out


def test_sglangs_loader_installed_every_hook_and_the_policy_choice() -> None:
    from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES
    from sglang.srt.server_args import prepare_server_args

    for target in HOOK_TARGETS:
        hooked = pkgutil.resolve_name(target.target)
        assert hasattr(hooked, "__wrapped__"), f"{target.target} is not hooked"
        assert inspect.unwrap(hooked) is not hooked
    assert EVICTION_POLICY in RADIX_EVICTION_POLICY_CHOICES
    args = prepare_server_args(["--model-path", "m", "--radix-eviction-policy", EVICTION_POLICY])
    assert args.radix_eviction_policy == EVICTION_POLICY


def test_kvretain_pins_on_sglangs_rust_core_and_ranks_nodes_on_its_python_core() -> None:
    pinned = _tree(PINNED)
    assert pinned.cache._tree_core_backend == tree_core.PINNED
    assert type(pinned.cache.tree_core).__name__ == "RustUnifiedTreeCore"
    assert isinstance(getattr(pinned.cache.tree_core, pins.ATTR), pins.PinTable)
    ranked = _tree("unified")  # SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python, or its fallbacks
    assert ranked.cache._tree_core_backend == "python"
    assert isinstance(ranked.cache.tree_core.eviction_strategy, RetainStrategy)
    stock = _tree(PINNED, policy="lru")
    assert stock.cache._tree_core_backend == "rust"  # SGLang's default, untouched
    assert not hasattr(stock.cache.tree_core, pins.ATTR)


# (requests in order: hold as (priority, duration) or None; clock advance before the pressure
#  request; which requests' prefixes survive a pressure request that needs two of them evicted)
EVICTION_CASES = [
    ("unretained go first", [(50, 300), None, None, None], 0, [True, False, False, True]),
    ("recency among unretained", [None, None, None, None], 0, [False, False, True, True]),
    (
        "higher priority outlives lower",
        [(10, 300), (90, 300), (50, 300), None],
        0,
        [False, True, True, False],
    ),
    (
        "recency among equal holds",
        [(50, 300), (50, 300), (50, 300), (50, 300)],
        0,
        [False, False, True, True],
    ),
    (
        "an expired hold is unretained",
        [(50, 10), None, (50, 300), None],
        11,
        [False, False, True, True],
    ),
    (
        "a hold just before expiry still holds",
        [(50, 10), None, None, None],
        5,
        [True, False, False, True],
    ),
    (
        "a null duration never expires",
        [(50, None), None, None, None],
        10**7,
        [True, False, False, True],
    ),
]


@pytest.mark.parametrize("kind", ORDER_KINDS)
@pytest.mark.parametrize(
    ("holds", "advance", "survives"),
    [c[1:] for c in EVICTION_CASES],
    ids=[c[0] for c in EVICTION_CASES],
)
def test_eviction_order_under_pressure(
    kind: str,
    holds: list[tuple[int, int | None] | None],
    advance: float,
    survives: list[bool],
    clock: FakeClock,
) -> None:
    tree = _tree(kind)
    for i, hold in enumerate(holds):
        hints = None if hold is None else retain(BLOCK, priority=hold[0], duration=hold[1])
        tree.run(_tokens(i), kv_hints=hints)
        clock.advance(1)
    clock.advance(advance)
    tree.run(_tokens(9, 2 * BLOCK))  # unhinted pressure: two requests' worth of pages
    assert [tree.cached(_tokens(i)) == BLOCK for i in range(4)] == survives


@pytest.mark.parametrize("kind", ORDER_KINDS)
def test_unhinted_requests_are_untouched_and_evicted_as_lru_evicts_them(kind: str) -> None:
    orders = {}
    for policy in (EVICTION_POLICY, "lru"):
        tree = _tree(kind, policy=policy)
        for i in range(4):
            tree.run(_tokens(i), output=[7])
        tree.run(_tokens(2))  # refresh one
        tree.run(_tokens(9, 2 * BLOCK))
        orders[policy] = [tree.cached(_tokens(i)) for i in range(4)]
        if policy == EVICTION_POLICY and kind != PINNED:
            for i in (2, 3):
                for node, _, _ in radix.path_spans(tree.leaf(_tokens(i))):
                    assert not hasattr(node, radix.HOLDS_ATTR)
                    assert not hasattr(node, HOLD_UNTIL_ATTR)
    assert orders[EVICTION_POLICY] == orders["lru"] == [0, 0, BLOCK, BLOCK]


# (directive range; node spans of the 22-token prompt + 2 output tokens and their hold: SGLang itself
#  splits at the prompt's last whole page, 20, so that output can go before prompt)
ROUNDING_CASES = [
    ("aligned", (0, 16), [(0, 16, 50), (16, 20, None), (20, 24, None)]),
    ("end rounded down", (0, 22), [(0, 20, 50), (20, 24, None)]),
    ("start rounded up", (5, 18), [(0, 8, None), (8, 16, 50), (16, 20, None), (20, 24, None)]),
    ("shorter than a page holds nothing", (1, 4), [(0, 20, None), (20, 24, None)]),
    ("within one page holds nothing", (5, 7), [(0, 20, None), (20, 24, None)]),
    ("end past the sequence is cut to it", (0, 4000), [(0, 20, 50), (20, 24, 50)]),
    (
        "end null runs to the end, output included",
        (8, None),
        [(0, 8, None), (8, 20, 50), (20, 24, 50)],
    ),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("span", "expected"), [c[1:] for c in ROUNDING_CASES], ids=[c[0] for c in ROUNDING_CASES]
)
def test_ranges_are_whole_pages_never_widened(
    kind: str, span: tuple[int, int | None], expected: list[tuple[int, int, int | None]]
) -> None:
    tree = _tree(kind)
    prompt, output = _tokens(0, 22), [7, 8]
    tree.run(prompt, output=output, kv_hints=retain(span[1], start=span[0]))
    assert _held(tree, prompt + output) == expected


# EAGLE trees key token pairs: key position i spans tokens i and i+1, so a token range
# [start, end) is the key range [start, end - 1), then whole pages inwards.
EAGLE_CASES = [
    ("whole prompt", (0, 22), [(0, 20, 50)]),
    ("the pair shift costs a page", (0, 20), [(0, 16, 50), (16, 20, None)]),
    ("start stays", (4, 21), [(0, 4, None), (4, 20, 50)]),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("span", "expected"), [c[1:] for c in EAGLE_CASES], ids=[c[0] for c in EAGLE_CASES]
)
def test_eagle_bigram_keys_hold_whole_pages_of_token_pairs(
    kind: str, span: tuple[int, int], expected: list[tuple[int, int, int | None]]
) -> None:
    # EAGLE's bigram keys stay on the Python core (the pins match token keys)
    tree = RadixTree(TreeSpec(kind=kind, page_size=PAGE, tokens=4 * BLOCK, eagle=True))
    assert kind == "radix" or tree.cache._tree_core_backend == "python"
    prompt, output = _tokens(0, 22), [7, 8]  # 24 tokens: 23 pairs, 20 of them in whole pages
    tree.run(prompt, output=output, kv_hints=retain(span[1], start=span[0]))
    assert _held(tree, prompt + output) == expected


def test_output_directive_covers_whole_output_pages_only(tree: RadixTree) -> None:
    prompt, output = _tokens(0, 10), list(range(1, 15))  # 24 tokens: output is [10, 24)
    hints = retain_hints([{"covers_output": True, "priority": 30, "duration": 60}])
    tree.run(prompt, output=output, kv_hints=hints)
    assert _held(tree, prompt + output) == [(0, 8, None), (8, 12, None), (12, 24, 30)]


def test_priority_zero_releases_that_scopes_hold_only(tree: RadixTree, clock: FakeClock) -> None:
    shared = _tokens(0)
    tree.run(shared, kv_hints=retain(BLOCK, scope="a", priority=40))
    tree.run(shared, kv_hints=retain(BLOCK, scope="b", priority=60))
    assert _held(tree, shared) == [(0, BLOCK, 60)]
    tree.run(shared, kv_hints=retain(BLOCK, scope="b", priority=0))
    assert _held(tree, shared) == [(0, BLOCK, 40)]  # scope a still holds
    tree.run(shared, kv_hints=retain(BLOCK, scope="a", priority=0))
    assert _held(tree, shared) == [(0, BLOCK, None)]
    node = tree.leaf(shared)
    assert not hasattr(node, radix.HOLDS_ATTR) and not hasattr(node, HOLD_UNTIL_ATTR)


@pytest.mark.parametrize("kind", ORDER_KINDS)
@pytest.mark.parametrize("released", [False, True])
def test_a_released_prefix_is_evicted_like_any_unretained_one(kind: str, released: bool) -> None:
    tree = _tree(kind)
    tree.run(_tokens(0), kv_hints=retain(BLOCK, scope="s"))
    if released:
        tree.run(_tokens(0), kv_hints=retain(BLOCK, scope="s", priority=0))
    for i in (1, 2, 3):
        tree.run(_tokens(i))
    tree.run(_tokens(9))  # the cache is full: one request's pages must go, the oldest unretained
    assert [tree.cached(_tokens(i)) for i in range(4)] == (
        [0, BLOCK, BLOCK, BLOCK] if released else [BLOCK, 0, BLOCK, BLOCK]
    )


def test_unscoped_holds_of_two_requests_on_a_shared_prefix_keep_the_longer(
    tree: RadixTree, clock: FakeClock
) -> None:
    shared = _tokens(0)
    a, b = shared + _tokens(1), shared + _tokens(2)
    tree.run(a, kv_hints=retain(2 * BLOCK, duration=300))
    tree.run(b, kv_hints=retain(2 * BLOCK, duration=10))  # the worker's scope is null
    clock.advance(20)
    assert _held(tree, a) == [(0, BLOCK, 50), (BLOCK, 2 * BLOCK, 50)]
    assert _held(tree, b) == [(0, BLOCK, 50), (BLOCK, 2 * BLOCK, None)]  # only b's own tail ended


def test_a_directive_that_does_not_cover_a_node_leaves_it_alone(
    tree: RadixTree, clock: FakeClock
) -> None:
    base = _tokens(0)
    tree.run(base, kv_hints=retain(BLOCK, scope="s", priority=20, duration=100))
    before = getattr(tree.leaf(base), HOLD_UNTIL_ATTR)
    clock.advance(50)
    longer = base + _tokens(1)
    tree.run(longer, kv_hints=retain(2 * BLOCK, start=BLOCK, scope="s", priority=20, duration=100))
    assert _held(tree, longer) == [(0, BLOCK, 20), (BLOCK, 2 * BLOCK, 20)]
    assert getattr(tree.leaf(base), HOLD_UNTIL_ATTR) == before  # not refreshed: not covered
    assert getattr(tree.leaf(longer), HOLD_UNTIL_ATTR) == clock.now + 100


def test_a_later_split_keeps_the_hold_on_both_halves(tree: RadixTree) -> None:
    held = _tokens(0)
    tree.run(held, kv_hints=retain(BLOCK))
    tree.run(held[:8] + _tokens(5, 8))  # unhinted, shares two pages: SGLang splits the node
    assert _held(tree, held) == [(0, 8, 50), (8, BLOCK, 50)]


def test_holds_stay_in_the_requests_namespace(tree: RadixTree) -> None:
    tokens = _tokens(0)
    tree.run(tokens)
    tree.run(tokens, salt="tenant-a", kv_hints=retain(10))  # splits its own node at page 8
    assert _held(tree, tokens, salt="tenant-a") == [(0, 8, 50), (8, BLOCK, None)]
    assert _held(tree, tokens) == [(0, BLOCK, None)]


@pytest.mark.parametrize("kind", KINDS)
def test_holds_apply_only_on_a_kvretain_tree(kind: str) -> None:
    tree = RadixTree(TreeSpec(kind=kind, policy="priority", page_size=PAGE, tree_core="python"))
    tree.run(_tokens(0), kv_hints=retain(BLOCK))
    assert not hasattr(tree.leaf(_tokens(0)), radix.HOLDS_ATTR)


@pytest.mark.parametrize("kind", KINDS)
def test_invalid_retain_actions_are_skipped_and_hold_nothing(kind: str) -> None:
    tree = _tree(kind)
    bad = retain_hints([{"start": 0, "end": BLOCK, "priority": 500, "duration": 10}])
    tree.run(_tokens(0), kv_hints=bad)
    assert _held(tree, _tokens(0)) == [(0, BLOCK, None)]


def _host_chain(tree: RadixTree, tokens: list[int]) -> None:
    """Put ``tokens`` on HiCache's host tier as a storage prefetch commits them."""
    import torch

    cache: Any = tree.cache
    host = cache.cache_controller.mem_pool_host.alloc(len(tokens)).to(torch.int64)
    hashes = [f"{tokens[0]}:{p}" for p in range(len(tokens) // PAGE)]
    cache.tree_core.insert_host(cache.root_node_handle(), tree.key(tokens), host, hashes)


def test_hicache_host_tier_keeps_the_retained_prefix_under_host_pressure(
    clock: FakeClock,
) -> None:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    tree = RadixTree(
        TreeSpec(kind="unified", page_size=PAGE, tokens=8 * BLOCK, hicache=True, tree_core="python")
    )
    sessions = [_tokens(i) for i in range(4)]
    for tokens in sessions:
        _host_chain(tree, tokens)
    for i, tokens in enumerate(sessions):  # the requests load them back onto the device
        tree.run(tokens, kv_hints=retain(BLOCK) if i == 1 else None)
        clock.advance(1)
    tree.cache.evict(EvictParams(num_tokens=4 * BLOCK))  # device pressure demotes all to host
    assert [tree.cached(t) for t in sessions] == [0, 0, 0, 0]
    assert [tree.host_cached(t) for t in sessions] == [BLOCK] * 4
    assert tree.cache.evict_host(2 * BLOCK) == 2 * BLOCK  # host pressure: two must go
    assert [tree.host_cached(t) for t in sessions] == [0, BLOCK, 0, BLOCK]

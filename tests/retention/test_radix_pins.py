"""kv.retain as pins on SGLang's default (Rust) TreeCore: what a scope's pins keep, replace and
release, what the budget lets in, and a conversation that keeps its prefix under pressure.

Each test builds SGLang's own ``UnifiedRadixCache`` on its Rust core over CPU pools, with the
plugin SGLang's loader found, and reads what SGLang reports: the prefix a later request matches.
"""

from __future__ import annotations

import pytest

from kvretention.retention import pins, tree_core
from support.sglang_radix import FakeClock, RadixTree, TreeSpec, retain, retain_hints

pytestmark = pytest.mark.retention

PAGE = 4
BLOCK = 16


def _tokens(i: int, n: int = BLOCK) -> list[int]:
    return list(range(1000 * (i + 1), 1000 * (i + 1) + n))


def _pinned(tokens: int) -> tuple[RadixTree, pins.PinTable]:
    tree = RadixTree(TreeSpec(kind="unified", page_size=PAGE, tokens=tokens))
    assert tree.cache._tree_core_backend == tree_core.PINNED
    return tree, getattr(tree.cache.tree_core, pins.ATTR)


def _present(tree: RadixTree, tokens: list[int]) -> int:
    """Tokens of ``tokens`` on the device, read without touching them (no LRU refresh)."""
    return int(tree.cache.tree_core.match_full_device_prefix(tree.key(tokens))[0])


def test_a_conversations_later_turn_takes_over_its_pin() -> None:
    tree, table = _pinned(16 * BLOCK)
    turn1 = _tokens(0)
    turn2 = turn1 + _tokens(1)
    tree.run(turn1, kv_hints=retain(BLOCK, scope="s"))
    tree.run(turn2, kv_hints=retain(2 * BLOCK, scope="s"))
    assert [p.end for p in table.pins()] == [2 * BLOCK]
    assert table.pinned_tokens == 2 * BLOCK
    tree.run(_tokens(5), kv_hints=retain(BLOCK, scope="t"))  # another scope: its own pin
    assert sorted(p.end for p in table.pins()) == [BLOCK, 2 * BLOCK]


def test_a_release_drops_that_scopes_pin_and_keeps_anothers_on_the_shared_prefix() -> None:
    tree, table = _pinned(4 * BLOCK)
    shared = _tokens(0)
    tree.run(shared, kv_hints=retain(BLOCK, scope="a", priority=40))
    tree.run(shared, kv_hints=retain(BLOCK, scope="b", priority=60))
    tree.run(shared, kv_hints=retain(BLOCK, scope="b", priority=0))
    assert [(p.scope, p.priority) for p in table.pins()] == [("a", 40)]
    tree.run(shared, kv_hints=retain(BLOCK, scope="a", priority=0))
    assert len(table) == 0 and table.pinned_tokens == 0
    for i in (1, 2, 3):
        tree.run(_tokens(i))
    tree.run(_tokens(9))  # one block must go: the released prefix, LRU's oldest
    assert _present(tree, shared) == 0


# (pins asked for in order as (priority, duration); which are pinned after each, by index).
# The pool is 4 blocks, the cap half of it: two one-block pins.
BUDGET_CASES = [
    ("two fit", [(50, 300), (50, 300)], [0, 1]),
    ("a higher priority takes the lowest's place", [(10, 300), (90, 300), (50, 300)], [1, 2]),
    ("a lower priority is not set when full", [(90, 300), (50, 300), (10, 300)], [0, 1]),
    ("among equals the soonest to expire goes", [(50, 100), (50, 300), (50, 200)], [1, 2]),
    ("a hold without expiry outranks one with", [(50, None), (50, 200), (50, 300)], [0, 2]),
    (
        "one expiring sooner does not take a later one's place",
        [(50, 300), (50, 300), (50, 100)],
        [0, 1],
    ),
]


@pytest.mark.parametrize(
    ("asks", "kept"), [c[1:] for c in BUDGET_CASES], ids=[c[0] for c in BUDGET_CASES]
)
def test_the_budget_keeps_the_highest_ranked_pins(
    asks: list[tuple[int, int | None]], kept: list[int], clock: FakeClock
) -> None:
    tree, table = _pinned(4 * BLOCK)
    assert table.cap_tokens == 2 * BLOCK
    for i, (priority, duration) in enumerate(asks):
        tree.run(
            _tokens(i), kv_hints=retain(BLOCK, scope=f"s{i}", priority=priority, duration=duration)
        )
        clock.advance(1)
    assert sorted(str(p.scope) for p in table.pins()) == [f"s{i}" for i in kept]
    assert table.pinned_tokens <= table.cap_tokens
    assert table.shed == len(asks) - len(kept)
    tree.run(_tokens(9, 2 * BLOCK))  # pressure for two blocks: the unpinned go
    assert [_present(tree, _tokens(i)) == BLOCK for i in range(len(asks))] == [
        i in kept for i in range(len(asks))
    ]


def test_a_growing_conversation_keeps_its_prefix_through_background_pressure(
    clock: FakeClock,
) -> None:
    """An agent's turns, each resending the last and adding a block, retained for 300 s, while
    unhinted background requests fill the pool between turns: every turn finds all of the last
    one's prompt; without hints, LRU has evicted it by then."""
    reads = {}
    for hinted in (True, False):
        tree, _table = _pinned(16 * BLOCK)  # the cap, 8 blocks, holds the last turn's 6
        prompt: list[int] = []
        hits = []
        for turn in range(6):
            prompt = prompt + _tokens(turn)
            hints = retain(len(prompt), scope="agent") if hinted else None
            hits.append(tree.run(prompt, kv_hints=hints))
            for b in range(4):  # background: 20 blocks, more than the pool holds
                tree.run(_tokens(100 + 10 * turn + b, 5 * BLOCK))
            clock.advance(5)
        reads[hinted] = hits
    assert reads[True] == [0, BLOCK, 2 * BLOCK, 3 * BLOCK, 4 * BLOCK, 5 * BLOCK]
    assert reads[False] == [0] * 6


def test_expired_pins_go_before_the_next_eviction(clock: FakeClock) -> None:
    tree, table = _pinned(4 * BLOCK)
    tree.run(_tokens(0), kv_hints=retain(BLOCK, duration=10))
    for i in (1, 2, 3):
        tree.run(_tokens(i))
    clock.advance(11)  # no checkpoint since: the eviction pass drops the pin first
    tree.run(_tokens(9))
    assert len(table) == 0
    assert [_present(tree, _tokens(i)) for i in range(4)] == [0, BLOCK, BLOCK, BLOCK]


def test_a_pin_ends_where_its_hold_does() -> None:
    """The tree is split at the hold's end (SGLang's own split): half a prompt held is half kept."""
    tree, table = _pinned(4 * BLOCK)
    tree.run(_tokens(0), kv_hints=retain(8))
    assert table.pinned_tokens == 8
    for i in (1, 2, 3, 4):
        tree.run(_tokens(i))  # pressure: everything unpinned goes, oldest first
    assert _present(tree, _tokens(0)) == 8


def test_a_system_prompts_longer_hold_outlives_the_conversations_in_one_request(
    clock: FakeClock,
) -> None:
    """Anthropic's two breakpoints in one request: the system prompt for an hour, the rest for
    five minutes. Two pins on one path; the shorter one does not take over the longer."""
    tree, table = _pinned(8 * BLOCK)
    prompt = _tokens(0) + _tokens(1)
    hints = retain_hints(
        [
            {"start": 0, "end": BLOCK, "priority": 50, "duration": 3600},
            {"start": BLOCK, "end": 2 * BLOCK, "priority": 50, "duration": 300},
        ]
    )
    tree.run(prompt, kv_hints=hints)
    assert sorted(p.end for p in table.pins()) == [BLOCK, 2 * BLOCK]
    clock.advance(301)
    for i in range(2, 9):
        tree.run(_tokens(i))  # pressure past the five minutes
    assert _present(tree, prompt) == BLOCK  # the system prompt's hour still holds


def test_a_reset_tree_forgets_its_pins_and_pins_anew(clock: FakeClock) -> None:
    """SGLang's flush_cache resets the tree: the pins went with its nodes, none is released twice."""
    tree, table = _pinned(4 * BLOCK)
    tree.run(_tokens(0), kv_hints=retain(BLOCK, duration=10))
    tree.cache.reset()
    assert len(table) == 0 and table.pinned_tokens == 0
    clock.advance(11)
    tree.run(_tokens(1), kv_hints=retain(BLOCK))  # expiry finds nothing stale to unpin
    assert [p.end for p in table.pins()] == [BLOCK] and table.pinned_tokens == BLOCK
    for i in (2, 3, 4, 5):
        tree.run(_tokens(i))
    assert _present(tree, _tokens(1)) == BLOCK

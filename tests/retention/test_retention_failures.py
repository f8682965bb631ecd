"""A failing retention hook inside SGLang's own radix cache: the request is served, the failure
turns into the worker's ``kvretention_retention_hook_failures_total``; and the ranks' clock
agreement runs inside that guard, only when a hold is at stake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvretention.retention import failures, pins, plugin, radix
from support.sglang_radix import FakeClock, RadixTree, TreeSpec, retain

pytestmark = pytest.mark.retention

BLOCK = 16


def _tokens(i: int) -> list[int]:
    return list(range(1000 * (i + 1), 1000 * (i + 1) + BLOCK))


def _scrape(directory: Path) -> str:
    """What the worker's ``/metrics`` says: its registry with the plugin's collector."""
    registry = CollectorRegistry()
    registry.register(failures.FailureCollector(directory))
    return generate_latest(registry).decode()


@pytest.fixture
def stats_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The directory a worker names for its scheduler, and a fresh count for this process."""
    monkeypatch.setenv(failures.STATS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(plugin, "COUNTS", failures.FailureCounts())
    return tmp_path


CORES = ["python", None]
"""The unified tree on SGLang's Python core (holds rank nodes) and on its default Rust core
(holds are pins)."""


def _break(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any, **__: Any) -> int:
        raise RuntimeError("SGLang moved the tree under the plugin")

    monkeypatch.setattr(radix, "apply_holds", broken)
    monkeypatch.setattr(pins.PinTable, "hold", broken)


@pytest.mark.parametrize(
    ("kind", "core"), [("unified", "python"), ("radix", None), ("unified", None)]
)
def test_a_failing_hold_is_served_unretained_and_counted_on_the_workers_metrics(
    kind: str, core: str | None, stats_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    zero = 'kvretention_retention_hook_failures_total{fallback="unretained",hook="checkpoint"} 0.0'
    assert zero in _scrape(stats_dir)  # present from zero, so increase() sees the first failure
    _break(monkeypatch)
    tree = RadixTree(TreeSpec(kind=kind, page_size=4, tokens=4 * BLOCK, tree_core=core))
    tree.run(_tokens(0), kv_hints=retain(BLOCK, duration=100))
    tree.run(_tokens(1), kv_hints=retain(BLOCK, duration=100))
    assert tree.cached(_tokens(0)) == BLOCK  # served, and its KV entered the tree
    text = _scrape(stats_dir)
    assert (
        'kvretention_retention_hook_failures_total{fallback="unretained",hook="checkpoint"} 2.0'
        in text
    )
    monkeypatch.undo()  # read the tree with the real module
    table = getattr(getattr(tree.cache, "tree_core", None), pins.ATTR, None)
    if table is not None:
        assert len(table) == 0  # nothing pinned: evicted as plain LRU
    else:
        assert radix.active_hold(tree.leaf(_tokens(0)), radix.clock()) is None


def test_counts_from_several_processes_are_summed(stats_dir: Path) -> None:
    (stats_dir / "101.json").write_text('{"checkpoint": 3, "l3_put": 1}')
    (stats_dir / "102.json").write_text('{"checkpoint": 4}')
    (stats_dir / "103.json").write_text("{half a rename")  # skipped, never a failed scrape
    assert failures.read_counts(stats_dir) == {
        "checkpoint": 7,
        "evict": 0,
        "l3_record": 0,
        "l3_put": 1,
    }


class _Ranks:
    """Two ranks as :func:`plugin.agree_on_now` sees them: every all-reduce counted (and made to
    fail when ``fail`` is set), the minimum being this rank's own reading."""

    def __init__(self, tree: RadixTree, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reductions = 0
        self.fail = False
        monkeypatch.setattr(plugin, "_multi_rank", lambda cache: True)

        def all_reduce(data: Any, tp_reduce_op: Any) -> None:
            self.reductions += 1
            if self.fail:
                raise RuntimeError("gloo: connection reset by peer")

        monkeypatch.setattr(tree.cache, "_all_reduce", all_reduce)


@pytest.mark.parametrize("core", CORES)
def test_ranks_agree_on_the_time_only_when_a_hold_is_at_stake(
    core: str | None, clock: FakeClock, stats_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = RadixTree(TreeSpec(kind="unified", page_size=4, tokens=8 * BLOCK, tree_core=core))
    ranks = _Ranks(tree, monkeypatch)
    tree.run(_tokens(0))
    assert ranks.reductions == 0  # unhinted, nothing held: no all-reduce
    tree.run(_tokens(1), kv_hints=retain(BLOCK, duration=10))
    assert ranks.reductions == 1
    tree.run(_tokens(2))
    assert ranks.reductions == 2  # a live hold: time must move on every rank alike
    clock.advance(20)
    tree.run(_tokens(3))
    assert ranks.reductions == 3  # the agreement that finds the hold expired
    tree.run(_tokens(4))
    assert ranks.reductions == 3  # nothing at stake any more


@pytest.mark.parametrize("core", CORES)
def test_a_failing_clock_agreement_is_inside_the_guard(
    core: str | None, stats_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = RadixTree(TreeSpec(kind="unified", page_size=4, tokens=8 * BLOCK, tree_core=core))
    ranks = _Ranks(tree, monkeypatch)
    ranks.fail = True
    tree.run(_tokens(0), kv_hints=retain(BLOCK, duration=10))  # served: the checkpoint returns
    assert tree.cached(_tokens(0)) == BLOCK
    assert failures.read_counts(stats_dir)["checkpoint"] == 1


def _full_after_a_hold(
    monkeypatch: pytest.MonkeyPatch, core: str | None
) -> tuple[RadixTree, _Ranks]:
    """A tree of 4 blocks, its ranks counted from the start, filled: block 0 held for 10 s, blocks
    1-3 after it."""
    tree = RadixTree(TreeSpec(kind="unified", page_size=4, tokens=4 * BLOCK, tree_core=core))
    ranks = _Ranks(tree, monkeypatch)
    tree.run(_tokens(0), kv_hints=retain(BLOCK, duration=10))
    for i in (1, 2, 3):
        tree.run(_tokens(i))
    return tree, ranks


@pytest.mark.parametrize("core", CORES)
def test_an_eviction_after_an_idle_spell_agrees_on_the_time_before_it_ranks(
    core: str | None, clock: FakeClock, stats_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree, ranks = _full_after_a_hold(monkeypatch, core)
    agreed = ranks.reductions
    clock.advance(60)  # idle: no checkpoint since, the hold expired 50 s ago
    tree.run(_tokens(4))  # needs one block: the pass agrees on the time, then ranks
    assert ranks.reductions == agreed + 1  # the checkpoint after it finds nothing at stake
    assert tree.cached(_tokens(0)) == 0  # expired: LRU's oldest goes first
    assert tree.cached(_tokens(1)) == BLOCK


@pytest.mark.parametrize("core", CORES)
def test_a_failing_agreement_before_an_eviction_ranks_by_the_last_agreed_time(
    core: str | None, clock: FakeClock, stats_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree, ranks = _full_after_a_hold(monkeypatch, core)
    clock.advance(60)
    ranks.fail = True
    tree.run(_tokens(4))  # served: the pass goes on by the time agreed before the idle spell
    assert tree.cached(_tokens(4)) == BLOCK
    assert tree.cached(_tokens(0)) == BLOCK  # still ranked as held at that time
    assert failures.read_counts(stats_dir)["evict"] == 1

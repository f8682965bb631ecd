"""The pin table's bookkeeping over a fake Rust core: the cap rule, and that updates and expiry
stay cheap (stale heap entries are skipped and compacted, a refreshed pin expires by its latest
expiry). What the pins do inside SGLang's own tree: tests/retention/test_radix_pins.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kvretention.retention.directives import Hold
from kvretention.retention.pins import PinTable, pin_cap


@pytest.mark.parametrize(
    ("pool", "context", "ratio", "cap"),
    [
        (1000, 0, 0.5, 500),  # context unknown: the ratio alone
        (1000, 100, 0.5, 500),
        (1000, 800, 0.5, 200),  # room for the longest request comes first
        (1000, 1000, 0.5, 0),  # no room at all: no pins
        (1000, 4000, 0.5, 0),
        (1000, 0, 1.0, 1000),
    ],
)
def test_the_cap_leaves_room_for_the_longest_request(
    pool: int, context: int, ratio: float, cap: int
) -> None:
    assert pin_cap(pool, context, ratio) == cap


@dataclass(frozen=True)
class Info:
    node_id: int
    path_start: int
    path_end: int


@dataclass
class FakeCore:
    """Keys are token tuples; each distinct prefix is its own node on a chain from the root."""

    pins: dict[int, int] = field(default_factory=dict)
    nodes: dict[tuple[int, ...], int] = field(default_factory=dict)

    def node(self, key: tuple[int, ...]) -> int:
        return self.nodes.setdefault(key, len(self.nodes) + 1)

    def match_full_device_prefix(self, key: tuple[int, ...]) -> tuple[int, int, int]:
        return len(key), self.node(key), len(key)

    def collect_path_info(self, nodes: list[int]) -> tuple[tuple[Info, ...], ...]:
        by_id = {v: k for k, v in self.nodes.items()}
        key = by_id[nodes[0]]
        path = [Info(self.node(key[:n]), n - 1, n) for n in range(1, len(key) + 1)]
        return (tuple(path),)

    def inc_full_pin(self, node: int) -> None:
        self.pins[node] = self.pins.get(node, 0) + 1

    def dec_full_pin(self, node: int) -> None:
        self.pins[node] -= 1
        if not self.pins[node]:
            del self.pins[node]


def test_refreshing_one_pin_many_times_keeps_the_heaps_small_and_expires_by_the_latest() -> None:
    core = FakeCore()
    table = PinTable(core, cap_tokens=100)
    tokens = tuple(range(8))
    for t in range(1000):
        table.hold("s", [Hold(0, 8, 50, float(t + 10))], lambda end: tokens[:end])
    assert len(table) == 1 and core.pins == {core.node(tokens): 1}
    assert len(table._ranked) <= 4 * len(table) + 65 and len(table._expiry) <= 4 * len(table) + 65
    assert table.expire(1000.0) == 0  # the first expiries are stale: the pin was refreshed
    assert table.expire(1009.0) == 1 and core.pins == {} and table.pinned_tokens == 0


def test_a_conversation_keeps_one_pin_and_scopes_share_nothing() -> None:
    core = FakeCore()
    table = PinTable(core, cap_tokens=100)
    tokens = tuple(range(40))
    for end in (8, 16, 24):
        table.hold("a", [Hold(0, end, 50, None)], lambda n: tokens[:n])
    table.hold("b", [Hold(0, 8, 50, None)], lambda n: tokens[:n])
    assert sorted((p.scope, p.end) for p in table.pins()) == [("a", 24), ("b", 8)]
    assert table.pinned_tokens == 24  # b's path lies within a's: counted once
    assert sum(core.pins.values()) == 2
    table.hold("a", [Hold(0, 40, 0, None)], lambda n: tokens[:n])  # a release over the path
    assert [(p.scope, p.end) for p in table.pins()] == [("b", 8)]


def test_a_pin_larger_than_the_cap_drops_nothing_and_lower_ranks_make_room() -> None:
    core = FakeCore()
    table = PinTable(core, cap_tokens=16)
    a, b, c = (tuple(range(k * 100, k * 100 + 16)) for k in (1, 2, 3))
    table.hold("a", [Hold(0, 8, 10, None)], lambda n: a[:n])
    table.hold("b", [Hold(0, 8, 20, None)], lambda n: b[:n])
    table.hold("c", [Hold(0, 16, 90, None)], lambda n: c[:n])  # 16 fits once a and b are gone
    assert [p.scope for p in table.pins()] == ["c"] and table.shed == 2
    table.hold("a", [Hold(0, 8, 10, None)], lambda n: a[:n])  # lower than c: not set
    assert [p.scope for p in table.pins()] == ["c"] and table.shed == 3
    big = tuple(range(900, 940))
    table.hold("d", [Hold(0, 40, 99, None)], lambda n: big[:n])  # over the cap alone
    assert [p.scope for p in table.pins()] == ["c"] and table.pinned_tokens == 16

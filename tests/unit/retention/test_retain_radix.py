"""Holds on tree nodes, on stand-in nodes shaped like SGLang's (the retention tier uses SGLang's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from kvretention.retention import HOLD_UNTIL_ATTR, radix
from kvretention.retention.contract import HOOK_TARGETS
from kvretention.retention.directives import Hold
from kvretention.retention.plugin import hooks


@dataclass(eq=False)
class Node:
    key: list[int]
    parent: Any = None
    priority: int = 0
    last_access_time: float = 0.0
    children: list[Any] = field(default_factory=list)


def chain(*lengths: int) -> list[Any]:
    """A root and a path of nodes of these key lengths; returns the path's nodes."""
    node = Node([])
    out = []
    for n in lengths:
        node = Node([0] * n, parent=node)
        out.append(node)
    return out


def test_path_spans_are_key_offsets_from_the_root() -> None:
    a, b, c = chain(8, 4, 12)
    assert [(s, e) for _, s, e in radix.path_spans(c)] == [(0, 8), (8, 12), (12, 24)]
    assert [n for n, _, _ in radix.path_spans(c)] == [a, b, c]


def test_boundaries_are_hold_edges_strictly_inside_a_node() -> None:
    spans = radix.path_spans(chain(8, 16)[-1])
    holds = [Hold(0, 8, 5, None), Hold(12, 20, 5, None), Hold(0, 40, 5, None)]
    assert radix.boundaries(holds, spans) == [12, 20]


SCOPE_CASES = [
    ("set", [("a", Hold(0, 8, 40, 100.0))], {"a": (40, 100.0)}, 40, 100.0),
    (
        "two scopes: top priority, latest expiry",
        [("a", Hold(0, 8, 40, 100.0)), ("b", Hold(0, 8, 60, 50.0))],
        {"a": (40, 100.0), "b": (60, 50.0)},
        60,
        100.0,
    ),
    (
        "null duration wins the summary",
        [("a", Hold(0, 8, 40, None)), ("b", Hold(0, 8, 60, 50.0))],
        {"a": (40, None), "b": (60, 50.0)},
        60,
        None,
    ),
    (
        "same scope is replaced",
        [("a", Hold(0, 8, 40, 100.0)), ("a", Hold(0, 8, 10, 5.0))],
        {"a": (10, 5.0)},
        40,
        5.0,
    ),
    ("release", [("a", Hold(0, 8, 40, 100.0)), ("a", Hold(0, 8, 0, None))], None, 40, None),
    (
        "the null scope never shortens another request's hold",
        [(None, Hold(0, 8, 40, 100.0)), (None, Hold(0, 8, 30, 50.0))],
        {None: (40, 100.0)},
        40,
        100.0,
    ),
    (
        "the null scope takes the higher priority and the later expiry",
        [(None, Hold(0, 8, 40, 100.0)), (None, Hold(0, 8, 60, None))],
        {None: (60, None)},
        60,
        None,
    ),
    (
        "a null-scope release",
        [(None, Hold(0, 8, 40, 100.0)), (None, Hold(0, 8, 0, None))],
        None,
        40,
        None,
    ),
]


@pytest.mark.parametrize(
    ("steps", "holds", "priority", "until"),
    [c[1:] for c in SCOPE_CASES],
    ids=[c[0] for c in SCOPE_CASES],
)
def test_scope_holds_and_their_summary(
    steps: list[tuple[str | None, Hold]], holds: Any, priority: int, until: float | None
) -> None:
    (node,) = chain(8)
    for scope, hold in steps:
        assert radix.apply_holds(radix.path_spans(node), [hold], scope=scope) == 1
    assert getattr(node, radix.HOLDS_ATTR, None) == holds
    assert node.priority == priority  # SGLang's field is raised, never lowered by a release
    if holds is None:
        assert not hasattr(node, HOLD_UNTIL_ATTR)
    else:
        assert getattr(node, HOLD_UNTIL_ATTR) == until


def test_a_node_only_partly_covered_is_left_alone() -> None:
    a, b = chain(8, 8)
    assert radix.apply_holds(radix.path_spans(b), [Hold(0, 12, 50, None)], scope=None) == 1
    assert radix.active_hold(a, 0.0) == (50, None) and radix.active_hold(b, 0.0) is None


def test_expired_holds_rank_as_unretained_and_recency_breaks_ties() -> None:
    a, b = chain(8, 8)
    a.last_access_time, b.last_access_time = 5.0, 3.0
    radix.apply_holds(radix.path_spans(b), [Hold(0, 16, 50, 100.0)], scope=None)
    assert radix.retained_priority(a, 99.0) == 50 and radix.active_hold(a, 100.0) is None
    assert radix.retained_priority(a, 100.0) == 0


def test_copy_holds_gives_a_split_parent_the_childs_holds() -> None:
    (child,) = chain(8)
    parent = Node([0] * 4)
    radix.apply_holds(radix.path_spans(child), [Hold(0, 8, 7, 9.0)], scope="s")
    radix.copy_holds(child, parent)
    assert radix.active_hold(parent, 0.0) == (7, 9.0)
    assert getattr(parent, radix.HOLDS_ATTR) is not getattr(child, radix.HOLDS_ATTR)


def test_every_contract_target_has_its_plugin_hook() -> None:
    table = hooks()
    assert list(table) == [t.target for t in HOOK_TARGETS]
    assert all(
        callable(fn) and kind in {"AROUND", "AFTER", "BEFORE"} for fn, kind in table.values()
    )


def test_a_hook_failure_is_logged_and_the_request_served(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvretention.retention import plugin
    from kvretention.retention.failures import FailureCounts

    class Broken:
        kv_hints: ClassVar[dict[str, Any]] = {
            "protocol_version": "0.1",
            "message_id": "m",
            "actions": [
                {
                    "action_id": "a",
                    "action_type": "kv.retain",
                    "action_version": "1.0",
                    "payload": {"directives": [{"end": 8, "priority": 5, "duration": 1}]},
                }
            ],
        }
        rid = "broken"

        @property
        def origin_input_ids(self) -> list[int]:
            raise RuntimeError("SGLang moved this")

    counts = FailureCounts()
    monkeypatch.setattr(plugin, "COUNTS", counts)
    served = plugin._hold_or_log(
        object(), Broken(), tokens=[1] * 8, leaf=None, is_bigram=False, now=lambda: 0.0
    )
    assert not served
    assert counts.count("checkpoint") == 2  # the failure, then this read's own
    assert "kv.retain not applied to request broken" in caplog.text


def test_writing_a_hold_drops_other_scopes_expired_ones() -> None:
    (node,) = chain(8)
    spans = radix.path_spans(node)
    for i in range(100):  # a shared prefix held by many short sessions in turn
        radix.apply_holds(spans, [Hold(0, 8, 50, 10.0 + i)], scope=f"s{i}", now=float(i))
    assert set(getattr(node, radix.HOLDS_ATTR)) == {f"s{i}" for i in range(90, 100)}
    assert radix.active_hold(node, 99.0) == (50, 109.0)


def test_holds_expire_by_a_monotonic_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setattr(time, "time", lambda: 4_000_000_000.0)  # the wall clock stepped
    assert abs(radix.clock() - time.monotonic()) < 5


# (holds on a node as (scope, priority, until); its last access; the time ranked at)
KEY_NODES = [
    ("unheld, old", [], 1.0, 50.0),
    ("unheld, recent", [], 2.0**44, 50.0),
    ("expired hold", [("a", 90, 40.0)], 3.0, 50.0),
    ("low hold", [(None, 1, 60.0)], 0.0, 50.0),
    ("low hold, recent", [(None, 1, 60.0)], 2.0**44, 50.0),
    ("high hold expired, low live", [("a", 90, 40.0), ("b", 5, None)], 7.0, 50.0),
    ("high hold, no expiry", [("a", 100, None)], 2.0**44 + 1, 50.0),
]


def test_the_eviction_key_orders_as_priority_then_recency() -> None:
    """One float per node sorts exactly as ``(retained_priority, last_access_time)``, counters
    up to 2**44 included (the unified tree's is a float counter)."""
    nodes = []
    for _, holds, last_access, _ in KEY_NODES:
        (node,) = chain(8)
        node.last_access_time = last_access
        for scope, priority, until in holds:
            radix.apply_holds(radix.path_spans(node), [Hold(0, 8, priority, until)], scope=scope)
        nodes.append(node)
    now = KEY_NODES[0][3]
    by_key = sorted(nodes, key=lambda n: radix.eviction_key(n, now))
    by_pair = sorted(nodes, key=lambda n: (radix.retained_priority(n, now), n.last_access_time))
    assert by_key == by_pair
    assert [KEY_NODES[nodes.index(n)][0] for n in by_key] == [
        "unheld, old",
        "expired hold",
        "unheld, recent",
        "low hold",
        "low hold, recent",
        "high hold expired, low live",
        "high hold, no expiry",
    ]


def test_the_rank_summary_follows_releases_and_splits() -> None:
    (node,) = chain(8)
    radix.apply_holds(radix.path_spans(node), [Hold(0, 8, 30, 10.0)], scope="a")
    radix.apply_holds(radix.path_spans(node), [Hold(0, 8, 60, None)], scope="b")
    assert getattr(node, radix.RANK_ATTR) == ((60, float("inf")), (30, 10.0))
    parent = Node([0] * 4)
    radix.copy_holds(node, parent)
    assert getattr(parent, radix.RANK_ATTR) == getattr(node, radix.RANK_ATTR)
    radix.apply_holds(radix.path_spans(node), [Hold(0, 8, 0, None)], scope="b")
    assert getattr(node, radix.RANK_ATTR) == ((30, 10.0),)
    radix.apply_holds(radix.path_spans(node), [Hold(0, 8, 0, None)], scope="a")
    assert not hasattr(node, radix.RANK_ATTR) and not hasattr(node, radix.HOLDS_ATTR)

"""``Children``: a labelled metric's child resolved once per label set, the same series exported."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kvretention.dataplane.labelled import Children
from kvretention.dataplane.router.state import RouterMetrics, RouterState, Worker


def test_children_are_the_metrics_own() -> None:
    registry = CollectorRegistry()
    counter = Counter("c", "c", ["a", "b"], registry=registry)
    children = Children(counter)
    assert children("x", "y") is counter.labels("x", "y")
    assert children("x", "y") is children("x", "y")
    children("x", "y").inc()
    counter.labels("x", "y").inc()
    children("x", "z").inc(5)
    assert registry.get_sample_value("c_total", {"a": "x", "b": "y"}) == 2
    assert registry.get_sample_value("c_total", {"a": "x", "b": "z"}) == 5


def test_router_exports_the_same_series_as_with_labels() -> None:
    """The router's per-request gauges and counter, moved through ``Children``, export what
    the same moves through ``labels()`` export."""
    worker = Worker(url="http://w:1", role="aggregated")
    state = RouterState(sources=[])
    for _ in range(3):
        state.begin(worker)
    state.end(worker)
    state.metrics.requests_of("aggregated", "ok").inc()
    state.metrics.requests_of("aggregated", "ok").inc()

    plain = RouterMetrics()
    plain.outstanding.labels("aggregated", "http://w:1").set(2)
    plain.pool_outstanding.labels("aggregated").inc(3)
    plain.pool_outstanding.labels("aggregated").dec()
    plain.requests.labels("aggregated", "ok").inc(2)

    def series(registry: CollectorRegistry) -> list[bytes]:
        return [
            line
            for line in generate_latest(registry).splitlines()
            if not line.startswith(b"#") and b"_created" not in line
        ]

    assert series(state.metrics.registry) == series(plain.registry)
    gauge = Gauge("g", "g", ["r"], registry=CollectorRegistry())
    assert Children(gauge)("p") is gauge.labels("p")

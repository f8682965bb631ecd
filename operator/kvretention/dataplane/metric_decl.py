"""Prometheus metric declarations in one line each: ``counter(registry, name, help, *labels)``.

The operator's, the frontend's, the router's and the worker's metric tables declare a dozen metrics
apiece; these keep each declaration to its name, its help text and its labels (the metric is the
one the constructor returns).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


def counter(registry: CollectorRegistry, name: str, help_: str, *labels: str) -> Counter:
    """``Counter(name, help_, labels, registry=registry)``."""
    return Counter(name, help_, list(labels), registry=registry)


def gauge(registry: CollectorRegistry, name: str, help_: str, *labels: str) -> Gauge:
    """``Gauge(name, help_, labels, registry=registry)``."""
    return Gauge(name, help_, list(labels), registry=registry)


def histogram(
    registry: CollectorRegistry, name: str, help_: str, *labels: str, buckets: Sequence[float]
) -> Histogram:
    """``Histogram(name, help_, labels, buckets=buckets, registry=registry)``."""
    return Histogram(name, help_, list(labels), buckets=buckets, registry=registry)

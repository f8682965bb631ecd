"""The metrics every kvretention process serves, read from the same registry classes the
processes build (not a hand-written list): the dashboards' and the alerts' tests compare their
queries with it."""

from __future__ import annotations

import tempfile

from prometheus_client import CollectorRegistry

DATA_PLANE_LABELS = ("fleet_namespace", "fleet", "component")
"""What the chart's PodMonitor adds to every data-plane series (from the pod's namespace and its
``app.kubernetes.io/instance`` and ``app.kubernetes.io/component`` labels)."""


def registries() -> dict[str, CollectorRegistry]:
    """One fresh registry per process kind, built by the same classes the processes use."""
    from kvretention.controller.metrics import Metrics
    from kvretention.dataplane.frontend.metrics import FrontendMetrics
    from kvretention.dataplane.router.state import RouterMetrics
    from kvretention.dataplane.worker.app import WorkerMetrics

    return {
        "operator": Metrics().registry,
        "frontend": FrontendMetrics().registry,
        "router": RouterMetrics().registry,
        # With the directory a worker names for SGLang's scheduler: the retention plugin's counts.
        "worker": WorkerMetrics(retention_stats_dir=tempfile.mkdtemp()).registry,
    }


_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


def exported_series() -> dict[str, frozenset[str]]:
    """Every series name the processes serve on ``/metrics`` -> its label names.

    prometheus_client has no public way to list a labelled metric's label names before it has a
    child, so this reads each collector's ``_name``/``_type``/``_labelnames``.
    """
    out: dict[str, frozenset[str]] = {}
    for registry in registries().values():
        for collector in list(registry._collector_to_names):
            if not hasattr(collector, "_name"):  # a custom collector: its samples name the labels
                for family in collector.collect():
                    for sample in family.samples:
                        out[sample.name] = frozenset(sample.labels)
                    if not family.samples:  # served with no sample yet: its name and labels
                        labels = frozenset(getattr(family, "_labelnames", ()))
                        for suffix in _SUFFIXES[family.type][:1]:
                            out[family.name + suffix] = labels
                continue
            name, kind = collector._name, collector._type  # type: ignore[attr-defined]
            labels = frozenset(collector._labelnames)  # type: ignore[attr-defined]
            for suffix in _SUFFIXES[kind]:
                out[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


def worker_samples(stats_dir: object, prefix: str) -> dict[str, float]:
    """``series -> value`` of a worker's ``/metrics`` whose names start with ``prefix``, the
    worker reading the retention plugin's numbers from ``stats_dir``."""
    from prometheus_client import generate_latest

    from kvretention.dataplane.worker.app import WorkerMetrics

    text = generate_latest(WorkerMetrics(retention_stats_dir=str(stats_dir)).registry).decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }

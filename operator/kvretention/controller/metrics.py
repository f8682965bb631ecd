"""The operator's Prometheus metrics, on a registry of their own (one per process, not global)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass
class Metrics:
    """Counters a test or a dashboard can read: reconciles, writes, errors, durations."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.reconciles = Counter(
            "kvretention_operator_reconciles",
            "Reconciles run, by result (ok, invalid, error).",
            ["result"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "kvretention_operator_reconcile_duration_seconds",
            "Wall time of one reconcile.",
            registry=r,
        )
        self.apply_writes = Counter(
            "kvretention_operator_apply_writes",
            "Server-side applies that changed (or created) a child, by kind.",
            ["kind"],
            registry=r,
        )
        self.dry_runs = Counter(
            "kvretention_operator_dry_runs",
            "Dry-run applies used to detect drift, by kind.",
            ["kind"],
            registry=r,
        )
        self.deletes = Counter(
            "kvretention_operator_deletes",
            "Children deleted because the spec no longer wants them, by kind.",
            ["kind"],
            registry=r,
        )
        self.status_writes = Counter(
            "kvretention_operator_status_writes",
            "Status subresource writes (only when the computed status changed).",
            registry=r,
        )
        self.events = Counter(
            "kvretention_operator_events",
            "Kubernetes Events posted on condition transitions.",
            registry=r,
        )
        self.errors = Counter(
            "kvretention_operator_errors",
            "Reconciles that failed and were requeued with backoff.",
            registry=r,
        )
        self.leader = Gauge(
            "kvretention_operator_leader",
            "1 while this process holds the leader Lease (or runs without election).",
            registry=r,
        )
        self.watched_objects = Gauge(
            "kvretention_operator_watched_objects",
            "KvRetentionDeployments this process knows about.",
            registry=r,
        )

    def writes(self) -> float:
        """All writes to the API server so far (children applied or deleted, status, events)."""
        total = 0.0
        for metric in (self.apply_writes, self.deletes, self.status_writes):
            for family in metric.collect():
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        total += sample.value
        return total

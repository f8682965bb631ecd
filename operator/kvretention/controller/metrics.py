"""The operator's Prometheus metrics, on a registry of their own (one per process, not global)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram

from kvretention.controller.kvstore_metrics import KvStoreReading
from kvretention.dataplane.metric_decl import counter, gauge

FLEET_LABELS = ("fleet_namespace", "fleet")
"""Not ``namespace``: Prometheus sets that target label to the operator's own namespace."""


@dataclass
class Metrics:
    """Counters a test or a dashboard can read: reconciles, writes, errors, durations."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    _conditions: dict[tuple[str, str], dict[str, tuple[str, str]]] = field(
        default_factory=dict, repr=False
    )

    def __post_init__(self) -> None:
        self._add_operator_metrics(self.registry)
        self._add_fleet_metrics(self.registry)

    def _add_operator_metrics(self, r: CollectorRegistry) -> None:
        """The operator's own work: reconciles, writes, Events, errors, leadership."""
        self.reconciles = counter(
            r,
            "kvretention_operator_reconciles",
            "Reconciles run, by result (ok, invalid, gone, terminating, error).",
            "result",
        )
        self.reconcile_seconds = Histogram(
            "kvretention_operator_reconcile_duration_seconds",
            "Wall time of one reconcile.",
            registry=r,
        )
        self.apply_writes = counter(
            r,
            "kvretention_operator_apply_writes",
            "Server-side applies that changed (or created) a child, by kind.",
            "kind",
        )
        self.dry_runs = counter(
            r,
            "kvretention_operator_dry_runs",
            "Dry-run applies used to detect drift, by kind.",
            "kind",
        )
        self.deletes = counter(
            r,
            "kvretention_operator_deletes",
            "Children deleted because the spec no longer wants them, by kind.",
            "kind",
        )
        self.status_writes = counter(
            r,
            "kvretention_operator_status_writes",
            "Status subresource writes (only when the computed status changed).",
        )
        self.events = counter(
            r, "kvretention_operator_events", "Kubernetes Events posted on condition transitions."
        )
        self.errors = counter(
            r,
            "kvretention_operator_errors",
            "Reconciles that failed and were requeued with backoff.",
        )
        self.leader = gauge(
            r,
            "kvretention_operator_leader",
            "1 while this process holds the leader Lease (or runs without election).",
        )
        self.watched_objects = gauge(
            r,
            "kvretention_operator_watched_objects",
            "KvRetentionDeployments this process knows about.",
        )

    def _add_fleet_metrics(self, r: CollectorRegistry) -> None:
        """Per fleet: its managed master's numbers and its conditions."""
        self.kvstore_up = gauge(
            r,
            "kvretention_kvstore_metrics_up",
            "1 when the last read of the managed Mooncake master's /metrics succeeded, else 0.",
            *FLEET_LABELS,
        )
        self.kvstore_gauges = {
            attr: Gauge(f"kvretention_kvstore_{metric}", help_, FLEET_LABELS, registry=r)
            for attr, metric, help_ in (
                ("capacity_bytes", "capacity_bytes", "Pool capacity (mounted segments)."),
                ("used_bytes", "used_bytes", "Bytes allocated to objects."),
                ("keys", "objects", "Objects stored."),
                ("pinned_keys", "pinned_objects", "Soft-pinned objects."),
                ("pinned_bytes", "pinned_bytes_estimate", "Pinned objects x mean object size."),
                ("evicted_keys", "evicted_objects", "Objects evicted since the master started."),
                ("evicted_bytes", "evicted_bytes", "Bytes evicted since the master started."),
                ("evictions", "evictions", "Eviction rounds since the master started."),
            )
        }
        self.kvstore_pinned_ratio = gauge(
            r,
            "kvretention_kvstore_pinned_ratio",
            "Estimated share of the pool's capacity that soft pins hold.",
            *FLEET_LABELS,
        )
        self.kvstore_budget_ratio = gauge(
            r,
            "kvretention_kvstore_budget_ratio",
            "softPin.budgetRatio: the share of the pool pins may hold (absent: no budget).",
            *FLEET_LABELS,
        )
        self.fleet_condition = Gauge(
            "kvretention_operator_fleet_condition",
            "A fleet's conditions as the operator last computed them: 1 per condition type, "
            "labelled with its status and reason (alerts and the operator dashboard read them).",
            [*FLEET_LABELS, "type", "status", "reason"],
            registry=r,
        )
        self.kvstore_over_budget = gauge(
            r,
            "kvretention_kvstore_over_budget",
            "1 while pins hold more of the pool than softPin.budgetRatio allows, else 0.",
            *FLEET_LABELS,
        )

    def observe_kvstore(
        self, namespace: str, name: str, reading: KvStoreReading, *, budget: float | None
    ) -> None:
        """Export one metrics read of a fleet's managed master."""
        labels = (namespace, name)
        usage = reading.usage
        self.kvstore_up.labels(*labels).set(0 if usage is None else 1)
        if usage is None:
            return
        for attr, metric in self.kvstore_gauges.items():
            metric.labels(*labels).set(getattr(usage, attr))
        ratio = usage.pinned_ratio
        if ratio is not None:
            self.kvstore_pinned_ratio.labels(*labels).set(ratio)
        if budget is None:
            self._remove(self.kvstore_budget_ratio, labels)
            self._remove(self.kvstore_over_budget, labels)
        else:
            self.kvstore_budget_ratio.labels(*labels).set(budget)
            over = ratio is not None and ratio > budget
            self.kvstore_over_budget.labels(*labels).set(1 if over else 0)

    def observe_conditions(
        self, namespace: str, name: str, conditions: Iterable[Mapping[str, Any]]
    ) -> None:
        """Export a fleet's conditions: one series per type, the old one gone when it changes."""
        key = (namespace, name)
        current = {str(c["type"]): (str(c["status"]), str(c.get("reason", ""))) for c in conditions}
        for type_, labels in self._conditions.get(key, {}).items():
            if current.get(type_) != labels:
                with contextlib.suppress(KeyError):
                    self.fleet_condition.remove(namespace, name, type_, *labels)
        for type_, (status, reason) in current.items():
            self.fleet_condition.labels(namespace, name, type_, status, reason).set(1)
        self._conditions[key] = current

    def forget_conditions(self, namespace: str, name: str) -> None:
        """Drop a deleted fleet's condition series."""
        self.observe_conditions(namespace, name, ())
        self._conditions.pop((namespace, name), None)

    def forget_kvstore(self, namespace: str, name: str) -> None:
        """Drop a deleted fleet's series."""
        labels = (namespace, name)
        gauges = [
            self.kvstore_up,
            self.kvstore_pinned_ratio,
            self.kvstore_budget_ratio,
            self.kvstore_over_budget,
            *self.kvstore_gauges.values(),
        ]
        for each in gauges:
            self._remove(each, labels)

    @staticmethod
    def _remove(gauge: Gauge, labels: tuple[str, str]) -> None:
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)

    def writes(self) -> float:
        """All writes to the API server so far (children applied or deleted, status, events)."""
        total = 0.0
        for metric in (self.apply_writes, self.deletes, self.status_writes):
            for family in metric.collect():
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        total += sample.value
        return total

"""Prometheus metrics of one frontend, on its own registry (state on the app, not module globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kvretention.dataplane.frontend.compat import LabelBudget
from kvretention.dataplane.labelled import Children
from kvretention.dataplane.metric_decl import counter, histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class FrontendMetrics:
    """Requests, rejections by reason, ignored fields, hints emitted by TTL, and upstream latency."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = counter(
            self.registry,
            "kvretention_frontend_requests",
            "Finished requests by endpoint and outcome (ok, rejected, error, client_disconnected).",
            "endpoint",
            "outcome",
        )
        self.rejections = counter(
            self.registry,
            "kvretention_frontend_rejections",
            "Requests refused before anything was forwarded, by reason (the error code).",
            "endpoint",
            "reason",
        )
        self.normalized = counter(
            self.registry,
            "kvretention_frontend_normalized",
            "Client quirks removed before templating, by kind (billing_header).",
            "endpoint",
            "kind",
        )
        self.ignored = counter(
            self.registry,
            "kvretention_frontend_ignored_fields",
            "Request fields accepted and not acted on (they do not change what the model computes), "
            "per field path with indexes as * (docs/frontend.md, Forward compatibility); at most "
            "64 distinct fields, later ones as 'other'.",
            "endpoint",
            "field",
        )
        self.ignored_labels = LabelBudget()
        self.hints = counter(
            self.registry,
            "kvretention_frontend_kv_hints",
            "KV-hint envelopes attached to forwarded requests, by TTL in seconds.",
            "endpoint",
            "ttl_seconds",
        )
        self.upstream_latency = histogram(
            self.registry,
            "kvretention_frontend_upstream_latency_seconds",
            "Router latency: to the first chunk (phase=first_chunk) and to the end (phase=total).",
            "endpoint",
            "phase",
            buckets=_LATENCY_BUCKETS,
        )
        # Every request moves these; each label set is resolved once (kvretention.dataplane.labelled).
        self.requests_of = Children(self.requests)
        self.latency_of = Children(self.upstream_latency)

    def count_ignored(self, endpoint: str, fields: tuple[str, ...]) -> None:
        """One count per ignored field of one request (a bounded set of label values)."""
        for name in fields:
            self.ignored.labels(endpoint, self.ignored_labels.label(name)).inc()

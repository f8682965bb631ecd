"""Prometheus metrics of one frontend, on its own registry (state on the app, not module globals)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvretention.dataplane.frontend.compat import LabelBudget
from kvretention.dataplane.labelled import Children
from kvretention.dataplane.metric_decl import counter, histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class ConversationMemory(Protocol):
    """What :class:`MemoryCollector` reads (``resume.Resumer``)."""

    @property
    def resumed_items(self) -> int: ...

    @property
    def parsed_items(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    def __len__(self) -> int: ...


class MemoryCollector:
    """The parse memory's counts, read at scrape time: items resumed against items parsed tell
    whether ``--remembered-conversations`` covers the conversations this frontend serves."""

    def __init__(self, memory: ConversationMemory) -> None:
        self.memory = memory

    def collect(self) -> Iterator[Metric]:
        items = CounterMetricFamily(
            "kvretention_frontend_conversation_items",
            "Conversation items (messages, input items) of requests, by whether the parse of the "
            "conversation's last request covered them (resumed) or they were parsed (parsed). "
            "Agents resend every item each turn: a falling resumed share means more live "
            "conversations than --remembered-conversations.",
            labels=["outcome"],
        )
        items.add_metric(["resumed"], self.memory.resumed_items)
        items.add_metric(["parsed"], self.memory.parsed_items)
        yield items
        yield GaugeMetricFamily(
            "kvretention_frontend_remembered_conversations",
            "Conversations whose last parse is kept, of --remembered-conversations.",
            value=len(self.memory),
        )
        yield GaugeMetricFamily(
            "kvretention_frontend_remembered_conversations_capacity",
            "--remembered-conversations.",
            value=self.memory.capacity,
        )


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
        self._memory: MemoryCollector | None = None

    def watch_memory(self, memory: ConversationMemory) -> None:
        """Serve the parse memory's counts (:class:`MemoryCollector`) from this registry (the
        latest app's memory, when one ``FrontendMetrics`` serves several apps)."""
        if self._memory is None:
            self._memory = MemoryCollector(memory)
            self.registry.register(self._memory)
        self._memory.memory = memory

    def count_ignored(self, endpoint: str, fields: tuple[str, ...]) -> None:
        """One count per ignored field of one request (a bounded set of label values)."""
        for name in fields:
            self.ignored.labels(endpoint, self.ignored_labels.label(name)).inc()

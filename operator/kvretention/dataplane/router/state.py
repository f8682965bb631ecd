"""The router's state: its settings, the workers it knows with their health and load, and its metrics.

Health evidence is weighed by :meth:`RouterState.observe` (see :mod:`kvretention.dataplane.router.health`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from kvretention.common.hop_auth import HopKeyFile
from kvretention.common.sessions import DEFAULT_SESSION_KEYS
from kvretention.dataplane.hop_client import HopClient, HopConnectError
from kvretention.dataplane.labelled import Children
from kvretention.dataplane.metric_decl import counter, gauge
from kvretention.dataplane.router.discovery import Endpoints, PoolRole, Source
from kvretention.dataplane.router.health import (
    DEFAULT_EJECT_AFTER,
    Evidence,
    HealthRecord,
    plan_health,
)
from kvretention.dataplane.router.picker import EndpointPool
from kvretention.dataplane.router.placement import (
    DEFAULT_MAX_PREFIXES,
    DEFAULT_MAX_SESSIONS,
    Balance,
    Policy,
    PrefixIndex,
    SessionPins,
    WorkerView,
)
from kvretention.dataplane.router.residency import (
    STALE_POLLS,
    ResidencySnapshot,
    plan_resident,
    residency_key,
)

log = logging.getLogger("kvretention.dataplane.router.app")


@dataclass
class RouterConfig:
    health_interval_s: float = 2.0
    health_timeout_s: float = 1.0
    eject_after: int = DEFAULT_EJECT_AFTER
    """Failed polls (or broken requests) in a row, with no answer in between, that eject a worker."""
    dns_interval_s: float = 5.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    """Longest gap between two streamed chunks before the request fails with ``upstream_timeout``."""
    bootstrap_port: int | None = None
    """Prefill bootstrap port when a prefill worker's ``/v1/info`` does not say."""
    max_sessions: int = DEFAULT_MAX_SESSIONS
    policy: Policy = "cache-aware"
    """Placement of requests without a session pin: longest prefix match, or least outstanding."""
    max_prefixes: int = DEFAULT_MAX_PREFIXES
    balance: Balance = field(default_factory=Balance)
    kv_residency: bool = False
    """``--kv-residency``: poll each worker's ``/kv/residency`` with its health, and place a session
    where its engine holds the session's KV."""
    ext_proc_host: str = "0.0.0.0"
    ext_proc_port: int = 0
    """``--ext-proc-port``: serve Envoy ``ext_proc`` as the Gateway's endpoint picker (0: off)."""
    session_keys: tuple[str, ...] = DEFAULT_SESSION_KEYS
    """``--session-keys``: where the picker reads a session (the frontends' own keys)."""


@dataclass
class Worker:
    url: str
    role: PoolRole
    health: HealthRecord = field(default_factory=HealthRecord)
    outstanding: int = 0
    served: int = 0
    answered: int = 0
    """Real requests the worker answered (a 2xx status): passive evidence that it is alive."""
    answered_seen: int = 0
    """``answered`` when its health was last weighed."""
    info: dict[str, Any] | None = None
    residency: ResidencySnapshot | None = None
    """The worker's last ``/kv/residency`` summary (``--kv-residency``)."""

    @property
    def healthy(self) -> bool:
        return self.health.healthy

    def view(self) -> WorkerView:
        return WorkerView(
            url=self.url, healthy=self.healthy, outstanding=self.outstanding, served=self.served
        )


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._declare_load()
        self._declare_health()
        self._declare_placement()
        # Every request moves these; each label set is resolved once (kvretention.dataplane.labelled).
        self.requests_of = Children(self.requests)
        self.outstanding_of = Children(self.outstanding)
        self.pool_outstanding_of = Children(self.pool_outstanding)

    def _declare_load(self) -> None:
        """Requests by outcome, and in flight per worker and per pool."""
        self.requests = counter(
            self.registry,
            "kvretention_router_requests",
            "Routed requests by mode and outcome.",
            "mode",
            "outcome",
        )
        self.healthy = gauge(
            self.registry, "kvretention_router_healthy_workers", "Healthy workers by role.", "role"
        )
        self.outstanding = gauge(
            self.registry,
            "kvretention_router_outstanding_requests",
            "Requests in flight per worker.",
            "role",
            "url",
        )
        self.pool_outstanding = gauge(
            self.registry,
            "kvretention_router_pool_outstanding_requests",
            "Requests in flight per pool (role): the signal a pool's autoscaler divides by replicas.",
            "role",
        )
        for role in ("aggregated", "prefill", "decode"):
            self.pool_outstanding.labels(role)  # present at 0 before the first request

    def _declare_health(self) -> None:
        """What the health checks and the hop check decided."""
        self.ejections = counter(
            self.registry,
            "kvretention_router_worker_ejections",
            "Workers taken out of rotation.",
            "role",
            "reason",
        )
        self.health_failures = counter(
            self.registry,
            "kvretention_router_worker_health_failures",
            "Failed health polls and broken requests, by what they showed.",
            "role",
            "evidence",
        )
        self.kept = counter(
            self.registry,
            "kvretention_router_worker_kept",
            "Failing workers kept in rotation: answering real requests, or the pool's last one.",
            "role",
            "why",
        )
        self.hop_refusals = counter(
            self.registry,
            "kvretention_router_hop_refusals",
            "Requests refused with a 403 for a missing or bad x-kvr-tenant-sig (only with "
            "--hop-key-file), by reason (missing, malformed, stale, invalid).",
            "reason",
        )

    def _declare_placement(self) -> None:
        """What decided each placement, and the endpoint picker's answers."""
        self.sticky = counter(
            self.registry,
            "kvretention_router_sticky_placements",
            "Placements decided by a session pin.",
        )
        self.prefix = counter(
            self.registry,
            "kvretention_router_prefix_placements",
            "Placements decided by a prefix match (cache-aware policy).",
        )
        self.resident = counter(
            self.registry,
            "kvretention_router_resident_placements",
            "Placements decided by a worker's engine reporting the session's KV resident "
            "(--kv-residency).",
        )
        self.picks = counter(
            self.registry,
            "kvretention_router_endpoint_picks",
            "Endpoint picker (--ext-proc-port) answers by outcome: session (the session's "
            "frontend), spread (no session: round robin), unavailable (503, none ready).",
            "outcome",
        )
        self.served = counter(
            self.registry,
            "kvretention_router_endpoint_served",
            "Responses the Gateway reported served (x-gateway-destination-endpoint-served), by "
            "whether the endpoint was the one picked (picked) or another (other).",
            "endpoint",
        )
        self.ready_endpoints = gauge(
            self.registry,
            "kvretention_router_ready_endpoints",
            "Frontends the endpoint picker may choose (--endpoint, --endpoint-dns) that are ready.",
        )


@dataclass
class RouterState:
    sources: list[Source]
    config: RouterConfig = field(default_factory=RouterConfig)
    workers: dict[str, Worker] = field(default_factory=dict)
    metrics: RouterMetrics = field(default_factory=RouterMetrics)
    session: HopClient | None = None
    health_session: aiohttp.ClientSession | None = None
    """Polls travel on their own connections, never queued behind long streams."""
    hop_keys: HopKeyFile | None = None
    """``--hop-key-file``: every request must carry the frontend's signature of its tenant."""
    endpoints: Endpoints | None = None
    """``--endpoint``/``--endpoint-dns``: the frontends the endpoint picker chooses among."""
    picker: EndpointPool = field(default_factory=EndpointPool)
    pins: SessionPins = field(init=False)
    prefixes: PrefixIndex = field(init=False)

    def __post_init__(self) -> None:
        self.pins = SessionPins(max_sessions=self.config.max_sessions)
        self.prefixes = PrefixIndex(max_prefixes=self.config.max_prefixes)

    @property
    def disaggregated(self) -> bool:
        return any(s.role != "aggregated" for s in self.sources)

    def pool(self, role: PoolRole) -> list[Worker]:
        return [w for w in self.workers.values() if w.role == role]

    def ready(self) -> bool:
        roles: tuple[PoolRole, ...] = (
            ("prefill", "decode") if self.disaggregated else ("aggregated",)
        )
        return all(any(w.healthy for w in self.pool(r)) for r in roles)

    def resident(
        self, role: PoolRole, *, tenant: str | None, session: str | None, now: float
    ) -> dict[str, int]:
        """URL -> the session's tokens each worker of ``role`` reports resident (fresh reports
        only; empty without ``--kv-residency``)."""
        if not self.config.kv_residency:
            return {}
        return plan_resident(
            {w.url: w.residency for w in self.pool(role)},
            key=residency_key(tenant, session),
            now=now,
            max_age_s=STALE_POLLS * self.config.health_interval_s,
        )

    def observe(self, worker: Worker, evidence: Evidence) -> None:
        """Weigh one poll's or one request's evidence about ``worker`` (see ``router.health``)."""
        served_since = worker.answered != worker.answered_seen
        worker.answered_seen = worker.answered
        others = any(w.healthy for w in self.pool(worker.role) if w is not worker)
        step = plan_health(
            worker.health,
            evidence,
            served_since=served_since,
            last_healthy=not others,
            eject_after=self.config.eject_after,
        )
        if evidence != "ok":
            self.metrics.health_failures.labels(worker.role, evidence).inc()
        if step.ejected is not None:
            log.warning("ejecting %s worker %s (%s)", worker.role, worker.url, step.ejected)
            self.metrics.ejections.labels(worker.role, step.ejected).inc()
        elif step.admitted:
            log.info("admitting %s worker %s", worker.role, worker.url)
        elif step.held is not None:
            if step.held == "last_worker" and worker.health.failures < self.config.eject_after:
                log.warning(
                    "keeping slow %s worker %s: it is the last healthy one", worker.role, worker.url
                )
            self.metrics.kept.labels(worker.role, step.held).inc()
        worker.health = step.record
        self._publish()

    def answered(self, worker: Worker) -> None:
        """A real request got a status line from ``worker``: it is alive, however slow its polls."""
        worker.answered += 1

    def _publish(self) -> None:
        for role in ("aggregated", "prefill", "decode"):
            self.metrics.healthy.labels(role).set(
                sum(1 for w in self.workers.values() if w.role == role and w.healthy)
            )

    def begin(self, worker: Worker) -> None:
        worker.outstanding += 1
        worker.served += 1
        self.metrics.outstanding_of(worker.role, worker.url).set(worker.outstanding)
        self.metrics.pool_outstanding_of(worker.role).inc()

    def end(self, worker: Worker) -> None:
        worker.outstanding -= 1
        self.metrics.outstanding_of(worker.role, worker.url).set(worker.outstanding)
        self.metrics.pool_outstanding_of(worker.role).dec()


STATE: Final = web.AppKey("router_state", RouterState)


def connect_evidence(exc: aiohttp.ClientConnectorError | HopConnectError) -> Evidence:
    """A refused connection is decisive (no process listens); anything else is not."""
    return "refused" if isinstance(exc.os_error, ConnectionRefusedError) else "error"


def failure_evidence(exc: TimeoutError | aiohttp.ClientError) -> Evidence:
    """What a failed poll shows: slowness (a timeout), no listener (refused), or another error."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError | HopConnectError):
        return connect_evidence(exc)
    return "error"


def ready_evidence(status: int) -> Evidence:
    """A ``/readyz`` answer: 200 ready, 503 says not ready (decisive), anything else is an error."""
    return "ok" if status == 200 else "not_ready" if status == 503 else "error"

"""Lease-based leader election (``coordination.k8s.io/v1``), the client-go way.

Only the holder of the Lease reconciles; standbys poll it. A standby takes over once it has seen
the same lease record, unrenewed, for a whole ``leaseDurationSeconds`` by its *own* clock (so clock
skew between nodes does not matter). A leader that cannot renew within ``renew_deadline_s`` stops
leading: the operator process exits non-zero and Kubernetes restarts it as a standby.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kvretention.controller.kinds import LEASE
from kvretention.controller.kube import ApiError, Kube, NotFound, RetryLater

log = logging.getLogger(__name__)

LEASE_NAME: Final = "kvretention-operator"
DEFAULT_LEASE_DURATION_S: Final = 15


def election_timings(duration_s: int) -> tuple[float, float]:
    """(renew deadline, retry period) for a lease duration, in client-go's 15 : 10 : 2 ratio.

    A leader gives up after the renew deadline, well before a standby may take over (one whole
    duration unrenewed), so two processes never both act; retries fit several times into each.
    """
    return duration_s * 2 / 3, duration_s * 2 / 15


class LeadershipLost(Exception):
    """The Lease could not be renewed in time; the process must stop acting."""


def default_identity() -> str:
    """``<pod or host name>_<random>``: unique per process, readable in ``kubectl get lease``."""
    host = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{host}_{uuid.uuid4().hex[:8]}"


def micro_time(now: dt.datetime) -> str:
    """Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def can_acquire(spec: Mapping[str, Any], *, identity: str, unchanged_for_s: float) -> bool:
    """Whether ``identity`` may take (or keep) the Lease whose spec is ``spec``.

    ``unchanged_for_s`` is how long this process has watched the same record go unrenewed.
    """
    holder = spec.get("holderIdentity") or ""
    if holder in ("", identity):
        return True
    duration = float(spec.get("leaseDurationSeconds") or 0)
    return unchanged_for_s >= duration


def build_lease_spec(
    previous: Mapping[str, Any] | None, *, identity: str, now: dt.datetime, duration_s: int
) -> dict[str, Any]:
    """The spec that records ``identity`` as holder, counting a transition when the holder changes."""
    previous = previous or {}
    same_holder = previous.get("holderIdentity") == identity
    transitions = int(previous.get("leaseTransitions") or 0)
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": duration_s,
        "acquireTime": previous.get("acquireTime") if same_holder else micro_time(now),
        "renewTime": micro_time(now),
        "leaseTransitions": transitions if same_holder or not previous else transitions + 1,
    }


@dataclass
class LeaderElector:
    """Acquire, hold and release one Lease."""

    kube: Kube
    namespace: str
    identity: str
    name: str = LEASE_NAME
    duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self.is_leader = False

    def _unchanged_for(self, spec: Mapping[str, Any]) -> float:
        key = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        now = time.monotonic()
        if key != self._observed:
            self._observed, self._observed_at = key, now
        return now - self._observed_at

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; False on any failure (someone else holds it, a conflict, an API error)."""
        path = LEASE.object_path(self.namespace, self.name)
        now = dt.datetime.now(dt.UTC)
        try:
            try:
                lease = await self.kube.request("GET", path, retry=False)
            except NotFound:
                body = {
                    "apiVersion": LEASE.api_version,
                    "kind": LEASE.kind,
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": build_lease_spec(
                        None, identity=self.identity, now=now, duration_s=self.duration_s
                    ),
                }
                await self.kube.request(
                    "POST", LEASE.collection_path(self.namespace), body=body, retry=False
                )
                return True
            spec = lease.get("spec") or {}
            unchanged_for = self._unchanged_for(spec)
            if not can_acquire(spec, identity=self.identity, unchanged_for_s=unchanged_for):
                return False
            lease["spec"] = build_lease_spec(
                spec, identity=self.identity, now=now, duration_s=self.duration_s
            )
            await self.kube.request("PUT", path, body=lease, retry=False)
            return True
        except (ApiError, NotFound, RetryLater, OSError) as exc:
            log.debug("lease attempt failed: %s", exc)
            return False
        except Exception as exc:  # urllib3 connection errors and the like
            log.debug("lease attempt failed: %s", exc)
            return False

    async def acquire(self) -> None:
        """Block until this process holds the Lease (standbys wait here)."""
        log.info("waiting for lease %s/%s as %s", self.namespace, self.name, self.identity)
        while True:
            if await self.try_acquire_or_renew():
                break
            await asyncio.sleep(self.retry_period_s * (1 + random.random() * 0.2))
        self.is_leader = True
        log.info("acquired lease %s/%s as %s", self.namespace, self.name, self.identity)

    async def hold(self) -> None:
        """Renew every retry period; raise LeadershipLost if a renewal deadline passes."""
        last_renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.retry_period_s)
            if await self.try_acquire_or_renew():
                last_renewed = time.monotonic()
            elif time.monotonic() - last_renewed > self.renew_deadline_s:
                self.is_leader = False
                raise LeadershipLost(f"could not renew lease {self.namespace}/{self.name}")

    async def release(self) -> None:
        """Give the Lease up on a clean shutdown so a standby takes over at once."""
        if not self.is_leader:
            return
        self.is_leader = False
        path = LEASE.object_path(self.namespace, self.name)
        try:
            lease = await self.kube.request("GET", path, retry=False)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            now = micro_time(dt.datetime.now(dt.UTC))
            lease["spec"] = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1}
            lease["spec"]["renewTime"] = now
            await self.kube.request("PUT", path, body=lease, retry=False)
            log.info("released lease %s/%s", self.namespace, self.name)
        except Exception as exc:
            log.warning("could not release lease: %s", exc)

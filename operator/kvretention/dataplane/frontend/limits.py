"""Per-tenant request limits: requests per second (a token bucket) and requests in flight.

Pure but for the clock passed in: :meth:`TenantLimiter.acquire` answers a :class:`Lease` to
release when the request finishes, or a :class:`Refusal` with the seconds after which a retry can
succeed (the 429's ``retry-after``). Each tenant has its own bucket and counter, so one tenant's
burst never spends another's allowance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

LimitKind = Literal["rate", "concurrency"]


@dataclass(frozen=True)
class Limits:
    """One tenant's limits; None: unlimited."""

    requests_per_second: float | None = None
    burst: int | None = None
    """Requests a quiet tenant may send at once (the bucket's size); default: the rate rounded
    up, at least 1."""
    concurrency: int | None = None
    """Requests in flight at once (a stream counts until it ends)."""

    def __post_init__(self) -> None:
        if self.requests_per_second is not None and not self.requests_per_second > 0:
            raise ValueError("requests_per_second must be > 0")
        if self.burst is not None and self.burst < 1:
            raise ValueError("burst must be >= 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")

    @property
    def bucket_size(self) -> float:
        if self.burst is not None:
            return float(self.burst)
        return float(max(1, math.ceil(self.requests_per_second or 1)))

    @property
    def unlimited(self) -> bool:
        return self.requests_per_second is None and self.concurrency is None


UNLIMITED: Final = Limits()


@dataclass(frozen=True)
class LimitPolicy:
    """Fleet defaults, and per-tenant overrides (a whole :class:`Limits` each)."""

    default: Limits = UNLIMITED
    tenants: Mapping[str, Limits] = field(default_factory=lambda: MappingProxyType({}))

    def for_tenant(self, tenant: str) -> Limits:
        return self.tenants.get(tenant, self.default)


@dataclass(frozen=True)
class Refusal:
    kind: LimitKind
    retry_after_s: int
    """Whole seconds (``retry-after`` takes an integer), at least 1."""


@dataclass
class _TenantState:
    tokens: float
    stamp: float
    in_flight: int = 0


@dataclass
class Lease:
    """A request admitted under its tenant's limits; :meth:`release` once, when it ends."""

    _limiter: TenantLimiter
    tenant: str
    _released: bool = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limiter._release(self.tenant)


class TenantLimiter:
    """Token buckets and in-flight counters, one per tenant (event-loop confined: no locks)."""

    def __init__(self, policy: LimitPolicy) -> None:
        self.policy = policy
        self._state: dict[str, _TenantState] = {}

    def acquire(self, tenant: str, *, now: float) -> Lease | Refusal:
        limits = self.policy.for_tenant(tenant)
        state = self._state.get(tenant)
        if state is None:
            state = self._state[tenant] = _TenantState(tokens=limits.bucket_size, stamp=now)
        if limits.concurrency is not None and state.in_flight >= limits.concurrency:
            return Refusal("concurrency", 1)
        rate = limits.requests_per_second
        if rate is not None:
            size = limits.bucket_size
            state.tokens = min(size, state.tokens + max(0.0, now - state.stamp) * rate)
            state.stamp = now
            if state.tokens < 1.0:
                return Refusal("rate", max(1, math.ceil((1.0 - state.tokens) / rate)))
            state.tokens -= 1.0
        state.in_flight += 1
        return Lease(self, tenant)

    def in_flight(self, tenant: str) -> int:
        state = self._state.get(tenant)
        return 0 if state is None else state.in_flight

    def _release(self, tenant: str) -> None:
        state = self._state.get(tenant)
        if state is not None and state.in_flight > 0:
            state.in_flight -= 1


LIMIT_FIELDS: Final = {"rps": "requests_per_second", "burst": "burst", "concurrency": "concurrency"}


def parse_limits(text: str) -> Limits:
    """``rps=5,burst=10,concurrency=2`` (any subset; empty: unlimited) -> :class:`Limits`;
    raises ``ValueError`` naming the bad part."""
    values: dict[str, float | int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, raw = part.partition("=")
        field_name = LIMIT_FIELDS.get(name.strip())
        if not sep or field_name is None:
            raise ValueError(f"{part!r} is not one of {', '.join(f'{k}=N' for k in LIMIT_FIELDS)}")
        try:
            values[field_name] = float(raw) if field_name == "requests_per_second" else int(raw)
        except ValueError:
            raise ValueError(f"{part!r}: {raw.strip()!r} is not a number") from None
    return Limits(**values)  # type: ignore[arg-type]


def parse_tenant_limits(items: tuple[str, ...]) -> dict[str, Limits]:
    """``TENANT:rps=5,concurrency=2`` items -> per-tenant overrides."""
    out: dict[str, Limits] = {}
    for item in items:
        tenant, sep, text = item.partition(":")
        if not sep or not tenant.strip():
            raise ValueError(f"{item!r} is not TENANT:rps=N,burst=N,concurrency=N")
        out[tenant.strip()] = parse_limits(text)
    return out

"""API keys from mounted Secrets: who a request is (its tenant), checked before anything else.

Keys live in one or more directories (each a Kubernetes Secret mounted as a volume; docs/auth.md):
every file is one tenant, named by the file (:data:`~kvretention.dataplane.tenancy.TENANT_PATTERN`),
and holds that tenant's keys, one per line (blank lines and ``#`` comments are skipped; two lines
let a key rotate without a gap). Hidden entries (the kubelet's ``..data`` links) are skipped. A key
listed for two tenants makes the whole set invalid: the previous set stays in force.

:class:`KeyStore` re-reads the directories every few seconds (the kubelet swaps a mounted Secret's
files in place), so a rotated key takes effect without a restart. Keys are kept only as SHA-256
digests, looked up by digest and confirmed with :func:`hmac.compare_digest`, and never logged: the
log and the metrics name tenants and files, never a key.

:class:`Gate` is the frontend's middleware: on every ``/v1/`` route, before the body is read, a
missing or wrong key gets the provider's 401, a tenant past its limits the provider's 429 with
``retry-after`` (:mod:`~kvretention.dataplane.frontend.limits`); an admitted request carries its
tenant (:data:`TENANT`) for the router header, the trace and the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Counter, Gauge

from kvretention.dataplane.frontend import errors
from kvretention.dataplane.frontend.errors import FrontendError, Provider
from kvretention.dataplane.frontend.limits import LimitPolicy, Refusal, TenantLimiter
from kvretention.dataplane.tenancy import HEADER_TENANT, TENANT_PATTERN, valid_tenant
from kvretention.dataplane.trace import RequestTrace

log = logging.getLogger("kvretention.frontend.auth")

TENANT: Final = web.RequestKey("kvretention_tenant", str)
"""The authenticated tenant of a request (absent with auth off)."""

DEFAULT_RELOAD_S: Final = 5.0
MIN_KEY_CHARS: Final = 16
BUCKET_BYTES: Final = 4
MAX_KEY_FILE_BYTES: Final = 1024 * 1024
PROTECTED_PREFIX: Final = "/v1/"
"""Routes that need a key: every API route. Probes and ``/metrics`` stay open to the kubelet and
Prometheus (they answer no model output and carry no key)."""


class KeysError(ValueError):
    """The key files cannot be used as they are (the message names files, never a key)."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True)
class KeyTable:
    """SHA-256 of each key -> its tenant."""

    by_digest: Mapping[bytes, str] = field(default_factory=dict)
    _buckets: Mapping[bytes, tuple[tuple[bytes, str], ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        buckets: dict[bytes, list[tuple[bytes, str]]] = {}
        for digest, tenant in self.by_digest.items():
            buckets.setdefault(digest[:BUCKET_BYTES], []).append((digest, tenant))
        object.__setattr__(self, "_buckets", {k: tuple(v) for k, v in buckets.items()})

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(self.by_digest.values())

    def __len__(self) -> int:
        return len(self.by_digest)

    def tenant_for(self, key: str) -> str | None:
        """The key's tenant, or None. The presented key is hashed first, so no comparison ever
        sees its bytes; the digest is found by its first bytes and compared whole with
        :func:`hmac.compare_digest`, whose time does not depend on where the bytes differ."""
        digest = _digest(key)
        found = None
        for known, tenant in self._buckets.get(digest[:BUCKET_BYTES], ()):
            if hmac.compare_digest(known, digest):
                found = tenant
        return found


def parse_key_lines(text: str, *, source: str) -> list[str]:
    """The keys of one tenant file: one per line, ``#`` comments and blank lines skipped."""
    keys: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if len(line) < MIN_KEY_CHARS or not line.isascii() or any(c.isspace() for c in line):
            raise KeysError(
                f"{source} line {number}: a key is at least {MIN_KEY_CHARS} printable ASCII "
                "characters with no spaces"
            )
        keys.append(line)
    return keys


def tenant_files(directory: Path) -> list[Path]:
    """The tenant files of one mounted Secret, by name; hidden entries skipped."""
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        raise KeysError(f"cannot list {directory}: {exc.strerror}") from None
    return [p for p in entries if not p.name.startswith(".") and p.is_file()]


def load_keys(directories: Sequence[Path]) -> KeyTable:
    """Every directory's tenant files as one table; raises :class:`KeysError` on a file that
    cannot be read, a file name that is not a tenant name, a malformed key, or a key listed for
    two tenants."""
    table: dict[bytes, str] = {}
    for directory in directories:
        for path in tenant_files(directory):
            tenant = path.name
            if not valid_tenant(tenant):
                raise KeysError(f"{path}: the file name is not a tenant name ({TENANT_PATTERN})")
            try:
                with path.open("rb") as f:
                    data = f.read(MAX_KEY_FILE_BYTES + 1)
            except OSError as exc:
                raise KeysError(f"cannot read {path}: {exc.strerror}") from None
            if len(data) > MAX_KEY_FILE_BYTES:
                raise KeysError(f"{path} is larger than {MAX_KEY_FILE_BYTES} bytes")
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise KeysError(f"{path} is not UTF-8 text") from None
            for key in parse_key_lines(text, source=str(path)):
                digest = _digest(key)
                other = table.setdefault(digest, tenant)
                if other != tenant:
                    raise KeysError(
                        f"{path}: a key of tenant {tenant} is also a key of tenant {other}"
                    )
    return KeyTable(table)


class AuthMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.refusals = Counter(
            "kvretention_frontend_auth_refusals",
            "Requests refused with a 401, by reason (missing_api_key, invalid_api_key).",
            ["reason"],
            registry=registry,
        )
        self.requests = Counter(
            "kvretention_frontend_tenant_requests",
            "Authenticated requests by tenant and HTTP status (429: past the tenant's limits).",
            ["tenant", "status"],
            registry=registry,
        )
        self.limited = Counter(
            "kvretention_frontend_tenant_limited",
            "Requests refused with a 429 by tenant and limit (rate, concurrency).",
            ["tenant", "limit"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "kvretention_frontend_tenant_in_flight",
            "Requests in flight by tenant.",
            ["tenant"],
            registry=registry,
        )
        self.keys = Gauge(
            "kvretention_frontend_auth_keys",
            "API keys in force (from the mounted Secrets).",
            registry=registry,
        )
        self.tenants = Gauge(
            "kvretention_frontend_auth_tenants",
            "Tenants with at least one API key in force.",
            registry=registry,
        )
        self.reloads = Counter(
            "kvretention_frontend_auth_reloads",
            "Key-file reloads by outcome (ok; error: the previous keys stay in force).",
            ["outcome"],
            registry=registry,
        )


class KeyStore:
    """The key table in force, re-read from ``directories`` when their files change."""

    def __init__(self, directories: Sequence[Path], *, reload_s: float = DEFAULT_RELOAD_S) -> None:
        self.directories = tuple(directories)
        self.reload_s = reload_s
        self.table = load_keys(self.directories)  # raises at start: a bad Secret stops it
        self._problem: str | None = None
        self.metrics: AuthMetrics | None = None
        log.info(
            "auth on: %d keys for %d tenants from %s",
            len(self.table),
            len(self.table.tenants),
            ", ".join(map(str, self.directories)),
        )

    def refresh(self) -> bool:
        """Re-read the files; True when a new table is in force. A set that cannot be used is
        logged once per distinct problem (files, never keys) and the previous table kept. The
        files are a few lines each: reading them is cheaper than trusting modification times."""
        try:
            table = load_keys(self.directories)
        except KeysError as exc:
            problem = str(exc)
            if problem != self._problem:
                self._problem = problem
                log.error("auth keys not reloaded, the previous keys stay in force: %s", problem)
                self._count("error")
            return False
        self._problem = None
        if table.by_digest == self.table.by_digest:
            return False
        self.table = table
        self._count("ok")
        log.info("auth keys reloaded: %d keys for %d tenants", len(table), len(table.tenants))
        return True

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.reloads.labels(outcome).inc()
            self.metrics.keys.set(len(self.table))
            self.metrics.tenants.set(len(self.table.tenants))

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.reload_s)
            try:
                self.refresh()
            except Exception:  # never let the watcher die: the keys in force stay
                log.exception("auth key reload failed")


def presented_keys(headers: Mapping[str, str], provider: Provider) -> list[str]:
    """The credentials a request carries, the provider's own header first: ``x-api-key``
    (Anthropic, Claude Code) and ``Authorization: Bearer`` (OpenAI, Codex, Claude Code's
    ``ANTHROPIC_AUTH_TOKEN``)."""
    api_key = headers.get("x-api-key", "").strip()
    authorization = headers.get("authorization", "")
    scheme, _, token = authorization.strip().partition(" ")
    bearer = token.strip() if scheme.lower() == "bearer" else ""
    ordered = (api_key, bearer) if provider is Provider.ANTHROPIC else (bearer, api_key)
    return [k for k in ordered if k]


Respond = Callable[[FrontendError, Provider], web.StreamResponse]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Gate:
    """Authentication and per-tenant limits for the frontend's API routes."""

    keys: KeyStore
    limits: LimitPolicy = field(default_factory=LimitPolicy)
    clock: Callable[[], float] = time.monotonic
    limiter: TenantLimiter = field(init=False)
    metrics: AuthMetrics | None = None
    trace: RequestTrace | None = None

    def __post_init__(self) -> None:
        self.limiter = TenantLimiter(self.limits)

    def authenticate(self, headers: Mapping[str, str], provider: Provider) -> str | FrontendError:
        """The request's tenant, or the provider's 401."""
        presented = presented_keys(headers, provider)
        if not presented:
            return errors.missing_api_key(provider)
        table = self.keys.table
        for key in presented:
            tenant = table.tenant_for(key)
            if tenant is not None:
                return tenant
        return errors.invalid_api_key(provider)

    def install(
        self,
        app: web.Application,
        *,
        registry: CollectorRegistry,
        respond: Respond,
        provider_for: Callable[[str], Provider],
        trace: RequestTrace | None = None,
    ) -> None:
        """Add the middleware (inside the app's error layer) and the key watcher to ``app``;
        refusals go to ``trace`` (the tenant when known, never a key)."""
        self.metrics = self.keys.metrics = AuthMetrics(registry)
        self.trace = trace
        self.keys._count("ok")
        app.middlewares.append(self._middleware(respond=respond, provider_for=provider_for))
        app.cleanup_ctx.append(self._watching)

    async def _watching(self, _app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(self.keys.watch(), name="kvretention-auth-keys")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def _middleware(
        self, *, respond: Respond, provider_for: Callable[[str], Provider]
    ) -> Middleware:
        @web.middleware
        async def gate(request: web.Request, handler: Handler) -> web.StreamResponse:
            if not request.path.startswith(PROTECTED_PREFIX):
                return await handler(request)
            provider = provider_for(request.path)
            who = self.authenticate(request.headers, provider)
            metrics = self.metrics
            if isinstance(who, FrontendError):
                if metrics is not None:
                    metrics.refusals.labels(who.code).inc()
                self._trace(request, who, tenant=None)
                response = respond(who, provider)
                response.force_close()  # the unread body is not worth reading
                return response
            lease = self.limiter.acquire(who, now=self.clock())
            if isinstance(lease, Refusal):
                if metrics is not None:
                    metrics.limited.labels(who, lease.kind).inc()
                    metrics.requests.labels(who, "429").inc()
                err = errors.rate_limited(
                    tenant=who, kind=lease.kind, retry_after=lease.retry_after_s
                )
                self._trace(request, err, tenant=who)
                return respond(err, provider)
            request[TENANT] = who
            status = 500
            if metrics is not None:
                metrics.in_flight.labels(who).inc()
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            finally:
                lease.release()
                if metrics is not None:
                    metrics.in_flight.labels(who).dec()
                    metrics.requests.labels(who, str(status)).inc()

        return gate

    def _trace(self, request: web.Request, err: FrontendError, *, tenant: str | None) -> None:
        if self.trace is None:
            return
        extra: dict[str, Any] = {"tenant": tenant} if tenant is not None else {}
        self.trace.record(
            request_id=uuid.uuid4().hex,
            outcome="rejected",
            path=request.path,
            status=err.status,
            error_code=err.code,
            **extra,
        )


def tenant_of(request: web.Request) -> str | None:
    return request.get(TENANT)


def tenant_headers(request: web.Request) -> dict[str, str]:
    """The router header naming the request's tenant (none with auth off)."""
    tenant = request.get(TENANT)
    return {HEADER_TENANT: tenant} if tenant is not None else {}

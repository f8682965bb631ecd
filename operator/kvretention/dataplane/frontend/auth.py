"""API keys from mounted Secrets: who a request is (its tenant), checked before anything else.

Keys live in one or more directories (each a Kubernetes Secret mounted as a volume; docs/auth.md):
every file is one tenant, named by the file (:data:`~kvretention.common.tenancy.TENANT_PATTERN`),
and holds that tenant's keys, one per line (blank lines and ``#`` comments are skipped; two lines
let a key rotate without a gap). Hidden entries (the kubelet's ``..data`` links) are skipped.

:class:`KeyStore` re-reads the directories every few seconds (the kubelet swaps a mounted Secret's
files in place), so a rotated key takes effect without a restart. What is wrong in a Secret is
skipped and reported, the rest applied, so a removed key stops working even when another line is
broken: a malformed line, a file whose name is not a tenant name, and a key listed for two tenants
(refused for both: whose it is cannot be known). Only a set that cannot be read at all keeps the
previous keys in force: a directory or file that cannot be read, or files that hold problems and
no usable key (a Secret garbled whole); with no previous keys (at start) that stops the frontend. Keys are kept only as SHA-256
digests, looked up by digest and confirmed with :func:`hmac.compare_digest`, and never logged: the
log and the metrics name tenants and files, never a key.

:class:`Gate` is the frontend's middleware: on every ``/v1/`` route, before the body is read, a
missing or wrong key gets the provider's 401 (with ``Expect: 100-continue``, instead of the
``100 Continue``: :meth:`Gate.expect_handler`), a tenant past its limits the provider's 429 with
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
from aiohttp.web_urldispatcher import _default_expect_handler
from prometheus_client import CollectorRegistry

from kvretention.api.names import METRICS_PATH
from kvretention.common.hop_auth import (
    HopKeyFile,
    key_lines,
    read_key_file,
    signed_headers,
    well_formed_key,
)
from kvretention.common.tenancy import TENANT_PATTERN, valid_tenant
from kvretention.common.trace import RequestTrace
from kvretention.dataplane.frontend import errors
from kvretention.dataplane.frontend.errors import FrontendError, Provider
from kvretention.dataplane.frontend.limits import LimitPolicy, Refusal, TenantLimiter
from kvretention.dataplane.metric_decl import counter, gauge

log = logging.getLogger("kvretention.frontend.auth")

TENANT: Final = web.RequestKey("kvretention_tenant", str)
"""The authenticated tenant of a request (absent with auth off)."""

DEFAULT_RELOAD_S: Final = 5.0
MIN_KEY_CHARS: Final = 16
BUCKET_BYTES: Final = 4
MAX_KEY_FILE_BYTES: Final = 1024 * 1024
CLIENT_CLOSED_STATUS: Final = 499
"""The status a request the client abandoned is counted and traced with (nginx's convention)."""
PROTECTED_PREFIX: Final = "/v1/"
"""Routes that need a key: every API route, and ``/metrics`` (it names tenants and their traffic;
scrapers read ``--metrics-port``, which serves nothing else and sits outside this gate). The probes
stay open to the kubelet (they answer no model output and carry no key)."""


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


def parse_key_lines(text: str, *, source: str) -> tuple[list[str], list[str]]:
    """The keys of one tenant file (one per line, ``#`` comments and blank lines skipped) and
    a problem per malformed line, naming ``source`` and the line's number, never its text."""
    keys: list[str] = []
    problems: list[str] = []
    for number, line in key_lines(text):
        if not well_formed_key(line, min_chars=MIN_KEY_CHARS):
            problems.append(
                f"{source} line {number}: a key is at least {MIN_KEY_CHARS} printable ASCII "
                "characters with no spaces (line skipped)"
            )
            continue
        keys.append(line)
    return keys, problems


def tenant_files(directory: Path) -> list[Path]:
    """The tenant files of one mounted Secret, by name; hidden entries skipped."""
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        raise KeysError(f"cannot list {directory}: {exc.strerror}") from None
    return [p for p in entries if not p.name.startswith(".") and p.is_file()]


@dataclass(frozen=True)
class LoadedKeys:
    """The usable keys of a set of mounted Secrets, and what was skipped (files and line
    numbers, never a key)."""

    table: KeyTable
    problems: tuple[str, ...] = ()


def load_keys(directories: Sequence[Path]) -> LoadedKeys:
    """Every directory's tenant files as one table. Skipped and reported: a file whose name is
    not a tenant name, a malformed line, a key listed for two tenants (refused for both). Raises
    :class:`KeysError` when a directory or file cannot be read (the set is unknown)."""
    owners: dict[bytes, tuple[str, str]] = {}  # digest -> (tenant, where it was first listed)
    shared: set[bytes] = set()
    problems: list[str] = []
    for directory in directories:
        for path in tenant_files(directory):
            tenant = path.name
            if not valid_tenant(tenant):
                problems.append(
                    f"{path}: the file name is not a tenant name ({TENANT_PATTERN}; file skipped)"
                )
                continue
            keys, bad = parse_key_lines(
                read_key_file(path, limit=MAX_KEY_FILE_BYTES, error=KeysError), source=str(path)
            )
            problems += bad
            for key in keys:
                digest = _digest(key)
                other, where = owners.setdefault(digest, (tenant, str(path)))
                if other != tenant:
                    shared.add(digest)
                    problems.append(
                        f"{path}: a key of tenant {tenant} is also a key of tenant {other} "
                        f"({where}; refused for both)"
                    )
    table = {digest: tenant for digest, (tenant, _) in owners.items() if digest not in shared}
    return LoadedKeys(KeyTable(table), tuple(problems))


def usable_keys(directories: Sequence[Path]) -> LoadedKeys:
    """:func:`load_keys`, raising :class:`KeysError` also when the files hold problems and no
    usable key: a Secret garbled whole is a set that cannot be read, not a revocation of every
    key (files with no key line and no problem are one)."""
    loaded = load_keys(directories)
    if loaded.problems and not loaded.table:
        raise KeysError("no usable key: " + "; ".join(loaded.problems))
    return loaded


class AuthMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.refusals = counter(
            registry,
            "kvretention_frontend_auth_refusals",
            "Requests refused with a 401, by reason (missing_api_key, invalid_api_key).",
            "reason",
        )
        self.requests = counter(
            registry,
            "kvretention_frontend_tenant_requests",
            "Authenticated requests by tenant and HTTP status (429: past the tenant's limits).",
            "tenant",
            "status",
        )
        self.limited = counter(
            registry,
            "kvretention_frontend_tenant_limited",
            "Requests refused with a 429 by tenant and limit (rate, concurrency).",
            "tenant",
            "limit",
        )
        self.limit = gauge(
            registry,
            "kvretention_frontend_tenant_limit",
            "This pod's limits in force by tenant ('*': the default) and limit (requests_per_"
            "second, burst, concurrency); the operator renders each pod its share of the fleet's.",
            "tenant",
            "limit",
        )
        self.in_flight = gauge(
            registry,
            "kvretention_frontend_tenant_in_flight",
            "Requests in flight by tenant.",
            "tenant",
        )
        self.keys = gauge(
            registry,
            "kvretention_frontend_auth_keys",
            "API keys in force (from the mounted Secrets).",
        )
        self.tenants = gauge(
            registry,
            "kvretention_frontend_auth_tenants",
            "Tenants with at least one API key in force.",
        )
        self.reloads = counter(
            registry,
            "kvretention_frontend_auth_reloads",
            "Key-file reloads by outcome (ok: a new set in force, its skipped lines in "
            "kvretention_frontend_auth_key_problems; error: unreadable, the previous keys stay).",
            "outcome",
        )
        self.problems = gauge(
            registry,
            "kvretention_frontend_auth_key_problems",
            "Lines and files of the mounted Secrets skipped by the last reload that was read "
            "(a malformed line, a file name that is not a tenant, a key listed for two tenants); "
            "the log names each by file and line number.",
        )


class KeyStore:
    """The key table in force, re-read from ``directories`` when their files change."""

    def __init__(self, directories: Sequence[Path], *, reload_s: float = DEFAULT_RELOAD_S) -> None:
        self.directories = tuple(directories)
        self.reload_s = reload_s
        loaded = usable_keys(self.directories)  # raises at start: an unreadable Secret stops it
        self.table = loaded.table
        self.problems = loaded.problems
        self._problem: str | None = None
        self.metrics: AuthMetrics | None = None
        self._report(loaded.problems)
        log.info(
            "auth on: %d keys for %d tenants from %s",
            len(self.table),
            len(self.table.tenants),
            ", ".join(map(str, self.directories)),
        )

    def refresh(self) -> bool:
        """Re-read the files; True when a new table is in force. Skipped lines are reported
        (logged when they change) and the rest applied; a set that cannot be read is logged once
        per distinct problem (files, never keys) and the previous table kept. The files are a few
        lines each: reading them is cheaper than trusting modification times."""
        try:
            loaded = usable_keys(self.directories)
        except KeysError as exc:
            problem = str(exc)
            if problem != self._problem:
                self._problem = problem
                log.error("auth keys not reloaded, the previous keys stay in force: %s", problem)
                self._count("error")
            return False
        self._problem = None
        if loaded.problems != self.problems:
            self._report(loaded.problems)
        self.problems = loaded.problems
        if loaded.table.by_digest == self.table.by_digest:
            self._set_problems()
            return False
        self.table = loaded.table
        self._count("ok")
        log.info(
            "auth keys reloaded: %d keys for %d tenants (%d lines skipped)",
            len(self.table),
            len(self.table.tenants),
            len(loaded.problems),
        )
        return True

    def _report(self, problems: tuple[str, ...]) -> None:
        for problem in problems:
            log.error("auth keys: %s", problem)

    def _set_problems(self) -> None:
        if self.metrics is not None:
            self.metrics.problems.set(len(self.problems))

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.reloads.labels(outcome).inc()
            self.metrics.keys.set(len(self.table))
            self.metrics.tenants.set(len(self.table.tenants))
        self._set_problems()

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
ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


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

    def admit_key(
        self, request: web.Request, *, respond: Respond, provider: Provider
    ) -> str | web.StreamResponse:
        """The request's tenant, or its 401 (counted and traced, the connection to be closed:
        the unread body is not worth reading)."""
        who = self.authenticate(request.headers, provider)
        if not isinstance(who, FrontendError):
            return who
        if self.metrics is not None:
            self.metrics.refusals.labels(who.code).inc()
        self._trace(request, who, tenant=None)
        response = respond(who, provider)
        response.force_close()
        return response

    def expect_handler(
        self, *, respond: Respond, provider_for: Callable[[str], Provider]
    ) -> ExpectHandler:
        """The API routes' ``Expect: 100-continue`` answer: aiohttp sends ``100 Continue``
        before any middleware runs, so a client without a valid key would upload its body only
        to get the 401; here the key is checked first and such a client gets the 401 instead."""

        async def expect(request: web.Request) -> web.StreamResponse | None:
            refused = self.admit_key(request, respond=respond, provider=provider_for(request.path))
            if isinstance(refused, web.StreamResponse):
                return refused
            # aiohttp's own (private; tests/dataplane/test_frontend_expect_continue.py runs it):
            # 100 Continue, 417 for any other expectation
            await _default_expect_handler(request)
            return None

        return expect

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
        for tenant, limits in (("*", self.limits.default), *self.limits.tenants.items()):
            for name, value in (
                ("requests_per_second", limits.requests_per_second),
                ("burst", limits.bucket_size if limits.requests_per_second else None),
                ("concurrency", limits.concurrency),
            ):
                if value is not None:
                    self.metrics.limit.labels(tenant, name).set(value)
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
            if not request.path.startswith(PROTECTED_PREFIX) and request.path != METRICS_PATH:
                return await handler(request)
            provider = provider_for(request.path)
            who = self.admit_key(request, respond=respond, provider=provider)
            if isinstance(who, web.StreamResponse):
                return who
            metrics = self.metrics
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
            except asyncio.CancelledError:
                status = CLIENT_CLOSED_STATUS  # the client hung up: as the trace records it
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


HOP_KEYS: Final = web.AppKey("kvretention_hop_keys", HopKeyFile)
"""``--hop-key-file``: what signs the tenant header for the router (absent: nothing signed)."""


def tenant_headers(request: web.Request) -> dict[str, str]:
    """The router headers naming the request's tenant (none with auth off) and, with a hop key,
    the signature the router and the workers check (:mod:`kvretention.common.hop_auth`)."""
    hop = request.app.get(HOP_KEYS)
    return signed_headers(
        hop.keys if hop is not None else None, request.get(TENANT), now=time.time()
    )

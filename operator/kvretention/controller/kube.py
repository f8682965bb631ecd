"""The only module that talks to the Kubernetes API server.

Everything here is thin I/O over the synchronous ``kubernetes`` client, run in a worker thread with
``asyncio.to_thread`` so kopf's event loop never blocks. Bodies go in and come out as plain dicts
(the JSON the API server speaks), so the pure builders and status code never see client models.
Transient failures (409 conflicts, 429, 5xx, dropped connections) are retried with bounded
exponential backoff, then surfaced as :class:`RetryLater` so the work queue retries later.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kvretention.api.names import FIELD_MANAGER
from kvretention.controller.kinds import EVENT, ResourceKind, kind_of

log = logging.getLogger(__name__)

APPLY_CONTENT_TYPE: Final = "application/apply-patch+yaml"
METADATA_ONLY: Final = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
"""Accept header for a read that returns an object's metadata alone (no Secret data leaves the
API server)."""

RETRY_STATUSES: Final = frozenset({409, 429, 500, 502, 503, 504})
"""HTTP statuses worth retrying: conflicts, throttling and server-side trouble."""

REQUEST_TIMEOUT_S: Final = 30.0

T = TypeVar("T")


@dataclass(frozen=True)
class _Call:
    """One request as the transport sends it."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...]
    body: Any
    content_type: str
    accept: str = "application/json"


class RetryLater(Exception):
    """Not now: the reconcile failed for a reason that may pass (a transient API failure after
    its retries, a child the API server refused); the work queue retries after ``delay``."""

    def __init__(self, message: str, *, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class NotFound(Exception):
    """The object does not exist (HTTP 404); the message says which request and what the API
    server answered."""


NAMESPACE_TERMINATING: Final = "NamespaceTerminating"
"""The cause the API server gives for a create in a namespace being deleted (HTTP 403)."""


class ApiError(Exception):
    """A non-retryable API error: the request, the status, the API server's reason, message and
    the reasons of its causes (each log line and status message names them)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        reason: str = "",
        causes: tuple[str, ...] = (),
        what: str = "",
    ) -> None:
        said = f"HTTP {status} {reason}".rstrip() + f": {message}"
        if causes:
            said += f" (causes: {', '.join(causes)})"
        super().__init__(f"{what}: {said}" if what else said)
        self.said = said
        """The answer without the request: status, reason, message and causes."""
        self.status = status
        self.message = message
        self.reason = reason
        self.causes = causes

    @property
    def namespace_terminating(self) -> bool:
        """A create refused because the namespace is being deleted: nothing will ever succeed
        there (a namespace of the same name made later is a new one)."""
        return self.status == 403 and (
            NAMESPACE_TERMINATING in self.causes or "because it is being terminated" in self.message
        )


def _server_status(exc: ApiException) -> tuple[str, str, tuple[str, ...]]:
    """The API server's message, reason and cause reasons from an error's Status body."""
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        return str(exc.body or exc.reason), str(exc.reason or ""), ()
    if not isinstance(body, dict):
        return str(exc.body), str(exc.reason or ""), ()
    causes = tuple(
        str(c.get("reason"))
        for c in (body.get("details") or {}).get("causes") or []
        if isinstance(c, dict) and c.get("reason")
    )
    return str(body.get("message") or exc.reason), str(body.get("reason") or exc.reason), causes


def is_retryable(exc: BaseException) -> bool:
    """Conflicts, throttling, 5xx and connection trouble are worth another try."""
    if isinstance(exc, ApiException):
        return exc.status in RETRY_STATUSES or exc.status == 0
    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


async def with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    attempts: int = 5,
    base_delay: float = 0.2,
    max_delay: float = 3.0,
) -> T:
    """Run ``call``; retry transient failures with jittered backoff, then raise RetryLater."""
    for attempt in range(attempts):
        try:
            return await call()
        except Exception as exc:
            if not is_retryable(exc):
                raise
            if attempt == attempts - 1:
                raise RetryLater(f"{what}: {exc}", delay=max_delay) from exc
            delay = min(max_delay, base_delay * 2**attempt) * (0.5 + random.random() / 2)
            log.debug("retrying %s in %.2fs after %s", what, delay, exc)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def load_config(*, pool_size: int = 32) -> client.ApiClient:
    """An API client from KUBECONFIG (or ~/.kube/config), else the in-cluster service account.

    ``pool_size`` should match the threads that call it: the client's default pool (10) would
    drop and reopen TLS connections whenever more calls run at once.
    """
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)


class Kube:
    """Async facade over one ``ApiClient``: dict in, dict out, retries built in."""

    def __init__(
        self, api: client.ApiClient, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._api = api
        self._clock = clock
        self.requests = 0
        """Requests sent (for tests and metrics)."""
        self._last_answer: float | None = None

    def seconds_since_answer(self) -> float | None:
        """How long ago the API server last answered (any status below 500), or None if never.

        The operator's ``/readyz`` reads this instead of asking the API server on every probe.
        """
        return None if self._last_answer is None else self._clock() - self._last_answer

    def _answered(self, status: int) -> None:
        # A 4xx is still an answer; a 5xx means the server is there but cannot serve (etcd down).
        if status < 500:
            self._last_answer = self._clock()

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    # -- raw transport -------------------------------------------------------------------------

    def _request_sync(self, call: _Call) -> dict[str, Any]:
        headers = {"Accept": call.accept, "Content-Type": call.content_type}
        request = self._api.param_serialize(
            method=call.method,
            resource_path=call.path,
            query_params=list(call.query),
            header_params=headers,
            body=call.body,
            auth_settings=["BearerToken"],
        )
        self.requests += 1
        response = self._api.call_api(*request, _request_timeout=REQUEST_TIMEOUT_S)
        response.read()  # type: ignore[no-untyped-call]
        self._answered(int(response.status))
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        data: dict[str, Any] = json.loads(response.data or b"{}")
        return data

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        retry: bool = True,
    ) -> dict[str, Any]:
        """One API call in a thread; 404 -> NotFound, other hard errors -> ApiError."""
        call = _Call(method, path, tuple(query), body, content_type, accept)

        async def once() -> dict[str, Any]:
            return await asyncio.to_thread(self._request_sync, call)

        try:
            if retry:
                return await with_retries(once, what=f"{method} {path}")
            return await once()
        except ApiException as exc:
            message, reason, causes = _server_status(exc)
            if exc.status == 404:
                raise NotFound(f"{method} {path}: HTTP 404 {reason}: {message}") from exc
            raise ApiError(
                int(exc.status or 0),
                message,
                reason=reason,
                causes=causes,
                what=f"{method} {path}",
            ) from exc

    # -- objects -------------------------------------------------------------------------------

    async def get(self, kind: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]:
        return await self.request("GET", kind.object_path(namespace, name))

    async def get_or_none(
        self, kind: ResourceKind, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        try:
            return await self.get(kind, namespace, name)
        except NotFound:
            return None

    async def exists(self, kind: ResourceKind, namespace: str | None, name: str) -> bool:
        """Whether the object exists: a metadata-only read (``get`` in RBAC), so a Secret's
        data never reaches the operator."""
        try:
            await self.request("GET", kind.object_path(namespace, name), accept=METADATA_ONLY)
        except NotFound:
            return False
        return True

    async def list(
        self, kind: ResourceKind, namespace: str | None, *, selector: str = ""
    ) -> list[dict[str, Any]]:
        """Every object of ``kind`` in ``namespace`` matching a label selector, with kind set."""
        query = [("labelSelector", selector)] if selector else []
        data = await self.request("GET", kind.collection_path(namespace), query=query)
        items: list[dict[str, Any]] = data.get("items") or []
        for item in items:  # list items come without apiVersion/kind
            item.setdefault("apiVersion", kind.api_version)
            item.setdefault("kind", kind.kind)
        return items

    async def list_page(
        self, kind: ResourceKind, namespace: str | None, *, selector: str, limit: int, token: str
    ) -> dict[str, Any]:
        """One page of a paginated LIST (``token``: the previous page's ``metadata.continue``)."""
        query = [("labelSelector", selector), ("limit", str(limit))]
        if token:
            query.append(("continue", token))
        return await self.request("GET", kind.collection_path(namespace), query=query)

    def watch_lines(
        self,
        kind: ResourceKind,
        namespace: str | None,
        *,
        selector: str,
        version: str,
        timeout_s: int,
    ) -> Iterator[bytes]:
        """A watch from ``version``, one JSON event per line, until the server ends it.

        Blocking: run it in a thread of its own (it holds the thread for up to ``timeout_s``).
        Bookmarks are asked for, so a quiet kind still moves its resume version along.
        """
        query = [
            ("watch", "1"),
            ("labelSelector", selector),
            ("resourceVersion", version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]
        request = self._api.param_serialize(
            method="GET",
            resource_path=kind.collection_path(namespace),
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        self.requests += 1
        response = self._api.call_api(*request, _request_timeout=(10, timeout_s + 30))
        self._answered(int(response.status))
        if not 200 <= response.status <= 299:
            response.read()  # type: ignore[no-untyped-call]
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        stream = response.response
        try:
            for line in stream:
                if line.strip():
                    yield line
        finally:
            stream.release_conn()

    async def apply(
        self,
        manifest: Mapping[str, Any],
        *,
        kind: ResourceKind | None = None,
        dry_run: bool = False,
        subresource: str = "",
    ) -> dict[str, Any]:
        """Server-side apply as ``kvretention-operator`` with force (we own what we build)."""
        kind = kind or kind_of(manifest)
        meta = manifest["metadata"]
        path = kind.object_path(meta.get("namespace"), meta["name"])
        if subresource:
            path = f"{path}/{subresource}"
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
        return await self.request(
            "PATCH", path, query=query, body=manifest, content_type=APPLY_CONTENT_TYPE
        )

    async def delete(self, kind: ResourceKind, namespace: str, name: str, *, uid: str) -> None:
        """Delete with a uid precondition (never a same-named replacement), background GC."""
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            await self.request("DELETE", kind.object_path(namespace, name), body=body)
        except NotFound:
            return
        except ApiError as exc:
            if exc.status != 409:  # precondition failed: it's already a different object
                raise

    async def create(self, kind: ResourceKind, namespace: str, body: Mapping[str, Any]) -> Any:
        return await self.request("POST", kind.collection_path(namespace), body=body)

    async def create_if_absent(
        self, kind: ResourceKind, namespace: str, body: Mapping[str, Any]
    ) -> bool:
        """Create ``body`` unless an object of its name exists (looked for first, and the API
        server's 409 AlreadyExists for a create that lost a race): True when this call made it.
        An object that exists is never read or changed."""
        if await self.exists(kind, namespace, body["metadata"]["name"]):
            return False
        try:
            await self.request("POST", kind.collection_path(namespace), body=body, retry=False)
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def post_event(
        self,
        involved: Mapping[str, Any],
        *,
        type_: str,
        reason: str,
        message: str,
        now: dt.datetime,
    ) -> None:
        """A core/v1 Event about ``involved`` (best effort: an event is never worth failing for)."""
        meta = involved["metadata"]
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": FIELD_MANAGER,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.create(EVENT, meta["namespace"], body)
        except (ApiError, RetryLater) as exc:
            log.warning("could not post event %s on %s: %s", reason, meta["name"], exc)

    async def ping(self) -> bool:
        """One cheap request (``GET /version``, readable by any client), no retries: whether the
        API server answered. Never raises."""
        try:
            await self.request("GET", "/version", retry=False)
        except Exception as exc:  # connection refused, timeouts, 5xx: all mean "not now"
            log.debug("API server ping failed: %s", exc)
            return False
        return True

    async def served(self, group: str, version: str, plural: str) -> bool:
        """Whether the API server serves ``plural`` in ``group/version`` (the CRD is installed)."""
        try:
            data = await self.request("GET", f"/apis/{group}/{version}", retry=False)
        except (NotFound, ApiError):
            return False
        return any(r.get("name") == plural for r in data.get("resources") or [])

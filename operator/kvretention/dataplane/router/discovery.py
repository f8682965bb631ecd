"""Where workers are: a static URL list, or a headless Service name resolved periodically.

A headless Service's DNS name resolves to one address per ready pod, so re-resolving it every few
seconds tracks scale-ups and replaced pods without talking to the Kubernetes API.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kvretention.api.names import Role

PoolRole = Role
"""The pool a worker serves: the worker's own role (one definition, in ``kvretention.api.names``)."""


class DiscoveryError(ValueError):
    """A ``--worker`` or ``--*-dns`` value that cannot name workers."""


@dataclass(frozen=True)
class Source:
    """Where one role's workers come from."""

    role: PoolRole
    static: tuple[str, ...] = ()
    dns: tuple[str, ...] = ()
    """``host:port`` names (a headless Service, e.g. ``workers.ns.svc:8100``)."""


@dataclass(frozen=True)
class Endpoints:
    """Where the endpoint picker's frontends are (``--endpoint``, ``--endpoint-dns``)."""

    static: tuple[str, ...] = ()
    dns: tuple[str, ...] = ()


@dataclass(frozen=True)
class Membership:
    added: tuple[str, ...]
    removed: tuple[str, ...]


def normalize_url(value: str) -> str:
    """``http://host:port`` without a trailing slash; a bare ``host:port`` gets ``http://``."""
    url = value.strip().rstrip("/")
    if not url:
        raise DiscoveryError("empty worker URL")
    if "://" not in url:
        url = "http://" + url
    if not url.startswith(("http://", "https://")):
        raise DiscoveryError(f"worker URL {value!r} must be http(s)")
    return url


def split_dns(name: str) -> tuple[str, int]:
    """``svc.ns.svc:8100`` -> (``svc.ns.svc``, 8100)."""
    host, sep, port = name.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise DiscoveryError(f"--*-dns wants host:port, got {name!r}")
    return host, int(port)


def url_for(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def plan_membership(current: Iterable[str], discovered: Iterable[str]) -> Membership:
    """What to add and remove so the pool equals what discovery found now."""
    now, found = set(current), set(discovered)
    return Membership(added=tuple(sorted(found - now)), removed=tuple(sorted(now - found)))


def held_departing(
    removed: Iterable[str], staying: Iterable[str], healthy: Mapping[str, bool]
) -> tuple[str, ...]:
    """Of the workers discovery dropped, those that keep serving for now.

    A rolling update swaps a pool's last pod for a new one in one DNS answer, and the new pod is
    admitted only after a readiness poll: dropping the old one at once leaves the pool empty (503)
    while it still serves through its preStop drain. So while no staying worker is healthy, the
    healthy departing ones stay; they go once a newcomer is admitted or their own checks fail.
    """
    if any(healthy.get(url, False) for url in staying):
        return ()
    return tuple(url for url in removed if healthy.get(url, False))


async def resolve(name: str) -> list[str]:
    """Worker URLs behind one ``host:port`` name (every address it resolves to)."""
    host, port = split_dns(name)
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({url_for(str(info[4][0]), port) for info in infos})


async def discover(source: Source | Endpoints) -> list[str] | None:
    """All URLs for a source now; None when DNS failed (keep the current pool, don't empty it)."""
    urls = {normalize_url(u) for u in source.static}
    for name in source.dns:
        try:
            urls.update(await resolve(name))
        except OSError:
            return None
    return sorted(urls)


def build_sources(
    *,
    workers: Sequence[str],
    worker_dns: Sequence[str],
    prefill: Sequence[str],
    prefill_dns: Sequence[str],
    decode: Sequence[str],
    decode_dns: Sequence[str],
) -> list[Source]:
    """Aggregated sources, or a prefill and a decode source; never a mix."""
    aggregated = bool(workers or worker_dns)
    disaggregated = bool(prefill or prefill_dns or decode or decode_dns)
    if aggregated and disaggregated:
        raise DiscoveryError(
            "use --worker/--worker-dns or the --prefill-*/--decode-* flags, not both"
        )
    if disaggregated:
        if not (prefill or prefill_dns) or not (decode or decode_dns):
            raise DiscoveryError("disaggregated mode needs both prefill and decode workers")
        for name in (*prefill_dns, *decode_dns):
            split_dns(name)
        return [
            Source(
                role="prefill", static=tuple(map(normalize_url, prefill)), dns=tuple(prefill_dns)
            ),
            Source(role="decode", static=tuple(map(normalize_url, decode)), dns=tuple(decode_dns)),
        ]
    if not aggregated:
        raise DiscoveryError("no workers: give --worker URL or --worker-dns host:port")
    for name in worker_dns:
        split_dns(name)
    return [
        Source(role="aggregated", static=tuple(map(normalize_url, workers)), dns=tuple(worker_dns))
    ]


def build_endpoints(*, static: Sequence[str], dns: Sequence[str]) -> Endpoints | None:
    """The picker's frontends (None when neither flag is given); names are checked now."""
    if not static and not dns:
        return None
    for name in dns:
        split_dns(name)
    return Endpoints(static=tuple(map(normalize_url, static)), dns=tuple(dns))

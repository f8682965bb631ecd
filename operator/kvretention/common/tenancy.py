"""Tenants between the hops: the name's rules, and what it becomes at each hop.

The frontend learns a request's tenant from its API key and sends the router ``x-kvr-tenant``
(never the key). The router keys its session pins and prefix index per tenant
(:func:`scoped_session`, :func:`scoped_chain`), so one tenant's conversations never attract
another's placement; the worker passes :func:`cache_salt_for` as SGLang's ``cache_salt``, which
partitions SGLang's radix tree (``RadixKey.cache_salt``) and seeds the request's HiCache / Mooncake
page keys (``storage_namespace_seed``), so one tenant's cached prefixes can never be matched, timed
or evicted-for through another's requests. The retention plugin reads the tenant back from the
salt (:func:`tenant_of_salt`) to count its pins against its own share of the pin budget.

Import-light (no aiohttp, no SGLang): the API, the router, the worker and the retention plugin
import it.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

HEADER_TENANT: Final = "x-kvr-tenant"
"""Frontend -> router -> worker: the authenticated tenant's name (set only by the frontend, which
never copies it from a client)."""

TENANT_PATTERN: Final = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
"""A tenant name: a DNS label with dots allowed (lower case, 1-63 characters). It is a metric
label value, a header value and a file name in a mounted Secret, so it stays that plain."""
_TENANT: Final = re.compile(TENANT_PATTERN)

SALT_PREFIX: Final = "kvr-tenant:"
CACHE_SALT_PARAM: Final = "cache_salt"


def valid_tenant(name: str) -> bool:
    return _TENANT.match(name) is not None


def cache_salt_for(tenant: str) -> str:
    """SGLang's ``cache_salt`` for ``tenant``: its radix namespace and its storage keys' seed."""
    return SALT_PREFIX + tenant


def tenant_of_salt(salt: object) -> str | None:
    """The tenant a ``cache_salt`` from :func:`cache_salt_for` names; None for any other salt."""
    if isinstance(salt, str) and salt.startswith(SALT_PREFIX):
        tenant = salt[len(SALT_PREFIX) :]
        return tenant if valid_tenant(tenant) else None
    return None


def tenant_of_headers(headers: Mapping[str, str]) -> str | None:
    """The tenant an upstream hop named, or None (auth off). A malformed name raises
    ``ValueError``: a hop must never fall back to the shared namespace by mistake."""
    value = headers.get(HEADER_TENANT)
    if value is None or value == "":
        return None
    if not valid_tenant(value):
        raise ValueError(f"{HEADER_TENANT} is not a tenant name ({TENANT_PATTERN})")
    return value


def scoped_session(tenant: str | None, session: str | None) -> str | None:
    """The router's session-pin key: the session within its tenant (unchanged with auth off)."""
    if tenant is None or session is None:
        return session
    return f"{tenant}/{session}"


def scoped_chain(tenant: str | None, chain: Sequence[str]) -> list[str]:
    """The router's prefix-index keys: each prefix hash within its tenant, so the same prompt
    from two tenants is two entries (unchanged with auth off)."""
    if tenant is None:
        return list(chain)
    seed = tenant.encode() + b"\x00"
    return [hashlib.blake2b(seed + h.encode(), digest_size=16).hexdigest() for h in chain]


@functools.cache
def _takes_cache_salt(function: Callable[..., Any]) -> bool:
    try:
        return CACHE_SALT_PARAM in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def engine_takes_cache_salt(async_generate: Callable[..., Any]) -> bool:
    """Whether the engine's ``async_generate`` has SGLang's ``cache_salt`` parameter (0.5.23
    has it, keyword-only); measured once per engine class."""
    return _takes_cache_salt(getattr(async_generate, "__func__", async_generate))


class TenantIsolationUnavailable(RuntimeError):
    """A tenant's request for an engine that cannot isolate it: refused, never served shared."""


def engine_kwargs(tenant: str | None, async_generate: Callable[..., Any]) -> dict[str, Any]:
    """What ``Engine.async_generate`` gets for the tenant: ``cache_salt``, or nothing with auth
    off. An engine without the parameter raises :class:`TenantIsolationUnavailable`."""
    if tenant is None:
        return {}
    if not engine_takes_cache_salt(async_generate):
        raise TenantIsolationUnavailable(
            "this worker's engine has no cache_salt parameter on Engine.async_generate, so it "
            "cannot keep tenants' KV caches apart; upgrade the worker image (SGLang >= 0.5.23)"
        )
    return {CACHE_SALT_PARAM: cache_salt_for(tenant)}

"""Pure: what each worker's engine says it holds, read from its ``GET /kv/residency`` summary.

With ``kvretention router --kv-residency`` the health poll also fetches each worker's summary (the
worker runs with ``--kv-events``: SGLang's own KV events, indexed per cache salt and session). A
request whose tenant and session some healthy worker reports resident goes to the worker holding
the most of that session's tokens (:func:`kvretention.dataplane.router.placement.plan_worker`).
Unlike the prefix index, which records what the router sent, this is what the engine kept: an
eviction shows here. A summary older than a few poll periods is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kvretention.common.tenancy import cache_salt_for

STALE_POLLS: Final = 3
"""Poll periods after which a summary no longer counts (the worker stopped answering it)."""

Owner = tuple[str | None, str | None]
"""``(cache_salt, session_id)`` as the engine reported them."""


@dataclass(frozen=True)
class ResidencySnapshot:
    tokens: Mapping[Owner, int] = field(default_factory=dict)
    fetched_at: float = 0.0
    """When the router received it (its own monotonic clock)."""


def parse_residency(body: Any, *, fetched_at: float) -> ResidencySnapshot | None:
    """A worker's summary, or None when it is not one (left out of placement)."""
    entries = body.get("entries") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        return None
    tokens: dict[Owner, int] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            return None
        salt, session, count = entry.get("cache_salt"), entry.get("session_id"), entry.get("tokens")
        if not (salt is None or isinstance(salt, str)) or not (
            session is None or isinstance(session, str)
        ):
            return None
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            return None
        tokens[(salt, session)] = tokens.get((salt, session), 0) + count
    return ResidencySnapshot(tokens=tokens, fetched_at=fetched_at)


def residency_key(tenant: str | None, session: str | None) -> Owner | None:
    """The owner a request's cache is filed under: the tenant's salt and the session as the worker
    sees it (scoped by its tenant, ``common.tenancy.scoped_session``), or None when it has no
    session (nothing to look up: a session-less owner is every request of the tenant)."""
    if session is None:
        return None
    return (cache_salt_for(tenant) if tenant is not None else None, session)


def plan_resident(
    snapshots: Mapping[str, ResidencySnapshot | None],
    *,
    key: Owner | None,
    now: float,
    max_age_s: float,
) -> dict[str, int]:
    """URL -> the request's resident tokens there, from the fresh summaries only (no zeros)."""
    if key is None:
        return {}
    found: dict[str, int] = {}
    for url, snapshot in snapshots.items():
        if snapshot is None or now - snapshot.fetched_at > max_age_s:
            continue
        tokens = snapshot.tokens.get(key, 0)
        if tokens > 0:
            found[url] = tokens
    return found

"""Pure placement decisions: which worker (or prefill/decode pair) serves a request.

A sticky session stays authoritative: while its pinned worker is healthy the session goes there,
however busy it is. Otherwise the healthy worker with the fewest outstanding requests wins, ties
broken by the fewest requests served so far (so sequential traffic spreads too), then by URL.
``prompt_cache_key`` is not an affinity key: the router never sees provider fields.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from kvretention.dataplane.protocol import HEADER_SESSION

DEFAULT_MAX_SESSIONS: Final = 100_000


@dataclass(frozen=True)
class WorkerView:
    """What placement needs to know about one worker."""

    url: str
    healthy: bool
    outstanding: int = 0
    served: int = 0


@dataclass(frozen=True)
class Choice:
    url: str
    sticky: bool
    """True when the session's pin decided, False when load did."""


@dataclass(frozen=True)
class PairChoice:
    prefill: Choice
    decode: Choice


def plan_worker(workers: Sequence[WorkerView], *, pinned: str | None) -> Choice | None:
    """The pinned worker if it is healthy, else the least loaded healthy one; None if none."""
    healthy = [w for w in workers if w.healthy]
    if not healthy:
        return None
    if pinned is not None and any(w.url == pinned for w in healthy):
        return Choice(url=pinned, sticky=True)
    best = min(healthy, key=lambda w: (w.outstanding, w.served, w.url))
    return Choice(url=best.url, sticky=False)


def plan_pair(
    prefill: Sequence[WorkerView],
    decode: Sequence[WorkerView],
    *,
    pinned_prefill: str | None,
    pinned_decode: str | None,
) -> PairChoice | None:
    """A prefill and a decode worker, each chosen like :func:`plan_worker`; None unless both exist."""
    p = plan_worker(prefill, pinned=pinned_prefill)
    d = plan_worker(decode, pinned=pinned_decode)
    return None if p is None or d is None else PairChoice(prefill=p, decode=d)


_SESSION_KEY: Final = b'"session_id"'


def session_of(body: bytes, headers: Mapping[str, str]) -> str | None:
    """The sticky-session key: the body's ``session_id`` field, else the ``x-session-id`` header.

    Parses a copy of the body only to read that one field, and only when the key is in the bytes
    at all (the frontend writes keys unescaped), so a 200 KB prompt with no session is never
    parsed here; the forwarded bytes are untouched.
    """
    raw = None
    if _SESSION_KEY in body:
        try:
            raw = json.loads(body)
        except ValueError:
            raw = None
    value = raw.get("session_id") if isinstance(raw, dict) else None
    if isinstance(value, str) and value:
        return value
    header = headers.get(HEADER_SESSION)
    return header or None


class SessionPins:
    """session -> worker URL, one table per role, bounded (least recently used pins go first)."""

    def __init__(self, *, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        self._max = max_sessions
        self._pins: OrderedDict[tuple[str, str], str] = OrderedDict()

    def get(self, role: str, session: str | None) -> str | None:
        if session is None:
            return None
        key = (role, session)
        url = self._pins.get(key)
        if url is not None:
            self._pins.move_to_end(key)
        return url

    def set(self, role: str, session: str | None, url: str) -> None:
        if session is None:
            return
        self._pins[(role, session)] = url
        self._pins.move_to_end((role, session))
        while len(self._pins) > self._max:
            self._pins.popitem(last=False)

    def __len__(self) -> int:
        return len(self._pins)

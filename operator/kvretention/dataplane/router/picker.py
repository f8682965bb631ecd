"""The endpoint picker's decisions: which frontend pod a Gateway sends a request to, and what the
router answers on each ``ext_proc`` phase (the Gateway API Inference Extension's Endpoint Picker
Protocol). No I/O: :mod:`kvretention.dataplane.router.extproc` serves it over gRPC.

A request with a session goes to the ready frontend that scores highest for that session
(rendezvous hashing): every picker replica, with no shared state, agrees, and only the sessions of
a frontend that left move. A session stays on one frontend because the frontend remembers each
conversation's last body (incremental decode) and its router keeps the session's worker pin.
Sessionless requests go round robin. The session is read the way the frontend reads it
(:func:`kvretention.dataplane.frontend.affinity.session_key`, the same ordered keys).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import urlsplit

import msgspec
from multidict import CIMultiDict

from kvretention.dataplane.frontend.affinity import session_key
from kvretention.dataplane.frontend.errors import FrontendError, Provider, error_body
from kvretention.dataplane.protocol import BODY_SESSION_OBJECTS, DEFAULT_SESSION_KEYS
from kvretention.dataplane.router.extproc_wire import (
    FULL_DUPLEX_STREAMED,
    Continue,
    Immediate,
    JsonValue,
    Metadata,
    Phase,
    ProcessingRequest,
)
from kvretention.dataplane.router.health import HealthRecord

HEADER_DESTINATION: Final = "x-gateway-destination-endpoint"
SERVED_KEY: Final = "x-gateway-destination-endpoint-served"
LB_NAMESPACE: Final = "envoy.lb"
SUBSET_NAMESPACE: Final = "envoy.lb.subset_hint"
SUBSET_KEY: Final = "x-gateway-destination-endpoint-subset"
MAX_BODY: Final = 64 * 1024 * 1024
"""Body bytes a full-duplex stream buffers (the router's own request limit)."""

Outcome = Literal["session", "spread", "unavailable"]
"""A pick: by the session's hash, round robin (no session), or none ready (503)."""


@dataclass(frozen=True)
class Pick:
    endpoint: str
    """``ip:port``."""
    outcome: Outcome


def address_of(url: str) -> str:
    """``http://10.0.0.7:8000`` -> ``10.0.0.7:8000`` (``[::1]:8000`` for IPv6)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def _score(session: str, endpoint: str) -> bytes:
    return hashlib.blake2b(f"{session}\x00{endpoint}".encode(), digest_size=8).digest()


def plan_endpoint(ready: Sequence[str], *, session: str | None, turn: int) -> Pick | None:
    """The session's highest-scoring ready endpoint; round robin (``turn``) without a session;
    None when none is ready."""
    if not ready:
        return None
    if session is not None:
        best = max(ready, key=lambda e: (_score(session, e), e))
        return Pick(endpoint=best, outcome="session")
    ordered = sorted(ready)
    return Pick(endpoint=ordered[turn % len(ordered)], outcome="spread")


def subset_of(metadata: Metadata) -> frozenset[str] | None:
    """The endpoints the data plane allows (``envoy.lb.subset_hint``), None when it sets none."""
    hint = metadata.get(SUBSET_NAMESPACE, {}).get(SUBSET_KEY)
    if hint is None:
        return None
    items = hint if isinstance(hint, list) else [hint]
    return frozenset(str(e).strip() for e in items if isinstance(e, str) and e.strip())


def served_of(metadata: Metadata) -> str | None:
    """``envoy.lb`` ``x-gateway-destination-endpoint-served``: the endpoint that answered."""
    value = metadata.get(LB_NAMESPACE, {}).get(SERVED_KEY)
    return value if isinstance(value, str) and value else None


def session_of_request(
    headers: CIMultiDict[str], body: bytes | None, *, keys: Sequence[str] = DEFAULT_SESSION_KEYS
) -> str | None:
    """The session as the frontend will read it; the body is parsed only when a key names one of
    its objects and its name appears in the bytes."""
    found = session_key(keys, headers=headers, body={})
    if found is not None or not body:
        return found
    owners = {k.partition(".")[0] for k in keys if k.partition(".")[0] in BODY_SESSION_OBJECTS}
    if not any(f'"{owner}"'.encode() in body for owner in owners):
        return None
    try:
        parsed: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    return session_key(keys, headers=headers, body=parsed) if isinstance(parsed, dict) else None


def no_endpoint(path: str) -> Immediate:
    """The 503 Envoy sends the client itself, in the shape of the provider the path names."""
    err = FrontendError(
        status=503,
        code="no_ready_endpoint",
        message="No frontend of this fleet is ready; try again shortly.",
    )
    provider = Provider.ANTHROPIC if path.startswith("/v1/messages") else Provider.OPENAI
    return Immediate(
        status=503,
        body=json.dumps(error_body(err, provider)).encode(),
        headers=(("content-type", "application/json"),),
        details="no_ready_endpoint",
    )


@dataclass(frozen=True)
class Reply:
    """One ``ProcessingResponse``: the answer and its dynamic metadata."""

    answer: Continue | Immediate
    metadata: dict[str, dict[str, JsonValue]] = field(default_factory=dict)


PickFn = Callable[[str | None, frozenset[str] | None], Pick | None]
ServedFn = Callable[[str | None, str], None]


@dataclass
class PickStream:
    """One ``Process`` stream (one HTTP request): what to answer to each message.

    Buffered body (and no body mode announced): request headers get CONTINUE, or the pick itself
    when the headers already name the session or end the request; the complete body gets the pick
    as a header mutation on the ``BodyResponse``. Full-duplex streamed (what the upstream EPP runs):
    nothing until the body ends, then the ``HeadersResponse`` with the pick and a ``BodyResponse``
    that sends the buffered body on. Every pick also goes into ``envoy.lb`` dynamic metadata.
    """

    pick: PickFn
    served: ServedFn
    keys: Sequence[str] = DEFAULT_SESSION_KEYS
    duplex: bool = False
    duplex_response: bool = False
    headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    body: bytearray = field(default_factory=bytearray)
    subset: frozenset[str] | None = None
    picked: str | None = None
    decided: bool = False

    def answer(self, request: ProcessingRequest) -> list[Reply]:
        if request.request_body_mode is not None:
            self.duplex = request.request_body_mode == FULL_DUPLEX_STREAMED
        if request.response_body_mode is not None:
            self.duplex_response = request.response_body_mode == FULL_DUPLEX_STREAMED
        phase = request.phase
        if phase == "request_headers" and request.headers is not None:
            return self._request_headers(request)
        if phase == "request_body" and request.body is not None:
            return self._request_body(request.body.body, end=request.body.end_of_stream)
        if phase == "response_headers":
            served = served_of(request.metadata)
            if served is not None:
                self.served(self.picked, served)
            return [Reply(Continue(phase))]
        if phase == "response_body" and request.body is not None and self.duplex_response:
            chunk = request.body
            return [
                Reply(Continue(phase, streamed_body=chunk.body, end_of_stream=chunk.end_of_stream))
            ]
        if phase == "request_trailers" and not self.decided:
            # A body that ended in trailers: pick on what arrived.
            return self._finish(trailers=True)
        return [] if phase is None else [Reply(Continue(phase))]

    def _request_headers(self, request: ProcessingRequest) -> list[Reply]:
        assert request.headers is not None
        self.headers = CIMultiDict(request.headers.headers)
        self.subset = subset_of(request.metadata)
        session = session_of_request(self.headers, None, keys=self.keys)
        if request.headers.end_of_stream or (session is not None and not self.duplex):
            return [self._decide("request_headers", session)]
        return [] if self.duplex else [Reply(Continue("request_headers"))]

    def _request_body(self, chunk: bytes, *, end: bool) -> list[Reply]:
        if self.decided:
            if self.duplex:
                return [Reply(Continue("request_body", streamed_body=chunk, end_of_stream=end))]
            return [Reply(Continue("request_body"))]
        if len(self.body) + len(chunk) <= MAX_BODY or self.duplex:
            self.body += chunk
        if end:
            return self._finish(trailers=False)
        return [] if self.duplex else [Reply(Continue("request_body"))]

    def _finish(self, *, trailers: bool) -> list[Reply]:
        session = session_of_request(self.headers, bytes(self.body), keys=self.keys)
        if not self.duplex:
            phase: Phase = "request_trailers" if trailers else "request_body"
            return [self._decide(phase, session)]
        first = self._decide("request_headers", session)
        if isinstance(first.answer, Immediate):
            return [first]
        body = Continue("request_body", streamed_body=bytes(self.body), end_of_stream=not trailers)
        replies = [first, Reply(body)]
        if trailers:
            replies.append(Reply(Continue("request_trailers")))
        return replies

    def _decide(self, phase: Phase, session: str | None) -> Reply:
        self.decided = True
        pick = self.pick(session, self.subset)
        if pick is None:
            return Reply(no_endpoint(self.headers.get(":path", "")))
        self.picked = pick.endpoint
        if phase == "request_trailers":
            # TrailersResponse mutates trailers only: the destination travels as metadata.
            return Reply(Continue(phase), {LB_NAMESPACE: {HEADER_DESTINATION: pick.endpoint}})
        answer = Continue(
            phase, set_headers=((HEADER_DESTINATION, pick.endpoint),), clear_route_cache=True
        )
        return Reply(answer, {LB_NAMESPACE: {HEADER_DESTINATION: pick.endpoint}})


@dataclass
class EndpointPool:
    """The picker's frontends: address -> health, and the round-robin turn."""

    health: dict[str, HealthRecord] = field(default_factory=dict)
    """Keyed by URL (``http://ip:port``), as discovery names them."""
    turn: int = 0

    def ready(self) -> list[str]:
        return sorted(address_of(url) for url, rec in self.health.items() if rec.healthy)

    def choose(self, session: str | None, subset: frozenset[str] | None) -> Pick | None:
        ready = self.ready()
        if subset is not None:
            ready = [e for e in ready if e in subset]
        pick = plan_endpoint(ready, session=session, turn=self.turn)
        if pick is not None and pick.outcome == "spread":
            self.turn += 1
        return pick

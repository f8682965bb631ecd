"""A minimal JSON-over-HTTPS client for start-up checks, so the plane needs no Kubernetes client.

``request`` answers once (polls retry by polling); ``write`` is for the plane's own writes right
after a component reported ready, when a refused connection or a 5xx still means "not yet".
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.error
import urllib.request
from typing import Any, Final, TypedDict, Unpack

# How long a write keeps retrying transient answers before the last one is the caller's error.
WRITE_BUDGET_S: Final = 30.0


def request(
    method: str,
    url: str,
    *,
    token: str | None = None,
    body: Any = None,
    ca_pem: bytes | None = None,
    timeout_s: float = 5.0,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """(status, decoded body); connection errors come back as status 0, with the error as the
    body, so callers can poll."""
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = content_type
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=_context(ca_pem)) as resp:
            return resp.status, _decode(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, _decode(err.read())
    except (OSError, ssl.SSLError, http.client.HTTPException) as err:
        reason = getattr(err, "reason", None) or err
        return 0, f"no answer from {url}: {reason!r}"


class RequestOptions(TypedDict, total=False):
    """What ``write`` passes on to ``request`` as it is (the same names and defaults)."""

    token: str | None
    body: Any
    ca_pem: bytes | None
    timeout_s: float
    content_type: str


def is_transient(status: int) -> bool:
    """No answer, too many requests, or a server error: worth asking again."""
    return status in (0, 429) or status >= 500


def write(
    method: str,
    url: str,
    *,
    budget_s: float = WRITE_BUDGET_S,
    first_delay_s: float = 0.2,
    **options: Unpack[RequestOptions],
) -> tuple[int, Any]:
    """``request``, asked again with a doubling delay (at most 2 s) while the answer is
    transient and ``budget_s`` lasts; returns the first lasting answer, else the last one."""
    deadline = time.monotonic() + budget_s
    delay = first_delay_s
    while True:
        status, answer = request(method, url, **options)
        if not is_transient(status) or time.monotonic() + delay > deadline:
            return status, answer
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def _context(ca_pem: bytes | None) -> ssl.SSLContext:
    if ca_pem is None:
        # Health checks of loopback components whose self-signed certs we never distribute.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return ssl.create_default_context(cadata=ca_pem.decode())


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")

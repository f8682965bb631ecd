"""A minimal JSON-over-HTTPS client for start-up checks, so the plane needs no Kubernetes client."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any


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
    """(status, decoded body); connection errors come back as status 0 so callers can poll."""
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
    except (OSError, ssl.SSLError):
        return 0, None


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

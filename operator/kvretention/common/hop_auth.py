"""The frontend -> router -> worker hop, authenticated: who named a request's tenant.

The router and the workers must not take ``x-kvr-tenant`` on trust: any pod that reaches their
ports could otherwise act as any tenant and probe that tenant's cache. With a hop key (a Secret
the operator makes per fleet and mounts in the frontend, the router and the workers), the frontend
signs each request's tenant for the time it sends it: ``x-kvr-tenant-sig: v1.<unix
seconds>.<hex HMAC-SHA256>`` over ``kvr-hop-v1``, the tenant (empty with auth off) and those
seconds, one per line. The router checks it and forwards it as it came; each worker checks it
before the tenant becomes SGLang's ``cache_salt``. A signature is good for
:data:`MAX_AGE_S` either side of the verifier's clock (pods' clocks differ a little), so a header
captured off the wire names only its own tenant and only for that long; capturing it needs the
traffic itself, which already shows the prompts. Digests are compared with
:func:`hmac.compare_digest`. Without a hop key nothing is signed or checked (a fleet without auth,
local runs).

A key file holds one key per line (at least :data:`MIN_KEY_CHARS` printable characters; blank
lines and ``#`` comments skipped): the first signs, every one verifies, so a key rotates without a
gap by adding the new one second, then moving it first once every pod reads it, then dropping the
old one.

Import-light (stdlib only): the frontend, the router and the worker import it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

from kvretention.common.tenancy import HEADER_TENANT

log = logging.getLogger("kvretention.hop_auth")

HEADER_TENANT_SIG: Final = "x-kvr-tenant-sig"
"""Frontend -> router -> worker: the hop key's signature over the tenant and the time it was sent."""

VERSION: Final = "v1"
MAX_AGE_S: Final = 60
"""How far (seconds) a signature's time may be from the verifier's clock, either way."""
MIN_KEY_CHARS: Final = 32
MAX_KEY_FILE_BYTES: Final = 64 * 1024
DEFAULT_RELOAD_S: Final = 5.0

_SIGNATURE: Final = re.compile(r"v1\.([0-9]{1,12})\.([0-9a-f]{64})")


class HopRefusal(StrEnum):
    """Why a hop refused a request's tenant (the ``reason`` label of the refusals metric)."""

    MISSING = "missing"
    MALFORMED = "malformed"
    STALE = "stale"
    INVALID = "invalid"


class HopKeyError(ValueError):
    """A hop key file that cannot be used (the message names the file, never a key)."""


@dataclass(frozen=True)
class HopKeys:
    """The keys of one key file: ``keys[0]`` signs, every one verifies."""

    keys: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise HopKeyError("no hop key")


def key_lines(text: str) -> Iterator[tuple[int, str]]:
    """The lines of a key file that hold a key, stripped, with their numbers (from 1): ``#``
    comments and blank lines are skipped."""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            yield number, line


def well_formed_key(line: str, *, min_chars: int) -> bool:
    """At least ``min_chars`` printable ASCII characters with no spaces."""
    return len(line) >= min_chars and line.isascii() and not any(c.isspace() for c in line)


def parse_hop_keys(text: str, *, source: str = "hop key") -> HopKeys:
    """The keys of a key file's text; a malformed line or no key at all raises
    :class:`HopKeyError` naming ``source`` and the line's number."""
    keys: list[bytes] = []
    for number, line in key_lines(text):
        if not well_formed_key(line, min_chars=MIN_KEY_CHARS):
            raise HopKeyError(
                f"{source} line {number}: a hop key is at least {MIN_KEY_CHARS} printable ASCII "
                "characters with no spaces"
            )
        keys.append(line.encode())
    if not keys:
        raise HopKeyError(f"{source} holds no hop key")
    return HopKeys(tuple(keys))


def read_key_file(path: Path, *, limit: int, error: type[ValueError]) -> str:
    """A mounted Secret's key file as text, at most ``limit`` bytes; raises ``error`` (naming the
    file, never a key). A byte that is not UTF-8 becomes U+FFFD: its line is malformed, not the
    whole file."""
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise error(f"{path} is larger than {limit} bytes")
    return data.decode("utf-8", "replace")


def read_hop_keys(path: Path) -> HopKeys:
    """:func:`parse_hop_keys` of a file (a mounted Secret's key); raises :class:`HopKeyError`."""
    text = read_key_file(path, limit=MAX_KEY_FILE_BYTES, error=HopKeyError)
    return parse_hop_keys(text, source=str(path))


class HopKeyFile:
    """The keys of ``--hop-key-file``: read at start (a file that cannot be used stops the
    process), then re-read at most every ``reload_s`` when asked for, so a rotated Secret reaches
    a running pod (the kubelet swaps a mounted Secret's files in place). A file that cannot be
    read later keeps the keys in force, logged once per distinct problem."""

    def __init__(
        self,
        path: Path,
        *,
        reload_s: float = DEFAULT_RELOAD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.reload_s = reload_s
        self._clock = clock
        self._keys = read_hop_keys(path)
        self._read_at = clock()
        self._problem: str | None = None

    @property
    def keys(self) -> HopKeys:
        now = self._clock()
        if now - self._read_at >= self.reload_s:
            self._read_at = now
            try:
                keys = read_hop_keys(self.path)
            except HopKeyError as exc:
                if str(exc) != self._problem:
                    self._problem = str(exc)
                    log.error("hop key not reloaded, the keys in force stay: %s", exc)
            else:
                if keys != self._keys:
                    log.info("hop key reloaded from %s (%d keys)", self.path, len(keys.keys))
                self._keys, self._problem = keys, None
        return self._keys


def _mac(key: bytes, tenant: str, seconds: str) -> str:
    message = f"kvr-hop-{VERSION}\n{tenant}\n{seconds}".encode("utf-8", "surrogatepass")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign_tenant(keys: HopKeys, tenant: str | None, *, now: float) -> str:
    """The ``x-kvr-tenant-sig`` value for ``tenant`` (None: no tenant, auth off) sent at ``now``
    (unix seconds)."""
    seconds = str(int(now))
    return f"{VERSION}.{seconds}.{_mac(keys.keys[0], tenant or '', seconds)}"


def verify_tenant(
    keys: HopKeys,
    tenant: str | None,
    signature: str | None,
    *,
    now: float,
    max_age_s: float = MAX_AGE_S,
) -> HopRefusal | None:
    """None when ``signature`` is a key's, for ``tenant`` (the header's value as received; None
    or empty: no tenant), made within ``max_age_s`` of ``now``; else why not."""
    if not signature:
        return HopRefusal.MISSING
    found = _SIGNATURE.fullmatch(signature)
    if found is None:
        return HopRefusal.MALFORMED
    seconds, digest = found.groups()
    if abs(now - int(seconds)) > max_age_s:
        return HopRefusal.STALE
    ok = False
    for key in keys.keys:  # every key, whichever matches: the time does not tell which one did
        ok |= hmac.compare_digest(_mac(key, tenant or "", seconds), digest)
    return None if ok else HopRefusal.INVALID


def hop_refusal(
    keys: HopKeys | None, headers: Mapping[str, str], *, now: float
) -> HopRefusal | None:
    """Why a hop refuses a request by its ``x-kvr-tenant`` and ``x-kvr-tenant-sig`` headers, or
    None: never without a hop key."""
    if keys is None:
        return None
    return verify_tenant(keys, headers.get(HEADER_TENANT), headers.get(HEADER_TENANT_SIG), now=now)


def signed_headers(keys: HopKeys | None, tenant: str | None, *, now: float) -> dict[str, str]:
    """The headers that name a request's tenant to the next hop: ``x-kvr-tenant`` (with a
    tenant) and, with a hop key, its signature (also with no tenant: the hop then knows the
    request came from the frontend)."""
    headers = {HEADER_TENANT: tenant} if tenant is not None else {}
    if keys is not None:
        headers[HEADER_TENANT_SIG] = sign_tenant(keys, tenant, now=now)
    return headers


def refusal_message(refusal: HopRefusal) -> str:
    """What the refusing hop answers (it names no key and no expected value)."""
    what = {
        HopRefusal.MISSING: "carries no",
        HopRefusal.MALFORMED: "carries a malformed",
        HopRefusal.STALE: f"carries a stale (more than {MAX_AGE_S}s off this pod's clock)",
        HopRefusal.INVALID: "carries an invalid",
    }[refusal]
    return (
        f"this hop accepts requests only from the fleet's frontend: the request {what} "
        f"{HEADER_TENANT_SIG} signature (hop key: --hop-key-file)"
    )

"""``--hop-key-file``, shared by the frontend, the router and the worker: the key that signs (the
frontend) and checks (the router, the workers) the tenant a request carries between them
(:mod:`kvretention.common.hop_auth`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import click
from prometheus_client import Counter

from kvretention.common.hop_auth import HopKeyError, HopKeyFile, hop_refusal, refusal_message

hop_key_file_option: Final = click.option(
    "--hop-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="KVR_HOP_KEY_FILE",
    help="The fleet's hop key (a mounted Secret: one key per line, the first signs, any one "
    "verifies; re-read when it changes). The frontend signs each request's tenant with it, the "
    "router and the workers refuse a request without a valid signature (403). Unset: nothing "
    "signed or checked.",
)


def load_hop_key_file(path: Path | None) -> HopKeyFile | None:
    """The hop key in force for ``--hop-key-file`` (None without one); a file that cannot be used
    stops startup with a usage error naming it, never a key."""
    if path is None:
        return None
    try:
        return HopKeyFile(path)
    except HopKeyError as exc:
        raise click.BadParameter(str(exc), param_hint="--hop-key-file") from None


def refused_hop(
    hop_keys: HopKeyFile | None, headers: Mapping[str, str], refusals: Counter
) -> str | None:
    """Why a hop the router or a worker got is refused (counted in ``refusals`` by reason), or
    None when the fleet's frontend signed it, or when no key is set. Checked before the body is
    read: only the frontend may name a tenant."""
    refused = hop_refusal(hop_keys.keys if hop_keys else None, headers, now=time.time())
    if refused is None:
        return None
    refusals.labels(refused.value).inc()
    return refusal_message(refused)

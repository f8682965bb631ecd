"""``--session-keys``: where a request names its session, one flag for the frontend and for the
router's endpoint picker, which must read a session where the frontend reads it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final, TypeVar

import click

from kvretention.common.sessions import DEFAULT_SESSION_KEYS

_SESSION_KEY: Final = re.compile(r"^((client_)?metadata\.[A-Za-z0-9_]+|[A-Za-z0-9][A-Za-z0-9_-]*)$")

F = TypeVar("F", bound=Callable[..., Any])


def parse_session_keys(value: str) -> tuple[str, ...]:
    """``a,b,metadata.c`` -> keys; a malformed key stops startup with a usage error."""
    keys = tuple(k.strip() for k in value.split(",") if k.strip())
    for key in keys:
        if not _SESSION_KEY.match(key):
            raise click.BadParameter(
                f"{key!r} is neither a header name nor (client_)metadata.<field>",
                param_hint="--session-keys",
            )
    return keys


def session_keys_option(help_: str) -> Callable[[F], F]:
    """The ``--session-keys`` option (``$KVR_SESSION_KEYS``), parsed into a tuple of keys."""
    return click.option(
        "--session-keys",
        default=",".join(DEFAULT_SESSION_KEYS),
        show_default=True,
        envvar="KVR_SESSION_KEYS",
        callback=lambda _ctx, _param, value: parse_session_keys(value),
        help=help_,
    )

"""Command-line options the data-plane servers and the operator share, so each reads and behaves
the same everywhere: the address and port a server listens on, the log level with its setup, and
the shapes of option that recur (an on-by-default switch, a choice whose first is the default, a
time limit)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

host_option: Final = click.option(
    "--host", default="0.0.0.0", show_default=True, help="Address to listen on."
)
"""``--host``: the address the frontend, the router and the worker listen on."""


def port_option(default: int) -> Callable[[F], F]:
    """``--port``: where the router or the worker serves its API."""
    return click.option(
        "--port", default=default, show_default=True, type=int, help="Port to listen on."
    )


def switch_option(name: str, *, help_: str, envvar: str | None = None) -> Callable[[F], F]:
    """``--NAME/--no-NAME``, on unless turned off."""
    return click.option(
        f"--{name}/--no-{name}", default=True, show_default=True, envvar=envvar, help=help_
    )


def choice_option(name: str, choices: Sequence[str], *, help_: str) -> Callable[[F], F]:
    """``--NAME`` one of ``choices``, the first unless given."""
    return click.option(
        f"--{name}", type=click.Choice(choices), default=choices[0], show_default=True, help=help_
    )


def seconds_option(name: str, default: float, help_: str) -> Callable[[F], F]:
    """A time limit: a number of seconds above 0."""
    return click.option(
        name,
        default=default,
        show_default=True,
        type=click.FloatRange(min=0, min_open=True),
        help=help_,
    )


def bootstrap_port_option(help_: str) -> Callable[[F], F]:
    """``--bootstrap-port``: a prefill worker's KV bootstrap port (SGLang's), none by default."""
    return click.option("--bootstrap-port", type=int, default=None, help=help_)


log_level_option: Final = click.option("--log-level", default="INFO", show_default=True)
"""``--log-level``: a :mod:`logging` level name, in any case."""


def configure_logging(log_level: str) -> None:
    """The data-plane servers' log lines: time, logger name, message."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")

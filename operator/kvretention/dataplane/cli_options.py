"""Command-line options the data-plane servers and the operator share, so each reads and behaves
the same everywhere: the address a server listens on, and the log level with its setup."""

from __future__ import annotations

import logging
from typing import Final

import click

host_option: Final = click.option(
    "--host", default="0.0.0.0", show_default=True, help="Address to listen on."
)
"""``--host``: the address the frontend, the router and the worker listen on."""

log_level_option: Final = click.option("--log-level", default="INFO", show_default=True)
"""``--log-level``: a :mod:`logging` level name, in any case."""


def configure_logging(log_level: str) -> None:
    """The data-plane servers' log lines: time, logger name, message."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")

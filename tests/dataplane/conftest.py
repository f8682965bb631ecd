"""Data-plane fixtures: processes started once per test module (see ``support.processes``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from support.processes import KvrProcess, StartKvretention, start_kvretention


@pytest.fixture(scope="module")
def router_standin() -> Iterator[Any]:
    """A running ``RouterStandIn`` (see ``router_standin.py``), one per test module."""
    from support.router_standin import RouterStandIn

    with RouterStandIn() as standin:
        yield standin


@pytest.fixture(scope="module")
def kvretention_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartKvretention]:
    """Factory fixture: ``kvretention_process(["frontend", ...], env=...)`` -> ``KvrProcess``.

    Every process started through it is stopped when the test module finishes.
    """
    started: list[KvrProcess] = []
    log_dir = tmp_path_factory.mktemp("kvretention-logs")

    def start(args: list[str], **kwargs: object) -> KvrProcess:
        kwargs.setdefault("log_dir", log_dir)
        process = start_kvretention(args, **kwargs)  # type: ignore[arg-type]
        started.append(process)
        return process

    yield start
    for process in reversed(started):
        process.stop()

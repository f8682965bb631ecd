"""The e2e tier's process fixture: every ``kvretention`` subcommand a module starts is stopped
when the module ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from support.processes import KvrProcess, StartKvretention, start_kvretention


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartKvretention]:
    """Start ``kvretention`` subcommands; all are stopped when the module ends."""
    started: list[KvrProcess] = []
    logs = tmp_path_factory.mktemp("e2e-logs")

    def run(args: list[str], **kwargs: Any) -> KvrProcess:
        process = start_kvretention(args, log_dir=logs, **kwargs)
        started.append(process)
        return process

    yield run
    for process in reversed(started):
        process.stop()

"""The e2e tier's process fixture: every ``kvretention`` subcommand a module starts is stopped
when the module ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.processes import StartKvretention, started_in_module


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartKvretention]:
    """Start ``kvretention`` subcommands; all are stopped when the module ends."""
    yield from started_in_module(tmp_path_factory.mktemp("e2e-logs"))

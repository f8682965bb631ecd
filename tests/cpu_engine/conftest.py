"""The CPU-engine tier: SGLang's real engine (tokenizer manager, scheduler, radix cache, plugins)
serving the project's tiny model on CPU, behind the real worker; every process a module starts is
stopped when the module ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.processes import StartKvretention, started_in_module


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartKvretention]:
    """Start ``kvretention`` subcommands; all are stopped when the module ends."""
    yield from started_in_module(tmp_path_factory.mktemp("cpu-engine-logs"))

"""The CPU-engine tier: SGLang's real engine (tokenizer manager, scheduler, radix cache, plugins)
serving the project's tiny model on CPU, behind the real worker; every process a module starts is
stopped when the module ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from support.cpu_engine import CpuWorker, StartCpuWorker, start_cpu_worker
from support.processes import StartKvretention, started_in_module


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartKvretention]:
    """Start ``kvretention`` subcommands; all are stopped when the module ends."""
    yield from started_in_module(tmp_path_factory.mktemp("cpu-engine-logs"))


@pytest.fixture(scope="module")
def cpu_worker(start: StartKvretention, tmp_path_factory: pytest.TempPathFactory) -> StartCpuWorker:
    """``cpu_worker(name, sglang_args=..., worker_args=...)``: a worker on the CPU engine
    (:func:`support.cpu_engine.start_cpu_worker`) in a fresh directory named ``name``."""

    def run(name: str, **kwargs: Any) -> CpuWorker:
        return start_cpu_worker(start, tmp_path_factory.mktemp(name), **kwargs)

    return run

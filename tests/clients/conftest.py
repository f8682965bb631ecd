"""The real-clients tier: the pinned Claude Code and Codex CLIs (npm) against the data plane
rendered from ``examples/agents.yaml``. ``KVR_CLIENTS=latest`` runs npm's latest releases instead
(``make clients-latest``); ``KVR_CLIENTS_REPORT=FILE`` writes what each client sent."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from support.processes import StartKvretention, started_in_module
from support.real_clients import Client, installed


@pytest.fixture(scope="session")
def clients() -> dict[str, Client]:
    """The CLIs, installed into the cache on first use; npm missing is a failure, not a skip."""
    return installed(latest=os.environ.get("KVR_CLIENTS") == "latest")


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartKvretention]:
    """Start ``kvretention`` subcommands; all are stopped when the module ends."""
    yield from started_in_module(tmp_path_factory.mktemp("clients-logs"))

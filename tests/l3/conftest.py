"""L3 fixtures: the real Mooncake store client (over the test-only libcuda stand-in) and masters
started with the operator's rendered argv."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from mooncake_harness import (
    Master,
    MasterFactory,
    StandinError,
    Store,
    build_standin,
    fleet_cr,
    load_store_module,
    running_master,
)


@pytest.fixture(scope="session")
def store_module() -> ModuleType:
    """``mooncake.store`` with the stand-in driver loaded.

    Under CI a stand-in that cannot be built fails every store test; on a dev box without gcc
    they are skipped with the builder's own error.
    """
    try:
        standin = build_standin()
    except StandinError as err:
        if os.environ.get("CI"):
            pytest.fail(f"the Mooncake store client cannot load: {err}")
        pytest.skip(f"the Mooncake store client cannot load here: {err}")
    return load_store_module(standin)


@pytest.fixture
def start_master(tmp_path: Path) -> MasterFactory:
    """Start a fresh master for one fleet spec: ``with start_master(master={...}) as m``."""
    count = 0

    @contextlib.contextmanager
    def start(**spec: Any) -> Iterator[Master]:
        nonlocal count
        count += 1
        with running_master(fleet_cr(**spec), tmp_path / f"master-{count}") as master:
            yield master

    return start


@pytest.fixture
def connect(store_module: ModuleType) -> Callable[[Master], Store]:
    """Store clients set up from a master's rendered config; the master closes them first."""

    def make(master: Master) -> Store:
        return Store(store_module, master)

    return make

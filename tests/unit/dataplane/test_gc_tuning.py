"""The data plane's collector settings: what startup loaded is frozen, collections are rarer."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from kvretention.dataplane.gc_tuning import GC_THRESHOLDS, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_freezes_startup_and_raises_the_thresholds() -> None:
    loaded = [{"startup": True}]  # what startup built: frozen, never scanned again
    tune_gc()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_freeze_count() > 0
    assert all(id(x) != id(loaded) for x in gc.get_objects())  # permanent: no generation holds it


@pytest.mark.usefixtures("restored_gc")
def test_cycles_are_still_collected() -> None:
    tune_gc()
    cycle: list[object] = []
    cycle.append(cycle)
    ref = id(cycle)
    del cycle
    assert gc.collect() >= 1
    assert all(id(x) != ref for x in gc.get_objects())

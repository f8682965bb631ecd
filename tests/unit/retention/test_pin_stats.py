"""The radix pins' numbers, from SGLang's scheduler processes to the worker's ``/metrics``: written
only when they changed and a second has passed, read as the largest over the processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvretention.retention import pin_stats
from kvretention.retention.failures import STATS_DIR_ENV
from kvretention.retention.pins import PinTable
from support.metric_registries import worker_samples


def scrape(directory: Path) -> dict[str, float]:
    return worker_samples(directory, "kvretention_worker_radix_pin")


@pytest.fixture
def stats_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(STATS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(pin_stats, "_TABLES", {})
    monkeypatch.setattr(pin_stats, "_WRITTEN", {})
    return tmp_path


def test_no_pinned_tree_no_gauge_and_a_zero_counter(stats_dir: Path) -> None:
    assert scrape(stats_dir) == {"kvretention_worker_radix_pins_dropped_total": 0.0}


def test_written_when_changed_and_a_second_has_passed(stats_dir: Path) -> None:
    table = PinTable(core=None, cap_tokens=1024)
    now = [100.0]

    def clock() -> float:
        return now[0]

    assert pin_stats.record_pins(table, clock=clock)  # the first: the budget shows at once
    table.pinned_tokens, table.shed = 400, 2
    assert not pin_stats.record_pins(table, clock=clock)  # changed, but within the second
    now[0] += 1.0
    assert pin_stats.record_pins(table, clock=clock)
    now[0] += 5.0
    assert not pin_stats.record_pins(table, clock=clock)  # unchanged: nothing to write
    assert scrape(stats_dir) == {
        'kvretention_worker_radix_pinned_tokens{kind="pinned"}': 400.0,
        'kvretention_worker_radix_pinned_tokens{kind="budget"}': 1024.0,
        "kvretention_worker_radix_pins_dropped_total": 2.0,
    }


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # two tensor-parallel ranks hold the same pins: the largest, not the sum
        (
            [
                {"pins": 3, "pinned_tokens": 400, "budget_tokens": 1024, "dropped": 1},
                {"pins": 3, "pinned_tokens": 400, "budget_tokens": 1024, "dropped": 1},
            ],
            {"pins": 3, "pinned_tokens": 400, "budget_tokens": 1024, "dropped": 1},
        ),
        # a half-written or foreign file is skipped, never a failed scrape
        (
            [
                {"pins": 1, "pinned_tokens": 16, "budget_tokens": 64, "dropped": 0},
                {"pins": "x", "pinned_tokens": 99, "budget_tokens": 99, "dropped": 99},
                ["not", "an", "object"],
            ],
            {"pins": 1, "pinned_tokens": 16, "budget_tokens": 64, "dropped": 0},
        ),
        ([], None),
    ],
)
def test_the_largest_over_the_processes(
    tmp_path: Path, files: list[Any], expected: dict[str, int] | None
) -> None:
    (tmp_path / "radix_pins").mkdir()
    for pid, data in enumerate(files):
        (tmp_path / "radix_pins" / f"{pid}.json").write_text(json.dumps(data))
    assert pin_stats.read_pins(str(tmp_path)) == expected

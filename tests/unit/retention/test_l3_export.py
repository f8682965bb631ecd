"""The L3 numbers on the worker's ``/metrics``: counted in SGLang's scheduler process (here: a child
process, or this one), summed by the worker's collector on each scrape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from kvretention.dataplane.worker.app import WorkerMetrics
from kvretention.retention.failures import STATS_DIR_ENV
from kvretention.retention.l3_budget import OUTCOMES
from kvretention.retention.l3_export import SUBDIR, read_numbers
from kvretention.retention.l3_stats import L3Stats

ROOT = Path(__file__).resolve().parents[3]

CHILD = """
from kvretention.retention.l3_stats import STATS
STATS.count("pinned", 3)
STATS.count("over_budget")
STATS.master_restarted(pins_lost=2)
STATS.set_pinned(4096, 8192, {"alice": 4096})
"""


def scrape(directory: Path) -> dict[str, float]:
    """The worker registry's samples, by name and labels as the text exposition writes them."""
    text = generate_latest(WorkerMetrics(retention_stats_dir=str(directory)).registry).decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("kvretention_l3_"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_a_child_process_counts_and_the_worker_serves_them(tmp_path: Path) -> None:
    env = {
        **os.environ,
        STATS_DIR_ENV: str(tmp_path),
        "PYTHONPATH": str(ROOT / "operator"),
    }
    for _ in range(2):  # two ranks' processes: summed
        subprocess.run([sys.executable, "-c", CHILD], env=env, check=True, timeout=60)
    samples = scrape(tmp_path)
    assert samples['kvretention_l3_pages_total{outcome="pinned"}'] == 6
    assert samples['kvretention_l3_pages_total{outcome="over_budget"}'] == 2
    assert samples['kvretention_l3_pages_total{outcome="pin_refused"}'] == 0
    assert samples["kvretention_l3_master_restarts_total"] == 2
    assert samples["kvretention_l3_pins_lost_total"] == 4
    assert samples["kvretention_l3_pinned_bytes"] == 8192
    assert samples["kvretention_l3_pin_budget_bytes"] == 16384
    assert samples['kvretention_l3_tenant_pinned_bytes{tenant="alice"}'] == 8192


def test_before_any_put_every_series_reads_zero(tmp_path: Path) -> None:
    samples = scrape(tmp_path)
    assert {k: v for k, v in samples.items() if v} == {}
    assert len([k for k in samples if k.startswith("kvretention_l3_pages_total")]) == len(OUTCOMES)
    assert "kvretention_l3_master_restarts_total" in samples
    assert "kvretention_l3_pin_budget_bytes" not in samples  # no budget known


def test_unreadable_files_are_skipped(tmp_path: Path) -> None:
    (tmp_path / SUBDIR).mkdir()
    (tmp_path / SUBDIR / "1.json").write_text("{half")
    (tmp_path / SUBDIR / "2.json").write_text("[]")
    (tmp_path / SUBDIR / "3.json").write_text(
        json.dumps({"pages": {"pinned": -4, "expired": 2}, "pins_lost": "x", "budget_bytes": 10})
    )
    numbers = read_numbers(tmp_path)
    assert numbers["pages"]["pinned"] == 0 and numbers["pages"]["expired"] == 2
    assert numbers["pins_lost"] == 0 and numbers["budget_bytes"] == 10


def test_the_write_path_publishes_at_most_every_half_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STATS_DIR_ENV, str(tmp_path))
    stats = L3Stats()
    path = tmp_path / SUBDIR / f"{os.getpid()}.json"
    stats.count("pinned")
    stats.set_pinned(100, 1000)
    assert json.loads(path.read_text())["pinned_bytes"] == 100
    stats.count("pinned")
    stats.set_pinned(200, 1000)  # within PUBLISH_S of the last write: left for the watch thread
    assert json.loads(path.read_text())["pinned_bytes"] == 100
    stats.publish(force=True)
    assert json.loads(path.read_text())["pinned_bytes"] == 200
    assert json.loads(path.read_text())["pages"]["pinned"] == 2
    path.unlink()
    stats.publish(force=True)  # nothing new: nothing written
    assert not path.exists()

"""Run ``sglang_retention_check.py`` (SGLang's MooncakeStore with or without the retention plugin)
against a running master, the way a worker runs it: the rendered config file and worker env.

Shared by ``test_l3_retention.py`` and ``benchmarks/retention_l3_bench.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mooncake_harness import ROOT, Master, build_standin, sglang_import_deps

from kvretention.common.kv_retain import ACTION_TYPE, ACTION_VERSION, PROTOCOL_VERSION
from kvretention.retention.failures import STATS_DIR_ENV
from kvretention.retention.l3_export import read_numbers

CHECK = Path(__file__).with_name("sglang_retention_check.py")
OBJECT_BYTES = 64 * 1024
"""One K or V object of a page; a page is two (128 KiB), so the 16 MiB pool holds 128 pages."""
PAGE_SIZE = 4


def retain(*directives: dict[str, Any], scope: str | None = "s") -> dict[str, Any]:
    """A ``kv.retain`` 1.0 envelope, as the worker sends it."""
    payload = {"scope": scope, "directives": list(directives)}
    action = {"action_id": "a", "action_type": ACTION_TYPE, "action_version": ACTION_VERSION}
    actions = [{**action, "payload": payload}]
    return {"protocol_version": PROTOCOL_VERSION, "message_id": "m", "actions": actions}


@dataclass(frozen=True)
class Request:
    rid: str
    pages: int
    token_base: int
    kv_hints: dict[str, Any] | None = None
    cache_salt: str | None = None
    extra_key: str | None = None


@dataclass(frozen=True)
class Scenario:
    requests: tuple[Request, ...]
    plugin: bool
    pressure_pages: int = 512
    wait_s: float = 0.0
    settle_s: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] | None = None
    """Replaces the rendered ``kvretention`` section (a master configured apart from it)."""
    restart_before: tuple[str, ...] = ()
    """Requests before which the worker "restarts": a new ledger, the earlier pins still there."""
    drop_metrics_port: bool = False
    """Leave ``master_metrics_port`` out of the file (as for an external master)."""
    restart_master_before: tuple[str, ...] = ()
    """Requests before which the master restarts (``run_scenario``'s ``restart_master``), the
    worker process staying up."""


RESTART_ASKED = "restart-master"
RESTART_DONE = "master-restarted"
"""Marker files in the scenario's directory: the check asks for a master restart and waits."""


def run_scenario(
    master: Master,
    scenario: Scenario,
    workdir: Path,
    *,
    restart_master: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run one scenario in a fresh interpreter; its JSON report. ``restart_master`` restarts the
    master (same ports) each time the check asks, before a ``restart_master_before`` request."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "mooncake.json"
    config = master.config()
    if scenario.settings is not None:
        config["kvretention"] = scenario.settings
    if scenario.drop_metrics_port:
        config.pop("master_metrics_port", None)
    config_path.write_text(json.dumps(config))
    trace = workdir / "trace.jsonl"
    stats_dir = workdir / "stats"  # what the worker's /metrics reads the plugin's numbers from
    stats_dir.mkdir(exist_ok=True)
    spec = {
        "standin": str(build_standin()),
        "metrics_url": master.metrics_url,
        "plugin": scenario.plugin,
        "page_size": PAGE_SIZE,
        "object_bytes": OBJECT_BYTES,
        "slots": max(64, sum(r.pages for r in scenario.requests) + 1),
        "pressure_pages": scenario.pressure_pages,
        "wait_s": scenario.wait_s,
        "settle_s": scenario.settle_s,
        "requests": [r.__dict__ for r in scenario.requests],
        "restart_before": list(scenario.restart_before),
        "restart_master_before": list(scenario.restart_master_before),
        "signal_dir": str(workdir),
        **scenario.extra,
    }
    spec_path = workdir / "scenario.json"
    spec_path.write_text(json.dumps(spec))
    env = {
        **os.environ,
        "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": str(config_path),
        "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
        "KVR_REQUEST_TRACE": str(trace),
        STATS_DIR_ENV: str(stats_dir),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(sglang_import_deps())]),
        "PYTHONWARNINGS": "ignore",
    }
    returncode, stdout, stderr = _run_check(spec_path, env, workdir, restart_master)
    assert returncode == 0, f"the retention check failed:\n{stderr[-6000:]}"
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report:\n{stdout[-2000:]}\n{stderr[-2000:]}"
    report: dict[str, Any] = json.loads(lines[-1])
    report["trace"] = (
        [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    )
    report["stderr"] = stderr[-4000:]
    report["worker_l3_numbers"] = read_numbers(stats_dir)
    return report


def _run_check(
    spec_path: Path,
    env: dict[str, str],
    workdir: Path,
    restart_master: Callable[[], None] | None,
    timeout_s: float = 600.0,
) -> tuple[int, str, str]:
    """Run the check, restarting the master whenever it asks; its exit status, stdout, stderr."""
    out, err = workdir / "check.out", workdir / "check.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(CHECK), str(spec_path)], stdout=stdout, stderr=stderr, env=env
        )
        deadline = time.monotonic() + timeout_s
        asked = workdir / RESTART_ASKED
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise TimeoutError(f"the retention check ran past {timeout_s:g}s")
            if asked.exists():
                assert restart_master is not None, "the check asked for a master restart"
                asked.unlink()
                restart_master()
                (workdir / RESTART_DONE).touch()
            time.sleep(0.05)
    return proc.returncode, out.read_text(errors="replace"), err.read_text(errors="replace")

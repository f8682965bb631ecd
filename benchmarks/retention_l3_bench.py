"""Retained pages in Mooncake after a pressure run, with and without the retention plugin.

The L3 half of issue 19's benchmark, on the real parts: a fresh ``mooncake_master`` with the
operator's rendered argv per run, and SGLang 0.5.23's own ``MooncakeStore`` (CPU, through the
test-only libcuda stand-in) set up from the rendered ``mooncake.json``, writing pages as HiCache
backs a node up (``batch_set_v1``, the keys its tree computes). Each run writes N
agent prompts of ``--pages`` pages retained by ``kv.retain`` (whole prompt, 1 h) beside as many
unhinted background prompts, then four pools of unhinted pressure pages; a page *survives* when it
reads back byte-exact. Side by side in one run: the retention plugin loaded by SGLang's own plugin
loader (its entry point), or not at all; a load within the pin budget and one past it.

    .venv/bin/python benchmarks/retention_l3_bench.py [--repeats 1] \
        [--out benchmarks/results/retention_l3.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "l3"))
sys.path.insert(0, str(ROOT / "operator"))

from mooncake_harness import SEGMENT_BYTES, fleet_cr, running_master  # noqa: E402
from retention_runner import OBJECT_BYTES, Request, Scenario, retain, run_scenario  # noqa: E402

from kvretention.controller.kvstore_metrics import parse_usage  # noqa: E402

PAGE_BYTES = 2 * OBJECT_BYTES
BUDGET = 0.5


def master_spec(*, allow_eviction: bool) -> dict[str, Any]:
    return {
        "leaseTtlMilliseconds": 50,
        "eviction": {"highWatermarkRatio": 0.8, "ratio": 0.05},
        "softPin": {
            "defaultTtlSeconds": 1800,
            "maxTtlSeconds": 86400,
            "allowEviction": allow_eviction,
            "budgetRatio": BUDGET,
        },
    }


def requests(sessions: int, pages: int) -> tuple[Request, ...]:
    hinted = [
        Request(f"session-{i}", pages, 100_000 * i, retain({"priority": 50, "duration": 3600}))
        for i in range(sessions)
    ]
    background = [Request(f"background-{i}", pages, 10**8 + 100_000 * i) for i in range(sessions)]
    return (*hinted, *background)


def one_run(
    *, allow_eviction: bool, plugin: bool, sessions: int, pages: int, workdir: Path
) -> dict[str, Any]:
    cr = fleet_cr(master=master_spec(allow_eviction=allow_eviction))
    with running_master(cr, workdir / "master") as master:
        scenario = Scenario(requests(sessions, pages), plugin=plugin, pressure_pages=512)
        started = time.monotonic()
        report = run_scenario(master, scenario, workdir / "run")
        elapsed = time.monotonic() - started
    infos = report["requests"]
    hinted = [v for k, v in infos.items() if k.startswith("session-")]
    background = [v for k, v in infos.items() if k.startswith("background-")]
    after = parse_usage(report["metrics_after_writes"])
    return {
        "retained_pages": sum(len(v["survived"]) for v in hinted),
        "retained_pages_survived": sum(sum(v["survived"]) for v in hinted),
        "retained_pages_present": sum(sum(v["exists"]) for v in hinted),
        "sessions_whole": sum(all(v["survived"]) for v in hinted),
        "background_pages_survived": sum(sum(v["survived"]) for v in background),
        "pages_written": sum(sum(v["written"]) for v in infos.values()),
        "pages_total": sum(len(v["written"]) for v in infos.values()),
        "pinned_ratio_after_writes": round(after.pinned_keys * OBJECT_BYTES / SEGMENT_BYTES, 4),
        "over_budget": report["stats"].get("over_budget", 0) if plugin else 0,
        "evicted_objects": parse_usage(report["metrics_after_pressure"]).evicted_keys,
        "wall_s": round(elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--pages", type=int, default=6)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/retention_l3.json")
    args = parser.parse_args()
    budget_pages = int(BUDGET * SEGMENT_BYTES) // PAGE_BYTES
    loads = {
        "within the budget": max(1, budget_pages // (2 * args.pages)),
        "past the budget": 2 * budget_pages // args.pages,
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvr-l3-bench-") as tmp:
        for allow_eviction in (False, True):
            for load, sessions in loads.items():
                for plugin in (False, True):
                    runs = []
                    for r in range(args.repeats):
                        work = Path(tmp) / f"{allow_eviction}-{sessions}-{plugin}-{r}"
                        runs.append(
                            one_run(
                                allow_eviction=allow_eviction,
                                plugin=plugin,
                                sessions=sessions,
                                pages=args.pages,
                                workdir=work,
                            )
                        )
                    median = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
                    rows.append(
                        {
                            "allow_eviction": allow_eviction,
                            "load": load,
                            "sessions": sessions,
                            "plugin": plugin,
                            "median": median,
                            "runs": runs,
                        }
                    )
                    print(_row(rows[-1]), flush=True)
    report = {
        "python": platform.python_version(),
        "budget_ratio": BUDGET,
        "pool_bytes": SEGMENT_BYTES,
        "page_bytes": PAGE_BYTES,
        "pages_per_session": args.pages,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


def _row(row: dict[str, Any]) -> str:
    m = row["median"]
    return (
        f"| {row['load']} ({row['sessions']} sessions) | {str(row['allow_eviction']).lower()} | "
        f"{'plugin' if row['plugin'] else 'stock'} | "
        f"{m['retained_pages_survived']:g}/{m['retained_pages']:g} | {m['sessions_whole']:g} | "
        f"{m['background_pages_survived']:g} | {m['pinned_ratio_after_writes']:.1%} | "
        f"{m['over_budget']:g} | {m['pages_written']:g}/{m['pages_total']:g} |"
    )


if __name__ == "__main__":
    main()

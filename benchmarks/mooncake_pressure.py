"""Pinned prompts under eviction pressure, and put/get throughput, on the real Mooncake store.

A small-scale version of the design note's pressure experiment. For each master configuration the
operator can render (``softPin.allowEviction`` true/false), a fresh ``mooncake_master`` starts
with the rendered argv and the real store client mounts one segment. ``--prompts`` prompts of
``--pages`` KV pages each are written, either all hinted (soft-pinned with a 1 h TTL, what the
worker's hint would ask for) or all unhinted, side by side in the same run; then ``--pressure``
times the pool's size of unpinned pages is written, each write retried while the pool is full, as
HiCache would. A prompt *survives* when every one of its pages is still readable with its bytes
(a prefix cache can only reuse whole prefixes). Throughput is 1 MiB put/get on loopback TCP, and
the cost of a pinned put next to a plain one in the same run.

    .venv/bin/python benchmarks/mooncake_pressure.py [--repeats 3] [--out benchmarks/results/mooncake_pressure.json]
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

from mooncake_harness import (  # noqa: E402
    MIB,
    NO_AVAILABLE_HANDLE,
    OK,
    Store,
    build_standin,
    fleet_cr,
    load_store_module,
    running_master,
    value_for,
)

PAGE = 256 * 1024


def master_spec(*, allow_eviction: bool) -> dict[str, Any]:
    pin: dict[str, Any] = {"defaultTtlSeconds": 1800, "maxTtlSeconds": 86400}
    pin["allowEviction"] = allow_eviction
    if not allow_eviction:
        pin["budgetRatio"] = 0.5
    return {
        "leaseTtlMilliseconds": 50,
        "eviction": {"highWatermarkRatio": 0.9, "ratio": 0.05},
        "softPin": pin,
    }


def pressure_round(
    module: Any,
    workdir: Path,
    *,
    allow_eviction: bool,
    hinted: bool,
    segment: int,
    prompts: int,
    pages: int,
    pressure: float,
) -> dict[str, Any]:
    cr = fleet_cr(master=master_spec(allow_eviction=allow_eviction), segment_bytes=segment)
    with running_master(cr, workdir) as master:
        store = Store(module, master)
        keys = [[f"prompt-{p}-page-{i}" for i in range(pages)] for p in range(prompts)]
        for prompt in keys:
            for key in prompt:
                rc = store.put(key, value_for(key, PAGE), pin_ttl_ms=3_600_000 if hinted else None)
                assert rc == OK, f"prompt write failed: {rc}"
        writes = int(pressure * segment / PAGE)
        started = time.perf_counter()
        refused = 0
        for i in range(writes):
            key = f"pressure-{i}"
            if store.put_under_pressure(key, value_for(key, PAGE), retry_s=1.0) != OK:
                refused += 1
        pressure_s = time.perf_counter() - started
        time.sleep(0.5)
        survived = sum(
            all(store.exists(k) and store.get(k) == value_for(k, PAGE) for k in prompt)
            for prompt in keys
        )
        usage = master.metrics()
    return {
        "allow_eviction": allow_eviction,
        "hinted": hinted,
        "prompts": prompts,
        "prompts_survived": survived,
        "pressure_writes": writes,
        "pressure_refused": refused,
        "pressure_seconds": pressure_s,
        "evicted_objects": int(usage["master_evicted_key_count"]),
        "eviction_rounds": int(usage["master_successful_evictions_total"]),
    }


def throughput_round(module: Any, workdir: Path, *, ops: int) -> dict[str, float]:
    # Room for every value twice over: this measures transfers, not eviction.
    cr = fleet_cr(master=master_spec(allow_eviction=True), segment_bytes=(2 * ops + 16) * MIB)
    value = bytes(range(256)) * (MIB // 256)
    with running_master(cr, workdir) as master:
        store = Store(module, master)
        kinds = (("put", False), ("put_pinned", True))
        # One untimed pass first: the first write into fresh segment memory pays for page faults.
        for label, pinned in kinds:
            for i in range(ops):
                assert store.put(f"warm-{label}-{i}", value, pin=pinned) == OK
                assert store.remove(f"warm-{label}-{i}") == OK
        samples: dict[str, list[float]] = {"put_mb_s": [], "put_pinned_mb_s": []}
        for round_ in range(3):  # plain and pinned alternate, so drift hits both alike
            for label, pinned in kinds:
                keys = [f"{label}-{round_}-{i}" for i in range(ops)]
                started = time.perf_counter()
                for key in keys:
                    rc = store.put(key, value, pin_ttl_ms=3_600_000 if pinned else None)
                    assert rc == OK, rc
                samples[f"{label}_mb_s"].append(
                    ops * len(value) / MIB / (time.perf_counter() - started)
                )
                for key in keys:
                    assert store.remove(key) == OK
        out = {k: statistics.median(v) for k, v in samples.items()}
        for i in range(ops):
            assert store.put(f"get-{i}", value) == OK
        started = time.perf_counter()
        for i in range(ops):
            assert store.get(f"get-{i}") == value
        out["get_mb_s"] = ops * len(value) / MIB / (time.perf_counter() - started)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--segment-mib", type=int, default=32)
    parser.add_argument(
        "--pinned-shares",
        type=float,
        nargs="+",
        default=[0.25, 0.9375],
        help="share of the pool the prompts fill (0.9375 is past the 0.9 high watermark)",
    )
    parser.add_argument("--pages", type=int, default=4, help="pages per prompt")
    parser.add_argument("--pressure", type=float, default=4.0, help="pool sizes of pressure")
    parser.add_argument("--ops", type=int, default=64, help="1 MiB operations per throughput run")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/mooncake_pressure.json"
    )
    args = parser.parse_args()

    module = load_store_module(build_standin())
    segment = args.segment_mib * MIB
    pressure: dict[tuple[float, bool, bool], list[dict[str, Any]]] = {}
    throughput: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="kvr-mooncake-bench-") as tmp:
        run = 0
        for _ in range(args.repeats):
            for share in args.pinned_shares:
                prompts = round(share * segment / (args.pages * PAGE))
                for allow_eviction in (True, False):
                    for hinted in (False, True):
                        run += 1
                        result = pressure_round(
                            module,
                            Path(tmp) / f"run-{run}",
                            allow_eviction=allow_eviction,
                            hinted=hinted,
                            segment=segment,
                            prompts=prompts,
                            pages=args.pages,
                            pressure=args.pressure,
                        )
                        pressure.setdefault((share, allow_eviction, hinted), []).append(result)
            run += 1
            throughput.append(throughput_round(module, Path(tmp) / f"run-{run}", ops=args.ops))

    rows = []
    for (share, allow_eviction, hinted), results in sorted(pressure.items()):
        rows.append(
            {
                "prompt_share_of_pool": share,
                "allow_eviction": allow_eviction,
                "hinted": hinted,
                "prompts": results[0]["prompts"],
                "survived_median": statistics.median(r["prompts_survived"] for r in results),
                "survived_all": [r["prompts_survived"] for r in results],
                "refused_median": statistics.median(r["pressure_refused"] for r in results),
                "evicted_median": statistics.median(r["evicted_objects"] for r in results),
                "pressure_writes": results[0]["pressure_writes"],
                "runs": results,
            }
        )
    tp = {k: statistics.median(t[k] for t in throughput) for k in throughput[0]}
    tp["pinned_over_plain_put"] = statistics.median(
        t["put_pinned_mb_s"] / t["put_mb_s"] for t in throughput
    )
    report = {
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "params": {
            "repeats": args.repeats,
            "segment_mib": args.segment_mib,
            "page_kib": PAGE // 1024,
            "prompt_shares_of_pool": args.pinned_shares,
            "pages_per_prompt": args.pages,
            "pressure_pool_sizes": args.pressure,
            "throughput_ops": args.ops,
        },
        "pressure": rows,
        "throughput": tp,
        "throughput_runs": throughput,
        "no_available_handle": NO_AVAILABLE_HANDLE,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")

    print(
        f"pool {args.segment_mib} MiB, prompts of {args.pages} x 256 KiB pages, "
        f"{args.pressure:g}x pool of pressure, medians of {args.repeats}"
    )
    print(
        "| prompts' share of pool | allowEviction | hints | prompts survived "
        "| pressure writes refused | objects evicted |"
    )
    print("|---:|---|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['prompt_share_of_pool']:.0%} | {str(r['allow_eviction']).lower()} | "
            f"{'hinted' if r['hinted'] else 'none'} | "
            f"{r['survived_median']:g}/{r['prompts']} | "
            f"{r['refused_median']:g}/{r['pressure_writes']} | {r['evicted_median']:g} |"
        )
    print()
    print("| put MB/s | pinned put MB/s | get MB/s | pinned/plain put |")
    print("|---:|---:|---:|---:|")
    print(
        f"| {tp['put_mb_s']:.0f} | {tp['put_pinned_mb_s']:.0f} | {tp['get_mb_s']:.0f} | "
        f"{tp['pinned_over_plain_put']:.2f} |"
    )


if __name__ == "__main__":
    main()

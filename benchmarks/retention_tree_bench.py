"""What retention costs SGLang's radix tree: per-request tree calls and one eviction pass, per core.

Side by side in one run, on SGLang 0.5.23's own ``UnifiedRadixCache`` over CPU pools (see
``tests/support/sglang_radix.py``), one arm per (policy, TreeCore): ``lru`` and ``priority`` on
SGLang's default Rust core, ``lru`` on the Python core, and ``kvretain`` (the retention plugin) on
both: pins on the Rust core, node ranks on the Python core where SGLang falls back to it (see
docs/retention.md, "Which tree core"). ``--before PATH`` adds the ``kvretain`` arms of another
source tree (``PATH/operator`` first on the path, in a subprocess).

- *per request*: the retention benchmark's workload (``retention_bench.py``: agent conversations
  with ``kv.retain`` on hinted turns, Zipf background, the cache under pressure), the CPU time of
  the tree calls a request makes (``match_prefix``, ``lock``, ``evict``, ``checkpoint`` with the
  plugin's hook, ``unlock``), median of the rounds;
- *eviction pass*: a tree of ``--leaves`` evictable leaves (half of them held on the hinted
  ``kvretain`` arms, none on the ``-unhinted`` ones), the CPU time of one ``evict`` of one
  page (SGLang ranks every evictable leaf per pass on the Python core), median and least over
  ``--passes``, arms interleaved; and the least CPU time of ranking every evictable leaf once,
  per leaf.

    .venv/bin/python benchmarks/retention_tree_bench.py [--before /tmp/before] \
        [--out benchmarks/results/retention_tree.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

import retention_bench  # noqa: E402
from retention_bench import PAGE, PRIORITY, ROUND_SECONDS, TTL, Workload, build_schedule  # noqa: E402
from support.sglang_radix import RadixTree, TreeSpec, load_sglang, retain  # noqa: E402

ARMS = {  # arm: (--radix-eviction-policy, TreeCore (None: SGLang's choice), hinted)
    "lru-rust": ("lru", None, False),
    "priority-rust": ("priority", None, True),
    "kvretain-rust": ("kvretain", None, True),  # SGLang's choice: its Rust core, holds as pins
    "kvretain-rust-unhinted": ("kvretain", None, False),  # the plugin on hint-free traffic
    "lru-python": ("lru", "python", False),
    "kvretain-python": ("kvretain", "python", True),  # where SGLang falls back: node ranks
    "kvretain-python-unhinted": ("kvretain", "python", False),
}
TREE_CALLS = ("match_prefix", "lock", "evict", "checkpoint", "unlock")


def _timed(cache: Any, spent: list[float]) -> None:
    """Count the CPU time of ``cache``'s tree calls into ``spent[0]`` (instance attributes shadow
    the class's methods, hooks included)."""
    for name in TREE_CALLS:
        method = getattr(cache, name)

        def timed(*args: Any, _method: Callable[..., Any] = method, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[0] += time.process_time() - start

        setattr(cache, name, timed)


def per_request(arm: str, w: Workload, rounds: list[list[Any]]) -> dict[str, Any]:
    policy, core, hinted = ARMS[arm]
    tree = RadixTree(retention_bench.tree_spec(w, policy=policy, core=core))
    spent = [0.0]
    _timed(tree.cache, spent)
    now = retention_bench.simulated_clock()
    requests = 0
    for events in rounds:
        for kind, item in events:
            requests += 1
            if kind == "bg":
                tree.run(item)
                continue
            hints = priority = None
            if hinted and policy == "kvretain":
                hints = retain(len(item.prompt), priority=PRIORITY, duration=TTL)
            elif hinted and policy == "priority":
                priority = PRIORITY
            tree.run(item.prompt, output=item.output, kv_hints=hints, priority=priority)
        now[0] += ROUND_SECONDS
    return {"tree_core": tree.cache._tree_core_backend, "tree_ms": 1000 * spent[0] / requests}


def _leaf_tokens(i: int) -> list[int]:
    """Two pages: one shared by every leaf, one of its own (the evictable leaf)."""
    return [7] * PAGE + [10 + i // 1000, 10 + i % 1000] + [3] * (PAGE - 2)


def pass_tree(arm: str, leaves: int) -> RadixTree:
    policy, core, hinted = ARMS[arm]
    spec = TreeSpec(
        kind="unified",
        policy=policy,
        page_size=PAGE,
        tokens=(leaves + 64) * 2 * PAGE,
        max_requests=4,
        context=4 * PAGE,
        tree_core=core,
    )
    tree = RadixTree(spec)
    for i in range(leaves):
        held = hinted and policy == "kvretain" and i % 2 == 0
        tree.run(_leaf_tokens(i), kv_hints=retain(2 * PAGE, duration=TTL) if held else None)
    return tree


def one_pass(tree: RadixTree) -> float:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    start = time.process_time()
    tree.cache.evict(EvictParams(num_tokens=PAGE))
    return time.process_time() - start


def rank_us(tree: RadixTree) -> float | None:
    """Ranking one evictable leaf, as the pass does (None: the Rust core ranks natively)."""
    core = tree.cache.tree_core
    if not hasattr(core, "evictable_device_leaves"):
        return None
    rank, leaves = core.eviction_strategy.get_priority, list(core.evictable_device_leaves)
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        [rank(n) for n in leaves]
        best = min(best, time.process_time() - start)
    return 1e6 * best / len(leaves)


def run(arms: list[str], *, rounds_n: int, leaves: int, passes: int) -> dict[str, Any]:
    from kvretention.retention import radix

    w = Workload()
    rounds, _ = build_schedule(w)
    requests: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    for _ in range(rounds_n):  # arms alternated: each sees the same machine noise
        for arm in arms:
            requests[arm].append(per_request(arm, w, rounds))
    radix.clock = lambda: 1_000_000.0
    trees = {arm: pass_tree(arm, leaves) for arm in arms}
    times: dict[str, list[float]] = {a: [] for a in arms}
    for _ in range(passes):
        for arm in arms:
            times[arm].append(one_pass(trees[arm]))
    out = {}
    for arm in arms:
        out[arm] = {
            "policy": ARMS[arm][0],
            "tree_core": requests[arm][0]["tree_core"],
            "tree_ms_per_request": statistics.median(r["tree_ms"] for r in requests[arm]),
            "pass_ms_median": 1000 * statistics.median(times[arm]),
            "pass_ms_min": 1000 * min(times[arm]),
            "rank_us": rank_us(trees[arm]),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/retention_tree.json")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--leaves", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=15)
    parser.add_argument("--before", type=Path, help="a source tree whose kvretain arm to add")
    args = parser.parse_args()
    load_sglang("kvretention")
    import logging

    logging.getLogger("sglang").setLevel(logging.WARNING)
    measure = dict(rounds_n=args.rounds, leaves=args.leaves, passes=args.passes)
    results = run(args.arms.split(","), **measure)
    if args.before is not None:
        out = args.out.with_suffix(".before.json")
        env = dict(os.environ, PYTHONPATH=str(args.before.resolve() / "operator"))
        mine = "kvretain-python,kvretain-python-unhinted"
        command = [sys.executable, __file__, "--arms", mine, "--out", str(out)]
        command += ["--rounds", str(args.rounds), "--leaves", str(args.leaves)]
        subprocess.run([*command, "--passes", str(args.passes)], env=env, check=True)
        for arm, before in json.loads(out.read_text())["results"].items():
            results[f"{arm} (before)"] = before
    base = results.get("lru-rust")
    for r in results.values():
        if base:
            r["tree_vs_lru_rust"] = r["tree_ms_per_request"] / base["tree_ms_per_request"]
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout
    report = {
        "benchmark": "retention_tree",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "leaves": args.leaves,
        "uptime_after": uptime.strip(),
        "results": results,
    }
    retention_bench.write_report(args.out, report)
    print(
        f"{'arm':<35} {'core':<7} {'tree ms/req':>11} {'x lru-rust':>10}"
        f" {'pass ms (median/min)':>21} {'rank us':>8}"
    )
    for arm, r in results.items():
        rank = "-" if r["rank_us"] is None else f"{r['rank_us']:.2f}"
        print(
            f"{arm:<35} {r['tree_core']:<7} {r['tree_ms_per_request']:>11.3f}"
            f" {r.get('tree_vs_lru_rust', float('nan')):>10.2f}"
            f" {r['pass_ms_median']:>12.2f} / {r['pass_ms_min']:<6.2f} {rank:>8}"
        )
    print(f"uptime: {uptime.strip()}; wrote {args.out}")


if __name__ == "__main__":
    main()

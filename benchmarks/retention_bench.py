"""Does a retained agent conversation keep its prefix in SGLang's radix tree under pressure?

Replays the same deterministic workload into SGLang 0.5.23's own radix cache (``UnifiedRadixCache``
over CPU pools, fed as its scheduler feeds it; see ``tests/support/sglang_radix.py``) once per arm,
side by side in one run:

- ``plugin``: ``--radix-eviction-policy kvretain`` with the retention plugin loaded by SGLang's
  plugin loader, on SGLang's default Rust core (holds as pins); hinted turns carry the
  ``kv.retain`` envelope the worker sends (``[0, prompt)``, priority 50, 300 s: Anthropic's
  default 5-minute TTL); ``plugin-python`` the same on the Python core (holds rank nodes), where
  SGLang falls back to it;
- ``priority``: SGLang's ``priority`` policy alone, hinted turns carrying request priority 50 (the
  most a fleet gets from stock SGLang: no ranges, no expiry, no release);
- ``lru``: SGLang's default; ``lru-python`` the same on the Python TreeCore, to tell
  ``plugin-python``'s cost from its core's.

The workload: 16 agent conversations of 10 turns (two agent kinds, each with its own shared
system-and-tools prefix; every turn appends the previous answer and a tool result), one new
conversation per round so about ten run at once; between rounds (60 s of simulated time, so holds
of finished conversations expire) unhinted background requests drawn from a pool of prompts
with Zipf reuse. The cache holds about 96k tokens: the conversations and the background do not
all fit. Reported per arm: the *next turn's cached-prefix share* of retained conversations (tokens
SGLang matched on turn t+1 over the page-aligned prefix turn t computed: prompt and answer), its
share of the retained range alone, the background's hit rate, and CPU time per request (the
median of ``--repeats`` runs; the shares are deterministic).

    .venv/bin/python benchmarks/retention_bench.py [--out benchmarks/results/retention_radix.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.sglang_radix import RadixTree, TreeSpec, load_sglang, retain  # noqa: E402

PAGE = 16
TTL = 300
PRIORITY = 50
ROUND_SECONDS = 60.0


@dataclass
class Workload:
    """Token sequences for every request, fixed by the seed (the same for every arm)."""

    sessions: int = 16
    turns: int = 10
    background_per_round: int = 48
    background_pool: int = 1024
    seed: int = 7
    cache_tokens: int = 96 * 1024
    _next: int = field(default=1, repr=False)

    def fresh(self, n: int) -> list[int]:
        """``n`` token ids no other sequence has used."""
        out = list(range(self._next, self._next + n))
        self._next += n
        return out


@dataclass
class Turn:
    session: int
    index: int
    prompt: list[int]
    output: list[int]


def build_schedule(w: Workload) -> tuple[list[list[Any]], list[list[int]]]:
    """Rounds of ``("turn", Turn)`` / ``("bg", prompt)`` events, and the background pool."""
    rng = random.Random(w.seed)
    agents = [w.fresh(3000), w.fresh(2400)]  # e.g. Claude Code's and Codex's system + tools
    pool = [w.fresh(rng.randint(1024, 3072)) for _ in range(w.background_pool)]
    weights = [1.0 / (k + 1) ** 1.1 for k in range(w.background_pool)]
    conversations: list[list[Turn]] = []
    for s in range(w.sessions):
        context = agents[s % 2] + w.fresh(rng.randint(200, 600))  # the user's first message
        turns = []
        for t in range(w.turns):
            output = w.fresh(rng.randint(60, 200))  # the answer: text or a tool call
            turns.append(Turn(s, t, list(context), output))
            context = context + output + w.fresh(rng.randint(200, 900))  # + tool result
        conversations.append(turns)
    rounds: list[list[Any]] = []
    for r in range(w.sessions + w.turns - 1):
        events: list[Any] = [
            ("turn", conversations[s][r - s]) for s in range(w.sessions) if 0 <= r - s < w.turns
        ]
        events += [("bg", rng.choices(pool, weights)[0]) for _ in range(w.background_per_round)]
        rng.shuffle(events)
        rounds.append(events)
    return rounds, pool


ARMS = {
    # arm: (--radix-eviction-policy, TreeCore: None = SGLang's default for that policy)
    "plugin": ("kvretain", None),  # SGLang's default Rust core, holds as pins
    "plugin-python": ("kvretain", "python"),  # where SGLang falls back: holds rank nodes
    "priority": ("priority", None),
    "lru": ("lru", None),
    "lru-python": ("lru", "python"),  # the Python core's own cost, beside plugin-python
}


def tree_spec(w: Workload, *, policy: str, core: str) -> TreeSpec:
    """The unified radix tree both retention benchmarks run: ``w``'s cache, 4 requests of 16 Ki."""
    return TreeSpec(
        kind="unified",
        policy=policy,
        page_size=PAGE,
        tokens=w.cache_tokens,
        max_requests=4,
        context=16 * 1024,
        tree_core=core,
    )


def simulated_clock() -> list[float]:
    """Put the retention plugin on a simulated wall clock (``now[0]``), the one holds expire by."""
    from kvretention.retention import radix

    now = [1_000_000.0]
    radix.clock = lambda: now[0]
    return now


def write_report(out: Path, report: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def run_arm(arm: str, w: Workload, rounds: list[list[Any]]) -> dict[str, Any]:
    policy, core = ARMS[arm]
    tree = RadixTree(tree_spec(w, policy=policy, core=core))
    now = simulated_clock()
    last: dict[int, Turn] = {}
    shares, range_shares, bg_hit, bg_total, requests = [], [], 0, 0, 0
    cpu = time.process_time()
    for events in rounds:
        for kind, item in events:
            requests += 1
            if kind == "bg":
                bg_hit += tree.run(item)
                bg_total += len(item) // PAGE * PAGE
                continue
            turn: Turn = item
            hints = priority = None
            if policy == "kvretain":
                hints = retain(len(turn.prompt), priority=PRIORITY, duration=TTL)
            elif arm == "priority":
                priority = PRIORITY
            hit = tree.run(turn.prompt, output=turn.output, kv_hints=hints, priority=priority)
            before = last.get(turn.session)
            if before is not None:
                computed = (len(before.prompt) + len(before.output)) // PAGE * PAGE
                retained = len(before.prompt) // PAGE * PAGE
                shares.append(min(hit, computed) / computed)
                range_shares.append(min(hit, retained) / retained)
            last[turn.session] = turn
        now[0] += ROUND_SECONDS
    cpu = time.process_time() - cpu
    return {
        "arm": arm,
        "policy": policy,
        "tree_core": tree.cache._tree_core_backend,
        "next_turn_share_mean": statistics.fmean(shares),
        "next_turn_share_p10": sorted(shares)[len(shares) // 10],
        "next_turn_share_min": min(shares),
        "retained_range_share_mean": statistics.fmean(range_shares),
        "turns_measured": len(shares),
        "turns_at_95pct_or_more": sum(s >= 0.95 for s in shares) / len(shares),
        "background_hit_rate": bg_hit / bg_total,
        "requests": requests,
        "cpu_ms_per_request": 1000 * cpu / requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks/results/retention_radix.json"
    )
    parser.add_argument("--cache-tokens", type=int, default=96 * 1024)
    parser.add_argument("--repeats", type=int, default=3, help="CPU time is the median of these")
    args = parser.parse_args()
    load_sglang("kvretention")
    import logging

    logging.getLogger("sglang").setLevel(logging.WARNING)
    w = Workload(cache_tokens=args.cache_tokens)
    rounds, _ = build_schedule(w)  # one schedule, replayed by every arm
    results = []
    for arm in ARMS:
        runs = [run_arm(arm, w, rounds) for _ in range(args.repeats)]
        cpu = statistics.median(r["cpu_ms_per_request"] for r in runs)
        assert all(r["next_turn_share_mean"] == runs[0]["next_turn_share_mean"] for r in runs)
        results.append({**runs[0], "cpu_ms_per_request": cpu, "repeats": args.repeats})
    plugin = results[0]
    for r in results:
        r["share_vs_plugin"] = r["next_turn_share_mean"] / plugin["next_turn_share_mean"]
        r["cpu_vs_plugin"] = r["cpu_ms_per_request"] / plugin["cpu_ms_per_request"]
    report = {
        "benchmark": "retention_radix",
        "workload": {
            "sessions": w.sessions,
            "turns": w.turns,
            "background_per_round": w.background_per_round,
            "background_pool": w.background_pool,
            "cache_tokens": w.cache_tokens,
            "page_size": PAGE,
            "ttl_seconds": TTL,
            "round_seconds": ROUND_SECONDS,
            "seed": w.seed,
        },
        "python": platform.python_version(),
        "results": results,
    }
    write_report(args.out, report)
    print(
        f"{'arm':<10} {'policy':<9} {'core':<7} {'next-turn share':>16} {'p10':>6} {'>=95%':>6}"
        f" {'retained range':>15} {'background hit':>15} {'CPU ms/req':>11}"
    )
    for r in results:
        print(
            f"{r['arm']:<10} {r['policy']:<9} {r['tree_core']:<7}"
            f" {r['next_turn_share_mean']:>16.1%} {r['next_turn_share_p10']:>6.1%}"
            f" {r['turns_at_95pct_or_more']:>6.0%} {r['retained_range_share_mean']:>15.1%}"
            f" {r['background_hit_rate']:>15.1%} {r['cpu_ms_per_request']:>11.2f}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Placement from the engines' own KV events (``router --kv-residency``) vs today's, side by side.

W workers run SGLang's real engine on CPU with ``--kv-events`` (pools large enough that nothing is
evicted). Two router replicas per arm sit in front of all of them, as two router pods behind one
Service do: each turn of a session goes to the other replica, so a replica meets most turns of a
session without its pin. Arms: ``residency`` (both replicas with ``--kv-residency``) and
``baseline`` (without). Each arm's sessions belong to its own two tenants (salted: arms never share
radix paths on the shared workers). Sessions are agent-shaped and carry ``session_id`` in the body,
no ``x-session-id`` header and no prefix chain (a client that is not our frontend); every turn
repeats the previous prompt and adds tokens; the sessions' turns come in a new order each round.
The share is SGLang's own ``cached_tokens`` over the
turn's prompt tokens; ``ideal`` is what the turn repeats.

    .venv/bin/python benchmarks/residency_bench.py                     # 3 workers, 6 sessions x 6 turns
    .venv/bin/python benchmarks/residency_bench.py --workers 2 --turns 4
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from kvretention.common.tenancy import HEADER_TENANT  # noqa: E402
from support.cpu_engine import SERVED_NAME, start_cpu_worker  # noqa: E402
from support.processes import started_in_module  # noqa: E402

ARMS = {"baseline": [], "residency": ["--kv-residency"]}
TENANTS = ("acme", "globex")
SYSTEM_TOKENS = 256
"""A tenant's shared system prompt and tools."""
FIRST_TOKENS = 300
TURN_TOKENS = 120
VOCAB_TOP = 800
POLL_S = 0.5


def generate(router: str, ids: list[int], *, tenant: str, session: str) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of one request through ``router``."""
    body = {
        "request_id": uuid.uuid4().hex,
        "model": SERVED_NAME,
        "token_ids": ids,
        "session_id": session,
        "sampling": {"max_new_tokens": 1, "temperature": 0},
    }
    request = urllib.request.Request(
        router + "/v1/generate",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", HEADER_TENANT: tenant},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=600) as resp:
        lines = [json.loads(line) for line in resp.read().decode().splitlines() if line.strip()]
    usage = next(line["usage"] for line in reversed(lines) if line.get("usage"))
    return int(usage["prompt_tokens"]), int(usage.get("cached_tokens") or 0)


@contextmanager
def fleet(workers: int, *, pool: int, logs: Path) -> Iterator[dict[str, list[str]]]:
    """arm -> its two router replicas' URLs, all over the same ``workers`` CPU engines."""
    runner = started_in_module(logs)
    start = next(runner)
    try:
        urls = [
            start_cpu_worker(
                start,
                logs / f"w{i}",
                sglang_args=["--max-total-tokens", str(pool), "--context-length", "8192"],
                worker_args=["--kv-events"],
            ).base_url
            for i in range(workers)
        ]
        routes = [a for url in urls for a in ("--worker", url)]
        yield {
            arm: [
                start(["router", *routes, "--health-interval", str(POLL_S), *flags]).base_url
                for _ in range(2)
            ]
            for arm, flags in ARMS.items()
        }
    finally:
        next(runner, None)


def replay(routers: dict[str, list[str]], args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    system = {t: [rng.randrange(10, VOCAB_TOP) for _ in range(SYSTEM_TOKENS)] for t in TENANTS}
    prompts: dict[tuple[str, str, str], list[int]] = {}
    rows: list[dict[str, Any]] = []
    order = list(range(args.sessions))
    for turn in range(args.turns):
        # Agents' turns arrive in no fixed order: the replicas' load tie-breaks then disagree, as
        # they do under real traffic (a fixed order would have both replay the same choices).
        rng.shuffle(order)
        for s in order:
            tenant = TENANTS[s % len(TENANTS)]
            for arm, replicas in routers.items():
                key = (arm, tenant, f"agent-{s}")
                before = prompts.get(key, system[tenant])
                grown = [
                    rng.randrange(10, VOCAB_TOP)
                    for _ in range(FIRST_TOKENS if turn == 0 else TURN_TOKENS)
                ]
                ids = before + grown
                prompt, cached = generate(
                    replicas[turn % 2], ids, tenant=f"{tenant}-{arm}", session=key[2]
                )
                rows.append(
                    {
                        "arm": arm,
                        "tenant": tenant,
                        "session": key[2],
                        "turn": turn,
                        "prompt_tokens": prompt,
                        "ideal": round(len(before) / prompt, 3) if turn else 0.0,
                        "share": round(cached / prompt, 3),
                    }
                )
                prompts[key] = ids
        time.sleep(3 * POLL_S)  # the last turn's blocks reach every replica's next poll
    return rows


def placements(router: str) -> dict[str, float]:
    """How a router placed its requests: by pin, by residency, by prefix match (from /metrics)."""
    with urllib.request.urlopen(router + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    counted = {"sticky": 0.0, "resident": 0.0, "prefix": 0.0}
    for line in text.splitlines():
        for kind in counted:
            if line.startswith(f"kvretention_router_{kind}_placements_total "):
                counted[kind] += float(line.split()[1])
    return counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--pool", type=int, default=32000, help="KV pool tokens per worker")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/residency.json")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="kvr-residency-") as tmp,
        fleet(args.workers, pool=args.pool, logs=Path(tmp)) as routers,
    ):
        rows = replay(routers, args)
        decided = {
            arm: {
                k: sum(placements(url)[k] for url in urls) for k in ("sticky", "resident", "prefix")
            }
            for arm, urls in routers.items()
        }
    later = [r for r in rows if r["turn"] > 0]
    summary = {
        arm: {
            "median_share": round(
                statistics.median(r["share"] for r in later if r["arm"] == arm), 3
            ),
            "mean_share": round(statistics.fmean(r["share"] for r in later if r["arm"] == arm), 3),
            "median_ideal": statistics.median(r["ideal"] for r in later if r["arm"] == arm),
            "placed_by": decided[arm],
        }
        for arm in ARMS
    }
    per_turn = [
        {
            "turn": t,
            **{
                arm: round(
                    statistics.fmean(
                        r["share"] for r in rows if r["arm"] == arm and r["turn"] == t
                    ),
                    3,
                )
                for arm in ARMS
            },
            "ideal": round(
                statistics.fmean(
                    r["ideal"] for r in rows if r["arm"] == "residency" and r["turn"] == t
                ),
                3,
            ),
        }
        for t in range(args.turns)
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "summary": summary,
                "per_turn": per_turn,
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print("| turn | ideal | baseline | residency |")
    print("|---|---|---|---|")
    for row in per_turn:
        print(
            f"| {row['turn']} | {row['ideal']:.3f} | {row['baseline']:.3f} | {row['residency']:.3f} |"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

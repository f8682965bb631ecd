"""Replay agent sessions through a fleet on SGLang's real engine: what share of each turn's prompt
does SGLang report as cached, with retention and without, side by side in one run?

Two fleets (frontend -> router -> worker) on SGLang 0.5.23's real engine on CPU, serving the
project's tiny model (``kvretention tiny-model``) with the same small KV pool, differ in one flag:

- ``retain``: ``--radix-eviction-policy kvretain`` (the retention plugin, loaded by SGLang);
- ``lru``: SGLang's default eviction.

Each replays the same recorded sessions (``kvretention.replay.sessions``: Claude Code on
``/v1/messages`` with its block-level ``cache_control``; Codex on ``/v1/responses``, retained by the
fleet's ``--default-ttl-seconds`` policy since Codex sends no cache control) turn by turn, all
sessions interleaved, and between rounds unhinted background prompts (straight to the worker, as
token ids) that fill the pool ``--pressure`` times over (one replay per value). Per turn it reads the usage the client
gets, which carries SGLang's own ``cached_tokens``: Anthropic ``cache_read_input_tokens`` and
Responses ``input_tokens_details.cached_tokens``. The share is cached / prompt tokens; a turn's
ideal share is the previous turn's prompt over this one's (everything it repeats).

    .venv/bin/python benchmarks/replay_bench.py [--turns 8] [--pool 24000] [--pressure 0.6 1.5]
        [--out benchmarks/results/replay.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from kvretention.replay.plan import SESSIONS, plan_sessions, usage_of  # noqa: E402
from support.cpu_engine import SERVED_NAME, start_cpu_fleet  # noqa: E402
from support.processes import started_in_module  # noqa: E402

ARMS = {"retain": ["--radix-eviction-policy", "kvretain"], "lru": []}
FLEET_TTL = 1800
BACKGROUND_PROMPT = 2000
"""Tokens per background prompt."""
VOCAB_TOP = 800


@dataclass(frozen=True)
class Turn:
    arm: str
    session: str
    turn: int
    prompt_tokens: int
    cached_tokens: int
    seconds: float


def post_json(url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as resp:
            answer: dict[str, Any] = json.load(resp)
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"{url}: {exc.code} {exc.read().decode(errors='replace')}") from None
    return answer


def background(worker_url: str, rng: random.Random, tokens: int) -> None:
    """Unhinted prompts straight to the worker, ``tokens`` in all, none repeated."""
    for _ in range(max(1, tokens // BACKGROUND_PROMPT)):
        ids = [rng.randrange(10, VOCAB_TOP) for _ in range(BACKGROUND_PROMPT)]
        body = {
            "request_id": uuid.uuid4().hex,
            "model": SERVED_NAME,
            "token_ids": ids,
            "sampling": {"max_new_tokens": 1},
        }
        request = urllib.request.Request(
            worker_url + "/v1/generate", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=600) as resp:
            resp.read()


@contextmanager
def fleet(arm: str, *, pool: int, logs: Path) -> Iterator[tuple[str, str]]:
    """(frontend URL, worker URL) of a fleet whose worker runs the arm's eviction flags."""
    runner = started_in_module(logs / arm)
    start = next(runner)
    try:
        started = start_cpu_fleet(
            start,
            logs / arm,
            sglang_args=["--max-total-tokens", str(pool), "--context-length", "32768", *ARMS[arm]],
            frontend_args=["--default-ttl-seconds", str(FLEET_TTL)],
        )
        yield started.frontend.base_url, started.worker.base_url
    finally:
        next(runner, None)


def replay(arm: str, args: argparse.Namespace, logs: Path, pressure: float) -> list[Turn]:
    rng = random.Random(args.seed)
    plans = plan_sessions(SESSIONS, turns=args.turns, model=SERVED_NAME)
    turns: list[Turn] = []
    with fleet(arm, pool=args.pool, logs=logs) as (frontend, worker):
        for t in range(max(len(p) for p in plans)):
            for step in (p[t] for p in plans if t < len(p)):
                started = time.perf_counter()
                answer = post_json(frontend + step.path, step.body, step.headers)
                prompt, cached = usage_of(step.path, answer)
                turns.append(
                    Turn(
                        arm,
                        step.session,
                        t,
                        prompt,
                        cached,
                        round(time.perf_counter() - started, 3),
                    )
                )
            background(worker, rng, int(args.pool * pressure))
    return turns


def table(turns: list[Turn]) -> list[dict[str, Any]]:
    """One row per (session, turn): each arm's cached share beside the ideal."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    previous: dict[tuple[str, str], int] = {}
    for turn in turns:
        row = rows.setdefault(
            (turn.session, turn.turn), {"session": turn.session, "turn": turn.turn}
        )
        row["prompt_tokens"] = turn.prompt_tokens
        before = previous.get((turn.arm, turn.session))
        row["ideal"] = (
            round(min(before, turn.prompt_tokens) / turn.prompt_tokens, 3) if before else 0.0
        )
        row[turn.arm] = round(turn.cached_tokens / turn.prompt_tokens, 3)
        previous[(turn.arm, turn.session)] = turn.prompt_tokens
    return list(rows.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--pool", type=int, default=24000, help="KV pool tokens per worker")
    parser.add_argument(
        "--pressure",
        type=float,
        nargs="+",
        default=[0.6, 1.5],
        help="background tokens per round / pool (one replay of both arms per value)",
    )
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/replay.json")
    args = parser.parse_args()
    results = []
    for pressure in args.pressure:
        with tempfile.TemporaryDirectory(prefix="kvr-replay-") as tmp:
            turns = [t for arm in ARMS for t in replay(arm, args, Path(tmp), pressure)]
        rows = table(turns)
        later = [r for r in rows if r["turn"] > 0]
        summary: dict[str, Any] = {
            arm: {
                "median_share": statistics.median(r[arm] for r in later),
                "mean_share": round(statistics.fmean(r[arm] for r in later), 3),
            }
            for arm in ARMS
        }
        summary["ideal"] = {"median_share": statistics.median(r["ideal"] for r in later)}
        results.append({"pressure": pressure, "rows": rows, "summary": summary})
        print(f"pressure {pressure}: background {pressure:.1f}x the pool between rounds")
        print(f"{'session':<12} {'turn':>4} {'prompt':>7} {'ideal':>6} {'retain':>7} {'lru':>6}")
        for r in rows:
            print(
                f"{r['session']:<12} {r['turn']:>4} {r['prompt_tokens']:>7} {r['ideal']:>6.2f} "
                f"{r['retain']:>7.2f} {r['lru']:>6.2f}"
            )
        print(json.dumps(summary))
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

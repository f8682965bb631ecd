"""Does a conversation's next turn land on the worker that holds its prefix? Policies side by side.

Replays N concurrent agent-shaped conversations of T turns over W stand-in workers (real worker
and router processes; the GPU engine is the stand-in, which records each call), once per policy:

=====================  =====================================================================
``session-keys``       the router's sticky sessions: every turn carries the session key the
                       frontend extracts (``x-session-id``), least outstanding otherwise
``cache-aware``        no session key: the frontend's prefix chain (``x-kvr-prefix``) and the
                       router's per-worker prefix index with its load guard
``least-outstanding``  no session key, no prefix: today's default before cache-aware routing
``round-robin``        no router: turn ``k`` of all traffic goes to worker ``k mod W``
=====================  =====================================================================

Every conversation shares one system prompt and tool list (as Claude Code and Codex sessions do),
so a naive prefix match would pile everything onto one worker: the load guard must spread them.
Reported per policy: the share of turns 2..T served by the worker that served the conversation's
previous turn, and the max/min requests per worker.

    .venv/bin/python benchmarks/routing_bench.py                 # 16 x 10 over 4 workers
    .venv/bin/python benchmarks/routing_bench.py --quick         # 4 x 4 over 2 workers
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

import aiohttp

HERE: Final = Path(__file__).resolve().parent
REPO: Final = HERE.parent
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(REPO / "tests"))

from kvretention.dataplane.frontend.affinity import prefix_chain  # noqa: E402
from kvretention.dataplane.protocol import (  # noqa: E402
    GENERATE_PATH,
    HEADER_PREFIX,
    HEADER_SESSION,
    ChatMessage,
    PreprocessedRequest,
    SamplingParams,
    ToolCall,
    ToolDefinition,
)
from support.processes import start_kvretention  # noqa: E402

RESULTS: Final = HERE / "results" / "routing.json"
POLICIES: Final = ("session-keys", "cache-aware", "least-outstanding", "round-robin")
SYSTEM: Final = "You are a coding agent working in a repository. " * 40
TOOLS: Final = [
    ToolDefinition(
        name=name,
        description=f"The {name} tool.",
        parameters={"type": "object", "properties": {"arg": {"type": "string"}}},
    )
    for name in ("bash", "read", "edit", "grep", "glob", "write", "web_fetch", "todo")
]


def turn_messages(conversation: int, turns: int) -> list[ChatMessage]:
    """An agent loop: each turn a user or tool-result message after a tool-calling answer."""
    messages = [ChatMessage(role="system", content=SYSTEM)]
    for t in range(turns):
        if t == 0:
            messages.append(ChatMessage(role="user", content=f"Task {conversation}: fix the bug."))
            continue
        call = ToolCall(id=f"call_{conversation}_{t}", name="bash", arguments='{"arg": "ls"}')
        messages.append(ChatMessage(role="assistant", content="", tool_calls=[call]))
        messages.append(
            ChatMessage(
                role="tool", tool_call_id=call.id, content=f"file_{t}.py\n" * (20 + conversation)
            )
        )
    return messages


async def send(
    http: aiohttp.ClientSession, url: str, *, conversation: int, turn: int, policy: str
) -> str:
    """One turn; returns its request id (the workers' records say who served it)."""
    rid = uuid.uuid4().hex
    messages = turn_messages(conversation, turn + 1)
    request = PreprocessedRequest(
        request_id=rid,
        model="standin",
        messages=messages,
        tools=TOOLS,
        sampling=SamplingParams(max_new_tokens=4),
    )
    headers = {"content-type": "application/json"}
    if policy == "session-keys":
        headers[HEADER_SESSION] = f"conversation-{conversation}"
    if policy == "cache-aware":
        headers[HEADER_PREFIX] = ",".join(prefix_chain(messages, TOOLS))
    async with http.post(url + GENERATE_PATH, data=request.to_json_bytes(), headers=headers) as r:
        assert r.status == 200, await r.text()
        await r.read()
    return rid


async def replay(
    *, policy: str, router: str | None, workers: list[str], conversations: int, turns: int
) -> dict[int, list[str]]:
    """conversation -> request ids in turn order; the conversations run concurrently."""
    counter = 0
    out: dict[int, list[str]] = {c: [] for c in range(conversations)}
    async with aiohttp.ClientSession() as http:

        async def conversation(c: int) -> None:
            nonlocal counter
            for t in range(turns):
                if router is not None:
                    url = router
                else:  # round-robin over all traffic
                    url = workers[counter % len(workers)]
                    counter += 1
                out[c].append(await send(http, url, conversation=c, turn=t, policy=policy))

        await asyncio.gather(*(conversation(c) for c in range(conversations)))
    return out


def served_by(records: dict[str, Path]) -> dict[str, str]:
    """request id -> worker, from each worker's stand-in record."""
    where: dict[str, str] = {}
    for worker, path in records.items():
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("event") == "generate":
                where[entry["rid"]] = worker
    return where


def score(turns: dict[int, list[str]], where: dict[str, str], workers: list[str]) -> dict[str, Any]:
    same = total = 0
    for rids in turns.values():
        for prev, cur in itertools.pairwise(rids):
            total += 1
            same += where[prev] == where[cur]
    per_worker = Counter(where[rid] for rids in turns.values() for rid in rids)
    counts = sorted(per_worker.get(w, 0) for w in workers)
    return {
        "same_worker_share": round(same / total, 3) if total else None,
        "requests_per_worker": counts,
        "max_min_ratio": round(counts[-1] / counts[0], 2) if counts[0] else float("inf"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--delay", type=float, default=0.005, help="stand-in seconds per token")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.conversations, args.turns, args.workers = 4, 4, 2
    results: dict[str, Any] = {
        "conversations": args.conversations,
        "turns": args.turns,
        "workers": args.workers,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "policies": {},
    }
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        logs = Path(tmp)
        for policy in POLICIES:
            records = {}
            workers = []
            for i in range(args.workers):
                record = logs / f"{policy}-w{i}.jsonl"
                proc = start_kvretention(
                    ["worker", "--engine", "standin:versioned"],
                    log_dir=logs,
                    env={"KVR_STANDIN_RECORD": str(record), "KVR_STANDIN_DELAY_S": str(args.delay)},
                )
                stack.callback(proc.stop)
                workers.append(proc.base_url)
                records[proc.base_url] = record
            router_url = None
            if policy != "round-robin":
                router_policy = "cache-aware" if policy == "cache-aware" else "least-outstanding"
                worker_args = [a for url in workers for a in ("--worker", url)]
                router = start_kvretention(
                    ["router", *worker_args, "--policy", router_policy, "--health-interval", "0.2"],
                    log_dir=logs,
                    ready_path="/readyz",
                )
                stack.callback(router.stop)
                router_url = router.base_url
            started = time.perf_counter()
            turns = asyncio.run(
                replay(
                    policy=policy,
                    router=router_url,
                    workers=workers,
                    conversations=args.conversations,
                    turns=args.turns,
                )
            )
            result = score(turns, served_by(records), workers)
            result["seconds"] = round(time.perf_counter() - started, 2)
            results["policies"][policy] = result
            print(f"{policy:18} {json.dumps(result)}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("| policy | same worker as the previous turn | requests per worker | max/min |")
    print("|---|---:|---|---:|")
    for policy, r in results["policies"].items():
        print(
            f"| {policy} | {r['same_worker_share']:.0%} | {r['requests_per_worker']} "
            f"| {r['max_min_ratio']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

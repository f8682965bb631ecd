"""A small closed-loop HTTP load generator on aiohttp, plus the process CPU accounting around it.

``C`` concurrent clients each POST the same body back to back until ``requests`` answers arrived
or ``max_seconds`` passed (whichever first); requests still in flight ``LATE_GRACE_S`` after
that are cancelled and not counted. Every answer is read to the end; for streams the
time to the first body byte and the number of SSE events (``data:`` lines, ``[DONE]`` excluded)
or NDJSON lines are counted. It pins itself to one CPU (``--cpu``) so that on a small machine its
own work competes with the servers as little as possible, and reports its own CPU time so a reader
can see when the load generator, not the server, was the limit.

Run by ``request_path_bench.py`` as a subprocess (one per measurement, JSON on stdout), or alone:

    python benchmarks/loadgen.py --url http://127.0.0.1:18000/v1/chat/completions \\
        --concurrency 8 --requests 500 --stream
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CLK_TCK = os.sysconf("SC_CLK_TCK")
LATE_GRACE_S = 5.0


# --- process CPU accounting (used by the benchmark drivers; /proc, no psutil) ---------------------


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads), from ``/proc/<pid>/stat``; 0 if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0.0
    # Fields after the command name (which may contain spaces) start after the last ')'.
    fields = raw[raw.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (via each thread's ``children`` file)."""
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            kids += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return kids


def tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants (LiteLLM and launchers may fork workers)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo += children_of(current)
    return out


def tree_cpu_seconds(pid: int) -> float:
    return sum(proc_cpu_seconds(p) for p in tree_pids(pid))


def rss_bytes(pid: int) -> int:
    """Resident set size of one process from ``/proc/<pid>/status`` (VmRSS)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Set the CPU affinity of every thread of ``pid`` and its descendants."""
    for p in tree_pids(pid):
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{p}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                continue


# --- the load itself --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadSpec:
    url: str
    body: bytes
    concurrency: int
    requests: int
    max_seconds: float
    stream: bool
    headers: dict[str, str] = field(default_factory=dict)
    warmup: int = 0


@dataclass
class LoadResult:
    """What one run measured; latencies in milliseconds."""

    requests: int
    errors: int
    wall_s: float
    throughput_rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    ttfb_p50_ms: float
    chunks: int
    chunks_per_request: float
    loadgen_cpu_s: float
    first_error: str | None = None
    cancelled: int = 0


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def count_events(body: bytes) -> int:
    """SSE events (``data:`` lines other than ``[DONE]``), else NDJSON lines."""
    if body.startswith(b"data:") or b"\ndata:" in body:
        return body.count(b"data:") - body.count(b"data: [DONE]")
    return body.count(b"\n")


async def _one(
    session: aiohttp.ClientSession, spec: LoadSpec
) -> tuple[float, float, int, str | None]:
    started = time.perf_counter()
    ttfb = 0.0
    async with session.post(spec.url, data=spec.body, headers=spec.headers) as resp:
        if spec.stream:
            parts: list[bytes] = []
            async for piece in resp.content.iter_any():
                if not parts:
                    ttfb = time.perf_counter() - started
                parts.append(piece)
            body = b"".join(parts)
        else:
            body = await resp.read()
            ttfb = time.perf_counter() - started
        elapsed = time.perf_counter() - started
        if resp.status != 200:
            return elapsed, ttfb, 0, f"HTTP {resp.status}: {body[:300]!r}"
        if not body:
            return elapsed, ttfb, 0, "empty body"
        return elapsed, ttfb, count_events(body) if spec.stream else 1, None


async def run_load(spec: LoadSpec) -> LoadResult:
    """Closed loop: ``concurrency`` workers share one request budget and one deadline."""
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=max(30.0, spec.max_seconds))
    latencies: list[float] = []
    ttfbs: list[float] = []
    errors = 0
    chunks = 0
    first_error: str | None = None
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for _ in range(spec.warmup):
            await _one(session, spec)
        budget = spec.requests
        deadline = time.perf_counter() + spec.max_seconds

        async def worker() -> None:
            nonlocal budget, errors, chunks, first_error
            while budget > 0 and time.perf_counter() < deadline:
                budget -= 1
                try:
                    elapsed, ttfb, n, err = await _one(session, spec)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    elapsed, ttfb, n, err = 0.0, 0.0, 0, f"{type(exc).__name__}: {exc}"
                if err is not None:
                    errors += 1
                    first_error = first_error or err
                    continue
                latencies.append(elapsed)
                ttfbs.append(ttfb)
                chunks += n

        cpu0 = os.times()
        started = time.perf_counter()
        workers = [asyncio.ensure_future(worker()) for _ in range(spec.concurrency)]
        # Requests still in flight this long after the deadline are cancelled and not counted:
        # a slow peer cannot stretch a run past its bound.
        _, late = await asyncio.wait(workers, timeout=spec.max_seconds + LATE_GRACE_S)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        wall = time.perf_counter() - started
        cpu1 = os.times()
    latencies.sort()
    ttfbs.sort()
    done = len(latencies)
    return LoadResult(
        requests=done,
        errors=errors,
        wall_s=wall,
        throughput_rps=done / wall if wall > 0 else 0.0,
        p50_ms=_percentile(latencies, 0.50) * 1e3,
        p90_ms=_percentile(latencies, 0.90) * 1e3,
        p99_ms=_percentile(latencies, 0.99) * 1e3,
        mean_ms=(statistics.fmean(latencies) * 1e3) if latencies else float("nan"),
        ttfb_p50_ms=_percentile(ttfbs, 0.50) * 1e3,
        chunks=chunks,
        chunks_per_request=chunks / done if done else 0.0,
        loadgen_cpu_s=(cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
        first_error=first_error,
        cancelled=len(late),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="closed-loop HTTP POST load generator")
    parser.add_argument("--url", required=True)
    parser.add_argument("--body-file", help="request body (default: a small chat completion)")
    parser.add_argument("--header", action="append", default=[], help="NAME:VALUE")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--cpu", type=int, default=None, help="pin the load generator to this CPU")
    parser.add_argument("--nice", type=int, default=0, help="niceness increment for this process")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.nice:
        os.nice(args.nice)
    if args.body_file:
        body = Path(args.body_file).read_bytes()
    else:
        body = json.dumps(
            {
                "model": "stub-model",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": args.stream,
            }
        ).encode()
    headers = {"Content-Type": "application/json"}
    for item in args.header:
        name, _, value = item.partition(":")
        headers[name.strip()] = value.strip()
    spec = LoadSpec(
        url=args.url,
        body=body,
        concurrency=args.concurrency,
        requests=args.requests,
        max_seconds=args.max_seconds,
        stream=args.stream,
        headers=headers,
        warmup=args.warmup,
    )
    result = asyncio.run(run_load(spec))
    out: dict[str, Any] = asdict(result)
    out["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

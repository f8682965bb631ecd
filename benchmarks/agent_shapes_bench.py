"""Frontend + router CPU per request against ``json.loads`` of the same body, per body shape.

The request path's cost should follow the bytes that are new, whatever shape an agent sends. Each
row runs one body shape against our frontend -> router -> stub (``request_path_bench.py``'s
``frontend+router`` target), at one concurrency, streaming or not, and divides the CPU the two
proxy processes spent per request by the CPU ``json.loads`` spends on the same bodies, timed in
this process right after the run (so every ratio is taken side by side):

=====================  ======================================================================
``cc-turns``           Claude Code ``/v1/messages``, ~400 small ``tool_use`` / ``tool_result``
                       messages (~185 KB), one block-level ``cache_control`` (issue 32)
``claude-code``        the benchmarks' own Claude Code body (``agent_bodies.claude_code_body``)
``codex``              the Codex ``/v1/responses`` body
``chat-agent``         the Claude Code conversation as Chat Completions
=====================  ======================================================================

Each shape is sent ``identical`` (every client the same bytes, every request) or ``growing`` (each
client its own conversation, each request the last one plus one tool round; ``cc-turns``,
``codex growing`` and ``chat-agent growing``, whose conversations all open with the agent's own
instructions or system prompt, as every user's of one agent do), with and without Claude Code's ``x-claude-code-session-id`` header (``+session``); ``cc-turns
same task`` grows each client's own conversation from one shared task message (the same prompt
sent by several agents at once), each request with a new Claude Code billing header. Each client's
first request (a conversation's first body, decoded whole) is sent before the count starts; the
rows count the requests after it (at least ``--requests``, 3 per client).

    .venv/bin/python benchmarks/agent_shapes_bench.py             # the table, ~4 min on 2 cores
    .venv/bin/python benchmarks/agent_shapes_bench.py --quick     # fewer requests and rows
    .venv/bin/python benchmarks/agent_shapes_bench.py --compare B1.json,B2.json A1.json,A2.json

Servers share every CPU but the last; the clients run on the last one.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp

HERE: Final = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import request_path_bench as rpb  # noqa: E402
from agent_bodies import (  # noqa: E402
    TARGET_BYTES,
    chat_agent_body,
    claude_code_body,
    codex_body,
    session_turns,
    small_turns_body,
)
from kvretention.replay.sessions import claude_code_session, codex_session  # noqa: E402
from loadgen import tree_cpu_seconds  # noqa: E402

RESULTS: Final = HERE / "results" / "agent_shapes.json"
TURNS: Final = 200
"""Tool rounds of the ``cc-turns`` body: 401 messages, ~185 KB."""
SESSION_HEADER: Final = "x-claude-code-session-id"

BodyMaker = Callable[[int, int], bytes]
"""``(client, request) -> body``: the bytes client ``client`` sends as its ``request``-th."""


@dataclass(frozen=True)
class Shape:
    name: str
    path: str
    growing: bool
    session: bool
    same_task: bool = False
    """Growing conversations that all open with the same task message and diverge from their
    first tool round, each request with a new billing header (as Claude Code sends it)."""


@dataclass
class Row:
    shape: str
    concurrency: int
    stream: bool
    requests: int
    errors: int
    body_kb: float
    proxy_cpu_ms_per_req: float
    frontend_cpu_ms_per_req: float
    """The frontend's part of ``proxy_cpu_ms_per_req`` (the rest is the router's)."""
    json_loads_ms: float
    ratio: float
    p50_ms: float
    first_error: str | None
    floor_cpu_ms_per_req: float = float("nan")
    """Two bare Python hops (``bare_hop.py``) moving the same bodies, same run."""
    floor_ratio: float = float("nan")


def _fixed(body: dict[str, Any], *, stream: bool) -> dict[str, Any]:
    out = dict(body)
    out["model"] = rpb.MODEL
    out["stream"] = stream
    if "max_tokens" in out:
        out["max_tokens"] = 6
    out.pop("thinking", None)
    return out


def body_maker(shape: Shape, *, stream: bool, requests_per_client: int) -> BodyMaker:
    """The bodies a run sends (a fresh conversation tag per run, so no run resumes another's)."""
    tag = uuid.uuid4().hex[:12]
    if shape.name.startswith("cc-turns"):
        if not shape.growing:
            one = json.dumps(_fixed(small_turns_body(TURNS, tag=tag), stream=stream)).encode()
            return lambda client, i: one
        start = TURNS - requests_per_client

        def grow(client: int, i: int) -> bytes:
            if shape.same_task:
                body = small_turns_body(start + i, tag=tag, branch=str(client), billing=i)
            else:
                body = small_turns_body(start + i, tag=f"{tag}-{client}")
            return json.dumps(_fixed(body, stream=stream)).encode()

        return grow
    if shape.growing:  # codex / chat-agent: each client its own session of the agent
        make_session = codex_session if shape.name.startswith("codex") else claude_code_session
        turns = session_turns(make_session, TARGET_BYTES)
        sessions: dict[int, list[bytes]] = {}

        def session_turn(client: int, i: int) -> bytes:
            if client not in sessions:
                requests = make_session(turns=turns, marker=f"{tag}-{client}")
                bodies = [body for _, body in requests[-requests_per_client:]]
                if make_session is claude_code_session:
                    bodies = [chat_agent_body(body) for body in bodies]
                sessions[client] = [json.dumps(_fixed(b, stream=stream)).encode() for b in bodies]
            return sessions[client][i]

        return session_turn
    if shape.name.startswith("claude-code"):
        base = claude_code_body()
    elif shape.name.startswith("codex"):
        base = codex_body()
    else:
        base = chat_agent_body(claude_code_body())
    one = json.dumps(_fixed(base, stream=stream)).encode()
    return lambda client, i: one


def shapes(*, quick: bool) -> list[Shape]:
    out = [
        Shape("cc-turns", rpb.MESSAGES_PATH, growing=False, session=False),
        Shape("cc-turns+session", rpb.MESSAGES_PATH, growing=False, session=True),
        Shape("cc-turns growing", rpb.MESSAGES_PATH, growing=True, session=False),
        Shape("cc-turns growing+session", rpb.MESSAGES_PATH, growing=True, session=True),
        Shape("cc-turns same task", rpb.MESSAGES_PATH, growing=True, session=False, same_task=True),
    ]
    if not quick:
        out += [
            Shape("claude-code", rpb.MESSAGES_PATH, growing=False, session=False),
            Shape("codex", rpb.RESPONSES_PATH, growing=False, session=False),
            Shape("chat-agent", rpb.CHAT_PATH, growing=False, session=False),
            Shape("codex growing", rpb.RESPONSES_PATH, growing=True, session=False),
            Shape("chat-agent growing", rpb.CHAT_PATH, growing=True, session=False),
        ]
    return out


async def _drive(
    url: str,
    make: list[list[bytes]],
    *,
    headers: list[dict[str, str]],
    stream: bool,
) -> tuple[int, int, list[float], str | None]:
    ok = errors = 0
    latencies: list[float] = []
    first_error: str | None = None
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client(c: int) -> None:
            nonlocal ok, errors, first_error
            for body in make[c]:
                started = time.perf_counter()
                async with session.post(url, data=body, headers=headers[c]) as resp:
                    data = await resp.read()
                    if resp.status != 200:
                        errors += 1
                        first_error = first_error or f"{resp.status}: {data[:300]!r}"
                    else:
                        ok += 1
                latencies.append((time.perf_counter() - started) * 1e3)
                del data

        await asyncio.gather(*(client(c) for c in range(len(make))))
    return ok, errors, latencies, first_error


def _json_loads_ms(bodies: list[bytes]) -> float:
    """CPU ms per body of ``json.loads`` (the text decoded from bytes, as a server does)."""
    rounds = max(1, 60 // len(bodies))
    start = time.process_time()
    for _ in range(rounds):
        for body in bodies:
            json.loads(body)
    return (time.process_time() - start) / (rounds * len(bodies)) * 1e3


def run_row(
    target: rpb.Target,
    shape: Shape,
    *,
    concurrency: int,
    stream: bool,
    per_client: int,
    floor: rpb.Target | None = None,
) -> Row:
    maker = body_maker(shape, stream=stream, requests_per_client=per_client)
    bodies = [[maker(c, i) for i in range(per_client)] for c in range(concurrency)]
    base = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    headers = [
        {**base, SESSION_HEADER: f"sess-{uuid.uuid4()}"} if shape.session else dict(base)
        for _ in range(concurrency)
    ]
    if shape.session and not shape.growing:
        headers = [headers[0]] * concurrency  # one conversation, every client
    ok, errors, latencies, first_error, spent = _measure(
        target.base_url + shape.path, target.proxy_pids, bodies, headers=headers, stream=stream
    )
    proxy_ms = sum(spent)
    sample = [b for per in bodies for b in per[-3:]][:12]
    loads_ms = min(_json_loads_ms(sample) for _ in range(5))  # the least disturbed of 5
    served = max(1, ok + errors)
    per_req = proxy_ms / served
    frontend_ms = spent[0] / served
    floor_ms = float("nan")
    if floor is not None:
        f_ok, f_err, _, _, f_spent = _measure(
            floor.base_url + shape.path, floor.proxy_pids, bodies, headers=headers, stream=stream
        )
        floor_ms = sum(f_spent) / max(1, f_ok + f_err)
    return Row(
        shape=shape.name,
        concurrency=concurrency,
        stream=stream,
        requests=ok,
        errors=errors,
        body_kb=statistics.mean(len(b) for b in sample) / 1000,
        proxy_cpu_ms_per_req=per_req,
        frontend_cpu_ms_per_req=frontend_ms,
        json_loads_ms=loads_ms,
        ratio=per_req / loads_ms,
        p50_ms=statistics.median(latencies),
        first_error=first_error,
        floor_cpu_ms_per_req=floor_ms,
        floor_ratio=floor_ms / loads_ms,
    )


def _measure(
    url: str,
    pids: tuple[int, ...],
    bodies: list[list[bytes]],
    *,
    headers: list[dict[str, str]],
    stream: bool,
) -> tuple[int, int, list[float], str | None, list[float]]:
    """Send each client's bodies; CPU ms each of ``pids`` spent on all but the first body of each
    client (a conversation's first body is parsed whole: sent before the count starts)."""
    asyncio.run(_drive(url, [per[:1] for per in bodies], headers=headers, stream=stream))
    before = [tree_cpu_seconds(p) for p in pids]
    ok, errors, latencies, first_error = asyncio.run(
        _drive(url, [per[1:] for per in bodies], headers=headers, stream=stream)
    )
    spent = [(tree_cpu_seconds(p) - b) * 1e3 for p, b in zip(pids, before, strict=True)]
    return ok, errors, latencies, first_error, spent


TARGETS: Final = {"frontend+router": 2, rpb.PLACING: 1}
"""What is measured, and how many bare hops its floor has (as many as its Python HTTP hops)."""


def _start_floor(stub: Any, log_dir: Path, *, count: int = 2) -> rpb.Target:
    """``count`` bare hops in a row in front of the stub's Chat Completions path (the stub reads
    only ``stream`` and the token limit, so it answers every body); stopped with this process."""
    hops = []
    upstream = stub.base_url + rpb.CHAT_PATH
    for name in [f"bare-hop-{i}" for i in range(count, 0, -1)]:
        port = rpb.helpers.free_port()
        hop = rpb.start_external(
            [sys.executable, str(HERE / "bare_hop.py"), "--port", str(port), "--upstream", upstream],
            name=name, ready_url=f"http://127.0.0.1:{port}/health", log_dir=log_dir, env={},
        )  # fmt: skip
        atexit.register(hop.stop)
        hops.append(hop)
        upstream = hop.base_url + rpb.CHAT_PATH
    return rpb.Target("bare-hops", hops[-1].base_url, tuple(h.proc.pid for h in reversed(hops)))


def format_table(rows: list[Row]) -> str:
    head = (
        f"{'shape':<26} {'c':>3} {'stream':>6} {'KB':>6} {'req':>5} {'err':>4} "
        f"{'fe+rt cpu ms/req':>16} {'fe':>5} {'json.loads ms':>13} {'ratio':>6} {'p50 ms':>7} "
        f"{'bare hops':>11} {'ratio':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.shape:<26} {r.concurrency:>3} {('yes' if r.stream else 'no'):>6} "
            f"{r.body_kb:>6.0f} {r.requests:>5} {r.errors:>4} {r.proxy_cpu_ms_per_req:>16.2f} "
            f"{r.frontend_cpu_ms_per_req:>5.2f} "
            f"{r.json_loads_ms:>13.2f} {r.ratio:>6.2f} {r.p50_ms:>7.1f} "
            f"{r.floor_cpu_ms_per_req:>11.2f} {r.floor_ratio:>6.2f}"
        )
    return "\n".join(lines)


def compare(before: list[Path], after: list[Path]) -> str:
    """A markdown table of two trees' runs (each a list of this benchmark's result files, run
    alternated): per row, the median over runs of frontend+router CPU per request and of its
    ratio to ``json.loads``, and of two bare hops' ratio (every run of both trees)."""

    def rows(paths: list[Path]) -> dict[tuple[str, int, bool], list[dict[str, Any]]]:
        out: dict[tuple[str, int, bool], list[dict[str, Any]]] = {}
        for path in paths:
            for row in json.loads(path.read_text())["rows"]:
                out.setdefault((row["shape"], row["concurrency"], row["stream"]), []).append(row)
        return out

    old, new = rows(before), rows(after)

    def med(runs: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    lines = [
        "| shape | c | stream | KB | CPU ms/req before → after | x json.loads before → after "
        "| 2 bare hops x json.loads |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for key, runs in new.items():
        shape, concurrency, stream = key
        was = old.get(key, [])
        floor = [*was, *runs]
        lines.append(
            f"| {shape} | {concurrency} | {'yes' if stream else 'no'} "
            f"| {med(runs, 'body_kb'):.0f} "
            f"| {med(was, 'proxy_cpu_ms_per_req') if was else float('nan'):.2f} → "
            f"{med(runs, 'proxy_cpu_ms_per_req'):.2f} "
            f"| {med(was, 'ratio') if was else float('nan'):.1f} → **{med(runs, 'ratio'):.1f}** "
            f"| {med(floor, 'floor_ratio'):.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="cc-turns shapes only, c=1 and 4")
    parser.add_argument("--requests", type=int, default=60, help="requests per row (at least)")
    parser.add_argument("--concurrency", default=None, help="comma-separated (default 1,4,16)")
    parser.add_argument("--shapes", default=None, help="comma-separated subset of shape names")
    parser.add_argument("--stream", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--no-floor", action="store_true", help="skip the bare hops")
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="frontend+router",
        help="frontend -> router (two hops, beside two bare hops) or the frontend placing in its "
        "own process (one hop, beside one bare hop)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        help="print a markdown table of two trees' result files (comma-separated each)",
    )
    args = parser.parse_args(argv)
    if args.compare:
        before, after = ([Path(p) for p in arg.split(",")] for arg in args.compare)
        print(compare(before, after))
        return
    levels = (
        [int(c) for c in args.concurrency.split(",")]
        if args.concurrency
        else ([1, 4] if args.quick else [1, 4, 16])
    )
    chosen = shapes(quick=args.quick)
    if args.shapes:
        wanted = set(args.shapes.split(","))
        chosen = [s for s in shapes(quick=False) if s.name in wanted]
    streams = {"both": (False, True), "yes": (True,), "no": (False,)}[args.stream]
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus = set(cpus[:-1]) if len(cpus) >= 2 else None
    if server_cpus:
        os.sched_setaffinity(0, server_cpus)
    rows: list[Row] = []
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="kvr-shapes-") as tmp,
        rpb.start_stack(
            log_dir=Path(tmp), peers=False, only={args.target}, server_cpus=server_cpus
        ) as stack,
    ):
        if server_cpus:
            os.sched_setaffinity(0, {cpus[-1]})
        target = next(t for t in stack.targets if t.name == args.target)
        hops = TARGETS[args.target]
        floor = (
            None if args.no_floor else _start_floor(stack.processes["stub"], Path(tmp), count=hops)
        )
        for shape in chosen:
            for concurrency in levels:
                for stream in streams:
                    per_client = 1 + max(3, -(-args.requests // concurrency))
                    row = run_row(
                        target, shape, concurrency=concurrency, stream=stream,
                        per_client=per_client, floor=floor,
                    )  # fmt: skip
                    rows.append(row)
                    print(
                        f"[{time.monotonic() - started:5.0f}s] {row.shape:<26} c{concurrency:<3}"
                        f" {'stream' if stream else 'json  '} {row.proxy_cpu_ms_per_req:6.2f}"
                        f" ms/req = {row.ratio:5.2f}x json.loads  err {row.errors}",
                        file=sys.stderr,
                    )
    report = {
        "benchmark": "agent_shapes",
        "target": args.target,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": rpb.machine_info(),
        "elapsed_s": round(time.monotonic() - started, 1),
        "rows": [asdict(r) for r in rows],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(rows))
    print(f"\nwrote {args.out} ({report['elapsed_s']} s; {report['machine']['uptime']})")


if __name__ == "__main__":
    main()

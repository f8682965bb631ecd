"""The worker's own CPU per agent turn, outside the engine, before and after reusing the previous
turn's tokens; and a burst of agent bodies at one worker through frontend -> router -> worker.

**Per turn** (in-process, no engine): the last two requests of a ~200 KB agent session, exactly as
the frontend forwards them (``PreprocessedRequest`` bytes and the ``x-kvr-prefix`` chain), each
prepared by the worker's ``plan_call`` with a real chat template and fast tokenizer
(``tests/support/chat_tokenizer.py``, the one the data-plane tests serve). ``before``: turn N+1
with no render cache; ``after``: a fresh cache that served turn N, then turn N+1. Process CPU
time, medians over repeats, interleaved so all see the same machine noise. ``after`` is run three
times: with the chat template rendered by Jinja2 (``apply_chat_template``, as until minijinja); by
minijinja where it renders identically (``dataplane/compiled_template.py``) but every turn decoded
and converted whole (:func:`without_memo`, the worker before issue 21's worker round); and as the
worker is now (the body decoded reusing the previous turn's messages, ``dataplane/worker/wire.py``,
only new messages converted, the newest message's breakpoint derived from the prompt's rendering,
``dataplane/generation_block.py``). The stages are timed apart, before and now: decode and
validate the body, build the template input, render the template, encode (the cache: tokenize
only what is new), resolve breakpoints. Cases: Claude Code on ``/v1/messages`` (its two
block-level breakpoints), the same without ``cache_control`` (no breakpoints), Codex on
``/v1/responses``, and the Claude Code body for a worker with no chat template (the request-path
benchmark's ``full`` target).

**Burst** (``--burst``): four clients send a ~192 KB Claude Code body 15 times each through our
frontend -> router -> one worker (stand-in engine with the chat template), as in issue 21 (17 of
60 answered 503 before); prints the status counts and the worker's CPU per request.

    .venv/bin/python benchmarks/worker_turn_bench.py [--repeats 7] [--turns 300] [--burst]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(HERE))

from kvretention.dataplane import chat_template  # noqa: E402
from kvretention.dataplane.chat_template import render_template  # noqa: E402
from kvretention.dataplane.compiled_template import compiled_template_for  # noqa: E402
from kvretention.dataplane.frontend import app as frontend  # noqa: E402
from kvretention.dataplane.template_input import ConvertedMessages  # noqa: E402

try:  # the steps the request flow calls, in their own module since the frontend's split
    from kvretention.dataplane.frontend import prepare
except ImportError:  # an older tree: all in app
    prepare = frontend
from kvretention.dataplane.frontend.endpoints import MESSAGES, RESPONSES, GenerateEndpoint  # noqa: E402
from kvretention.dataplane.frontend.upstream import RouterClient  # noqa: E402
from kvretention.dataplane.gc_tuning import tune_gc  # noqa: E402
from kvretention.dataplane.protocol import HEADER_PREFIX  # noqa: E402
from kvretention.dataplane.worker import call  # noqa: E402
from kvretention.dataplane.worker import plan as worker  # noqa: E402
from kvretention.dataplane.worker.call import (  # noqa: E402
    build_engine_prompt,
    resolve_prompt_breakpoints,
)
from kvretention.dataplane.worker.dialect import Dialect  # noqa: E402
from kvretention.dataplane.worker.engine import LoadedEngine  # noqa: E402
from kvretention.dataplane.worker.render_cache import RenderCache  # noqa: E402
from kvretention.dataplane.worker.wire import ConversationMemo  # noqa: E402
from kvretention.replay.sessions import claude_code_session, codex_session  # noqa: E402
from support import chat_tokenizer  # noqa: E402
from support.processes import start_kvretention  # noqa: E402
from support.worker_client import post_messages  # noqa: E402

GOAL_MS = 2.0


@dataclass(frozen=True)
class Turns:
    """Turn N and turn N+1 of one session, as the router hands them to the worker."""

    name: str
    previous: tuple[bytes, dict[str, str]]
    current: tuple[bytes, dict[str, str]]
    client_bytes: int = 0
    """The client's own body for turn N+1 (what the frontend received)."""
    templated: bool = True


class _Manager:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer


class _Engine:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer_manager = _Manager(tokenizer)


def forwarded(
    api: GenerateEndpoint, body: dict[str, Any], rid: str
) -> tuple[bytes, dict[str, str]]:
    """What the frontend sends the router for ``body`` (the router passes it on unchanged)."""
    config = frontend.FrontendConfig(router_url="http://127.0.0.1:9")
    state = frontend.FrontendState(config=config, router=RouterClient(config.router_url, timeout=1))
    parsed = api.parse(body, hints=True, breakpoints=config.breakpoints)
    final = prepare.apply_hint_policy(
        frontend.normalize_clients(parsed, state=state, endpoint=api.endpoint), config=config
    )
    session = "session-0123456789"
    request = prepare.build_preprocessed(
        final, request_id=rid, session_id=session, tokenizer=None, model=final.model
    )
    headers = {
        k.lower(): v for k, v in prepare.router_headers(final, session, config=config).items()
    }
    return request.to_json_bytes(), headers


def build_cases(turns: int) -> list[Turns]:
    claude = claude_code_session(turns=turns)
    plain = claude_code_session(turns=turns, cache_control=False)
    codex = codex_session(turns=turns)
    cases = []
    for name, api, session in (
        ("claude-code", MESSAGES, claude),
        ("claude-code-no-breakpoints", MESSAGES, plain),
        ("codex", RESPONSES, codex),
    ):
        cases.append(
            Turns(
                name,
                forwarded(api, session[-2][1], "turn-n"),
                forwarded(api, session[-1][1], "turn-n+1"),
                client_bytes=len(json.dumps(session[-1][1]).encode()),
            )
        )
    cases.append(
        Turns(
            "claude-code-no-template",
            cases[0].previous,
            cases[0].current,
            client_bytes=cases[0].client_bytes,
            templated=False,
        )
    )
    return cases


@contextmanager
def without_memo() -> Iterator[None]:
    """The worker before it reused the previous turn's decoded and converted messages: the body
    decoded whole (``json.loads`` + pydantic), every message converted for the template, and a
    breakpoint's cut conversation always rendered (never derived from the prompt's rendering)."""
    decode, convert, same = (
        worker.decode_reusing,
        chat_template.build_template_input,
        chat_template.same_input,
    )

    def whole(*args: Any, **kwargs: Any) -> Any:
        return convert(*args, **{**kwargs, "converted": None})

    worker.decode_reusing = lambda *args, **kwargs: None  # type: ignore[assignment]
    chat_template.build_template_input = whole  # type: ignore[assignment]
    call.build_template_input = whole  # type: ignore[assignment]
    chat_template.same_input = lambda a, b: False  # type: ignore[assignment]
    try:
        yield
    finally:
        worker.decode_reusing = decode  # type: ignore[assignment]
        chat_template.build_template_input = convert  # type: ignore[assignment]
        call.build_template_input = convert  # type: ignore[assignment]
        chat_template.same_input = same  # type: ignore[assignment]


@contextmanager
def jinja2_only() -> Iterator[None]:
    """Render with ``apply_chat_template`` alone (the worker before minijinja)."""
    chat_template.compiled_template_for = lambda tokenizer: None
    try:
        yield
    finally:
        chat_template.compiled_template_for = compiled_template_for


def cpu_ms(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return (time.process_time() - start) * 1000


def measure(case: Turns, tokenizer: Any, *, repeats: int) -> dict[str, Any]:
    engine = LoadedEngine(
        engine=_Engine(tokenizer if case.templated else None),
        name="bench",
        dialect=Dialect.VERSIONED,
    )
    body, headers = case.current
    prev_body, prev_headers = case.previous

    def plan(cache: RenderCache | None, b: bytes = body, h: dict[str, str] = headers) -> Any:
        return worker.plan_call(b, headers=h, state_role="aggregated", engine=engine, cache=cache)

    def warmed() -> RenderCache | None:
        if not case.templated:
            return None
        cache = RenderCache(tokenizer, verify_every=0)
        plan(cache, prev_body, prev_headers)
        return cache

    before, after_jinja, after_minijinja, after = [], [], [], []
    stages: dict[str, list[float]] = {}
    planned = plan(None)
    markers = len(planned.breakpoints.resolved) if planned.breakpoints else 0
    chain = headers.get(HEADER_PREFIX, "").split(",")
    compiled = compiled_template_for(tokenizer) if case.templated else None

    def record_stages(suffix: str) -> None:
        """Time the cached turn's stages one by one (``suffix``: which tree's columns)."""
        cache = warmed()
        templated = tokenizer if case.templated else None
        timed = after_stages(body, templated, cache, chain=chain, markers=markers, headers=headers)
        for stage, ms in timed.items():
            stages.setdefault(f"{stage}{suffix}", []).append(ms)

    for _ in range(repeats):
        with without_memo():
            with jinja2_only():
                before.append(cpu_ms(lambda: plan(None)))
                cache = warmed()
                after_jinja.append(cpu_ms(lambda c=cache: plan(c)))
            cache = warmed()
            after_minijinja.append(cpu_ms(lambda c=cache: plan(c)))
            record_stages("_before")
        cache = warmed()
        after.append(cpu_ms(lambda c=cache: plan(c)))
        record_stages("")
    fresh = warmed()
    reused = plan(fresh).reused_tokens if fresh is not None else 0
    med = {k: round(statistics.median(v), 3) for k, v in stages.items() if v}
    return {
        "client_body_bytes": case.client_bytes,
        "body_bytes": len(body),
        "prompt_tokens": planned.prompt_tokens,
        "reused_tokens": reused,
        "breakpoints": len(planned.breakpoints.resolved) if planned.breakpoints else 0,
        "renderer": "minijinja" if compiled is not None else "jinja2",
        "before_ms": round(statistics.median(before), 3),
        "after_jinja2_ms": round(statistics.median(after_jinja), 3),
        "after_minijinja_ms": round(statistics.median(after_minijinja), 3),
        "after_ms": round(statistics.median(after), 3),
        "after_over_before": round(statistics.median(after) / statistics.median(before), 3),
        "minijinja_over_jinja2": round(
            statistics.median(after_minijinja) / statistics.median(after_jinja), 3
        ),
        "memo_over_minijinja": round(
            statistics.median(after) / statistics.median(after_minijinja), 3
        ),
        "after_stages_ms": med,
    }


def after_stages(
    body: bytes,
    tokenizer: Any,
    cache: RenderCache | None,
    *,
    chain: list[str],
    markers: int,
    headers: dict[str, str],
) -> dict[str, float]:
    """``plan_call``'s main steps one by one, on a cache that served the previous turn (its
    memo too, unless run under :func:`without_memo`)."""
    memo = ConversationMemo() if cache is not None else None
    start = time.process_time()
    decoded = worker.decode_reusing(body, headers=headers, cache=cache, memo=memo)
    if decoded is None:
        memo = None
        request, _ = worker.decode_whole(body)
    else:
        request, _ = decoded
    stages = {"decode_validate": (time.process_time() - start) * 1000}
    if tokenizer is None or cache is None:
        return stages
    converted = memo.converted if memo is not None else ConvertedMessages()
    start = time.process_time()
    template_input = chat_template.build_template_input(
        request.messages or [],
        tools=request.tools,
        tool_choice=request.tool_choice,
        reasoning=request.reasoning,
        developer_role=chat_template.template_has_developer_role(tokenizer.chat_template),
        converted=converted,
    )
    stages["template_input"] = (time.process_time() - start) * 1000
    with jinja2_only():
        start = time.process_time()
        render_template(tokenizer, template_input)
        stages["render_jinja2"] = (time.process_time() - start) * 1000
    start = time.process_time()
    text = render_template(tokenizer, template_input)
    stages["render"] = (time.process_time() - start) * 1000
    start = time.process_time()
    cache.encode(text, session=request.session_id, chain=chain)
    stages["encode"] = (time.process_time() - start) * 1000
    if markers:
        prompt = build_engine_prompt(
            request, tokenizer=tokenizer, cache=cache, chain=chain, memo=memo
        )
        start = time.process_time()
        resolve_prompt_breakpoints(request, prompt, tokenizer=tokenizer, expected=markers)
        stages["breakpoints"] = (time.process_time() - start) * 1000
    return stages


# ---------------------------------------------------------------- the burst


def burst(
    *, clients: int, requests: int, turns: int, router_path: Path | None = None
) -> dict[str, Any]:
    """frontend -> router -> one worker as processes; the status of every request.
    ``router_path``: an ``operator/`` tree to run the router from (a baseline revision)."""
    headers, body = claude_code_session(turns=turns)[-1]
    raw = json.dumps(body).encode()
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        tokenizer = chat_tokenizer.save(logs / "tokenizer")
        started = []
        try:
            w = start_kvretention(
                ["worker", "--engine", "standin:versioned", "--model-path", str(tokenizer)],
                log_dir=logs,
                timeout=90,
            )
            started.append(w)
            r = start_kvretention(
                ["router", "--worker", w.base_url],
                log_dir=logs,
                env={"PYTHONPATH": str(router_path)} if router_path is not None else None,
            )
            started.append(r)
            f = start_kvretention(
                [
                    *("frontend", "--router-url", r.base_url, "--model", "standin"),
                    *("--model-alias", f"{body['model']}=standin"),
                ],
                log_dir=logs,
            )
            started.append(f)

            def one(_: int) -> int:
                return post_messages(f.port, headers, raw, timeout=600)[0]

            cpu_before = _cpu_s(w.proc.pid)
            wall = time.monotonic()
            with ThreadPoolExecutor(clients) as pool:
                statuses = list(pool.map(one, range(clients * requests)))
            wall = time.monotonic() - wall
            worker_cpu_ms = (_cpu_s(w.proc.pid) - cpu_before) * 1000 / len(statuses)
        finally:
            for p in reversed(started):
                p.stop()
    return {
        "body_bytes": len(raw),
        "clients": clients,
        "requests": len(statuses),
        "statuses": dict(Counter(statuses)),
        "wall_s": round(wall, 1),
        "worker_cpu_ms_per_request": round(worker_cpu_ms, 1),
    }


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--turns", type=int, default=300, help="session length (~200 KB at 300)")
    parser.add_argument("--burst", action="store_true", help="also run the burst (processes)")
    parser.add_argument(
        "--burst-baseline",
        default=None,
        metavar="REV",
        help="also run the burst with the router of this git revision, before ours",
    )
    parser.add_argument("--out", default=str(HERE / "results" / "worker_turn.json"))
    args = parser.parse_args(argv)
    tokenizer = chat_tokenizer.build_tokenizer()
    started = time.monotonic()
    cases = build_cases(args.turns)
    tune_gc()  # as the worker does once loaded (``worker/cli.py``)
    results = {c.name: measure(c, tokenizer, repeats=args.repeats) for c in cases}
    report: dict[str, Any] = {
        "benchmark": "worker_turn",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "repeats": args.repeats,
        "turns": args.turns,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "results": results,
    }
    if args.burst_baseline:
        with tempfile.TemporaryDirectory() as tree:
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", args.burst_baseline, "operator"],
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
            report["burst_baseline"] = {
                "revision": args.burst_baseline,
                **burst(clients=4, requests=15, turns=280, router_path=Path(tree) / "operator"),
            }
    if args.burst or args.burst_baseline:
        report["burst"] = burst(clients=4, requests=15, turns=280)
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    report["uptime_after"] = subprocess.run(
        ["uptime"], capture_output=True, text=True, check=False
    ).stdout.strip()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(report))
    return 0


def format_table(report: dict[str, Any]) -> str:
    lines = [
        "| case | client body | to the worker | prompt tokens | reused | breakpoints "
        "| no cache ms | cache + Jinja2 ms | cache + minijinja ms (before) | + memo ms (after) "
        "| after / before | decode+validate | template input | render minijinja | encode "
        "| breakpoints ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def pair(s: dict[str, float], stage: str) -> str:
        if stage not in s:
            return ""
        return f"{s.get(stage + '_before', 0):.1f} → {s[stage]:.1f}"

    for name, r in report["results"].items():
        s = r["after_stages_ms"]
        lines.append(
            f"| {name} | {r['client_body_bytes'] / 1000:.0f} KB | {r['body_bytes'] / 1000:.0f} KB "
            f"| {r['prompt_tokens']} | {r['reused_tokens']} | {r['breakpoints']} "
            f"| {r['before_ms']:.1f} | {r['after_jinja2_ms']:.1f} "
            f"| {r['after_minijinja_ms']:.1f} | **{r['after_ms']:.1f}** "
            f"| **{r['memo_over_minijinja']:.2f}** "
            f"| {pair(s, 'decode_validate')} | {pair(s, 'template_input')} "
            f"| {s.get('render', 0):.1f} | {s.get('encode', 0):.1f} "
            f"| {pair(s, 'breakpoints')} |"
        )
    for key in ("burst_baseline", "burst"):
        if key in report:
            b = report[key]
            router = f"router of {b['revision']}" if "revision" in b else "this router"
            lines += [
                "",
                f"burst ({router}): {b['requests']} requests of {b['body_bytes'] / 1000:.0f} KB "
                f"from {b['clients']} clients, statuses {b['statuses']}, {b['wall_s']} s, worker "
                f"CPU {b['worker_cpu_ms_per_request']} ms/request",
            ]
    lines.append(f"\n{report['elapsed_s']} s; {report['uptime_after']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

"""Normalization cost vs JSON parse cost of the same body, per request; and the frontend's whole
per-request parse on the same body.

For typical small and large (~200 KB) OpenAI Chat Completions / Responses and Anthropic Messages
bodies, and for agent-shaped ~200 KB bodies (a Codex Responses request and a Claude Code Messages
request with tools, tool calls and results, reasoning / thinking history and Claude Code's
block-level breakpoints; ``agent_bodies.py``), times side by side in the same run (process CPU
time, medians over repeats, every step's samples interleaved):

- ``json.loads(body)``, the parse every server pays;
- the hint normalizer the frontend runs (``hints_from_*``, ``prefix`` breakpoint mode, the
  default), and the v1 ``normalize_*`` (``--breakpoints reject``) where it accepts the body;
- the frontend's per-request work on the same body, stage by stage, with the functions
  ``dataplane/frontend/app.py`` calls: body to JSON (UTF-8 decode, ``json.loads``, the surrogate
  scan), the provider's ``parse_*`` into the neutral conversation (which runs the normalizer),
  the client normalisation and hint policy, ``PreprocessedRequest``, the prefix chain header and
  the router request's serialization. The three steps that remember earlier requests (the parse,
  the chain, the serialization) are timed on fresh state: for the agent bodies as the session's
  next turn (the turn before served first, untimed), and as its first turn
  (``first_turn_stages_us``); for the others as a first request.

Target: normalization under 20% of parse time.

    .venv/bin/python benchmarks/normalize_bench.py [--repeats 7] [--out benchmarks/results/normalize.json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_bodies import (
    chat_agent_body,
    claude_code_turns,
    codex_turns,
    with_responses_hints,
)
from kvretention.dataplane.frontend import app as frontend

try:  # the steps the request flow calls, in their own modules since the frontend's split
    from kvretention.dataplane.frontend import body as frontend_body
    from kvretention.dataplane.frontend import prepare
except ImportError:  # an older tree: all in app
    frontend_body = prepare = frontend
from kvretention.dataplane.frontend import upstream
from kvretention.dataplane.frontend.endpoints import (
    CHAT,
    MESSAGES,
    RESPONSES,
    GenerateEndpoint,
)
from kvretention.dataplane.frontend.upstream import RouterClient
from kvretention.dataplane.gc_tuning import tune_gc
from kvretention.dataplane.protocol import PreprocessedRequest
from kvretention.hints import (
    ClientError,
    hints_from_chat_completions,
    hints_from_messages,
    hints_from_responses,
    normalize_chat_completions,
    normalize_messages,
    normalize_responses,
)

TARGET_PERCENT = 20.0
Normalizer = Callable[[Mapping[str, Any]], object]


@dataclass(frozen=True)
class Api:
    endpoint: GenerateEndpoint
    hints: Callable[..., Any]
    """The v2 normalizer (``hints_from_*``), called as the frontend does (``prefix`` mode)."""
    v1: Normalizer
    """The v1 normalizer (``reject`` mode)."""


CHAT_API = Api(CHAT, hints_from_chat_completions, normalize_chat_completions)
RESPONSES_API = Api(RESPONSES, hints_from_responses, normalize_responses)
MESSAGES_API = Api(MESSAGES, hints_from_messages, normalize_messages)


def _text(n: int, seed: int) -> str:
    words = ["retain", "prompt", "cache", "kv", "hint", "tokens", "mooncake", "sglang", "page"]
    out: list[str] = []
    size = 0
    i = seed
    while size < n:
        word = words[i % len(words)]
        out.append(word)
        size += len(word) + 1
        i += 7
    return " ".join(out)


def chat_body(*, turns: int, chars: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": _text(chars, 0)}]
    for t in range(turns):
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": _text(chars, t)},
                    {"type": "text", "text": _text(chars // 4, t + 1)},
                ],
            }
        )
        messages.append({"role": "assistant", "content": _text(chars, t + 2)})
    return {
        "model": "m",
        "messages": messages,
        "max_completion_tokens": 256,
        "temperature": 0.2,
        "stream": True,
        "prompt_cache_key": "tenant-a",
        "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    }


def responses_body(*, turns: int, chars: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for t in range(turns):
        items.append(
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": _text(chars, t)}],
            }
        )
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": _text(chars, t + 3)}],
            }
        )
    return {
        "model": "m",
        "instructions": _text(chars, 5),
        "input": items,
        "max_output_tokens": 256,
        "stream": True,
        "prompt_cache_options": {"ttl": "30m"},
    }


def messages_body(*, turns: int, chars: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for t in range(turns):
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": _text(chars, t)},
                    {
                        "type": "tool_result",
                        "tool_use_id": f"t{t}",
                        "content": [{"type": "text", "text": _text(chars // 4, t)}],
                    },
                ],
            }
        )
        messages.append(
            {"role": "assistant", "content": [{"type": "text", "text": _text(chars, t)}]}
        )
    return {
        "model": "claude",
        "max_tokens": 256,
        "system": [{"type": "text", "text": _text(chars, 9)}],
        "tools": [
            {"name": f"tool{i}", "description": "d", "input_schema": {"type": "object"}}
            for i in range(8)
        ],
        "messages": messages,
        "stream": True,
        "cache_control": {"type": "ephemeral", "ttl": "1h"},
    }


@dataclass(frozen=True)
class Case:
    name: str
    api: Api
    body: dict[str, Any]
    hinted: bool = True
    """Whether the body carries a retention control (Codex as it sends itself does not)."""
    agent: bool = False
    headers: Mapping[str, str] | None = None
    previous: dict[str, Any] | None = None
    """The session's request before ``body`` (agent cases): the frontend served it first, so
    the steps are timed as a session's next turn."""


def build_cases() -> list[Case]:
    codex_before, codex = codex_turns()
    claude_before, claude_code = claude_code_turns()
    return [
        Case("chat/small", CHAT_API, chat_body(turns=2, chars=200)),
        Case("chat/large", CHAT_API, chat_body(turns=40, chars=2000)),
        Case("chat/large_many_parts", CHAT_API, chat_body(turns=800, chars=100)),
        Case("responses/small", RESPONSES_API, responses_body(turns=2, chars=200)),
        Case("responses/large", RESPONSES_API, responses_body(turns=45, chars=2200)),
        Case("messages/small", MESSAGES_API, messages_body(turns=2, chars=200)),
        Case("messages/large", MESSAGES_API, messages_body(turns=40, chars=2200)),
        Case("messages/large_many_blocks", MESSAGES_API, messages_body(turns=700, chars=100)),
        Case(
            "agent/codex (as sent)",
            RESPONSES_API,
            codex,
            hinted=False,
            agent=True,
            previous=codex_before,
        ),
        Case(
            "agent/codex + cache options",
            RESPONSES_API,
            with_responses_hints(codex),
            agent=True,
            previous=with_responses_hints(codex_before),
        ),
        Case("agent/claude_code", MESSAGES_API, claude_code, agent=True, previous=claude_before),
        Case(
            "agent/chat",
            CHAT_API,
            chat_agent_body(claude_code),
            hinted=False,
            agent=True,
            previous=chat_agent_body(claude_before),
        ),
    ]


def _per_call_ns(fn: Callable[[], object], *, budget_s: float = 0.05) -> float:
    """Median-ready sample: the mean CPU ns per call over a loop sized to take about ``budget_s``.

    Process CPU time, not wall time: on a shared machine the time this process spends preempted
    by others' work would otherwise land on whichever step happened to be running."""
    loops = 1
    while True:
        start = time.process_time_ns()
        for _ in range(loops):
            fn()
        elapsed = time.process_time_ns() - start
        if elapsed >= budget_s * 1e9 or loops >= 1 << 20:
            return elapsed / loops
        loops *= 2


def _v1_accepts(api: Api, body: Mapping[str, Any]) -> bool:
    try:
        api.v1(body)
    except ClientError:
        return False  # v1 refuses block-level breakpoints: nothing to time
    return True


def frontend_stages(case: Case) -> dict[str, Callable[[], object]]:
    """The frontend's per-request steps for ``case``'s body, each on the previous one's output,
    with the functions the request flow in ``dataplane/frontend/app.py`` calls (no tokenizer, as
    the request-path benchmark's frontend; the router connection is never opened)."""
    raw = json.dumps(case.body).encode()
    config = frontend.FrontendConfig(router_url="http://127.0.0.1:9")
    state = frontend.FrontendState(config=config, router=RouterClient(config.router_url, timeout=1))
    api = case.api.endpoint
    session = "session-0123456789"

    def read() -> object:  # what the frontend does with the bytes once they arrived
        return frontend_body.decode_json_body(raw)

    body = json.loads(raw)
    parsed = api.parse(body, hints=True, breakpoints=config.breakpoints)

    def policy() -> object:
        p = frontend.normalize_clients(parsed, state=state, endpoint=api.endpoint)
        if HINT_POLICY is not None:  # the policy and the metric's TTL from one find_markers
            return HINT_POLICY(p, config=config)
        p = prepare.apply_hint_policy(p, config=config)
        return prepare.longest_ttl(p)

    final = prepare.apply_hint_policy(
        frontend.normalize_clients(parsed, state=state, endpoint=api.endpoint), config=config
    )

    def preprocess() -> object:
        return prepare.build_preprocessed(
            final, request_id="r" * 32, session_id=session, tokenizer=None, model=final.model
        )

    upstream = preprocess()
    assert isinstance(upstream, PreprocessedRequest)
    return {
        "body_to_json": read,
        "parse_conversation": lambda: api.parse(body, hints=True, breakpoints=config.breakpoints),
        "client_and_hint_policy": policy,
        "preprocessed_request": preprocess,
        "prefix_chain_header": lambda: prepare.router_headers(final, session, config=config),
        "serialize_for_router": upstream.to_json_bytes,
    }


HINT_POLICY = getattr(prepare, "hint_policy", None)
"""What the tree under test's request flow calls (older trees: ``apply_hint_policy`` then
``longest_ttl``, two walks for markers)."""
RESUMES: bool = "resumer" in inspect.signature(MESSAGES.parse).parameters
"""Whether the tree under test parses a session's next body from the last one's (issue 21)."""
DECODES_ITEMWISE: bool = "resumer" in inspect.signature(frontend_body.decode_json_body).parameters
"""Whether the tree under test decodes a session's next body only past its last one's items."""
ROUTER_BODY: Callable[[PreprocessedRequest], bytes] | None = getattr(upstream, "router_body", None)
"""What the tree under test sends the router (older trees: ``to_json_bytes``)."""
NEXT_TURN_SAMPLES = 25
NEXT_TURN_STAGES = (
    "body_to_json",
    "parse_conversation",
    "prefix_chain_header",
    "serialize_for_router",
)


def _serve(
    api: GenerateEndpoint, state: frontend.FrontendState, raw: bytes
) -> tuple[int, int, int, int]:
    """One request through the frontend's steps; CPU ns of the decode, the parse, the chain, the
    serialization."""
    clock, config = time.process_time_ns, state.config
    extra: dict[str, Any] = {"resumer": state.resumer} if RESUMES else {}
    t_read = clock()
    if DECODES_ITEMWISE:
        body = frontend_body.decode_json_body(raw, resumer=state.resumer)  # type: ignore[call-arg]
    else:
        body = frontend_body.decode_json_body(raw)
    t0 = clock()
    parsed = api.parse(body, hints=True, breakpoints=config.breakpoints, **extra)
    t1 = clock()
    final = prepare.apply_hint_policy(
        frontend.normalize_clients(parsed, state=state, endpoint=api.endpoint), config=config
    )
    upstream = prepare.build_preprocessed(
        final, request_id="r" * 32, session_id="s", tokenizer=None, model=final.model
    )
    t2 = clock()
    prepare.router_headers(final, "s", config=config)
    t3 = clock()
    ROUTER_BODY(upstream) if ROUTER_BODY is not None else upstream.to_json_bytes()
    t4 = clock()
    return t0 - t_read, t1 - t0, t3 - t2, t4 - t3


def served_us(case: Case, *, previous: dict[str, Any] | None) -> dict[str, float]:
    """The steps that remember earlier requests, timed on fresh state: each sample starts a new
    frontend state, serves ``previous`` through every step when given (untimed: the session's
    turn before), then times each step on ``case.body`` once. Mean of the samples, in µs. With no
    ``previous`` this is a session's first request. A tree without the memory (``RESUMES``
    false) parses every body whole either way."""
    api = case.api.endpoint
    totals = dict.fromkeys(NEXT_TURN_STAGES, 0)
    previous_raw = None if previous is None else json.dumps(previous).encode()
    raw = json.dumps(case.body).encode()
    for _ in range(NEXT_TURN_SAMPLES):
        config = frontend.FrontendConfig(router_url="http://127.0.0.1:9")
        state = frontend.FrontendState(
            config=config, router=RouterClient(config.router_url, timeout=1)
        )
        if previous_raw is not None:
            _serve(api, state, previous_raw)
        times = _serve(api, state, raw)
        for stage, ns in zip(NEXT_TURN_STAGES, times, strict=True):
            totals[stage] += ns
    return {k: v / NEXT_TURN_SAMPLES / 1e3 for k, v in totals.items()}


def measure(case: Case, *, repeats: int) -> dict[str, Any]:
    raw = json.dumps(case.body).encode()
    parsed = json.loads(raw)
    hints = case.api.hints(parsed, breakpoints="prefix")
    assert (hints.envelope is not None) == case.hinted, f"{case.name}: unexpected hint {hints}"
    v1 = _v1_accepts(case.api, parsed)
    stages = frontend_stages(case)
    fns: dict[str, Callable[[], object]] = {
        "json_loads": lambda: json.loads(raw),
        "normalize": lambda: case.api.hints(parsed, breakpoints="prefix"),
        **({"normalize_v1": lambda: case.api.v1(parsed)} if v1 else {}),
        **{f"frontend.{k}": fn for k, fn in stages.items()},
    }
    for stage in NEXT_TURN_STAGES:  # timed on fresh state below (they remember requests)
        del fns[f"frontend.{stage}"]
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):  # interleaved so every step sees the same machine noise
        for key, fn in fns.items():
            samples[key].append(_per_call_ns(fn))
        for stage, value in served_us(case, previous=case.previous).items():
            samples.setdefault(f"frontend.{stage}", []).append(value * 1e3)
        if case.previous is not None:
            for stage, value in served_us(case, previous=None).items():
                samples.setdefault(f"first_turn.{stage}", []).append(value * 1e3)
    us = {k: statistics.median(v) / 1e3 for k, v in samples.items()}
    order = ["body_to_json", "parse_conversation", "client_and_hint_policy"]
    order += ["preprocessed_request", "prefix_chain_header", "serialize_for_router"]
    stage_us = {k: round(us[f"frontend.{k}"], 3) for k in order}
    first_turn = {
        k.removeprefix("first_turn."): round(v, 3) for k, v in us.items() if "first_turn." in k
    }
    total = sum(stage_us.values())
    parse = us["json_loads"]
    return {
        "body_bytes": len(raw),
        "hinted": case.hinted,
        "agent": case.agent,
        "parse_us": round(parse, 3),
        "normalize_us": round(us["normalize"], 3),
        "normalize_percent_of_parse": round(100 * us["normalize"] / parse, 2),
        "normalize_v1_us": round(us["normalize_v1"], 3) if v1 else None,
        "frontend_stages_us": stage_us,
        "next_turn": case.previous is not None,
        "resumes": RESUMES,
        "first_turn_stages_us": first_turn,
        "frontend_total_us": round(total, 3),
        "conversation_over_json_loads": round(stage_us["parse_conversation"] / parse, 2),
        "normalize_percent_of_frontend": round(100 * us["normalize"] / total, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="benchmarks/results/normalize.json")
    parser.add_argument("--only", default=None, help="comma-separated case-name prefixes")
    args = parser.parse_args(argv)
    tune_gc()  # the frontend process's collector settings: a collection is not a step's cost
    cases = build_cases()
    if args.only:
        cases = [c for c in cases if c.name.startswith(tuple(args.only.split(",")))]
    started = time.monotonic()
    results = {case.name: measure(case, repeats=args.repeats) for case in cases}
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout
    report = {
        "benchmark": "normalize",
        "target_percent": TARGET_PERCENT,
        "repeats": args.repeats,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "uptime_after": uptime.strip(),
        "cpus": os.cpu_count(),
        "elapsed_s": round(time.monotonic() - started, 1),
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(format_tables(results))
    worst = max(r["normalize_percent_of_parse"] for r in results.values())
    print(f"\nworst case {worst:.1f}% of parse time (target < {TARGET_PERCENT:g}%); wrote {out}")
    print(f"{report['elapsed_s']} s; uptime: {report['uptime_after']}")
    return 0 if worst < TARGET_PERCENT else 1


def format_tables(results: Mapping[str, Mapping[str, Any]]) -> str:
    lines = [
        "| case | body | json.loads | normalize | normalize/parse | v1 normalize |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        v1 = "refused" if r["normalize_v1_us"] is None else f"{r['normalize_v1_us']:.2f} µs"
        lines.append(
            f"| {name} | {r['body_bytes'] / 1024:.1f} KiB | {r['parse_us']:.1f} µs "
            f"| {r['normalize_us']:.2f} µs | {r['normalize_percent_of_parse']:.1f}% | {v1} |"
        )
    stages = next(iter(results.values()))["frontend_stages_us"]
    lines += [
        "",
        "| case | json.loads | " + " | ".join(stages) + " | frontend total | "
        "parse_*/json.loads | normalize/total |",
        "|---|" + "---:|" * (len(stages) + 4),
    ]
    for name, r in results.items():
        s = r["frontend_stages_us"]
        lines.append(
            f"| {name} | {r['parse_us']:.0f} µs | "
            + " | ".join(f"{s[k]:.0f} µs" for k in stages)
            + f" | {r['frontend_total_us']:.0f} µs | {r['conversation_over_json_loads']:.1f}x "
            f"| {r['normalize_percent_of_frontend']:.1f}% |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

"""Normalization cost vs JSON parse cost of the same body, per request.

For typical small and large (~200 KB) OpenAI Chat Completions / Responses and Anthropic Messages
bodies, times ``json.loads(body)`` and the provider normalizer on the parsed body side by side in
the same run (medians over repeats), and reports normalization as a percentage of parse time.
Target: under 20%.

    .venv/bin/python benchmarks/normalize_bench.py [--repeats 7] [--out benchmarks/results/normalize.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvretention.hints import normalize_chat_completions, normalize_messages, normalize_responses

TARGET_PERCENT = 20.0
Normalizer = Callable[[Mapping[str, Any]], object]


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


CASES: list[tuple[str, Normalizer, dict[str, Any]]] = [
    ("chat/small", normalize_chat_completions, chat_body(turns=2, chars=200)),
    ("chat/large", normalize_chat_completions, chat_body(turns=40, chars=2000)),
    ("chat/large_many_parts", normalize_chat_completions, chat_body(turns=800, chars=100)),
    ("responses/small", normalize_responses, responses_body(turns=2, chars=200)),
    ("responses/large", normalize_responses, responses_body(turns=45, chars=2200)),
    ("messages/small", normalize_messages, messages_body(turns=2, chars=200)),
    ("messages/large", normalize_messages, messages_body(turns=40, chars=2200)),
    ("messages/large_many_blocks", normalize_messages, messages_body(turns=700, chars=100)),
]


def _per_call_ns(fn: Callable[[], object], *, budget_s: float = 0.05) -> float:
    """Median-ready sample: the mean ns per call over a loop sized to take about ``budget_s``."""
    loops = 1
    while True:
        start = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        elapsed = time.perf_counter_ns() - start
        if elapsed >= budget_s * 1e9 or loops >= 1 << 20:
            return elapsed / loops
        loops *= 2


def measure(normalize: Normalizer, body: dict[str, Any], *, repeats: int) -> dict[str, Any]:
    raw = json.dumps(body).encode()
    parsed = json.loads(raw)
    assert normalize(parsed) is not None, "every benchmark body carries a hint"
    parse_ns: list[float] = []
    norm_ns: list[float] = []
    for _ in range(repeats):  # interleaved so both see the same machine noise
        parse_ns.append(_per_call_ns(lambda: json.loads(raw)))
        norm_ns.append(_per_call_ns(lambda: normalize(parsed)))
    parse = statistics.median(parse_ns)
    norm = statistics.median(norm_ns)
    return {
        "body_bytes": len(raw),
        "parse_us": round(parse / 1e3, 3),
        "normalize_us": round(norm / 1e3, 3),
        "normalize_percent_of_parse": round(100 * norm / parse, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="benchmarks/results/normalize.json")
    args = parser.parse_args(argv)
    results = {name: measure(fn, body, repeats=args.repeats) for name, fn, body in CASES}
    report = {
        "benchmark": "normalize",
        "target_percent": TARGET_PERCENT,
        "repeats": args.repeats,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print("| case | body | json.loads | normalize | normalize/parse |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        print(
            f"| {name} | {r['body_bytes'] / 1024:.1f} KiB | {r['parse_us']:.1f} µs "
            f"| {r['normalize_us']:.2f} µs | {r['normalize_percent_of_parse']:.1f}% |"
        )
    worst = max(r["normalize_percent_of_parse"] for r in results.values())
    print(f"\nworst case {worst:.1f}% of parse time (target < {TARGET_PERCENT:g}%); wrote {out}")
    return 0 if worst < TARGET_PERCENT else 1


if __name__ == "__main__":
    raise SystemExit(main())

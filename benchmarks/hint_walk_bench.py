"""The hint normalizers' walk over an agent body, with and without the messages' encodings (the
frontend's resumer makes them anyway): does skipping the items whose bytes never name the key pay?
Side by side in one process, interleaved, CPU µs per call (medians of 15 rounds of 30 calls).

    .venv/bin/python benchmarks/hint_walk_bench.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kvretention.dataplane.frontend.resume import encode_items
from kvretention.hints import (
    hints_from_chat_completions,
    hints_from_messages,
    hints_from_responses,
)
from normalize_bench import build_cases

KEYS = {
    "agent/claude_code": (hints_from_messages, "messages", b'"cache_control"'),
    "agent/chat": (hints_from_chat_completions, "messages", b'"prompt_cache_breakpoint"'),
    "agent/codex + cache options": (hints_from_responses, "input", b'"prompt_cache_breakpoint"'),
}


def _per_call_us(fn: Callable[[], object], n: int = 30) -> float:
    start = time.process_time_ns()
    for _ in range(n):
        fn()
    return (time.process_time_ns() - start) / n / 1e3


def measure(
    normalize: Callable[..., object], items: list[object], body: object, named: bytes
) -> str:
    encoded = encode_items(items) or []
    steps: dict[str, Callable[[], object]] = {
        "walk every item": lambda: normalize(body),
        "scan the items' bytes for the key": lambda: [named in b for b in encoded],
        "encode the items (the resumer does)": lambda: encode_items(items),
    }
    if normalize is hints_from_messages:
        steps["walk the items naming the key"] = lambda: normalize(body, encoded=encoded)
    samples: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(15):
        for name, fn in steps.items():
            samples[name].append(_per_call_us(fn))
    cells = ", ".join(f"{k}: {statistics.median(v):.0f} µs" for k, v in samples.items())
    return f"({sum(map(len, encoded)) // 1024} KiB of items): {cells}"


def main() -> int:
    for case in build_cases():
        if case.name in KEYS:
            normalize, key, named = KEYS[case.name]
            body = json.loads(json.dumps(case.body))
            print(case.name, measure(normalize, body[key], body, named))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

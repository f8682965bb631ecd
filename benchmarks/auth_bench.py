"""What auth costs the frontend per request, beside what it already pays for the same request.

Times side by side in one run (process CPU time, medians over repeats, samples interleaved):

- the gate's work per request (``auth.Gate``: read the key from the headers, SHA-256 it, look it
  up and confirm it with ``hmac.compare_digest``, take and give back the tenant's rate and
  concurrency lease), for a table of 10 and of 10,000 keys, with a valid and a wrong key;
- ``json.loads`` of a small Chat Completions body and of a ~200 KB Claude Code Messages body
  (``agent_bodies.py``), the first thing the frontend does with a request it serves.

    .venv/bin/python benchmarks/auth_bench.py [--repeats 7] [--out benchmarks/results/auth.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_bodies import claude_code_turns
from kvretention.dataplane.frontend.auth import Gate, KeyStore
from kvretention.dataplane.frontend.errors import Provider
from kvretention.dataplane.frontend.limits import LimitPolicy, Limits, Refusal

LOOPS = 2_000


def _gate(keys: int, root: Path) -> tuple[Gate, str]:
    directory = root / f"keys-{keys}"
    directory.mkdir()
    per_tenant = max(1, keys // 10)
    first = ""
    for t in range(min(keys, 10)):
        lines = [f"sk-tenant{t:02d}-{i:012d}-bench" for i in range(per_tenant)]
        first = first or lines[0]
        (directory / f"tenant-{t:02d}").write_text("\n".join(lines) + "\n")
    limits = LimitPolicy(default=Limits(requests_per_second=1e9, concurrency=1_000_000))
    return Gate(keys=KeyStore([directory]), limits=limits), first


def _gate_step(gate: Gate, key: str) -> Callable[[], None]:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}

    def step() -> None:
        who = gate.authenticate(headers, Provider.OPENAI)
        if isinstance(who, str):
            lease = gate.limiter.acquire(who, now=time.monotonic())
            if not isinstance(lease, Refusal):
                lease.release()

    return step


def _per_call_us(step: Callable[[], None], loops: int) -> float:
    start = time.process_time()
    for _ in range(loops):
        step()
    return (time.process_time() - start) / loops * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/auth.json"))
    args = parser.parse_args()

    small = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    agent = json.dumps(claude_code_turns()[1])
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        gates = {n: _gate(n, root) for n in (10, 10_000)}
        steps: dict[str, tuple[Callable[[], None], int]] = {
            "json_small": (lambda: json.loads(small), LOOPS),
            "json_agent_200kb": (lambda: json.loads(agent), 20),
        }
        for n, (gate, key) in gates.items():
            steps[f"gate_{n}_keys_valid"] = (_gate_step(gate, key), LOOPS)
            steps[f"gate_{n}_keys_wrong"] = (_gate_step(gate, "sk-not-a-key-000000000000"), LOOPS)
        samples: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.repeats):
            for name, (step, loops) in steps.items():
                samples[name].append(_per_call_us(step, loops))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    result: dict[str, Any] = {
        "python": platform.python_version(),
        "repeats": args.repeats,
        "agent_body_bytes": len(agent),
        "median_us": {k: round(v, 3) for k, v in medians.items()},
        "gate_over_json_small": {
            k: round(v / medians["json_small"], 3)
            for k, v in medians.items()
            if k.startswith("gate")
        },
        "gate_over_json_agent": {
            k: round(v / medians["json_agent_200kb"], 5)
            for k, v in medians.items()
            if k.startswith("gate")
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'step':<24} {'median us':>10} {'/ json small':>13} {'/ json agent':>13}")
    for name, value in medians.items():
        print(
            f"{name:<24} {value:>10.2f} {value / medians['json_small']:>13.3f} "
            f"{value / medians['json_agent_200kb']:>13.5f}"
        )


if __name__ == "__main__":
    main()

"""The frontend's per-request steps on the agent bodies, measured on several source trees side by
side: ``normalize_bench.py --only agent`` runs once per tree per round, the trees alternated so
each sees the same machine noise; each cell is the lowest of the rounds' medians (noise on a shared
machine only ever adds CPU time).

    git archive <rev> operator | (mkdir -p /tmp/before && tar -x -C /tmp/before)
    .venv/bin/python benchmarks/ab_trees.py before=/tmp/before after=. [--rounds 2 --repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run(tree: Path, *, repeats: int) -> dict[str, Any]:
    """One ``normalize_bench`` run with ``tree``'s ``operator/`` first on the path."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "normalize.json"
        env = dict(os.environ, PYTHONPATH=str(tree / "operator"))
        command = [sys.executable, str(HERE / "normalize_bench.py"), "--only", "agent"]
        command += ["--repeats", str(repeats), "--out", str(out)]
        subprocess.run(command, env=env, check=False, capture_output=True)
        results: dict[str, Any] = json.loads(out.read_text())["results"]
        return results


def table(runs: dict[str, list[dict[str, Any]]]) -> str:
    labels = list(runs)
    first = runs[labels[0]][0]
    cases = list(first)
    stages = list(first[cases[0]]["frontend_stages_us"])
    rows = [
        "| case | step | " + " | ".join(labels) + f" | {labels[-1]}/{labels[0]} |",
        "|---|---|" + "---:|" * (len(labels) + 1),
    ]
    names = {"parse_us": "json.loads (reference)", "frontend_total_us": "**frontend total**"}
    for case in cases:
        for key in ["parse_us", *stages, "frontend_total_us"]:
            values = [
                min(r[case]["frontend_stages_us"].get(key, r[case].get(key)) for r in runs[label])
                for label in labels
            ]
            cells = " | ".join(f"{v:.0f} µs" for v in values)
            rows.append(
                f"| {case} | {names.get(key, key)} | {cells} | {values[-1] / values[0]:.2f} |"
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", help="label=path of a source tree holding operator/")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/frontend_ab.json")
    args = parser.parse_args(argv)
    trees = {label: Path(path).resolve() for label, path in (t.split("=", 1) for t in args.trees)}
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    for _ in range(args.rounds):
        for label, tree in trees.items():
            runs[label].append(run(tree, repeats=args.repeats))
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"trees": {k: str(v) for k, v in trees.items()}, "uptime_after": uptime.strip()}
    out.write_text(json.dumps({**report, "runs": runs}, indent=2) + "\n")
    print(table(runs))
    print(f"uptime: {uptime.strip()}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Render the README's request-path and operator tables from the benchmarks' JSON results.

    .venv/bin/python benchmarks/report.py            # both sections' tables, as Markdown
    .venv/bin/python benchmarks/report.py request    # only the request path
    .venv/bin/python benchmarks/report.py agents     # the agent-shaped request-path run

The prose around the tables (what dominates, what was tried) is written by hand in README.md.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Final

RESULTS: Final = Path(__file__).resolve().parent / "results"
OURS: Final = ("frontend", "frontend+router", "full")


def _num(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def request_tables(data: dict[str, Any]) -> str:
    """One table per scenario: each target's latency, throughput and CPU against direct/LiteLLM."""
    out = []
    machine = data["machine"]
    out.append(
        f"Run {machine['date']}, {data['repeats']} repeats (medians), ≤{data['max_seconds_per_run']} s "
        f"per run, servers pinned to CPU {data['pinning']['server_cpus']}, load generator to CPU "
        f"{data['pinning']['loadgen_cpu']}; `uptime` at the end: `{machine['uptime']}`; peers "
        + ", ".join(f"{k} {v}" for k, v in sorted(data.get("peers", {}).items()))
        + "."
    )
    for scenario, targets in data["summary"].items():
        out.append(f"\n**{scenario}**\n")
        out.append(
            "| target | p50 ms | +p50 ms | p99 ms | +p99 ms | req/s | x direct | "
            "proxy CPU ms/req | worker CPU ms/req | x LiteLLM CPU | chunks per proxy CPU-s |"
        )
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for target, m in targets.items():
            direct = target == "direct"
            out.append(
                f"| {target} | {_num(m['p50_ms'], '.2f')} | {'' if direct else _num(m['added_p50_ms'], '+.2f')} "
                f"| {_num(m['p99_ms'], '.2f')} | {'' if direct else _num(m['added_p99_ms'], '+.2f')} "
                f"| {_num(m['throughput_rps'], '.0f')} | {_num(m['throughput_ratio'], '.2f')} "
                f"| {'' if direct else _num(m['proxy_cpu_ms_per_req'], '.3f')} "
                f"| {_num(m['worker_cpu_ms_per_req'], '.3f') if m['worker_cpu_ms_per_req'] else ''} "
                f"| {'' if direct or target == 'litellm' else _num(m['cpu_ratio_to_litellm'], '.2f')} "
                f"| {'' if direct else _num(m['chunks_per_proxy_cpu_s'], ',.0f')} |"
            )
    return "\n".join(out)


def request_goals(data: dict[str, Any]) -> str:
    out = ["| goal | target | scenario | measured | met |", "|---|---|---|---:|:---:|"]
    for g in data.get("goals", []):
        out.append(
            f"| {g['name']} | {g['target']} | {g['scenario']} | {g['metric']} = "
            f"{_num(g['value'], '.3f')} | {'yes' if g['met'] else '**no**'} |"
        )
    return "\n".join(out)


def operator_table(runs: list[dict[str, Any]]) -> str:
    """One row per N, from one or more ``operator_bench.py`` result files (each says when it ran)."""
    out = []
    for data in runs:
        sizes = ", ".join(str(r["n"]) for r in data["results"])
        out.append(
            f"N = {sizes}: run {data['machine']['date']}, client concurrency "
            f"{data['client_concurrency']} on both sides, operator resync {data['resync_seconds']} s; "
            f"`uptime` before: `{data['machine']['uptime_before']}`, after: "
            f"`{data['machine']['uptime_after']}`."
        )
    out += [
        "",
        "| N | bulk apply s | bulk Ready s | operator: children applied s (x bulk apply) "
        "| operator: all Ready s (x bulk Ready) | child writes / fleet | status writes / fleet "
        "| dry-run applies / fleet | writes at steady state | reads / fleet / resync at steady state "
        "| operator RSS MiB "
        "| operator CPU ms / fleet | spec change -> status p50 / p99 s | -> Ready again p50 / p99 s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = sorted((r for data in runs for r in data["results"]), key=lambda r: r["n"])
    for r in rows:
        b, o = r["baseline"], r["operator"]
        s = o["spec_change"]
        out.append(
            f"| {r['n']} | {b['apply_s']:.1f} | {b['ready_s']:.1f} "
            f"| {_num(o['children_applied_s'], '.1f')} ({_num(r['ratio']['applied'], '.2f')}) "
            f"| {o['ready_s']:.1f} ({r['ratio']['ready']:.2f}) "
            f"| {o['child_writes_per_fleet_first']:.2f} (of {o['children_per_fleet']}) "
            f"| {o['status_writes_per_fleet_first']:.2f} | {o['dry_run_applies_per_fleet_first']:.2f} "
            f"| {o['api_writes_per_fleet_steady'] * r['n']:.0f} "
            f"| {_num(o.get('api_reads_per_fleet_per_resync_steady'), '.1f')} "
            f"| {o['operator_rss_kib']['VmRSS'] / 1024:.0f} | {o['operator_cpu_ms_per_fleet']:.0f} "
            f"| {_num(s['status_observed_p50_s'], '.1f')} / {_num(s['status_observed_p99_s'], '.1f')} "
            f"| {_num(s['ready_again_p50_s'], '.1f')} / {_num(s['ready_again_p99_s'], '.1f')} |"
        )
    return "\n".join(out)


def operator_runs() -> list[dict[str, Any]]:
    """``operator.json`` (the default sizes) and, when present, ``operator_large.json`` (N = 500)."""
    names = ("operator.json", "operator_large.json")
    return [json.loads((RESULTS / n).read_text()) for n in names if (RESULTS / n).exists()]


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which in ("all", "request"):
        data = json.loads((RESULTS / "request_path.json").read_text())
        print(request_goals(data), "\n", request_tables(data), sep="\n")
    agents = RESULTS / "request_path_agents.json"
    if which == "agents" or (which == "all" and agents.exists()):
        data = json.loads(agents.read_text())
        print(f"\n`{data['command']}`\n")
        print(request_goals(data), "\n", request_tables(data), sep="\n")
    if which in ("all", "operator"):
        print()
        print(operator_table(operator_runs()))


if __name__ == "__main__":
    main()

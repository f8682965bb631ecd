"""The operator's resident memory with N fleets, this checkout side by side with another one.

For each N and each operator: create N ``examples/aggregated.yaml`` fleets at once in a fresh
namespace of one local plane, and read the operator's RSS and high-water mark once every fleet has
reconciled (``--ready``: also once every fleet is Ready); then, over the same converged fleets,
start each operator afresh (a restart or a failover: the initial listing of every child and pod)
and read the same once it has reconciled every fleet. ``--baseline DIR`` runs the operator of
another checkout's ``operator/`` (e.g. a ``git worktree`` of an older commit) in the same run.

    .venv/bin/python benchmarks/operator_memory.py --sizes 100,500
    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/operator_memory.py --sizes 100,500 --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

HERE: Final = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from operator_bench import (  # noqa: E402
    CONCURRENCY,
    GROUP,
    PLURAL,
    VERSION,
    Cluster,
    Operator,
    apply_crd,
    client,
    control_plane,
    fleet_bodies,
    is_ready,
    list_fleets,
    make_namespace,
    nodes_for,
    rss_kib,
    wait_for,
)

RESULTS: Final = HERE / "results" / "operator_memory.json"


def start(cluster: Cluster, log_dir: Path, ns: str, *, code: Path | None, name: str) -> Operator:
    env = {"PYTHONPATH": str(code / "operator")} if code is not None else None
    op = Operator(
        cluster,
        log_dir,
        f"--namespace={ns}",
        "--no-leader-elect",
        "--resync-seconds=3600",
        "--log-level=WARNING",
        name=name,
        env=env,
    )
    op.wait_ready(timeout_s=300)
    return op


def reconciled(op: Operator, n: int) -> bool:
    try:
        return op.metric_sum("kvretention_operator_reconciles_total") >= n
    except OSError:  # busy: its metrics endpoint did not answer in time
        return False


def measure(
    op: Operator, what: str, n: int, *, settle_s: float, timeout_s: float
) -> dict[str, Any]:
    started = time.monotonic()
    wait_for(what, lambda: reconciled(op, n), timeout_s=timeout_s)
    seconds = time.monotonic() - started
    time.sleep(settle_s)  # the reconciles queued by their own writes' watch events
    rss = rss_kib(op.process.proc.pid)
    return {
        "seconds": round(seconds, 1),
        "rss_mib": round(rss["VmRSS"] / 1024, 1),
        "hwm_mib": round(rss["VmHWM"] / 1024, 1),
    }


def first_run(
    cluster: Cluster, api: Any, n: int, *, label: str, code: Path | None, args: argparse.Namespace
) -> tuple[str, dict[str, Any]]:
    """N fleets created at once in a fresh namespace, under one operator: its RSS once every
    fleet has reconciled (and, with ``--ready``, once every fleet is Ready)."""
    ns = f"mem-{label}-{n}-{int(time.time())}"
    make_namespace(api, ns)
    op = start(cluster, Path(tempfile.mkdtemp(prefix="kvr-opmem-")), ns, code=code, name=label)
    try:
        custom: Any = client.CustomObjectsApi(api)
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(
                pool.map(
                    lambda b: custom.create_namespaced_custom_object(
                        GROUP, VERSION, ns, PLURAL, copy.deepcopy(b)
                    ),
                    fleet_bodies(n, ns),
                )
            )
        out = measure(op, f"{n} fleets reconciled", n, settle_s=args.settle, timeout_s=args.timeout)
        if args.ready:
            wait_for(
                f"{n} fleets Ready",
                lambda: sum(is_ready(cr) for cr in list_fleets(api, ns)) == n,
                timeout_s=args.timeout,
            )
            time.sleep(args.settle)
            rss = rss_kib(op.process.proc.pid)
            out["ready_rss_mib"] = round(rss["VmRSS"] / 1024, 1)
            out["ready_hwm_mib"] = round(rss["VmHWM"] / 1024, 1)
    finally:
        op.stop()
    return ns, out


def run_size(
    cluster: Cluster, api: Any, n: int, *, codes: dict[str, Path | None], args: argparse.Namespace
) -> dict[str, Any]:
    out: dict[str, Any] = {"n": n}
    ns = ""
    for label, code in codes.items():
        ns, out[f"first_{label}"] = first_run(cluster, api, n, label=label, code=code, args=args)
    log_dir = Path(tempfile.mkdtemp(prefix="kvr-opmem-"))
    for label, code in codes.items():  # each over the same converged fleets (the last namespace)
        op = start(cluster, log_dir, ns, code=code, name=f"restart-{label}")
        try:
            out[f"restart_{label}"] = measure(
                op, f"{n} fleets after a restart", n, settle_s=args.settle, timeout_s=args.timeout
            )
        finally:
            op.stop()
    print(json.dumps(out), file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="100,500")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout to compare")
    parser.add_argument("--kubeconfig", type=Path, default=None, help="use this plane")
    parser.add_argument("--ready", action="store_true", help="also wait for every fleet Ready")
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    codes: dict[str, Path | None] = {"this": None}
    if args.baseline is not None:
        codes["baseline"] = args.baseline.resolve()
    nodes = nodes_for(sizes * len(codes))  # each operator's first run has its own fleets
    with (
        tempfile.TemporaryDirectory(prefix="kvr-opmem-") as tmp,
        control_plane(
            kubeconfig=args.kubeconfig, state_dir=Path(tmp) / "plane", nodes=nodes
        ) as cluster,
    ):
        api = cluster.api_client()
        apply_crd(api)
        results = [run_size(cluster, api, n, codes=codes, args=args) for n in sizes]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

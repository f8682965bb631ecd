"""Operator convergence on the real local control plane, side by side with a plain bulk apply.

For each N (default 10 and 100; ``--large`` adds 500) in fresh namespaces of one local plane:

1. **Baseline**: ``kvretention render`` the N fleets, then server-side apply every rendered
   manifest straight to the API server with the Python ``kubernetes`` client, as many calls at a
   time as the operator's API thread pool allows (neither side has a client-side QPS limiter),
   and wait until every Deployment is Ready (kwok marks the pods Ready).
2. **Operator**: start ``kvretention operator --namespace NS --no-leader-elect``, create the same N
   ``KvRetentionDeployment`` objects at once, wait until every one reports ``Ready=True`` for its
   generation. Then: API writes per fleet on that first reconcile and during a steady-state window of
   two resync periods (from the API server's own ``apiserver_request_total``, APPLY/DELETE only, so
   the controller-manager's and kwok's writes are not counted; the operator's own counters beside
   them), the operator's RSS and CPU, and the p50/p99 time from a spec change (``workers.replicas``
   2 -> 3 on every fleet at once) to the status that observes it.

Convergence time is reported as a ratio to the baseline (goal: within 1.5x).

    .venv/bin/python benchmarks/operator_bench.py              # N = 10, 100 (~5 min on 2 cores)
    .venv/bin/python benchmarks/operator_bench.py --large      # adds N = 500
    .venv/bin/python benchmarks/operator_bench.py --kubeconfig .kvr-cluster/kubeconfig  # reuse a plane
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

HERE: Final = Path(__file__).resolve().parent
REPO: Final = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "tests"))

from kubernetes import client, watch  # noqa: E402
from operator_fixtures import CRD_PATH, Operator, load_example  # noqa: E402

from kvretention.api.models import GROUP, PLURAL, VERSION  # noqa: E402
from kvretention.controller.operator import KUBE_THREADS  # noqa: E402
from kvretention_devtools.localcluster import down, up  # noqa: E402
from kvretention_devtools.localcluster.binaries import resolve_bin_dir  # noqa: E402
from loadgen import proc_cpu_seconds  # noqa: E402
from profiling import start_sampler  # noqa: E402
from support.controlplane import Cluster  # noqa: E402
from support.kube_reads import exists  # noqa: E402

RESULTS: Final = HERE / "results" / "operator.json"
CONCURRENCY: Final = KUBE_THREADS
"""Client concurrency of both sides: the operator makes its API calls from a pool of this many
threads (its reconcile workers apply a fleet's children concurrently), so the baseline does too."""
BASELINE_MANAGER: Final = "kvr-bench-bulk"
PODS_PER_FLEET: Final = 6  # frontend, router, mooncake master, 3 workers after the spec change
GPUS_PER_FLEET: Final = 3
GPUS_PER_NODE: Final = 64
PODS_PER_NODE: Final = 240
POLL_S: Final = 0.25
WRITE_VERBS: Final = frozenset({"APPLY", "DELETE"})
OWNED: Final = {
    ("apps", "deployments", ""),
    ("", "services", ""),
    ("", "configmaps", ""),
    ("policy", "poddisruptionbudgets", ""),
    ("networking.k8s.io", "networkpolicies", ""),
    (GROUP, PLURAL, "status"),
}
"""(group, resource, subresource) the operator writes; only it (and the baseline) use APPLY."""
STATUS: Final = "status"
_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


# --- the API server's own request counters --------------------------------------------------------


def call(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    query: list[tuple[str, str]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
) -> bytes:
    """One raw request through the Python client (its auth, TLS and pool); the body as bytes."""
    request = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=query or [],
        header_params={"Content-Type": content_type, "Accept": "application/json, */*"},
        body=body,
        auth_settings=["BearerToken"],
    )
    resp: Any = api.call_api(*request, _request_timeout=60)
    resp.read()
    data: bytes = resp.data or b""
    if not 200 <= resp.status < 300:
        raise RuntimeError(f"{method} {path}: HTTP {resp.status} {data[:300]!r}")
    return data


def apiserver_requests(api: client.ApiClient) -> dict[tuple[str, ...], float]:
    """``apiserver_request_total`` as (verb, dry_run, group, resource, subresource) -> count."""
    out: dict[tuple[str, ...], float] = {}
    for line in call(api, "GET", "/metrics").decode().splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m["labels"]))
        key = tuple(
            labels.get(n, "") for n in ("verb", "dry_run", "group", "resource", "subresource")
        )
        out[key] = out.get(key, 0.0) + float(m["value"])
    return out


def _deltas(
    before: Mapping[tuple[str, ...], float], after: Mapping[tuple[str, ...], float]
) -> Iterator[tuple[tuple[str, ...], float]]:
    """Each request counter's key and its increase between two snapshots, where it moved."""
    for key, value in after.items():
        delta = value - before.get(key, 0.0)
        if delta:
            yield key, delta


def owned_writes(
    before: Mapping[tuple[str, ...], float], after: Mapping[tuple[str, ...], float]
) -> dict[str, float]:
    """Persisted APPLY/DELETE requests on the operator's kinds between two snapshots, by resource."""
    out: dict[str, float] = {}
    for (verb, dry_run, group, resource, sub), delta in _deltas(before, after):
        if verb in WRITE_VERBS and not dry_run and (group, resource, sub) in OWNED:
            label = f"{verb} {resource}{'/' + sub if sub else ''}"
            out[label] = out.get(label, 0.0) + delta
    return out


READ_RESOURCES: Final = frozenset(
    {
        PLURAL,
        "deployments",
        "services",
        "configmaps",
        "poddisruptionbudgets",
        "networkpolicies",
        "pods",
    }
)


_ETCD = re.compile(r"^etcd_requests_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def cr_updates(api: client.ApiClient) -> float:
    """Updates of the custom resource that reached etcd. A server-side apply that changes nothing
    never does, so between two snapshots this counts the status writes that changed something."""
    total = 0.0
    for line in call(api, "GET", "/metrics").decode().splitlines():
        m = _ETCD.match(line)
        if m:
            labels = dict(_LABEL.findall(m["labels"]))
            if labels.get("operation") == "update" and labels.get("resource") == PLURAL:
                total += float(m["value"])
    return total


def reads(before: Mapping[tuple[str, ...], float], after: Mapping[tuple[str, ...], float]) -> float:
    """GET and LIST requests on the fleet's kinds (the rest of the plane watches instead), less
    LISTs of the custom resource: this script polls those itself (the operator only GETs one)."""
    return sum(reads_by(before, after).values())


def reads_by(
    before: Mapping[tuple[str, ...], float], after: Mapping[tuple[str, ...], float]
) -> dict[str, float]:
    out: dict[str, float] = {}
    for (verb, _, _, resource, sub), delta in _deltas(before, after):
        if verb not in ("GET", "LIST") or resource not in READ_RESOURCES or sub:
            continue
        if verb == "LIST" and resource == PLURAL:
            continue
        out[f"{verb} {resource}"] = out.get(f"{verb} {resource}", 0.0) + delta
    return out


def dry_runs(
    before: Mapping[tuple[str, ...], float], after: Mapping[tuple[str, ...], float]
) -> float:
    return sum(
        v - before.get(k, 0.0)
        for k, v in after.items()
        if k[0] == "APPLY" and k[1] and (k[2], k[3], k[4]) in OWNED
    )


# --- cluster helpers ------------------------------------------------------------------------------


def nodes_for(sizes: list[int]) -> int:
    fleets = 2 * sum(sizes)
    return max(
        1,
        math.ceil(fleets * PODS_PER_FLEET / PODS_PER_NODE),
        math.ceil(fleets * GPUS_PER_FLEET / GPUS_PER_NODE),
    )


@contextmanager
def control_plane(*, kubeconfig: Path | None, state_dir: Path, nodes: int) -> Iterator[Cluster]:
    """Start a dedicated plane (stopped by pid at the end), or use the one ``kubeconfig`` names."""
    bin_dir = resolve_bin_dir()
    if kubeconfig is not None:
        yield Cluster.from_kubeconfig(kubeconfig, bin_dir=bin_dir)
        return
    started = time.monotonic()
    state, _ = up(
        state_dir, bin_dir=bin_dir, nodes=nodes, gpus_per_node=GPUS_PER_NODE, timeout_s=300
    )
    print(
        f"control plane up in {time.monotonic() - started:.0f}s ({nodes} kwok nodes)",
        file=sys.stderr,
    )
    try:
        yield Cluster(
            kubeconfig=state.kubeconfig, server=state.server, bin_dir=bin_dir, state_dir=state_dir
        )
    finally:
        down(state_dir)


def bench_operator(
    cluster: Cluster, log_dir: Path, ns: str, *, resync_s: float, name: str = "operator"
) -> Operator:
    """The operator as every run measures it: one namespace, no leader election, warnings only."""
    return Operator(
        cluster,
        log_dir,
        f"--namespace={ns}",
        "--no-leader-elect",
        f"--resync-seconds={resync_s}",
        "--log-level=WARNING",
        name=name,
    )


def wait_for(what: str, check: Callable[[], Any], *, timeout_s: float) -> Any:
    """Poll ``check`` until it returns something truthy (that value); TimeoutError past
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(POLL_S)
    return result


def apply(api: client.ApiClient, path: str, manifest: Mapping[str, Any]) -> None:
    """Server-side apply ``manifest`` at ``path`` as the baseline's field manager, forcing."""
    call(
        api,
        "PATCH",
        path,
        query=[("fieldManager", BASELINE_MANAGER), ("force", "true")],
        body=manifest,
        content_type="application/apply-patch+yaml",
    )


def apply_crd(api: client.ApiClient) -> None:
    ext: Any = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(CRD_PATH.read_text())
    name = body["metadata"]["name"]
    apply(api, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", body)

    def established() -> bool:
        conds = ext.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    wait_for(f"CRD {name}", established, timeout_s=60)


def make_namespace(api: client.ApiClient, name: str) -> None:
    """A namespace ready for pods: its default ServiceAccount and root CA ConfigMap exist."""
    core: Any = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name, "labels": {"kvretention.dev/bench": "true"}}})

    def ready() -> bool:
        return exists(lambda: core.read_namespaced_service_account("default", name)) and exists(
            lambda: core.read_namespaced_config_map("kube-root-ca.crt", name)
        )

    wait_for(f"namespace {name}", ready, timeout_s=60)


def fleet_bodies(n: int, namespace: str) -> list[dict[str, Any]]:
    return [
        load_example("aggregated", name=f"fleet-{i:04d}", namespace=namespace) for i in range(n)
    ]


def render(bodies: list[dict[str, Any]], *, namespace: str, tmp: Path) -> list[dict[str, Any]]:
    """``kvretention render``: the exact manifests the operator would apply, without a cluster."""
    source = tmp / f"{namespace}.yaml"
    source.write_text(yaml.safe_dump_all(bodies))
    done = subprocess.run(
        [sys.executable, "-m", "kvretention", "render", "-f", str(source), "-n", namespace],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def object_path(manifest: Mapping[str, Any]) -> str:
    api_version, kind = manifest["apiVersion"], manifest["kind"]
    plural = {
        "Deployment": "deployments",
        "Service": "services",
        "ConfigMap": "configmaps",
        "PodDisruptionBudget": "poddisruptionbudgets",
        "NetworkPolicy": "networkpolicies",
    }[kind]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    meta = manifest["metadata"]
    return f"{prefix}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"


def bulk_apply(api: client.ApiClient, manifests: list[dict[str, Any]]) -> None:
    """Server-side apply every manifest, ``CONCURRENCY`` at a time, with the Python client."""

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(lambda m: apply(api, object_path(m), m), manifests))


def deployments_ready(api: client.ApiClient, namespace: str, *, expect: int) -> bool:
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    items = json.loads(call(api, "GET", path))["items"]
    if len(items) < expect:
        return False
    return all(
        (d["status"].get("observedGeneration") or 0) >= d["metadata"]["generation"]
        and (d["status"].get("readyReplicas") or 0) == d["spec"]["replicas"]
        for d in items
    )


def list_fleets(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    items: list[dict[str, Any]] = json.loads(call(api, "GET", path))["items"]
    return items


def is_ready(cr: Mapping[str, Any]) -> bool:
    status = cr.get("status") or {}
    gen = cr["metadata"].get("generation")
    return status.get("observedGeneration") == gen and any(
        c["type"] == "Ready" and c["status"] == "True" and c.get("observedGeneration") == gen
        for c in status.get("conditions") or []
    )


def rss_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1])
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# --- one size -------------------------------------------------------------------------------------


@dataclass
class SizeResult:
    n: int
    baseline: dict[str, Any] = field(default_factory=dict)
    operator: dict[str, Any] = field(default_factory=dict)
    ratio: dict[str, float] = field(default_factory=dict)


def run_baseline(api: client.ApiClient, n: int, *, tmp: Path, timeout_s: float) -> dict[str, Any]:
    ns = f"bench-bulk-{n}"
    make_namespace(api, ns)
    manifests = render(fleet_bodies(n, ns), namespace=ns, tmp=tmp)
    deployments = sum(1 for m in manifests if m["kind"] == "Deployment")
    before = apiserver_requests(api)
    started = time.monotonic()
    bulk_apply(api, manifests)
    applied = time.monotonic() - started
    wait_for(
        f"{n} bulk fleets Ready",
        lambda: deployments_ready(api, ns, expect=deployments),
        timeout_s=timeout_s,
    )
    ready = time.monotonic() - started
    writes = owned_writes(before, apiserver_requests(api))
    return {
        "namespace": ns,
        "objects": len(manifests),
        "objects_per_fleet": len(manifests) / n,
        "apply_s": round(applied, 3),
        "ready_s": round(ready, 3),
        "api_writes": writes,
        "api_writes_per_fleet": sum(writes.values()) / n,
    }


def run_operator(
    cluster: Cluster,
    api: client.ApiClient,
    n: int,
    *,
    log_dir: Path,
    resync_s: float,
    timeout_s: float,
    profile_dir: Path | None = None,
) -> dict[str, Any]:
    ns = f"bench-op-{n}"
    make_namespace(api, ns)
    op = bench_operator(cluster, log_dir, ns, resync_s=resync_s)
    try:
        op.wait_ready(timeout_s=120)
        result = _measure_operator(
            api, op, n, ns=ns, resync_s=resync_s, timeout_s=timeout_s, profile_dir=profile_dir
        )
        wait_quiet(op, timeout_s=timeout_s)
    finally:
        code = op.stop()
        if code != 0:
            print(f"operator exited {code}:\n{op.process.log()[-3000:]}", file=sys.stderr)
    result["restart"] = measure_restart(
        cluster, api, n, ns=ns, log_dir=log_dir, timeout_s=timeout_s
    )
    return result


def wait_quiet(op: Operator, *, timeout_s: float, quiet_s: float = 3.0) -> None:
    """Until the operator has written nothing for ``quiet_s`` (the spec change fully settled), so
    a restart measured next starts from converged fleets."""
    last, since = op.writes(), time.monotonic()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(POLL_S)
        now = op.writes()
        if now != last:
            last, since = now, time.monotonic()


def measure_restart(
    cluster: Cluster, api: client.ApiClient, n: int, *, ns: str, log_dir: Path, timeout_s: float
) -> dict[str, Any]:
    """A fresh operator over N converged fleets (a restart or a failover): the API requests its
    first pass costs until it has reconciled every fleet once. Its resync is an hour, so the
    window holds that first pass only."""
    before = apiserver_requests(api)
    updates_before = cr_updates(api)
    started = time.monotonic()
    op = bench_operator(cluster, log_dir, ns, resync_s=3600, name="operator-restarted")
    try:
        op.wait_ready(timeout_s=120)
        wait_for(
            f"{n} fleets reconciled after a restart",
            lambda: op.metric_sum("kvretention_operator_reconciles_total") >= n,
            timeout_s=timeout_s,
        )
        window = time.monotonic() - started
        time.sleep(2.0)  # let the last reconciles (re-queued by their own watch events) finish
        after = apiserver_requests(api)
        updates = cr_updates(api) - updates_before
        own_writes = op.writes()
        reconciles = op.metric_sum("kvretention_operator_reconciles_total")
        events = op.metric_sum("kvretention_operator_events_total")
    finally:
        code = op.stop()
        if code != 0:
            print(f"operator exited {code}:\n{op.process.log()[-3000:]}", file=sys.stderr)
    writes = owned_writes(before, after)
    return {
        "fleets": n,
        "window_s": round(window, 2),
        "reconciles": reconciles,
        "dry_runs": dry_runs(before, after),
        "reads": reads(before, after),
        "reads_by": reads_by(before, after),
        "api_writes": writes,
        "status_writes_that_changed_it": updates,
        "operator_counted_writes": own_writes,
        "events": events,
    }


def _measure_operator(
    api: client.ApiClient,
    op: Operator,
    n: int,
    *,
    ns: str,
    resync_s: float,
    timeout_s: float,
    profile_dir: Path | None,
) -> dict[str, Any]:
    pid = op.process.proc.pid
    custom: Any = client.CustomObjectsApi(api)
    bodies = fleet_bodies(n, ns)
    children_per_fleet = len(render(bodies[:1], namespace=ns, tmp=Path(tempfile.mkdtemp())))
    before = apiserver_requests(api)
    updates_before = cr_updates(api)
    own_before = op.writes()
    cpu_before = proc_cpu_seconds(pid)
    sampler = None
    if profile_dir is not None:
        sampler = start_sampler(pid, profile_dir / f"operator-{n}.txt", max_seconds=timeout_s)
        time.sleep(1.0)  # let py-spy attach
    started = time.monotonic()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(
            pool.map(
                lambda b: custom.create_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, copy.deepcopy(b)
                ),
                bodies,
            )
        )
    created = time.monotonic() - started
    applied_at: float | None = None

    def all_ready() -> bool:
        nonlocal applied_at
        if (
            applied_at is None
            and op.metric_sum("kvretention_operator_apply_writes_total") >= n * children_per_fleet
        ):
            applied_at = time.monotonic() - started
        items = list_fleets(api, ns)
        return len(items) == n and all(is_ready(cr) for cr in items)

    wait_for(f"{n} fleets Ready", all_ready, timeout_s=timeout_s)
    ready = time.monotonic() - started
    cpu_converge = proc_cpu_seconds(pid) - cpu_before
    profile = sampler.stop() if sampler is not None else None
    after_first = apiserver_requests(api)
    effective_status_writes = cr_updates(api) - updates_before
    first = owned_writes(before, after_first)
    first_dry = dry_runs(before, after_first)
    first_reads = reads(before, after_first)
    first_reads_by = reads_by(before, after_first)
    first_events = op.metric_sum("kvretention_operator_events_total")
    own_first = op.writes() - own_before
    rss_converged = rss_kib(pid)

    # Steady state: two resync periods with nothing to do must write nothing.
    steady_before, own_steady_before, cpu_steady_before = (
        apiserver_requests(api),
        op.writes(),
        proc_cpu_seconds(pid),
    )
    window = 2 * resync_s + 2
    time.sleep(window)
    steady_after = apiserver_requests(api)
    steady = owned_writes(steady_before, steady_after)
    steady_dry = dry_runs(steady_before, steady_after)
    steady_reads = reads(steady_before, steady_after)
    steady_reads_by = reads_by(steady_before, steady_after)
    own_steady = op.writes() - own_steady_before
    cpu_steady = proc_cpu_seconds(pid) - cpu_steady_before

    latency = spec_change_latency(api, ns, n, timeout_s=timeout_s)
    return {
        "namespace": ns,
        "children_per_fleet": children_per_fleet,
        "create_s": round(created, 3),
        "children_applied_s": round(applied_at, 3) if applied_at is not None else None,
        "ready_s": round(ready, 3),
        "api_writes_first": first,
        "api_writes_per_fleet_first": sum(first.values()) / n,
        "child_writes_per_fleet_first": sum(v for k, v in first.items() if STATUS not in k) / n,
        "status_writes_per_fleet_first": first.get(f"APPLY {PLURAL}/{STATUS}", 0.0) / n,
        "status_writes_that_changed_it_per_fleet_first": effective_status_writes / n,
        "dry_run_applies_per_fleet_first": first_dry / n,
        "api_reads_per_fleet_first": first_reads / n,
        "api_reads_first": first_reads_by,
        "events_per_fleet_first": first_events / n,
        "api_requests_per_fleet_first": (
            sum(first.values()) + first_dry + first_reads + first_events
        )
        / n,
        "operator_counted_writes_per_fleet_first": own_first / n,
        "steady_window_s": window,
        "api_writes_steady": steady,
        "api_writes_per_fleet_steady": sum(steady.values()) / n,
        "dry_run_applies_steady": steady_dry,
        "api_reads_per_fleet_per_resync_steady": round(steady_reads / n / (window / resync_s), 2),
        "api_reads_steady": steady_reads_by,
        "operator_counted_writes_steady": own_steady,
        "operator_cpu_s_converge": round(cpu_converge, 2),
        "operator_cpu_ms_per_fleet": round(cpu_converge / n * 1e3, 2),
        "operator_cpu_s_steady_window": round(cpu_steady, 2),
        "operator_rss_kib": rss_kib(pid),
        "operator_rss_kib_converged": rss_converged,
        "spec_change": latency,
        "profile": profile,
    }


def spec_change_latency(
    api: client.ApiClient, ns: str, n: int, *, timeout_s: float
) -> dict[str, Any]:
    """Patch every fleet at once; time each until its status observes the new generation."""
    custom: Any = client.CustomObjectsApi(api)
    rv = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["metadata"][
        "resourceVersion"
    ]
    patched: dict[str, tuple[float, int]] = {}
    observed: dict[str, float] = {}
    ready_again: dict[str, float] = {}
    lock = threading.Lock()
    stop = threading.Event()
    w: Any = watch.Watch()  # type: ignore[no-untyped-call]

    def watcher() -> None:
        for event in w.stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            PLURAL,
            resource_version=rv,
            timeout_seconds=int(timeout_s),
        ):
            now = time.monotonic()
            obj = event["object"]
            name = obj["metadata"]["name"]
            status = obj.get("status") or {}
            with lock:
                want = patched.get(name)
                if want is None:
                    continue
                if status.get("observedGeneration", 0) >= want[1] and name not in observed:
                    observed[name] = now - want[0]
                if (
                    is_ready(obj)
                    and status.get("workersReady") == "3/3"
                    and name not in ready_again
                ):
                    ready_again[name] = now - want[0]
                if len(ready_again) == n or stop.is_set():
                    return

    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    time.sleep(0.5)

    def patch(name: str) -> None:
        t0 = time.monotonic()
        obj = custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            ns,
            PLURAL,
            name,
            {"spec": {"workers": {"replicas": 3}}},
            _content_type="application/merge-patch+json",
        )
        with lock:
            patched[name] = (t0, int(obj["metadata"]["generation"]))

    names = [f"fleet-{i:04d}" for i in range(n)]
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(patch, names))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and thread.is_alive():
        with lock:
            if len(ready_again) == n:
                break
        time.sleep(POLL_S)
    stop.set()
    w.stop()
    obs, rdy = list(observed.values()), list(ready_again.values())
    return {
        "fleets": n,
        "observed": len(obs),
        "status_observed_p50_s": round(statistics.median(obs), 3) if obs else None,
        "status_observed_p99_s": round(percentile(obs, 0.99), 3) if obs else None,
        "status_observed_max_s": round(max(obs), 3) if obs else None,
        "ready_again": len(rdy),
        "ready_again_p50_s": round(statistics.median(rdy), 3) if rdy else None,
        "ready_again_p99_s": round(percentile(rdy, 0.99), 3) if rdy else None,
    }


# --- report ---------------------------------------------------------------------------------------


def format_table(results: list[SizeResult]) -> str:
    head = (
        f"{'N':>4} {'bulk apply s':>12} {'bulk ready s':>12} {'op applied s':>12} {'op ready s':>10} "
        f"{'x bulk':>7} {'child+status writes/fleet':>25} {'steady':>7} {'dry-runs/fleet':>14} {'RSS MiB':>8} "
        f"{'cpu ms/fleet':>12} {'spec->status p50/p99 s':>23}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        b, o, s = r.baseline, r.operator, r.operator.get("spec_change", {})
        lines.append(
            f"{r.n:>4} {b['apply_s']:>12.2f} {b['ready_s']:>12.2f} "
            f"{(o['children_applied_s'] or float('nan')):>12.2f} {o['ready_s']:>10.2f} "
            f"{r.ratio['ready']:>7.2f} "
            f"{o['child_writes_per_fleet_first']:>15.2f} + {o['status_writes_per_fleet_first']:>7.2f} "
            f"{o['api_writes_per_fleet_steady']:>7.2f} {o['dry_run_applies_per_fleet_first']:>14.2f} "
            f"{o['operator_rss_kib']['VmRSS'] / 1024:>8.1f} {o['operator_cpu_ms_per_fleet']:>12.1f} "
            f"{s.get('status_observed_p50_s')!s:>11}/{s.get('status_observed_p99_s')!s:<11}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="10,100", help="comma-separated fleet counts")
    parser.add_argument("--large", action="store_true", help="add N=500")
    parser.add_argument(
        "--kubeconfig", type=Path, default=None, help="use this plane instead of starting one"
    )
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="state dir of the dedicated plane"
    )
    parser.add_argument("--resync-seconds", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=1200.0, help="bound on each wait")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--profile", action="store_true", help="py-spy the operator while it converges"
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s] + ([500] if args.large else [])
    results: list[SizeResult] = []
    started = time.monotonic()
    load_before = subprocess.run(
        ["uptime"], capture_output=True, text=True, check=False
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="kvr-opbench-") as tmp_name:
        tmp = Path(tmp_name)
        state_dir = args.state_dir or tmp / "plane"
        with control_plane(
            kubeconfig=args.kubeconfig, state_dir=state_dir, nodes=nodes_for(sizes)
        ) as cluster:
            api = cluster.api_client()
            apply_crd(api)
            for n in sizes:
                result = SizeResult(n=n)
                result.baseline = run_baseline(api, n, tmp=tmp, timeout_s=args.timeout)
                print(f"N={n} baseline: {json.dumps(result.baseline)}", file=sys.stderr)
                result.operator = run_operator(
                    cluster,
                    api,
                    n,
                    log_dir=tmp,
                    resync_s=args.resync_seconds,
                    timeout_s=args.timeout,
                    profile_dir=HERE / "results" / "profiles" if args.profile else None,
                )
                print(f"N={n} operator: {json.dumps(result.operator)}", file=sys.stderr)
                result.ratio = {
                    "ready": result.operator["ready_s"] / result.baseline["ready_s"],
                    "applied": (result.operator["children_applied_s"] or float("nan"))
                    / result.baseline["apply_s"],
                }
                results.append(result)
            api.close()  # type: ignore[no-untyped-call]
    load_after = subprocess.run(
        ["uptime"], capture_output=True, text=True, check=False
    ).stdout.strip()
    goals = [
        {
            "n": r.n,
            "convergence_within_1.5x_of_bulk_apply": r.ratio["ready"] <= 1.5,
            "exactly_one_write_per_child": r.operator["child_writes_per_fleet_first"]
            == r.operator["children_per_fleet"],
            "status_writes_per_fleet": r.operator["status_writes_per_fleet_first"],
            "zero_writes_once_converged": r.operator["api_writes_per_fleet_steady"] == 0,
        }
        for r in results
    ]
    report = {
        "benchmark": "operator",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "uptime_before": load_before,
            "uptime_after": load_after,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "client_concurrency": CONCURRENCY,
        "resync_seconds": args.resync_seconds,
        "elapsed_s": round(time.monotonic() - started, 1),
        "results": [r.__dict__ for r in results],
        "goals": goals,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(results))
    for g in goals:
        print(json.dumps(g))
    print(f"\nwrote {args.out} ({report['elapsed_s']} s; {load_after})")


if __name__ == "__main__":
    main()

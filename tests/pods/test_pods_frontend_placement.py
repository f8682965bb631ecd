"""``router.placement: Frontend`` on the real node: each frontend pod places requests itself and
posts them straight to a worker pod, one Python hop before the engine.

The tier's fleet is switched to ``Frontend`` for this module and back to ``Router`` after it (the
other modules use the router path). The frontend Deployment rolls to pods whose command finds the
workers through the workers' headless Service (``--worker-dns``); a Claude Code conversation sent
to one of them is served by SGLang's real engine on one worker pod (the session stays where the
frontend pinned it: SGLang's ``cached_tokens`` grow on the second turn), the placement is counted
on the frontend pod's own ``/metrics``, and the router pod relays nothing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from pods_fixtures import (
    FLEET_NS,
    READY_S,
    cached_tokens,
    component_pods,
    condition,
    fleet_pods,
    fleet_service,
    get_json,
    kubectl,
    pod_metric,
    post,
    programmed_routes,
    traced,
    wait_service_routes,
)

from kvretention.replay.sessions import claude_code_session
from support.controlplane import Cluster, wait_until

FRONTEND_PORT = 8000
REQUESTS = "kvretention_router_requests_total"
"""The placement's request counter: the router's, served by whichever process places."""


def _placed_by(pod: dict[str, Any]) -> str:
    """``Frontend`` when the pod's frontend posts to workers itself, ``Router`` when it posts to
    the router."""
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "frontend"]
    argv = [*container.get("command", []), *container.get("args", [])]
    return "Frontend" if "--worker-dns" in argv else "Router"


def _rolled_to(cluster: Cluster, fleet: str, placement: str) -> list[dict[str, Any]]:
    """The frontend pods, once every one of them runs ``placement`` and is ready, every replaced
    pod is gone (not only going away: the next module lists the fleet's pods and must find none
    of this module's), and the fleet reports Ready and Converged; empty before."""
    kvrd = get_json(cluster, "kvrd", "-n", FLEET_NS, fleet)
    replicas = kvrd["spec"]["frontend"]["replicas"]
    pods = component_pods(cluster, fleet, "frontend")
    every = [
        p
        for p in fleet_pods(cluster, fleet)
        if p["metadata"]["labels"].get("app.kubernetes.io/component") == "frontend"
    ]
    ready = [
        p
        for p in pods
        if _placed_by(p) == placement
        and all(s["ready"] for s in p["status"].get("containerStatuses") or [{"ready": False}])
    ]
    converged = (
        condition(kvrd, "Ready").get("status") == "True"
        and condition(kvrd, "Progressing").get("reason") == "Converged"
    )
    return ready if converged and len(ready) == len(pods) == len(every) == replicas else []


def _place_in(cluster: Cluster, fleet: str, placement: str) -> list[dict[str, Any]]:
    patch = {"spec": {"router": {"placement": placement}}}
    kubectl(
        cluster, "-n", FLEET_NS, "patch", "kvrd", fleet, "--type=merge", "-p", json.dumps(patch)
    )
    pods: list[dict[str, Any]] = wait_until(
        f"the frontend pods rolled to placement {placement}",
        lambda: _rolled_to(cluster, fleet, placement),
        timeout_s=READY_S,
    )
    # The next module posts through the Service: it must route to these pods and no replaced one
    # (a replaced pod's address answers "No route to host").
    svc = fleet_service(cluster, fleet, "frontend")
    wait_service_routes(cluster, svc)
    ips = {p["status"]["podIP"] for p in pods}
    wait_until(
        f"Service {svc['metadata']['name']} routing to the rolled pods {sorted(ips)} only",
        lambda: {route.rpartition(":")[0] for route in programmed_routes(svc)} == ips,
        timeout_s=60,
    )
    return pods


@pytest.fixture(scope="module")
def placing_frontends(node_cluster: Cluster, fleet: str) -> Iterator[list[dict[str, Any]]]:
    """The fleet with ``placement: Frontend``: its ready frontend pods; ``Router`` again after."""
    try:
        yield _place_in(node_cluster, fleet, "Frontend")
    finally:
        _place_in(node_cluster, fleet, "Router")


def test_a_frontend_pod_places_a_session_on_one_worker_pod_without_the_router(
    node_cluster: Cluster, fleet: str, placing_frontends: list[dict[str, Any]]
) -> None:
    frontend = placing_frontends[0]
    url = f"http://{frontend['status']['podIP']}:{FRONTEND_PORT}/v1/messages"
    (router,) = component_pods(node_cluster, fleet, "router")
    relayed_before = pod_metric(router, REQUESTS)
    placed_before = pod_metric(frontend, REQUESTS)
    assert relayed_before is not None and placed_before is not None

    *_, first, second = claude_code_session(turns=2)
    answers = []
    for headers, body in (first, second):
        answer = post(url, {**body, "model": "claude-haiku-4-5"}, headers)
        assert answer["type"] == "message", answer
        answers.append(answer)
    served = [a["id"].partition("_")[2] for a in answers]
    records = wait_until(
        f"the workers' traces of {served}",
        lambda: (r := traced(node_cluster, fleet)) and all(rid in r for rid in served) and r,
        timeout_s=60,
    )
    assert all(records[rid]["outcome"] == "ok" for rid in served), [records[r] for r in served]
    pods = [records[rid]["served_by"] for rid in served]
    cached = [cached_tokens("claude-code", a) for a in answers]
    print(f"placed by {frontend['metadata']['name']}: {pods}, cached {cached}", file=sys.stderr)
    # The frontend pinned the session: both turns on one worker pod, the second reading the
    # first's prefix from SGLang's radix cache, with the hint the frontend made.
    assert len(set(pods)) == 1, pods
    assert cached[1] > 0 and cached[1] > cached[0], cached
    assert records[served[1]]["kv_hints_passed"] is True, records[served[1]]

    # The frontend pod counted both placements; the router pod took no request.
    assert pod_metric(frontend, REQUESTS) == placed_before + 2
    assert pod_metric(router, REQUESTS) == relayed_before

"""``router.placement``: the router places (two hops), or each frontend pod does (one hop). What the
builders render for each: the frontend's upstream flags (which its own CLI accepts), the router's
unchanged command, and the workers' NetworkPolicy letting the placer in."""

from __future__ import annotations

from typing import Any

import pytest
from fake_kube import load_example

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources import build_children
from kvretention.dataplane.frontend.cli import frontend_cmd
from kvretention.dataplane.frontend.config import REMEMBERED_CONVERSATIONS
from kvretention.ports import WORKER_PORT

NAME = "qwen"
WORKER_DNS = f"{NAME}-worker.ns.svc:{WORKER_PORT}"
"""The aggregated workers' headless Service: the same name the router's ``--worker-dns`` has."""


def _children(router: dict[str, Any]) -> list[dict[str, Any]]:
    body = load_example("aggregated")
    body["metadata"] = {**body["metadata"], "name": NAME, "namespace": "ns", "uid": "u-1"}
    body["spec"]["router"] = router
    return build_children(KvRetentionDeployment.from_k8s(body))


def _one(children: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [c for c in children if c["kind"] == kind and c["metadata"]["name"] == name]
    return found


def _command(children: list[dict[str, Any]], name: str) -> list[str]:
    deployment = _one(children, "Deployment", name)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["command"])


# (router spec, the frontend's upstream params; the router's placement flags)
CASES = [
    pytest.param(
        {},
        {"router_url": f"http://{NAME}-router:8001", "worker_dns": (), "kv_residency": False},
        id="router-places",
    ),
    pytest.param(
        {"placement": "Frontend"},
        {
            "router_url": None,
            "worker_dns": (WORKER_DNS,),
            "kv_residency": False,
            "policy": "cache-aware",
        },
        id="frontend-places",
    ),
    pytest.param(
        {"placement": "Frontend", "kvEvents": True, "policy": "LeastOutstanding"},
        {
            "router_url": None,
            "worker_dns": (WORKER_DNS,),
            "kv_residency": True,
            "policy": "least-outstanding",
        },
        id="frontend-places-by-residency",
    ),
]


@pytest.mark.parametrize(("router", "params"), CASES)
def test_the_frontend_goes_where_placement_says(
    router: dict[str, Any], params: dict[str, Any]
) -> None:
    children = _children(router)
    command = _command(children, f"{NAME}-frontend")
    parsed = frontend_cmd.make_context("frontend", command[2:]).params
    assert {k: parsed[k] for k in params} == params
    router_command = _command(children, f"{NAME}-router")
    policy = {"LeastOutstanding": "least-outstanding"}.get(router.get("policy", ""), "cache-aware")
    assert router_command[router_command.index("--policy") + 1] == policy
    assert ("--kv-residency" in router_command) == bool(router.get("kvEvents"))
    assert router_command[router_command.index("--worker-dns") + 1] == WORKER_DNS


@pytest.mark.parametrize(
    ("placement", "placers"),
    [("Router", ["router"]), ("Frontend", ["router", "frontend"])],
)
def test_the_workers_let_in_what_places(placement: str, placers: list[str]) -> None:
    policy = _one(_children({"placement": placement}), "NetworkPolicy", f"{NAME}-worker")
    rules = [
        rule
        for rule in policy["spec"]["ingress"]
        if rule.get("ports") == [{"port": WORKER_PORT, "protocol": "TCP"}]
    ]
    [rule] = rules
    [peer] = rule["from"]
    [components] = peer["podSelector"]["matchExpressions"]
    assert components["key"] == "app.kubernetes.io/component"
    assert sorted(components["values"]) == sorted(placers)


def test_placement_in_the_frontend_is_refused_for_a_disaggregated_fleet() -> None:
    body = load_example("disaggregated")
    body["spec"]["router"] = {"placement": "Frontend"}
    with pytest.raises(
        ValueError, match=r"router\.placement Frontend places on aggregated workers"
    ):
        KvRetentionDeployment.from_k8s(body)


@pytest.mark.parametrize("remembered", [None, 1, 500])
def test_the_frontend_remembers_as_many_conversations_as_the_spec_says(
    remembered: int | None,
) -> None:
    """Unset renders no flag (the frontend's own default, and fleets that never set it keep the
    command they had); set, the frontend's CLI reads the number back."""
    body = load_example("aggregated")
    body["metadata"] = {**body["metadata"], "name": NAME, "namespace": "ns", "uid": "u-1"}
    if remembered is not None:
        body["spec"].setdefault("frontend", {})["rememberedConversations"] = remembered
    command = _command(build_children(KvRetentionDeployment.from_k8s(body)), f"{NAME}-frontend")
    parsed = frontend_cmd.make_context("frontend", command[2:]).params
    assert parsed["remembered_conversations"] == (remembered or REMEMBERED_CONVERSATIONS)
    assert any(arg.startswith("--remembered-conversations") for arg in command) == (
        remembered is not None
    )

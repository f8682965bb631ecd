"""The router as the InferencePool's endpoint picker (every pool names it: v1 requires a picker):
what the builders render with a pool, and that nothing of it is rendered without one: the pool's
``endpointPickerRef``, the router's flags and ext-proc port, the headless Service over the frontend
pods, and the NetworkPolicies that let a Gateway reach both."""

from __future__ import annotations

from typing import Any

import pytest
from fake_kube import load_example

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources import build_children
from kvretention.dataplane.frontend.cli import frontend_cmd
from kvretention.dataplane.router.cli import router_cmd
from kvretention.dataplane.router.discovery import build_endpoints
from kvretention.ports import FRONTEND_PORT, ROUTER_EXT_PROC_PORT

NAME = "qwen"
ROUTER = f"{NAME}-router"
POOL = f"{NAME}-frontend"
PODS = f"{NAME}-frontend-pods"
GATEWAY = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}}}


def _children(
    pool: dict[str, Any] | None, *, clients: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    body = load_example("aggregated")
    body["metadata"] = {**body["metadata"], "name": NAME, "namespace": "ns", "uid": "u-1"}
    if pool is not None:
        body["spec"]["gateway"] = {"inferencePool": pool}
    if clients is not None:
        body["spec"]["networkPolicy"] = {"clientsFrom": clients}
    return build_children(KvRetentionDeployment.from_k8s(body))


def _of(children: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any] | None:
    found = [c for c in children if c["kind"] == kind and c["metadata"]["name"] == name]
    assert len(found) <= 1
    return found[0] if found else None


def _get(children: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = _of(children, kind, name)
    assert found is not None, f"{kind} {name} not rendered"
    return found


def _picker_child(
    children: list[dict[str, Any]], kind: str, name: str, mode: str | None
) -> dict[str, Any] | None:
    """``kind`` ``name``, which is rendered exactly when the router is the picker (``mode`` set)."""
    found = _of(children, kind, name)
    assert (found is not None) == (mode is not None), f"{kind} {name} with failureMode {mode}"
    return found


def _container(children: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (container,) = _get(children, "Deployment", name)["spec"]["template"]["spec"]["containers"]
    return container


def _flag(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


# (pool option, the failureMode rendered; None: no pool, so no picker)
CASES = [
    pytest.param(None, None, id="no-pool"),
    pytest.param({"enabled": False}, None, id="pool-off"),
    pytest.param(
        {"enabled": False, "endpointPicker": {"failureMode": "FailClose"}}, None, id="off-mode"
    ),
    pytest.param({"enabled": True}, "FailOpen", id="default"),
    pytest.param(
        {"enabled": True, "endpointPicker": {"failureMode": "FailClose"}},
        "FailClose",
        id="fail-close",
    ),
]


@pytest.mark.parametrize(("pool", "mode"), CASES)
def test_a_pool_names_the_router_as_its_picker(
    pool: dict[str, Any] | None, mode: str | None
) -> None:
    children = _children(pool)
    rendered = _picker_child(children, "InferencePool", POOL, mode)
    if rendered is None:
        return
    ref = rendered["spec"]["endpointPickerRef"]
    assert ref == {
        "group": "",
        "kind": "Service",
        "name": ROUTER,
        "port": {"number": ROUTER_EXT_PROC_PORT},
        "failureMode": mode,
    }
    # The ref's Service and port are ones the fleet renders, and the port reaches the container's.
    service = _get(children, "Service", ref["name"])
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    (served,) = [p for p in _container(children, ROUTER)["ports"] if p["name"] == "ext-proc"]
    assert port["targetPort"] == served["containerPort"] == ROUTER_EXT_PROC_PORT


@pytest.mark.parametrize(("pool", "mode"), CASES)
def test_the_router_serves_ext_proc_and_resolves_the_frontend_pods_only_as_the_picker(
    pool: dict[str, Any] | None, mode: str | None
) -> None:
    children = _children(pool)
    container = _container(children, ROUTER)
    command = container["command"]
    service_ports = {p["name"]: p for p in _get(children, "Service", ROUTER)["spec"]["ports"]}
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    if mode is None:
        assert "--ext-proc-port" not in command and "--endpoint-dns" not in command
        assert "ext-proc" not in service_ports and "ext-proc" not in container_ports
        return
    assert _flag(command, "--ext-proc-port") == str(ROUTER_EXT_PROC_PORT)
    assert _flag(command, "--endpoint-dns") == f"{PODS}.ns.svc:{FRONTEND_PORT}"
    assert container_ports["ext-proc"] == ROUTER_EXT_PROC_PORT
    assert service_ports["ext-proc"] == {
        "name": "ext-proc",
        "port": ROUTER_EXT_PROC_PORT,
        "targetPort": ROUTER_EXT_PROC_PORT,
        "protocol": "TCP",
        "appProtocol": "kubernetes.io/h2c",
    }
    # The router's own API and its probes stay where they were.
    assert service_ports["http"]["port"] == container_ports["http"]
    assert container["readinessProbe"]["httpGet"]["port"] == container_ports["http"]


@pytest.mark.parametrize(("pool", "mode"), CASES)
def test_a_headless_service_publishes_the_ready_frontend_pods_only_for_the_picker(
    pool: dict[str, Any] | None, mode: str | None
) -> None:
    children = _children(pool)
    pods = _picker_child(children, "Service", PODS, mode)
    if pods is None:
        return
    spec = pods["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is False
    assert spec["ports"] == [
        {"name": "http", "port": FRONTEND_PORT, "targetPort": FRONTEND_PORT, "protocol": "TCP"}
    ]
    # The very pods the frontend Service and the InferencePool select.
    frontend = _get(children, "Service", POOL)
    assert spec["selector"] == frontend["spec"]["selector"]
    assert (
        spec["selector"] == _get(children, "InferencePool", POOL)["spec"]["selector"]["matchLabels"]
    )
    (http,) = [p for p in _container(children, POOL)["ports"] if p["name"] == "http"]
    assert http["containerPort"] == FRONTEND_PORT
    (owner,) = pods["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "KvRetentionDeployment",
        NAME,
        "u-1",
        True,
    )
    # Applied before the pool that names the router, so the picker's DNS name exists first.
    names = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert names.index(("Service", PODS)) < names.index(("InferencePool", POOL))


def _rules(children: list[dict[str, Any]], name: str, port: int) -> list[dict[str, Any]]:
    """The ingress rules of ``name``'s NetworkPolicy that open ``port``."""
    policy = _get(children, "NetworkPolicy", name)
    return [
        r for r in policy["spec"]["ingress"] if any(p["port"] == port for p in r.get("ports", []))
    ]


def _router_peer(rule: dict[str, Any]) -> bool:
    return any(
        e["values"] == ["router"]
        for peer in rule.get("from", [])
        for e in peer.get("podSelector", {}).get("matchExpressions", [])
    )


@pytest.mark.parametrize(("pool", "mode"), CASES)
@pytest.mark.parametrize("clients", [None, [GATEWAY]], ids=["anyone", "clients-from"])
def test_network_policies_let_the_gateway_reach_the_picker_and_the_picker_the_frontends(
    pool: dict[str, Any] | None, mode: str | None, clients: list[dict[str, Any]] | None
) -> None:
    children = _children(pool, clients=clients)
    ext_proc = _rules(children, ROUTER, ROUTER_EXT_PROC_PORT)
    frontend = _rules(children, POOL, FRONTEND_PORT)
    from_router = [r for r in frontend if _router_peer(r)]
    from_clients = [r for r in frontend if not _router_peer(r)]
    # The frontend's port is for networkPolicy.clientsFrom (anyone when empty), picker or not.
    expected_clients = {"ports": [{"protocol": "TCP", "port": FRONTEND_PORT}]}
    if clients:
        expected_clients = {"from": clients, **expected_clients}
    assert from_clients == [expected_clients]
    if mode is None:
        assert ext_proc == [] and from_router == []
        return
    # The Gateway calls the picker as one of the frontend's clients: the same peers.
    expected = {"ports": [{"protocol": "TCP", "port": ROUTER_EXT_PROC_PORT}]}
    assert ext_proc == [{"from": clients, **expected} if clients else expected]
    # The router polls each frontend pod's /readyz before handing it out.
    (rule,) = from_router
    assert rule["ports"] == [{"protocol": "TCP", "port": FRONTEND_PORT}]


@pytest.mark.parametrize(("pool", "mode"), CASES)
def test_the_router_cli_takes_the_rendered_picker_flags(
    pool: dict[str, Any] | None, mode: str | None
) -> None:
    """The contract with ``kvretention router``: what is rendered parses, and the picker is on
    exactly when the operator renders it (the CLI refuses one flag without the other)."""
    children = _children(pool)
    command = _container(children, ROUTER)["command"]
    assert command[:2] == ["kvretention", "router"]
    params = router_cmd.make_context("router", command[2:]).params
    frontends = build_endpoints(static=params["endpoints"], dns=params["endpoint_dns"])
    if mode is None:
        assert params["ext_proc_port"] == 0 and frontends is None
        assert not any(a.startswith("--session-keys") for a in command)
        return
    assert params["ext_proc_port"] == ROUTER_EXT_PROC_PORT
    assert params["endpoint_dns"] == (f"{PODS}.ns.svc:{FRONTEND_PORT}",)
    assert frontends is not None
    # The picker reads a request's session where the frontends read it.
    frontend = _container(children, POOL)["command"]
    assert frontend[:2] == ["kvretention", "frontend"]
    keys = frontend_cmd.make_context("frontend", frontend[2:]).params["session_keys"]
    assert params["session_keys"] == keys and "x-session-id" in keys


@pytest.mark.parametrize("keys", [[], ["x-tenant-session"]], ids=["none", "one"])
def test_the_picker_takes_the_frontends_session_keys(keys: list[str]) -> None:
    body = load_example("aggregated")
    body["metadata"] = {**body["metadata"], "name": NAME, "namespace": "ns"}
    body["spec"]["router"] = {"sessionKeys": keys}
    body["spec"]["gateway"] = {"inferencePool": {"enabled": True}}
    children = build_children(KvRetentionDeployment.from_k8s(body))
    router = _container(children, ROUTER)["command"]
    frontend = _container(children, POOL)["command"]
    assert router_cmd.make_context("router", router[2:]).params["session_keys"] == tuple(keys)
    assert frontend_cmd.make_context("frontend", frontend[2:]).params["session_keys"] == tuple(keys)

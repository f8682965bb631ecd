"""The rendered NetworkPolicies' intent, as a table: which pod may reach which port.

A small evaluator of the NetworkPolicy semantics the builder uses (same-namespace podSelector with
matchLabels/matchExpressions, arbitrary peers, port lists, an empty ``from`` meaning anyone): a pod
no policy selects is open; a selected pod takes what any rule of any selecting policy allows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources import build_children

Labels = Mapping[str, str]
OUTSIDE: Labels = {"app": "somebody-else"}
MONITORING: Labels = {"app": "prometheus"}
OPERATOR: Labels = {
    "app.kubernetes.io/name": "kvretention-operator",
    "app.kubernetes.io/instance": "kvr",
    "app.kubernetes.io/component": "operator",
    "app.kubernetes.io/part-of": "kvretention",
}
"""The operator's pod as the chart labels it (tests/chart checks the chart still does)."""


def pod(component: str, instance: str = "f") -> Labels:
    return {
        "app.kubernetes.io/name": "kvretention",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
    }


def selects(selector: Mapping[str, Any], labels: Labels) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        assert expr["operator"] == "In", expr
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def peer_allows(peer: Mapping[str, Any], source: Labels) -> bool:
    if "podSelector" in peer and "namespaceSelector" not in peer:
        return selects(peer["podSelector"], source)
    if peer.get("namespaceSelector") == {} and "podSelector" in peer:  # any namespace
        return selects(peer["podSelector"], source)
    return source is MONITORING  # the only other peer the tests configure: metricsFrom


def allowed(policies: list[dict[str, Any]], source: Labels, dest: Labels, port: int) -> bool:
    selecting = [p for p in policies if selects(p["spec"]["podSelector"], dest)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"]["ingress"]:
            ports = [p["port"] for p in rule.get("ports") or []]
            peers = rule.get("from")
            if (not ports or port in ports) and (
                not peers or any(peer_allows(peer, source) for peer in peers)
            ):
                return True
    return False


def policies(**spec: Any) -> list[dict[str, Any]]:
    cr = KvRetentionDeployment.from_k8s(
        {
            "apiVersion": "kvretention.io/v1alpha1",
            "kind": "KvRetentionDeployment",
            "metadata": {"name": "f", "namespace": "ns"},
            "spec": {"model": {"name": "m", "path": "p"}, **spec},
        }
    )
    return [m for m in build_children(cr) if m["kind"] == "NetworkPolicy"]


PD = {"mode": "disaggregated", "prefill": {}, "decode": {}}
METRICS = {"metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]}
GATEWAY = {"clientsFrom": [{"podSelector": {"matchLabels": {"app": "gateway"}}}]}

# (case, spec, source, destination, port, allowed)
TABLE: list[tuple[str, dict[str, Any], Labels, Labels, int, bool]] = [
    ("clients reach the frontend", {}, OUTSIDE, pod("frontend"), 8000, True),
    ("nothing else on the frontend", {}, OUTSIDE, pod("frontend"), 9000, False),
    ("frontend -> router", {}, pod("frontend"), pod("router"), 8001, True),
    ("clients cannot skip the frontend", {}, OUTSIDE, pod("router"), 8001, False),
    ("workers cannot call the router", {}, pod("worker"), pod("router"), 8001, False),
    ("router -> workers", {}, pod("router"), pod("worker"), 8002, True),
    ("router only on the HTTP port", {}, pod("router"), pod("worker"), 12345, False),
    ("frontend cannot skip the router", {}, pod("frontend"), pod("worker"), 8002, False),
    ("clients cannot reach workers", {}, OUTSIDE, pod("worker"), 8002, False),
    ("workers <-> workers, any port", {}, pod("worker"), pod("worker"), 15000, True),
    ("another fleet's worker is out", {}, pod("worker", "g"), pod("worker"), 15000, False),
    ("workers -> master RPC", {}, pod("worker"), pod("mooncake-master"), 50051, True),
    ("workers -> master metadata", {}, pod("worker"), pod("mooncake-master"), 8080, True),
    ("the router cannot reach the master", {}, pod("router"), pod("mooncake-master"), 50051, False),
    ("clients cannot reach the master", {}, OUTSIDE, pod("mooncake-master"), 50051, False),
    ("master metrics closed by default", {}, MONITORING, pod("mooncake-master"), 9003, False),
    (
        "router -> prefill bootstrap",
        {"workers": PD},
        pod("router"),
        pod("worker-prefill"),
        8998,
        True,
    ),
    (
        "decode -> prefill (PD transfer)",
        {"workers": PD},
        pod("worker-decode"),
        pod("worker-prefill"),
        8998,
        True,
    ),
    (
        "prefill -> decode (PD transfer)",
        {"workers": PD},
        pod("worker-prefill"),
        pod("worker-decode"),
        17000,
        True,
    ),
    (
        "prefill -> master",
        {"workers": PD},
        pod("worker-prefill"),
        pod("mooncake-master"),
        50051,
        True,
    ),
    ("clients cannot reach prefill", {"workers": PD}, OUTSIDE, pod("worker-prefill"), 8998, False),
    *[
        # A scraper reaches the metrics port only, never the port serving /v1/generate (where
        # only the frontend's signed x-kvr-tenant is taken) nor the client port.
        (
            f"monitoring scrapes the {component}{when}",
            {"networkPolicy": policy},
            MONITORING,
            pod(component),
            9100,
            True,
        )
        for component in ("frontend", "router", "worker")
        for when, policy in (("", METRICS), (" with clientsFrom", {**METRICS, **GATEWAY}))
    ],
    (
        "monitoring cannot call workers",
        {"networkPolicy": METRICS},
        MONITORING,
        pod("worker"),
        8002,
        False,
    ),
    (
        "monitoring cannot call the router",
        {"networkPolicy": METRICS},
        MONITORING,
        pod("router"),
        8001,
        False,
    ),
    (
        "monitoring cannot call prefill workers",
        {"workers": PD, "networkPolicy": METRICS},
        MONITORING,
        pod("worker-prefill"),
        8002,
        False,
    ),
    (
        "monitoring is no client when clientsFrom is set",
        {"networkPolicy": {**METRICS, **GATEWAY}},
        MONITORING,
        pod("frontend"),
        8000,
        False,
    ),
    ("metrics ports closed by default", {}, MONITORING, pod("worker"), 9100, False),
    ("the operator reads the workers' metrics", {}, OPERATOR, pod("worker"), 9100, True),
    (
        "the operator reads a prefill worker's metrics",
        {"workers": PD},
        OPERATOR,
        pod("worker-prefill"),
        9100,
        True,
    ),
    ("the operator reads the master's metrics", {}, OPERATOR, pod("mooncake-master"), 9003, True),
    ("the operator cannot call a worker", {}, OPERATOR, pod("worker"), 8002, False),
    (
        "the operator cannot reach the master's RPC",
        {},
        OPERATOR,
        pod("mooncake-master"),
        50051,
        False,
    ),
    ("the operator does not read the router's metrics", {}, OPERATOR, pod("router"), 9100, False),
    (
        "a pod with only the operator's component label is not the operator",
        {},
        {"app.kubernetes.io/component": "operator"},
        pod("worker"),
        9100,
        False,
    ),
    (
        "monitoring scrapes the master",
        {"networkPolicy": METRICS},
        MONITORING,
        pod("mooncake-master"),
        9003,
        True,
    ),
    (
        "monitoring only its port",
        {"networkPolicy": METRICS},
        MONITORING,
        pod("mooncake-master"),
        50051,
        False,
    ),
    (
        "clientsFrom narrows the frontend",
        {"networkPolicy": {"clientsFrom": [{"podSelector": {"matchLabels": {"app": "gateway"}}}]}},
        OUTSIDE,
        pod("frontend"),
        8000,
        False,
    ),
    (
        "clientsFrom lets the gateway in",
        {"networkPolicy": {"clientsFrom": [{"podSelector": {"matchLabels": {"app": "gateway"}}}]}},
        {"app": "gateway"},
        pod("frontend"),
        8000,
        True,
    ),
    (
        "switched off: open",
        {"networkPolicy": {"enabled": False}},
        OUTSIDE,
        pod("mooncake-master"),
        50051,
        True,
    ),
]


@pytest.mark.parametrize(
    ("case", "spec", "source", "dest", "port", "expected"), TABLE, ids=[t[0] for t in TABLE]
)
def test_who_may_reach_what(
    case: str, spec: dict[str, Any], source: Labels, dest: Labels, port: int, expected: bool
) -> None:
    assert allowed(policies(**spec), source, dest, port) is expected, case


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, {"f-mooncake", "f-worker", "f-router", "f-frontend"}),
        ({"workers": PD}, {"f-mooncake", "f-prefill", "f-decode", "f-router", "f-frontend"}),
        (
            {"kvStore": {"mooncake": {"mode": "external", "external": {"masterAddress": "m:1"}}}},
            {"f-worker", "f-router", "f-frontend"},
        ),
        ({"networkPolicy": {"enabled": False}}, set()),
    ],
)
def test_one_policy_per_deployment(spec: dict[str, Any], expected: set[str]) -> None:
    assert {p["metadata"]["name"] for p in policies(**spec)} == expected
    for policy in policies(**spec):
        assert policy["spec"]["policyTypes"] == ["Ingress"]


@pytest.mark.parametrize("spec", [{}, {"workers": PD}], ids=["aggregated", "disaggregated"])
def test_the_scrapers_rule_names_only_the_metrics_port(spec: dict[str, Any]) -> None:
    """Every rule that lets ``metricsFrom`` in opens the metrics port and nothing else."""
    metrics_from = METRICS["metricsFrom"]
    rendered = policies(**spec, networkPolicy=METRICS)
    ports = {
        p["metadata"]["name"]: [port["port"] for port in rule["ports"]]
        for p in rendered
        for rule in p["spec"]["ingress"]
        if rule.get("from") == metrics_from
    }
    expected = {name: [9100] for name in {p["metadata"]["name"] for p in rendered}}
    assert ports == {**expected, "f-mooncake": [9003]}

"""``helm lint`` and ``helm template`` for the main value combinations: RBAC, args, security, CRDs."""

from __future__ import annotations

import re
from typing import Any

import pytest
from chartlib import (
    CHART,
    CRD_NAME,
    LEASE_NAME,
    RELEASE_NAMESPACE,
    Helm,
    flatten_values,
    metrics_toggle,
    one,
    operator_container,
    rules_as_set,
    select,
)

from kvretention.api.names import OPERATOR_POD_LABELS

# Exactly what the operator uses (the contract in docs/install.md); nothing more may appear.
RECONCILE_RULES = (
    {
        ("kvretention.io", "kvretentiondeployments", "*", verb)
        for verb in ("get", "list", "watch", "patch")
    }
    | {
        ("kvretention.io", "kvretentiondeployments/status", "*", verb)
        for verb in ("get", "patch", "update")
    }
    | {
        ("apps", "deployments", "*", verb)
        for verb in ("get", "list", "watch", "create", "patch", "update", "delete")
    }
    | {
        ("", resource, "*", verb)
        for resource in ("services", "configmaps")
        for verb in ("get", "list", "watch", "create", "patch", "update", "delete")
    }
    | {
        (group, resource, "*", verb)
        for group, resource in (
            ("policy", "poddisruptionbudgets"),
            ("networking.k8s.io", "networkpolicies"),
            ("autoscaling", "horizontalpodautoscalers"),
            ("leaderworkerset.x-k8s.io", "leaderworkersets"),
            ("inference.networking.k8s.io", "inferencepools"),
        )
        for verb in ("get", "list", "watch", "create", "patch", "update", "delete")
    }
    | {("", "pods", "*", verb) for verb in ("get", "list", "watch")}
    | {("", "secrets", "*", verb) for verb in ("get", "create")}
    | {
        (group, "events", "*", verb)
        for group in ("", "events.k8s.io")
        for verb in ("create", "patch")
    }
)
LEASE_RULES = {
    ("coordination.k8s.io", "leases", "*", "create"),
    ("coordination.k8s.io", "leases", LEASE_NAME, "get"),
    ("coordination.k8s.io", "leases", LEASE_NAME, "update"),
}
FLEET_NAME_LABEL = "kvretention"  # app.kubernetes.io/name on every child the operator creates


def test_helm_lint_strict(helm: Helm) -> None:
    done = helm.run("lint", str(CHART), "--strict")
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize(
    "values",
    [
        {"watch": {"clusterWide": True}},
        {"metrics": {"serviceMonitor": {"enabled": True}}},
        {"crds": {"enabled": False}},
        {"operator": {"replicas": 3}},
        {"namespace": {"create": True}},
    ],
    ids=["cluster-wide", "service-monitor", "no-crds", "ha", "namespace"],
)
def test_helm_lint_combinations(helm: Helm, values: dict[str, Any]) -> None:
    args = [f"--set-json={k}" for k in flatten_values(values)]
    helm.run("lint", str(CHART), "--strict", *args)


@pytest.mark.parametrize(
    ("values", "role_namespaces", "cluster_wide", "namespace_args"),
    [
        ({}, [RELEASE_NAMESPACE], False, [f"--namespace={RELEASE_NAMESPACE}"]),
        (
            {"watch": {"namespaces": ["team-a", "team-b", "team-a"]}},
            ["team-a", "team-b"],
            False,
            ["--namespace=team-a", "--namespace=team-b"],
        ),
        ({"watch": {"clusterWide": True}}, [], True, ["--all-namespaces"]),
    ],
    ids=["release-namespace", "listed-namespaces", "cluster-wide"],
)
def test_rbac_scope_matches_watch(
    helm: Helm,
    values: dict[str, Any],
    role_namespaces: list[str],
    cluster_wide: bool,
    namespace_args: list[str],
) -> None:
    docs = helm.template(values)
    sa = one(docs, "ServiceAccount")
    subject = {
        "kind": "ServiceAccount",
        "name": sa["metadata"]["name"],
        "namespace": RELEASE_NAMESPACE,
    }

    reconcile_roles = [
        r for r in select(docs, "Role") if not r["metadata"]["name"].endswith("-leader-election")
    ]
    assert sorted(r["metadata"]["namespace"] for r in reconcile_roles) == role_namespaces
    for role in reconcile_roles:
        assert rules_as_set(role["rules"]) == RECONCILE_RULES
    bindings = [
        b
        for b in select(docs, "RoleBinding")
        if b["roleRef"]["name"] in {r["metadata"]["name"] for r in reconcile_roles}
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == role_namespaces
    assert all(b["subjects"] == [subject] for b in bindings)

    cluster_roles = select(docs, "ClusterRole")
    cluster_bindings = select(docs, "ClusterRoleBinding")
    assert len(cluster_roles) == len(cluster_bindings) == (1 if cluster_wide else 0)
    if cluster_wide:
        assert rules_as_set(cluster_roles[0]["rules"]) == RECONCILE_RULES
        assert cluster_bindings[0]["subjects"] == [subject]
        assert cluster_bindings[0]["roleRef"]["name"] == cluster_roles[0]["metadata"]["name"]

    # The Lease: always a Role in the release namespace, never cluster-wide.
    lease_role = one(docs, "Role", f"{sa['metadata']['name']}-leader-election")
    assert lease_role["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert rules_as_set(lease_role["rules"]) == LEASE_RULES
    lease_binding = one(docs, "RoleBinding", f"{sa['metadata']['name']}-leader-election")
    assert lease_binding["subjects"] == [subject]

    args = operator_container(docs)["args"]
    assert [a for a in args if a.startswith(("--namespace", "--all-namespaces"))] == namespace_args


def test_operator_deployment_defaults(helm: Helm) -> None:
    docs = helm.template()
    deploy = one(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    container = operator_container(docs)
    assert deploy["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert deploy["spec"]["replicas"] == 1
    assert "strategy" not in deploy["spec"]  # RollingUpdate: the Lease keeps one active
    assert container["command"] == ["kvretention"]
    assert container["args"] == [
        "operator",
        f"--namespace={RELEASE_NAMESPACE}",
        "--health-port=8080",
        "--metrics-port=9090",
        "--leader-elect",
        "--lease-duration-seconds=15",
        "--resync-seconds=60",
    ]
    assert container["image"] == "ghcr.io/kvretention/operator:0.1.0"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert container["resources"]["requests"] == {"cpu": "50m", "memory": "128Mi"}
    # The operator's selector can never match a fleet's pods.
    selector = deploy["spec"]["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/name"] != FLEET_NAME_LABEL
    assert selector.items() <= deploy["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize(
    "values", [{}, {"nameOverride": "kvr", "fullnameOverride": "x", "podLabels": {"a": "b"}}]
)
def test_operator_pods_carry_the_labels_fleet_network_policies_let_in(
    helm: Helm, values: dict[str, Any]
) -> None:
    """A fleet's NetworkPolicies let the operator's pods read the workers' and the master's
    metrics ports by these labels; a name override must not drop them."""
    labels = one(helm.template(values), "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert OPERATOR_POD_LABELS.items() <= labels.items()


def test_secure_pod_defaults(helm: Helm) -> None:
    docs = helm.template()
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = operator_container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # A read-only root still needs a scratch /tmp.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_scheduling_and_resources_pass_through(helm: Helm) -> None:
    values = {
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                            ]
                        }
                    ]
                }
            }
        },
        "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "priorityClassName": "system-cluster-critical",
        "image": {"digest": "sha256:" + "a" * 64},
        "operator": {"extraArgs": ["--verbose"], "resyncSeconds": 30},
    }
    docs = helm.template(values)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = operator_container(docs)
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["affinity"] == values["affinity"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert container["resources"] == values["resources"]
    assert container["image"] == "ghcr.io/kvretention/operator@sha256:" + "a" * 64
    assert container["args"][-2:] == ["--resync-seconds=30", "--verbose"]


def test_no_leader_election_means_one_replica_and_recreate(helm: Helm) -> None:
    docs = helm.template({"operator": {"leaderElection": {"enabled": False}}})
    deploy = one(docs, "Deployment")
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    args = operator_container(docs)["args"]
    assert "--no-leader-elect" in args
    assert not any(a.startswith("--lease-duration-seconds") for a in args)
    error = helm.template_error({"operator": {"replicas": 2, "leaderElection": {"enabled": False}}})
    assert "leaderElection" in error


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"operator": {"replicas": "two"}}, "replicas"),
        ({"operator": {"replicaz": 1}}, "replicaz"),
        ({"watch": {"namespaces": ["Not_A_Namespace"]}}, "namespaces"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"metrics": {"port": 70000}}, "port"),
        ({"watch": {"clusterWide": True, "namespaces": ["a"]}}, "clusterWide"),
        (
            {"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}},
            "metrics.service.enabled",
        ),
    ],
    ids=[
        "type",
        "unknown-key",
        "bad-namespace",
        "enum",
        "port-range",
        "both-scopes",
        "monitor-needs-service",
    ],
)
def test_bad_values_are_rejected(helm: Helm, values: dict[str, Any], fragment: str) -> None:
    assert fragment in helm.template_error(values)


@pytest.mark.parametrize("enabled", [False, True])
def test_service_monitor_toggle(helm: Helm, enabled: bool) -> None:
    docs = metrics_toggle(helm, "serviceMonitor", enabled=enabled)
    monitors = select(docs, "ServiceMonitor")
    assert len(monitors) == int(enabled)
    service = one(docs, "Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    if enabled:
        monitor = monitors[0]
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "prom"
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
        selected = monitor["spec"]["selector"]["matchLabels"]
        assert selected.items() <= service["metadata"]["labels"].items()


@pytest.mark.parametrize(
    ("values", "present", "keep"),
    [
        ({}, True, True),
        ({"crds": {"keep": False}}, True, False),
        ({"crds": {"enabled": False}}, False, False),
    ],
    ids=["default-keep", "no-keep", "disabled"],
)
def test_crd_toggles(helm: Helm, values: dict[str, Any], present: bool, keep: bool) -> None:
    crds = select(helm.template(values), "CustomResourceDefinition")
    assert [c["metadata"]["name"] for c in crds] == ([CRD_NAME] if present else [])
    if present:
        annotations = crds[0]["metadata"].get("annotations") or {}
        assert (annotations.get("helm.sh/resource-policy") == "keep") is keep


def test_namespace_object_only_on_request(helm: Helm) -> None:
    assert select(helm.template(), "Namespace") == []
    ns = one(helm.template({"namespace": {"create": True}}), "Namespace")
    assert ns["metadata"]["name"] == RELEASE_NAMESPACE
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_every_value_is_documented() -> None:
    """Each key in values.yaml has a ``# --`` comment above it or above an enclosing key."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    undocumented: list[str] = []
    for index, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][\w.-]*):", line)
        if match is None:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        comments = []
        back = index - 1
        while back >= 0 and lines[back].strip().startswith("#"):
            comments.append(lines[back].strip())
            back -= 1
        documented = any(c.startswith("# --") for c in comments) or any(d for _, d in stack)
        is_parent = (
            index + 1 < len(lines)
            and (
                len(lines[index + 1]) - len(lines[index + 1].lstrip()) > indent
                and not lines[index + 1].lstrip().startswith("- ")
            )
            and line.rstrip().endswith(":")
        )
        if not documented and not is_parent:
            undocumented.append(line.strip())
        stack.append((indent, documented))
    assert undocumented == []


def test_lease_duration_is_passed_through(helm: Helm) -> None:
    docs = helm.template({"operator": {"leaderElection": {"leaseDurationSeconds": 6}}})
    assert "--lease-duration-seconds=6" in operator_container(docs)["args"]
    error = helm.template_error({"operator": {"leaderElection": {"leaseDurationSeconds": 1}}})
    assert "leaseDurationSeconds" in error

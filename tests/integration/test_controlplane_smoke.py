"""The local control plane behaves like a real one where mocks would not.

Each test exercises one API-server or controller behaviour the operator depends on: controllers,
scheduler and kwok making a Deployment Ready, garbage collection, CEL admission, server-side apply
ownership and status subresource isolation.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from support.controlplane import ApplyCrd, Cluster, wait_until
from support.crd_bodies import crd_body
from support.kube_reads import exists

pytestmark = pytest.mark.integration

GROUP = "smoke.kvretention.dev"
PLURAL = "widgets"
CEL_MESSAGE = "spec.minReplicas must not exceed spec.replicas"

WIDGET_CRD = crd_body(
    GROUP,
    {"plural": PLURAL, "singular": "widget", "kind": "Widget"},
    spec={
        "type": "object",
        "properties": {"replicas": {"type": "integer"}, "minReplicas": {"type": "integer"}},
        "x-kubernetes-validations": [
            {
                "rule": "!has(self.minReplicas) || self.minReplicas <= self.replicas",
                "message": CEL_MESSAGE,
            }
        ],
    },
    status={"type": "object", "properties": {"observedReplicas": {"type": "integer"}}},
)


def widget(name: str, **spec: int) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def error_body(err: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(err.body)
    return body


def test_kubectl_is_ours_and_sees_a_ready_fake_node(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["clientVersion"]["gitVersion"] == "v1.37.2"
    assert version["serverVersion"]["gitVersion"] == "v1.37.2"
    ready = cluster.kubectl(
        "get", "nodes", "-o", "jsonpath={.items[*].status.conditions[?(@.type=='Ready')].status}"
    ).stdout
    assert ready.split() == ["True"]


def test_deployment_reaches_ready_replicas(k8s: client.ApiClient, namespace: str) -> None:
    labels = {"app": "smoke"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "smoke"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                # kwok never pulls images; the name only has to be valid.
                "spec": {"containers": [{"name": "app", "image": "registry.invalid/smoke:1"}]},
            },
        },
    }
    apps = client.AppsV1Api(k8s)
    apps.create_namespaced_deployment(namespace, deployment)

    def ready_replicas() -> bool:
        status = apps.read_namespaced_deployment_status("smoke", namespace).status
        return (status.ready_replicas or 0) == 2

    wait_until("Deployment smoke readyReplicas=2", ready_replicas)
    pods = client.CoreV1Api(k8s).list_namespaced_pod(namespace, label_selector="app=smoke").items
    assert len(pods) == 2
    assert all(pod.spec.node_name == "kvr-node-0" and pod.status.pod_ip for pod in pods)


def test_deleting_an_owner_garbage_collects_what_it_owns(
    k8s: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(k8s)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner.metadata.uid,
    }
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "owned", "ownerReferences": [reference]}}
    )
    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    wait_until(
        "the garbage collector to delete ConfigMap owned",
        lambda: not exists(lambda: core.read_namespaced_config_map("owned", namespace)),
    )


def test_cel_rule_rejects_a_bad_object_at_admission(
    k8s: client.ApiClient, namespace: str, apply_crd: ApplyCrd
) -> None:
    apply_crd(WIDGET_CRD)
    custom = client.CustomObjectsApi(k8s)
    with pytest.raises(ApiException) as rejected:
        custom.create_namespaced_custom_object(
            GROUP, "v1", namespace, PLURAL, widget("bad", replicas=1, minReplicas=3)
        )
    assert rejected.value.status == 422
    assert CEL_MESSAGE in error_body(rejected.value)["message"]
    accepted = custom.create_namespaced_custom_object(
        GROUP, "v1", namespace, PLURAL, widget("good", replicas=3, minReplicas=1)
    )
    assert accepted["spec"] == {"replicas": 3, "minReplicas": 1}


def test_server_side_apply_reports_a_conflict_between_managers(
    k8s: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(k8s)

    def apply(manager: str, value: str, *, force: bool = False) -> Any:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared"},
                "data": {"mode": value}}  # fmt: skip
        return core.patch_namespaced_config_map(
            "shared", namespace, body, field_manager=manager, force=force,
            _content_type="application/apply-patch+yaml",
        )  # fmt: skip

    apply("alpha", "a")
    with pytest.raises(ApiException) as conflict:
        apply("beta", "b")
    assert conflict.value.status == 409
    assert error_body(conflict.value)["reason"] == "Conflict"
    assert "alpha" in error_body(conflict.value)["message"]
    forced = apply("beta", "b", force=True)
    assert forced.data == {"mode": "b"}
    owners = {
        entry.manager for entry in forced.metadata.managed_fields if entry.operation == "Apply"
    }
    assert owners == {"beta"}


def test_status_subresource_write_does_not_change_spec(
    k8s: client.ApiClient, namespace: str, apply_crd: ApplyCrd
) -> None:
    apply_crd(WIDGET_CRD)
    custom = client.CustomObjectsApi(k8s)
    custom.create_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, widget("w", replicas=1))
    patch = {"spec": {"replicas": 5}, "status": {"observedReplicas": 1}}
    custom.patch_namespaced_custom_object_status(GROUP, "v1", namespace, PLURAL, "w", patch)
    stored = custom.get_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, "w")
    assert stored["status"] == {"observedReplicas": 1}
    assert stored["spec"] == {"replicas": 1}
    # ...and the main resource ignores status, so neither side can clobber the other.
    custom.patch_namespaced_custom_object(
        GROUP, "v1", namespace, PLURAL, "w", {"status": {"observedReplicas": 9}}
    )
    stored = custom.get_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, "w")
    assert stored["status"] == {"observedReplicas": 1}

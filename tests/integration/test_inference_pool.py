"""``spec.gateway.inferencePool`` on the real control plane: without the InferencePool CRD status
names it and the rest of the fleet is created; once a CRD for ``inferencepools.inference.
networking.k8s.io`` v1 is installed (no edit, no operator restart) the operator creates the
InferencePool, owned by the fleet and selecting its frontend pods, and the condition follows what a
Gateway writes in the pool's ``status.parents``; the pool names the router in its
``endpointPickerRef`` (v1 requires a picker) beside the headless Service ``<name>-frontend-pods``,
the picker's failure mode follows the spec, and turning the pool off removes both.

The CRD is a minimal structural one written here (the fields the operator sets, and a status
subresource), not the Gateway API Inference Extension's own. The module deletes it first and
last: CRDs are cluster-wide, and the session's plane is shared by the modules.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from operator_fixtures import GOOD_REPORT, Fleets, Operator, fleets_fixture, load_example
from operator_fixtures import operator_fixture as _operator_fixture

from support.controlplane import ApplyCrd, wait_until
from support.inference_pool_crd import CRD_NAME, GROUP, inference_pool_crd
from support.kube_reads import exists, read_or_none

pytestmark = pytest.mark.integration

CONDITION = "InferencePoolAccepted"
CRD = inference_pool_crd()


def _delete_crd(k8s: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(k8s)
    try:
        ext.delete_custom_resource_definition(CRD_NAME)
    except ApiException as exc:
        if exc.status != 404:
            raise

    wait_until(
        f"CRD {CRD_NAME} deleted",
        lambda: not exists(lambda: ext.read_custom_resource_definition(CRD_NAME)),
        timeout_s=60,
    )


@pytest.fixture(scope="module", autouse=True)
def no_crd(k8s: client.ApiClient) -> Iterator[None]:
    """No InferencePool API when the operator starts; none left for the modules after this one."""
    _delete_crd(k8s)
    try:
        yield
    finally:
        _delete_crd(k8s)


operator = _operator_fixture(resync_s=30.0)
fleets = fleets_fixture()


def _pool(fleets: Fleets, name: str) -> dict[str, Any] | None:
    return read_or_none(
        lambda: fleets.custom.get_namespaced_custom_object(
            GROUP, "v1", fleets.ns, "inferencepools", f"{name}-frontend"
        )
    )


def test_the_pool_waits_for_its_crd_then_selects_the_frontend_and_reports_its_gateway(
    operator: Operator, fleets: Fleets, apply_crd: ApplyCrd
) -> None:
    name = "gw"
    body = load_example("aggregated", name=name)
    body["spec"]["gateway"] = {"inferencePool": {"enabled": True}}
    created = fleets.create(body)
    # The API server defaults the picker's failure mode: open, every frontend serves everything.
    assert created["spec"]["gateway"] == {
        "inferencePool": {"enabled": True, "endpointPicker": {"failureMode": "FailOpen"}}
    }

    missing = fleets.wait_condition(
        name, CONDITION, "False", reason="InferencePoolCrdMissing", timeout_s=120
    )
    assert CRD_NAME in missing["message"]
    assert f"InferencePool {name}-frontend cannot be created" in missing["message"]
    # The Event is posted after the condition is written: wait for it, do not sample once.
    wait_until(
        "a Warning Event InferencePoolCrdMissing",
        lambda: any(
            e.reason == "InferencePoolCrdMissing" and e.type == "Warning"
            for e in fleets.core.list_namespaced_event(fleets.ns).items
        ),
        timeout_s=30,
    )
    # The rest of the fleet is created and becomes Ready: the pool is not part of Ready.
    children = fleets.children(name)
    assert ("Deployment", f"{name}-frontend") in children
    assert ("Service", f"{name}-frontend") in children
    fleets.wait_condition(name, "Ready", "True", timeout_s=120, reporting=GOOD_REPORT)

    apply_crd(CRD)
    pool = wait_until(f"InferencePool {name}-frontend", lambda: _pool(fleets, name), timeout_s=150)
    fleet_uid = fleets.get(name)["metadata"]["uid"]
    (owner,) = pool["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "KvRetentionDeployment",
        fleet_uid,
        True,
    )
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["appProtocol"] == "http"
    # The router is the pool's endpoint picker: the pool names its ext-proc port.
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": f"{name}-router",
        "port": {"number": 9004},
        "failureMode": "FailOpen",
    }
    # It selects exactly the frontend's pods: those its Deployment runs, and no other pod.
    labels = pool["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    selected = {
        p.metadata.name
        for p in fleets.core.list_namespaced_pod(fleets.ns, label_selector=selector).items
    }
    frontend = fleets.deployment(f"{name}-frontend")
    wanted = ",".join(
        f"{k}={v}" for k, v in sorted(frontend["spec"]["selector"]["matchLabels"].items())
    )
    frontend_pods = {
        p.metadata.name
        for p in fleets.core.list_namespaced_pod(fleets.ns, label_selector=wanted).items
    }
    assert selected and selected == frontend_pods
    fleets.wait_condition(name, CONDITION, "Unknown", reason="NoParent", timeout_s=60)

    # A Gateway takes the pool up: the condition follows its status.parents.
    fleets.custom.patch_namespaced_custom_object_status(
        GROUP,
        "v1",
        fleets.ns,
        "inferencepools",
        f"{name}-frontend",
        {
            "status": {
                "parents": [
                    {
                        "parentRef": {"name": "inference-gateway", "namespace": fleets.ns},
                        "conditions": [
                            {
                                "type": "Accepted",
                                "status": "True",
                                "reason": "SupportedByParent",
                                "message": "",
                                "lastTransitionTime": "2026-01-01T00:00:00Z",
                            }
                        ],
                    }
                ]
            }
        },
    )
    accepted = fleets.wait_condition(name, CONDITION, "True", reason="Accepted", timeout_s=60)
    assert f"Gateway {fleets.ns}/inference-gateway" in accepted["message"]
    assert fleets.conditions(name)["Ready"]["status"] == "True"

    # A headless Service publishes the frontend pods the router picks among.
    pods = wait_until(
        f"Service {name}-frontend-pods",
        lambda: fleets.children(name).get(("Service", f"{name}-frontend-pods")),
        timeout_s=60,
    )
    assert pods["spec"]["clusterIP"] == "None"
    assert pods["spec"].get("publishNotReadyAddresses", False) is False  # false is omitted
    assert pods["spec"]["selector"] == labels
    assert [p["port"] for p in pods["spec"]["ports"]] == [8000]
    assert pods["metadata"]["ownerReferences"][0]["uid"] == fleet_uid
    router = fleets.children(name)[("Service", f"{name}-router")]
    (ext_proc,) = [p for p in router["spec"]["ports"] if p["name"] == "ext-proc"]
    assert (ext_proc["port"], ext_proc["appProtocol"]) == (9004, "kubernetes.io/h2c")
    command = fleets.deployment(f"{name}-router")["spec"]["template"]["spec"]["containers"][0][
        "command"
    ]
    endpoint_dns = command[command.index("--endpoint-dns") + 1]
    assert endpoint_dns == f"{name}-frontend-pods.{fleets.ns}.svc:8000"

    # The picker's failure mode follows the spec; the Gateway's verdict still stands.
    close = {"enabled": True, "endpointPicker": {"failureMode": "FailClose"}}
    fleets.patch_spec(name, {"gateway": {"inferencePool": close}})
    wait_until(
        "the InferencePool's picker fails closed",
        lambda: (
            (p := _pool(fleets, name)) is not None
            and p["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
        ),
        timeout_s=60,
    )
    assert fleets.conditions(name)[CONDITION]["status"] == "True"

    # The pool turned off: it and the headless Service are deleted, the router stops picking.
    fleets.patch_spec(name, {"gateway": {"inferencePool": {"enabled": False}}})
    wait_until(
        f"Service {name}-frontend-pods and InferencePool {name}-frontend deleted",
        lambda: (
            ("Service", f"{name}-frontend-pods") not in fleets.children(name)
            and _pool(fleets, name) is None
        ),
        timeout_s=60,
    )
    router = fleets.children(name)[("Service", f"{name}-router")]
    assert [p["name"] for p in router["spec"]["ports"]] == ["http"]

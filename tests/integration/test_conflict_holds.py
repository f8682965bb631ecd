"""A conflict stops what depends on it, on the real plane: with a foreign Service ``<fleet>-frontend``
and a foreign ConfigMap ``<fleet>-mooncake-config`` in the namespace, the operator writes neither,
creates no pod that mounts the foreign ConfigMap, advertises no foreign endpoint, and says in status
which child waits; once the foreign objects are gone it creates what waited.

One operator (all namespaces, no leader election, a 3 s resync) serves the module; kwok makes pods
Ready.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client
from operator_fixtures import Fleets, Operator, fleets_fixture, load_example, operator_fixture

from support.controlplane import wait_until

pytestmark = pytest.mark.integration

RESYNC_S = 3.0

operator = operator_fixture(resync_s=RESYNC_S)
fleets = fleets_fixture()


def _foreign_service(fleets: Fleets, name: str) -> client.V1Service:
    return fleets.core.create_namespaced_service(
        fleets.ns,
        client.V1Service(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1ServiceSpec(
                selector={"app": "someone-else"}, ports=[client.V1ServicePort(port=8000)]
            ),
        ),
    )


def _foreign_configmap(fleets: Fleets, name: str) -> client.V1ConfigMap:
    return fleets.core.create_namespaced_config_map(
        fleets.ns,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=name),
            data={"mooncake.json": '{"master_server_address": "attacker.example:50051"}'},
        ),
    )


def _pods_mounting(fleets: Fleets, configmap: str) -> list[str]:
    """Every pod of the namespace with a volume from ``configmap``."""
    return [
        pod.metadata.name
        for pod in fleets.core.list_namespaced_pod(fleets.ns).items
        for volume in pod.spec.volumes or []
        if volume.config_map is not None and volume.config_map.name == configmap
    ]


def _ready(fleets: Fleets, name: str) -> dict[str, Any]:
    return fleets.conditions(name)["Ready"]


def test_a_foreign_service_and_configmap_hold_what_would_use_them(
    operator: Operator, fleets: Fleets
) -> None:
    service = _foreign_service(fleets, "held-frontend")
    configmap = _foreign_configmap(fleets, "held-mooncake-config")
    fleets.create(load_example("aggregated", name="held"))

    ready = fleets.wait_condition("held", "Ready", "False", reason="ChildConflict")
    for said in (
        f"Service {fleets.ns}/held-frontend already exists",
        f"ConfigMap {fleets.ns}/held-mooncake-config already exists",
        "Deployment held-worker is not created or updated until the conflict is gone: it mounts "
        "ConfigMap held-mooncake-config, which is taken",
    ):
        assert said in ready["message"], ready["message"]
    workers = fleets.wait_condition("held", "WorkersReady", "False", reason="ChildConflict")
    assert "Deployment held-worker is not created" in workers["message"]

    # What does not depend on the foreign objects is created and becomes ready.
    fleets.wait_condition("held", "RouterReady", "True")
    fleets.wait_condition("held", "FrontendReady", "True")
    time.sleep(2 * RESYNC_S)  # resyncs change nothing
    children = fleets.children("held")
    assert ("Deployment", "held-worker") not in children
    assert ("ConfigMap", "held-mooncake-config") not in children  # not ours: not labelled
    assert _pods_mounting(fleets, "held-mooncake-config") == []
    assert "endpoint" not in fleets.get("held")["status"]
    for kind, read, name, theirs in (
        ("Service", fleets.core.read_namespaced_service, "held-frontend", service),
        ("ConfigMap", fleets.core.read_namespaced_config_map, "held-mooncake-config", configmap),
    ):
        after = read(name, fleets.ns)
        assert after.metadata.resource_version == theirs.metadata.resource_version, kind
        assert not after.metadata.owner_references, kind

    # The ConfigMap gone: the operator makes its own, then the workers that mount it.
    fleets.core.delete_namespaced_config_map("held-mooncake-config", fleets.ns)
    wait_until(
        "the worker Deployment", lambda: ("Deployment", "held-worker") in fleets.children("held")
    )
    ours = fleets.core.read_namespaced_config_map("held-mooncake-config", fleets.ns)
    assert [ref.name for ref in ours.metadata.owner_references or []] == ["held"]
    assert "attacker.example" not in ours.data["mooncake.json"]
    assert "endpoint" not in fleets.get("held")["status"]  # the Service is still someone else's

    # The Service gone: the endpoint is the fleet's own.
    fleets.core.delete_namespaced_service("held-frontend", fleets.ns)
    endpoint = f"http://held-frontend.{fleets.ns}.svc:8000"
    wait_until("status.endpoint", lambda: fleets.get("held")["status"].get("endpoint") == endpoint)
    wait_until("no ChildConflict", lambda: _ready(fleets, "held")["reason"] != "ChildConflict")


def test_a_foreign_master_service_holds_the_config_and_the_workers(
    operator: Operator, fleets: Fleets
) -> None:
    """The ConfigMap addresses the master's Service by name: with that name taken, the ConfigMap
    is held, and so is every worker that mounts it."""
    _foreign_service(fleets, "chain-mooncake")
    fleets.create(load_example("aggregated", name="chain"))
    ready = fleets.wait_condition("chain", "Ready", "False", reason="ChildConflict")
    assert (
        "ConfigMap chain-mooncake-config is not created or updated until the conflict is gone: "
        "it addresses Service chain-mooncake, which is taken" in ready["message"]
    )
    assert (
        "Deployment chain-worker is not created or updated until the conflict is gone: it mounts "
        "ConfigMap chain-mooncake-config, which addresses Service chain-mooncake, which is taken"
        in ready["message"]
    )
    fleets.wait_condition("chain", "RouterReady", "True")
    time.sleep(2 * RESYNC_S)
    children = fleets.children("chain")
    assert ("ConfigMap", "chain-mooncake-config") not in children
    assert ("Deployment", "chain-worker") not in children
    assert ("Deployment", "chain-mooncake") in children  # the master itself names no Service

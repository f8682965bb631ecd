"""Autoscaled worker pools on the real control plane: the API server accepts the HPAs the operator
renders, the kube-controller-manager's HPA controller reads each one's target through the pool
workload's own scale subresource (whose selector is the pool's pods) and drives its replicas, and
the operator leaves those replicas to it.

No metrics API is served here, so the controller cannot read the External metric: it says so in
the HPA's ScalingActive condition (naming the metric it asked for). Below minReplicas it scales
anyway, without a metric, which is how this test sees it drive the pool.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client
from operator_fixtures import Fleets, Operator, fleets_fixture, load_example, operator_fixture

from kvretention.controller.resources.autoscaling import EXTERNAL_METRIC
from support.controlplane import wait_until
from support.kube_reads import exists

pytestmark = pytest.mark.integration

RESYNC_S = 3.0
HPA_TIMEOUT_S = 120.0
"""The HPA controller syncs every 15 s; a few rounds at most."""

operator = operator_fixture(resync_s=RESYNC_S)
fleets = fleets_fixture()


def hpa(fleets: Fleets, name: str) -> dict[str, Any]:
    api = client.AutoscalingV2Api(fleets.apps.api_client)
    raw: dict[str, Any] = api.api_client.sanitize_for_serialization(
        api.read_namespaced_horizontal_pod_autoscaler(name, fleets.ns)
    )
    return raw


def hpa_condition(fleets: Fleets, name: str, type_: str) -> dict[str, Any] | None:
    conditions = (hpa(fleets, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), None)


def scale(fleets: Fleets, deployment: str) -> dict[str, Any]:
    raw: dict[str, Any] = fleets.apps.api_client.sanitize_for_serialization(
        fleets.apps.read_namespaced_deployment_scale(deployment, fleets.ns)
    )
    return raw


def pool_pod_labels(fleets: Fleets, deployment: str) -> dict[str, str]:
    labels: dict[str, str] = fleets.deployment(deployment)["spec"]["template"]["metadata"]["labels"]
    return labels


def replicas_owners(fleets: Fleets, deployment: str) -> set[str]:
    """Field managers that own the Deployment's ``spec.replicas``."""
    raw = fleets.apps.api_client.sanitize_for_serialization(
        fleets.apps.read_namespaced_deployment(deployment, fleets.ns)
    )
    owners = set()
    for entry in raw["metadata"].get("managedFields") or []:
        if "f:replicas" in (entry.get("fieldsV1") or {}).get("f:spec", {}):
            owners.add(entry["manager"])
    return owners


def check_pool_is_driven_by_its_hpa(
    fleets: Fleets, *, pool: str, role: str, fleet: str, min_replicas: int
) -> None:
    # Accepted by the API server, and aimed at the pool's own workload.
    wait_until(f"HPA {pool}", lambda: _exists(fleets, pool), timeout_s=60)
    spec = hpa(fleets, pool)["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": pool}
    (metric,) = spec["metrics"]
    assert metric["external"]["metric"]["name"] == EXTERNAL_METRIC
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {"fleet": fleet, "role": role}

    # The controller read the target's scale subresource ...
    able = wait_until(
        f"{pool} AbleToScale",
        lambda: _true(hpa_condition(fleets, pool, "AbleToScale")),
        timeout_s=HPA_TIMEOUT_S,
    )
    assert able["reason"] in {"SucceededGetScale", "SucceededRescale", "ReadyForNewScale"}, able
    # ... whose selector is exactly the pool's pods,
    selector = dict(
        part.split("=", 1) for part in scale(fleets, pool)["status"]["selector"].split(",")
    )
    pods = pool_pod_labels(fleets, pool)
    assert selector.items() <= pods.items()
    assert selector["app.kubernetes.io/component"] == pods["app.kubernetes.io/component"]
    # and it drives the pool: below minReplicas it scales up with no metric at all.
    wait_until(
        f"{pool} at {min_replicas} replicas",
        lambda: fleets.deployment(pool)["spec"]["replicas"] == min_replicas,
        timeout_s=HPA_TIMEOUT_S,
    )
    inactive = wait_until(
        f"{pool} ScalingActive False",
        lambda: _false(hpa_condition(fleets, pool, "ScalingActive")),
        timeout_s=HPA_TIMEOUT_S,
    )
    assert EXTERNAL_METRIC in inactive["message"], inactive
    # The operator's apply leaves an autoscaled pool's replicas to the HPA.
    assert "kvretention-operator" not in replicas_owners(fleets, pool)


def _exists(fleets: Fleets, name: str) -> bool:
    return exists(lambda: hpa(fleets, name))


def _true(cond: dict[str, Any] | None) -> dict[str, Any] | None:
    return cond if cond is not None and cond["status"] == "True" else None


def _false(cond: dict[str, Any] | None) -> dict[str, Any] | None:
    return cond if cond is not None and cond["status"] == "False" else None


def test_an_autoscaled_aggregated_pool_is_scaled_by_its_hpa(
    operator: Operator, fleets: Fleets
) -> None:
    body = load_example("aggregated", name="scaled")
    body["spec"]["workers"]["autoscaling"] = {"minReplicas": 2, "maxReplicas": 4, "target": 8}
    body["spec"]["workers"]["replicas"] = 1
    fleets.create(body)
    check_pool_is_driven_by_its_hpa(
        fleets, pool="scaled-worker", role="aggregated", fleet="scaled", min_replicas=2
    )
    # Resyncs later the operator still leaves the HPA's count alone.
    time.sleep(2 * RESYNC_S)
    assert fleets.deployment("scaled-worker")["spec"]["replicas"] == 2
    # The fleet's status counts the pool as the HPA sized it.
    fleets.wait_condition("scaled", "WorkersReady", "True")
    pools = fleets.get("scaled")["status"]["workers"]["pools"]
    assert [(p["name"], p["ready"]) for p in pools] == [("scaled-worker", 2)]
    # Converged: the HPA's own writes (its status, the scale) start no write loop.
    writes = operator.writes()
    time.sleep(3 * RESYNC_S)
    assert operator.writes() == writes
    # The fleet's conditions are on the operator's /metrics for the alerts and the dashboard.
    exported = {
        key
        for key in operator.metrics()
        if key.startswith("kvretention_operator_fleet_condition{") and 'fleet="scaled"' in key
    }
    assert any('type="Ready"' in key for key in exported), exported


def test_prefill_and_decode_pools_get_an_hpa_each(operator: Operator, fleets: Fleets) -> None:
    body = load_example("disaggregated", name="pd")
    workers = body["spec"]["workers"]
    workers["autoscaling"] = {"minReplicas": 1, "maxReplicas": 3, "target": 4}
    workers["prefill"] = {**workers.get("prefill", {}), "replicas": 1}
    workers["prefill"]["autoscaling"] = {"minReplicas": 2, "maxReplicas": 3, "target": 16}
    fleets.create(body)
    check_pool_is_driven_by_its_hpa(
        fleets, pool="pd-prefill", role="prefill", fleet="pd", min_replicas=2
    )
    decode = hpa(fleets, "pd-decode")["spec"]
    assert decode["scaleTargetRef"]["name"] == "pd-decode"
    assert decode["metrics"][0]["external"]["metric"]["selector"]["matchLabels"]["role"] == "decode"


def test_removing_autoscaling_deletes_the_hpa_and_gives_replicas_back(
    operator: Operator, fleets: Fleets
) -> None:
    body = load_example("aggregated", name="unscaled")
    body["spec"]["workers"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2, "target": 8}
    fleets.create(body)
    wait_until("HPA unscaled-worker", lambda: _exists(fleets, "unscaled-worker"), timeout_s=60)
    fleets.patch_spec("unscaled", {"workers": {"autoscaling": None, "replicas": 3}})
    wait_until("HPA deleted", lambda: not _exists(fleets, "unscaled-worker"), timeout_s=60)
    wait_until(
        "replicas from the spec again",
        lambda: fleets.deployment("unscaled-worker")["spec"]["replicas"] == 3,
        timeout_s=60,
    )
    assert "kvretention-operator" in replicas_owners(fleets, "unscaled-worker")

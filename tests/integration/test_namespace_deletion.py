"""Deleting a namespace with fleets in it, on the real plane (kube-controller-manager's namespace
controller deletes its content): the operator makes no re-create attempt into the terminating
namespace, and no line it logs is a failure without the API server's reason.
"""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from operator_fixtures import Fleets, Operator, load_example, operator_fixture

from support.controlplane import wait_until
from support.kube_reads import exists

pytestmark = pytest.mark.integration

RESYNC_S = 3.0

operator = operator_fixture(resync_s=RESYNC_S)


def _gone(core: client.CoreV1Api, name: str) -> bool:
    return not exists(lambda: core.read_namespace(name))


def test_a_deleted_namespace_gets_no_recreate_attempts(
    operator: Operator, k8s: client.ApiClient
) -> None:
    core = client.CoreV1Api(k8s)
    ns = f"doomed-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        _delete_with_fleets(operator, core, Fleets(k8s, ns))
    finally:
        with contextlib.suppress(ApiException):  # a failure before the deletion: free the GPUs
            core.delete_namespace(ns)


def _delete_with_fleets(operator: Operator, core: client.CoreV1Api, fleets: Fleets) -> None:
    ns = fleets.ns
    wait_until("ServiceAccount default", lambda: core.list_namespaced_service_account(ns).items)
    for name in ("one", "two"):
        fleets.create(load_example("aggregated", name=name))
    for name in ("one", "two"):
        wait_until(f"{name}'s children", lambda n=name: len(fleets.children(n)) >= 8)
        fleets.wait_condition(name, "RouterReady", "True")

    before = len(operator.process.log())
    core.delete_namespace(ns)
    wait_until(f"namespace {ns} deleted", lambda: _gone(core, ns), timeout_s=120)
    time.sleep(2 * RESYNC_S)  # a resync after: nothing left to reconcile
    log = operator.process.log()[before:]
    lines = [line for line in log.splitlines() if ns in line]
    applied = [line for line in lines if "applied " in line]
    assert applied == [], "\n".join(applied)  # nothing re-created
    # Every warning about the namespace names the API server's reason, never a bare path.
    warnings = [line for line in lines if "WARNING" in line or "failed" in line]
    assert all("HTTP " in line for line in warnings), "\n".join(warnings)
    terminating = [line for line in lines if "is being deleted" in line]
    assert len(terminating) <= 2, "\n".join(terminating)  # once per fleet, at most

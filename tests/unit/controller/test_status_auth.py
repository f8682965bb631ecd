"""FrontendReady names a missing auth Secret: the frontend pods wait in ContainerCreating, which the
kubelet reports without a reason, so the Secret the API server does not have is the reason."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from kvretention.controller.conditions import PROBLEM_REASONS, Verdict, check_auth_secrets
from kvretention.controller.status import Fleet, Observed, compute_status

NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
STARTING = Verdict("False", "PodsStarting", "Deployment f-frontend: 0/1 ready; ContainerCreating")
READY = Verdict("True", "PodsReady", "all pods ready (f-frontend 1/1)")
SCALED = Verdict("False", "ScaledToZero", "Deployment f-frontend is scaled to 0 replicas")
PULL = Verdict("False", "ImagePullBackOff", "Deployment f-frontend: back-off pulling image")


@pytest.mark.parametrize(
    ("frontend", "missing", "reason", "fragments"),
    [
        (STARTING, [], "PodsStarting", ["ContainerCreating"]),
        (
            STARTING,
            ["keys"],
            "AuthSecretMissing",
            ["Secret keys not found in namespace ns", "secretRefs", "ContainerCreating"],
        ),
        (
            PULL,
            ["b", "a"],
            "AuthSecretMissing",
            ["Secrets a, b not found in namespace ns", "cannot mount them"],
        ),
        # Ready pods mounted it before it went: nothing is held up (Progressing tells a stuck
        # rollout); scaled to zero is on purpose.
        (READY, ["keys"], "PodsReady", ["all pods ready"]),
        (SCALED, ["keys"], "ScaledToZero", ["scaled to 0"]),
    ],
    ids=["none-missing", "missing", "two-missing", "ready", "scaled-to-zero"],
)
def test_check_auth_secrets(
    frontend: Verdict, missing: list[str], reason: str, fragments: list[str]
) -> None:
    got = check_auth_secrets(frontend, missing, namespace="ns")
    assert got.reason == reason
    assert (got.status == "True") is (frontend.status == "True")
    for fragment in fragments:
        assert fragment in got.message


def _deployment(name: str, component: str) -> dict[str, Any]:
    label = "app.kubernetes.io/component"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {label: component}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {label: component}}},
    }


def test_a_missing_secret_is_why_the_fleet_is_not_ready() -> None:
    desired = [
        _deployment("f-frontend", "frontend"),
        _deployment("f-router", "router"),
        _deployment("f-worker", "worker"),
    ]
    ready = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1}
    live = {
        m["metadata"]["name"]: {
            "metadata": {"name": m["metadata"]["name"], "generation": 1},
            "status": {
                **({"replicas": 1, "updatedReplicas": 1} if "frontend" in name else ready),
                "observedGeneration": 1,
            },
        }
        for m in desired
        for name in [m["metadata"]["name"]]
    }
    fleet = Fleet(
        name="f",
        namespace="ns",
        generation=1,
        hints_required=False,
        desired=desired,
        kvstore_external="m:50051",
    )
    observed = Observed(deployments=live, missing_secrets=["keys"])
    status = compute_status(fleet, observed, previous=None, now=NOW)
    got = {c["type"]: c for c in status["conditions"]}
    assert (got["FrontendReady"]["status"], got["FrontendReady"]["reason"]) == (
        "False",
        "AuthSecretMissing",
    )
    assert "Secret keys not found in namespace ns" in got["FrontendReady"]["message"]
    assert (got["Ready"]["status"], got["Ready"]["reason"]) == ("False", "AuthSecretMissing")
    assert "AuthSecretMissing" in PROBLEM_REASONS
    without = compute_status(fleet, Observed(deployments=live), previous=None, now=NOW)
    assert {c["type"]: c["reason"] for c in without["conditions"]}["FrontendReady"] != (
        "AuthSecretMissing"
    )

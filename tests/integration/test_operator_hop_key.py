"""The fleet's hop key on the real control plane: an auth fleet gets its ``<fleet>-hop-key``
Secret once (owned by the fleet, a random key), mounted in the frontend, router and worker pods;
reconciles after a spec change and several resyncs leave it exactly as it was (never rewritten),
and it goes with the fleet."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from kubernetes import client
from operator_fixtures import Fleets, Operator, fleets_fixture, load_example, operator_fixture

from kvretention.common.hop_auth import parse_hop_keys
from support.controlplane import wait_until
from support.kube_reads import read_or_none

pytestmark = pytest.mark.integration

RESYNC_S = 2.0
operator = operator_fixture(resync_s=RESYNC_S)
fleets = fleets_fixture()


def secret_or_none(fleets: Fleets, name: str) -> client.V1Secret | None:
    return read_or_none(lambda: fleets.core.read_namespaced_secret(name, fleets.ns))


def create_auth_fleet(fleets: Fleets, name: str, *, keys: str) -> dict[str, Any]:
    """Fleet ``name`` (the aggregated example) with frontend auth on, its tenants' keys in the
    Secret ``keys`` (made first)."""
    fleets.create_secret(keys, {"team-a": "sk-team-a-3f9c1e0b7d2a4c68\n"})
    body = load_example("aggregated", name=name)
    body["spec"].setdefault("frontend", {})["auth"] = {"secretRefs": [{"name": keys}]}
    return fleets.create(body)


def wait_for_hop_key(fleets: Fleets, fleet: str) -> client.V1Secret:
    """The hop-key Secret the operator makes for ``fleet``, once it exists."""
    name = f"{fleet}-hop-key"
    return wait_until(f"Secret {name}", lambda: secret_or_none(fleets, name), timeout_s=90)


def test_the_hop_key_is_made_once_kept_across_reconciles_and_goes_with_the_fleet(
    operator: Operator, fleets: Fleets
) -> None:
    fleet = create_auth_fleet(fleets, "hop", keys="fleet-keys")

    secret = wait_for_hop_key(fleets, "hop")
    (owner,) = secret.metadata.owner_references
    assert (owner.kind, owner.uid, owner.controller) == (
        "KvRetentionDeployment",
        fleet["metadata"]["uid"],
        True,
    )
    key = secret.data["hop-key"]
    assert len(parse_hop_keys(base64.b64decode(key).decode()).keys[0]) == 64

    for deployment in ("hop-frontend", "hop-router", "hop-worker"):
        pod = wait_until(
            f"Deployment {deployment}",
            lambda d=deployment: fleets.children("hop").get(("Deployment", d)),
            timeout_s=60,
        )["spec"]["template"]["spec"]
        assert {"hop-hop-key"} == {
            v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == "hop-key"
        }, deployment
        assert "--hop-key-file=/etc/kvretention/hop/hop-key" in pod["containers"][0]["command"]

    # A spec change the operator applies, then resyncs: the key stays, unwritten.
    fleets.patch_spec("hop", {"router": {"replicas": 2}})
    wait_until(
        "hop-router at 2 replicas",
        lambda: fleets.deployment("hop-router")["spec"]["replicas"] == 2,
        timeout_s=60,
    )
    reconciles = operator.metric_sum("kvretention_operator_reconciles_total")
    wait_until(
        "three more reconciles",
        lambda: operator.metric_sum("kvretention_operator_reconciles_total") >= reconciles + 3,
        timeout_s=60,
    )
    kept = fleets.core.read_namespaced_secret("hop-hop-key", fleets.ns)
    assert kept.data["hop-key"] == key
    assert kept.metadata.resource_version == secret.metadata.resource_version

    fleets.delete("hop")
    wait_until(
        "the hop key garbage-collected with its fleet",
        lambda: secret_or_none(fleets, "hop-hop-key") is None,
        timeout_s=90,
    )


def test_turning_auth_off_deletes_the_hop_key_the_fleet_made(
    operator: Operator, fleets: Fleets
) -> None:
    create_auth_fleet(fleets, "hopoff", keys="fleet-keys-off")
    wait_for_hop_key(fleets, "hopoff")
    fleets.patch_spec("hopoff", {"frontend": {"auth": None}})
    wait_until(
        "the hop key deleted once no pod reads it",
        lambda: secret_or_none(fleets, "hopoff-hop-key") is None,
        timeout_s=90,
    )
    pod = fleets.deployment("hopoff-frontend")["spec"]["template"]["spec"]
    assert not [v for v in pod.get("volumes") or [] if v["name"] == "hop-key"]

"""``spec.frontend.auth`` on the real control plane: the API server keeps the field (the CRD has
it), refuses a malformed one, and the operator's frontend Deployment mounts the named Secret
read-only (no subPath, so the kubelet updates the keys in place) and points the frontend at it."""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException
from operator_fixtures import Fleets, Operator, fleets_fixture, load_example, operator_fixture

from support.controlplane import wait_until
from support.kube_reads import read_or_none

pytestmark = pytest.mark.integration

operator = operator_fixture(resync_s=3.0)
fleets = fleets_fixture()

AUTH = {
    "secretRefs": [{"name": "fleet-keys"}],
    "limits": {"requestsPerSecond": 5, "concurrency": 8},
    "tenants": [{"name": "team-a", "requestsPerSecond": 50}],
    "pinShare": 0.5,
}


def test_the_frontend_deployment_mounts_the_auth_secret(operator: Operator, fleets: Fleets) -> None:
    fleets.create_secret("fleet-keys", {"team-a": "sk-team-a-3f9c1e0b7d2a4c68\n"})
    body = load_example("aggregated", name="authed")
    body["spec"].setdefault("frontend", {})["auth"] = AUTH
    created = fleets.create(body)
    assert created["spec"]["frontend"]["auth"]["secretRefs"] == [{"name": "fleet-keys"}]
    assert created["spec"]["frontend"]["auth"]["pinShare"] == 0.5

    deployment = wait_until(
        "authed-frontend Deployment",
        lambda: read_or_none(lambda: fleets.deployment("authed-frontend")),
        timeout_s=90,
    )
    pod = deployment["spec"]["template"]["spec"]  # type: ignore[index]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    (name,) = [
        n for n, v in volumes.items() if v.get("secret", {}).get("secretName") == "fleet-keys"
    ]
    assert mounts[name]["mountPath"] == "/etc/kvretention/auth/fleet-keys"
    assert mounts[name]["readOnly"] is True
    assert "subPath" not in mounts[name]
    command = container["command"]
    assert "--auth-keys-dir=/etc/kvretention/auth/fleet-keys" in command
    assert "--tenant-limits=rps=5,concurrency=8" in command
    assert "--tenant-limit=team-a:rps=50" in command
    config = wait_until(
        "authed-mooncake-config",
        lambda: fleets.children("authed").get(("ConfigMap", "authed-mooncake-config")),
        timeout_s=30,
    )
    assert '"tenant_pin_share": 0.5' in "".join(config["data"].values())


@pytest.mark.parametrize(
    ("auth", "field"),
    [
        pytest.param({"secretRefs": []}, "secretRefs", id="no-secret"),
        pytest.param(
            {"secretRefs": [{"name": "k"}], "tenants": [{"name": "Team A"}]}, "name", id="tenant"
        ),
        pytest.param({"secretRefs": [{"name": "k"}], "pinShare": 0}, "pinShare", id="share"),
        pytest.param(
            {"secretRefs": [{"name": "k"}, {"name": "k"}]}, "secretRefs", id="duplicate-secret"
        ),
    ],
)
def test_the_api_server_refuses_a_malformed_auth(
    fleets: Fleets, auth: dict[str, object], field: str
) -> None:
    body = load_example("aggregated", name="bad-auth")
    body["spec"].setdefault("frontend", {})["auth"] = auth
    with pytest.raises(ApiException) as caught:
        fleets.create(body)
    assert caught.value.status == 422
    assert field in str(caught.value.body)

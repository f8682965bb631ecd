"""``spec.frontend.auth`` rendered: the Secrets mounted into the frontend, its flags, the tenants'
share of the pin budget in the workers' Mooncake config, and the spec's own checks."""

from __future__ import annotations

from typing import Any

import pytest

from kvretention.api.models import KvRetentionDeployment, SpecError
from kvretention.controller.resources import build_children, build_mooncake_client_config
from kvretention.controller.resources.checks import check_spec
from kvretention.controller.resources.hop_key import HOP_KEY_VOLUME
from kvretention.dataplane.frontend.limits import parse_limits, parse_tenant_limits

Body = dict[str, Any]


def body(auth: Body | None) -> Body:
    spec: Body = {"model": {"name": "m", "path": "org/m"}}
    if auth is not None:
        spec["frontend"] = {"auth": auth}
    return {
        "apiVersion": "kvretention.io/v1alpha1",
        "kind": "KvRetentionDeployment",
        "metadata": {"name": "f", "namespace": "ns", "uid": "u-1"},
        "spec": spec,
    }


def frontend_pod(auth: Body | None) -> Body:
    cr = KvRetentionDeployment.from_k8s(body(auth))
    (deployment,) = [
        m
        for m in build_children(cr)
        if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-frontend")
    ]
    pod: Body = deployment["spec"]["template"]["spec"]
    return pod


TWO_SECRETS = {
    "secretRefs": [{"name": "team-keys"}, {"name": "partner-keys"}],
    "limits": {"requestsPerSecond": 2.5, "concurrency": 8},
    "tenants": [{"name": "team-a", "requestsPerSecond": 50, "burst": 100}],
    "pinShare": 0.25,
}

CASES = [
    pytest.param(None, [], [], [], id="auth-off"),
    pytest.param(
        {"secretRefs": [{"name": "keys"}]},
        [{"name": "auth-keys-0", "secret": {"secretName": "keys", "defaultMode": 0o444}}],
        [{"name": "auth-keys-0", "mountPath": "/etc/kvretention/auth/keys", "readOnly": True}],
        ["--auth-keys-dir=/etc/kvretention/auth/keys"],
        id="one-secret-no-limits",
    ),
    pytest.param(
        TWO_SECRETS,
        [
            {"name": "auth-keys-0", "secret": {"secretName": "team-keys", "defaultMode": 0o444}},
            {"name": "auth-keys-1", "secret": {"secretName": "partner-keys", "defaultMode": 0o444}},
        ],
        [
            {
                "name": "auth-keys-0",
                "mountPath": "/etc/kvretention/auth/team-keys",
                "readOnly": True,
            },
            {
                "name": "auth-keys-1",
                "mountPath": "/etc/kvretention/auth/partner-keys",
                "readOnly": True,
            },
        ],
        [
            "--auth-keys-dir=/etc/kvretention/auth/team-keys",
            "--auth-keys-dir=/etc/kvretention/auth/partner-keys",
            "--tenant-limits=rps=2.5,concurrency=8",
            "--tenant-limit=team-a:rps=50,burst=100",
        ],
        id="two-secrets-limits-overrides",
    ),
]


@pytest.mark.parametrize(("auth", "volumes", "mounts", "args"), CASES)
def test_the_frontend_mounts_each_secret_and_gets_its_flags(
    auth: Body | None, volumes: list[Body], mounts: list[Body], args: list[str]
) -> None:
    pod = frontend_pod(auth)
    (container,) = pod["containers"]
    # the hop key's volume is test_hop_key_secret.py's
    assert [v for v in pod.get("volumes", []) if v["name"] != HOP_KEY_VOLUME] == volumes
    assert [m for m in container.get("volumeMounts", []) if m["name"] != HOP_KEY_VOLUME] == mounts
    command = container["command"]
    assert [a for a in command if a.startswith(("--auth", "--tenant"))] == args
    # what the operator renders, the frontend's own parsers accept as the spec says
    defaults = [a.partition("=")[2] for a in command if a.startswith("--tenant-limits=")]
    overrides = tuple(a.partition("=")[2] for a in command if a.startswith("--tenant-limit="))
    if auth is not None:
        spec_limits = auth.get("limits", {})
        parsed = parse_limits(defaults[0] if defaults else "")
        assert parsed.requests_per_second == spec_limits.get("requestsPerSecond")
        assert parsed.concurrency == spec_limits.get("concurrency")
        tenants = parse_tenant_limits(overrides)
        assert sorted(tenants) == sorted(t["name"] for t in auth.get("tenants", []))


@pytest.mark.parametrize(
    ("auth", "share"),
    [(None, None), ({"secretRefs": [{"name": "k"}]}, None), (TWO_SECRETS, 0.25)],
)
def test_the_tenants_pin_share_reaches_the_workers_mooncake_config(
    auth: Body | None, share: float | None
) -> None:
    cr = KvRetentionDeployment.from_k8s(body(auth))
    section = build_mooncake_client_config(cr.spec, master_host="m")["kvretention"]
    assert section.get("tenant_pin_share") == share


@pytest.mark.parametrize(
    ("auth", "problem"),
    [
        pytest.param({"secretRefs": []}, "secretRefs", id="no-secret"),
        pytest.param(
            {"secretRefs": [{"name": "k"}], "tenants": [{"name": "Team A"}]},
            "tenants",
            id="tenant-not-a-name",
        ),
        pytest.param(
            {"secretRefs": [{"name": "k"}], "limits": {"requestsPerSecond": 0}},
            "requestsPerSecond",
            id="zero-rate",
        ),
        pytest.param({"secretRefs": [{"name": "k"}], "pinShare": 1.5}, "pinShare", id="share"),
    ],
)
def test_a_malformed_auth_spec_is_refused(auth: Body, problem: str) -> None:
    with pytest.raises(SpecError, match=problem):
        KvRetentionDeployment.from_k8s(body(auth))


@pytest.mark.parametrize(
    ("pod", "problems"),
    [
        pytest.param({"volumes": [{"name": "cache", "emptyDir": {}}]}, [], id="other-volume"),
        pytest.param(
            {"volumes": [{"name": "auth-keys-0", "emptyDir": {}}]},
            ["spec.frontend.pod.volumes[0]: the name auth-keys-0 is used by the operator"],
            id="volume-name",
        ),
        pytest.param(
            {"volumeMounts": [{"name": "v", "mountPath": "/etc/kvretention/"}]},
            [
                "spec.frontend.pod.volumeMounts[0]: /etc/kvretention/ would hide the auth "
                "Secrets mounted under /etc/kvretention/auth"
            ],
            id="mount-over",
        ),
        pytest.param(
            {"volumeMounts": [{"name": "v", "mountPath": "/etc/kvretention/auth/keys/x"}]},
            [
                "spec.frontend.pod.volumeMounts[0]: /etc/kvretention/auth/keys/x would hide "
                "the auth Secrets mounted under /etc/kvretention/auth"
            ],
            id="mount-under",
        ),
        pytest.param(
            {"volumeMounts": [{"name": "v", "mountPath": "/etc/kvretention-other"}]},
            [],
            id="a-sibling",
        ),
    ],
)
def test_frontend_pod_options_may_not_take_the_auth_mounts(pod: Body, problems: list[str]) -> None:
    spec = body({"secretRefs": [{"name": "keys"}]})
    spec["spec"]["frontend"]["pod"] = pod
    assert check_spec(KvRetentionDeployment.from_k8s(spec)) == problems
    without = body(None)
    without["spec"]["frontend"] = {"pod": pod}
    assert check_spec(KvRetentionDeployment.from_k8s(without)) == []


@pytest.mark.parametrize(
    ("replicas", "default", "override"),
    [
        (1, "rps=30,burst=12,concurrency=9", "team-a:rps=5"),
        (3, "rps=10,burst=4,concurrency=3", "team-a:rps=1.66667"),
        (4, "rps=7.5,burst=3,concurrency=2", "team-a:rps=1.25"),
        (20, "rps=1.5,burst=1,concurrency=1", "team-a:rps=0.25"),  # each pod keeps at least 1
        (0, "rps=30,burst=12,concurrency=9", "team-a:rps=5"),  # no pods: nothing to divide
    ],
    ids=["one-pod", "three", "four", "more-pods-than-the-limit", "scaled-to-zero"],
)
def test_each_frontend_pod_gets_its_share_of_the_fleet_wide_limits(
    replicas: int, default: str, override: str
) -> None:
    """The frontend pods share no state: N pods each enforcing the spec's limits would let a
    tenant through N times over, so each pod gets the spec's limits divided by N."""
    auth = {
        "secretRefs": [{"name": "keys"}],
        "limits": {"requestsPerSecond": 30, "burst": 12, "concurrency": 9},
        "tenants": [{"name": "team-a", "requestsPerSecond": 5}],
    }
    cr_body = body(auth)
    cr_body["spec"]["frontend"]["replicas"] = replicas
    cr = KvRetentionDeployment.from_k8s(cr_body)
    (deployment,) = [
        m
        for m in build_children(cr)
        if m["kind"] == "Deployment" and m["metadata"]["name"].endswith("-frontend")
    ]
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert f"--tenant-limits={default}" in command
    assert f"--tenant-limit={override}" in command
    parse_limits(default)  # the frontend takes what the operator renders
    parse_tenant_limits((override,))

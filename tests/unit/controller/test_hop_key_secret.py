"""The fleet's hop key rendered: the Secret as the operator creates it, and its key mounted and
passed as ``--hop-key-file`` to the frontend, the router and every worker pod (auth fleets only)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from kvretention.api.models import KvRetentionDeployment
from kvretention.common.hop_auth import parse_hop_keys
from kvretention.controller.resources import build_children
from kvretention.controller.resources.hop_key import (
    HOP_KEY_MOUNT,
    HOP_KEY_VOLUME,
    build_hop_key_secret,
    hop_key_secret,
)
from kvretention.dataplane.frontend.cli import frontend_cmd
from kvretention.dataplane.router.cli import router_cmd
from kvretention.dataplane.worker.cli import worker_cmd

Body = dict[str, Any]
AUTH = {"secretRefs": [{"name": "keys"}]}
FLAG = f"--hop-key-file={HOP_KEY_MOUNT}/hop-key"


def fleet(*, auth: Body | None, mode: str = "aggregated") -> KvRetentionDeployment:
    spec: Body = {"model": {"name": "m", "path": "org/m"}, "workers": {"mode": mode}}
    if mode == "disaggregated":
        spec["workers"] |= {"prefill": {"replicas": 1}, "decode": {}}
    if auth is not None:
        spec["frontend"] = {"auth": auth}
    return KvRetentionDeployment.from_k8s(
        {
            "apiVersion": "kvretention.io/v1alpha1",
            "kind": "KvRetentionDeployment",
            "metadata": {"name": "f", "namespace": "ns", "uid": "u-1"},
            "spec": spec,
        }
    )


def pods(cr: KvRetentionDeployment) -> dict[str, Body]:
    """Each Deployment's pod spec by the Deployment's name."""
    return {
        m["metadata"]["name"]: m["spec"]["template"]["spec"]
        for m in build_children(cr)
        if m["kind"] == "Deployment"
    }


@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_an_auth_fleet_mounts_the_hop_key_in_frontend_router_and_workers(mode: str) -> None:
    cr = fleet(auth=AUTH, mode=mode)
    signers = {"f-frontend", "f-router", *(("f-worker",) if mode == "aggregated" else ())}
    if mode == "disaggregated":
        signers |= {"f-prefill", "f-decode"}
    by_name = pods(cr)
    assert signers <= set(by_name)
    for name in signers:
        pod = by_name[name]
        (volume,) = [v for v in pod["volumes"] if v["name"] == HOP_KEY_VOLUME]
        assert volume["secret"]["secretName"] == "f-hop-key"
        (container,) = pod["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == HOP_KEY_VOLUME]
        assert mount == {"name": HOP_KEY_VOLUME, "mountPath": HOP_KEY_MOUNT, "readOnly": True}
        command = container["command"]
        cut = command.index("--") if "--" in command else len(command)
        assert FLAG in command[:cut], name  # the worker's own flag, not SGLang's


def test_without_auth_nothing_is_signed_or_mounted() -> None:
    cr = fleet(auth=None)
    assert hop_key_secret(cr) is None
    for name, pod in pods(cr).items():
        assert HOP_KEY_VOLUME not in [v["name"] for v in pod.get("volumes", [])], name
        assert not [a for c in pod["containers"] for a in c["command"] if "hop-key" in a], name
    with pytest.raises(ValueError, match="no frontend auth"):
        build_hop_key_secret(cr, key="k" * 64)


def test_the_secret_is_owned_by_the_fleet_and_holds_a_key_the_pods_accept() -> None:
    cr = fleet(auth=AUTH)
    secret = build_hop_key_secret(cr, key="ab" * 32)
    meta = secret["metadata"]
    assert (secret["kind"], meta["name"], meta["namespace"]) == ("Secret", "f-hop-key", "ns")
    (owner,) = meta["ownerReferences"]
    assert (owner["uid"], owner["controller"]) == ("u-1", True)
    text = base64.b64decode(secret["data"]["hop-key"]).decode()
    assert parse_hop_keys(text).keys == (("ab" * 32).encode(),)


@pytest.mark.parametrize("command", [frontend_cmd, router_cmd, worker_cmd])
def test_every_hop_takes_the_flag(command: Any) -> None:
    assert "--hop-key-file" in [o for p in command.params for o in p.opts]

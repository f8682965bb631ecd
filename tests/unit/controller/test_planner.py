"""The pure planner and the cache's pure parts, table-driven: which children are kept, verified or
applied; when the manifest hash is trusted; what is pruned; when status is written; read-your-
writes; re-list detection; the applied state by owner UID; the slim index entries."""

from __future__ import annotations

from typing import Any

import pytest
from fake_kube import load_example

from kvretention.api.models import KvRetentionDeployment
from kvretention.api.names import FIELD_MANAGER, MANIFEST_HASH_ANNOTATION
from kvretention.controller.cache import (
    AppliedState,
    OwnWrites,
    Relists,
    decode_entry,
    index_by_instance,
)
from kvretention.controller.planner import (
    FleetPlan,
    held_message,
    manifest_hash,
    plan_child,
    plan_fleet,
    plan_holds,
    plan_prune,
    plan_status,
    references,
    stamp_of,
    trusted_by_annotation,
    with_manifest_hash,
)
from kvretention.controller.resources import build_children

BUILT: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "x-config", "namespace": "ns", "labels": {"a": "b"}},
    "data": {"k": "v"},
}
MANIFEST = with_manifest_hash(BUILT)
OURS = {"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": {"f:data": {}}}


def _live(*managed: dict[str, Any], digest: str | None = None) -> dict[str, Any]:
    annotations = {MANIFEST_HASH_ANNOTATION: digest or manifest_hash(BUILT), "other": "x"}
    return {
        **BUILT,
        "metadata": {
            **BUILT["metadata"],
            "uid": "u1",
            "resourceVersion": "7",
            "annotations": annotations,
            "managedFields": list(managed),
        },
    }


def test_the_hash_annotation_is_the_hash_of_the_built_manifest() -> None:
    assert MANIFEST["metadata"]["annotations"] == {MANIFEST_HASH_ANNOTATION: manifest_hash(BUILT)}
    assert "annotations" not in BUILT["metadata"]  # the builder's manifest is left alone


@pytest.mark.parametrize(
    ("live", "trusted"),
    [
        (_live(OURS), True),
        (_live(OURS, digest="other"), False),  # built from another spec
        (_live(), False),  # nobody applied it as the operator
        (
            _live(
                OURS,
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "fieldsV1": {
                        "f:metadata": {
                            "f:annotations": {".": {}, "f:deployment.kubernetes.io/revision": {}}
                        }
                    },
                },
            ),
            True,
        ),
        (
            _live(
                OURS,
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "subresource": "status",
                    "fieldsV1": {"f:status": {}},
                },
            ),
            True,
        ),
        (
            _live(
                OURS,
                {
                    "manager": "kubectl",
                    "operation": "Update",
                    "subresource": "scale",
                    "fieldsV1": {"f:spec": {"f:replicas": {}}},
                },
            ),
            False,
        ),
        (
            _live(
                OURS,
                {
                    "manager": "kubectl-edit",
                    "operation": "Update",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}},
                },
            ),
            False,
        ),
        (
            _live(
                OURS,
                {
                    "manager": "kubectl-edit",
                    "operation": "Update",
                    "fieldsV1": {
                        "f:metadata": {"f:annotations": {f"f:{MANIFEST_HASH_ANNOTATION}": {}}}
                    },
                },
            ),
            False,
        ),
    ],
    ids=[
        "ours",
        "other-hash",
        "no-apply",
        "revision",
        "status",
        "scaled",
        "relabelled",
        "hash-edited",
    ],
)
def test_trusted_by_annotation(live: dict[str, Any], trusted: bool) -> None:
    assert trusted_by_annotation(live, MANIFEST) is trusted


def test_plan_child() -> None:
    live = _live(OURS)
    stamp = stamp_of(live, MANIFEST, digest=manifest_hash(MANIFEST))
    assert plan_child(MANIFEST, None, remembered=stamp) == "apply"
    assert plan_child(MANIFEST, live, remembered=stamp) == "keep"
    moved = {**live, "metadata": {**live["metadata"], "resourceVersion": "8"}}
    assert plan_child(MANIFEST, moved, remembered=stamp) == "verify"  # no generation: by rv
    assert plan_child(MANIFEST, live, remembered=None) == "keep"  # restarted: the hash
    assert plan_child(MANIFEST, _live(), remembered=None) == "verify"


def _child(kind: str, name: str, owner: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1" if kind == "Deployment" else "v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "ownerReferences": [{"uid": owner, "controller": True}],
        },
    }


def test_plan_prune_deletes_only_unwanted_children_it_controls() -> None:
    live = {
        ("Deployment", "f-worker"): _child("Deployment", "f-worker", "me"),
        ("Deployment", "f-prefill"): _child("Deployment", "f-prefill", "me"),
        ("Service", "f-other"): _child("Service", "f-other", "someone-else"),
    }
    desired = [{"kind": "Deployment", "metadata": {"name": "f-prefill"}}]
    prunes = plan_prune(desired, live, uid="me")
    assert [(p.kind, p.name, p.uid) for p in prunes] == [("Deployment", "f-worker", "uid-f-worker")]


@pytest.mark.parametrize(
    ("previous", "status", "write", "events"),
    [
        ({"conditions": [], "foreign": 1}, {"conditions": []}, False, 0),
        (
            None,
            {"conditions": [{"type": "Ready", "status": "False", "reason": "PodsStarting"}]},
            True,
            0,
        ),
        (
            {"conditions": [{"type": "Ready", "status": "False", "reason": "PodsStarting"}]},
            {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready"}]},
            True,
            1,
        ),
    ],
    ids=["unchanged", "first", "flip"],
)
def test_plan_status(
    previous: dict[str, Any] | None, status: dict[str, Any], write: bool, events: int
) -> None:
    plan = plan_status(previous, status)
    assert (plan.write, len(plan.events)) == (write, events)


def _obj(rv: str, uid: str = "u") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "n", "uid": uid, "resourceVersion": rv}}


def test_own_writes_stand_in_until_the_index_catches_up() -> None:
    writes = OwnWrites()
    writes.record("ConfigMap", _obj("1"), _obj("2"))
    assert writes.resolve("ConfigMap", ("ns", "n"), _obj("1")) == _obj("2")  # index is stale
    writes.record("ConfigMap", _obj("2"), _obj("3"))  # the index still holds rv 1
    assert writes.resolve("ConfigMap", ("ns", "n"), _obj("1")) == _obj("3")
    assert writes.resolve("ConfigMap", ("ns", "n"), _obj("2")) == _obj("3")  # first write's event
    assert writes.resolve("ConfigMap", ("ns", "n"), _obj("3")) == _obj("3")  # caught up
    assert writes.resolve("ConfigMap", ("ns", "n"), _obj("1")) == _obj("1")  # entry dropped
    writes.record("ConfigMap", None, _obj("5", uid="new"))  # created, not indexed yet
    assert writes.resolve("ConfigMap", ("ns", "n"), None) == _obj("5", uid="new")
    writes.forget("new")  # deleted before the index ever saw it
    assert writes.resolve("ConfigMap", ("ns", "n"), None) is None
    writes.record("ConfigMap", _obj("6"), _obj("6"))  # an apply that changed nothing
    assert writes.resolve("ConfigMap", ("ns", "n"), _obj("6")) == _obj("6")


def test_relists_count_once_per_relisted_kind() -> None:
    now = [0.0]
    relists = Relists(clock=lambda: now[0])
    for uid in ("a", "b"):
        relists.saw("pods", uid, event_type=None)  # the initial list
    relists.saw("pods", "c", event_type="ADDED")
    assert relists.epoch == 0
    for uid in ("a", "b", "c"):
        relists.saw("pods", uid, event_type=None)  # a re-list
    assert relists.epoch == 1
    now[0] = 60.0
    relists.saw("pods", "b", event_type="DELETED")
    relists.saw("pods", "b", event_type=None)  # forgotten when deleted: not a re-list sign
    assert relists.epoch == 1
    relists.saw("pods", "a", event_type=None)
    assert relists.epoch == 2


def test_applied_state_is_per_owner_uid() -> None:
    state = AppliedState()
    stamp = ("u", "g1", "d", "m")
    state.remember("uid-mm", ("Deployment", "mm-b-router"), stamp)  # fleet mm's own child
    state.remember("uid-mm-b", ("Deployment", "mm-b-router"), stamp)
    state.forget_owner("uid-mm")
    assert state.get("uid-mm-b", ("Deployment", "mm-b-router")) == stamp
    assert state.owners() == {"uid-mm-b"}


def test_index_entries_are_plain_and_slim() -> None:
    body = {
        "metadata": {
            "namespace": "ns",
            "name": "f-router",
            "labels": {"app.kubernetes.io/instance": "f"},
            "managedFields": [
                {
                    "manager": FIELD_MANAGER,
                    "operation": "Apply",
                    "time": "t",
                    "fieldsV1": {
                        "f:spec": {"f:replicas": {}},
                        "f:metadata": {"f:annotations": {"f:x": {}}, "f:labels": {"f:y": {}}},
                    },
                }
            ],
        },
        "spec": {"replicas": 1},
    }
    ((key, entry),) = index_by_instance(body).items()  # type: ignore[union-attr]
    value = decode_entry(entry)
    assert key == ("ns", "f")
    assert value["metadata"]["managedFields"] == [
        {
            "manager": FIELD_MANAGER,
            "operation": "Apply",
            "fieldsV1": {
                "f:spec": {},
                "f:metadata": {"f:annotations": {"f:x": {}}, "f:labels": {}},
            },
        }
    ]
    ((_, pod),) = index_by_instance(body, pod=True).items()  # type: ignore[union-attr]
    assert "managedFields" not in decode_entry(pod)["metadata"]
    assert index_by_instance(body, fleet=True) == {("ns", "f-router"): entry}
    assert index_by_instance({"metadata": {"namespace": "ns", "name": "x"}}) is None


# -- what waits for a name conflict ------------------------------------------------------------


def _children(example: str) -> list[dict[str, Any]]:
    return build_children(KvRetentionDeployment.from_k8s(load_example(example)))


@pytest.mark.parametrize(
    ("example", "taken", "held"),
    [
        # The client-facing Service: nothing of the fleet calls it (status.endpoint says it).
        ("aggregated", [("Service", "qwen-frontend")], {}),
        (
            "aggregated",
            [("ConfigMap", "qwen-mooncake-config")],
            {
                (
                    "Deployment",
                    "qwen-worker",
                ): "mounts ConfigMap qwen-mooncake-config, which is taken"
            },
        ),
        (
            "aggregated",
            [("Service", "qwen-mooncake")],
            {
                ("ConfigMap", "qwen-mooncake-config"): "addresses Service qwen-mooncake, which is "
                "taken",
                ("Deployment", "qwen-worker"): "mounts ConfigMap qwen-mooncake-config, which "
                "addresses Service qwen-mooncake, which is taken",
            },
        ),
        (
            "aggregated",
            [("Service", "qwen-worker")],
            {("Deployment", "qwen-router"): "addresses Service qwen-worker, which is taken"},
        ),
        (
            "aggregated",
            [("Service", "qwen-router")],
            {("Deployment", "qwen-frontend"): "addresses Service qwen-router, which is taken"},
        ),
        (
            "aggregated",
            [("Service", "qwen-frontend"), ("ConfigMap", "qwen-mooncake-config")],
            {
                (
                    "Deployment",
                    "qwen-worker",
                ): "mounts ConfigMap qwen-mooncake-config, which is taken"
            },
        ),
        # Disaggregated: only the prefill pool mounts the Mooncake ConfigMap.
        (
            "disaggregated",
            [("ConfigMap", "qwen-pd-mooncake-config")],
            {
                ("Deployment", "qwen-pd-prefill"): "mounts ConfigMap qwen-pd-mooncake-config, "
                "which is taken"
            },
        ),
        (
            "disaggregated",
            [("Service", "qwen-pd-decode")],
            {("Deployment", "qwen-pd-router"): "addresses Service qwen-pd-decode, which is taken"},
        ),
        # A taken Deployment or PodDisruptionBudget: nothing names it.
        ("aggregated", [("Deployment", "qwen-worker"), ("PodDisruptionBudget", "qwen-worker")], {}),
        ("aggregated", [], {}),
    ],
)
def test_plan_holds_what_depends_on_a_taken_name(
    example: str, taken: list[tuple[str, str]], held: dict[tuple[str, str], str]
) -> None:
    desired = _children(example)
    assert plan_holds(desired, {key: {} for key in taken}) == held


def _pod_manifest(pod: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"spec": pod}}}


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        ({"containers": [], "volumes": [{"name": "v", "secret": {"secretName": "s"}}]}, "mounts"),
        (
            {
                "containers": [],
                "volumes": [{"name": "v", "projected": {"sources": [{"secret": {"name": "s"}}]}}],
            },
            "mounts",
        ),
        (
            {"containers": [{"name": "c", "envFrom": [{"secretRef": {"name": "s"}}]}]},
            "reads its environment from",
        ),
        (
            {
                "initContainers": [
                    {
                        "name": "c",
                        "env": [
                            {"name": "E", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
                        ],
                    }
                ],
                "containers": [],
            },
            "reads its environment from",
        ),
        ({"containers": [{"name": "c", "args": ["--to=http://svc:80"]}]}, "addresses"),
        (
            {"containers": [{"name": "c", "env": [{"name": "E", "value": "svc.ns.svc"}]}]},
            "addresses",
        ),
        ({"containers": [{"name": "c", "command": ["svc-other:80", "my-svc", "a.svc"]}]}, None),
        ({"containers": [{"name": "c", "image": "svc"}], "hostname": "svc"}, None),
    ],
)
def test_references_found_in_a_pod_spec(pod: dict[str, Any], expected: str | None) -> None:
    children = [("Secret", "s"), ("Service", "svc"), ("Deployment", "d")]
    found = references(_pod_manifest(pod), children)
    assert [r.how for r in found] == ([expected] if expected else [])


def test_a_held_child_is_said_by_name_and_why() -> None:
    assert held_message(("Deployment", "w"), "mounts ConfigMap c, which is taken") == (
        "Deployment w is not created or updated until the conflict is gone: it mounts "
        "ConfigMap c, which is taken"
    )


@pytest.mark.parametrize(
    ("example", "url"),
    [
        ("aggregated", "http://qwen-mooncake.ns.svc:9003/metrics"),
        ("external-mooncake", None),  # not ours to read
    ],
)
def test_the_plan_carries_the_masters_metrics_url(example: str, url: str | None) -> None:
    plan = plan_fleet(load_example(example))
    assert isinstance(plan, FleetPlan)
    assert plan.master_metrics_url == url


@pytest.mark.parametrize(
    "example", ["aggregated", "disaggregated", "multinode", "external-mooncake", "agents"]
)
def test_the_plans_endpoint_and_scale_are_those_of_its_manifests(example: str) -> None:
    """Status reads the endpoint and the scale from the plan: they name the frontend Service
    (its first port) and the scaled pool's workload as rendered, and select that pool's pods
    (a LeaderWorkerSet's leaders only)."""
    plan = plan_fleet(load_example(example))
    assert isinstance(plan, FleetPlan)
    fleet, kids = plan.fleet, {(m["kind"], m["metadata"]["name"]): m for m in plan.desired}
    assert fleet.endpoint is not None and fleet.scale is not None
    service = kids[("Service", fleet.endpoint.service)]
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == "frontend"
    port = service["spec"]["ports"][0]["port"]
    assert fleet.endpoint.url == f"http://{fleet.endpoint.service}.ns.svc:{port}"
    (pool,) = [
        m
        for (kind, name), m in kids.items()
        if kind in ("Deployment", "LeaderWorkerSet") and name == fleet.scale.workload
    ]
    component = pool["metadata"]["labels"]["app.kubernetes.io/component"]
    scaled = "worker-decode" if plan.cr.spec.workers.mode == "disaggregated" else "worker"
    assert component == scaled
    if pool["kind"] == "LeaderWorkerSet":  # its leaders: one pod per replica (a group)
        leader = pool["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]
        keys = [f"app.kubernetes.io/{key}" for key in ("name", "instance", "component")]
        match = {key: leader[key] for key in keys}
        match["leaderworkerset.sigs.k8s.io/worker-index"] = "0"
    else:
        match = pool["spec"]["selector"]["matchLabels"]
    assert fleet.scale.selector == ",".join(f"{k}={v}" for k, v in sorted(match.items()))

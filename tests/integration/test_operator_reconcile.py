"""The operator as a real process against the real local control plane: reconcile, status, drift.

One operator (all namespaces, no leader election, a 3 s resync) serves the whole module; each test
has its own namespace. kwok makes pods Ready; the probe report is injected into worker pods' status
(no worker image runs here).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from operator_fixtures import (
    CRD_PATH,
    GOOD_REPORT,
    OLD_ENGINE_REPORT,
    TRANSPORT_ONLY_REPORT,
    Fleets,
    Operator,
    fleets_fixture,
    load_example,
    operator_fixture,
    resource_versions,
)

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources import build_children
from support.controlplane import ApplyCrd, wait_until

pytestmark = pytest.mark.integration

RESYNC_S = 3.0


operator = operator_fixture(resync_s=RESYNC_S)
fleets = fleets_fixture()


def expected_children(fleets: Fleets, name: str) -> set[tuple[str, str]]:
    cr = KvRetentionDeployment.from_k8s(
        {**load_example("aggregated", name=name, namespace=fleets.ns)}
    )
    return {(m["kind"], m["metadata"]["name"]) for m in build_children(cr)}


def test_sample_reaches_ready_with_one_write_per_child_and_none_once_converged(
    operator: Operator, fleets: Fleets
) -> None:
    writes_before = operator.metric_sum("kvretention_operator_apply_writes_total")
    body = load_example("aggregated")
    body["metadata"]["annotations"] = {"example.com/owned-by-gitops": "yes"}
    created = fleets.create(body)
    name = created["metadata"]["name"]

    fleets.wait_condition(name, "WorkersReady", "True")
    fleets.wait_condition(name, "KvHintsSupported", "Unknown", reason="ProbePending")
    fleets.wait_condition(name, "RetentionApplied", "Unknown", reason="ProbePending")
    # Optional policy: serving before the probe report arrives, and says so.
    fleets.wait_condition(name, "Ready", "True", reason="ReadyWithoutKvHints")
    fleets.wait_condition(name, "Ready", "True", reason="Ready", reporting=GOOD_REPORT)
    applied = fleets.wait_condition(name, "RetentionApplied", "True", reason="Applied")
    assert "--radix-eviction-policy kvretain" in applied["message"]

    cr = fleets.get(name)
    status = cr["status"]
    assert status["observedGeneration"] == cr["metadata"]["generation"]
    assert status["workersReady"] == "2/2"
    assert status["frontend"] == {"ready": 1, "desired": 1, "updated": 1, "available": 1}
    assert [(p["name"], p["reason"], p["ready"]) for p in status["workers"]["pools"]] == [
        (f"{name}-worker", "PodsReady", 2)
    ]
    assert status["endpoint"].startswith(f"http://{name}-frontend.{fleets.ns}.svc:")
    assert status["engine"]["sglangVersion"] == "0.5.23"
    assert status["engine"]["dialect"] == "versioned"
    assert status["engine"]["retentionPlugin"] == "loaded"
    assert status["replicas"] == 2
    assert f"app.kubernetes.io/instance={name}" in status["selector"]
    for cond in status["conditions"]:
        assert cond["observedGeneration"] == cr["metadata"]["generation"], cond

    # Nothing the operator needs lives in the user's metadata; no finalizer.
    assert cr["metadata"]["annotations"] == {"example.com/owned-by-gitops": "yes"}
    assert not cr["metadata"].get("finalizers")

    # Exactly the rendered children, each owned by the CR, each applied once.
    children = fleets.children(name)
    assert set(children) == expected_children(fleets, name)
    uid = cr["metadata"]["uid"]
    for obj in children.values():
        refs = obj["metadata"]["ownerReferences"]
        assert [(r["uid"], r["controller"]) for r in refs] == [(uid, True)]
        managers = {m["manager"] for m in obj["metadata"]["managedFields"]}
        assert "kvretention-operator" in managers
    applied = operator.metric_sum("kvretention_operator_apply_writes_total") - writes_before
    assert applied == len(children)

    # Events only on condition flips, from our own reporting component.
    events = fleets.core.list_namespaced_event(
        fleets.ns, field_selector=f"involvedObject.name={name}"
    ).items
    ours = [e for e in events if e.reporting_component == "kvretention-operator"]
    reasons = {(e.reason, e.type) for e in ours}
    assert ("ReadyWithoutKvHints", "Normal") in reasons  # Ready flipped to True
    assert ("EngineAcceptsKvHints", "Normal") in reasons  # KvHintsSupported flipped to True
    assert ("Applied", "Normal") in reasons  # RetentionApplied flipped to True
    # One Event per flip: Ready went Unknown/False -> True once, so it has one True event.
    flips = [e.message for e in ours]
    assert len(flips) == len(set(flips)), flips
    assert sum(1 for m in flips if m.startswith("Ready is True")) == 1

    # Converged: two resync periods pass with no write at all.
    before = resource_versions(fleets, name)
    writes = operator.writes()
    time.sleep(2 * RESYNC_S + 1)
    assert resource_versions(fleets, name) == before
    assert operator.writes() == writes


def test_engine_without_kv_hints_under_required_policy_is_not_ready(
    operator: Operator, fleets: Fleets
) -> None:
    body = load_example("aggregated", name="strict")
    body["spec"]["hints"]["policy"] = "Required"
    fleets.create(body)
    fleets.wait_condition("strict", "WorkersReady", "True")
    # Before any report: not Ready, waiting for the probe.
    fleets.wait_condition("strict", "Ready", "False", reason="ProbePending")
    cond = fleets.wait_condition(
        "strict",
        "KvHintsSupported",
        "False",
        reason="EngineLacksKvHints",
        reporting=OLD_ENGINE_REPORT,
    )
    assert "0.4.6" in cond["message"]
    ready = fleets.wait_condition("strict", "Ready", "False", reason="EngineLacksKvHints")
    assert "kv_hints" in ready["message"]
    assert fleets.get("strict")["status"]["engine"]["kvHintsParameter"] is False


def test_stock_image_under_required_policy_is_transport_only_until_the_plugin_loads(
    operator: Operator, fleets: Fleets
) -> None:
    """A worker image whose probe predates the retention plugin transports kv.retain without
    applying it: under Required the fleet is not Ready, and says so; the plugin's image fixes it."""
    body = load_example("aggregated", name="stock")
    body["spec"]["hints"]["policy"] = "Required"
    fleets.create(body)
    fleets.wait_condition("stock", "WorkersReady", "True")
    cond = fleets.wait_condition(
        "stock",
        "RetentionApplied",
        "False",
        reason="TransportOnly",
        reporting=TRANSPORT_ONLY_REPORT,
    )
    assert "predates the retention plugin" in cond["message"]
    fleets.wait_condition("stock", "KvHintsSupported", "True")
    ready = fleets.wait_condition("stock", "Ready", "False", reason="TransportOnly")
    assert ready["message"] == cond["message"]
    assert "retentionPlugin" not in fleets.get("stock")["status"]["engine"]
    fleets.wait_condition("stock", "Ready", "True", reason="Ready", reporting=GOOD_REPORT)
    fleets.wait_condition("stock", "RetentionApplied", "True", reason="Applied")


def test_invalid_spec_gets_invalid_spec_and_no_children(operator: Operator, fleets: Fleets) -> None:
    body = load_example("aggregated", name="bad")
    body["spec"]["workers"]["aggregated"] = {"extraArgs": ["--tp-size=4"]}
    fleets.create(body)
    cond = fleets.wait_condition("bad", "Ready", "False", reason="InvalidSpec")
    assert "--tp-size" in cond["message"]
    assert fleets.children("bad") == {}
    # Fixing the spec recovers without any restart.
    fleets.patch_spec("bad", {"workers": {"aggregated": {"extraArgs": []}}})
    fleets.wait_condition("bad", "WorkersReady", "True")


def master_spec(**master: Any) -> dict[str, Any]:
    """A spec patch setting fields of the managed Mooncake master."""
    return {"kvStore": {"mooncake": {"master": master}}}


BAD_CRS: list[tuple[str, dict[str, Any], str]] = [
    (
        "disaggregated without pools",
        {"workers": {"mode": "disaggregated"}},
        "workers.mode disaggregated needs workers.prefill and workers.decode",
    ),
    (
        "external Mooncake without an address",
        {"kvStore": {"mooncake": {"mode": "external"}}},
        "kvStore.mooncake.mode external needs kvStore.mooncake.external.masterAddress",
    ),
    (
        "hints without an L3 tier",
        {"hints": {"policy": "Required"}, "workers": {"hicache": {"enabled": False}}},
        "retention hints",
    ),
    (
        "soft pin default above max",
        master_spec(softPin={"defaultTtlSeconds": 50000, "maxTtlSeconds": 43200}),
        "softPin.defaultTtlSeconds must not exceed softPin.maxTtlSeconds",
    ),
    (
        "pins that hold without a budget",
        master_spec(softPin={"allowEviction": False}),
        "softPin.allowEviction false needs softPin.budgetRatio",
    ),
    (
        "pin budget at the high watermark",
        master_spec(
            eviction={"highWatermarkRatio": 0.8},
            softPin={"allowEviction": False, "budgetRatio": 0.8},
        ),
        "softPin.budgetRatio must be below eviction.highWatermarkRatio",
    ),
    ("unknown mode", {"workers": {"mode": "sideways"}}, "Unsupported value"),
    ("unknown tool-call parser", {"model": {"toolCallParser": "qwen9"}}, "Unsupported value"),
    ("unknown reasoning parser", {"model": {"reasoningParser": "r2"}}, "Unsupported value"),
    (
        "alias repeating the served name",
        {"model": {"aliases": ["qwen3-0.6b"]}},
        "model.aliases must not repeat model.name",
    ),
    ("duplicate aliases", {"model": {"aliases": ["a", "a"]}}, "Duplicate value"),
    ("unknown router policy", {"router": {"policy": "RoundRobin"}}, "Unsupported value"),
    (
        "default TTL above the soft-pin max",
        {
            "hints": {"defaultTtlSeconds": 50000},
            "kvStore": {"mooncake": {"master": {"softPin": {"maxTtlSeconds": 43200}}}},
        },
        "hints.defaultTtlSeconds must not exceed kvStore.mooncake.master.softPin.maxTtlSeconds",
    ),
    ("malformed session key", {"router": {"sessionKeys": ["a b"]}}, "should match"),
    ("negative replicas", {"workers": {"replicas": -1}}, "should be greater than or equal to 0"),
    # What render refuses for its types, the API server refuses too (and the other way round).
    ("replicas as a string", {"workers": {"replicas": "2"}}, "must be of type integer"),
    (
        "tensorParallelSize as a string",
        {"workers": {"aggregated": {"tensorParallelSize": "2"}}},
        "must be of type integer",
    ),
    (
        "a boolean as a string",
        {"hints": {"providers": {"openai": "false"}}},
        "must be of type boolean",
    ),
    (
        "a toleration operator Kubernetes does not have",
        {"workers": {"pod": {"tolerations": [{"key": "a", "operator": "Maybe"}]}}},
        "Unsupported value",
    ),
    (
        "a node selector value that is not a string",
        {"router": {"pod": {"nodeSelector": {"gpu": 1}}}},
        "must be of type string",
    ),
    (
        "a rollout that can never progress",
        {"workers": {"rollout": {"maxSurge": 0, "maxUnavailable": 0}}},
        "workers.rollout: maxSurge and maxUnavailable must not both be 0",
    ),
    *(
        (
            f"gpuResource {name}",
            {"workers": {"gpuResource": name}},
            "workers.gpuResource must be a vendor resource name such as nvidia.com/gpu",
        )
        for name in ("cpu", "memory", "kubernetes.io/gpu")
    ),
    *(
        (
            f"rememberedConversations {count}",
            {"frontend": {"rememberedConversations": count}},
            message,
        )
        for count, message in (
            (0, "should be greater than or equal to 1"),
            (100_001, "should be less than or equal to 100000"),
        )
    ),
    *(
        (
            f"external master port {port}",
            {
                "kvStore": {
                    "mooncake": {"mode": "external", "external": {"masterAddress": f"mc:{port}"}}
                }
            },
            "kvStore.mooncake.external.masterAddress port must be 1-65535",
        )
        for port in ("0", "99999")
    ),
]


@pytest.mark.parametrize(("case", "spec", "message"), BAD_CRS, ids=[c[0] for c in BAD_CRS])
def test_bad_crs_are_rejected_at_admission(
    fleets: Fleets, apply_crd: ApplyCrd, case: str, spec: dict[str, Any], message: str
) -> None:
    apply_crd(CRD_PATH)
    body = load_example("aggregated", name="rejected")

    def merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
        for key, value in patch.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    merge(body["spec"], spec)
    with pytest.raises(ApiException) as err:
        fleets.create(body)
    assert err.value.status == 422, case
    assert message in str(err.value.body), err.value.body


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("a.b", "must consist of lowercase letters, digits and '-'"),
        ("1e3", "must consist of lowercase letters, digits and '-'"),
        ("x" * 55, "metadata.name must be at most 54 characters"),
    ],
)
def test_names_that_make_invalid_child_names_are_rejected_at_admission(
    fleets: Fleets, apply_crd: ApplyCrd, name: str, message: str
) -> None:
    apply_crd(CRD_PATH)
    with pytest.raises(ApiException) as err:
        fleets.create(load_example("aggregated", name=name))
    assert err.value.status == 422, name
    assert message in str(err.value.body), err.value.body


def test_spec_change_rolls_only_the_affected_deployments(
    operator: Operator, fleets: Fleets
) -> None:
    fleets.create(load_example("aggregated", name="roll"))
    fleets.wait_condition("roll", "WorkersReady", "True")
    fleets.wait_condition("roll", "FrontendReady", "True")

    def generations() -> dict[str, int]:
        return {
            n: o["metadata"]["generation"]
            for (k, n), o in fleets.children("roll").items()
            if k == "Deployment"
        }

    before = generations()
    # A frontend-only change: only the frontend Deployment moves.
    fleets.patch_spec("roll", {"frontend": {"image": "example.com/kvretention:next"}})
    wait_until("frontend rolled", lambda: generations()["roll-frontend"] > before["roll-frontend"])
    fleets.wait_condition("roll", "Progressing", "False", reason="Converged", generation=2)
    after = generations()
    assert {n for n in after if after[n] != before[n]} == {"roll-frontend"}

    # A Mooncake transfer change lands in the client config the workers mount: its hash is in the
    # worker pod template, so the workers roll; the master, frontend and router stay.
    fleets.patch_spec("roll", {"kvStore": {"mooncake": {"transfer": {"globalSegmentSize": "8gb"}}}})
    wait_until("worker rolled", lambda: generations()["roll-worker"] > after["roll-worker"])
    fleets.wait_condition("roll", "Progressing", "False", reason="Converged", generation=3)
    final = generations()
    assert {n for n in final if final[n] != after[n]} == {"roll-worker"}
    assert fleets.get("roll")["status"]["observedGeneration"] == 3


def _rollout_events(
    fleets: Fleets, since: str, out: list[dict[str, Any]], watcher: watch.Watch
) -> None:
    """Every Deployment of the namespace as the API server showed it, in order, from ``since``
    (the watch ends with the test's namespace; what it saw by then is what the test reads)."""
    with contextlib.suppress(Exception):
        for event in watcher.stream(
            fleets.apps.list_namespaced_deployment,
            fleets.ns,
            resource_version=since,
            timeout_seconds=180,
        ):
            out.append(event["raw_object"])


def _image(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def _runs_its_template(deployment: dict[str, Any]) -> bool:
    """Every pod on the Deployment's current template and none of the old ones left."""
    spec, status = deployment["spec"], deployment.get("status") or {}
    return (
        status.get("observedGeneration", 0) >= deployment["metadata"]["generation"]
        and status.get("updatedReplicas", 0) >= spec["replicas"]
        and status.get("replicas", 0) <= spec["replicas"]
    )


def test_a_version_bump_rolls_the_workers_before_the_frontend_and_router(
    operator: Operator, fleets: Fleets
) -> None:
    """One patch moves all three images; the real Deployment controller rolls the workers, and
    the frontend and router take their new image only after no old worker pod is left."""
    fleets.create(load_example("aggregated", name="bump"))
    fleets.wait_condition("bump", "Progressing", "False", reason="Converged")
    since = fleets._raw(fleets.apps.list_namespaced_deployment, fleets.ns)["metadata"][
        "resourceVersion"
    ]
    seen: list[dict[str, Any]] = []
    watcher = watch.Watch()
    threading.Thread(
        target=_rollout_events, args=(fleets, since, seen, watcher), daemon=True
    ).start()
    new, new_worker = "example.com/kvretention:next", "example.com/worker:next"
    fleets.patch_spec(
        "bump",
        {"frontend": {"image": new}, "router": {"image": new}, "workers": {"image": new_worker}},
    )
    fleets.wait_condition("bump", "Progressing", "False", reason="Converged", generation=2)
    assert _image(fleets.deployment("bump-frontend")) == new
    assert _image(fleets.deployment("bump-router")) == new
    wait_until(
        "the watch saw the new frontend and router",
        lambda: (
            {"bump-frontend", "bump-router"}
            <= {d["metadata"]["name"] for d in seen if _image(d) == new}
        ),
    )
    watcher.stop()

    def first(name: str, image: str) -> int:
        return next(
            i for i, d in enumerate(seen) if d["metadata"]["name"] == name and _image(d) == image
        )

    workers_done = next(
        i
        for i, d in enumerate(seen)
        if d["metadata"]["name"] == "bump-worker"
        and _image(d) == new_worker
        and _runs_its_template(d)
    )
    assert first("bump-worker", new_worker) < workers_done
    assert first("bump-frontend", new) > workers_done
    assert first("bump-router", new) > workers_done


def test_hand_deleted_and_hand_edited_children_are_repaired(
    operator: Operator, fleets: Fleets
) -> None:
    fleets.create(load_example("aggregated", name="drift"))
    fleets.wait_condition("drift", "RouterReady", "True")
    old = fleets.children("drift")
    router_uid = old[("Deployment", "drift-router")]["metadata"]["uid"]

    fleets.apps.delete_namespaced_deployment("drift-router", fleets.ns)
    fleets.core.delete_namespaced_service("drift-frontend", fleets.ns)
    fleets.apps.patch_namespaced_deployment(
        "drift-frontend",
        fleets.ns,
        {"spec": {"replicas": 5}},
        _content_type="application/merge-patch+json",
    )

    def repaired() -> bool:
        now = fleets.children("drift")
        router = now.get(("Deployment", "drift-router"))
        return (
            router is not None
            and router["metadata"]["uid"] != router_uid
            and ("Service", "drift-frontend") in now
            and now[("Deployment", "drift-frontend")]["spec"]["replicas"] == 1
        )

    wait_until("children repaired", repaired, timeout_s=30)
    assert set(fleets.children("drift")) == set(old)
    fleets.wait_condition("drift", "RouterReady", "True")


def test_deleting_the_cr_garbage_collects_everything_it_owned(
    operator: Operator, fleets: Fleets
) -> None:
    fleets.create(load_example("aggregated", name="gone"))
    wait_until("children created", lambda: len(fleets.children("gone")) >= 8)
    fleets.delete("gone")
    wait_until("children collected", lambda: fleets.children("gone") == {}, timeout_s=90)


@pytest.mark.parametrize("component", ["workers", "frontend"])
def test_a_component_scaled_to_zero_is_not_ready(
    operator: Operator, fleets: Fleets, component: str
) -> None:
    fleets.create(load_example("aggregated", name="zero"))
    fleets.wait_condition("zero", "WorkersReady", "True")
    fleets.patch_spec("zero", {component: {"replicas": 0}})
    condition = "WorkersReady" if component == "workers" else "FrontendReady"
    fleets.wait_condition("zero", condition, "False", reason="ScaledToZero")
    ready = fleets.wait_condition("zero", "Ready", "False", reason="ScaledToZero")
    assert "scaled to 0 replicas" in ready["message"]


PLACEMENT: dict[str, Any] = {
    "labels": {"team": "inference"},
    "annotations": {"example.com/cost-center": "42"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"team": "inference"}},
                    },
                }
            ]
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"team": "inference"}},
        }
    ],
    "imagePullSecrets": [{"name": "registry"}],
    "env": [{"name": "HF_HOME", "value": "/cache"}],
    "volumes": [{"name": "cache", "emptyDir": {}}],
    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
}


def test_pod_options_reach_the_pods_and_the_fleet_still_converges(
    operator: Operator, fleets: Fleets
) -> None:
    body = load_example("aggregated", name="placed")
    body["spec"]["workers"]["pod"] = PLACEMENT
    body["spec"]["frontend"] = {**body["spec"].get("frontend", {}), "pod": PLACEMENT}
    fleets.create(body)
    fleets.wait_condition("placed", "WorkersReady", "True")
    fleets.wait_condition("placed", "FrontendReady", "True")
    for deployment in ("placed-worker", "placed-frontend"):
        template = fleets.deployment(deployment)["spec"]["template"]
        pod = template["spec"]
        for key in ("tolerations", "affinity", "topologySpreadConstraints", "imagePullSecrets"):
            assert pod[key] == PLACEMENT[key], (deployment, key)
        assert template["metadata"]["labels"]["team"] == "inference"
        assert template["metadata"]["annotations"]["example.com/cost-center"] == "42"
        assert {"name": "cache", "emptyDir": {}} in pod["volumes"]
        main = pod["containers"][0]
        assert {"name": "HF_HOME", "value": "/cache"} in main["env"]
        assert {"name": "cache", "mountPath": "/cache"} in main["volumeMounts"]
    worker_pods = fleets.core.list_namespaced_pod(
        fleets.ns, label_selector="app.kubernetes.io/instance=placed,team=inference"
    ).items
    assert worker_pods and all(p.spec.tolerations for p in worker_pods)


def test_an_existing_object_with_a_childs_name_is_never_adopted(
    operator: Operator, fleets: Fleets
) -> None:
    """A Service made by hand keeps its selector and owner, and survives the fleet's deletion."""
    theirs = fleets.core.create_namespaced_service(
        fleets.ns,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="victim-frontend"),
            spec=client.V1ServiceSpec(
                selector={"app": "mine"}, ports=[client.V1ServicePort(port=80)]
            ),
        ),
    )
    fleets.create(load_example("aggregated", name="victim"))
    ready = fleets.wait_condition("victim", "Ready", "False", reason="ChildConflict")
    assert f"Service {fleets.ns}/victim-frontend already exists" in ready["message"]
    fleets.wait_condition("victim", "Progressing", "False", reason="ChildConflict")
    # Everything else is created; the user's Service is untouched, even after resyncs.
    wait_until("the other children", lambda: len(fleets.children("victim")) >= 8)
    time.sleep(2 * RESYNC_S)
    after = fleets.core.read_namespaced_service("victim-frontend", fleets.ns)
    assert after.metadata.resource_version == theirs.metadata.resource_version
    assert not after.metadata.owner_references
    assert after.spec.selector == {"app": "mine"}

    fleets.delete("victim")
    wait_until("the fleet's children collected", lambda: fleets.children("victim") == {})
    survivor = fleets.core.read_namespaced_service("victim-frontend", fleets.ns)
    assert survivor.metadata.uid == theirs.metadata.uid


def test_disaggregated_and_external_mooncake_examples_reach_ready(
    operator: Operator, fleets: Fleets
) -> None:
    fleets.create(load_example("disaggregated"))
    fleets.create(load_example("external-mooncake"))
    for name in ("qwen-pd", "qwen-ext"):
        fleets.wait_condition(name, "WorkersReady", "True")
    # Disaggregated: two pools; the scale subresource follows the decode pool.
    pd = fleets.get("qwen-pd")["status"]
    workers = pd["workers"]
    assert (workers["ready"], workers["desired"], workers["available"]) == (3, 3, 3)
    assert [(p["name"], p["role"], p["ready"], p["reason"]) for p in workers["pools"]] == [
        ("qwen-pd-prefill", "worker-prefill", 1, "PodsReady"),
        ("qwen-pd-decode", "worker-decode", 2, "PodsReady"),
    ]
    assert pd["replicas"] == 2
    assert "worker-decode" in pd["selector"]
    names = {n for (k, n) in fleets.children("qwen-pd") if k == "Deployment"}
    assert {"qwen-pd-prefill", "qwen-pd-decode"} <= names
    assert "qwen-pd-worker" not in names
    # External Mooncake: no master of ours, and the store condition says whose it is.
    kv = fleets.wait_condition("qwen-ext", "KvStoreReady", "True", reason="External")
    assert "mooncake-master.mooncake.svc:50051" in kv["message"]
    assert not any(n.endswith("-mooncake") for (_, n) in fleets.children("qwen-ext"))
    # Required hints (the PD example) with a capable engine: Ready.
    fleets.wait_condition("qwen-pd", "Ready", "True", reason="Ready", reporting=GOOD_REPORT)

"""Builder properties: determinism, ownership, labels, and that a spec change touches only what it must."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources import (
    build_children,
    build_mooncake_client_config,
    build_mooncake_master_args,
    build_sglang_args,
    frontend_endpoint,
    scale_selector,
    scaled_role,
)
from kvretention.controller.resources.common import CONFIG_HASH_ANNOTATION
from kvretention.dataplane.protocol import DEFAULT_SESSION_KEYS

Body = dict[str, Any]


def base(**spec: Any) -> Body:
    body: Body = {
        "apiVersion": "kvretention.io/v1alpha1",
        "kind": "KvRetentionDeployment",
        "metadata": {"name": "f", "namespace": "ns", "uid": "u-1"},
        "spec": {"model": {"name": "m", "path": "org/m"}},
    }
    body["spec"].update(spec)
    return body


PD = {"mode": "disaggregated", "prefill": {"replicas": 2}, "decode": {}}


def children(body: Body) -> dict[str, Any]:
    return {
        f"{m['kind']}/{m['metadata']['name']}": m
        for m in build_children(KvRetentionDeployment.from_k8s(body))
    }


def changed(before: Body, mutate: Callable[[Body], None]) -> set[str]:
    after = copy.deepcopy(before)
    mutate(after)
    old, new = children(before), children(after)
    assert old.keys() == new.keys()
    return {key for key in old if old[key] != new[key]}


def _set(path: str, value: Any) -> Callable[[Body], None]:
    def mutate(body: Body) -> None:
        node = body["spec"]
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    return mutate


@pytest.mark.parametrize(
    ("start", "path", "value", "expected"),
    [
        ({}, "frontend.replicas", 3, {"Deployment/f-frontend"}),
        ({}, "frontend.image", "img:2", {"Deployment/f-frontend"}),
        ({}, "frontend.service", {"port": 80}, {"Service/f-frontend"}),
        ({}, "router.replicas", 2, {"Deployment/f-router"}),
        ({}, "router.sessionAffinity", {"type": "ClientIP"}, {"Service/f-router"}),
        ({}, "workers.replicas", 4, {"Deployment/f-worker"}),
        ({}, "workers.startupTimeoutSeconds", 3600, {"Deployment/f-worker"}),
        ({}, "workers.rollout", {"progressDeadlineSeconds": 7200}, {"Deployment/f-worker"}),
        ({}, "hints", {"providers": {"anthropic": False}}, {"Deployment/f-frontend"}),
        # The policy only decides readiness (status): no child changes.
        ({}, "hints", {"policy": "Required"}, set()),
        (
            {},
            "kvStore.mooncake.transfer",
            {"protocol": "rdma"},
            {"ConfigMap/f-mooncake-config", "Deployment/f-worker"},
        ),
        # The plugin's pin settings travel in the ConfigMap, re-read in place: no worker roll.
        (
            {},
            "kvStore.mooncake.master.softPin",
            {"maxTtlSeconds": 50000},
            {"ConfigMap/f-mooncake-config", "Deployment/f-mooncake"},
        ),
        ({}, "kvStore.mooncake.master.eviction", {"ratio": 0.2}, {"Deployment/f-mooncake"}),
        (
            {},
            "kvStore.mooncake.master.rpcPort",
            50052,
            {
                "ConfigMap/f-mooncake-config",
                "Service/f-mooncake",
                "Deployment/f-mooncake",
                "NetworkPolicy/f-mooncake",
                "Deployment/f-worker",
            },
        ),
        (
            {},
            "workers.hicache",
            {"writePolicy": "write_through_selective"},
            {"Deployment/f-worker"},
        ),
        ({"workers": PD}, "workers.replicas", 5, {"Deployment/f-decode"}),
        ({"workers": PD}, "workers.prefill", {"replicas": 1}, {"Deployment/f-prefill"}),
        (
            {"workers": PD},
            "kvStore.mooncake.transfer",
            {"globalSegmentSize": "8gb"},
            {"ConfigMap/f-mooncake-config", "Deployment/f-prefill"},
        ),
        ({"workers": PD}, "workers.hicache", {"ratio": 3.0}, {"Deployment/f-prefill"}),
        # The pins' budget is read by SGLang's scheduler at start: every pool's workers roll.
        ({}, "workers.radixPinRatio", 0.75, {"Deployment/f-worker"}),
        (
            {"workers": PD},
            "workers.radixPinRatio",
            0.75,
            {"Deployment/f-prefill", "Deployment/f-decode"},
        ),
    ],
)
def test_a_change_touches_only_its_children(
    start: Body, path: str, value: Any, expected: set[str]
) -> None:
    assert changed(base(**copy.deepcopy(start)), _set(path, value)) == expected


def test_worker_scale_keeps_the_pod_template() -> None:
    old, new = children(base()), children(base(workers={"replicas": 7}))
    assert (
        old["Deployment/f-worker"]["spec"]["template"]
        == new["Deployment/f-worker"]["spec"]["template"]
    )
    assert new["Deployment/f-worker"]["spec"]["replicas"] == 7


def test_config_change_rolls_workers_through_the_hash_only() -> None:
    old = children(base())["Deployment/f-worker"]["spec"]["template"]
    new = children(base(kvStore={"mooncake": {"transfer": {"protocol": "rdma"}}}))[
        "Deployment/f-worker"
    ]["spec"]["template"]
    assert old["spec"] == new["spec"]
    assert (
        old["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
        != new["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
    )


def test_same_spec_same_bytes() -> None:
    first = json.dumps(build_children(KvRetentionDeployment.from_k8s(base(workers=PD))))
    second = json.dumps(build_children(KvRetentionDeployment.from_k8s(base(workers=PD))))
    assert first == second


def test_children_are_owned_and_labelled() -> None:
    for key, manifest in children(base(workers=PD)).items():
        meta = manifest["metadata"]
        assert meta["namespace"] == "ns", key
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "kvretention.io/v1alpha1",
                "kind": "KvRetentionDeployment",
                "name": "f",
                "uid": "u-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ], key
        assert meta["labels"]["app.kubernetes.io/instance"] == "f"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "kvretention-operator"
        if manifest["kind"] == "Deployment":
            template_labels = manifest["spec"]["template"]["metadata"]["labels"]
            assert manifest["spec"]["selector"]["matchLabels"].items() <= template_labels.items()


def test_no_owner_references_without_uid() -> None:
    body = base()
    del body["metadata"]["uid"]
    assert all("ownerReferences" not in m["metadata"] for m in children(body).values())


@pytest.mark.parametrize(
    ("workers", "kv_store", "expected"),
    [
        (
            {},
            {},
            [
                "ConfigMap/f-mooncake-config",
                "Service/f-mooncake",
                "Deployment/f-mooncake",
                "Service/f-worker",
                "Deployment/f-worker",
                "PodDisruptionBudget/f-worker",
            ],
        ),
        (
            PD,
            {},
            [
                "ConfigMap/f-mooncake-config",
                "Service/f-mooncake",
                "Deployment/f-mooncake",
                "Service/f-prefill",
                "Deployment/f-prefill",
                "PodDisruptionBudget/f-prefill",
                "Service/f-decode",
                "Deployment/f-decode",
                "PodDisruptionBudget/f-decode",
            ],
        ),
        (
            {},
            {"mooncake": {"mode": "external", "external": {"masterAddress": "mc:1"}}},
            [
                "ConfigMap/f-mooncake-config",
                "Service/f-worker",
                "Deployment/f-worker",
                "PodDisruptionBudget/f-worker",
            ],
        ),
    ],
)
def test_children_in_apply_order(workers: Body, kv_store: Body, expected: list[str]) -> None:
    keys = list(children(base(workers=workers, kvStore=kv_store)))
    policies = [
        f"NetworkPolicy/{key.split('/')[1]}" for key in expected if key.startswith("Deployment/")
    ]
    assert keys == [
        *expected,
        "Service/f-router",
        "Deployment/f-router",
        "Service/f-frontend",
        "Deployment/f-frontend",
        *policies,
        "NetworkPolicy/f-router",
        "NetworkPolicy/f-frontend",
    ]


def _container(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    spec = manifest["spec"]["template"]["spec"]
    found: dict[str, Any] = next(
        c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name
    )
    return found


def test_worker_pods_run_the_probe_first() -> None:
    for name in ("Deployment/f-prefill", "Deployment/f-decode"):
        probe = _container(children(base(workers=PD))[name], "probe")
        assert probe["command"] == [
            "kvretention",
            "probe",
            "--report-only",
            "--termination-log",
            "/dev/termination-log",
        ]
        assert probe["terminationMessagePolicy"] == "File"


def test_disaggregated_wiring() -> None:
    kids = children(base(workers=PD))
    prefill = _container(kids["Deployment/f-prefill"], "worker")["command"]
    decode = _container(kids["Deployment/f-decode"], "worker")["command"]
    assert prefill[:14] == [
        "kvretention",
        "worker",
        "--engine",
        "sglang",
        "--role",
        "prefill",
        "--host",
        "0.0.0.0",
        "--port",
        "8002",
        "--metrics-port",
        "9100",
        "--bootstrap-port",
        "8998",
    ]
    assert "--hicache-storage-backend" in prefill and "--hicache-storage-backend" not in decode
    assert "CONFIG_HASH" not in json.dumps(kids["Deployment/f-decode"])
    assert CONFIG_HASH_ANNOTATION not in json.dumps(kids["Deployment/f-decode"])
    router = _container(kids["Deployment/f-router"], "router")["command"]
    assert router[-4:] == [
        "--prefill-dns",
        "f-prefill.ns.svc:8002",
        "--decode-dns",
        "f-decode.ns.svc:8002",
    ]
    assert kids["Deployment/f-prefill"]["spec"]["replicas"] == 2
    assert kids["Deployment/f-decode"]["spec"]["replicas"] == 1


def test_frontend_points_at_the_router() -> None:
    cr = KvRetentionDeployment.from_k8s(base(frontend={"service": {"port": 80}}))
    command = _container(children(base())["Deployment/f-frontend"], "frontend")["command"]
    assert command[-11:] == [
        "--router-url",
        "http://f-router:8001",
        "--model",
        "m",
        "--openai-hints",
        "--anthropic-hints",
        "--breakpoints=prefix",
        "--hint-priority=50",
        "--normalize-clients",
        "--prefix-routing",
        "--session-keys=" + ",".join(DEFAULT_SESSION_KEYS),
    ]
    assert frontend_endpoint(cr) == "http://f-frontend.ns.svc:80"


@pytest.mark.parametrize(
    ("hints", "expected"),
    [
        (
            {},
            [
                "--breakpoints=prefix",
                "--hint-priority=50",
                "--normalize-clients",
                "--prefix-routing",
            ],
        ),
        (
            {
                "breakpoints": "Prefix",
                "priority": 90,
                "defaultTtlSeconds": 600,
                "normalizeClients": False,
            },
            [
                "--breakpoints=prefix",
                "--hint-priority=90",
                "--default-ttl-seconds=600",
                "--no-normalize-clients",
                "--prefix-routing",
            ],
        ),
    ],
    ids=["defaults", "all-set"],
)
def test_hint_policy_flags(hints: dict[str, object], expected: list[str]) -> None:
    command = _container(children(base(hints=hints))["Deployment/f-frontend"], "frontend")[
        "command"
    ]
    start = command.index("--anthropic-hints") + 1
    assert command[start : start + len(expected)] == expected


@pytest.mark.parametrize(
    ("model", "router", "frontend_tail", "router_policy"),
    [
        (
            {"aliases": ["claude-haiku-4-5", "gpt-5-codex"]},
            {"sessionKeys": ["metadata.user_id"], "policy": "LeastOutstanding"},
            [
                "--no-prefix-routing",
                "--model-alias=claude-haiku-4-5=m",
                "--model-alias=gpt-5-codex=m",
                "--session-keys=metadata.user_id",
            ],
            "least-outstanding",
        ),
        ({}, {"sessionKeys": []}, ["--prefix-routing", "--session-keys="], "cache-aware"),
    ],
    ids=["aliases-and-keys", "no-affinity"],
)
def test_agent_routing_flags(
    model: dict[str, object],
    router: dict[str, object],
    frontend_tail: list[str],
    router_policy: str,
) -> None:
    body = base(router=router)
    body["spec"]["model"].update(model)
    kids = children(body)
    frontend = _container(kids["Deployment/f-frontend"], "frontend")["command"]
    assert frontend[-len(frontend_tail) :] == frontend_tail
    router_cmd = _container(kids["Deployment/f-router"], "router")["command"]
    assert router_cmd[router_cmd.index("--policy") + 1] == router_policy


HICACHE_LAYOUT = [
    *("--hicache-write-policy", "write_through"),
    *("--hicache-io-backend", "kernel"),
    *("--hicache-mem-layout", "page_first"),
]
"""The host-cache flags every enabled hicache gets, whatever its ratio and storage backend."""


@pytest.mark.parametrize(
    ("hicache", "expected_tail"),
    [
        (
            {},
            [
                "--enable-hierarchical-cache",
                *HICACHE_LAYOUT,
                *("--hicache-storage-backend", "mooncake"),
                *("--hicache-storage-prefetch-policy", "timeout"),
            ],
        ),
        (
            {"ratio": 1.5, "storageBackend": "none"},
            ["--enable-hierarchical-cache", "--hicache-ratio", "1.5", *HICACHE_LAYOUT],
        ),
        ({"enabled": False}, ["--enable-metrics"]),
    ],
)
def test_sglang_hicache_args(hicache: Body, expected_tail: list[str]) -> None:
    hints = {"providers": {"openai": False, "anthropic": False}}
    cr = KvRetentionDeployment.from_k8s(base(hints=hints, workers={"hicache": hicache}))
    args = build_sglang_args(cr.spec, role="aggregated")
    assert args[:9] == [
        "--model-path",
        "org/m",
        "--served-model-name",
        "m",
        "--tp-size",
        "1",
        "--page-size",
        "64",
        "--enable-metrics",
    ]
    assert args[-len(expected_tail) :] == expected_tail


def test_mooncake_master_args_follow_the_spec() -> None:
    cr = KvRetentionDeployment.from_k8s(
        base(
            kvStore={
                "mooncake": {
                    "master": {
                        "rpcPort": 1,
                        "metricsPort": 2,
                        "metadataPort": 3,
                        "softPin": {
                            "defaultTtlSeconds": 60,
                            "maxTtlSeconds": 43200,
                            "allowEviction": False,
                            "budgetRatio": 0.5,
                        },
                    }
                }
            }
        )
    )
    args = build_mooncake_master_args(cr.spec)
    assert args[0] == "mooncake_master"
    for flag in (
        "--rpc_port=1",
        "--metrics_port=2",
        "--http_metadata_server_port=3",
        "--default_kv_soft_pin_ttl=60000",
        "--max_kv_soft_pin_ttl=43200000",
        "--allow_evict_soft_pinned_objects=false",
        "--enable_http_metadata_server=true",
    ):
        assert flag in args


@pytest.mark.parametrize(
    ("kv_store", "expected"),
    [
        (
            {},
            {
                "master_server_address": "h:50051",
                "metadata_server": "http://h:8080/metadata",
                "protocol": "tcp",
                "device_name": "",
                "global_segment_size": "4gb",
                "master_metrics_port": 9003,
                "kvretention": {"max_pin_ttl_ms": 86_400_000},
            },
        ),
        (
            {
                "mooncake": {
                    "mode": "external",
                    "external": {"masterAddress": "x:7"},
                    "transfer": {"protocol": "rdma", "device": "mlx5_0"},
                }
            },
            {
                "master_server_address": "x:7",
                "metadata_server": "P2PHANDSHAKE",
                "protocol": "rdma",
                "device_name": "mlx5_0",
                "global_segment_size": "4gb",
                "kvretention": {"max_pin_ttl_ms": 86_400_000},
            },
        ),
        (
            {
                "mooncake": {
                    "mode": "external",
                    "external": {"masterAddress": "x:7", "tenant": "t.f"},
                }
            },
            {
                "master_server_address": "x:7",
                "metadata_server": "P2PHANDSHAKE",
                "protocol": "tcp",
                "device_name": "",
                "global_segment_size": "4gb",
                "tenant_id": "t.f",
                "kvretention": {"max_pin_ttl_ms": 86_400_000},
            },
        ),
        (
            {
                "mooncake": {
                    "mode": "external",
                    "external": {"masterAddress": "x:7", "metricsPort": 9003, "tenant": "t.f"},
                }
            },
            {
                "master_server_address": "x:7",
                "metadata_server": "P2PHANDSHAKE",
                "protocol": "tcp",
                "device_name": "",
                "global_segment_size": "4gb",
                "master_metrics_port": 9003,
                "tenant_id": "t.f",
                "kvretention": {"max_pin_ttl_ms": 86_400_000},
            },
        ),
    ],
)
def test_mooncake_client_config(kv_store: Body, expected: Body) -> None:
    cr = KvRetentionDeployment.from_k8s(base(kvStore=kv_store))
    assert build_mooncake_client_config(cr.spec, master_host="h") == expected


@pytest.mark.parametrize(
    ("workers", "role", "deployment"),
    [({}, "aggregated", "Deployment/f-worker"), (PD, "decode", "Deployment/f-decode")],
)
def test_scale_selector_matches_the_scaled_pool(workers: Body, role: str, deployment: str) -> None:
    cr = KvRetentionDeployment.from_k8s(base(workers=workers))
    assert scaled_role(cr) == role
    match_labels = children(base(workers=workers))[deployment]["spec"]["selector"]["matchLabels"]
    assert scale_selector(cr) == ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        (None, {"limits": {"nvidia.com/gpu": 2}}),
        (
            {"requests": {"nvidia.com/gpu": 2, "cpu": 4}},
            {"requests": {"cpu": 4, "nvidia.com/gpu": 2}, "limits": {"nvidia.com/gpu": 2}},
        ),
        (
            {"requests": {"example.com/fpga": 1}},
            {
                "requests": {"example.com/fpga": 1},
                "limits": {"example.com/fpga": 1, "nvidia.com/gpu": 2},
            },
        ),
        ({"limits": {"nvidia.com/gpu": 2}}, {"limits": {"nvidia.com/gpu": 2}}),
    ],
    ids=["tp-only", "gpu-request-only", "other-extended-request", "limit-given"],
)
def test_extended_resource_requests_get_an_equal_limit(resources: Body, expected: Body) -> None:
    pool: Body = {"tensorParallelSize": 2}
    if resources is not None:
        pool["resources"] = resources
    deployment = children(base(workers={"aggregated": pool}))["Deployment/f-worker"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == expected


SERVICE_PODS = {
    "frontend": ("frontend", "Deployment/f-frontend"),
    "router": ("router", "Deployment/f-router"),
    "master": ("kvStore", "Deployment/f-mooncake"),
}


def _service_spec(component: str, resources: Body) -> Body:
    field, _ = SERVICE_PODS[component]
    if component == "master":
        return {field: {"mooncake": {"master": {"resources": resources}}}}
    return {field: {"resources": resources}}


@pytest.mark.parametrize("component", sorted(SERVICE_PODS))
@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        (None, {"requests": {"cpu": "100m", "memory": "128Mi"}}),
        ({"requests": {"cpu": 2}}, {"requests": {"cpu": 2}}),
        ({"limits": {"memory": "1Gi"}}, {"limits": {"memory": "1Gi"}}),
    ],
    ids=["unset-is-never-best-effort", "requests-given", "limits-given"],
)
def test_service_pods_request_cpu_unless_the_user_says(
    component: str, resources: Body | None, expected: Body
) -> None:
    """A frontend, router or master that requests nothing would be BestEffort: the last to get
    CPU on a busy node (probes time out, it leaves its Service), the first evicted."""
    body = base(**_service_spec(component, resources)) if resources is not None else base()
    deployment = children(body)[SERVICE_PODS[component][1]]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == expected


@pytest.mark.parametrize(
    ("workers", "surge", "unavailable", "drain", "grace"),
    [
        ({}, 0, 1, "30", 55),
        ({"rollout": {"maxSurge": 1, "maxUnavailable": 0}, "drainSeconds": 120}, 1, 0, "120", 145),
        ({"rollout": {"maxUnavailable": 2}, "drainSeconds": 0}, 0, 2, "0", 25),
    ],
    ids=["defaults", "surge-when-gpus-spare", "faster"],
)
def test_workers_roll_without_a_spare_gpu_and_drain_before_stopping(
    workers: Body, surge: int, unavailable: int, drain: str, grace: int
) -> None:
    kids = children(base(workers=workers))
    deployment = kids["Deployment/f-worker"]
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable},
    }
    pod = deployment["spec"]["template"]["spec"]
    worker = _container(deployment, "worker")
    # The router lets go first (preStop), then SIGTERM drains the streams, all within the grace.
    assert worker["lifecycle"] == {"preStop": {"sleep": {"seconds": 10}}}
    command = worker["command"]
    assert command[command.index("--drain-seconds") + 1] == drain
    assert command.index("--drain-seconds") < command.index("--")
    assert pod["terminationGracePeriodSeconds"] == grace
    pdb = kids["PodDisruptionBudget/f-worker"]
    assert pdb["spec"] == {
        "maxUnavailable": unavailable,
        "selector": deployment["spec"]["selector"],
    }
    assert pdb["metadata"]["ownerReferences"] == deployment["metadata"]["ownerReferences"]
    # Only workers: the frontend and router keep the default rolling update.
    assert "strategy" not in kids["Deployment/f-frontend"]["spec"]


@pytest.mark.parametrize(
    ("workers", "threshold", "deadline"),
    [
        # 30 minutes to load weights; the Deployment waits 10 more for scheduling and the pull.
        ({}, 180, 2400),
        ({"startupTimeoutSeconds": 3600}, 360, 4200),
        ({"startupTimeoutSeconds": 65}, 7, 665),  # rounded up to whole probe periods
        ({"startupTimeoutSeconds": 60}, 6, 660),
        ({"startupTimeoutSeconds": 60, "rollout": {"progressDeadlineSeconds": 61}}, 6, 61),
        ({"rollout": {"progressDeadlineSeconds": 7200}}, 180, 7200),
        ({**PD, "startupTimeoutSeconds": 5400}, 540, 6000),
    ],
    ids=["defaults", "an-hour", "rounded-up", "shortest", "shortest-deadline", "slow-pulls", "pd"],
)
def test_worker_startup_window_sets_the_probe_and_the_progress_deadline(
    workers: Body, threshold: int, deadline: int
) -> None:
    kids = children(base(workers=workers))
    pools = [
        k
        for k in ("Deployment/f-worker", "Deployment/f-prefill", "Deployment/f-decode")
        if k in kids
    ]
    assert pools
    for key in pools:
        deployment = kids[key]
        assert deployment["spec"]["progressDeadlineSeconds"] == deadline, key
        worker = _container(deployment, "worker")
        assert worker["startupProbe"] == {
            "httpGet": {"path": "/healthz", "port": 8002},
            "periodSeconds": 10,
            "failureThreshold": threshold,
        }
        # Liveness waits for the startup probe, so it never restarts a worker that is loading.
        assert worker["livenessProbe"]["failureThreshold"] == 3
    # Only workers load a model: the other Deployments keep Kubernetes' default (600 s).
    for key in ("Deployment/f-frontend", "Deployment/f-router", "Deployment/f-mooncake"):
        assert "progressDeadlineSeconds" not in kids[key]["spec"], key


def test_progress_deadline_lives_outside_the_pod_template() -> None:
    """A longer deadline changes no pod: the workers keep running (no rollout)."""
    before = children(base())["Deployment/f-worker"]
    after = children(base(workers={"rollout": {"progressDeadlineSeconds": 7200}}))[
        "Deployment/f-worker"
    ]
    assert after["spec"]["template"] == before["spec"]["template"]
    assert after["spec"]["progressDeadlineSeconds"] != before["spec"]["progressDeadlineSeconds"]


def test_each_worker_pool_has_its_own_budget() -> None:
    kids = children(base(workers=PD))
    for pool in ("prefill", "decode"):
        pdb = kids[f"PodDisruptionBudget/f-{pool}"]
        assert pdb["spec"]["selector"] == kids[f"Deployment/f-{pool}"]["spec"]["selector"]


POD_OPTIONS: Body = {
    "labels": {"team": "inference"},
    "annotations": {"example.com/cost-center": "42"},
    "nodeSelector": {"node.kubernetes.io/instance-type": "h200"},
    "tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Equal", "value": "yes", "tolerationSeconds": 30},
    ],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h200"]}]}
                ]
            }
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
        }
    ],
    "priorityClassName": "inference-high",
    "runtimeClassName": "nvidia",
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccountName": "fleet",
    "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
    "volumes": [{"name": "cache", "emptyDir": {}}],
    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
}
PASSED_THROUGH = (
    "nodeSelector",
    "tolerations",
    "affinity",
    "topologySpreadConstraints",
    "priorityClassName",
    "runtimeClassName",
    "imagePullSecrets",
    "serviceAccountName",
)


@pytest.mark.parametrize(
    ("workers", "path", "deployments"),
    [
        ({}, "frontend.pod", ["f-frontend"]),
        ({}, "router.pod", ["f-router"]),
        ({}, "workers.pod", ["f-worker"]),
        (PD, "workers.pod", ["f-prefill", "f-decode"]),
        ({}, "kvStore.mooncake.master.pod", ["f-mooncake"]),
    ],
    ids=["frontend", "router", "workers", "both-pools", "mooncake-master"],
)
def test_pod_options_reach_exactly_their_components_pods(
    workers: Body, path: str, deployments: list[str]
) -> None:
    body = base(workers=copy.deepcopy(workers))
    plain = children(body)
    _set(path, POD_OPTIONS)(body)
    kids = children(body)
    touched = {key for key, m in kids.items() if m["kind"] == "Deployment" and m != plain.get(key)}
    assert touched == {f"Deployment/{d}" for d in deployments}
    for name in deployments:
        template = kids[f"Deployment/{name}"]["spec"]["template"]
        pod = template["spec"]
        for key in PASSED_THROUGH:
            assert pod[key] == POD_OPTIONS[key], key
        # Ours win and stay: selector labels, the config hash, our env, volumes and mounts.
        assert template["metadata"]["labels"]["team"] == "inference"
        selector = kids[f"Deployment/{name}"]["spec"]["selector"]["matchLabels"]
        assert selector.items() <= template["metadata"]["labels"].items()
        assert template["metadata"]["annotations"]["example.com/cost-center"] == "42"
        old_pod = plain[f"Deployment/{name}"]["spec"]["template"]["spec"]
        assert pod["volumes"] == [*old_pod.get("volumes", []), *POD_OPTIONS["volumes"]]
        for container, old in zip(pod["containers"], old_pod["containers"], strict=True):
            assert container["env"] == [*old.get("env", []), *POD_OPTIONS["env"]]
            assert container["volumeMounts"] == [
                *old.get("volumeMounts", []),
                *POD_OPTIONS["volumeMounts"],
            ]
        for init in pod.get("initContainers", []):
            assert "env" not in init and "volumeMounts" not in init


def test_unset_pod_options_leave_the_pod_alone() -> None:
    assert children(base(frontend={"pod": {}})) == children(base())

"""Model validation: the same rules the CRD's schema and CEL enforce, judged without a cluster."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvretention.api.models import (
    API_VERSION,
    DEFAULT_WORKER_IMAGE,
    KvRetentionDeployment,
    SpecError,
)

NO_HINTS = {"policy": "Optional", "providers": {"openai": False, "anthropic": False}}


def body(spec: dict[str, Any] | None = None, *, name: str = "demo") -> dict[str, Any]:
    base: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "KvRetentionDeployment",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"model": {"name": "qwen", "path": "Qwen/Qwen3-0.6B"}},
    }
    base["spec"].update(copy.deepcopy(spec or {}))
    return base


def test_minimal_body_gets_defaults() -> None:
    cr = KvRetentionDeployment.from_k8s(body())
    spec = cr.spec
    assert (cr.name, cr.namespace) == ("demo", "ns")
    assert spec.hints.policy == "Optional" and spec.hints.active()
    assert spec.workers.mode == "aggregated" and spec.workers.replicas == 1
    assert spec.workers.image == DEFAULT_WORKER_IMAGE
    assert spec.workers.hicache.write_policy == "write_through"
    assert spec.workers.hicache.storage_backend == "mooncake"
    assert spec.kv_store.mooncake.mode == "managed"
    assert spec.kv_store.mooncake.master.soft_pin.max_ttl_seconds == 86400
    assert spec.frontend.service.port == 8000


def test_camel_case_on_the_wire_round_trips() -> None:
    cr = KvRetentionDeployment.from_k8s(
        body({"workers": {"hicache": {"sizeGiB": 8}, "aggregated": {"tensorParallelSize": 2}}})
    )
    assert cr.spec.workers.hicache.size_gib == 8
    dumped = cr.spec.model_dump(by_alias=True, exclude_none=True)
    assert dumped["workers"]["hicache"]["sizeGiB"] == 8
    assert dumped["workers"]["aggregated"]["tensorParallelSize"] == 2
    assert dumped["kvStore"]["mooncake"]["master"]["softPin"]["maxTtlSeconds"] == 86400


VALID = [
    pytest.param(
        {"hints": NO_HINTS, "workers": {"hicache": {"enabled": False}}}, id="no-hints-no-hicache"
    ),
    pytest.param(
        {"hints": NO_HINTS, "workers": {"hicache": {"storageBackend": "none"}}}, id="no-hints-no-l3"
    ),
    pytest.param(
        {"workers": {"mode": "disaggregated", "prefill": {"replicas": 2}, "decode": {}}},
        id="disaggregated",
    ),
    pytest.param(
        {"kvStore": {"mooncake": {"mode": "external", "external": {"masterAddress": "mc:50051"}}}},
        id="external",
    ),
    pytest.param(
        {
            "kvStore": {
                "mooncake": {
                    "master": {"softPin": {"defaultTtlSeconds": 3600, "maxTtlSeconds": 43200}}
                }
            }
        },
        id="soft-pin-max-12h",
    ),
    pytest.param(
        {
            "kvStore": {
                "mooncake": {"master": {"softPin": {"allowEviction": False, "budgetRatio": 0.5}}}
            }
        },
        id="pins-that-hold-with-a-budget",
    ),
    pytest.param(
        {"kvStore": {"mooncake": {"master": {"softPin": {"budgetRatio": 0.3}}}}},
        id="budget-with-evictable-pins",
    ),
    pytest.param(
        {"hints": {"policy": "Required", "providers": {"openai": False}}},
        id="required-anthropic-only",
    ),
    pytest.param(
        {"workers": {"hicache": {"writePolicy": "write_through_selective"}}}, id="selective"
    ),
    pytest.param(
        {"model": {"name": "m", "path": "/m", "volume": {"claimName": "weights"}}}, id="pvc"
    ),
    pytest.param(
        {
            "model": {
                "name": "m",
                "path": "/m",
                "toolCallParser": "gpt-oss",
                "reasoningParser": "gpt-oss",
                "aliases": ["claude-sonnet-4-5[1m]", "claude-haiku-4-5@20251001", "gpt-5-codex"],
            }
        },
        id="agent-model",
    ),
    pytest.param(
        {"model": {"name": "m", "path": "/m", "aliases": ["claude-*", "gpt-*", "*-codex", "*"]}},
        id="alias-patterns",
    ),
    pytest.param({"workers": {"gpuResource": "amd.com/gpu"}}, id="gpu-amd"),
    pytest.param(
        {
            "workers": {
                "pod": {
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "nodeSelector": {"gpu": "h200"},
                    "affinity": {"podAntiAffinity": {}},
                    "imagePullSecrets": [{"name": "regcred"}],
                }
            }
        },
        id="pod-options",
    ),
    pytest.param({"workers": {"gpuResource": ""}}, id="gpu-none"),
    pytest.param({"workers": {"startupTimeoutSeconds": 60}}, id="startup-min"),
    pytest.param({"workers": {"startupTimeoutSeconds": 86400}}, id="startup-max"),
    pytest.param(
        {"workers": {"startupTimeoutSeconds": 60, "rollout": {"progressDeadlineSeconds": 61}}},
        id="deadline-just-past-startup",
    ),
    pytest.param(
        {
            "workers": {
                "startupTimeoutSeconds": 86400,
                "rollout": {"progressDeadlineSeconds": 87000},
            }
        },
        id="deadline-max",
    ),
    *(
        pytest.param(
            {"kvStore": {"mooncake": {"mode": "external", "external": {"masterAddress": a}}}},
            id=f"master-{a}",
        )
        for a in ("mc:1", "mc.ns.svc:65535", "[::1]:50051", "10.0.0.1:50051")
    ),
]


@pytest.mark.parametrize("spec", VALID)
def test_valid_specs(spec: dict[str, Any]) -> None:
    KvRetentionDeployment.from_k8s(body(spec))


INVALID = [
    pytest.param({"model": None}, "spec.model", id="model-missing"),
    pytest.param({"model": {"name": "", "path": "p"}}, "spec.model.name", id="model-name-empty"),
    pytest.param({"hints": {"policy": "Always"}}, "spec.hints.policy", id="policy-enum"),
    pytest.param(
        {"hints": {"policy": "Required", "providers": {"openai": False, "anthropic": False}}},
        "hints.policy Required needs at least one provider",
        id="required-without-providers",
    ),
    pytest.param(
        {"workers": {"mode": "disaggregated"}},
        "workers.mode disaggregated needs workers.prefill and workers.decode",
        id="disagg-without-pools",
    ),
    pytest.param(
        {"workers": {"mode": "disaggregated", "prefill": {}}},
        "workers.mode disaggregated needs workers.prefill and workers.decode",
        id="disagg-without-decode",
    ),
    pytest.param(
        {"workers": {"prefill": {}}},
        "workers.mode aggregated takes workers.aggregated, not prefill/decode",
        id="aggregated-with-prefill",
    ),
    pytest.param(
        {"workers": {"mode": "disaggregated", "prefill": {}, "decode": {}, "aggregated": {}}},
        "not aggregated",
        id="disagg-with-aggregated",
    ),
    pytest.param(
        {"workers": {"hicache": {"enabled": False}}},
        "retention hints (hints.policy Required or any hints.providers enabled) need",
        id="hints-without-hicache",
    ),
    pytest.param(
        {"workers": {"hicache": {"writePolicy": "write_back"}}},
        "a write-through writePolicy",
        id="hints-with-write-back",
    ),
    pytest.param(
        {"workers": {"hicache": {"storageBackend": "none"}}},
        "storageBackend mooncake",
        id="hints-without-mooncake",
    ),
    pytest.param(
        {"workers": {"hicache": {"ratio": 2.0, "sizeGiB": 8}}},
        "set ratio or sizeGiB, not both",
        id="ratio-and-size",
    ),
    pytest.param(
        {"workers": {"hicache": {"memLayout": "layer_first"}}},
        "needs a page-first memLayout",
        id="mooncake-layer-first",
    ),
    pytest.param(
        {"workers": {"aggregated": {"tensorParallelSize": 0}}},
        "tensorParallelSize",
        id="tp-zero",
    ),
    pytest.param({"workers": {"replicas": -1}}, "spec.workers.replicas", id="replicas-negative"),
    pytest.param(
        {"kvStore": {"mooncake": {"mode": "external"}}},
        "mode external needs kvStore.mooncake.external.masterAddress",
        id="external-without-address",
    ),
    pytest.param(
        {"kvStore": {"mooncake": {"external": {"masterAddress": "mc:50051"}}}},
        "mode managed must not set kvStore.mooncake.external",
        id="managed-with-external",
    ),
    pytest.param(
        {"kvStore": {"mooncake": {"mode": "external", "external": {"masterAddress": "no-port"}}}},
        "masterAddress",
        id="external-address-without-port",
    ),
    pytest.param(
        {"kvStore": {"mooncake": {"master": {"softPin": {"maxTtlSeconds": 1800}}}}},
        "maxTtlSeconds",
        id="soft-pin-max-below-largest-hint",
    ),
    pytest.param(
        {"kvStore": {"mooncake": {"master": {"softPin": {"maxTtlSeconds": 90000}}}}},
        "maxTtlSeconds",
        id="soft-pin-max-above-a-day",
    ),
    pytest.param(
        {"kvStore": {"mooncake": {"master": {"softPin": {"maxTtlSeconds": 3600}}}}},
        "maxTtlSeconds",
        id="soft-pin-max-below-longest-hint-12h",
    ),
    pytest.param(
        {
            "kvStore": {
                "mooncake": {
                    "master": {"softPin": {"defaultTtlSeconds": 50000, "maxTtlSeconds": 43200}}
                }
            }
        },
        "softPin.defaultTtlSeconds must not exceed softPin.maxTtlSeconds",
        id="soft-pin-default-above-max",
    ),
    pytest.param(
        {
            "kvStore": {
                "mooncake": {"master": {"eviction": {"highWatermarkRatio": 0.5, "ratio": 0.6}}}
            }
        },
        "eviction.ratio must be below eviction.highWatermarkRatio",
        id="eviction-ratio-above-watermark",
    ),
    pytest.param(
        {"kvStore": {"mooncake": {"master": {"softPin": {"allowEviction": False}}}}},
        "softPin.allowEviction false needs softPin.budgetRatio",
        id="pins-that-hold-without-a-budget",
    ),
    pytest.param(
        {
            "kvStore": {
                "mooncake": {
                    "master": {
                        "eviction": {"highWatermarkRatio": 0.8},
                        "softPin": {"allowEviction": False, "budgetRatio": 0.8},
                    }
                }
            }
        },
        "softPin.budgetRatio must be below eviction.highWatermarkRatio",
        id="budget-at-the-watermark",
    ),
    pytest.param(
        {"kvStore": {"mooncake": {"master": {"softPin": {"budgetRatio": 0}}}}},
        "budgetRatio",
        id="budget-zero",
    ),
    pytest.param(
        {"kvStore": {"mooncake": {"transfer": {"protocol": "ib"}}}},
        "protocol",
        id="transfer-protocol-enum",
    ),
    pytest.param(
        {"kvStore": {"mooncake": {"transfer": {"globalSegmentSize": "4Gi"}}}},
        "globalSegmentSize",
        id="segment-size-format",
    ),
    pytest.param(
        {"model": {"name": "m", "path": "/m", "volume": {"claimName": "a", "hostPath": "/b"}}},
        "exactly one of claimName or hostPath",
        id="volume-both",
    ),
    pytest.param({"workers": {"gpus": 1}}, "spec.workers.gpus", id="unknown-field"),
    pytest.param(
        {"model": {"name": "m", "path": "/m", "toolCallParser": "qwen9"}},
        "toolCallParser",
        id="tool-call-parser-enum",
    ),
    pytest.param(
        {"model": {"name": "m", "path": "/m", "reasoningParser": "r2"}},
        "reasoningParser",
        id="reasoning-parser-enum",
    ),
    pytest.param(
        {"model": {"name": "m", "path": "/m", "aliases": ["m"]}},
        "model.aliases must not repeat model.name",
        id="alias-is-the-name",
    ),
    pytest.param(
        {"model": {"name": "m", "path": "/m", "aliases": ["a", "a"]}},
        "model.aliases must be unique",
        id="alias-duplicate",
    ),
    pytest.param(
        {"model": {"name": "m", "path": "/m", "aliases": ["bad name"]}},
        "aliases",
        id="alias-pattern",
    ),
    pytest.param(
        {"model": {"name": "m", "path": "/m", "aliases": ["claude-?"]}},
        "aliases",
        id="alias-only-star-is-a-wildcard",
    ),
    pytest.param(
        {"model": {"name": "m", "path": "/m", "aliases": ["-claude-*"]}},
        "aliases",
        id="alias-leading-dash",
    ),
    pytest.param({"router": {"sessionKeys": ["x session"]}}, "sessionKeys", id="session-key-space"),
    pytest.param({"router": {"sessionKeys": ["metadata."]}}, "sessionKeys", id="session-key-body"),
    pytest.param({"router": {"policy": "RoundRobin"}}, "policy", id="router-policy-enum"),
    pytest.param(
        {
            "hints": {"defaultTtlSeconds": 50000},
            "kvStore": {"mooncake": {"master": {"softPin": {"maxTtlSeconds": 43200}}}},
        },
        "hints.defaultTtlSeconds must not exceed kvStore.mooncake.master.softPin.maxTtlSeconds",
        id="default-ttl-above-soft-pin-max",
    ),
    pytest.param({"hints": {"breakpoints": "Widen"}}, "breakpoints", id="breakpoints-enum"),
    pytest.param({"hints": {"priority": 0}}, "priority", id="priority-range"),
    # Strict types, as the API server is: a string is never coerced to a number or a boolean.
    pytest.param({"workers": {"replicas": "2"}}, "spec.workers.replicas", id="replicas-string"),
    pytest.param(
        {"workers": {"aggregated": {"tensorParallelSize": "2"}}},
        "spec.workers.aggregated.tensorParallelSize",
        id="tp-string",
    ),
    pytest.param(
        {"hints": {"providers": {"openai": "false"}}},
        "spec.hints.providers.openai",
        id="bool-string",
    ),
    pytest.param({"frontend": {"replicas": 1.0}}, "spec.frontend.replicas", id="replicas-float"),
    pytest.param(
        {"workers": {"hicache": {"enabled": 1}}}, "spec.workers.hicache.enabled", id="bool-int"
    ),
    pytest.param(
        {"workers": {"rollout": {"maxSurge": 0, "maxUnavailable": 0}}},
        "workers.rollout: maxSurge and maxUnavailable must not both be 0",
        id="rollout-stuck",
    ),
    pytest.param(
        {"workers": {"drainSeconds": -1}}, "spec.workers.drainSeconds", id="drain-negative"
    ),
    *(
        pytest.param(
            {"workers": {"startupTimeoutSeconds": value}},
            "spec.workers.startupTimeoutSeconds",
            id=f"startup-{value!r}",
        )
        for value in (59, 0, 86401, "1800", 1800.5)
    ),
    *(
        pytest.param(
            {"workers": {"rollout": {"progressDeadlineSeconds": value}}},
            "spec.workers.rollout.progressDeadlineSeconds",
            id=f"deadline-{value!r}",
        )
        for value in (60, 87001, "2400")
    ),
    *(
        pytest.param(
            {"workers": {**workers, "rollout": {"progressDeadlineSeconds": deadline}}},
            "workers.rollout.progressDeadlineSeconds must exceed workers.startupTimeoutSeconds",
            id=f"deadline-{deadline}-within-startup",
        )
        # The default startup window (1800) counts when the spec leaves it out.
        for workers, deadline in (({}, 1800), ({}, 600), ({"startupTimeoutSeconds": 120}, 120))
    ),
    *(
        pytest.param(
            {"workers": {"gpuResource": name}},
            "workers.gpuResource must be a vendor resource name such as nvidia.com/gpu",
            id=f"gpu-resource-{name}",
        )
        for name in (
            "cpu",
            "memory",
            "hugepages-2Mi",
            "kubernetes.io/gpu",
            "x.kubernetes.io/g",
            "nvidia.com/",
        )
    ),
    *(
        pytest.param(
            {"kvStore": {"mooncake": {"mode": "external", "external": {"masterAddress": a}}}},
            "kvStore.mooncake.external.masterAddress port must be 1-65535",
            id=f"master-port-{a}",
        )
        for a in ("mc:0", "mc:99999", "mc:65536", "[::1]:00000")
    ),
]


@pytest.mark.parametrize(("spec", "expected"), INVALID)
def test_invalid_specs(spec: dict[str, Any], expected: str) -> None:
    raw = body(spec)
    if spec.get("model", "keep") is None:
        del raw["spec"]["model"]
    with pytest.raises(SpecError) as err:
        KvRetentionDeployment.from_k8s(raw)
    assert expected in str(err.value)
    assert "Traceback" not in str(err.value) and "Value error" not in str(err.value)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("", "metadata.name: required"), ("x" * 55, "at most 54 characters")],
)
def test_names(name: str, expected: str) -> None:
    with pytest.raises(SpecError, match=expected):
        KvRetentionDeployment.from_k8s(body(name=name))


def test_status_tolerates_unknown_fields() -> None:
    raw = body()
    raw["status"] = {"observedGeneration": 2, "workersReady": "1/1", "futureField": 1}
    cr = KvRetentionDeployment.from_k8s(raw)
    assert cr.status is not None and cr.status.workers_ready == "1/1"

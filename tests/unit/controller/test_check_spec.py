"""check_spec: problems the schema cannot see, one message each; a workable spec has none."""

from __future__ import annotations

from typing import Any

import pytest

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources import check_spec
from kvretention.controller.resources.checks import segment_bytes


def cr(**spec: Any) -> KvRetentionDeployment:
    return KvRetentionDeployment.from_k8s(
        {
            "apiVersion": "kvretention.io/v1alpha1",
            "kind": "KvRetentionDeployment",
            "metadata": {"name": "c"},
            "spec": {"model": {"name": "m", "path": "p"}, **spec},
        }
    )


PD = {"mode": "disaggregated", "prefill": {}, "decode": {}}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, []),
        ({"workers": {"aggregated": {"extraArgs": ["--mem-fraction-static", "0.8"]}}}, []),
        (
            {
                "workers": {
                    "aggregated": {
                        "tensorParallelSize": 2,
                        "resources": {"limits": {"nvidia.com/gpu": 2, "memory": "64Gi"}},
                    }
                }
            },
            [],
        ),
        (
            {"workers": {"aggregated": {"extraArgs": ["--model-path=/x"]}}},
            [
                "spec.workers.aggregated.extraArgs[0]: --model-path is set by the operator from the spec; change the matching spec field instead"
            ],
        ),
        (
            {"workers": {**PD, "decode": {"extraArgs": ["--enable-hicache"]}}},
            [
                "spec.workers.decode.extraArgs[0]: --enable-hicache (SGLang reads it as --enable-hierarchical-cache) is set by the operator from the spec; change the matching spec field instead"
            ],
        ),
        (
            {"workers": {**PD, "bootstrapPort": 8002}},
            ["spec.workers.bootstrapPort: 8002 is the worker's HTTP port; choose another"],
        ),
        (
            {"workers": {**PD, "bootstrapPort": 9100}},
            ["spec.workers.bootstrapPort: 9100 is the worker's metrics port; choose another"],
        ),
        (
            {"frontend": {"resources": {"requests": {"cpu": 2}, "limits": {"cpu": "1500m"}}}},
            ["spec.frontend.resources: requests.cpu exceeds limits.cpu"],
        ),
        (
            {
                "workers": {
                    **PD,
                    "prefill": {
                        "tensorParallelSize": 4,
                        "resources": {"limits": {"nvidia.com/gpu": 2}},
                    },
                }
            },
            [
                "spec.workers.prefill.resources.limits.nvidia.com/gpu is 2 but tensorParallelSize is 4: SGLang needs one GPU per rank"
            ],
        ),
        (
            {
                "workers": {
                    "gpuResource": "amd.com/gpu",
                    "aggregated": {"resources": {"limits": {"nvidia.com/gpu": 8}}},
                }
            },
            [],
        ),
        (  # a GPU request without a limit is fine (the builder sets the limit), if it fits TP
            {"workers": {"aggregated": {"resources": {"requests": {"nvidia.com/gpu": 1}}}}},
            [],
        ),
        (
            {"workers": {"aggregated": {"resources": {"requests": {"nvidia.com/gpu": 2}}}}},
            [
                "spec.workers.aggregated.resources.requests.nvidia.com/gpu is 2 but tensorParallelSize is 1: SGLang needs one GPU per rank"
            ],
        ),
        (
            {
                "workers": {
                    "aggregated": {
                        "resources": {
                            "requests": {"example.com/fpga": 1},
                            "limits": {"example.com/fpga": 2},
                        }
                    }
                }
            },
            [
                "spec.workers.aggregated.resources: requests.example.com/fpga must equal limits.example.com/fpga (Kubernetes does not overcommit extended resources)"
            ],
        ),
        (
            {"kvStore": {"mooncake": {"transfer": {"globalSegmentSize": "1"}}}},
            [
                "spec.kvStore.mooncake.transfer.globalSegmentSize: 1 is below the minimum of 67108864 bytes (64 MiB)"
            ],
        ),
        ({"kvStore": {"mooncake": {"transfer": {"globalSegmentSize": "67108864"}}}}, []),
        ({"kvStore": {"mooncake": {"transfer": {"globalSegmentSize": "1gb"}}}}, []),
        (
            {"workers": {"aggregated": {"resources": {"limits": {"memory": "3Gi"}}}}},
            [
                "spec.workers.aggregated.resources.limits.memory 3Gi is below the 4Gi the worker needs for its HiCache host pool (hicache.sizeGiB x tensorParallelSize) plus its Mooncake segment (kvStore.mooncake.transfer.globalSegmentSize)"
            ],
        ),
        (
            {"workers": {"aggregated": {"resources": {"limits": {"memory": "4Gi"}}}}},
            [],
        ),
        (
            {"workers": {**PD, "decode": {"resources": {"limits": {"memory": "1Gi"}}}}},
            [],
        ),
        (
            {"kvStore": {"mooncake": {"master": {"metadataPort": 50051}}}},
            [
                "spec.kvStore.mooncake.master: rpcPort, metricsPort and metadataPort must differ, got 50051, 9003, 50051"
            ],
        ),
        (
            {
                "kvStore": {
                    "mooncake": {
                        "mode": "external",
                        "external": {"masterAddress": "a:1"},
                        "master": {"metadataPort": 50051},
                    }
                }
            },
            [],
        ),
    ],
)
def test_check_spec(spec: dict[str, Any], expected: list[str]) -> None:
    assert check_spec(cr(**spec)) == expected


@pytest.mark.parametrize(("value", "expected"), [("4gb", 4 * 2**30), ("1048576", 2**20)])
def test_segment_bytes(value: str, expected: int) -> None:
    assert segment_bytes(value) == expected


MANAGED = "is set by the operator from the spec; change the matching spec field instead"


@pytest.mark.parametrize(
    ("extra_args", "expected"),
    [
        (["--mem-fraction-static", "0.8"], []),
        (["--mem-frac", "0.8"], []),  # an abbreviation of a flag the user may set
        (["--disable-radix-cache", "--no-enable-tf32-matmul"], []),
        (["--model-path=/x"], [f"[0]: --model-path {MANAGED}"]),
        (["--model", "/x"], [f"[0]: --model (SGLang reads it as --model-path) {MANAGED}"]),
        (["--tp-siz", "4"], [f"[0]: --tp-siz (SGLang reads it as --tp-size) {MANAGED}"]),
        (
            ["--tensor-parallel=4"],
            [f"[0]: --tensor-parallel (SGLang reads it as --tp-size) {MANAGED}"],
        ),
        (
            ["--mem-frac", "0.8", "--served", "x"],
            [f"[2]: --served (SGLang reads it as --served-model-name) {MANAGED}"],
        ),
        (["--tool-call-parser", "qwen"], [f"[0]: --tool-call-parser {MANAGED}"]),
        (
            ["--config", "/etc/sglang.yaml"],
            [
                "[0]: --config reads SGLang flags from a file the operator cannot check (it could "
                "override the flags rendered from the spec); list the flags in extraArgs"
            ],
        ),
        (
            ["--conf=/etc/sglang.yaml"],
            [
                "[0]: --conf reads SGLang flags from a file the operator cannot check (it could "
                "override the flags rendered from the spec); list the flags in extraArgs"
            ],
        ),
        (
            ["--no-such-flag"],
            [": SGLang 0.5.23 would refuse these: unrecognized arguments: --no-such-flag"],
        ),
        (["stray"], [": SGLang 0.5.23 would refuse these: unrecognized arguments: stray"]),
        (
            ["--mem-fraction-static"],
            [
                ": SGLang 0.5.23 would refuse these: argument --mem-fraction-static: expected one argument"
            ],
        ),
        (
            ["--enable-h"],
            [
                ": SGLang 0.5.23 would refuse these: ambiguous option: --enable-h could match "
                "--enable-http2, --enable-hierarchical-cache, --enable-hicache, --enable-hisparse, "
                "--enable-http-worker-reuseport"
            ],
        ),
    ],
)
def test_extra_args_are_read_with_sglangs_parser(
    extra_args: list[str], expected: list[str]
) -> None:
    spec = {"workers": {"aggregated": {"extraArgs": extra_args}}}
    assert check_spec(cr(**spec)) == [f"spec.workers.aggregated.extraArgs{e}" for e in expected]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"workers": {"pod": {"labels": {"team": "a"}, "env": [{"name": "A", "value": "1"}]}}}, []),
        (
            {"frontend": {"pod": {"labels": {"app.kubernetes.io/instance": "x"}}}},
            [
                "spec.frontend.pod.labels: app.kubernetes.io/instance is set by the operator (it selects pods on it)"
            ],
        ),
        (
            {"workers": {"pod": {"annotations": {"kvretention.io/config-hash": "x"}}}},
            ["spec.workers.pod.annotations: kvretention.io/config-hash is set by the operator"],
        ),
        (
            {"workers": {"pod": {"env": [{"name": "POD_IP", "value": "1.2.3.4"}]}}},
            ["spec.workers.pod.env[0]: POD_IP is set by the operator"],
        ),
        (
            {"router": {"pod": {"env": [{"value": "x"}, {"name": "A"}, {"name": "A"}]}}},
            [
                "spec.router.pod.env[0].name: required (a non-empty string)",
                "spec.router.pod.env[2].name: 'A' is repeated",
            ],
        ),
        (
            {"workers": {"pod": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}},
            ["spec.workers.pod.volumes[0]: the name dshm is used by the operator"],
        ),
        (
            {
                "kvStore": {
                    "mooncake": {
                        "master": {
                            "pod": {"volumeMounts": [{"name": "v", "mountPath": "/dev/shm/"}]}
                        }
                    }
                }
            },
            [
                "spec.kvStore.mooncake.master.pod.volumeMounts[0]: /dev/shm/ is already mounted by the operator"
            ],
        ),
        (
            {
                "workers": {
                    "pod": {"volumeMounts": [{"name": "v"}, {"name": "v", "mountPath": "/a"}]}
                }
            },
            ["spec.workers.pod.volumeMounts[0].mountPath: required (a non-empty string)"],
        ),
        (
            {
                "model": {
                    "name": "m",
                    "path": "/w",
                    "volume": {"claimName": "c", "mountPath": "/w"},
                },
                "workers": {"pod": {"volumeMounts": [{"name": "v", "mountPath": "/w"}]}},
            },
            ["spec.workers.pod.volumeMounts[0]: /w is already mounted by the operator"],
        ),
    ],
)
def test_pod_options_cannot_take_over_the_operators_settings(
    spec: dict[str, Any], expected: list[str]
) -> None:
    assert check_spec(cr(**spec)) == expected

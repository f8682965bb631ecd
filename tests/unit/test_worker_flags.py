"""The worker alone decides SGLang's disaggregation flags: the command the operator renders, parsed
by the worker's own CLI, hands SGLang each of them exactly once, with the values the spec says."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources.workers import build_worker_command
from kvretention.dataplane.worker.cli import worker_cmd
from kvretention.dataplane.worker.engine import build_sglang_argv, without_unloaded_policy


def _cr(workers: dict[str, Any], transfer: dict[str, Any] | None = None) -> KvRetentionDeployment:
    spec: dict[str, Any] = {"model": {"name": "m", "path": "org/m"}, "workers": workers}
    if transfer is not None:
        spec["kvStore"] = {"mooncake": {"transfer": transfer}}
    return KvRetentionDeployment.from_k8s(
        {
            "apiVersion": "kvretention.io/v1alpha1",
            "kind": "KvRetentionDeployment",
            "metadata": {"name": "f", "namespace": "ns", "uid": "u-1"},
            "spec": spec,
        }
    )


def effective_sglang_argv(command: list[str]) -> list[str]:
    """What ``kvretention worker`` hands SGLang for a rendered command line."""
    assert command[:2] == ["kvretention", "worker"]
    params = worker_cmd.make_context("worker", command[2:]).params
    return build_sglang_argv(
        params["server_args"],
        role=params["role"],
        bootstrap_port=params["bootstrap_port"],
        ib_device=params["ib_device"],
    )


def _disaggregation(argv: list[str]) -> dict[str, list[str]]:
    flags: dict[str, list[str]] = {}
    for flag, value in itertools.pairwise(argv):
        if flag.startswith("--disaggregation-"):
            flags.setdefault(flag, []).append(value)
    return flags


PD = {"mode": "disaggregated", "prefill": {}, "decode": {}, "bootstrapPort": 9100}
RDMA = {"protocol": "rdma", "device": "mlx5_0"}
MODE = "--disaggregation-mode"
BACKEND = "--disaggregation-transfer-backend"
PORT = "--disaggregation-bootstrap-port"
DEVICE = "--disaggregation-ib-device"


@pytest.mark.parametrize(
    ("workers", "transfer", "role", "expected"),
    [
        ({}, None, "aggregated", {}),
        ({}, RDMA, "aggregated", {}),
        (PD, None, "prefill", {MODE: ["prefill"], BACKEND: ["mooncake"], PORT: ["9100"]}),
        (PD, None, "decode", {MODE: ["decode"], BACKEND: ["mooncake"]}),
        (
            PD,
            RDMA,
            "prefill",
            {MODE: ["prefill"], BACKEND: ["mooncake"], PORT: ["9100"], DEVICE: ["mlx5_0"]},
        ),
        (PD, RDMA, "decode", {MODE: ["decode"], BACKEND: ["mooncake"], DEVICE: ["mlx5_0"]}),
        (PD, {"protocol": "tcp"}, "decode", {MODE: ["decode"], BACKEND: ["mooncake"]}),
    ],
    ids=[
        "aggregated",
        "aggregated-rdma",
        "prefill",
        "decode",
        "prefill-rdma",
        "decode-rdma",
        "decode-tcp",
    ],
)
def test_each_disaggregation_flag_reaches_sglang_once(
    workers: dict[str, Any], transfer: dict[str, Any] | None, role: Any, expected: dict[str, Any]
) -> None:
    command = build_worker_command(_cr(workers, transfer), role)
    sglang_part = command[command.index("--") + 1 :]
    assert _disaggregation(sglang_part) == {}, "the operator renders none of SGLang's PD flags"
    assert _disaggregation(effective_sglang_argv(command)) == expected


@pytest.mark.parametrize(
    ("argv", "choices", "kept"),
    [
        pytest.param(
            ["--radix-eviction-policy", "kvretain", "--page-size", "16"],
            ["lru", "priority", "kvretain"],
            ["--radix-eviction-policy", "kvretain", "--page-size", "16"],
            id="plugin-loaded-keeps-the-flag",
        ),
        pytest.param(
            ["--radix-eviction-policy", "kvretain", "--page-size", "16"],
            ["lru", "priority"],
            ["--page-size", "16"],
            id="plugin-not-loaded-drops-the-pair",
        ),
        pytest.param(
            ["--radix-eviction-policy=kvretain", "--page-size", "16"],
            ["lru"],
            ["--page-size", "16"],
            id="equals-form-dropped",
        ),
        pytest.param(
            ["--radix-eviction-policy", "lfu"],
            ["lru", "lfu"],
            ["--radix-eviction-policy", "lfu"],
            id="a-users-own-policy-untouched",
        ),
    ],
)
def test_kvretain_is_dropped_only_when_sglang_lacks_the_choice(
    argv: list[str], choices: list[str], kept: list[str]
) -> None:
    assert without_unloaded_policy(argv, choices) == kept

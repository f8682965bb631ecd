"""``spec.workers.radixPinRatio``: the share of each worker's GPU KV pool that kv.retain holds may
keep pinned, rendered as the worker container's ``KVR_RADIX_PIN_RATIO`` and read by the retention
plugin inside SGLang's scheduler."""

from __future__ import annotations

from typing import Any

import pytest

from kvretention.api.models import KvRetentionDeployment, SpecError
from kvretention.api.spec_workers import DEFAULT_RADIX_PIN_RATIO
from kvretention.controller.resources import build_children
from kvretention.controller.resources.checks import check_spec
from kvretention.controller.resources.workers import WORKER_CONTAINER
from kvretention.retention import pins, plugin

Body = dict[str, Any]
PD: Body = {"mode": "disaggregated", "prefill": {}, "decode": {}}
MULTINODE: Body = {"aggregated": {"tensorParallelSize": 2}, "nodesPerReplica": 2}


def fleet(workers: Body) -> KvRetentionDeployment:
    return KvRetentionDeployment.from_k8s(
        {
            "apiVersion": "kvretention.io/v1alpha1",
            "kind": "KvRetentionDeployment",
            "metadata": {"name": "f", "namespace": "ns", "uid": "u-1"},
            "spec": {"model": {"name": "m", "path": "org/m"}, "workers": workers},
        }
    )


def _templates(node: Any) -> list[Body]:
    """Every pod template in a child (a Deployment's, or an LWS's leader and worker templates)."""
    if not isinstance(node, dict):
        return []
    found = [node] if isinstance(node.get("spec"), dict) and "containers" in node["spec"] else []
    return found + [t for value in node.values() for t in _templates(value)]


def pin_ratios(cr: KvRetentionDeployment) -> dict[str, list[str | None]]:
    """Per child holding worker containers: each one's ``KVR_RADIX_PIN_RATIO`` (None: not set)."""
    out: dict[str, list[str | None]] = {}
    for child in build_children(cr):
        for template in _templates(child.get("spec")):
            for container in template["spec"]["containers"]:
                if container["name"] != WORKER_CONTAINER:
                    continue
                env = {e["name"]: e.get("value") for e in container.get("env", [])}
                name = f"{child['kind']}/{child['metadata']['name']}"
                out.setdefault(name, []).append(env.get(pins.RATIO_ENV))
    return out


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        pytest.param({}, {"Deployment/f-worker": [None]}, id="unset"),
        pytest.param({"radixPinRatio": 0.75}, {"Deployment/f-worker": ["0.75"]}, id="aggregated"),
        pytest.param({"radixPinRatio": 1}, {"Deployment/f-worker": ["1.0"]}, id="whole-pool"),
        pytest.param(
            {**PD, "radixPinRatio": 0.3},
            {"Deployment/f-prefill": ["0.3"], "Deployment/f-decode": ["0.3"]},
            id="every-pool",
        ),
        pytest.param(
            {**MULTINODE, "radixPinRatio": 0.6},
            {"LeaderWorkerSet/f-worker-lws": ["0.6", "0.6"]},
            id="multinode-leader-and-workers",
        ),
    ],
)
def test_the_ratio_reaches_every_worker_container(
    workers: Body, expected: dict[str, list[str | None]]
) -> None:
    assert pin_ratios(fleet(workers)) == expected


@pytest.mark.parametrize("ratio", [0, 0.0, -0.5, 1.01, 2, "half", True])
def test_a_ratio_outside_zero_to_one_is_refused(ratio: Any) -> None:
    with pytest.raises(SpecError, match=r"spec\.workers\.radixPinRatio"):
        fleet({"radixPinRatio": ratio})


@pytest.mark.parametrize(
    ("workers", "problems"),
    [
        pytest.param(
            {"radixPinRatio": 0.75, "pod": {"env": [{"name": pins.RATIO_ENV, "value": "0.9"}]}},
            [
                f"spec.workers.pod.env[0]: {pins.RATIO_ENV} is set by "
                "spec.workers.radixPinRatio; set one of the two"
            ],
            id="both-places",
        ),
        pytest.param(
            {"pod": {"env": [{"name": pins.RATIO_ENV, "value": "0.9"}]}}, [], id="env-alone"
        ),
        pytest.param({"radixPinRatio": 0.75}, [], id="field-alone"),
    ],
)
def test_the_ratio_is_set_in_one_place(workers: Body, problems: list[str]) -> None:
    assert [p for p in check_spec(fleet(workers)) if pins.RATIO_ENV in p] == problems


def test_the_spec_names_the_plugins_own_default() -> None:
    assert DEFAULT_RADIX_PIN_RATIO == pins.DEFAULT_RATIO


@pytest.mark.parametrize(
    ("raw", "ratio"),
    [
        pytest.param(None, pins.DEFAULT_RATIO, id="unset"),
        pytest.param("0.75", 0.75, id="rendered"),
        pytest.param("1.0", 1.0, id="whole-pool"),
        pytest.param("0", pins.DEFAULT_RATIO, id="zero"),
        pytest.param("1.5", pins.DEFAULT_RATIO, id="above-one"),
        pytest.param("half", pins.DEFAULT_RATIO, id="not-a-number"),
    ],
)
def test_the_plugin_reads_the_rendered_ratio(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, ratio: float
) -> None:
    """What the operator renders is what the plugin uses; anything else keeps the default (the
    plugin never stops a worker from serving)."""
    if raw is None:
        monkeypatch.delenv(pins.RATIO_ENV, raising=False)
    else:
        monkeypatch.setenv(pins.RATIO_ENV, raw)
    assert plugin._pin_ratio() == ratio

"""``workers.autoscaling`` and ``workers.prefill.autoscaling``: bounds, min <= max, and no scale to
zero for a pool that retains hinted prefixes unless the user allows it (pydantic here; the same
rules as CEL are checked on the real API server in tests/integration/test_autoscaling.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvretention.api.models import API_VERSION, KvRetentionDeployment, SpecError

NO_HINTS = {"policy": "Optional", "providers": {"openai": False, "anthropic": False}}
ZERO = {"minReplicas": 0, "maxReplicas": 4, "target": 8}
ZERO_ALLOWED = {**ZERO, "allowScaleToZero": True}
SCALED = {"minReplicas": 1, "maxReplicas": 4, "target": 8}


def body(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "KvRetentionDeployment",
        "metadata": {"name": "demo", "namespace": "ns"},
        "spec": {"model": {"name": "qwen", "path": "Qwen/Qwen3-0.6B"}, **copy.deepcopy(spec)},
    }


def disaggregated(prefill: dict[str, Any] | None, decode: dict[str, Any] | None) -> dict[str, Any]:
    workers: dict[str, Any] = {"mode": "disaggregated", "prefill": {}, "decode": {}}
    if prefill is not None:
        workers["prefill"]["autoscaling"] = prefill
    if decode is not None:
        workers["autoscaling"] = decode
    return {"workers": workers}


VALID = [
    pytest.param({"workers": {"autoscaling": SCALED}}, id="aggregated"),
    pytest.param({"workers": {"autoscaling": ZERO_ALLOWED}}, id="aggregated-zero-allowed"),
    pytest.param(
        {"hints": NO_HINTS, "workers": {"autoscaling": ZERO, "hicache": {"enabled": False}}},
        id="aggregated-zero-without-hints",
    ),
    pytest.param(disaggregated(SCALED, SCALED), id="both-pools"),
    pytest.param(disaggregated(None, ZERO), id="decode-zero-retains-nothing"),
    pytest.param(disaggregated(ZERO_ALLOWED, None), id="prefill-zero-allowed"),
    pytest.param(
        {"workers": {"autoscaling": {"minReplicas": 3, "maxReplicas": 3, "target": 1}}},
        id="min-equals-max",
    ),
]

INVALID = [
    pytest.param(
        {"workers": {"autoscaling": ZERO}}, "allowScaleToZero", id="aggregated-zero-with-hints"
    ),
    pytest.param(disaggregated(ZERO, None), "allowScaleToZero", id="prefill-zero-with-hints"),
    pytest.param(
        {"hints": {"defaultTtlSeconds": 300, **NO_HINTS}, "workers": {"autoscaling": ZERO}},
        "allowScaleToZero",
        id="zero-with-a-default-ttl",
    ),
    pytest.param(
        {"workers": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2, "target": 1}}},
        "minReplicas must not exceed maxReplicas",
        id="min-above-max",
    ),
    pytest.param(
        {"workers": {"autoscaling": {"minReplicas": 1, "maxReplicas": 2, "target": 0}}},
        "target",
        id="zero-target",
    ),
    pytest.param(
        {"workers": {"autoscaling": {"minReplicas": 1, "target": 2}}},
        "maxReplicas",
        id="no-max",
    ),
]


@pytest.mark.parametrize("spec", VALID)
def test_valid_autoscaling_is_accepted(spec: dict[str, Any]) -> None:
    KvRetentionDeployment.from_k8s(body(spec))


@pytest.mark.parametrize(("spec", "message"), INVALID)
def test_invalid_autoscaling_is_refused(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        KvRetentionDeployment.from_k8s(body(spec))

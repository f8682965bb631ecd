"""Quantities and images as ``render`` judges them: parsed as the API server parses them, bounded
by what one node can have, refused with a message naming the field (the CEL side of the same rules
is checked against the real API server in tests/integration/test_cel_table.py)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from kvretention.api.models import KvRetentionDeployment, SpecError
from kvretention.api.quantity import NODE_BOUNDS, node_bound, parse_quantity, quantity_problem


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2, Decimal(2)),
        ("500m", Decimal("0.5")),
        ("16Gi", Decimal(16 * 2**30)),
        ("1G", Decimal(10**9)),
        ("1e3", Decimal(1000)),
        ("1.5Ki", Decimal(1536)),
        (".5", Decimal("0.5")),
        ("+2", Decimal(2)),
    ],
)
def test_parse_quantity(value: int | str, expected: Decimal) -> None:
    assert parse_quantity(value) == expected


@pytest.mark.parametrize(
    "value", ["", "Gi", "1 Gi", " 1", "1 ", "1gb", "one", "1.2.3", ".", "1e999999999"]
)
def test_parse_quantity_rejects(value: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(value)


@pytest.mark.parametrize(
    ("resource", "bound"),
    [
        ("cpu", "4096"),
        ("memory", "64Ti"),
        ("ephemeral-storage", "1Pi"),
        ("hugepages-2Mi", "64Ti"),
        ("nvidia.com/gpu", "4096"),
    ],
)
def test_node_bound(resource: str, bound: str) -> None:
    assert node_bound(resource) == bound
    assert dict(NODE_BOUNDS).get(resource, bound) == bound


@pytest.mark.parametrize(
    ("resource", "value", "problem"),
    [
        ("memory", "64Ti", None),
        ("memory", "1e100", "memory: '1e100' is more than one node can have (at most 64Ti)"),
        ("cpu", 4097, "cpu: 4097 is more than one node can have (at most 4096)"),
        ("cpu", "-1", "cpu: '-1' must not be negative"),
        ("nvidia.com/gpu", 8, None),
        (
            "hugepages-1Gi",
            "1Pi",
            "hugepages-1Gi: '1Pi' is more than one node can have (at most 64Ti)",
        ),
        ("cpu", "2 ", "cpu: '2 ' is not a Kubernetes quantity"),
    ],
)
def test_quantity_problem(resource: str, value: int | str, problem: str | None) -> None:
    assert quantity_problem(resource, value) == problem


def _cr(spec: dict[str, Any]) -> KvRetentionDeployment:
    return KvRetentionDeployment.from_k8s(
        {
            "apiVersion": "kvretention.io/v1alpha1",
            "kind": "KvRetentionDeployment",
            "metadata": {"name": "c"},
            "spec": {"model": {"name": "m", "path": "p"}, **spec},
        }
    )


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            {"workers": {"aggregated": {"resources": {"requests": {"memory": "1e100"}}}}},
            "spec.workers.aggregated.resources.requests: memory: '1e100' is more than one node "
            "can have (at most 64Ti)",
        ),
        (
            {"router": {"resources": {"limits": {"memory": "1 GB", "cpu": "-2"}}}},
            "spec.router.resources.limits: cpu: '-2' must not be negative; memory: '1 GB' is not "
            "a Kubernetes quantity",
        ),
        (
            {"frontend": {"image": " ghcr.io/kvretention/kvretention:0.1.0"}},
            "spec.frontend.image: must be an image reference",
        ),
        ({"workers": {"image": "ghcr.io/Org/worker:1"}}, "spec.workers.image: must be an image"),
        (
            {"kvStore": {"mooncake": {"master": {"image": "worker:1 "}}}},
            "spec.kvStore.mooncake.master.image: must be an image reference",
        ),
        ({"router": {"image": "a:b:c"}}, "spec.router.image: must be an image reference"),
    ],
)
def test_the_model_refuses_naming_the_field(spec: dict[str, Any], problem: str) -> None:
    with pytest.raises(SpecError) as refused:
        _cr(spec)
    assert [p for p in refused.value.problems if p.startswith(problem)], refused.value.problems


@pytest.mark.parametrize(
    "image",
    [
        "nginx",
        "ghcr.io/kvretention/worker:0.1.0",
        "localhost:5000/a/b_c__d-e:v1.2",
        "registry.example.com:443/team/model@sha256:" + "a" * 64,
        "lmsysorg/sglang:v0.5.3-cu129",
    ],
)
def test_the_model_accepts_image_references(image: str) -> None:
    assert _cr({"workers": {"image": image}}).spec.workers.image == image

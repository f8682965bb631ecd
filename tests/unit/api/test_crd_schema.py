"""The generated CRD is a structural schema with the names, subresources and columns agreed on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kvretention.api.cli import crds_cmd
from kvretention.api.crd import CRD_FILENAME, build_crd, structural
from kvretention.api.models import KvRetentionDeploymentSpec

FORBIDDEN_KEYS = {"$ref", "$defs", "title", "anyOf", "allOf", "oneOf", "const", "definitions"}


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _walk(node[key], f"{path}[{key}]")


def test_every_node_is_structural() -> None:
    problems = []
    for path, node in _walk(_schema()):
        if "type" not in node and not node.get("x-kubernetes-int-or-string"):
            problems.append(f"{path}: no type")
        if FORBIDDEN_KEYS & node.keys():
            problems.append(f"{path}: {sorted(FORBIDDEN_KEYS & node.keys())}")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{path}: properties beside additionalProperties")
        if node.get("type") == "array" and "items" not in node:
            problems.append(f"{path}: array without items")
        if node.get("type") == "integer" and node.get("format") not in ("int32", "int64"):
            problems.append(f"{path}: integer without int32/int64 format")
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            if key in node and not isinstance(node[key], bool):
                problems.append(f"{path}: numeric {key} (OpenAPI v3.0 wants a boolean)")
        if node.get("default", "absent") is None:
            problems.append(f"{path}: default null")
    assert problems == []


def test_every_spec_field_has_a_description() -> None:
    spec = _schema()["properties"]["spec"]
    missing = [p for p, node in _walk(spec) if p and "description" not in node]
    assert missing == []


def test_nullable_optional_and_defaulted_objects() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    assert spec["workers"]["properties"]["prefill"]["nullable"] is True
    assert spec["workers"]["default"]["mode"] == "aggregated"
    assert spec["workers"]["default"]["hicache"]["storageBackend"] == "mooncake"
    assert spec["workers"]["properties"]["hicache"]["default"]["writePolicy"] == "write_through"
    assert spec["kvStore"]["properties"]["mooncake"]["default"]["mode"] == "managed"
    assert "external" not in spec["kvStore"]["properties"]["mooncake"]["default"]
    assert _schema()["properties"]["spec"]["required"] == ["model"]


def test_names_scope_subresources_and_columns() -> None:
    crd = build_crd()
    names = crd["spec"]["names"]
    assert crd["metadata"]["name"] == "kvretentiondeployments.kvretention.io"
    assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == (
        "KvRetentionDeployment",
        "kvretentiondeployments",
        ["kvrd"],
        ["kvretention"],
    )
    assert crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["storage"] and version["served"]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.workers.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Ready": '.status.conditions[?(@.type=="Ready")].status',
        "Mode": ".spec.workers.mode",
        "Workers": ".status.workersReady",
        "Hints": '.status.conditions[?(@.type=="KvHintsSupported")].status',
        "Retention": '.status.conditions[?(@.type=="RetentionApplied")].reason',
        "Age": ".metadata.creationTimestamp",
    }


def test_status_shape_for_the_operator() -> None:
    status = _schema()["properties"]["status"]["properties"]
    conditions = status["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["required"]) == {"type", "status"}
    assert status["workersReady"]["type"] == "string"
    assert status["kopf"]["x-kubernetes-preserve-unknown-fields"] is True
    assert status["observedGeneration"]["format"] == "int64"
    assert set(status["engine"]["properties"]) == {
        "sglangVersion",
        "dialect",
        "kvHintsParameter",
        "storageBackends",
        "mooncakeImportable",
        "retentionPlugin",
        "hookTargetProblems",
        "device",
    }
    assert status["engine"]["properties"]["retentionPlugin"]["enum"] == [
        "loaded",
        "not_installed",
        "not_selected",
        "load_failed",
        "unsupported",
    ]


def _rules(node: dict[str, Any]) -> list[str]:
    return [
        m
        for _, n in _walk(node)
        for m in (r["message"] for r in n.get("x-kubernetes-validations", []))
    ]


def test_cel_rules_are_present_with_messages() -> None:
    messages = _rules(_schema())
    for expected in (
        "retention hints",
        "workers.mode disaggregated needs workers.prefill and workers.decode",
        "kvStore.mooncake.mode external needs kvStore.mooncake.external.masterAddress",
        "kvStore.mooncake.mode managed must not set kvStore.mooncake.external",
        "softPin.defaultTtlSeconds must not exceed softPin.maxTtlSeconds",
        "softPin.allowEviction false needs softPin.budgetRatio",
        "softPin.budgetRatio must be below eviction.highWatermarkRatio",
        "metadata.name must be at most 54 characters",
        "workers.rollout.progressDeadlineSeconds must exceed workers.startupTimeoutSeconds",
    ):
        assert any(expected in m for m in messages), expected


def test_soft_pin_max_ttl_bounds() -> None:
    soft_pin = _schema()["properties"]["spec"]["properties"]["kvStore"]["properties"]["mooncake"][
        "properties"
    ]["master"]["properties"]["softPin"]["properties"]
    # The minimum is the longest TTL the frontend emits (OpenAI Responses 12h).
    assert (soft_pin["maxTtlSeconds"]["minimum"], soft_pin["maxTtlSeconds"]["maximum"]) == (
        43200,
        86400,
    )


def test_worker_startup_window_bounds() -> None:
    workers = _schema()["properties"]["spec"]["properties"]["workers"]
    startup = workers["properties"]["startupTimeoutSeconds"]
    deadline = workers["properties"]["rollout"]["properties"]["progressDeadlineSeconds"]
    assert (startup["default"], startup["minimum"], startup["maximum"]) == (1800, 60, 86400)
    # No default: unset, the operator derives it from the startup window (+600 s).
    assert "default" not in deadline
    assert (deadline["minimum"], deadline["maximum"]) == (61, 87000)
    assert workers["default"]["startupTimeoutSeconds"] == 1800


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (
            {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "X"},
            {"type": "string", "nullable": True},
        ),
        (
            {"anyOf": [{"type": "integer"}, {"type": "string"}], "description": "q"},
            {"x-kubernetes-int-or-string": True, "description": "q"},
        ),
        (
            {"$ref": "#/$defs/A", "description": "outer"},
            {
                "type": "object",
                "description": "outer",
                "properties": {"n": {"type": "integer", "format": "int32", "maximum": 5}},
            },
        ),
        ({"type": "integer"}, {"type": "integer", "format": "int64"}),
        (
            {"type": "object", "additionalProperties": True},
            {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        ),
        ({"type": "number"}, {"type": "number", "format": "double"}),
        ({"const": "x", "type": "string"}, {"type": "string", "enum": ["x"]}),
        (
            {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            {
                "type": "number",
                "format": "double",
                "minimum": 0,
                "exclusiveMinimum": True,
                "maximum": 1,
                "exclusiveMaximum": True,
            },
        ),
    ],
)
def test_structural_rewrite(schema: dict[str, Any], expected: dict[str, Any]) -> None:
    defs = {
        "A": {
            "type": "object",
            "title": "A",
            "description": "inner",
            "additionalProperties": False,
            "properties": {"n": {"type": "integer", "maximum": 5, "title": "N"}},
        }
    }
    assert structural({**schema, "$defs": defs}) == expected


def test_structural_rejects_unions_it_cannot_express() -> None:
    with pytest.raises(ValueError, match="anyOf"):
        structural({"anyOf": [{"type": "string"}, {"type": "boolean"}]})


def test_spec_schema_generation_is_deterministic() -> None:
    first = KvRetentionDeploymentSpec.model_json_schema(by_alias=True)
    assert structural(first) == structural(
        KvRetentionDeploymentSpec.model_json_schema(by_alias=True)
    )


def test_crds_cli_prints_and_writes(tmp_path: Any) -> None:
    runner = CliRunner()
    printed = runner.invoke(crds_cmd, [])
    assert printed.exit_code == 0
    assert yaml.safe_load(printed.output)["kind"] == "CustomResourceDefinition"
    written = runner.invoke(crds_cmd, ["--write", str(tmp_path / "crds")])
    assert written.exit_code == 0
    assert (tmp_path / "crds" / CRD_FILENAME).read_text() == printed.output

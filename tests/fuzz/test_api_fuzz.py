"""Bad input at the API: odd specs through from_k8s -> check_spec -> build_children, odd probe reports.

Properties:

- ``KvRetentionDeployment.from_k8s`` raises only ``SpecError``; ``check_spec`` returns problems
  (meaning "don't build") and raises nothing; when both pass, ``build_children`` succeeds and every
  child has a valid name (DNS-1035 label for Services, DNS-1123 subdomain otherwise), the owner's
  namespace, the managed-by label and label values Kubernetes accepts, and serializes to JSON/YAML;
- ``parse_probe_report`` and ``compute_status`` never raise on any termination message, and the
  status they produce is one the CRD's status schema accepts.

Bodies are the examples under ``examples/`` with one to three values replaced: huge or negative
numbers, quantities such as ``1e3``/``0.5Gi``/``1e999999999``, unicode, empty and long strings,
wrong types. Every crash found is pinned below as a regression case.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from fuzz_strategies import budget, json_values, outcome
from hypothesis import given
from hypothesis import strategies as st

from kvretention.api.models import (
    FIELD_MANAGER,
    KvRetentionDeployment,
    KvRetentionDeploymentStatus,
    SpecError,
)
from kvretention.controller.probe_reports import PodReport, ProbeFailure, parse_probe_report
from kvretention.controller.resources import (
    build_children,
    check_spec,
    frontend_endpoint,
    scale_selector,
    scaled_workload,
)
from kvretention.controller.resources.checks import parse_quantity
from kvretention.controller.resources.common import LABEL_MANAGED_BY
from kvretention.controller.status import Endpoint, Fleet, Observed, Scale, compute_status
from support.sample_probe_reports import HINTS_REPORT

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
EXAMPLES: list[dict[str, Any]] = [
    yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES_DIR.glob("*.yaml"))
]
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _expanded(example: dict[str, Any]) -> dict[str, Any]:
    """The example with every default spelled out, so every field is a mutation target."""
    spec = KvRetentionDeployment.from_k8s(example).spec
    out = copy.deepcopy(example)
    out["spec"] = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    return out


BASES = [_expanded(e) for e in EXAMPLES]


def _paths(node: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    return out


POOLS = ("aggregated", "prefill", "decode")
RESOURCE_PATHS: list[tuple[str, ...]] = [
    ("spec", "frontend", "resources"),
    ("spec", "router", "resources"),
    ("spec", "kvStore", "mooncake", "master", "resources"),
    *(("spec", "workers", pool, "resources") for pool in POOLS),
]
GRAFTS: list[tuple[str, ...]] = [
    *RESOURCE_PATHS,
    *(("spec", "workers", pool, "extraArgs") for pool in POOLS),
    ("spec", "workers", "hicache", "sizeGiB"),
    ("spec", "workers", "hicache", "ratio"),
    ("spec", "workers", "gpuResource"),
    ("spec", "model", "volume"),
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("metadata", "uid"),
    ("metadata",),
]

odd_quantities = st.sampled_from(
    [
        "1e3",
        "0.5Gi",
        "1E",
        "1e999999999",
        "1e-999999999",
        "1E+999999",
        "-1",
        "+1",
        "-0.5Gi",
        ".",
        "1.",
        ".5",
        "1Ki",
        "1ki",
        "",
        " ",
        "1 Gi",
        "1e3Gi",
        "9" * 5000,
        "1e" + "9" * 5000,
        "1.2.3",
        "0x10",
        "\u0661\u0662",
        "1_000",
        "NaN",
        "Infinity",
    ]
)
USED_PORTS = [8000, 8001, 8002, 8080, 8998, 9003, 50051]
"""Ports the children already use: a spec value equal to one may collide."""
EDGE_NUMBERS = [0, -1, 1, 2, 63, 64, 65535, 65536, 86400, 86401, 2**31, 2**63, 10**30, -(10**30)]
odd_numbers = st.sampled_from([*EDGE_NUMBERS, *USED_PORTS]) | st.integers(
    min_value=-(2**70), max_value=2**70
)
odd_strings = (
    st.text(max_size=12)
    | st.text(min_size=250, max_size=300)
    | st.sampled_from(["", " ", "a.b", "1abc", "-a", "a-", "A", "a_b", "x" * 54, "x" * 55, "é"])
)
quantity_maps = st.dictionaries(
    st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "ephemeral-storage"]) | st.text(max_size=4),
    odd_quantities | odd_numbers | st.sampled_from(["2", "500m", "16Gi", 4]),
    max_size=3,
)
resources = st.fixed_dictionaries({}, optional={"requests": quantity_maps, "limits": quantity_maps})
paths_on_disk = st.sampled_from(
    [
        "",
        "/",
        "/models",
        "/dev/shm",
        "/dev/shm/",
        "/etc/kvretention/mooncake",
        "/a/../b",
        "rel",
        "x",
    ]
)
volumes = st.fixed_dictionaries(
    {}, optional={"claimName": paths_on_disk, "hostPath": paths_on_disk, "mountPath": paths_on_disk}
)
odd_values = st.one_of(
    odd_numbers,
    odd_quantities,
    odd_strings,
    st.floats(),
    st.booleans(),
    st.none(),
    resources,
    st.lists(odd_strings, max_size=3),
    json_values,
)


def _set(body: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node: Any = body
    for key in path[:-1]:
        if not isinstance(node, dict):
            return
        node = node.setdefault(key, {})
    if isinstance(node, dict):
        node[path[-1]] = value


@st.composite
def cr_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """An example CR with one to three values replaced by odd ones."""
    body = copy.deepcopy(draw(st.sampled_from(BASES)))
    targets = st.sampled_from(_paths(body) + GRAFTS)
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        _set(body, draw(targets), draw(odd_values))
    for _ in range(draw(st.integers(min_value=0, max_value=2))):  # quantities are the parsed part
        _set(body, draw(st.sampled_from(RESOURCE_PATHS)), draw(resources))
    if draw(st.integers(min_value=0, max_value=4)) == 0:
        _set(body, ("spec", "model", "volume"), draw(volumes))
    return body


def check_cr(body: dict[str, Any]) -> None:
    try:
        cr = KvRetentionDeployment.from_k8s(body)
    except SpecError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
        outcome("SpecError")
        return
    problems = check_spec(cr)
    assert all(isinstance(p, str) and p for p in problems)
    if problems:
        outcome("check_spec problems")
        return  # the operator builds nothing for this spec
    outcome("built")
    children = build_children(cr)
    assert children
    namespace = body["metadata"].get("namespace") or "default"
    assert DNS1123_LABEL.match(namespace) and len(namespace) <= 63, namespace
    for child in children:
        meta = child["metadata"]
        name = meta["name"]
        if child["kind"] == "Service":
            assert DNS1035_LABEL.match(name) and len(name) <= 63, name
        else:
            assert DNS1123_SUBDOMAIN.match(name) and len(name) <= 253, name
        assert meta["namespace"] == namespace
        assert meta["labels"][LABEL_MANAGED_BY] == FIELD_MANAGER
        for value in meta["labels"].values():
            assert LABEL_VALUE.match(value) and len(value) <= 63, value
        for quantity in _quantities(child):
            assert parse_quantity(quantity) >= 0, quantity
        check_api_server_rules(child)
    json.dumps(children)
    yaml.safe_dump(children)


QUALIFIED_NAME = re.compile(r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def check_api_server_rules(manifest: dict[str, Any]) -> None:
    """A few rules the API server enforces that a spec value can break: duplicate Service ports,
    duplicate container ports, malformed resource names, an empty hostPath."""
    if manifest["kind"] == "Service":
        ports = manifest["spec"]["ports"]
        assert len({(p["port"], p["protocol"]) for p in ports}) == len(ports), ports
        assert len({p["name"] for p in ports}) == len(ports), ports
        return
    pod = manifest.get("spec", {}).get("template", {}).get("spec", {})
    containers = pod.get("containers", []) + pod.get("initContainers", [])
    for container in containers:
        mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
        assert len(set(mounts)) == len(mounts), mounts
        ports = container.get("ports", [])
        assert len({(p["containerPort"], p["protocol"]) for p in ports}) == len(ports), ports
        for kind in ("requests", "limits"):
            for key in container.get("resources", {}).get(kind, {}):
                assert QUALIFIED_NAME.match(key), key
    for volume in pod.get("volumes", []):
        if "persistentVolumeClaim" in volume:
            assert volume["persistentVolumeClaim"]["claimName"]
        if "hostPath" in volume:
            path = volume["hostPath"]["path"]
            assert path and ".." not in path.split("/"), path


def _quantities(manifest: dict[str, Any]) -> list[int | str]:
    """Every request and limit of every container in a Deployment."""
    pod = manifest.get("spec", {}).get("template", {}).get("spec", {})
    out: list[int | str] = []
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        for kind in ("requests", "limits"):
            out += container.get("resources", {}).get(kind, {}).values()
    return out


@budget(300)
@given(body=cr_bodies())
def test_specs_either_fail_typed_or_build_valid_children(body: dict[str, Any]) -> None:
    check_cr(body)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e["metadata"]["name"])
def test_examples_build(example: dict[str, Any]) -> None:
    """The harness itself: unmutated examples pass every check and build."""
    cr = KvRetentionDeployment.from_k8s(example)
    assert check_spec(cr) == []
    check_cr(example)


# -- probe reports and status ----------------------------------------------------------------------


@st.composite
def probe_messages(draw: st.DrawFn) -> Any:
    """A termination message: garbage text, deep or huge JSON, or the report with wrong types."""
    kind = draw(st.sampled_from(["text", "json", "report", "deep", "huge", "raw"]))
    if kind == "text":
        return draw(st.text(max_size=64))
    if kind == "json":
        return json.dumps(draw(json_values))
    if kind == "deep":
        depth = draw(st.integers(min_value=1, max_value=100_000))
        return "[" * depth + "]" * depth
    if kind == "huge":  # a long string, or a number Python refuses to parse (> 4300 digits)
        digits = "9" * draw(st.integers(1, 20_000))
        quoted = draw(st.booleans())
        return (
            json.dumps(HINTS_REPORT)[:-1]
            + f', "sglang_version": {json.dumps(digits) if quoted else digits}}}'
        )
    if kind == "raw":  # the Kubernetes field is a string, but a broken client could send anything
        return draw(json_values)
    report = dict(HINTS_REPORT)
    for key in draw(st.lists(st.sampled_from([*HINTS_REPORT, "extra"]), max_size=4)):
        report[key] = draw(json_values)
    return json.dumps(report)


def _pod(name: str, message: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {
            "initContainerStatuses": [
                {"name": "probe", "state": {"terminated": {"exitCode": 0, "message": message}}}
            ]
        },
    }


FLEET_CR = KvRetentionDeployment.from_k8s({**EXAMPLES[0], "metadata": {"name": "f", "uid": "u"}})
FLEET = Fleet(
    name="f",
    namespace="default",
    generation=1,
    hints_required=True,
    desired=build_children(FLEET_CR),
    endpoint=Endpoint(service="f-frontend", url=frontend_endpoint(FLEET_CR)),
    scale=Scale(workload=scaled_workload(FLEET_CR), selector=scale_selector(FLEET_CR)),
)


@budget(200)
@given(messages=st.lists(probe_messages(), min_size=1, max_size=3))
def test_probe_reports_never_crash_status(messages: list[Any]) -> None:
    pods = [_pod(f"w-{i}", m) for i, m in enumerate(messages)]
    for pod in pods:
        report = parse_probe_report(pod)
        assert report is None or isinstance(report, PodReport | ProbeFailure)
    status = compute_status(FLEET, Observed(worker_pods=pods), previous=None, now=T0)
    KvRetentionDeploymentStatus.model_validate(status, strict=False)
    engine = status.get("engine")
    if engine is not None:
        assert isinstance(engine["sglangVersion"], str)
        assert all(isinstance(b, str) for b in engine["storageBackends"])
        assert isinstance(engine["kvHintsParameter"], bool)
        assert isinstance(engine["mooncakeImportable"], bool)
    json.dumps(status)


# -- regressions: shrunk examples the properties above found ---------------------------------------


def _example(**metadata: Any) -> dict[str, Any]:
    body = copy.deepcopy(EXAMPLES[0])
    body["metadata"] = metadata
    return body


def _with_requests(**requests: Any) -> dict[str, Any]:
    body = copy.deepcopy(EXAMPLES[0])
    body["spec"]["frontend"] = {"resources": {"requests": requests}}
    return body


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            {**EXAMPLES[0], "metadata": 5},
            "metadata: must be an object",
            id="metadata_int_was_AttributeError",
        ),
        pytest.param(
            _example(name="1e3"), "metadata.name: '1e3'", id="name_1e3_built_invalid_service_names"
        ),
        pytest.param(
            _example(name="0.5gi"), "metadata.name:", id="name_with_dot_built_invalid_service_names"
        ),
        pytest.param(
            _example(name="Qwen"), "metadata.name:", id="uppercase_name_built_invalid_names"
        ),
        pytest.param(
            _example(name="qwen", namespace="0.5Gi"),
            "metadata.namespace:",
            id="namespace_invalid_was_built",
        ),
        pytest.param(
            _example(name="qwen", namespace=-1),
            "metadata.namespace:",
            id="namespace_int_was_str_of_int",
        ),
    ],
)
def test_regression_metadata_is_a_spec_error(body: dict[str, Any], expected: str) -> None:
    with pytest.raises(SpecError) as err:
        KvRetentionDeployment.from_k8s(body)
    assert expected in str(err.value)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            _with_requests(cpu="1e999999999"),
            "'1e999999999' is not a Kubernetes quantity",
            id="overflow_was_decimal_Overflow",
        ),
        pytest.param(
            _with_requests(cpu="1e" + "9" * 5000),
            "is not a Kubernetes quantity",
            id="5000_digit_exponent",
        ),
        pytest.param(
            _with_requests(cpu="-1"), "'-1' must not be negative", id="negative_was_built"
        ),
        pytest.param(
            _with_requests(memory="-0.5Gi"), "must not be negative", id="negative_binary_was_built"
        ),
    ],
)
def test_regression_odd_quantities_are_problems(body: dict[str, Any], expected: str) -> None:
    try:  # refused by the schema (as the API server would) or by check_spec: a problem either way
        problems = check_spec(KvRetentionDeployment.from_k8s(body))
    except SpecError as exc:
        problems = exc.problems
    assert any(expected in p for p in problems), problems


DISAGGREGATED = next(e for e in EXAMPLES if e["spec"]["workers"]["mode"] == "disaggregated")


def _disaggregated(*path: str, value: Any) -> dict[str, Any]:
    body = copy.deepcopy(DISAGGREGATED)
    _set(body, path, value)
    return body


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            _with_requests(**{"": "1"}),
            "'' is not a valid resource name",
            id="empty_resource_name_was_built",
        ),
        pytest.param(
            _with_requests(**{"a b": "1"}),
            "'a b' is not a valid resource name",
            id="resource_name_with_space_was_built",
        ),
        pytest.param(
            _disaggregated("spec", "workers", "gpuResource", value="nvidia com/gpu"),
            "spec.workers.gpuResource",
            id="gpu_resource_name_was_built",
        ),
        pytest.param(
            _disaggregated("spec", "workers", "bootstrapPort", value=8002),
            "spec.workers.bootstrapPort",
            id="bootstrap_port_8002_duplicated_service_port",
        ),
        pytest.param(
            _disaggregated("spec", "model", "volume", value={"hostPath": ""}),
            "spec.model.volume.hostPath",
            id="empty_host_path_was_built",
        ),
        pytest.param(
            _disaggregated("spec", "model", "volume", value={"hostPath": "/a/../b"}),
            "spec.model.volume.hostPath",
            id="host_path_backstep_was_built",
        ),
        pytest.param(
            _disaggregated("spec", "model", "volume", value={"claimName": ""}),
            "spec.model.volume.claimName",
            id="empty_claim_name_was_built",
        ),
        pytest.param(
            _disaggregated(
                "spec", "model", "volume", value={"claimName": "w", "mountPath": "/dev/shm/"}
            ),
            "spec.model.volume.mountPath",
            id="mount_path_dev_shm_duplicated_a_mount",
        ),
    ],
)
def test_regression_children_the_api_server_would_refuse_are_problems(
    body: dict[str, Any], expected: str
) -> None:
    try:  # refused by the schema (as the API server would) or by check_spec: a problem either way
        problems = check_spec(KvRetentionDeployment.from_k8s(body))
    except SpecError as exc:
        problems = exc.problems
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    ("message", "error"),
    [
        pytest.param("[" * 100_000 + "]" * 100_000, "not JSON", id="deep_was_RecursionError"),
        pytest.param(
            '{"schema": 1, "sglang_version": ' + "9" * 5000 + "}", "not JSON", id="5000_digits"
        ),
        pytest.param(
            json.dumps({**HINTS_REPORT, "sglang_version": 9}),
            "sglang_version",
            id="version_int_made_status_invalid",
        ),
        pytest.param(
            json.dumps({**HINTS_REPORT, "hicache_storage_backends": 5}),
            "hicache_storage_backends",
            id="backends_int_was_TypeError",
        ),
        pytest.param(
            json.dumps({**HINTS_REPORT, "hicache_storage_backends": "mooncake"}),
            "hicache_storage_backends",
            id="backends_str_split_into_letters",
        ),
        pytest.param(
            json.dumps({**HINTS_REPORT, "kv_hints_parameter": "false"}),
            "kv_hints_parameter",
            id="string_false_read_as_true",
        ),
    ],
)
def test_regression_bad_probe_reports_are_probe_failures(message: str, error: str) -> None:
    report = parse_probe_report(_pod("w-0", message))
    assert isinstance(report, ProbeFailure) and error in report.error, report
    status = compute_status(
        FLEET, Observed(worker_pods=[_pod("w-0", message)]), previous=None, now=T0
    )
    hints = next(c for c in status["conditions"] if c["type"] == "KvHintsSupported")
    assert (hints["status"], hints["reason"]) == ("False", "ProbeReportInvalid")
    KvRetentionDeploymentStatus.model_validate(status)


def test_a_good_report_still_parses() -> None:
    report = parse_probe_report(_pod("w-0", json.dumps(HINTS_REPORT)))
    assert isinstance(report, PodReport)
    assert report.report.hicache_storage_backends == ("file", "mooncake")
    assert report.report.kv_hints_parameter

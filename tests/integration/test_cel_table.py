"""Every CEL rule of the generated CRD, judged by the real kube-apiserver and by the pydantic model
on the same objects: one that passes the rule and one that breaks it, per rule. They must agree.

The rules are read from ``crds/*.yaml`` (every ``x-kubernetes-validations`` in the schema), so a
rule added without a case here fails :func:`test_every_cel_rule_has_cases`, and a Python check that
drifts from its CEL twin fails :func:`test_cel_and_pydantic_agree`. The API server is the authority:
each object is created with a server-side dry run (nothing is stored).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from operator_fixtures import CRD_PATH

from kvretention.api.models import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    KvRetentionDeployment,
    SpecError,
)
from kvretention.api.quantity import QUANTITY_MESSAGE
from kvretention.api.spec import IMAGE_MESSAGE
from support.controlplane import ApplyCrd

pytestmark = pytest.mark.integration

Patch = dict[str, Any]


@dataclass(frozen=True)
class Rule:
    path: str
    """Where the rule sits in the CR (``.spec.workers``; ``""`` for the whole object)."""
    message: str
    rule: str

    @property
    def id(self) -> str:
        return f"{self.path or '.'}: {self.message[:60]}"


def _rules(node: Mapping[str, Any], path: str = "") -> Iterator[Rule]:
    for v in node.get("x-kubernetes-validations") or []:
        yield Rule(path, v.get("message", ""), v["rule"])
    for key, child in (node.get("properties") or {}).items():
        yield from _rules(child, f"{path}.{key}")
    if isinstance(node.get("items"), Mapping):
        yield from _rules(node["items"], f"{path}[*]")
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from _rules(node["additionalProperties"], f"{path}{{*}}")


CRD = yaml.safe_load(CRD_PATH.read_text())
RULES = list(_rules(CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))


# -- the table ------------------------------------------------------------------------------------

FIELD_CASES: dict[str, tuple[Any, Any]] = {
    # rules on a field, the same wherever it sits: (a value that passes, one that breaks it)
    IMAGE_MESSAGE: ("ghcr.io/acme/sglang:v0.5.3-cu129", " ghcr.io/acme/sglang:v0.5.3"),
    QUANTITY_MESSAGE: ({"cpu": "4", "memory": "64Ti"}, {"memory": "1e100"}),
}

POOL_ON: Patch = {"gateway": {"inferencePool": {"enabled": True}}}

RULE_CASES: dict[tuple[str, str], tuple[Patch, Patch]] = {
    # (path, message prefix): (a spec patch that passes, one that breaks it); "metadata" patches
    # the object's metadata
    # before the 54-character rule, whose message starts the same
    ("", "metadata.name must be at most 49 characters with"): (
        {"metadata": {"name": "a" * 49}, **POOL_ON},
        {"metadata": {"name": "a" * 50}, **POOL_ON},
    ),
    ("", "metadata.name must be at most"): (
        {"metadata": {"name": "a" * 54}},
        {"metadata": {"name": "a" * 55}},
    ),
    ("", "metadata.name must consist of"): (
        {"metadata": {"name": "fleet-1"}},
        {"metadata": {"name": "fleet.one"}},
    ),
    (".spec", "retention hints"): (
        {"workers": {"hicache": {"writePolicy": "write_through"}}},
        {"workers": {"hicache": {"writePolicy": "write_back"}}},
    ),
    (".spec", "hints.defaultTtlSeconds must not exceed"): (
        {"hints": {"defaultTtlSeconds": 43200}},
        {
            "hints": {"defaultTtlSeconds": 50000},
            "kvStore": {"mooncake": {"master": {"softPin": {"maxTtlSeconds": 43200}}}},
        },
    ),
    (".spec", "autoscaling.minReplicas 0 on a pool"): (
        {
            "workers": {
                "autoscaling": {
                    "minReplicas": 0,
                    "maxReplicas": 2,
                    "target": 4,
                    "allowScaleToZero": True,
                }
            }
        },
        {"workers": {"autoscaling": {"minReplicas": 0, "maxReplicas": 2, "target": 4}}},
    ),
    (".spec.router", "router.kvEvents places a request by its session"): (
        {"router": {"kvEvents": True}},
        {"router": {"kvEvents": True, "sessionKeys": []}},
    ),
    (".spec", "router.placement Frontend places on aggregated workers only"): (
        {"router": {"placement": "Frontend"}},
        {
            "router": {"placement": "Frontend"},
            "workers": {"mode": "disaggregated", "prefill": {}, "decode": {}},
        },
    ),
    (".spec.model", "model.aliases must not repeat"): (
        {"model": {"aliases": ["m2"]}},
        {"model": {"aliases": ["m"]}},
    ),
    (".spec.model.volume", "model.volume needs exactly one"): (
        {"model": {"volume": {"claimName": "models"}}},
        {"model": {"volume": {"claimName": "models", "hostPath": "/models"}}},
    ),
    (".spec.hints", "hints.policy Required needs"): (
        {"hints": {"policy": "Required"}},
        {"hints": {"policy": "Required", "providers": {"openai": False, "anthropic": False}}},
    ),
    (".spec.workers", "workers.mode disaggregated needs"): (
        {"workers": {"mode": "disaggregated", "prefill": {}, "decode": {}}},
        {"workers": {"mode": "disaggregated", "prefill": {}}},
    ),
    (".spec.workers", "workers.mode aggregated takes"): (
        {"workers": {"mode": "aggregated", "aggregated": {}}},
        {"workers": {"mode": "aggregated", "decode": {}}},
    ),
    (".spec.workers", "workers.mode disaggregated takes"): (
        {"workers": {"mode": "disaggregated", "prefill": {}, "decode": {}}},
        {"workers": {"mode": "disaggregated", "prefill": {}, "decode": {}, "aggregated": {}}},
    ),
    (".spec.workers", "workers.rollout.progressDeadlineSeconds must exceed"): (
        {"workers": {"startupTimeoutSeconds": 600, "rollout": {"progressDeadlineSeconds": 1200}}},
        {"workers": {"startupTimeoutSeconds": 600, "rollout": {"progressDeadlineSeconds": 600}}},
    ),
    (".spec.workers", "workers.aggregated.tensorParallelSize must be a multiple"): (
        {"workers": {"nodesPerReplica": 2, "aggregated": {"tensorParallelSize": 4}}},
        {"workers": {"nodesPerReplica": 2, "aggregated": {"tensorParallelSize": 3}}},
    ),
    (".spec.workers", "workers.prefill.tensorParallelSize must be a multiple"): (
        {
            "workers": {
                "mode": "disaggregated",
                "prefill": {"tensorParallelSize": 4, "nodesPerReplica": 2},
                "decode": {},
            }
        },
        {
            "workers": {
                "mode": "disaggregated",
                "prefill": {"tensorParallelSize": 3, "nodesPerReplica": 2},
                "decode": {},
            }
        },
    ),
    (".spec.workers", "workers.decode.tensorParallelSize must be a multiple"): (
        {
            "workers": {
                "mode": "disaggregated",
                "prefill": {},
                "decode": {"tensorParallelSize": 4, "nodesPerReplica": 2},
            }
        },
        {
            "workers": {
                "mode": "disaggregated",
                "prefill": {},
                "decode": {"tensorParallelSize": 3, "nodesPerReplica": 2},
            }
        },
    ),
    (".spec.workers.autoscaling", "autoscaling.minReplicas must not exceed"): (
        {"workers": {"autoscaling": {"minReplicas": 2, "maxReplicas": 2, "target": 4}}},
        {"workers": {"autoscaling": {"minReplicas": 3, "maxReplicas": 2, "target": 4}}},
    ),
    (".spec.workers.prefill.autoscaling", "autoscaling.minReplicas must not exceed"): (
        {
            "workers": {
                "mode": "disaggregated",
                "prefill": {"autoscaling": {"minReplicas": 1, "maxReplicas": 2, "target": 4}},
                "decode": {},
            }
        },
        {
            "workers": {
                "mode": "disaggregated",
                "prefill": {"autoscaling": {"minReplicas": 3, "maxReplicas": 2, "target": 4}},
                "decode": {},
            }
        },
    ),
    (".spec.workers.gpuResource", "workers.gpuResource must be a vendor"): (
        {"workers": {"gpuResource": "amd.com/gpu"}},
        {"workers": {"gpuResource": "memory"}},
    ),
    (".spec.workers.hicache", "hicache: set ratio or sizeGiB"): (
        {"workers": {"hicache": {"sizeGiB": 16}}},
        {"workers": {"hicache": {"sizeGiB": 16, "ratio": 2.0}}},
    ),
    (".spec.workers.hicache", "hicache.storageBackend mooncake needs"): (
        {"workers": {"hicache": {"memLayout": "page_first"}}},
        {"workers": {"hicache": {"memLayout": "layer_first"}}},
    ),
    (".spec.workers.rollout", "workers.rollout: maxSurge and maxUnavailable"): (
        {"workers": {"rollout": {"maxSurge": 1, "maxUnavailable": 0}}},
        {"workers": {"rollout": {"maxSurge": 0, "maxUnavailable": 0}}},
    ),
    (".spec.kvStore.mooncake", "kvStore.mooncake.mode external needs"): (
        {"kvStore": {"mooncake": {"mode": "external", "external": {"masterAddress": "m:50051"}}}},
        {"kvStore": {"mooncake": {"mode": "external"}}},
    ),
    (".spec.kvStore.mooncake", "kvStore.mooncake.mode managed must not"): (
        {"kvStore": {"mooncake": {"mode": "managed"}}},
        {"kvStore": {"mooncake": {"mode": "managed", "external": {"masterAddress": "m:50051"}}}},
    ),
    (".spec.kvStore.mooncake.master", "softPin.budgetRatio must be below"): (
        {"kvStore": {"mooncake": {"master": {"softPin": {"budgetRatio": 0.5}}}}},
        {"kvStore": {"mooncake": {"master": {"softPin": {"budgetRatio": 0.9}}}}},
    ),
    (".spec.kvStore.mooncake.master.eviction", "eviction.ratio must be below"): (
        {"kvStore": {"mooncake": {"master": {"eviction": {"ratio": 0.1}}}}},
        {"kvStore": {"mooncake": {"master": {"eviction": {"ratio": 0.95}}}}},
    ),
    (".spec.kvStore.mooncake.master.softPin", "softPin.defaultTtlSeconds must not exceed"): (
        {"kvStore": {"mooncake": {"master": {"softPin": {"defaultTtlSeconds": 3600}}}}},
        {
            "kvStore": {
                "mooncake": {
                    "master": {"softPin": {"defaultTtlSeconds": 50000, "maxTtlSeconds": 43200}}
                }
            }
        },
    ),
    (".spec.kvStore.mooncake.master.softPin", "softPin.allowEviction false needs"): (
        {
            "kvStore": {
                "mooncake": {"master": {"softPin": {"allowEviction": False, "budgetRatio": 0.5}}}
            }
        },
        {"kvStore": {"mooncake": {"master": {"softPin": {"allowEviction": False}}}}},
    ),
    (
        ".spec.kvStore.mooncake.external.masterAddress",
        "kvStore.mooncake.external.masterAddress port",
    ): (
        {"kvStore": {"mooncake": {"mode": "external", "external": {"masterAddress": "m:65535"}}}},
        {"kvStore": {"mooncake": {"mode": "external", "external": {"masterAddress": "m:65536"}}}},
    ),
}

CONTEXT: tuple[tuple[str, Patch], ...] = (
    # what a field rule's path needs around it to exist at all
    (".spec.workers.prefill", {"workers": {"mode": "disaggregated", "prefill": {}, "decode": {}}}),
    (".spec.workers.decode", {"workers": {"mode": "disaggregated", "prefill": {}, "decode": {}}}),
)

BASE: dict[str, Any] = {
    "apiVersion": API_VERSION,
    "kind": KIND,
    "metadata": {"name": "cel"},
    "spec": {"model": {"name": "m", "path": "p"}},
}


def _merge(into: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _at(path: str, value: Any) -> Patch:
    """A spec patch setting ``value`` at a rule's path (``.spec.a.b`` -> {a: {b: value}})."""
    keys = path.removeprefix(".spec.").split(".")
    patch: Any = value
    for key in reversed(keys):
        patch = {key: patch}
    return patch


def case(rule: Rule, *, passing: bool) -> dict[str, Any] | None:
    """The object that passes (or breaks) ``rule``; None when the table has no case for it."""
    body = copy.deepcopy(BASE)
    if rule.message in FIELD_CASES:
        for prefix, context in CONTEXT:
            if rule.path.startswith(prefix):
                _merge(body["spec"], context)
        _merge(body["spec"], _at(rule.path, FIELD_CASES[rule.message][0 if passing else 1]))
        return body
    for (path, prefix), patches in RULE_CASES.items():
        if path == rule.path and rule.message.startswith(prefix):
            patch = copy.deepcopy(patches[0 if passing else 1])
            _merge(body["metadata"], patch.pop("metadata", {}))
            _merge(body["spec"], patch)
            return body
    return None


# -- the judges -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dry_run(k8s: client.ApiClient, apply_crd: ApplyCrd) -> Iterator[Any]:
    """``dry_run(body)``: the API server's verdict on creating ``body`` (None: admitted, else the
    422 message), in one namespace for the module; nothing is stored."""
    apply_crd(CRD_PATH)
    core = client.CoreV1Api(k8s)
    custom = client.CustomObjectsApi(k8s)
    namespace = f"cel-table-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})

    def judge(body: Mapping[str, Any]) -> str | None:
        try:
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, dict(body), dry_run="All"
            )
        except ApiException as exc:
            assert exc.status == 422, (exc.status, exc.body)
            return str(exc.body)
        return None

    yield judge
    core.delete_namespace(namespace)


def pydantic_verdict(body: Mapping[str, Any]) -> str | None:
    """The model's verdict (what ``render`` and the operator parse with): None or the problems."""
    try:
        KvRetentionDeployment.from_k8s({**body, "metadata": {**body["metadata"], "namespace": "x"}})
    except SpecError as exc:
        return "; ".join(exc.problems)
    return None


def test_every_cel_rule_has_cases() -> None:
    missing = [r.id for r in RULES if case(r, passing=True) is None]
    assert not missing, f"add a passing and a breaking object to RULE_CASES for: {missing}"
    assert len(RULES) >= 30  # the walk found the rules (nested objects, not only the spec)


@pytest.mark.parametrize("passing", [True, False], ids=["passes", "breaks"])
@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_cel_and_pydantic_agree(dry_run: Any, rule: Rule, passing: bool) -> None:
    body = case(rule, passing=passing)
    if body is None:
        pytest.fail(f"no case for {rule.id} (see test_every_cel_rule_has_cases)")
    server, model = dry_run(body), pydantic_verdict(body)
    if passing:
        assert server is None, f"the API server refused the passing case: {server}"
        assert model is None, f"pydantic refused what the API server admits: {model}"
    else:
        assert server is not None, f"the API server admitted the breaking case of {rule.rule}"
        assert rule.message[:40] in server, f"refused, but not by this rule: {server}"
        assert model is not None, f"pydantic admits what the API server refuses: {server}"
        field = rule.path.removeprefix(".") or "metadata.name"
        assert rule.message[:30] in model or field in model, f"refused for another reason: {model}"

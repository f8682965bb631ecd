"""The retention plugin's wiring: ``--radix-eviction-policy kvretain`` on the pools that retain when
hints are on, the user's own eviction policy or plugin whitelist taking precedence, and what
RetentionApplied is told about it (``sglang_args.plan_retention``)."""

from __future__ import annotations

from typing import Any

import pytest

from kvretention.api.models import KvRetentionDeployment
from kvretention.api.names import Role
from kvretention.controller.planner import plan_fleet
from kvretention.controller.resources import build_children, build_sglang_args, check_spec
from kvretention.controller.resources.sglang_args import (
    RetentionWiring,
    plan_retention,
    pool_for,
    user_eviction_policy,
)

Body = dict[str, Any]
KVRETAIN = ["--radix-eviction-policy", "kvretain"]
HINTS_OFF = {"providers": {"openai": False, "anthropic": False}}
PD = {"mode": "disaggregated", "prefill": {"replicas": 1}, "decode": {}}


def body(**spec: Any) -> Body:
    return {
        "apiVersion": "kvretention.io/v1alpha1",
        "kind": "KvRetentionDeployment",
        "metadata": {"name": "f", "namespace": "ns", "uid": "u-1"},
        "spec": {"model": {"name": "m", "path": "org/m"}, **spec},
    }


def cr(**spec: Any) -> KvRetentionDeployment:
    return KvRetentionDeployment.from_k8s(body(**spec))


def policies(args: list[str]) -> list[str]:
    """Every ``--radix-eviction-policy`` value in an argv, in order (written either way)."""
    out = []
    for i, token in enumerate(args):
        if token == "--radix-eviction-policy":
            out.append(args[i + 1])
        elif token.startswith("--radix-eviction-policy="):
            out.append(token.split("=", 1)[1])
    return out


def plugins_env(value: str) -> Body:
    return {"pod": {"env": [{"name": "SGLANG_PLUGINS", "value": value}]}}


FROM_SECRET = {
    "pod": {
        "env": [
            {"name": "A", "value": "1"},
            {
                "name": "SGLANG_PLUGINS",
                "valueFrom": {"configMapKeyRef": {"name": "c", "key": "plugins"}},
            },
        ]
    }
}


@pytest.mark.parametrize(
    ("spec", "role", "rendered", "policy", "blocked"),
    [
        ({}, "aggregated", True, ["kvretain"], None),
        ({"hints": {"policy": "Required"}}, "aggregated", True, ["kvretain"], None),
        ({"hints": {"providers": {"openai": False}}}, "aggregated", True, ["kvretain"], None),
        (
            {"hints": HINTS_OFF, "workers": {"hicache": {"enabled": False}}},
            "aggregated",
            False,
            [],
            None,
        ),
        ({"hints": HINTS_OFF}, "aggregated", False, [], None),
        (  # the fleet's default TTL retains requests with no cache control, providers or not
            {"hints": {**HINTS_OFF, "defaultTtlSeconds": 1800}},
            "aggregated",
            True,
            ["kvretain"],
            None,
        ),
        (
            {
                "hints": {**HINTS_OFF, "defaultTtlSeconds": 600},
                "workers": {"hicache": {"enabled": False}},
            },
            "aggregated",
            True,
            ["kvretain"],
            None,
        ),
        ({"workers": PD}, "prefill", True, ["kvretain"], None),
        ({"workers": PD}, "decode", False, [], None),
        (
            {"workers": {"aggregated": {"extraArgs": ["--radix-eviction-policy", "lru"]}}},
            "aggregated",
            False,
            ["lru"],
            "EvictionPolicyOverridden",
        ),
        (
            {"workers": {"aggregated": {"extraArgs": ["--radix-eviction-policy=priority"]}}},
            "aggregated",
            False,
            ["priority"],
            "EvictionPolicyOverridden",
        ),
        (  # the user's own kvretain: rendered once, by the user
            {"workers": {"aggregated": {"extraArgs": ["--radix-eviction-policy", "kvretain"]}}},
            "aggregated",
            False,
            ["kvretain"],
            None,
        ),
        (  # the config flag alone leaves the policy to the operator
            {"workers": {"aggregated": {"extraArgs": ["--radix-eviction-policy-config", "{}"]}}},
            "aggregated",
            True,
            ["kvretain"],
            None,
        ),
        (  # decode keeps no retained prefixes: its policy is its own business
            {"workers": {**PD, "decode": {"extraArgs": ["--radix-eviction-policy", "lru"]}}},
            "prefill",
            True,
            ["kvretain"],
            None,
        ),
        (
            {"workers": {**PD, "prefill": {"extraArgs": ["--radix-eviction-policy", "lfu"]}}},
            "prefill",
            False,
            ["lfu"],
            "EvictionPolicyOverridden",
        ),
        ({"workers": plugins_env("vendor")}, "aggregated", False, [], "PluginNotSelected"),
        ({"workers": plugins_env("vendor, kvretention")}, "aggregated", True, ["kvretain"], None),
        ({"workers": plugins_env(" , ")}, "aggregated", True, ["kvretain"], None),
        ({"workers": FROM_SECRET}, "aggregated", False, [], "PluginNotSelected"),
        (
            {"hints": HINTS_OFF, "workers": plugins_env("vendor")},
            "aggregated",
            False,
            [],
            None,
        ),
    ],
    ids=[
        "defaults",
        "required",
        "one-provider",
        "hints-and-hicache-off",
        "hints-off",
        "default-ttl-only",
        "default-ttl-without-hicache",
        "pd-prefill",
        "pd-decode",
        "user-policy",
        "user-policy-equals",
        "user-kvretain",
        "user-policy-config-only",
        "pd-decode-user-policy",
        "pd-prefill-user-policy",
        "whitelist-without-plugin",
        "whitelist-with-plugin",
        "blank-whitelist",
        "whitelist-from-configmap",
        "hints-off-whitelist",
    ],
)
def test_retention_wiring(
    spec: Body, role: Role, rendered: bool, policy: list[str], blocked: str | None
) -> None:
    fleet = cr(**spec)
    assert check_spec(fleet) == []
    args = build_sglang_args(fleet.spec, role=role)
    ours = args[: len(args) - len(pool_for(fleet.spec, role).extra_args)]
    assert (ours[-2:] == KVRETAIN) is rendered
    assert policies(args) == policy
    wiring = plan_retention(fleet.spec)
    assert wiring.hints is (
        fleet.spec.hints.active() or fleet.spec.hints.default_ttl_seconds is not None
    )
    assert wiring.blocked_reason == blocked


def test_the_policy_follows_hicache_and_precedes_the_users_extras() -> None:
    args = build_sglang_args(
        cr(workers={"aggregated": {"extraArgs": ["--mem-fraction-static", "0.8"]}}).spec,
        role="aggregated",
    )
    hicache = args.index("--enable-hierarchical-cache")
    policy = args.index("--radix-eviction-policy")
    assert hicache < policy < args.index("--mem-fraction-static")
    assert args[policy + 1] == "kvretain"


@pytest.mark.parametrize(
    ("workers", "fragment"),
    [
        (
            {"aggregated": {"extraArgs": ["--radix-eviction-policy", "lru"]}},
            "spec.workers.aggregated.extraArgs sets --radix-eviction-policy lru, which takes "
            "precedence over the plugin's kvretain",
        ),
        (
            plugins_env("vendor"),
            "spec.workers.pod.env[0] sets SGLANG_PLUGINS to 'vendor', which leaves out kvretention",
        ),
        (FROM_SECRET, "spec.workers.pod.env[1] sets SGLANG_PLUGINS from valueFrom"),
    ],
)
def test_a_blocked_wiring_names_the_setting(workers: Body, fragment: str) -> None:
    assert fragment in plan_retention(cr(workers=workers).spec).blocked_message


def test_the_plan_carries_the_wiring_to_status() -> None:
    plan = plan_fleet(body(workers={"aggregated": {"extraArgs": ["--radix-eviction-policy=lru"]}}))
    assert not hasattr(plan, "problems")
    assert plan.fleet.retention.blocked_reason == "EvictionPolicyOverridden"  # type: ignore[union-attr]
    assert plan_fleet(body()).fleet.retention == RetentionWiring(hints=True)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("extra", "value"),
    [
        ([], None),
        (["--radix-eviction-policy", "lru"], "lru"),
        (["--radix-eviction-policy=slru"], "slru"),
        (["--radix-eviction-policy", "lru", "--radix-eviction-policy", "lfu"], "lfu"),
        (["--radix-eviction-policy-config", "{}"], None),
        (["--no-such-flag"], None),  # check_spec refuses it
    ],
)
def test_user_eviction_policy_reads_as_sglang(extra: list[str], value: str | None) -> None:
    assert user_eviction_policy(extra) == value


def _probe_env(children: list[Body], deployment: str) -> list[Body] | None:
    pod = next(
        m for m in children if m["kind"] == "Deployment" and m["metadata"]["name"] == deployment
    )["spec"]["template"]
    probe = pod["spec"]["initContainers"][0]
    env: list[Body] | None = probe.get("env")
    return env


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        ({}, None),
        (plugins_env("vendor"), [{"name": "SGLANG_PLUGINS", "value": "vendor"}]),
        (FROM_SECRET, [FROM_SECRET["pod"]["env"][1]]),
    ],
)
def test_the_probe_sees_the_workers_plugin_whitelist(workers: Body, expected: Any) -> None:
    """The init container judges the plugin under the whitelist the engine will run with; the
    other env stays on the worker container only."""
    kids = build_children(cr(workers=workers))
    assert _probe_env(kids, "f-worker") == expected

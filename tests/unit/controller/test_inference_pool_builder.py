"""``spec.gateway.inferencePool``: the InferencePool the builders render (over the frontend pods),
the ``InferencePoolAccepted`` condition's chain, and the executor with and without its CRD."""

from __future__ import annotations

from typing import Any

import pytest
from fake_kube import (
    FakeKube,
    condition_messages,
    fake,
    load_example,
    master_only_controller,
    reconcile_unserved,
)

from kvretention.api.models import KvRetentionDeployment, SpecError
from kvretention.api.names import CONDITION_TYPES, INFERENCE_POOL_ACCEPTED
from kvretention.controller import kinds
from kvretention.controller.cache import CR_KIND
from kvretention.controller.conditions import (
    CHILD_CONFLICT,
    INFERENCE_POOL_CRD_MISSING,
    INFERENCE_POOL_NOT_ACCEPTED,
    PROBLEM_REASONS,
    check_inference_pool,
)
from kvretention.controller.planner import FleetPlan, plan_fleet
from kvretention.controller.resources import build_children

__all__ = ["fake"]

POOL = "qwen-frontend"


def _body(pool: dict[str, Any] | None, *, name: str = "qwen") -> dict[str, Any]:
    body = load_example("aggregated")
    body["metadata"] = {**body["metadata"], "name": name, "namespace": "ns", "uid": "u-1"}
    if pool is not None:
        body["spec"]["gateway"] = {"inferencePool": pool}
    return body


def _children(pool: dict[str, Any] | None) -> list[dict[str, Any]]:
    return build_children(KvRetentionDeployment.from_k8s(_body(pool)))


def _of(children: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(c for c in children if c["kind"] == kind and c["metadata"]["name"] == name)


# -- spec and builder --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "rendered"),
    [(None, False), ({}, False), ({"enabled": False}, False), ({"enabled": True}, True)],
)
def test_an_inference_pool_is_rendered_only_when_asked_for(
    pool: dict[str, Any] | None, rendered: bool
) -> None:
    pools = [c for c in _children(pool) if c["kind"] == "InferencePool"]
    assert len(pools) == (1 if rendered else 0)


@pytest.mark.parametrize(
    "pool", [{"enabled": "yes"}, {"enabled": True, "endpointPickerRef": {"name": "epp"}}]
)
def test_the_option_is_strict(pool: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        KvRetentionDeployment.from_k8s(_body(pool))


def test_the_pool_selects_the_frontend_pods_on_their_http_port_and_is_owned_by_the_fleet() -> None:
    children = _children({"enabled": True})
    pool = _of(children, "InferencePool", POOL)
    frontend = _of(children, "Deployment", POOL)
    service = _of(children, "Service", POOL)
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert (
        kinds.kind_of(pool) is kinds.INFERENCE_POOL and kinds.INFERENCE_POOL in kinds.OPTIONAL_KINDS
    )
    # The very pods the frontend Service sends clients to, and nothing else of the fleet.
    assert pool["spec"]["selector"] == {"matchLabels": service["spec"]["selector"]}
    template = frontend["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= template.items()
    for c in children:
        if c["kind"] == "Deployment" and c["metadata"]["name"] != POOL:
            labels = c["spec"]["template"]["metadata"]["labels"]
            assert not pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (http,) = [
        p
        for p in frontend["spec"]["template"]["spec"]["containers"][0]["ports"]
        if p["name"] == "http"
    ]
    assert pool["spec"]["targetPorts"] == [{"number": http["containerPort"]}]
    assert pool["spec"]["appProtocol"] == "http"
    assert pool["spec"]["endpointPickerRef"]["name"] == "qwen-router"  # v1 requires one
    (owner,) = pool["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "KvRetentionDeployment",
        "qwen",
        "u-1",
        True,
    )


def test_the_plan_names_the_pool_for_status_only_when_it_is_wanted() -> None:
    on, off = plan_fleet(_body({"enabled": True})), plan_fleet(_body(None))
    assert isinstance(on, FleetPlan) and isinstance(off, FleetPlan)
    assert on.fleet.inference_pool == POOL
    assert off.fleet.inference_pool is None


# -- the condition's chain ---------------------------------------------------------------------


def _parent(name: str, status: str | None, reason: str = "", message: str = "") -> dict[str, Any]:
    conditions = (
        []
        if status is None
        else [
            {"type": "Accepted", "status": status, "reason": reason, "message": message},
            {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs"},
        ]
    )
    return {"parentRef": {"name": name, "namespace": "gw"}, "conditions": conditions}


def _live(*parents: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": POOL}, "status": {"parents": list(parents)} if parents else {}}


@pytest.mark.parametrize(
    ("live", "unserved", "conflict", "status", "reason", "says"),
    [
        (None, "not served: install the CRD", None, "False", INFERENCE_POOL_CRD_MISSING, "CRD"),
        (None, None, "InferencePool ns/qwen-frontend taken", "False", CHILD_CONFLICT, "taken"),
        (None, None, None, "Unknown", "NotCreated", "does not exist yet"),
        (_live(), None, None, "Unknown", "NoParent", "no Gateway has taken it up"),
        (_live(_parent("a", None)), None, None, "Unknown", "Pending", "Gateway gw/a has not"),
        (
            _live(_parent("a", "Unknown", "Pending")),
            None,
            None,
            "Unknown",
            "Pending",
            "Gateway gw/a has not accepted it yet",
        ),
        (
            _live(_parent("a", "True", "SupportedByParent")),
            None,
            None,
            "True",
            "Accepted",
            "accepted by Gateway gw/a",
        ),
        (
            _live(_parent("a", "True"), _parent("b", None)),
            None,
            None,
            "True",
            "Accepted",
            "accepted by Gateway gw/a; not yet by Gateway gw/b",
        ),
        (
            _live(_parent("a", "True"), _parent("b", "False", "NotSupportedByParent", "no")),
            None,
            None,
            "False",
            INFERENCE_POOL_NOT_ACCEPTED,
            "not accepted by Gateway gw/b: NotSupportedByParent: no",
        ),
    ],
)
def test_the_condition_says_what_stands_between_the_pool_and_a_gateway(
    live: dict[str, Any] | None,
    unserved: str | None,
    conflict: str | None,
    status: str,
    reason: str,
    says: str,
) -> None:
    verdict = check_inference_pool(POOL, live, namespace="ns", unserved=unserved, conflict=conflict)
    assert (verdict.status, verdict.reason) == (status, reason)
    assert says in verdict.message
    # Only what someone must act on is a problem (a Warning Event); waiting for a Gateway is not.
    assert (reason in PROBLEM_REASONS) == (status == "False")


# -- the executor, with and without the CRD ----------------------------------------------------


def _fleet(fake: FakeKube, pool: dict[str, Any] | None) -> None:
    body = _body(pool)
    body["metadata"].pop("uid")
    fake.put(CR_KIND, body)


async def test_without_the_option_status_has_no_pool_condition(fake: FakeKube) -> None:
    _fleet(fake, None)
    await master_only_controller(fake).reconcile(("ns", "qwen"))
    assert [c["type"] for c in fake.cr()["status"]["conditions"]] == list(CONDITION_TYPES)
    assert not any(kind == "inferencepools" for kind, _ in fake.children())


async def test_without_the_crd_status_says_so_and_the_rest_of_the_fleet_is_ready(
    fake: FakeKube,
) -> None:
    _fleet(fake, {"enabled": True})
    fake.unserve(kinds.INFERENCE_POOL)
    await reconcile_unserved(fake, master_only_controller(fake), "InferencePool")
    conditions = condition_messages(fake.cr())
    status, reason, message = conditions[INFERENCE_POOL_ACCEPTED]
    assert (status, reason) == ("False", INFERENCE_POOL_CRD_MISSING)
    assert "inferencepools.inference.networking.k8s.io CRD is not installed" in message
    assert [c["type"] for c in fake.cr()["status"]["conditions"]] == [
        *CONDITION_TYPES,
        INFERENCE_POOL_ACCEPTED,
    ]
    # The fleet serves through its own Service all the same: the pool is not part of Ready.
    assert conditions["FrontendReady"][0] == "True"
    assert conditions["Ready"][1] != INFERENCE_POOL_CRD_MISSING
    assert ("deployments", "qwen-frontend") in fake.children()


async def test_with_the_crd_the_pool_is_applied_and_a_gateway_accepting_it_shows(
    fake: FakeKube,
) -> None:
    _fleet(fake, {"enabled": True})
    c = master_only_controller(fake)
    await c.reconcile(("ns", "qwen"))
    assert ("inferencepools", POOL) in fake.children()
    assert condition_messages(fake.cr())[INFERENCE_POOL_ACCEPTED][:2] == ("Unknown", "NoParent")
    pool = fake.objects[("inferencepools", "ns", POOL)]
    pool["status"] = {"parents": [_parent("inference-gateway", "True", "SupportedByParent")]}
    await c.reconcile(("ns", "qwen"))
    status, reason, message = condition_messages(fake.cr())[INFERENCE_POOL_ACCEPTED]
    assert (status, reason) == ("True", "Accepted")
    assert "Gateway gw/inference-gateway" in message


async def test_a_foreign_pool_of_that_name_is_a_conflict_and_left_alone(fake: FakeKube) -> None:
    _fleet(fake, {"enabled": True})
    foreign = fake.put(
        kinds.INFERENCE_POOL,
        {
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": POOL, "namespace": "ns"},
            "spec": {"selector": {"matchLabels": {"app": "theirs"}}},
        },
    )
    await master_only_controller(fake).reconcile(("ns", "qwen"))
    status, reason, message = condition_messages(fake.cr())[INFERENCE_POOL_ACCEPTED]
    assert (status, reason) == ("False", CHILD_CONFLICT)
    assert f"InferencePool ns/{POOL} already exists" in message
    assert fake.objects[("inferencepools", "ns", POOL)] == foreign


async def test_turning_the_option_off_deletes_the_pool_and_its_condition(fake: FakeKube) -> None:
    _fleet(fake, {"enabled": True})
    c = master_only_controller(fake)
    await c.reconcile(("ns", "qwen"))
    assert ("inferencepools", POOL) in fake.children()
    body = fake.cr()
    body["spec"]["gateway"] = {"inferencePool": {"enabled": False}}
    body["metadata"]["generation"] = 2
    fake.put(CR_KIND, body)
    await c.reconcile(("ns", "qwen"))
    assert ("inferencepools", POOL) not in fake.children()
    assert [c["type"] for c in fake.cr()["status"]["conditions"]] == list(CONDITION_TYPES)

"""``spec.gateway``: off by default, and spelled out in the CRD so ``kubectl explain`` shows it; a
pool always names the router as its endpoint picker; the picker's rules as pydantic judges them (tests/integration/test_cel_table.py holds the API
server to the same)."""

from __future__ import annotations

from typing import Any

import pytest

from kvretention.api.crd import build_crd
from kvretention.api.models import (
    FRONTEND_PODS_SUFFIX,
    PICKER_MAX_NAME_LENGTH,
    PICKER_NAME_MESSAGE,
    KvRetentionDeployment,
    KvRetentionDeploymentSpec,
    SpecError,
)


def _gateway_schema() -> dict[str, Any]:
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    gateway: dict[str, Any] = root["properties"]["spec"]["properties"]["gateway"]
    return gateway


def test_the_inference_pool_is_off_unless_asked_for() -> None:
    spec = KvRetentionDeploymentSpec.model_validate(
        {"model": {"name": "m", "path": "org/m"}}, strict=False
    )
    assert spec.gateway.inference_pool.enabled is False


def test_the_crd_defaults_and_describes_the_option() -> None:
    gateway = _gateway_schema()
    off = {"enabled": False, "endpointPicker": {"failureMode": "FailOpen"}}
    assert gateway["default"] == {"inferencePool": off}
    pool = gateway["properties"]["inferencePool"]
    assert pool["default"] == off
    enabled = pool["properties"]["enabled"]
    assert (enabled["type"], enabled["default"]) == ("boolean", False)
    assert "frontend pods" in enabled["description"]
    assert "ext-proc port (9004)" in enabled["description"]
    assert pool.get("additionalProperties") in (None, False)
    picker = pool["properties"]["endpointPicker"]["properties"]
    assert picker["failureMode"]["enum"] == ["FailOpen", "FailClose"]
    assert set(picker) == {"failureMode"}  # v1 requires a picker: there is no turning it off


def _fleet(pool: dict[str, Any], *, name: str = "gw") -> dict[str, Any]:
    return {
        "apiVersion": "kvretention.io/v1alpha1",
        "kind": "KvRetentionDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": "m", "path": "org/m"}, "gateway": {"inferencePool": pool}},
    }


@pytest.mark.parametrize(
    ("pool", "name", "problem"),
    [
        ({"enabled": True}, "gw", None),
        ({"enabled": False, "endpointPicker": {"failureMode": "FailClose"}}, "gw", None),
        ({"enabled": True, "endpointPicker": {"failureMode": "FailClose"}}, "gw", None),
        ({"enabled": True}, "a" * 49, None),
        ({"enabled": True}, "a" * 50, PICKER_NAME_MESSAGE),
        ({"enabled": False}, "a" * 54, None),
        ({"enabled": True, "endpointPicker": {"failureMode": "Open"}}, "gw", "failureMode"),
        ({"enabled": True, "endpointPicker": {"enabled": True}}, "gw", "enabled"),
        ({"enabled": True, "endpointPicker": {"port": 9}}, "gw", "port"),
    ],
)
def test_a_pool_needs_a_name_that_leaves_room_for_its_pickers_service(
    pool: dict[str, Any], name: str, problem: str | None
) -> None:
    body = _fleet(pool, name=name)
    if problem is None:
        KvRetentionDeployment.from_k8s(body)
        return
    with pytest.raises(SpecError) as err:
        KvRetentionDeployment.from_k8s(body)
    assert problem in str(err.value)


def test_the_longest_picker_name_makes_a_service_name_of_63() -> None:
    assert len(f"{'a' * PICKER_MAX_NAME_LENGTH}-{FRONTEND_PODS_SUFFIX}") == 63

"""``spec.gateway``: off by default, and spelled out in the CRD so ``kubectl explain`` shows it."""

from __future__ import annotations

from typing import Any

from kvretention.api.crd import build_crd
from kvretention.api.models import KvRetentionDeploymentSpec


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
    assert gateway["default"] == {"inferencePool": {"enabled": False}}
    pool = gateway["properties"]["inferencePool"]
    assert pool["default"] == {"enabled": False}
    enabled = pool["properties"]["enabled"]
    assert (enabled["type"], enabled["default"]) == ("boolean", False)
    assert "frontend pods" in enabled["description"]
    assert pool.get("additionalProperties") in (None, False)

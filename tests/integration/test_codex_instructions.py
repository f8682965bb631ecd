"""``spec.frontend.codexInstructions``, ``spec.workers.planningThreads`` and the bounds of
``spec.workers.radixPinRatio`` on the real control plane:
the API server keeps them (the CRD has them) and refuses malformed ones; the frontend Deployment
mounts the ConfigMap key read-only and passes it as ``--codex-instructions-file``; the workers get
``--planning-threads``. (That FrontendReady names a missing ConfigMap is the unit tier's: kwok marks
the pods Ready whether or not their volumes exist.)"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from operator_fixtures import (
    CRD_PATH,
    Fleets,
    Operator,
    fleets_fixture,
    load_example,
    operator_fixture,
)

from support.controlplane import ApplyCrd, wait_until
from support.kube_reads import read_or_none

pytestmark = pytest.mark.integration

operator = operator_fixture(resync_s=3.0)
fleets = fleets_fixture()

CODEX = {"configMapKeyRef": {"name": "codex-prompt", "key": "instructions.md"}}


def _deployment(fleets: Fleets, name: str) -> dict[str, Any] | None:
    return read_or_none(lambda: fleets.deployment(name))


def test_codex_instructions_are_mounted_and_planning_threads_passed(
    operator: Operator, fleets: Fleets
) -> None:
    body = load_example("aggregated", name="codex")
    body["spec"].setdefault("frontend", {})["codexInstructions"] = CODEX
    body["spec"]["workers"]["planningThreads"] = 8
    created = fleets.create(body)
    assert created["spec"]["frontend"]["codexInstructions"] == CODEX
    assert created["spec"]["workers"]["planningThreads"] == 8

    deployment = wait_until(
        "codex-frontend Deployment", lambda: _deployment(fleets, "codex-frontend"), timeout_s=90
    )
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == "codex-prompt"
    assert volume["configMap"]["items"] == [{"key": "instructions.md", "path": "instructions"}]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert "subPath" not in mount
    flag = f"--codex-instructions-file={mount['mountPath']}/instructions"
    assert flag in container["command"]

    workers = wait_until(
        "codex worker Deployment",
        lambda: next(
            (
                d
                for (kind, _), d in fleets.children("codex").items()
                if kind == "Deployment" and "worker" in d["metadata"]["name"]
            ),
            None,
        ),
        timeout_s=60,
    )
    (worker,) = [
        c for c in workers["spec"]["template"]["spec"]["containers"] if "--" in c["command"]
    ]
    command = worker["command"][: worker["command"].index("--")]
    assert command[command.index("--planning-threads") + 1] == "8"


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        pytest.param(
            {"frontend": {"codexInstructions": {"configMapKeyRef": {"name": "c"}}}},
            "key",
            id="no-key",
        ),
        pytest.param(
            {"frontend": {"codexInstructions": {"configMapKeyRef": {"name": "c", "key": "a/b"}}}},
            "key",
            id="key-with-slash",
        ),
        pytest.param({"frontend": {"codexInstructions": {}}}, "configMapKeyRef", id="no-ref"),
        pytest.param({"workers": {"planningThreads": 0}}, "planningThreads", id="threads-0"),
        pytest.param({"workers": {"planningThreads": 65}}, "planningThreads", id="threads-65"),
        pytest.param({"workers": {"radixPinRatio": 0}}, "radixPinRatio", id="pin-ratio-0"),
        pytest.param({"workers": {"radixPinRatio": 1.5}}, "radixPinRatio", id="pin-ratio-1.5"),
    ],
)
def test_the_api_server_refuses_malformed_gateway_features(
    fleets: Fleets, apply_crd: ApplyCrd, patch: dict[str, dict[str, Any]], field: str
) -> None:
    apply_crd(CRD_PATH)  # this test needs the CRD, not the module's operator
    body = load_example("aggregated", name="bad-gateway")
    for section, values in patch.items():
        body["spec"].setdefault(section, {}).update(values)
    with pytest.raises(ApiException) as caught:
        fleets.create(body)
    assert caught.value.status == 422
    assert field in str(caught.value.body)

"""The Argo CD health check (deploy/argocd/health-kvretention.lua) run by a real Lua 5.1 interpreter.

Argo CD runs health checks with gopher-lua, a Lua 5.1 implementation; Debian's ``lua5.1`` is the
closest interpreter the registries ship (``apt-get install lua5.1``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any

import pytest
from chartlib import ROOT

from kvretention.controller.conditions import (
    INFERENCE_POOL_CRD_MISSING,
    INFERENCE_POOL_NOT_ACCEPTED,
    PROBLEM_REASONS,
)
from kvretention.controller.diagnosis import UNSCHEDULABLE

SCRIPT = ROOT / "deploy" / "argocd" / "health-kvretention.lua"


def to_lua(value: Any) -> str:
    """A JSON-like value as a Lua literal (lists 1-based, as Argo CD hands objects to Lua)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid Lua string literal for these inputs
    if isinstance(value, list):
        return "{" + ", ".join(to_lua(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{json.dumps(k)}] = {to_lua(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


@pytest.fixture(scope="module")
def lua() -> str:
    found = shutil.which("lua5.1") or shutil.which("lua")
    if found is None:
        message = "no Lua interpreter: apt-get install lua5.1"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return found


def health(lua: str, obj: dict[str, Any]) -> tuple[str, str]:
    program = (
        f"obj = {to_lua(obj)}\n"
        f"local hs = dofile({json.dumps(str(SCRIPT))})\n"
        'io.write(hs.status, "\\n", hs.message or "")\n'
    )
    done = subprocess.run(
        [lua, "-"], input=program, capture_output=True, text=True, timeout=10, check=True
    )
    status, _, message = done.stdout.partition("\n")
    return status, message


def cond(
    ctype: str, status: str, reason: str = "", message: str = "", gen: int = 2
) -> dict[str, Any]:
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": gen,
    }


def kvrd(status: dict[str, Any] | None, generation: int = 2) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "kvretention.io/v1alpha1",
        "kind": "KvRetentionDeployment",
        "metadata": {"name": "fleet", "namespace": "demo", "generation": generation},
        "spec": {"workers": {"mode": "aggregated"}},
    }
    if status is not None:
        obj["status"] = status
    return obj


CASES = [
    ("no-status", kvrd(None), "Progressing", "Waiting for the kvretention operator"),
    ("empty-status", kvrd({}), "Progressing", "Waiting for the kvretention operator"),
    (
        "old-generation",
        kvrd({"observedGeneration": 1, "conditions": [cond("Ready", "True", gen=1)]}),
        "Progressing",
        "observe generation 2",
    ),
    (
        "no-observed-generation",
        kvrd({"conditions": [cond("Ready", "True")]}),
        "Progressing",
        "observe generation 2",
    ),
    (
        "ready",
        kvrd(
            {
                "observedGeneration": 2,
                "conditions": [
                    cond("Progressing", "False", "Reconciled"),
                    cond("Ready", "True", "FleetReady", "3/3 workers ready"),
                ],
            }
        ),
        "Healthy",
        "3/3 workers ready",
    ),
    (
        "ready-condition-stale",
        kvrd({"observedGeneration": 2, "conditions": [cond("Ready", "True", gen=1)]}),
        "Progressing",
        "Ready reflects generation 1",
    ),
    (
        "invalid-spec",
        kvrd(
            {
                "observedGeneration": 2,
                "conditions": [
                    cond(
                        "Ready",
                        "False",
                        "InvalidSpec",
                        "workers.prefill is required in disaggregated mode",
                    ),
                    cond("Progressing", "True", "Reconciling"),
                ],
            }
        ),
        "Degraded",
        "workers.prefill is required",
    ),
    (
        "hints-unsupported",
        kvrd(
            {
                "observedGeneration": 2,
                "conditions": [
                    cond("Ready", "False", "EngineLacksKvHints", "sglang 0.4.0 has no kv_hints"),
                ],
            }
        ),
        "Degraded",
        "no kv_hints",
    ),
    (
        "retention-not-applied-under-required",
        kvrd(
            {
                "observedGeneration": 2,
                "conditions": [
                    cond(
                        "Ready", "False", "TransportOnly", "the retention plugin is not installed"
                    ),
                    cond("RetentionApplied", "False", "TransportOnly"),
                ],
            }
        ),
        "Degraded",
        "plugin is not installed",
    ),
    (
        "retention-not-applied-but-optional",
        kvrd(
            {
                "observedGeneration": 2,
                "conditions": [
                    cond("Ready", "True", "Ready", "kv.retain is not applied"),
                    cond("RetentionApplied", "False", "HookTargetsMissing"),
                ],
            }
        ),
        "Healthy",
        "kv.retain is not applied",
    ),
    (
        "retention-probe-pending-under-required",
        kvrd(
            {
                "observedGeneration": 2,
                "conditions": [
                    cond("Ready", "False", "ProbePending", "no worker pod has reported"),
                    cond("RetentionApplied", "Unknown", "ProbePending"),
                ],
            }
        ),
        "Progressing",
        "no worker pod has reported",
    ),
    (
        "converged-but-loading",
        kvrd(
            {
                "observedGeneration": 2,
                "conditions": [
                    cond("Ready", "False", "WorkersNotReady", ""),
                    cond("Progressing", "False", "Converged"),
                ],
            }
        ),
        "Progressing",
        "WorkersNotReady",
    ),
    (
        "hints-unsupported-but-optional",
        kvrd(
            {
                "observedGeneration": 2,
                "conditions": [
                    cond("Ready", "True", "ReadyWithoutKvHints", "serving; hints not applied"),
                    cond("KvHintsSupported", "False", "EngineLacksKvHints"),
                ],
            }
        ),
        "Healthy",
        "hints not applied",
    ),
    (
        "rolling-out",
        kvrd(
            {
                "observedGeneration": 2,
                "conditions": [
                    cond("Ready", "False", "WorkersNotReady", "1/3 workers ready"),
                    cond("Progressing", "True", "RollingOut"),
                ],
            }
        ),
        "Progressing",
        "1/3 workers ready",
    ),
    (
        "master-restarting",
        kvrd(
            {
                "observedGeneration": 2,
                "conditions": [
                    cond(
                        "Ready",
                        "False",
                        "MasterRestarting",
                        "the Mooncake master is restarting with a new pod template",
                    ),
                    cond("Progressing", "True", "RollingOut"),
                ],
            }
        ),
        "Progressing",
        "restarting with a new pod template",
    ),
    (
        "crash-loop",
        kvrd(
            {
                "observedGeneration": 2,
                "conditions": [
                    cond("Ready", "False", "CrashLoopBackOff", "fleet-worker-0: back-off 5m0s"),
                    cond("Progressing", "True", "RollingOut"),
                ],
            }
        ),
        "Degraded",
        "back-off",
    ),
    (
        "past-the-progress-deadline",
        kvrd(
            {
                "observedGeneration": 2,
                "conditions": [
                    cond("Ready", "False", "ProgressDeadlineExceeded", "fleet-router timed out"),
                    cond("Progressing", "False", "ProgressDeadlineExceeded"),
                ],
            }
        ),
        "Degraded",
        "timed out",
    ),
    (
        "waiting-for-a-gpu-node",
        kvrd(
            {
                "observedGeneration": 2,
                "conditions": [
                    cond("Ready", "False", "Unschedulable", "Insufficient nvidia.com/gpu"),
                    cond("Progressing", "True", "RollingOut"),
                ],
            }
        ),
        "Progressing",
        "Insufficient nvidia.com/gpu",
    ),
    (
        "unknown",
        kvrd({"observedGeneration": 2, "conditions": [cond("Ready", "Unknown", "Probing")]}),
        "Progressing",
        "Probing",
    ),
    (
        "no-ready-condition",
        kvrd({"observedGeneration": 2, "conditions": [cond("WorkersReady", "True")]}),
        "Progressing",
        "Waiting for the Ready condition",
    ),
]


@pytest.mark.parametrize(
    ("obj", "status", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_health(lua: str, obj: dict[str, Any], status: str, fragment: str) -> None:
    got_status, message = health(lua, obj)
    assert (got_status, fragment in message) == (status, True), message


def test_docs_embed_the_shipped_script() -> None:
    """docs/install.md shows the argocd-cm snippet with exactly this script."""
    doc = (ROOT / "docs" / "install.md").read_text()
    body = "\n".join("    " + ln if ln else "" for ln in SCRIPT.read_text().splitlines())
    assert "resource.customizations.health.kvretention.io_KvRetentionDeployment: |" in doc
    assert body in doc


def test_degraded_means_what_the_operator_warns_about() -> None:
    """The script's Degraded reasons are the operator's problem reasons (its Warning Events) that
    can reach Ready, less those a new node can end (Argo CD calls a Pending pod Progressing)."""
    table = SCRIPT.read_text().split("local permanent = {", 1)[1].split("}", 1)[0]
    degraded = set(re.findall(r"^\s*(\w+) = true,$", table, flags=re.M))
    waiting_for_a_node = {UNSCHEDULABLE, "SchedulingGated"}
    # The retention budget and the InferencePool have conditions of their own, not part of Ready.
    not_on_ready = {
        "OverBudget",
        "PinsLost",
        INFERENCE_POOL_CRD_MISSING,
        INFERENCE_POOL_NOT_ACCEPTED,
    }
    expected = PROBLEM_REASONS - waiting_for_a_node - not_on_ready
    assert degraded == expected

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
from pathlib import Path
from typing import Any

import pytest
import yaml
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


CASES_FILE = Path(__file__).with_name("argocd_health_cases.yaml")


CONDITION_FIELDS = ("type", "status", "reason", "message", "observedGeneration")
CONDITION_DEFAULTS = ("", "", 2)  # reason, message, observedGeneration


def cond(row: list[Any]) -> dict[str, Any]:
    """A condition from a case's row: type and status, then what the defaults leave out."""
    values = [*row, *CONDITION_DEFAULTS[len(row) - 2 :]]
    return dict(zip(CONDITION_FIELDS, values, strict=True))


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


def load_cases() -> list[Any]:
    """argocd_health_cases.yaml as pytest params: (object, Argo CD's status, message fragment)."""
    params = []
    for case in yaml.safe_load(CASES_FILE.read_text()):
        status = case.get("status")
        if status:
            status = {**status, "conditions": [cond(c) for c in status["conditions"]]}
        params.append(pytest.param(kvrd(status), *case["expect"], id=case["id"]))
    return params


@pytest.mark.parametrize(("obj", "status", "fragment"), load_cases())
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

"""Shared fixtures for every tier."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# The real local control plane's fixtures (cluster, k8s, namespace, apply_crd, start_process),
# shared by the integration and chart tiers; the plane starts only when a test asks for it.
pytest_plugins = ["support.kube_fixtures"]

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def kv_hints_wire() -> dict[str, Any]:
    """The shared wire examples of the KV-hint envelope (valid and invalid)."""
    data: dict[str, Any] = json.loads((FIXTURES / "kv_hints_wire.json").read_text())
    return data


def load_kv_hints_wire() -> dict[str, Any]:
    """Module-level access for parametrize tables."""
    data: dict[str, Any] = json.loads((FIXTURES / "kv_hints_wire.json").read_text())
    return data

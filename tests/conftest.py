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
TESTS = Path(__file__).parent

SLOWEST_TIERS_FIRST = (
    "integration",
    "l3",
    "clients",
    "cpu_engine",
    "engine",
    "dataplane",
    "chart",
    "retention",
    "e2e",
    "fuzz",
    "observability",
    "unit",
)
"""The tiers by the time their files take (a plane, masters, engines, CLIs first; unit last), so
``make test``'s two workers (pytest-xdist, whole files each) start the long files early and fill
the end with short ones instead of waiting on one long file."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order whole tiers by :data:`SLOWEST_TIERS_FIRST`; a stable sort keeps every file's tests
    together and in their order."""
    rank = {tier: i for i, tier in enumerate(SLOWEST_TIERS_FIRST)}

    def tier_of(item: pytest.Item) -> int:
        parts = item.path.parts[len(TESTS.parts) :] if item.path.is_relative_to(TESTS) else ()
        return rank.get(parts[0], len(rank)) if len(parts) > 1 else len(rank)

    items.sort(key=tier_of)


@pytest.fixture(scope="session")
def kv_hints_wire() -> dict[str, Any]:
    """The shared wire examples of the KV-hint envelope (valid and invalid)."""
    data: dict[str, Any] = json.loads((FIXTURES / "kv_hints_wire.json").read_text())
    return data


def load_kv_hints_wire() -> dict[str, Any]:
    """Module-level access for parametrize tables."""
    data: dict[str, Any] = json.loads((FIXTURES / "kv_hints_wire.json").read_text())
    return data

"""Fixtures for the chart tier: helm from the build cache.

The control-plane fixtures (``cluster``, ``k8s``, ``namespace``, ``start_process``) come from
``support.kube_fixtures`` (registered in ``tests/conftest.py``), so both tiers share one plane.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from chartlib import Helm, find_bin_dir


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    """The cached helm/kubectl bin dir; fails under CI when missing, skips on a dev box."""
    found = find_bin_dir()
    if found is None or not (found / "helm").is_file():
        message = "helm is not built yet: run scripts/bootstrap.sh (scripts/build-kube.sh)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return found


@pytest.fixture(scope="session")
def helm(bin_dir: Path) -> Helm:
    """helm for rendering (no cluster)."""
    return Helm(binary=bin_dir / "helm")

"""Fixtures for the chart tier: helm from the build cache, and the integration tier's control plane.

The control-plane fixtures (``cluster``, ``k8s``, ``namespace``, ``start_process``) are the
integration tier's own, loaded from ``tests/integration/conftest.py`` so both tiers exercise the
same plane code.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from chartlib import Helm, find_bin_dir

_INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


def _load_integration_fixtures() -> None:
    """Re-export the integration fixtures here unless a parent conftest already provides them."""
    source = _INTEGRATION / "conftest.py"
    if str(_INTEGRATION) not in sys.path:
        sys.path.insert(0, str(_INTEGRATION))
    spec = importlib.util.spec_from_file_location("kvr_integration_conftest", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("cluster", "k8s", "namespace", "start_process"):
        if hasattr(module, name):
            globals()[name] = getattr(module, name)


_load_integration_fixtures()


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

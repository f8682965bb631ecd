"""The committed CRD under crds/ is exactly what the API models generate."""

from __future__ import annotations

from pathlib import Path

from kvretention.api.crd import CRD_FILENAME, render_crd_yaml

CRD_PATH = Path(__file__).resolve().parents[3] / "crds" / CRD_FILENAME


def test_committed_crd_matches_models() -> None:
    assert CRD_PATH.exists(), f"{CRD_PATH} is missing: run `kvretention crds --write crds/`"
    assert CRD_PATH.read_text() == render_crd_yaml(), (
        f"{CRD_PATH} drifted from kvretention.api.models: "
        "run `.venv/bin/kvretention crds --write crds/` and commit the result"
    )

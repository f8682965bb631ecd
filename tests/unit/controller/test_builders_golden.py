"""Golden manifests: what ``kvretention render`` prints for each sample and case, byte for byte.

Regenerate after an intended change with ``KVR_UPDATE_GOLDEN=1 .venv/bin/pytest
tests/unit/controller/test_builders_golden.py`` and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvretention.controller.render import RenderError, render_files

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
GOLDEN = HERE / "golden"
CASES = HERE / "cases"
UPDATE = os.environ.get("KVR_UPDATE_GOLDEN") == "1"

VALID = {
    "aggregated": ROOT / "examples" / "aggregated.yaml",
    "disaggregated": ROOT / "examples" / "disaggregated.yaml",
    "external-mooncake": ROOT / "examples" / "external-mooncake.yaml",
    "agents": ROOT / "examples" / "agents.yaml",
    "multinode": ROOT / "examples" / "multinode.yaml",
    "managed-mooncake": CASES / "managed-mooncake.yaml",
    "hints-required": CASES / "hints-required.yaml",
    "hints-optional": CASES / "hints-optional.yaml",
    "no-hints": CASES / "no-hints.yaml",
    "inference-pool": CASES / "inference-pool.yaml",
    "inference-pool-picker": CASES / "inference-pool-picker.yaml",
    "gateway-features": CASES / "gateway-features.yaml",
    "auth": CASES / "auth.yaml",
}
INVALID = sorted(p.stem for p in CASES.glob("invalid-*.yaml"))


def _check(golden: Path, actual: str) -> None:
    if UPDATE:
        golden.write_text(actual)
    assert golden.exists(), f"{golden} missing: rerun with KVR_UPDATE_GOLDEN=1"
    assert actual == golden.read_text(), (
        f"{golden.name} differs from what the builders render; if intended, rerun with "
        "KVR_UPDATE_GOLDEN=1 and review the diff"
    )


@pytest.mark.parametrize("case", sorted(VALID))
def test_golden_manifests(case: str) -> None:
    _check(GOLDEN / f"{case}.yaml", render_files([VALID[case]], namespace="default"))


@pytest.mark.parametrize("case", INVALID)
def test_golden_invalid_specs(case: str) -> None:
    with pytest.raises(RenderError) as err:
        render_files([CASES / f"{case}.yaml"], namespace="default")
    text = str(err.value).replace(str(CASES) + "/", "") + "\n"
    _check(GOLDEN / f"{case}.txt", text)


def test_every_invalid_case_is_covered() -> None:
    assert {"invalid-check-spec", "invalid-pd-without-decode", "invalid-soft-pin"} <= set(INVALID)

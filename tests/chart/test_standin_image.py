"""The stand-in worker image (images/worker/Dockerfile with ``ENGINE=standin`` on a plain Python
base, built by scripts/build-images.sh for the real-node pods tier): the build script builds that
variant of the one worker Dockerfile (whose defaults, the GPU image, tests/chart/test_images.py
lints), and the image's ``kvretention`` changes only the engine, the model path and the parsers in
the commands the operator renders."""

from __future__ import annotations

import runpy

import pytest
from chartlib import ROOT

DOCKERFILE = ROOT / "images" / "worker" / "Dockerfile"
BUILD_IMAGES = ROOT / "scripts" / "build-images.sh"
SHIM = ROOT / "images" / "worker" / "standin-kvretention"


def test_one_worker_dockerfile_builds_both_engines() -> None:
    """No second Dockerfile: the build script passes the stand-in's engine and base as build args
    to the GPU image's Dockerfile, which has a branch for each engine."""
    assert sorted(p.name for p in DOCKERFILE.parent.glob("Dockerfile*")) == ["Dockerfile"]
    text = DOCKERFILE.read_text()
    for engine in ("sglang", "standin"):
        assert f'"$ENGINE" = {engine} ]' in text, engine
    script = BUILD_IMAGES.read_text()
    assert "[worker]=images/worker/Dockerfile" in script
    assert "base_ref=localhost/kvretention/python:3.11.11-slim-bookworm" in script
    assert "--build-arg ENGINE=standin --build-arg WORKER_BASE=$base_ref" in script


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

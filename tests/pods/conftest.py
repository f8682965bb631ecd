"""The pods tier: a real node on this machine (``kvretention cluster up --real-node``), so every
pod is a real process from images built here (``scripts/build-images.sh``).

Opt-in: it needs root, the Debian packages of ``scripts/install-node.sh`` and the node's binaries
(``scripts/build-node.sh``), and while the node stands its iptables rules would break loopback
tests; so it is collected only when ``KVR_PODS_TIER=1`` (``make test-pods``). The node lives for
this folder only (package scope): it is torn down, and the host checked to be exactly as recorded
(no iptables rule, sysctl, mount, link or cgroup left), before any other tier runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kvretention_devtools.localcluster import ClusterError, down, up
from kvretention_devtools.localcluster.binaries import resolve_bin_dir
from support.controlplane import Cluster

TIER_ENV = "KVR_PODS_TIER"
ROOT = Path(__file__).resolve().parents[2]

if os.environ.get(TIER_ENV) != "1":
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="package")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A fresh plane with a real node; torn down (and the host checked clean) after this folder."""
    state_dir = tmp_path_factory.mktemp("kvr-real-node")
    try:
        bin_dir = resolve_bin_dir()
        state, _ = up(state_dir, bin_dir=bin_dir, real_node=True, timeout_s=300.0)
    except ClusterError as err:
        down(state_dir)
        pytest.fail(f"real node unavailable: {err}", pytrace=False)
    try:
        yield Cluster(
            kubeconfig=state.kubeconfig, server=state.server, bin_dir=bin_dir, state_dir=state_dir
        )
    finally:
        # Raises (an error in the last test's teardown) when anything of the node is left.
        down(state_dir)


@pytest.fixture(scope="package")
def node_k8s(node_cluster: Cluster) -> Iterator[client.ApiClient]:
    api = node_cluster.api_client()
    yield api
    api.close()


@pytest.fixture(scope="package")
def images() -> dict[str, str]:
    """Short name (pause, operator, runtime, worker) -> the image reference containerd has."""
    listing = Path(os.environ.get("KVR_NODE_IMAGES") or _images_dir() / "images.json")
    return {name: v["ref"] for name, v in json.loads(listing.read_text()).items()}


def _images_dir() -> Path:
    cache = Path(os.environ.get("KVR_CACHE") or Path.home() / ".cache" / "kvretention")
    return cache / "images"

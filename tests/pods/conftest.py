"""The pods tier: a real node on this machine (``kvretention cluster up --real-node``), so every
pod is a real process from images built here (``scripts/build-images.sh``).

It needs root, the Debian packages of ``scripts/install-node.sh``, the node's binaries
(``scripts/build-node.sh``) and the images (``scripts/build-images.sh``), which
``scripts/test-pods.sh`` prepares before it sets ``KVR_PODS_TIER=1``: ``make test`` runs it after
the other tiers, in a pytest run of its own (the node's iptables chains and sysctls must not
overlap another tier), and says why where the machine cannot run a node. Without
``KVR_PODS_TIER=1`` this folder is not collected. The node lives for this folder only (package
scope): it is torn down, and the host checked to be exactly as recorded (no iptables rule, sysctl,
mount, link or cgroup left).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from pods_fixtures import (
    CHART,
    FLEET_NS,
    READY_S,
    RELEASE_NS,
    build_fleet,
    condition,
    fleet_service,
    get_json,
    kubectl,
    service_routes,
    wait_service_routes,
    why_not_ready,
)

from kvretention_devtools.localcluster import ClusterError, down, up
from kvretention_devtools.localcluster.binaries import resolve_bin_dir
from support.controlplane import Cluster, wait_until
from support.inference_pool_crd import CRD_NAME, inference_pool_crd
from support.kube_fixtures import api_client_for, serving

TIER_ENV = "KVR_PODS_TIER"
ROOT = Path(__file__).resolve().parents[2]

if os.environ.get(TIER_ENV) != "1":
    collect_ignore_glob = ["test_*.py"]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so a fixture's teardown can tell that its test
    failed (and dump the fleet's state while it is still there)."""
    report = yield
    setattr(item, f"report_{call.when}", report)
    return report


@pytest.fixture(scope="package")
def node_cluster(
    tmp_path_factory: pytest.TempPathFactory, images_listing: Path
) -> Iterator[Cluster]:
    """A fresh plane with a real node; torn down (and the host checked clean) after this folder."""
    state_dir = tmp_path_factory.mktemp("kvr-real-node")
    problem = None
    with pytest.MonkeyPatch.context() as patch:
        # The node imports exactly the images the tests name (the ones last built).
        patch.setenv("KVR_NODE_IMAGES", str(images_listing))
        try:
            bin_dir = resolve_bin_dir()
            state, _ = up(state_dir, bin_dir=bin_dir, real_node=True, timeout_s=300.0)
        except ClusterError as err:
            problem = str(err)
    if problem is not None:
        down(state_dir)
        pytest.fail(f"real node unavailable: {problem}", pytrace=False)
    # Its teardown raises (an error in the last test's teardown) when anything of the node is left.
    yield from serving(state, bin_dir=bin_dir, state_dir=state_dir)


@pytest.fixture(scope="package")
def node_k8s(node_cluster: Cluster) -> Iterator[client.ApiClient]:
    yield from api_client_for(node_cluster)


@pytest.fixture(scope="package")
def images_listing() -> Path:
    """``images.json`` as scripts/build-images.sh last wrote it (``make test-pods`` builds first,
    so the images hold the checkout's code), or ``$KVR_NODE_IMAGES``."""
    cache = Path(os.environ.get("KVR_CACHE") or Path.home() / ".cache" / "kvretention")
    listing = Path(os.environ.get("KVR_NODE_IMAGES") or cache / "images" / "images.json")
    if not listing.is_file():
        pytest.fail(f"no {listing}: run scripts/build-images.sh", pytrace=False)
    return listing


@pytest.fixture(scope="package")
def images(images_listing: Path) -> dict[str, str]:
    """Short name (pause, operator, runtime, worker) -> the image reference containerd has."""
    return {name: v["ref"] for name, v in json.loads(images_listing.read_text()).items()}


@pytest.fixture(scope="package")
def fleet(node_cluster: Cluster, images: dict[str, str]) -> Iterator[str]:
    """The chart's operator (a pod) and the example fleet it reconciled, with the InferencePool
    CRD installed first (as a Gateway stack would) and the router as the pool's endpoint picker;
    one fleet for every module of the tier. Yields the fleet name."""
    cluster = node_cluster
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(inference_pool_crd()))
    kubectl(cluster, "wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    kubectl(cluster, "create", "namespace", FLEET_NS)
    repo, _, tag = images["operator"].rpartition(":")
    cluster_bin = cluster.bin_dir
    helm = [
        str(cluster_bin / "helm"),
        f"--kubeconfig={cluster.kubeconfig}",
        "install",
        "kvretention",
        str(CHART),
        f"--namespace={RELEASE_NS}",
        "--create-namespace",
        f"--set=image.repository={repo}",
        f"--set=image.tag={tag}",
        "--set=image.pullPolicy=Never",
        f"--set=watch.namespaces={{{FLEET_NS}}}",
        "--wait",
        "--timeout=3m",
    ]
    done = subprocess.run(helm, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = build_fleet(images)
    kubectl(cluster, "-n", FLEET_NS, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(doc))
    name = doc["metadata"]["name"]
    try:
        wait_until(
            f"{FLEET_NS}/{name} Ready",
            lambda: (
                condition(get_json(cluster, "kvrd", "-n", FLEET_NS, name), "Ready").get("status")
                == "True"
            ),
            timeout_s=READY_S,
        )
    except BaseException:
        print(why_not_ready(cluster, name), file=sys.stderr)
        raise
    # Ready counts the Deployments' ready pods; the frontend Service carries a request only once
    # its EndpointSlice lists the ready pod and kube-proxy has programmed that endpoint.
    frontend = fleet_service(cluster, name, "frontend")
    ready_at, routed_at_ready = time.monotonic(), service_routes(cluster, frontend)
    wait_service_routes(cluster, frontend)
    print(
        f"frontend Service: routed at Ready: {routed_at_ready}; "
        f"routing {time.monotonic() - ready_at:.1f}s after Ready",
        file=sys.stderr,
    )
    yield name


@pytest.fixture(autouse=True)
def dump_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """When a test that uses the fleet fails, what the fleet looked like right then (conditions,
    pods, warning events such as failed probes, logs of pods not ready) goes with its report."""
    yield
    report = getattr(request.node, "report_call", None)
    args = getattr(request.node, "funcargs", {})
    if report is None or not report.failed or "fleet" not in args:
        return
    print(why_not_ready(args["node_cluster"], args["fleet"]), file=sys.stderr)

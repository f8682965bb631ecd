"""Fixtures for the integration and chart tiers: a real control plane on loopback, namespaces, CRDs, processes.

``cluster`` (session) starts a fresh plane in a temporary state dir with
``kvretention_devtools.localcluster.up`` and stops it by pid at the end, or, when ``$KVR_KUBECONFIG`` names a
kubeconfig, uses that plane as is (e.g. one started with ``kvretention cluster up``, for fast reruns).
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kvretention.api.models import GROUP, PLURAL, VERSION
from kvretention_devtools.localcluster import ClusterError, ClusterState, down, up
from kvretention_devtools.localcluster.binaries import resolve_bin_dir
from support.controlplane import ApplyCrd, Cluster, RunningProcess, StartProcess, wait_until
from support.kube_reads import exists

KUBECONFIG_ENV = "KVR_KUBECONFIG"
FIELD_MANAGER = "kvr-tests"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The session's control plane (fresh, or the one ``$KVR_KUBECONFIG`` points at)."""
    external = os.environ.get(KUBECONFIG_ENV)
    state_dir = tmp_path_factory.mktemp("kvr-cluster")
    try:
        bin_dir = resolve_bin_dir()
        if not external:
            state, _ = up(state_dir, bin_dir=bin_dir)
    except ClusterError as err:
        pytest.fail(f"local control plane unavailable: {err}", pytrace=False)
    if external:
        yield Cluster.from_kubeconfig(Path(external), bin_dir=bin_dir)
        return
    yield from serving(state, bin_dir=bin_dir, state_dir=state_dir)


def serving(state: ClusterState, *, bin_dir: Path, state_dir: Path) -> Iterator[Cluster]:
    """The plane ``up`` started, as a :class:`Cluster` for as long as it is used; then ``down``
    (by pid), which raises where anything of it is left."""
    try:
        yield Cluster(
            kubeconfig=state.kubeconfig, server=state.server, bin_dir=bin_dir, state_dir=state_dir
        )
    finally:
        down(state_dir)


def api_client_for(cluster: Cluster) -> Iterator[client.ApiClient]:
    """A Python ``kubernetes`` ApiClient for ``cluster``, closed at the end."""
    api = cluster.api_client()
    yield api
    api.close()


@pytest.fixture(scope="session")
def k8s(cluster: Cluster) -> Iterator[client.ApiClient]:
    """A Python ``kubernetes`` ApiClient for the session's plane."""
    yield from api_client_for(cluster)


@pytest.fixture
def namespace(k8s: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test, ready for Pods; deleted afterwards (not awaited)."""
    core = client.CoreV1Api(k8s)
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"kvretention.dev/test": "true"}}})

    wait_until(
        f"ServiceAccount {name}/default",
        lambda: exists(lambda: core.read_namespaced_service_account("default", name)),
    )
    yield name
    _delete_fleets(k8s, name)
    core.delete_namespace(name)


def _delete_fleets(k8s: client.ApiClient, namespace: str) -> None:
    """Delete the namespace's fleets first (no finalizers: gone at once), so the operator of a later
    module never reconciles a fleet left in a namespace that takes a while to terminate."""
    try:
        client.CustomObjectsApi(k8s).delete_collection_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL
        )
    except ApiException as err:
        if err.status != 404:  # 404: the tier never installed the CRD
            raise


def _crd_established(api: client.ApiextensionsV1Api, name: str) -> bool:
    crd = api.read_custom_resource_definition(name)
    conditions = (crd.status.conditions if crd.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


@pytest.fixture(scope="session")
def apply_crd(k8s: client.ApiClient) -> ApplyCrd:
    """``apply_crd(path_or_dict)``: server-side apply a CRD and wait until it is Established.

    CRDs are cluster-scoped and stay for the session (re-applying is a no-op), so tests that share
    one do not race on its deletion.
    """
    api = client.ApiextensionsV1Api(k8s)

    def apply(crd: Path | str | Mapping[str, Any]) -> dict[str, Any]:
        body = dict(crd) if isinstance(crd, Mapping) else yaml.safe_load(Path(crd).read_text())
        name = body["metadata"]["name"]
        api.patch_custom_resource_definition(
            name,
            body,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
        )
        wait_until(f"CRD {name} Established", lambda: _crd_established(api, name))
        return body

    return apply


@pytest.fixture
def start_process(cluster: Cluster, tmp_path: Path) -> Iterator[StartProcess]:
    """``start_process(argv, env=None, name=None)``: run a real process against the plane.

    Its environment has ``KUBECONFIG`` set to the plane's; everything started is stopped at teardown
    and the last lines of its log are printed (pytest shows them for failing tests).
    """
    started: list[RunningProcess] = []

    def start(
        argv: Sequence[str], *, env: Mapping[str, str] | None = None, name: str | None = None
    ) -> RunningProcess:
        label = name or Path(argv[0]).name
        log_path = tmp_path / f"{label}-{len(started)}.log"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **cluster.env, **(env or {})}
        with log_path.open("wb") as out:
            proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=full_env)
        running = RunningProcess(argv=list(argv), proc=proc, log_path=log_path)
        started.append(running)
        return running

    yield start
    for running in reversed(started):
        code = running.stop()
        print(f"--- {' '.join(running.argv)} (exit {code}), last lines:\n{running.log()[-3000:]}")

"""The LeaderWorkerSet controller and a second kwok node for the multinode modules.

Import from test modules as ``from lws_fixtures import ...`` (pytest puts this folder on sys.path).
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kvretention_devtools.localcluster import lws
from kvretention_devtools.localcluster.components import build_node
from support.controlplane import Cluster, wait_until
from support.kube_reads import exists

SECOND_NODE = "kvr-node-lws-1"
GROUP = "leaderworkerset.x-k8s.io"


def credentials(cluster: Cluster) -> tuple[str, bytes]:
    """The plane's admin token and CA, from its kubeconfig."""
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    token = kubeconfig["users"][0]["user"]["token"]
    ca_pem = base64.b64decode(kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"])
    return str(token), ca_pem


@contextlib.contextmanager
def second_node(k8s: client.ApiClient) -> Iterator[None]:
    """A second fake GPU node, so a group can put one rank on each of two nodes."""
    core = client.CoreV1Api(k8s)
    try:
        core.create_node(build_node(SECOND_NODE, gpus=8))
    except ApiException as exc:
        if exc.status != 409:
            raise

    def ready() -> bool:
        conditions = core.read_node(SECOND_NODE).status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    try:
        wait_until(f"Node {SECOND_NODE} Ready", ready)
        yield
    finally:
        core.delete_node(SECOND_NODE)


def start_lws(cluster: Cluster, tmp_path_factory: Any) -> Any:
    """Start the LWS controller (CRD, process, webhooks); returns its state dir for stop_lws."""
    token, ca_pem = credentials(cluster)
    state_dir = cluster.state_dir or tmp_path_factory.mktemp("lws")
    lws.start(
        state_dir, server=cluster.server, token=token, ca_pem=ca_pem, kubeconfig=cluster.kubeconfig
    )
    return state_dir


def stop_lws(cluster: Cluster, state_dir: Any) -> None:
    token, ca_pem = credentials(cluster)
    lws.stop(state_dir, server=cluster.server, token=token, ca_pem=ca_pem)


@contextlib.contextmanager
def lws_running(cluster: Cluster, tmp_path_factory: Any) -> Iterator[None]:
    state_dir = start_lws(cluster, tmp_path_factory)
    try:
        yield
    finally:
        stop_lws(cluster, state_dir)


def delete_lws_crd(k8s: client.ApiClient) -> None:
    """No LeaderWorkerSet API at all (deleting the CRD deletes every LeaderWorkerSet too)."""
    ext = client.ApiextensionsV1Api(k8s)
    try:
        ext.delete_custom_resource_definition(lws.CRD_NAME)
    except ApiException as exc:
        if exc.status != 404:
            raise

    wait_until(
        f"CRD {lws.CRD_NAME} deleted",
        lambda: not exists(lambda: ext.read_custom_resource_definition(lws.CRD_NAME)),
        timeout_s=60,
    )

"""Pure builders: where each file of a plane lives and the argv each component runs with."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

SERVICE_CIDR: Final = "10.96.0.0/16"
POD_CIDR: Final = "10.244.0.0/16"
SA_ISSUER: Final = "https://kubernetes.default.svc.cluster.local"
KWOK_ANNOTATION: Final = "kwok.x-k8s.io/node"
# Start order; stop goes in reverse so nothing loses its API server or etcd first.
ORDER: Final = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


@dataclass(frozen=True)
class Layout:
    """Files of one plane under its state dir."""

    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    @property
    def serving_cert(self) -> Path:
        """Self-signed by kube-apiserver in --cert-dir; it holds the CA that signed it too."""
        return self.certs / "apiserver.crt"

    @property
    def sa_key(self) -> Path:
        return self.certs / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.certs / "sa.pub"

    @property
    def token_file(self) -> Path:
        return self.certs / "tokens.csv"

    @property
    def kwok_home(self) -> Path:
        """kwok also reads ~/.kwok/kwok.yaml; a private HOME keeps a user's config out."""
        return self.root / "kwok-home"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int


def etcd_url(ports: Ports) -> str:
    return f"http://127.0.0.1:{ports.etcd_client}"


def server_url(ports: Ports) -> str:
    return f"https://127.0.0.1:{ports.apiserver}"


def build_etcd_argv(bin_dir: Path, layout: Layout, ports: Ports) -> list[str]:
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(bin_dir / "etcd"),
        "--name=kvr",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={etcd_url(ports)}",
        f"--advertise-client-urls={etcd_url(ports)}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=kvr={peer}",
        # Throwaway data: skipping fsync makes every write, and so every test, much faster.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def build_apiserver_argv(bin_dir: Path, layout: Layout, ports: Ports) -> list[str]:
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers={etcd_url(ports)}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={layout.certs}",
        f"--token-auth-file={layout.token_file}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-key-file={layout.sa_pub}",
        f"--service-account-signing-key-file={layout.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # A loopback advertise address is refused by the endpoint reconciler; nothing in-cluster
        # dials the kubernetes Service here, so it needs no endpoints.
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true",
        "--profiling=false",
    ]


def _serving_flags(port: int, kubeconfig: Path) -> list[str]:
    """Loopback-only health endpoints; delegated authn/z so they start without warnings."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--leader-elect=false",
        "--profiling=false",
    ]


def build_controller_manager_argv(bin_dir: Path, layout: Layout, ports: Ports) -> list[str]:
    return [
        str(bin_dir / "kube-controller-manager"),
        *_serving_flags(ports.controller_manager, layout.kubeconfig),
        f"--cert-dir={layout.certs / 'controller-manager'}",
        # Every default controller: Deployments, ReplicaSets, GC, namespaces, SAs, node lifecycle.
        "--controllers=*",
        f"--service-account-private-key-file={layout.sa_key}",
        f"--root-ca-file={layout.serving_cert}",
        f"--cluster-cidr={POD_CIDR}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
    ]


def build_scheduler_argv(bin_dir: Path, layout: Layout, ports: Ports) -> list[str]:
    return [
        str(bin_dir / "kube-scheduler"),
        *_serving_flags(ports.scheduler, layout.kubeconfig),
        f"--cert-dir={layout.certs / 'scheduler'}",
    ]


def build_kwok_argv(bin_dir: Path, layout: Layout, ports: Ports) -> list[str]:
    return [
        str(bin_dir / "kwok"),
        f"--kubeconfig={layout.kubeconfig}",
        f"--config={bin_dir / 'kwok-stages.yaml'}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
        f"--server-address=127.0.0.1:{ports.kwok}",
        "--node-ip=127.0.0.1",
        f"--cidr={POD_CIDR}",
        "--node-lease-duration-seconds=40",
    ]


def build_argv(component: str, bin_dir: Path, layout: Layout, ports: Ports) -> list[str]:
    builders = {
        "etcd": build_etcd_argv,
        "kube-apiserver": build_apiserver_argv,
        "kube-controller-manager": build_controller_manager_argv,
        "kube-scheduler": build_scheduler_argv,
        "kwok": build_kwok_argv,
    }
    return builders[component](bin_dir, layout, ports)


def build_node(name: str, *, gpus: int) -> dict[str, Any]:
    """A fake Node kwok manages: schedulable, with room for a fleet (GPUs included)."""
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "250", "ephemeral-storage": "1Ti"}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def build_kubeconfig(*, server: str, ca_pem: bytes, token: str) -> dict[str, Any]:
    """Self-contained (CA embedded), so the file still works when copied elsewhere."""
    ca_data = base64.b64encode(ca_pem).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "kvr", "cluster": {"server": server, "certificate-authority-data": ca_data}}
        ],
        "users": [{"name": "kvr-admin", "user": {"token": token}}],
        "contexts": [{"name": "kvr", "context": {"cluster": "kvr", "user": "kvr-admin"}}],
        "current-context": "kvr",
    }

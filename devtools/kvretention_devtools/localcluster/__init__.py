"""A real Kubernetes control plane on loopback for tests, the demo and benchmarks.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake Nodes that make Pods
Ready without a kubelet) run as local processes built by ``scripts/build-kube.sh``; ``up`` starts
them and writes a kubeconfig, ``down`` stops them by process id.
"""

from kvretention_devtools.localcluster.cluster import (
    ClusterState,
    cluster_status,
    down,
    load_state,
    up,
)
from kvretention_devtools.localcluster.errors import ClusterError

__all__ = ["ClusterError", "ClusterState", "cluster_status", "down", "load_state", "up"]

"""Pure builders for the real node: where its files live, their content, and each argv."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

NODE_NAME: Final = "kvr-real-node"
BRIDGE: Final = "kvr0"
# The pods' subnet on the node's own bridge; the gateway is the node's address (the API server,
# the kubelet and CoreDNS listen on it, so pods reach them without leaving the bridge).
POD_SUBNET: Final = "10.244.0.0/24"
GATEWAY: Final = "10.244.0.1"
CLUSTER_DOMAIN: Final = "cluster.local"
CGROUP_ROOT: Final = "kvr-node"
CNI_NETWORK: Final = "kvr"
# Paths the kubelet and containerd 1.6 use whatever they are configured with.
FIXED_PATHS: Final = (
    Path("/run/containerd"),
    Path("/var/lib/kubelet"),
    Path("/var/log/pods"),
    Path("/var/log/containers"),
    Path("/run/netns"),
    Path("/var/lib/cni"),
)
# What the kubelet, kube-proxy and the CNI bridge may set; each is recorded and put back.
SYSCTLS: Final = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.forwarding",
    "net.ipv4.conf.all.route_localnet",
    "net.ipv6.conf.all.forwarding",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)
# Set by the node itself before anything starts (the rest are set by the kubelet or the bridge).
NODE_SYSCTLS: Final = {
    "net.ipv4.ip_forward": "1",
    "net.bridge.bridge-nf-call-iptables": "1",
}


@dataclass(frozen=True)
class NodePorts:
    kubelet: int
    kubelet_healthz: int
    proxy_healthz: int
    proxy_metrics: int
    coredns_health: int


@dataclass(frozen=True)
class NodeLayout:
    """Files of the real node under the plane's state dir."""

    root: Path

    @property
    def dir(self) -> Path:
        return self.root / "node"

    @property
    def state_file(self) -> Path:
        return self.dir / "node.json"

    @property
    def host_record(self) -> Path:
        return self.dir / "host-record.json"

    @property
    def containerd_root(self) -> Path:
        return self.dir / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.dir / "containerd" / "state"

    @property
    def containerd_config(self) -> Path:
        return self.dir / "containerd" / "config.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.dir / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.dir / "kubelet.yaml"

    @property
    def proxy_config(self) -> Path:
        return self.dir / "kube-proxy.yaml"

    @property
    def corefile(self) -> Path:
        return self.dir / "Corefile"

    @property
    def resolv_conf(self) -> Path:
        return self.dir / "resolv.conf"

    def log(self, component: str) -> Path:
        return self.root / "logs" / f"{component}.log"


def build_containerd_config(layout: NodeLayout, *, cni_bin_dir: Path, sandbox_image: str) -> str:
    """containerd 1.6 (config version 2): all state under the node's folder, runc with cgroupfs,
    the CRI plugin on the node's CNI network, the locally built pause image as the sandbox."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return "\n".join(
        [
            "version = 2",
            f"root = {json.dumps(str(layout.containerd_root))}",
            f"state = {json.dumps(str(layout.containerd_state))}",
            "[grpc]",
            f"  address = {json.dumps(str(layout.containerd_socket))}",
            "[ttrpc]",
            f"  address = {json.dumps(str(layout.containerd_socket) + '.ttrpc')}",
            "[debug]",
            '  level = "warn"',
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {json.dumps(str(layout.dir / 'containerd' / 'opt'))}",
            f"[{cri}]",
            f"  sandbox_image = {json.dumps(sandbox_image)}",
            '  stream_server_address = "127.0.0.1"',
            "  enable_selinux = false",
            "  disable_apparmor = true",
            # Without CAP_SYS_RESOURCE (dropped on this kind of machine) runc cannot lower a
            # sandbox's oom_score_adj to the kubelet's -998: keep it at containerd's own.
            "  restrict_oom_score_adj = true",
            f"[{cri}.containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            f"[{cri}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{cri}.containerd.runtimes.runc.options]",
            "  SystemdCgroup = false",
            f"[{cri}.cni]",
            f"  bin_dir = {json.dumps(str(cni_bin_dir))}",
            f"  conf_dir = {json.dumps(str(layout.cni_conf_dir))}",
            "",
        ]
    )


def build_cni_conflist(layout: NodeLayout) -> dict[str, Any]:
    """One bridge with the node as gateway; no masquerade: pod traffic stays on the bridge."""
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(layout.cni_ipam_dir),
                },
            },
            {"type": "loopback"},
        ],
    }


def build_kubelet_config(layout: NodeLayout, ports: NodePorts) -> dict[str, Any]:
    """What it took on a cgroup v1 machine with containerd 1.6 (see docs/real-node.md)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_ROOT}",
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "address": GATEWAY,
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        # Only the node's own API server and pods reach this address (the bridge).
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDNS": [GATEWAY],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(layout.resolv_conf),
        "failSwapOn": False,
        "serializeImagePulls": False,
        # Locally built images are never pulled again: never collect them, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "podLogsDir": "/var/log/pods",
        "staticPodPath": "",
        "kernelMemcgNotification": False,
        "protectKernelDefaults": False,
        "registerNode": True,
        "shutdownGracePeriod": "0s",
    }


def build_kubelet_argv(bin_dir: Path, layout: NodeLayout, *, kubeconfig: Path) -> list[str]:
    return [
        str(bin_dir / "kubelet"),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={layout.kubelet_root}",
        f"--cert-dir={layout.kubelet_root / 'pki'}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={GATEWAY}",
        "--v=1",
    ]


def build_proxy_config(kubeconfig: Path, ports: NodePorts) -> dict[str, Any]:
    """iptables mode; conntrack sysctls left alone; no localhost NodePorts (no route_localnet)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "hostnameOverride": NODE_NAME,
        "bindAddress": GATEWAY,
        "clusterCIDR": POD_SUBNET,
        "healthzBindAddress": f"127.0.0.1:{ports.proxy_healthz}",
        "metricsBindAddress": f"127.0.0.1:{ports.proxy_metrics}",
        "nodePortAddresses": [f"{GATEWAY}/32"],
        "iptables": {"localhostNodePorts": False, "syncPeriod": "10s", "minSyncPeriod": "0s"},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def build_proxy_argv(bin_dir: Path, layout: NodeLayout) -> list[str]:
    return [str(bin_dir / "kube-proxy"), f"--config={layout.proxy_config}", "--v=1"]


def build_corefile(*, kubeconfig: Path, ports: NodePorts, upstream: str | None) -> str:
    """Cluster names from the API server; anything else to the host's resolver, if it has one."""
    forward = f"    forward . {upstream}\n" if upstream else ""
    return (
        f"{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{\n"
        f"    bind {GATEWAY}\n"
        "    errors\n"
        f"    health 127.0.0.1:{ports.coredns_health}\n"
        f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{\n"
        f"        kubeconfig {kubeconfig}\n"
        "        pods insecure\n"
        "        ttl 5\n"
        "    }\n"
        "    cache 5\n"
        "}\n"
        ".:53 {\n"
        f"    bind {GATEWAY}\n"
        "    errors\n"
        f"{forward}"
        "}\n"
    )


def build_coredns_argv(bin_dir: Path, layout: NodeLayout) -> list[str]:
    return [str(bin_dir / "coredns"), "-conf", str(layout.corefile)]


def build_resolv_conf() -> str:
    """For pods with dnsPolicy Default: the cluster's DNS too (the host's may be unreachable)."""
    return f"nameserver {GATEWAY}\n"


def build_kubernetes_endpoints(apiserver_port: int) -> dict[str, Any]:
    """The ``kubernetes`` Service's endpoints: the API server on the node's bridge address
    (its endpoint reconciler is off, as on the loopback plane)."""
    return {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "subsets": [
            {
                "addresses": [{"ip": GATEWAY}],
                "ports": [{"name": "https", "port": apiserver_port, "protocol": "TCP"}],
            }
        ],
    }


def build_apiserver_extra_args() -> list[str]:
    """Appended to the loopback plane's kube-apiserver argv (the last value of a flag wins)."""
    return [
        f"--bind-address={GATEWAY}",
        f"--advertise-address={GATEWAY}",
        "--kubelet-preferred-address-types=InternalIP",
    ]


def build_gpu_capacity_patch(gpus: int) -> list[dict[str, Any]]:
    """JSON patch adding stand-in ``nvidia.com/gpu`` capacity to the node's status, so worker pods
    that ask for GPUs schedule here (the worker image runs the engine stand-in)."""
    return [
        {"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(gpus)},
    ]

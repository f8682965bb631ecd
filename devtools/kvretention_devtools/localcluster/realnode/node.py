"""Start and stop the real node: prerequisites, the host record, containerd, the kubelet,
kube-proxy and CoreDNS, the ``kubernetes`` Service's endpoints and the node's stand-in GPUs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from kvretention.ports import free_ports
from kvretention_devtools.localcluster import process
from kvretention_devtools.localcluster.errors import ClusterError
from kvretention_devtools.localcluster.httpjson import request, write
from kvretention_devtools.localcluster.realnode import config, host, preflight
from kvretention_devtools.localcluster.realnode.config import (
    BRIDGE,
    GATEWAY,
    NODE_NAME,
    NodeLayout,
    NodePorts,
)

Echo = Callable[[str], None]
ORDER: Final = ("containerd", "kubelet", "kube-proxy", "coredns")
NODE_BIN_ENV: Final = "KVR_NODE_BIN"
IMAGES_ENV: Final = "KVR_NODE_IMAGES"
# Which state dir holds the machine's real node (one at a time: one bridge, one cgroup root), so a
# node whose owner died (a killed test run in a temporary dir) is found and torn down by the next.
MARKER: Final = Path("/run/kvretention-real-node")
CNI_BIN_DIRS: Final = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
# Debian package that brings each command, for the error that names the fix.
PACKAGES: Final = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "iptables": "iptables",
    "iptables-save": "iptables",
    "iptables-restore": "iptables",
    "ip": "iproute2",
}


@dataclass(frozen=True)
class Image:
    """A locally built image: its reference and the OCI archive scripts/build-images.sh wrote."""

    ref: str
    archive: str


@dataclass(frozen=True)
class NodeState:
    """``node/node.json``: the node's processes and what the plane needs to reach it."""

    bin_dir: Path
    pids: Mapping[str, int]
    ports: NodePorts
    images: Mapping[str, Image]

    def binary(self, name: str) -> str:
        if name == "containerd":
            return shutil.which("containerd") or "containerd"
        return str(self.bin_dir / name)

    def to_json(self) -> str:
        return json.dumps(
            {
                "bin_dir": str(self.bin_dir),
                "pids": dict(self.pids),
                "ports": self.ports.__dict__,
                "images": {k: v.__dict__ for k, v in self.images.items()},
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> NodeState:
        data = json.loads(text)
        return cls(
            bin_dir=Path(data["bin_dir"]),
            pids={k: int(v) for k, v in data["pids"].items()},
            ports=NodePorts(**data["ports"]),
            images={k: Image(**v) for k, v in data["images"].items()},
        )


def load_node(state_dir: Path) -> NodeState | None:
    try:
        return NodeState.from_json(NodeLayout(state_dir).state_file.read_text())
    except FileNotFoundError:
        return None


def stale_node_dir() -> Path | None:
    """The state dir of a real node this machine still has (its host record not yet restored)."""
    try:
        found = Path(MARKER.read_text().strip())
    except OSError:
        return None
    if not NodeLayout(found).host_record.is_file():
        MARKER.unlink(missing_ok=True)
        return None
    return found


def check_prerequisites(bin_dir: Path | None = None) -> tuple[Path, dict[str, Image]]:
    """The node's bin dir and its images (name -> OCI archive), or an error naming each fix."""
    problems = preflight.machine_problems()
    missing = sorted({pkg for cmd, pkg in PACKAGES.items() if shutil.which(cmd) is None})
    if not any((d / "bridge").is_file() for d in CNI_BIN_DIRS):
        missing.append("containernetworking-plugins")
    if missing:
        problems.append(
            f"missing Debian packages: {' '.join(missing)} (scripts/install-node.sh installs them)"
        )
    bins = _node_bin_dir(bin_dir, problems)
    images = _images(problems)
    if problems:
        raise ClusterError("cannot start a real node:\n  - " + "\n  - ".join(problems))
    assert bins is not None
    return bins, images


def prepare_host(state_dir: Path, *, echo: Echo) -> None:
    """Record the host (unless a record is there from a node not yet torn down), then make the
    bridge the API server will listen on and set the sysctls the pods' traffic needs."""
    layout = NodeLayout(state_dir)
    if layout.host_record.is_file():
        echo("a previous real node was not torn down; restoring the host first")
        stop_node(state_dir, echo=echo)
    shutil.rmtree(layout.dir, ignore_errors=True)
    layout.dir.mkdir(parents=True)
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        raise ClusterError(
            f"the bridge {BRIDGE} exists: a real node of another state dir runs (stop it with "
            f"kvretention cluster down --state-dir ...), or delete it: ip link delete {BRIDGE}"
        )
    rec = host.record()
    layout.host_record.write_text(rec.to_json())
    MARKER.write_text(str(state_dir.resolve()))
    echo(f"recorded the host's sysctls, iptables and mounts in {layout.host_record}")
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for name, value in config.NODE_SYSCTLS.items():
        host.write_sysctl(name, value)
    host.prepare_cgroups()


def start_node(
    state_dir: Path,
    *,
    bin_dir: Path,
    images: Mapping[str, Image],
    kubeconfig: Path,
    server: str,
    token: str,
    ca_pem: bytes,
    apiserver_port: int,
    gpus: int,
    timeout_s: float,
    echo: Echo,
) -> NodeState:
    layout = NodeLayout(state_dir)
    ports = NodePorts(*free_ports(5))
    cni_bin = next(d for d in CNI_BIN_DIRS if (d / "bridge").is_file())
    for path in (
        layout.containerd_config.parent,
        layout.cni_conf_dir,
        layout.cni_ipam_dir,
        layout.kubelet_root,
    ):
        path.mkdir(parents=True, exist_ok=True)
    sandbox = images["pause"].ref
    layout.containerd_config.write_text(
        config.build_containerd_config(layout, cni_bin_dir=cni_bin, sandbox_image=sandbox)
    )
    (layout.cni_conf_dir / "10-kvr.conflist").write_text(
        json.dumps(config.build_cni_conflist(layout), indent=2)
    )
    layout.kubelet_config.write_text(yaml.safe_dump(config.build_kubelet_config(layout, ports)))
    layout.proxy_config.write_text(yaml.safe_dump(config.build_proxy_config(kubeconfig, ports)))
    layout.resolv_conf.write_text(config.build_resolv_conf())
    layout.corefile.write_text(
        config.build_corefile(kubeconfig=kubeconfig, ports=ports, upstream=_upstream_dns())
    )
    deadline = time.monotonic() + timeout_s
    state = NodeState(bin_dir=bin_dir, pids={}, ports=ports, images=dict(images))
    pids: dict[str, int] = {}

    def start(name: str, argv: list[str]) -> None:
        pids[name] = process.spawn(argv, log=layout.log(name))
        _save(layout, state, pids)
        echo(f"started {name} (pid {pids[name]}, log {layout.log(name)})")

    def wait(what: str, check: Callable[[], bool]) -> None:
        watched = {
            name: process.Watched(pid, state.binary(name), layout.log(name))
            for name, pid in pids.items()
        }
        process.wait_until(what, check, watched=watched, deadline=deadline, interval_s=0.3)

    start("containerd", [state.binary("containerd"), "--config", str(layout.containerd_config)])
    wait("containerd's socket", lambda: _ctr_ok(layout))
    for image in images.values():
        began = time.monotonic()
        _ctr(layout, "images", "import", image.archive)
        echo(f"imported {image.ref} in {time.monotonic() - began:.1f}s")
    start("kubelet", config.build_kubelet_argv(bin_dir, layout, kubeconfig=kubeconfig))
    api = _Api(server, token, ca_pem)
    wait(f"Node {NODE_NAME} Ready", lambda: api.node_ready(NODE_NAME))
    if gpus:
        api.patch_status(NODE_NAME, config.build_gpu_capacity_patch(gpus))
    api.apply_endpoints(config.build_kubernetes_endpoints(apiserver_port))
    start("kube-proxy", config.build_proxy_argv(bin_dir, layout))
    start("coredns", config.build_coredns_argv(bin_dir, layout))
    health = f"http://127.0.0.1:{ports.coredns_health}/health"
    wait("CoreDNS /health", lambda: request("GET", health)[0] == 200)
    proxy = f"http://127.0.0.1:{ports.proxy_healthz}/healthz"
    wait("kube-proxy /healthz", lambda: request("GET", proxy)[0] == 200)
    return _save(layout, state, pids)


def node_alive(state_dir: Path) -> dict[str, bool]:
    state = load_node(state_dir)
    if state is None:
        return {}
    return {
        name: name in state.pids and process.is_alive(state.pids[name], state.binary(name))
        for name in ORDER
    }


def stop_node(state_dir: Path, *, echo: Echo) -> list[str]:
    """Stop the node's processes and every pod process, then put the host back as recorded.
    Returns what is still different from the record (empty when the host is clean)."""
    layout = NodeLayout(state_dir)
    state = load_node(state_dir)
    if state is None and not layout.host_record.is_file():
        return []  # no real node in this state dir (a kwok-only plane): touch nothing
    try:
        _stop_processes(layout, state, echo)
    except OSError as err:
        # Whatever failed here, the host is still restored below (and checked).
        echo(f"stopping the node's processes failed ({err}); restoring the host anyway")
    if not layout.host_record.is_file():
        return []
    rec = host.HostRecord.from_json(layout.host_record.read_text())
    left = host.restore(rec, owned=[layout.dir], echo=echo)
    if left:
        echo("the host is NOT as recorded:\n  " + "\n  ".join(left))
        return left
    echo("restored the host's sysctls, iptables rules, mounts and links")
    layout.host_record.unlink()
    if stale_node_dir() == state_dir.resolve():
        MARKER.unlink(missing_ok=True)
    layout.state_file.unlink(missing_ok=True)
    shutil.rmtree(layout.dir / "containerd", ignore_errors=True)
    return []


def _stop_processes(layout: NodeLayout, state: NodeState | None, echo: Echo) -> None:
    if state is not None:
        for name in ("coredns", "kube-proxy", "kubelet"):
            pid = state.pids.get(name)
            if pid is not None and process.stop(pid, state.binary(name)):
                echo(f"stopped {name} (pid {pid})")
    _kill_pod_processes(layout, echo)
    containerd = None if state is None else state.pids.get("containerd")
    if state is not None and containerd and process.stop(containerd, state.binary("containerd")):
        echo(f"stopped containerd (pid {containerd})")
    _kill_shims(layout)


class _Api:
    def __init__(self, server: str, token: str, ca_pem: bytes) -> None:
        self.server, self.token, self.ca_pem = server, token, ca_pem

    def get(self, path: str) -> tuple[int, Any]:
        return request("GET", f"{self.server}{path}", token=self.token, ca_pem=self.ca_pem)

    def write(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        return write(
            method, f"{self.server}{path}", token=self.token, body=body, ca_pem=self.ca_pem
        )

    def node_ready(self, name: str) -> bool:
        status, body = self.get(f"/api/v1/nodes/{name}")
        if status != 200 or not isinstance(body, dict):
            return False
        conditions = body.get("status", {}).get("conditions") or []
        taints = body.get("spec", {}).get("taints") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        return ready and not any(t.get("key", "").startswith("node.kubernetes.io/") for t in taints)

    def patch_status(self, name: str, patch: list[dict[str, Any]]) -> None:
        status, body = write(
            "PATCH",
            f"{self.server}/api/v1/nodes/{name}/status",
            token=self.token,
            body=patch,
            ca_pem=self.ca_pem,
            content_type="application/json-patch+json",
        )
        if status != 200:
            raise ClusterError(f"patching Node {name}'s status failed ({status}): {body}")

    def apply_endpoints(self, endpoints: dict[str, Any]) -> None:
        path = "/api/v1/namespaces/default/endpoints"
        status, body = self.write("POST", path, endpoints)
        if status == 409:
            status, body = self.write("PUT", f"{path}/kubernetes", endpoints)
        if status not in (200, 201):
            raise ClusterError(f"writing the kubernetes Endpoints failed ({status}): {body}")


def _kill_pod_processes(layout: NodeLayout, echo: Echo) -> None:
    """SIGKILL every process in the node's cgroups (every pod's), until none is left."""
    for _ in range(50):
        pids = _cgroup_pids()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    echo(f"processes still in the node's cgroups: {sorted(_cgroup_pids())}")


def _cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for hierarchy in host._hierarchies():
        root = hierarchy / config.CGROUP_ROOT
        if not root.is_dir():
            continue
        for dirpath, _, files in os.walk(root):
            if "cgroup.procs" in files:
                try:
                    text = (Path(dirpath) / "cgroup.procs").read_text()
                except OSError:
                    continue  # the kubelet or runc removed it since the walk listed it
                pids |= {int(p) for p in text.split()}
    return pids


def _kill_shims(layout: NodeLayout) -> None:
    """containerd's runc shims of this node (they name its socket); they outlive containerd."""
    needle = str(layout.containerd_socket).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmdline and needle in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def _save(layout: NodeLayout, state: NodeState, pids: Mapping[str, int]) -> NodeState:
    current = NodeState(
        bin_dir=state.bin_dir, pids=dict(pids), ports=state.ports, images=state.images
    )
    layout.state_file.write_text(current.to_json())
    return current


def _ctr(layout: NodeLayout, *args: str) -> str:
    argv = ["ctr", "--address", str(layout.containerd_socket), "--namespace", "k8s.io", *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


def _ctr_ok(layout: NodeLayout) -> bool:
    if not layout.containerd_socket.exists():
        return False
    try:
        _ctr(layout, "version")
    except ClusterError:
        return False
    return True


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


def _upstream_dns() -> str | None:
    """The host's resolvers, unless they are on loopback (unreachable from the node's DNS)."""
    try:
        lines = Path("/etc/resolv.conf").read_text().splitlines()
    except OSError:
        return None
    servers = [line.split()[1] for line in lines if line.startswith("nameserver ")]
    servers = [s for s in servers if not s.startswith("127.")]
    return " ".join(servers) or None


def _node_bin_dir(explicit: Path | None, problems: list[str]) -> Path | None:
    if explicit is None and os.environ.get(NODE_BIN_ENV):
        explicit = Path(os.environ[NODE_BIN_ENV])
    if explicit is None:
        explicit = _script_output("build-node.sh", problems, what="kubelet, kube-proxy, CoreDNS")
    if explicit is None:
        return None
    missing = [n for n in ("kubelet", "kube-proxy", "coredns") if not (explicit / n).is_file()]
    if missing:
        problems.append(f"missing in {explicit}: {', '.join(missing)} (scripts/build-node.sh)")
    return explicit


def _images(problems: list[str]) -> dict[str, Image]:
    """name -> image, from ``$KVR_NODE_IMAGES`` or ``scripts/build-images.sh --check``."""
    listing = os.environ.get(IMAGES_ENV)
    if listing is None:
        out = _script_output("build-images.sh", problems, what="the pause and fleet images")
        if out is None:
            return {}
        listing = str(out / "images.json")
    try:
        raw = json.loads(Path(listing).read_text())
        images = {name: Image(ref=v["ref"], archive=v["archive"]) for name, v in raw.items()}
    except (OSError, ValueError, KeyError, TypeError) as err:
        problems.append(f"no image list at {listing}: {err} (scripts/build-images.sh)")
        return {}
    if "pause" not in images:
        problems.append(f"{listing} has no pause image (scripts/build-images.sh)")
    return images


def _script_output(script: str, problems: list[str], *, what: str) -> Path | None:
    path = Path(__file__).resolve().parents[4] / "scripts" / script
    if not path.is_file():
        problems.append(f"no scripts/{script} (not a source checkout) to find {what}")
        return None
    done = subprocess.run([str(path), "--check"], capture_output=True, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        problems.append(f"{what} are not built yet: run scripts/{script} ({done.stderr.strip()})")
        return None
    return Path(done.stdout.strip().splitlines()[-1])

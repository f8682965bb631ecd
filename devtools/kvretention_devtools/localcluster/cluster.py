"""Bring a local plane up and down: start order, readiness, the state file, teardown by pid."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from kvretention.ports import free_ports
from kvretention_devtools.localcluster import components, lws, pki, process
from kvretention_devtools.localcluster.binaries import resolve_bin_dir
from kvretention_devtools.localcluster.components import ORDER, Layout, Ports
from kvretention_devtools.localcluster.errors import ClusterError
from kvretention_devtools.localcluster.httpjson import request, write
from kvretention_devtools.localcluster.realnode import config as node_config
from kvretention_devtools.localcluster.realnode import node as realnode

Echo = Callable[[str], None]


@dataclass(frozen=True)
class ClusterState:
    """What ``up`` recorded in ``state.json``: enough to reach the plane and to stop it."""

    state_dir: Path
    bin_dir: Path
    server: str
    kubeconfig: Path
    token: str
    ports: Ports
    pids: Mapping[str, int]
    nodes: tuple[str, ...]
    started_at: float

    def to_json(self) -> str:
        data = asdict(self)
        data.update(
            state_dir=str(self.state_dir),
            bin_dir=str(self.bin_dir),
            kubeconfig=str(self.kubeconfig),
            pids=dict(self.pids),
            nodes=list(self.nodes),
        )
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        data = json.loads(text)
        return cls(
            state_dir=Path(data["state_dir"]),
            bin_dir=Path(data["bin_dir"]),
            server=data["server"],
            kubeconfig=Path(data["kubeconfig"]),
            token=data["token"],
            ports=Ports(**data["ports"]),
            pids={k: int(v) for k, v in data["pids"].items()},
            nodes=tuple(data["nodes"]),
            started_at=float(data["started_at"]),
        )

    def binary(self, component: str) -> str:
        return str(self.bin_dir / component)

    def alive(self) -> dict[str, bool]:
        return {
            name: process.is_alive(self.pids[name], self.binary(name))
            if name in self.pids
            else False
            for name in ORDER
        }


def load_state(state_dir: Path) -> ClusterState | None:
    try:
        return ClusterState.from_json(Layout(state_dir).state_file.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as err:
        raise ClusterError(f"unreadable {Layout(state_dir).state_file}: {err}") from err


def is_ready(state: ClusterState) -> bool:
    status, _ = request("GET", f"{state.server}/readyz", token=state.token, timeout_s=3)
    node_up = all(realnode.node_alive(state.state_dir).values())
    return all(state.alive().values()) and node_up and status == 200


def up(
    state_dir: Path,
    *,
    bin_dir: Path | None = None,
    apiserver_port: int = 0,
    nodes: int = 1,
    gpus_per_node: int = 8,
    timeout_s: float = 180.0,
    echo: Echo = lambda _: None,
    real_node: bool = False,
    node_bin_dir: Path | None = None,
) -> tuple[ClusterState, bool]:
    """Start a fresh plane, or return the running one; the bool says whether it was started now.
    ``real_node``: no kwok Nodes; a real node (``realnode``) runs the pods on this machine."""
    state_dir = state_dir.resolve()
    with _locked(state_dir):
        existing = load_state(state_dir)
        if existing is not None:
            if is_ready(existing):
                if real_node != (realnode.load_node(state_dir) is not None):
                    kind = "a real node" if not real_node else "kwok Nodes only"
                    raise ClusterError(
                        f"a plane with {kind} runs in {state_dir}; stop it first "
                        "(kvretention cluster down)"
                    )
                return existing, False
            echo(f"found a stale or partly running plane in {state_dir}; stopping it")
            _stop_all(state_dir, echo)
        return _fresh(
            state_dir,
            bin_dir=bin_dir,
            apiserver_port=apiserver_port,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            timeout_s=timeout_s,
            echo=echo,
            real_node=real_node,
            node_bin_dir=node_bin_dir,
        )


def _fresh(
    state_dir: Path,
    *,
    bin_dir: Path | None,
    apiserver_port: int,
    nodes: int,
    gpus_per_node: int,
    timeout_s: float,
    echo: Echo,
    real_node: bool = False,
    node_bin_dir: Path | None = None,
) -> tuple[ClusterState, bool]:
    bins = resolve_bin_dir(bin_dir)
    node = realnode.check_prerequisites(node_bin_dir) if real_node else None
    stale = realnode.stale_node_dir() if real_node else None
    if stale is not None and stale != state_dir:
        echo(f"a real node of {stale} was never torn down; stopping it and restoring the host")
        with _locked(stale):
            _stop_all(stale, echo)
    ports = _allocate_ports(apiserver_port)
    layout = Layout(state_dir)
    _reset(layout)
    server = components.server_url(ports)
    if node is not None:
        nodes = 0  # the real node registers itself; no kwok Node would run a process
        server = f"https://{node_config.GATEWAY}:{ports.apiserver}"
    token = pki.new_token()
    pki.generate_service_account_keys(layout.sa_key, layout.sa_pub)
    layout.token_file.write_text(pki.build_token_file(token))
    layout.token_file.chmod(0o600)
    state = ClusterState(
        state_dir=state_dir,
        bin_dir=bins,
        server=server,
        kubeconfig=layout.kubeconfig,
        token=token,
        ports=ports,
        pids={},
        nodes=tuple(f"kvr-node-{i}" for i in range(nodes)),
        started_at=time.time(),
    )
    try:
        if node is not None:
            realnode.prepare_host(state_dir, echo=echo)
        started = _start(
            state,
            layout,
            gpus_per_node=gpus_per_node,
            timeout_s=timeout_s,
            echo=echo,
            real_node=node is not None,
        )
        if node is not None:
            realnode.start_node(
                state_dir,
                bin_dir=node[0],
                images=node[1],
                kubeconfig=layout.kubeconfig,
                server=state.server,
                token=token,
                ca_pem=layout.serving_cert.read_bytes(),
                apiserver_port=ports.apiserver,
                gpus=gpus_per_node,
                timeout_s=timeout_s,
                echo=echo,
            )
        return started, True
    except BaseException:
        _stop_all(state_dir, echo)
        raise


def down(state_dir: Path, *, echo: Echo = lambda _: None) -> list[str]:
    """Stop every recorded process, last started first; returns the names that were running."""
    state_dir = state_dir.resolve()
    if not state_dir.is_dir():
        return []
    with _locked(state_dir):
        return _stop_all(state_dir, echo)


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    """One up/down at a time per state dir (two shells, or a test run beside a demo)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _stop_all(state_dir: Path, echo: Echo) -> list[str]:
    if lws.stop(state_dir):
        echo("stopped lws-controller-manager")
    left = realnode.stop_node(state_dir, echo=echo)
    state = load_state(state_dir)
    if state is None:
        if left:
            raise ClusterError("the real node left the host changed:\n  " + "\n  ".join(left))
        return []
    stopped = []
    for name in reversed(ORDER):
        pid = state.pids.get(name)
        if pid is not None and process.stop(pid, state.binary(name)):
            echo(f"stopped {name} (pid {pid})")
            stopped.append(name)
    Layout(state_dir).state_file.unlink(missing_ok=True)
    if left:
        raise ClusterError("the real node left the host changed:\n  " + "\n  ".join(left))
    return stopped


def cluster_status(state_dir: Path) -> dict[str, Any]:
    """A plain summary for ``cluster status`` and for tests."""
    state = load_state(state_dir.resolve())
    if state is None:
        return {"running": False, "state_dir": str(state_dir)}
    alive = state.alive()
    return {
        "running": is_ready(state),
        "state_dir": str(state.state_dir),
        "server": state.server,
        "kubeconfig": str(state.kubeconfig),
        "bin_dir": str(state.bin_dir),
        "components": {name: {"pid": state.pids.get(name), "alive": alive[name]} for name in ORDER},
        **_node_status(state_dir.resolve()),
    }


def _node_status(state_dir: Path) -> dict[str, Any]:
    node = realnode.load_node(state_dir)
    if node is None:
        return {}
    alive = realnode.node_alive(state_dir)
    return {"node": {name: {"pid": node.pids.get(name), "alive": up} for name, up in alive.items()}}


def _start(
    state: ClusterState,
    layout: Layout,
    *,
    gpus_per_node: int,
    timeout_s: float,
    echo: Echo,
    real_node: bool = False,
) -> ClusterState:
    deadline = time.monotonic() + timeout_s
    pids: dict[str, int] = {}

    def start(name: str, env: Mapping[str, str] | None = None) -> None:
        argv = components.build_argv(name, state.bin_dir, layout, state.ports)
        if real_node and name == "kube-apiserver":
            argv += node_config.build_apiserver_extra_args()
        pids[name] = process.spawn(argv, log=layout.log(name), env=env)
        _save(state, pids)
        echo(f"started {name} (pid {pids[name]}, log {layout.log(name)})")

    def wait(what: str, check: Callable[[], bool]) -> None:
        watched = {
            name: process.Watched(pid, state.binary(name), layout.log(name))
            for name, pid in pids.items()
        }
        process.wait_until(what, check, watched=watched, deadline=deadline)

    start("etcd")
    etcd = components.etcd_url(state.ports)
    wait("etcd /health", lambda: request("GET", f"{etcd}/health")[0] == 200)
    start("kube-apiserver")
    wait("kube-apiserver /readyz", lambda: _ok(state, "/readyz"))
    ca_pem = layout.serving_cert.read_bytes()
    kubeconfig = components.build_kubeconfig(server=state.server, ca_pem=ca_pem, token=state.token)
    layout.kubeconfig.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
    layout.kubeconfig.chmod(0o600)
    start("kube-controller-manager")
    start("kube-scheduler")
    start("kwok", env={"HOME": str(layout.kwok_home)})
    for name in state.nodes:
        _create_node(state, ca_pem, components.build_node(name, gpus=gpus_per_node))
    for name, port in (
        ("kube-controller-manager", state.ports.controller_manager),
        ("kube-scheduler", state.ports.scheduler),
    ):
        wait(f"{name} /healthz", functools.partial(_healthy, f"https://127.0.0.1:{port}/healthz"))
    for name in state.nodes:
        wait(f"Node {name} Ready", functools.partial(_node_ready, state, ca_pem, name))
    # Pods need their namespace's default ServiceAccount, which controller-manager creates.
    sa_path = "/api/v1/namespaces/default/serviceaccounts/default"
    wait("ServiceAccount default/default", functools.partial(_ok, state, sa_path, ca_pem))
    return _save(state, pids)


def _healthy(url: str) -> bool:
    return request("GET", url)[0] == 200


def _ok(state: ClusterState, path: str, ca_pem: bytes | None = None) -> bool:
    return request("GET", f"{state.server}{path}", token=state.token, ca_pem=ca_pem)[0] == 200


def _create_node(state: ClusterState, ca_pem: bytes, node: dict[str, Any]) -> None:
    status, body = write(
        "POST", f"{state.server}/api/v1/nodes", token=state.token, body=node, ca_pem=ca_pem
    )
    if status not in (201, 409):
        raise ClusterError(f"creating Node {node['metadata']['name']} failed ({status}): {body}")


def _node_ready(state: ClusterState, ca_pem: bytes, name: str) -> bool:
    status, body = request(
        "GET", f"{state.server}/api/v1/nodes/{name}", token=state.token, ca_pem=ca_pem
    )
    if status != 200 or not isinstance(body, dict):
        return False
    conditions = body.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _save(state: ClusterState, pids: Mapping[str, int]) -> ClusterState:
    current = dataclasses.replace(state, pids=dict(pids))
    path = Layout(state.state_dir).state_file
    tmp = path.with_suffix(".tmp")
    tmp.write_text(current.to_json())
    tmp.chmod(0o600)
    tmp.replace(path)
    return current


def _reset(layout: Layout) -> None:
    """Drop what a previous plane left (data, keys, logs); a fresh plane starts from nothing."""
    for path in (layout.etcd_data, layout.certs, layout.logs, layout.kwok_home):
        shutil.rmtree(path, ignore_errors=True)
    layout.kubeconfig.unlink(missing_ok=True)
    for path in (layout.root, layout.certs, layout.logs, layout.kwok_home):
        path.mkdir(parents=True, exist_ok=True)
    layout.etcd_data.mkdir(mode=0o700)


def _allocate_ports(apiserver_port: int) -> Ports:
    """Free loopback ports; a requested API server port must be free now or it is an error."""
    if apiserver_port:
        _check_free(apiserver_port)
    free = free_ports(6)
    return Ports(
        etcd_client=free[0],
        etcd_peer=free[1],
        apiserver=apiserver_port or free[2],
        controller_manager=free[3],
        scheduler=free[4],
        kwok=free[5],
    )


def _check_free(port: int) -> None:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as err:
            raise ClusterError(
                f"port {port} on 127.0.0.1 is taken ({err.strerror}); stop what holds it "
                "or pick another with --port (0 picks a free one)"
            ) from err

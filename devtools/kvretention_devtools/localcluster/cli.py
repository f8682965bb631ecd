"""``kvretention cluster up|down|status|kubeconfig``: the local control plane from the shell."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import click

from kvretention_devtools.localcluster import lws
from kvretention_devtools.localcluster.binaries import repo_root
from kvretention_devtools.localcluster.cluster import (
    ClusterState,
    cluster_status,
    down,
    is_ready,
    up,
)
from kvretention_devtools.localcluster.cluster import load_state as _load_state
from kvretention_devtools.localcluster.components import Layout
from kvretention_devtools.localcluster.errors import ClusterError

STATE_ENV: Final = "KVR_CLUSTER_DIR"
FC = TypeVar("FC", bound=Callable[..., Any])


def default_state_dir() -> Path:
    """``$KVR_CLUSTER_DIR``, else ``.kvr-cluster`` in the checkout (or the current directory)."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    return (repo_root() or Path.cwd()) / ".kvr-cluster"


state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=default_state_dir,
    show_default=f"${STATE_ENV} or <repo>/.kvr-cluster",
    help="Where pids, logs, keys, etcd data and the kubeconfig live.",
)


@click.group()
def cluster() -> None:
    """A real local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)."""


def _dir_option(flag: str, *, help: str) -> Callable[[FC], FC]:
    """An optional existing directory (``None`` when not given: each has a default of its own)."""
    return click.option(
        flag, type=click.Path(file_okay=False, exists=True, path_type=Path), default=None, help=help
    )


def _int_option(*decls: str, low: int, high: int, default: int, help: str) -> Callable[[FC], FC]:
    return click.option(
        *decls, type=click.IntRange(low, high), default=default, show_default=True, help=help
    )


@cluster.command("up")
@state_dir_option
@_dir_option(
    "--bin-dir", help="Binaries (default: $KVR_KUBE_BIN or scripts/build-kube.sh's cache)."
)
@_int_option(
    "--port",
    "apiserver_port",
    low=0,
    high=65535,
    default=0,
    help="kube-apiserver port on 127.0.0.1; 0 picks a free one.",
)
@_int_option("--nodes", low=1, high=100, default=1, help="Fake kwok Nodes to create.")
@_int_option(
    "--gpus-per-node", low=0, high=64, default=8, help="nvidia.com/gpu capacity of each fake Node."
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=180.0,
    show_default=True,
    help="Seconds to wait for the plane to become ready.",
)
@click.option(
    "--foreground", is_flag=True, help="Stay attached; Ctrl-C or SIGTERM stops the plane."
)
@click.option(
    "--real-node",
    is_flag=True,
    help="Run pods for real on this machine (root): containerd, the kubelet, kube-proxy, CoreDNS "
    "and a CNI bridge instead of kwok Nodes; `down` restores every sysctl, iptables rule and mount "
    "it changed. Needs scripts/install-node.sh, scripts/build-node.sh, scripts/build-images.sh.",
)
@_dir_option(
    "--node-bin-dir",
    help="kubelet, kube-proxy, coredns (default: $KVR_NODE_BIN or scripts/build-node.sh's cache).",
)
@click.option(
    "--lws",
    "with_lws",
    is_flag=True,
    help="Also run the LeaderWorkerSet controller (multinode fleets): its CRD, the controller as a "
    "process and its webhooks (scripts/build-lws.sh builds it; `down` stops it).",
)
@_dir_option(
    "--lws-dir",
    help="lws-controller-manager and crds.yaml (default: $KVR_LWS_DIR or build-lws.sh's cache).",
)
def up_cmd(
    state_dir: Path, foreground: bool, with_lws: bool, lws_dir: Path | None, **plane: Any
) -> None:
    """Start the plane (or report the running one) and write its kubeconfig."""
    began = time.monotonic()
    try:
        # plane: bin_dir, apiserver_port, nodes, gpus_per_node, timeout_s, real_node, node_bin_dir
        state, started = up(state_dir, echo=_note, **plane)
    except ClusterError as err:
        raise click.ClickException(str(err)) from err
    if with_lws:
        try:
            lws.start(
                state.state_dir,
                server=state.server,
                token=state.token,
                ca_pem=Layout(state.state_dir).serving_cert.read_bytes(),
                kubeconfig=state.kubeconfig,
                lws_dir=lws_dir,
                echo=_note,
            )
        except ClusterError as err:
            raise click.ClickException(str(err)) from err
    if started:
        _note(f"ready in {time.monotonic() - began:.1f}s")
    else:
        _note(f"already running (state in {state.state_dir})")
    _print_usage(state)
    if foreground:
        _serve_until_signalled(state)


@cluster.command("down")
@state_dir_option
def down_cmd(state_dir: Path) -> None:
    """Stop every process of the plane by pid (data, keys and logs stay for inspection)."""
    try:
        stopped = down(state_dir, echo=_note)
    except ClusterError as err:
        raise click.ClickException(str(err)) from err
    _note("stopped" if stopped else f"nothing running in {state_dir}")


@cluster.command("status")
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def status_cmd(state_dir: Path, as_json: bool) -> None:
    """Show each component's pid and whether the API server is ready; exit 1 when not running."""
    info = cluster_status(state_dir)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    elif not info.get("components"):
        click.echo(f"not running (no state in {state_dir})")
    else:
        click.echo(f"{'ready' if info['running'] else 'NOT READY'}  {info['server']}")
        for name, comp in {**info["components"], **info.get("node", {})}.items():
            click.echo(f"  {name:<24} pid {comp['pid']!s:<8} {'up' if comp['alive'] else 'DOWN'}")
        click.echo(f"kubeconfig: {info['kubeconfig']}")
    if not info["running"]:
        raise SystemExit(1)


@cluster.command("kubeconfig")
@state_dir_option
@click.option(
    "--print", "print_content", is_flag=True, help="Print the file's content, not its path."
)
def kubeconfig_cmd(state_dir: Path, print_content: bool) -> None:
    """Print the kubeconfig path (use as KUBECONFIG=$(kvretention cluster kubeconfig))."""
    state = _load_state(state_dir.resolve())
    if state is None or not state.kubeconfig.is_file():
        raise click.ClickException(
            f"no plane in {state_dir}; start one with: kvretention cluster up"
        )
    click.echo(state.kubeconfig.read_text() if print_content else str(state.kubeconfig))


def _note(message: str) -> None:
    click.echo(f"[cluster] {message}", err=True)


def _print_usage(state: ClusterState) -> None:
    click.echo(f"server:     {state.server}")
    click.echo(f"kubeconfig: {state.kubeconfig}")
    click.echo(
        f"try:        {state.bin_dir / 'kubectl'} --kubeconfig {state.kubeconfig} get nodes,pods -A"
    )


def _serve_until_signalled(state: ClusterState) -> None:
    """Block until SIGINT/SIGTERM or a component dies, then stop the plane."""
    signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    _note("running in the foreground; Ctrl-C stops it")
    try:
        while signal.sigtimedwait(signals, 2.0) is None:
            if not is_ready(state):
                dead = [name for name, alive in state.alive().items() if not alive]
                _note(f"not ready any more (down: {', '.join(dead) or 'none'}); stopping")
                break
    finally:
        down(state.state_dir, echo=_note)

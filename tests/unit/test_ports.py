"""A process started by hand listens where the operator would put it: every CLI's ``--port``
default is the port the operator renders into that component's pods."""

from __future__ import annotations

from typing import Any

import click
import pytest

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources import build_children
from kvretention.dataplane.frontend.cli import frontend_cmd
from kvretention.dataplane.router.cli import router_cmd
from kvretention.dataplane.worker.cli import worker_cmd
from kvretention.ports import METRICS_PORT

CR = KvRetentionDeployment.from_k8s(
    {
        "apiVersion": "kvretention.io/v1alpha1",
        "kind": "KvRetentionDeployment",
        "metadata": {"name": "f", "namespace": "ns", "uid": "u-1"},
        "spec": {"model": {"name": "m", "path": "org/m"}},
    }
)


def _default_port(command: click.Command) -> Any:
    (port,) = (p for p in command.params if p.name == "port")
    return port.default


def _rendered_container(deployment: str) -> dict[str, Any]:
    (manifest,) = (
        m
        for m in build_children(CR)
        if m["kind"] == "Deployment" and m["metadata"]["name"] == deployment
    )
    containers: list[dict[str, Any]] = manifest["spec"]["template"]["spec"]["containers"]
    return containers[0]


@pytest.mark.parametrize(
    ("command", "deployment"),
    [(frontend_cmd, "f-frontend"), (router_cmd, "f-router"), (worker_cmd, "f-worker")],
    ids=["frontend", "router", "worker"],
)
def test_cli_default_port_is_the_rendered_port(command: click.Command, deployment: str) -> None:
    container = _rendered_container(deployment)
    args = container["command"]
    rendered = int(args[args.index("--port") + 1])
    assert [p["containerPort"] for p in container["ports"] if p["name"] == "http"] == [rendered]
    assert _default_port(command) == rendered


@pytest.mark.parametrize(
    ("command", "deployment"),
    [(frontend_cmd, "f-frontend"), (router_cmd, "f-router"), (worker_cmd, "f-worker")],
    ids=["frontend", "router", "worker"],
)
def test_pods_serve_metrics_on_the_metrics_port(command: click.Command, deployment: str) -> None:
    """The rendered ``--metrics-port`` is the container port named ``metrics`` (what the chart's
    PodMonitor scrapes); a process started by hand opens no second port unless told."""
    container = _rendered_container(deployment)
    args = container["command"]
    cut = args.index("--") if "--" in args else len(args)
    rendered = int(args[args.index("--metrics-port", 0, cut) + 1])
    assert rendered == METRICS_PORT
    assert [p["containerPort"] for p in container["ports"] if p["name"] == "metrics"] == [rendered]
    (option,) = (p for p in command.params if p.name == "metrics_port")
    assert option.default is None

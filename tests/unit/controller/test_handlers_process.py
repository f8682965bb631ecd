"""The operator process's own surface: flags, health and metrics endpoints (no cluster)."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

from kvretention.controller.metrics import Metrics
from kvretention.controller.operator import (
    ProcessState,
    build_health_app,
    build_metrics_app,
    operator_cmd,
)


def test_namespace_and_all_namespaces_exclude_each_other() -> None:
    result = CliRunner().invoke(operator_cmd, ["--namespace", "a", "--all-namespaces"])
    assert result.exit_code == 2
    assert "exclude each other" in result.output


def test_help_lists_the_contract_flags() -> None:
    result = CliRunner().invoke(operator_cmd, ["--help"])
    assert result.exit_code == 0
    for flag in (
        "--namespace",
        "--all-namespaces",
        "--health-port",
        "--metrics-port",
        "--leader-elect / --no-leader-elect",
        "--leader-election-namespace",
        "--resync-seconds",
    ):
        assert flag in result.output


async def test_readyz_follows_the_role() -> None:
    state = ProcessState(identity="me")
    async with TestClient(TestServer(build_health_app(state))) as http:
        assert (await http.get("/healthz")).status == 200
        assert (await http.get("/readyz")).status == 503  # starting
        state.role = "standby"
        response = await http.get("/readyz")
        assert response.status == 200
        assert await response.json() == {"ok": True, "role": "standby", "identity": "me"}
        state.role = "leader"
        assert (await http.get("/readyz")).status == 503  # kopf not watching yet
        state.kopf_ready.set()
        assert (await http.get("/readyz")).status == 200


async def test_metrics_endpoint_serves_the_operator_registry() -> None:
    metrics = Metrics()
    metrics.apply_writes.labels("Deployment").inc(3)
    metrics.status_writes.inc()
    assert metrics.writes() == 4
    async with TestClient(TestServer(build_metrics_app(metrics))) as http:
        body = await (await http.get("/metrics")).text()
    assert 'kvretention_operator_apply_writes_total{kind="Deployment"} 3.0' in body

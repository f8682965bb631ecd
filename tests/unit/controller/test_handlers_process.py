"""The operator process's own surface: flags, health and metrics endpoints (no cluster)."""

from __future__ import annotations

from typing import Any

import pytest
import urllib3
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

from kvretention.controller.kube import Kube
from kvretention.controller.metrics import Metrics
from kvretention.controller.operator import (
    API_PING_AFTER_S,
    API_STALE_AFTER_S,
    ProcessState,
    api_reachable,
    build_health_app,
    build_metrics_app,
    operator_cmd,
    plan_api_ping,
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
    state = ProcessState(identity="me", api_age=lambda: 1.0)
    async with TestClient(TestServer(build_health_app(state))) as http:
        assert (await http.get("/healthz")).status == 200
        assert (await http.get("/readyz")).status == 503  # starting
        state.role = "standby"
        response = await http.get("/readyz")
        assert response.status == 200
        assert await response.json() == {
            "ok": True,
            "role": "standby",
            "identity": "me",
            "apiServer": "reachable",
            "apiServerAnsweredSecondsAgo": 1.0,
        }
        state.role = "leader"
        assert (await http.get("/readyz")).status == 503  # kopf not watching yet
        state.kopf_ready.set()
        assert (await http.get("/readyz")).status == 200


async def test_readyz_is_503_while_the_api_server_does_not_answer() -> None:
    age: list[float | None] = [None]
    state = ProcessState(identity="me", role="leader", api_age=lambda: age[0])
    state.kopf_ready.set()
    async with TestClient(TestServer(build_health_app(state))) as http:
        response = await http.get("/readyz")
        assert response.status == 503  # never answered yet
        assert (await response.json())["apiServer"] == "unreachable"
        age[0] = API_STALE_AFTER_S - 1
        assert (await http.get("/readyz")).status == 200
        age[0] = API_STALE_AFTER_S + 1
        response = await http.get("/readyz")
        assert response.status == 503
        body = await response.json()
        assert (body["ok"], body["apiServer"]) == (False, "unreachable")
        # Liveness never depends on the API server: an outage must not restart the operator.
        assert (await http.get("/healthz")).status == 200


@pytest.mark.parametrize(
    ("age", "ping", "reachable"),
    [(None, True, False), (0.5, False, True), (5.0, True, True), (16.0, True, False)],
)
def test_heartbeat_and_readiness_decisions(age: float | None, ping: bool, reachable: bool) -> None:
    assert plan_api_ping(age, after=API_PING_AFTER_S) is ping
    assert api_reachable(age, stale_after=API_STALE_AFTER_S) is reachable


class _Response:
    def __init__(self, status: int) -> None:
        self.status = status
        self.data = b"{}"
        self.reason = "x"

    def read(self) -> bytes:
        return self.data

    def getheaders(self) -> dict[str, str]:
        return {}


class _Api:
    """Stands in for kubernetes.client.ApiClient at the transport boundary Kube uses."""

    def __init__(self) -> None:
        self.answer: int | Exception = 200

    def param_serialize(self, **_: Any) -> tuple[Any, ...]:
        return ("GET", "http://x/version", {}, None, [])

    def call_api(self, *_: Any, **__: Any) -> _Response:
        if isinstance(self.answer, Exception):
            raise self.answer
        return _Response(self.answer)

    def close(self) -> None:
        pass


async def test_kube_remembers_when_the_api_server_last_answered() -> None:
    now = [100.0]
    api = _Api()
    kube = Kube(api, clock=lambda: now[0])  # type: ignore[arg-type]
    assert kube.seconds_since_answer() is None
    assert await kube.ping() is True
    now[0] = 103.0
    assert kube.seconds_since_answer() == 3.0
    api.answer = 403  # refused, but answered
    assert await kube.ping() is False
    assert kube.seconds_since_answer() == 0.0
    now[0] = 110.0
    api.answer = urllib3.exceptions.MaxRetryError(None, "/version", "connection refused")  # type: ignore[arg-type]
    assert await kube.ping() is False
    api.answer = 503  # there, but cannot serve
    assert await kube.ping() is False
    assert kube.seconds_since_answer() == 7.0  # still the 403 at t=103


async def test_metrics_endpoint_serves_the_operator_registry() -> None:
    metrics = Metrics()
    metrics.apply_writes.labels("Deployment").inc(3)
    metrics.status_writes.inc()
    assert metrics.writes() == 4
    async with TestClient(TestServer(build_metrics_app(metrics))) as http:
        body = await (await http.get("/metrics")).text()
    assert 'kvretention_operator_apply_writes_total{kind="Deployment"} 3.0' in body

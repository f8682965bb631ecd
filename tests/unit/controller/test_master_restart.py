"""A restart of the managed Mooncake master's process (a crash, an OOM kill): its objects and soft
pins are gone, and ``RetentionBudget`` says ``PinsLost`` (a Warning Event) for as long as a lost
pin could have lived. Pods are shaped as the kubelet reports a restarted container."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from fake_kube import fleet_deployment, rolled_out

from kvretention.controller.conditions import PINS_LOST, Verdict
from kvretention.controller.diagnosis import observe_workload
from kvretention.controller.master_restart import (
    MasterRestart,
    check_pins_lost,
    find_master_restart,
)
from kvretention.controller.planner import event_type
from kvretention.controller.status import Fleet, Observed, compute_status, transitions

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
COMPONENT = "app.kubernetes.io/component"
INSTANCE = "app.kubernetes.io/instance"
DAY_S = 86_400


def master_pod(
    name: str = "f-mooncake-1",
    *,
    restarts: int = 0,
    finished: str | None = None,
    started: str = "2026-01-01T11:00:05Z",
    exit_reason: str | None = "OOMKilled",
    container: str = "mooncake-master",
    component: str = "mooncake-master",
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": container,
        "ready": True,
        "restartCount": restarts,
        "state": {"running": {"startedAt": started}},
    }
    if finished is not None:
        terminated: dict[str, Any] = {"exitCode": 137, "finishedAt": finished}
        if exit_reason:
            terminated["reason"] = exit_reason
        status["lastState"] = {"terminated": terminated}
    return {
        "metadata": {"name": name, "labels": {INSTANCE: "f", COMPONENT: component}},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True"},
            ],
            "containerStatuses": [status],
        },
    }


def live(name: str) -> dict[str, Any]:
    return rolled_out(name)


MASTER = fleet_deployment("f-mooncake", "mooncake-master")
MASTER_WORKLOAD = [observe_workload(MASTER, live("f-mooncake"))]
OOM = "2026-01-01T11:00:00Z"

FINDS = [
    pytest.param([master_pod()], None, id="never-restarted"),
    pytest.param(
        [master_pod(restarts=2, finished=OOM)],
        MasterRestart(
            "f-mooncake-1",
            2,
            dt.datetime(2026, 1, 1, 11, tzinfo=dt.UTC),
            "exit code 137 (OOMKilled)",
        ),
        id="oom-killed",
    ),
    pytest.param(
        [master_pod(restarts=1)],
        MasterRestart("f-mooncake-1", 1, dt.datetime(2026, 1, 1, 11, 0, 5, tzinfo=dt.UTC), None),
        id="no-last-state-the-start-of-the-new-process",
    ),
    pytest.param(
        [master_pod(restarts=3, container="sidecar", finished=OOM)], None, id="another-container"
    ),
    pytest.param(
        [master_pod(restarts=3, component="worker", finished=OOM)], None, id="not-the-master"
    ),
    pytest.param(
        [
            master_pod("a", restarts=1, finished="2026-01-01T10:00:00Z"),
            master_pod("b", restarts=1, finished=OOM, exit_reason=None),
        ],
        MasterRestart("b", 1, dt.datetime(2026, 1, 1, 11, tzinfo=dt.UTC), "exit code 137"),
        id="the-latest-of-two-pods",
    ),
    pytest.param([master_pod(restarts=1, started="", finished="not a time")], None, id="no-time"),
]


@pytest.mark.parametrize(("pods", "expected"), FINDS)
def test_find_master_restart(pods: list[dict[str, Any]], expected: MasterRestart | None) -> None:
    assert find_master_restart(MASTER_WORKLOAD, pods) == expected


BUDGET = Verdict("True", "WithinBudget", "observed: 4 pinned objects hold about 1.0%")
RESTART = MasterRestart("p", 1, T0, "exit code 137 (OOMKilled)")

WINDOWS = [
    pytest.param(RESTART, T0 + dt.timedelta(hours=1), DAY_S, True, id="within-the-longest-pin"),
    pytest.param(RESTART, T0 + dt.timedelta(days=1), DAY_S, False, id="every-lost-pin-ended"),
    pytest.param(None, T0, DAY_S, False, id="no-restart"),
    pytest.param(RESTART, T0, None, False, id="no-pin-length-known"),
]


@pytest.mark.parametrize(("restart", "now", "longest", "lost"), WINDOWS)
def test_pins_lost_for_as_long_as_a_lost_pin_could_live(
    restart: MasterRestart | None, now: dt.datetime, longest: float | None, lost: bool
) -> None:
    got = check_pins_lost(BUDGET, restart, now=now, longest_pin_s=longest)
    if not lost:
        assert got == BUDGET
        return
    assert (got.status, got.reason) == ("False", PINS_LOST)
    assert "soft pins written before 2026-01-01T12:00:00Z are lost" in got.message
    assert "restart 1, exit code 137 (OOMKilled)" in got.message
    assert "until 2026-01-02T12:00:00Z" in got.message
    assert got.message.endswith("budget: WithinBudget: " + BUDGET.message)


OTHERS = {name: live(name) for name in ("f-frontend", "f-router", "f-worker")}
FLEET = Fleet(
    name="f",
    namespace="ns",
    generation=1,
    hints_required=False,
    desired=[
        fleet_deployment("f-frontend", "frontend"),
        fleet_deployment("f-router", "router"),
        fleet_deployment("f-worker", "worker"),
        MASTER,
    ],
    longest_pin_s=43_200,
)


def condition(status: dict[str, Any], type_: str) -> tuple[str, str]:
    c = next(c for c in status["conditions"] if c["type"] == type_)
    return c["status"], c["reason"]


def test_a_master_restart_posts_one_warning_and_leaves_ready_alone() -> None:
    def step(pods: list[dict[str, Any]], previous: Any, now: dt.datetime) -> Any:
        observed = Observed(deployments={**OTHERS, "f-mooncake": live("f-mooncake")}, pods=pods)
        return compute_status(FLEET, observed, previous=previous, now=now)

    before = step([master_pod()], None, T0)
    assert condition(before, "RetentionBudget") == ("Unknown", "NotMeasured")
    restarted = step([master_pod(restarts=1, finished=OOM)], before, T0)
    assert condition(restarted, "RetentionBudget") == ("False", PINS_LOST)
    assert condition(restarted, "Ready") == condition(before, "Ready")
    assert condition(restarted, "KvStoreReady") == ("True", "PodsReady")
    posted = [(c["type"], c["reason"], event_type(c)) for c in transitions(before, restarted)]
    assert posted == [("RetentionBudget", PINS_LOST, "Warning")]
    assert step([master_pod(restarts=1, finished=OOM)], restarted, T0) == restarted
    # 12 h (maxTtlSeconds) after the process ended, no pin written before it could still live.
    later = T0 + dt.timedelta(hours=12)
    ended = step([master_pod(restarts=1, finished=OOM)], restarted, later)
    assert condition(ended, "RetentionBudget") == ("Unknown", "NotMeasured")
    assert [event_type(c) for c in transitions(restarted, ended)] == ["Normal"]


def test_an_external_master_has_no_pods_of_ours() -> None:
    external = Fleet(
        name="f",
        namespace="ns",
        generation=1,
        hints_required=False,
        desired=FLEET.desired[:3],
        kvstore_external="m:50051",
        longest_pin_s=43_200,
    )
    status = compute_status(
        external,
        Observed(deployments=OTHERS, pods=[master_pod(restarts=1, finished=OOM)]),
        previous=None,
        now=T0,
    )
    assert condition(status, "RetentionBudget") == ("Unknown", "ExternalMaster")

"""Workers first: a frontend or router takes a new image only once every worker runs its own.

The rule on hand-made objects (a table), then a whole fleet through the executor: a version bump
of all three images, the workers' rollout, an operator restarted in the middle of it."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from fake_kube import FakeKube, condition_messages, controller, fake, load_example, make_ready

from kvretention.api.names import LABEL_COMPONENT
from kvretention.controller.cache import CR_KIND
from kvretention.controller.objects import ChildKey
from kvretention.controller.rollout_order import images_of, plan_workers_first

__all__ = ["fake"]

OLD, NEW = "example.com/kvr:1.0", "example.com/kvr:1.1"
OLD_WORKER, NEW_WORKER = "example.com/worker:1.0", "example.com/worker:1.1"


def _deployment(name: str, component: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {LABEL_COMPONENT: component}},
        "spec": {
            "replicas": 2,
            "template": {"spec": {"containers": [{"name": "main", "image": image}]}},
        },
    }


def _live(
    manifest: dict[str, Any], *, updated: int = 2, available: int = 2, replicas: int = 2
) -> dict[str, Any]:
    """``manifest`` as the API server shows it: ``updated`` of 2 pods on its template, ``replicas``
    pods in all (more than 2 while old pods remain)."""
    obj = copy.deepcopy(manifest)
    obj["metadata"]["generation"] = 2
    obj["status"] = {
        "observedGeneration": 2,
        "replicas": replicas,
        "updatedReplicas": updated,
        "readyReplicas": available,
        "availableReplicas": available,
    }
    return obj


@dataclass
class Case:
    id: str
    frontend_live: str | None
    """The running frontend's image (None: not created yet)."""
    worker_live: str | None
    """The running worker's image (None: not created yet)."""
    worker_state: dict[str, int] = field(default_factory=dict)
    waits: bool = False


CASES = [
    Case("frontend created with the workers", None, None),
    Case("frontend image unchanged", NEW, OLD_WORKER),
    Case("worker not yet given its new template", OLD, OLD_WORKER, waits=True),
    Case("worker not created yet", OLD, None, waits=True),
    Case("old worker pods still running", OLD, NEW_WORKER, {"updated": 1, "replicas": 3}, True),
    Case("worker rolled out", OLD, NEW_WORKER),
    Case("new worker pods crash: nothing held back", OLD, NEW_WORKER, {"available": 0}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_frontend_waits_only_while_old_workers_run(case: Case) -> None:
    desired = [
        _deployment("f-frontend", "frontend", NEW),
        _deployment("f-worker", "worker", NEW_WORKER),
    ]
    live: dict[ChildKey, dict[str, Any]] = {}
    if case.frontend_live is not None:
        live[("Deployment", "f-frontend")] = _live(
            _deployment("f-frontend", "frontend", case.frontend_live)
        )
    if case.worker_live is not None:
        worker = _deployment("f-worker", "worker", case.worker_live)
        live[("Deployment", "f-worker")] = _live(worker, **case.worker_state)
    waits = plan_workers_first(desired, live)
    assert (("Deployment", "f-frontend") in waits) is case.waits
    if case.waits:
        assert "f-worker runs its new image" in waits[("Deployment", "f-frontend")]


def test_every_sender_waits_for_every_worker_pool() -> None:
    """Router and frontend both wait, for each pool that still runs its old image."""
    desired = [
        _deployment("f-frontend", "frontend", NEW),
        _deployment("f-router", "router", NEW),
        _deployment("f-prefill", "worker-prefill", NEW_WORKER),
        _deployment("f-decode", "worker-decode", NEW_WORKER),
    ]
    live = {
        ("Deployment", "f-frontend"): _live(_deployment("f-frontend", "frontend", OLD)),
        ("Deployment", "f-router"): _live(_deployment("f-router", "router", OLD)),
        ("Deployment", "f-prefill"): _live(_deployment("f-prefill", "worker-prefill", OLD_WORKER)),
        ("Deployment", "f-decode"): _live(_deployment("f-decode", "worker-decode", OLD_WORKER)),
    }
    waits = plan_workers_first(desired, live)
    assert set(waits) == {("Deployment", "f-frontend"), ("Deployment", "f-router")}
    assert "until f-prefill, f-decode run their new image" in waits[("Deployment", "f-router")]


def test_a_leader_worker_sets_images_are_its_leader_and_worker_templates() -> None:
    pod = {"spec": {"initContainers": [{"image": "init:1"}], "containers": [{"image": "w:1"}]}}
    lws = {"kind": "LeaderWorkerSet", "spec": {"leaderWorkerTemplate": {"leaderTemplate": pod}}}
    assert images_of(lws) == ("init:1", "w:1")
    lws["spec"]["leaderWorkerTemplate"]["workerTemplate"] = {
        "spec": {"containers": [{"image": "w:2"}]}
    }
    assert images_of(lws) == ("init:1", "w:1", "w:2")


# -- a fleet through the executor --------------------------------------------------------------


def _images(fake: FakeKube, name: str) -> tuple[str, ...]:
    return images_of(fake.objects[("deployments", "ns", name)])


def _bump(fake: FakeKube) -> None:
    """One edit moves the frontend, the router and the workers to new images."""
    cr = fake.cr()
    spec = cr["spec"]
    spec.setdefault("frontend", {})["image"] = NEW
    spec.setdefault("router", {})["image"] = NEW
    spec["workers"]["image"] = NEW_WORKER
    cr["metadata"]["generation"] += 1


async def test_a_version_bump_rolls_the_workers_before_the_frontend_and_router(
    fake: FakeKube,
) -> None:
    fake.put(CR_KIND, load_example("aggregated"))
    c = controller(fake)
    await c.reconcile(("ns", "qwen"))
    make_ready(fake)
    await c.reconcile(("ns", "qwen"))
    before = {n: _images(fake, n) for n in ("qwen-frontend", "qwen-router")}

    _bump(fake)
    await c.reconcile(("ns", "qwen"))
    assert NEW_WORKER in _images(fake, "qwen-worker")
    assert {n: _images(fake, n) for n in before} == before  # untouched while workers roll
    status, reason, message = condition_messages(fake.cr())["Progressing"]
    assert (status, reason) == ("True", "RollingOut")
    assert "Deployment qwen-frontend keeps its running image until qwen-worker" in message

    # an operator restarted mid-rollout decides the same from what the cluster shows
    restarted = controller(fake)
    await restarted.reconcile(("ns", "qwen"))
    assert {n: _images(fake, n) for n in before} == before

    make_ready(fake)  # the worker Deployment has replaced every pod
    await restarted.reconcile(("ns", "qwen"))
    assert NEW in _images(fake, "qwen-frontend") and NEW in _images(fake, "qwen-router")
    make_ready(fake)
    await restarted.reconcile(("ns", "qwen"))
    assert condition_messages(fake.cr())["Progressing"][:2] == ("False", "Converged")


async def test_a_frontend_change_alone_is_applied_at_once(fake: FakeKube) -> None:
    fake.put(CR_KIND, load_example("aggregated"))
    c = controller(fake)
    await c.reconcile(("ns", "qwen"))
    make_ready(fake)
    await c.reconcile(("ns", "qwen"))
    fake.cr()["spec"].setdefault("frontend", {})["image"] = NEW
    await c.reconcile(("ns", "qwen"))
    assert NEW in _images(fake, "qwen-frontend")

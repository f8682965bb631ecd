"""The reconcile against an in-memory API: write counts, drift repair, pruning, invalid specs.

The fake keeps the one property of server-side apply the reconcile relies on: applying what is
already there changes nothing (no new resourceVersion). The real API server is exercised by the
integration tier; this tier pins the controller's decisions and is fast.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from collections.abc import Mapping
from typing import Any

import pytest
from fake_kube import (
    NOW,
    FakeKube,
    FakeMaster,
    conditions,
    controller,
    fake,
    load_example,
    make_ready,
    reconciled,
)

from kvretention.api.models import KIND
from kvretention.controller import kinds
from kvretention.controller import kube as k
from kvretention.controller.cache import CHILD_INDEXES, CR_KIND, FLEETS_INDEX, PODS_INDEX
from kvretention.controller.executor import Controller
from kvretention.controller.informer import WATCHED
from kvretention.controller.kvstore_metrics import KvStoreReading, KvStoreUsage
from kvretention.controller.objects import owner_key
from kvretention.controller.planner import event_type
from kvretention.controller.watch import INDEX_IDS, Watches, build_registry
from kvretention.controller.workqueue import WorkQueue, backoff_delay

__all__ = ["fake"]  # the fixture


async def ready_fleet(fake: FakeKube) -> Controller:
    """The aggregated example reconciled, its children made ready, and reconciled again."""
    c = await reconciled(fake)
    make_ready(fake)
    await c.reconcile(("ns", "qwen"))
    return c


def clocked_master(
    fake: FakeKube, reading: KvStoreReading
) -> tuple[str, list[dt.datetime], FakeMaster, Controller]:
    """The disaggregated example and a controller on a hand-moved clock (``now[0]``) whose
    Mooncake master answers ``reading`` (set ``master.reading`` to change it)."""
    body = load_example("disaggregated")
    fake.put(CR_KIND, body)
    now = [NOW]
    master = FakeMaster(reading)
    c = Controller(fake, clock=lambda: now[0], read_kvstore=master)  # type: ignore[arg-type]
    return body["metadata"]["name"], now, master, c


def retention_budget(status: Mapping[str, Any]) -> dict[str, Any]:
    """The RetentionBudget condition of a fleet's status."""
    return dict(next(x for x in status["conditions"] if x["type"] == "RetentionBudget"))


async def test_first_reconcile_writes_each_child_once_then_nothing(fake: FakeKube) -> None:
    fake.put(CR_KIND, load_example("aggregated"))
    c = controller(fake)
    assert await c.reconcile(("ns", "qwen")) == "ok"
    kinds = [w[0] for w in fake.writes]
    children = [w for w in fake.writes if not w[0].endswith("/status")]
    assert len(children) == len(set(children)) == len(fake.children())
    assert kinds.count("KvRetentionDeployment/status") == 1
    assert conditions(fake.cr())["Ready"][0] == "False"

    fake.writes.clear()
    await c.reconcile(("ns", "qwen"))
    assert fake.writes == []  # converged on the spec side, status unchanged

    make_ready(fake)
    await c.reconcile(("ns", "qwen"))
    assert fake.writes == [("KvRetentionDeployment/status", "qwen")]
    cond = conditions(fake.cr())
    assert cond["WorkersReady"] == ("True", "PodsReady")
    # Optional policy, no probe report yet: serving, without hints.
    assert cond["Ready"] == ("True", "ReadyWithoutKvHints")

    fake.writes.clear()
    for _ in range(3):
        await c.reconcile(("ns", "qwen"))
    assert fake.writes == []


async def test_deleted_and_edited_children_are_repaired(fake: FakeKube) -> None:
    c = await ready_fleet(fake)
    fake.writes.clear()

    del fake.objects[("deployments", "ns", "qwen-router")]
    edited = fake.objects[("deployments", "ns", "qwen-frontend")]
    edited["spec"]["replicas"] = 7
    edited["metadata"]["resourceVersion"] = "999"
    edited["metadata"]["generation"] += 1  # as the API server does on a spec edit
    await c.reconcile(("ns", "qwen"))
    repaired = {w for w in fake.writes if w[0] == "Deployment"}
    assert repaired == {("Deployment", "qwen-router"), ("Deployment", "qwen-frontend")}
    assert fake.objects[("deployments", "ns", "qwen-frontend")]["spec"]["replicas"] == 1


async def test_invalid_spec_creates_nothing_and_says_why(fake: FakeKube) -> None:
    body = load_example("aggregated")
    body["spec"]["workers"]["mode"] = (
        "sideways"  # the schema would reject it; a stale CRD might not
    )
    fake.put(CR_KIND, body)
    c = controller(fake)
    assert await c.reconcile(("ns", "qwen")) == "invalid"
    assert fake.children() == set()
    status, reason = conditions(fake.cr())["Ready"]
    assert (status, reason) == ("False", "InvalidSpec")
    assert (
        "mode"
        in next(c for c in fake.cr()["status"]["conditions"] if c["type"] == "Ready")["message"]
    )
    fake.writes.clear()
    assert await c.reconcile(("ns", "qwen")) == "invalid"
    assert fake.writes == []  # no status churn on an invalid object either


async def test_user_metadata_is_never_written(fake: FakeKube) -> None:
    body = load_example("aggregated")
    body["metadata"]["annotations"] = {"argocd.argoproj.io/tracking-id": "x"}
    fake.put(CR_KIND, body)
    before = copy.deepcopy(fake.cr())
    await controller(fake).reconcile(("ns", "qwen"))
    after = fake.cr()
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
    assert after["spec"] == before["spec"]
    assert "finalizers" not in after["metadata"]


async def test_mode_change_prunes_children_the_spec_no_longer_wants(fake: FakeKube) -> None:
    c = await reconciled(fake)
    cr = fake.cr()
    uid = cr["metadata"]["uid"]
    for obj in fake.objects.values():  # the builders set ownerReferences from the CR's uid
        if obj is not cr:
            assert any(r["uid"] == uid for r in obj["metadata"].get("ownerReferences", []))
    disagg = load_example("disaggregated")
    cr["spec"] = {**disagg["spec"], "model": cr["spec"]["model"]}
    cr["metadata"]["generation"] += 1
    await c.reconcile(("ns", "qwen"))
    names = {n for (_, n) in fake.children()}
    assert "qwen-worker" not in names
    assert {"qwen-prefill", "qwen-decode"} <= names


async def test_gone_object_is_a_no_op(fake: FakeKube) -> None:
    assert await controller(fake).reconcile(("ns", "missing")) == "gone"
    assert fake.writes == []


async def test_failures_are_retried_with_backoff_and_never_escape(fake: FakeKube) -> None:
    fake.put(CR_KIND, load_example("aggregated"))
    c = controller(fake)
    calls = 0

    async def boom(*_: Any, **__: Any) -> Any:
        nonlocal calls
        calls += 1
        raise k.ApiError(500, "etcd is sad")

    fake.list = boom  # type: ignore[method-assign]
    c.known.add(("ns", "qwen"))
    await c._process(("ns", "qwen"))
    await c._process(("ns", "qwen"))
    assert calls == 2
    assert c.failures[("ns", "qwen")] == 2
    assert c.metrics.errors._value.get() == 2


def test_workqueue_coalesces_and_serializes() -> None:
    async def scenario() -> list[tuple[str, str]]:
        q = WorkQueue()
        a, b = ("ns", "a"), ("ns", "b")
        q.add(a)
        q.add(a)
        q.add(b)
        first = await q.get()
        q.add(first)  # re-added while processing: not handed out twice at once
        second = await q.get()
        assert q.queue.empty()
        q.done(first)
        third = await q.get()
        return [first, second, third]

    assert asyncio.run(scenario()) == [("ns", "a"), ("ns", "b"), ("ns", "a")]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {
                "metadata": {
                    "namespace": "ns",
                    "ownerReferences": [
                        {
                            "apiVersion": "kvretention.io/v1alpha1",
                            "kind": "KvRetentionDeployment",
                            "name": "x",
                        }
                    ],
                }
            },
            ("ns", "x"),
        ),
        (
            {"metadata": {"namespace": "ns", "labels": {"app.kubernetes.io/instance": "y"}}},
            ("ns", "y"),
        ),
        ({"metadata": {"namespace": "ns"}}, None),
        ({"metadata": {}}, None),
    ],
)
def test_owner_key(body: dict[str, Any], expected: tuple[str, str] | None) -> None:
    assert owner_key(body) == expected


def test_backoff_grows_and_caps() -> None:
    assert [backoff_delay(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert backoff_delay(50) == 60.0


def test_registry_has_only_event_handlers() -> None:
    registry = build_registry()
    # No change-detection handlers (they persist state in the object) and no daemons/timers
    # (they add a finalizer): only watch-event handlers and the startup settings.
    assert not registry._changing.get_all_handlers()
    assert not registry._spawning.get_all_handlers()
    # kopf watches the custom resources only; the children and pods are the informers'.
    assert [str(h.id) for h in registry._watching.get_all_handlers()] == ["kvretentiondeployment"]


def test_child_watches_are_filtered_by_the_api_server() -> None:
    managed = "app.kubernetes.io/managed-by=kvretention-operator"
    assert {(kind.kind, selector) for _, kind, selector in WATCHED} == {
        ("Deployment", managed),
        ("Service", managed),
        ("ConfigMap", managed),
        ("PodDisruptionBudget", managed),
        ("NetworkPolicy", managed),
        ("HorizontalPodAutoscaler", managed),
        ("LeaderWorkerSet", managed),
        ("InferencePool", managed),
        ("Pod", "app.kubernetes.io/name=kvretention,app.kubernetes.io/instance"),
    }
    # The custom resource itself is watched whole (by kopf): users do not label their fleets.
    registry = build_registry()
    (cr_handler,) = registry._watching.get_all_handlers()
    assert cr_handler.selector is not None and cr_handler.labels is None


def _fleet_pod(fake: FakeKube, name: str, component: str, status: dict[str, Any]) -> None:
    labels = {
        "app.kubernetes.io/name": "kvretention",
        "app.kubernetes.io/instance": "qwen",
        "app.kubernetes.io/component": component,
    }
    fake.put(
        kinds.POD,
        {"metadata": {"name": name, "namespace": "ns", "labels": labels}, "status": status},
    )


async def test_a_pod_the_scheduler_cannot_place_names_the_reason_and_warns(
    fake: FakeKube,
) -> None:
    c = await reconciled(fake)
    assert fake.events == []  # a fleet coming up is not news
    make_ready(fake)
    worker = fake.objects[("deployments", "ns", "qwen-worker")]
    worker["status"].update(readyReplicas=1, availableReplicas=1)
    message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    _fleet_pod(
        fake,
        "qwen-worker-abc",
        "worker",
        {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                }
            ],
        },
    )
    # Another fleet's pod in the same namespace is not looked at.
    fake.put(
        kinds.POD,
        {
            "metadata": {
                "name": "other-worker-x",
                "namespace": "ns",
                "labels": {
                    "app.kubernetes.io/name": "kvretention",
                    "app.kubernetes.io/instance": "other",
                    "app.kubernetes.io/component": "worker",
                },
            },
            "status": {"phase": "Failed", "reason": "Evicted"},
        },
    )
    await c.reconcile(("ns", "qwen"))
    cond = {x["type"]: x for x in fake.cr()["status"]["conditions"]}
    assert cond["WorkersReady"]["reason"] == "Unschedulable"
    assert cond["WorkersReady"]["message"] == (
        f"Deployment qwen-worker (1/2 ready): pod qwen-worker-abc: {message}"
    )
    assert (cond["Ready"]["status"], cond["Ready"]["reason"]) == ("False", "Unschedulable")
    assert cond["Progressing"]["status"] == "True"
    pools = fake.cr()["status"]["workers"]["pools"]
    assert [(p["name"], p["reason"]) for p in pools] == [("qwen-worker", "Unschedulable")]
    # The components that came up flipped to True (Normal); the stuck workers warn once each.
    warnings = [reason for type_, reason in fake.events if type_ == "Warning"]
    assert warnings == ["Unschedulable", "Unschedulable"]  # Ready and WorkersReady
    assert ("Normal", "PodsReady") in fake.events
    fake.events.clear()
    await c.reconcile(("ns", "qwen"))
    assert fake.events == []  # still stuck: nothing new to say


async def test_a_refused_child_is_reported_in_status_and_retried(fake: FakeKube) -> None:
    fake.put(CR_KIND, load_example("aggregated"))
    real_apply = fake.apply

    async def refuse_router(manifest: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        if manifest["metadata"]["name"] == "qwen-router" and manifest["kind"] == "Deployment":
            raise k.ApiError(403, 'deployments.apps "qwen-router" is forbidden', reason="Forbidden")
        return await real_apply(manifest, **kwargs)

    fake.apply = refuse_router  # type: ignore[method-assign]
    c = controller(fake)
    c.known.add(("ns", "qwen"))
    with pytest.raises(k.RetryLater, match=r"HTTP 403 Forbidden: .* is forbidden"):
        await c.reconcile(("ns", "qwen"))
    ready = next(x for x in fake.cr()["status"]["conditions"] if x["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ApplyFailed")
    assert ready["message"] == (
        'Deployment qwen-router: HTTP 403 Forbidden: deployments.apps "qwen-router" is forbidden'
    )
    assert ("deployments", "ns", "qwen-frontend") in fake.objects  # the rest still applied


async def test_status_only_changes_to_a_child_cost_no_dry_run(fake: FakeKube) -> None:
    """A Deployment's status (and resourceVersion) moves all the time; its generation does not."""
    c = await ready_fleet(fake)
    before = sum(v for v in _dry_runs(c).values())
    for key, obj in fake.objects.items():
        if key[0] == "deployments":
            obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 100)
            obj["status"]["observedGeneration"] = obj["metadata"]["generation"]
    fake.writes.clear()
    await c.reconcile(("ns", "qwen"))
    assert [w for w in fake.writes if w[0] == "Deployment"] == []
    assert sum(v for v in _dry_runs(c).values()) == before


async def test_a_hand_edited_label_is_repaired(fake: FakeKube) -> None:
    c = await ready_fleet(fake)
    fake.writes.clear()
    edited = fake.objects[("deployments", "ns", "qwen-router")]
    edited["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone-else"
    edited["metadata"]["resourceVersion"] = "1234"  # a metadata edit bumps no generation
    await c.reconcile(("ns", "qwen"))
    assert ("Deployment", "qwen-router") in fake.writes
    labels = fake.objects[("deployments", "ns", "qwen-router")]["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "kvretention-operator"


def _dry_runs(c: Controller) -> dict[str, float]:
    return {
        s.labels["kind"]: s.value
        for metric in c.metrics.dry_runs.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }


@pytest.mark.parametrize(
    ("reading", "status", "reason"),
    [
        (None, "Unknown", "NotMeasured"),  # a first failed read is transient (stale)
        (
            KvStoreReading("2025-01-01T00:00:00Z", usage=KvStoreUsage(100, 80, 8, 1, 3, 30, 1)),
            "True",
            "WithinBudget",
        ),
        (
            KvStoreReading("2025-01-01T00:00:00Z", usage=KvStoreUsage(100, 80, 8, 7, 3, 30, 1)),
            "False",
            "OverBudget",
        ),
    ],
    ids=["unreachable", "within", "over"],
)
async def test_pool_usage_reaches_status_and_is_read_at_most_once_per_interval(
    fake: FakeKube, reading: KvStoreReading | None, status: str, reason: str
) -> None:
    body = load_example("disaggregated")  # softPin.budgetRatio 0.5
    fake.put(CR_KIND, body)
    master = FakeMaster(reading)
    c = controller(fake, master)
    await c.reconcile(("ns", body["metadata"]["name"]))
    assert master.urls == [f"http://{body['metadata']['name']}-mooncake.ns.svc:9003/metrics"]
    got = fake.cr(body["metadata"]["name"])["status"]
    budget = retention_budget(got)
    assert (budget["status"], budget["reason"]) == (status, reason)
    assert got["kvStore"]["observedAt"] == "2025-01-01T00:00:00Z"
    assert got["kvStore"]["budgetRatio"] == 0.5
    if reading is not None and reading.usage is not None:
        assert got["kvStore"]["pinnedObjects"] == reading.usage.pinned_keys
    # The next reconcile inside the interval reuses the recorded reading: no read, no new write.
    writes = len(fake.writes)
    await c.reconcile(("ns", body["metadata"]["name"]))
    assert len(master.urls) == 1
    assert len(fake.writes) == writes


async def test_reads_are_rate_limited_and_an_unchanged_pool_writes_no_status(
    fake: FakeKube,
) -> None:
    name, now, master, c = clocked_master(
        fake, KvStoreReading("x", usage=KvStoreUsage(100, 80, 8, 1, 3, 30, 1))
    )
    await c.reconcile(("ns", name))
    first = copy.deepcopy(fake.cr(name)["status"]["kvStore"])
    writes = len(fake.writes)
    now[0] = NOW + dt.timedelta(seconds=31)  # due again: read, same numbers -> no write
    await c.reconcile(("ns", name))
    assert len(master.urls) == 2
    assert len(fake.writes) == writes
    assert fake.cr(name)["status"]["kvStore"] == first
    master.reading = KvStoreReading("y", usage=KvStoreUsage(100, 90, 9, 6, 3, 30, 1))
    now[0] = NOW + dt.timedelta(seconds=45)  # not due: the new numbers wait for the next read
    await c.reconcile(("ns", name))
    assert len(master.urls) == 2
    now[0] = NOW + dt.timedelta(seconds=62)
    await c.reconcile(("ns", name))
    assert len(master.urls) == 3
    status = fake.cr(name)["status"]
    assert status["kvStore"]["pinnedObjects"] == 6
    assert status["kvStore"]["observedAt"] == "y"
    budget = retention_budget(status)
    assert (budget["status"], budget["reason"]) == ("False", "OverBudget")
    c.observe(("ns", name), deleted=True)
    assert (
        c.metrics.registry.get_sample_value(
            "kvretention_kvstore_metrics_up", {"fleet_namespace": "ns", "fleet": name}
        )
        is None
    )


async def test_a_master_that_stays_unreadable_is_stale_then_unavailable_once(
    fake: FakeKube,
) -> None:
    name = load_example("disaggregated")["metadata"]["name"]
    url = f"http://{name}-mooncake.ns.svc:9003/metrics"
    _, now, master, c = clocked_master(
        fake, KvStoreReading("t0", error=f"{url}: [Errno -2] Name or service not known")
    )

    def budget() -> dict[str, Any]:
        return retention_budget(fake.cr(name)["status"])

    # Right after Ready the Service name may not resolve yet: a note, not a state.
    await c.reconcile(("ns", name))
    stamp = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (budget()["status"], budget()["reason"]) == ("Unknown", "NotMeasured")
    assert "Name or service not known" in budget()["message"]
    assert fake.cr(name)["status"]["kvStore"]["staleSince"] == stamp
    stale = copy.deepcopy(fake.cr(name)["status"])
    writes = len(fake.writes)
    # Retried every 5 s inside the grace period; a changed error writes nothing.
    for i, error in enumerate(["no answer within 2s", "Connection refused"] * 5):
        master.reading = KvStoreReading(f"t{i + 1}", error=f"{url}: {error}")
        now[0] += dt.timedelta(seconds=5)
        await c.reconcile(("ns", name))
    assert len(master.urls) == 11
    assert len(fake.writes) == writes
    assert fake.cr(name)["status"] == stale
    # Past the grace period: unavailable, naming the first error, dated from the first failure.
    now[0] = NOW + dt.timedelta(seconds=61)
    await c.reconcile(("ns", name))
    assert (budget()["status"], budget()["reason"]) == ("Unknown", "MetricsUnavailable")
    assert budget()["message"] == f"{url}: [Errno -2] Name or service not known"
    assert fake.cr(name)["status"]["kvStore"]["observedAt"] == stamp
    assert "staleSince" not in fake.cr(name)["status"]["kvStore"]
    first = copy.deepcopy(fake.cr(name)["status"])
    writes = len(fake.writes)
    for i, error in enumerate(["no answer within 2s", "Connection refused", "no answer"]):
        master.reading = KvStoreReading(f"u{i}", error=f"{url}: {error}")
        now[0] += dt.timedelta(seconds=31)  # back to the normal interval
        await c.reconcile(("ns", name))
    assert len(fake.writes) == writes
    assert fake.cr(name)["status"] == first
    master.reading = KvStoreReading("t9", usage=KvStoreUsage(100, 80, 8, 1, 3, 30, 1))
    now[0] += dt.timedelta(seconds=31)  # readable again: a new state, written
    await c.reconcile(("ns", name))
    status = fake.cr(name)["status"]
    assert status["kvStore"]["observedAt"] == "t9"
    assert (budget()["status"], budget()["reason"]) == ("True", "WithinBudget")


async def test_a_read_lost_after_numbers_keeps_them_marked_stale(fake: FakeKube) -> None:
    name, now, master, c = clocked_master(
        fake, KvStoreReading("t0", usage=KvStoreUsage(100, 80, 8, 1, 3, 30, 1))
    )
    await c.reconcile(("ns", name))
    master.reading = KvStoreReading("t1", error="dns")
    now[0] += dt.timedelta(seconds=31)
    await c.reconcile(("ns", name))
    status = fake.cr(name)["status"]
    budget = retention_budget(status)
    assert (budget["status"], budget["reason"]) == ("True", "WithinBudget")
    assert "stale: the numbers are from t0" in budget["message"]
    assert status["kvStore"]["pinnedObjects"] == 1
    assert status["kvStore"]["staleReason"] == "dns"
    master.reading = KvStoreReading("t2", usage=KvStoreUsage(100, 80, 8, 1, 3, 30, 1))
    now[0] += dt.timedelta(seconds=5)  # retried at the short interval: recovered
    await c.reconcile(("ns", name))
    status = fake.cr(name)["status"]
    assert len(master.urls) == 3
    assert "staleSince" not in status["kvStore"]
    assert status["kvStore"]["observedAt"] == "t0"


@pytest.mark.parametrize(
    "metadata",
    [
        {},  # made by hand, none of our labels
        {"labels": {"app.kubernetes.io/instance": "qwen"}},  # our labels, but not our owner
        {"ownerReferences": [{"kind": KIND, "name": "qwen", "uid": "old-uid", "controller": True}]},
    ],
    ids=["unlabelled", "labelled", "other-owner"],
)
async def test_a_taken_child_name_is_a_conflict_never_adopted(
    fake: FakeKube, metadata: dict[str, Any]
) -> None:
    fake.put(CR_KIND, load_example("aggregated"))
    theirs = copy.deepcopy(
        fake.put(
            kinds.SERVICE,
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "qwen-frontend", "namespace": "ns", **metadata},
                "spec": {"selector": {"app": "mine"}},
            },
        )
    )
    c = controller(fake)
    await c.reconcile(("ns", "qwen"))
    assert fake.objects[("services", "ns", "qwen-frontend")] == theirs  # untouched
    assert ("Service", "qwen-frontend") not in fake.writes
    assert ("deployments", "qwen-frontend") in fake.children()  # the rest is created
    ready = next(c for c in fake.cr()["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ChildConflict")
    assert "Service ns/qwen-frontend already exists and is not controlled by" in ready["message"]
    assert conditions(fake.cr())["Progressing"] == ("False", "ChildConflict")

    # Once the user's object is gone, the next reconcile creates ours.
    del fake.objects[("services", "ns", "qwen-frontend")]
    await c.reconcile(("ns", "qwen"))
    assert ("Service", "qwen-frontend") in fake.writes
    assert conditions(fake.cr())["Ready"][1] != "ChildConflict"


async def test_a_conflict_holds_what_would_use_the_foreign_object(fake: FakeKube) -> None:
    """A foreign frontend Service and Mooncake ConfigMap: no worker Deployment mounts the
    ConfigMap, status.endpoint does not advertise the Service, and status says which waits."""
    fake.put(CR_KIND, load_example("aggregated"))
    foreign = {"namespace": "ns", "labels": {"app.kubernetes.io/instance": "qwen"}}
    fake.put(
        kinds.SERVICE,
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "qwen-frontend", **foreign}},
    )
    fake.put(
        kinds.CONFIGMAP,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "qwen-mooncake-config", **foreign},
            "data": {"mooncake.json": '{"master_server_address": "elsewhere:50051"}'},
        },
    )
    c = controller(fake)
    await c.reconcile(("ns", "qwen"))
    assert ("deployments", "qwen-worker") not in fake.children()
    assert ("Deployment", "qwen-worker") not in fake.writes
    assert ("deployments", "qwen-frontend") in fake.children()  # it names neither
    status = fake.cr()["status"]
    assert "endpoint" not in status
    held = (
        "Deployment qwen-worker is not created or updated until the conflict is gone: it mounts "
        "ConfigMap qwen-mooncake-config, which is taken"
    )
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ChildConflict")
    assert held in ready["message"]
    workers = next(c for c in status["conditions"] if c["type"] == "WorkersReady")
    assert (workers["status"], workers["reason"], workers["message"]) == (
        "False",
        "ChildConflict",
        held,
    )

    # The ConfigMap gone, the workers are created; the Service gone, the endpoint is ours.
    del fake.objects[("configmaps", "ns", "qwen-mooncake-config")]
    await c.reconcile(("ns", "qwen"))
    assert ("deployments", "qwen-worker") in fake.children()
    assert "endpoint" not in fake.cr()["status"]
    del fake.objects[("services", "ns", "qwen-frontend")]
    await c.reconcile(("ns", "qwen"))
    assert fake.cr()["status"]["endpoint"] == "http://qwen-frontend.ns.svc:8000"
    assert conditions(fake.cr())["Ready"][1] != "ChildConflict"


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ({"type": "WorkersReady", "status": "False", "reason": "PodsNotReady"}, "Normal"),
        ({"type": "WorkersReady", "status": "False", "reason": "PodsStarting"}, "Normal"),
        ({"type": "WorkersReady", "status": "False", "reason": "RollingOut"}, "Normal"),
        ({"type": "WorkersReady", "status": "False", "reason": "Unschedulable"}, "Warning"),
        ({"type": "Ready", "status": "False", "reason": "ImagePullBackOff"}, "Warning"),
        ({"type": "FrontendReady", "status": "False", "reason": "ReplicaFailure"}, "Warning"),
        ({"type": "Ready", "status": "False", "reason": "InvalidSpec"}, "Warning"),
        (
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"},
            "Normal",
        ),
        ({"type": "WorkersReady", "status": "False", "reason": "ScaledToZero"}, "Normal"),
        ({"type": "Ready", "status": "False", "reason": "ScaledToZero"}, "Normal"),
        ({"type": "Ready", "status": "False", "reason": "ChildConflict"}, "Warning"),
        ({"type": "Progressing", "status": "False", "reason": "Converged"}, "Normal"),
        ({"type": "Ready", "status": "True", "reason": "Ready"}, "Normal"),
    ],
)
def test_event_type(condition: dict[str, str], expected: str) -> None:
    assert event_type(condition) == expected


def test_every_watched_kind_fills_an_index_the_reconcile_reads() -> None:
    registry = build_registry()
    ids = sorted(str(h.id) for h in registry._indexing.get_all_handlers())
    assert ids == sorted(INDEX_IDS) == [FLEETS_INDEX]
    c = Controller(FakeKube())
    watches = Watches.build(FakeKube(), c, namespaces=("a", "b"))
    # the index ids IndexedView reads: every child kind and the pods, across both namespaces
    assert c.children is not None and set(c.children) == {*CHILD_INDEXES, PODS_INDEX}
    assert len(watches.informers.members) == 2 * len(WATCHED)
    assert c.synced == watches.informers.wait_synced

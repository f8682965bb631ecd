"""The executor over kopf's indexes: what a reconcile asks the API server, at rest, after a
restart, after a re-list, and right after its own writes; the applied-state cache by owner UID."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
from typing import Any

import pytest
from fake_kube import (
    NOW,
    FakeIndices,
    FakeKube,
    FakeMaster,
    FakeWorkers,
    condition_messages,
    controller,
    fake,
    load_example,
    make_ready,
    master_only_controller,
    reconcile_rolled_out,
    reconciled,
    reconciled_with_frontend,
)

from kvretention.api.names import FIELD_MANAGER
from kvretention.controller import kinds
from kvretention.controller import kube as k
from kvretention.controller.cache import CR_KIND, encode_entry
from kvretention.controller.executor import Controller
from kvretention.controller.kvstore_metrics import READ_INTERVAL_SECONDS
from support.loop_tasks import ended_with_exception, recording_tasks

__all__ = ["fake"]


def _dry_runs(c: Controller) -> float:
    return sum(
        s.value
        for metric in c.metrics.dry_runs.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    )


def _indexed(fake: FakeKube) -> Controller:
    c = master_only_controller(fake)
    c.bind(FakeIndices(fake))
    return c


def _fleet(fake: FakeKube, name: str) -> None:
    body = load_example("aggregated")
    body["metadata"]["name"] = name
    fake.put(CR_KIND, body)


async def _converge(c: Controller, fake: FakeKube, *names: str) -> None:
    for name in names:
        await c.reconcile(("ns", name))
    make_ready(fake)
    for name in names:
        await c.reconcile(("ns", name))


async def test_deleting_a_fleet_keeps_what_is_known_of_a_fleet_its_name_prefixes(
    fake: FakeKube,
) -> None:
    _fleet(fake, "mm")
    _fleet(fake, "mm-b")
    c = master_only_controller(fake)
    await _converge(c, fake, "mm", "mm-b")
    before = _dry_runs(c)
    c.observe(("ns", "mm"), deleted=True)
    fake.writes.clear()
    await c.reconcile(("ns", "mm-b"))
    assert _dry_runs(c) == before  # mm-b's children are still known to match: no dry run
    assert fake.writes == []


async def test_a_resync_at_rest_reads_nothing_from_the_api_server(fake: FakeKube) -> None:
    fake.put(CR_KIND, load_example("aggregated"))
    c = _indexed(fake)
    await _converge(c, fake, "qwen")
    fake.reads.clear()
    fake.writes.clear()
    fake.events.clear()
    for _ in range(3):
        assert await c.reconcile(("ns", "qwen")) == "ok"
    assert fake.reads == []
    assert fake.writes == []
    assert fake.events == []


async def test_a_first_reconcile_reads_each_child_name_once_and_then_trusts_the_indexes(
    fake: FakeKube,
) -> None:
    c = await reconciled(fake, _indexed)
    children = len(fake.children())
    # No LIST at all; one GET per child name, to see that no object of ours has it yet.
    assert sorted({verb for verb, _ in fake.reads}) == ["GET"]
    assert len(fake.reads) == children
    fake.reads.clear()
    await c.reconcile(("ns", "qwen"))
    assert fake.reads == []


async def test_a_restarted_operator_trusts_the_manifest_hash_instead_of_a_dry_run(
    fake: FakeKube,
) -> None:
    fake.put(CR_KIND, load_example("aggregated"))
    await _converge(_indexed(fake), fake, "qwen")
    fake.writes.clear()
    fake.reads.clear()
    restarted = _indexed(fake)  # empty applied-state cache, as after a restart or failover
    assert await restarted.reconcile(("ns", "qwen")) == "ok"
    assert _dry_runs(restarted) == 0
    assert fake.writes == []
    assert fake.reads == []


async def test_a_restarted_operator_checks_a_child_another_manager_wrote(fake: FakeKube) -> None:
    fake.put(CR_KIND, load_example("aggregated"))
    await _converge(_indexed(fake), fake, "qwen")
    edited = fake.objects[("deployments", "ns", "qwen-router")]
    edited["spec"]["replicas"] = 5  # kubectl scale while the operator was down
    edited["metadata"]["generation"] += 1
    edited["metadata"]["managedFields"].append(
        {
            "manager": "kubectl",
            "operation": "Update",
            "subresource": "scale",
            "fieldsV1": {"f:spec": {"f:replicas": {}}},
        }
    )
    fake.writes.clear()
    restarted = _indexed(fake)
    await restarted.reconcile(("ns", "qwen"))
    assert _dry_runs(restarted) == 1  # only the edited child
    assert ("Deployment", "qwen-router") in fake.writes
    assert fake.objects[("deployments", "ns", "qwen-router")]["spec"]["replicas"] == 1


async def test_after_a_relist_each_fleet_reads_the_api_server_once_and_forgets_stale_entries(
    fake: FakeKube,
) -> None:
    fake.put(CR_KIND, load_example("aggregated"))
    c = _indexed(fake)
    await _converge(c, fake, "qwen")
    stale = copy.deepcopy(fake.objects[("deployments", "ns", "qwen-router")])
    indices = FakeIndices(fake)

    class WithStaleEntry(FakeIndices):
        def __getitem__(self, index: str) -> dict[tuple[str, str], list[bytes]]:
            out = indices[index]
            if index == "deployments":  # deleted while the watch was down; kopf kept it
                out.setdefault(("ns", "qwen"), []).append(encode_entry(stale))
            return out

    del fake.objects[("deployments", "ns", "qwen-router")]
    fake.writes.clear()
    c.indices = WithStaleEntry(fake)
    await c.reconcile(("ns", "qwen"))
    assert ("Deployment", "qwen-router") not in fake.writes  # the index still shows it
    # kopf re-lists the kind: a listing event for an object it had already listed.
    uid = fake.objects[("deployments", "ns", "qwen-frontend")]["metadata"]["uid"]
    body = {"metadata": {"uid": uid}}
    c.saw("deployments", body, event_type=None)
    c.saw("deployments", body, event_type=None)
    fake.reads.clear()
    await c.reconcile(("ns", "qwen"))
    assert ("Deployment", "qwen-router") in fake.writes  # re-created
    assert ("LIST", "deployments") in fake.reads
    fake.reads.clear()
    fake.writes.clear()
    c.indices = WithStaleEntry(fake)  # the new router is indexed; the stale copy lingers
    await c.reconcile(("ns", "qwen"))
    assert fake.reads == []  # checked once per re-list; the stale uid is tombstoned
    assert fake.writes == []


async def test_a_reconcile_before_the_watch_delivers_its_own_status_posts_nothing_twice(
    fake: FakeKube,
) -> None:
    c = await reconciled(fake, _indexed)
    make_ready(fake)
    snapshot = FakeIndices(fake)
    frozen = {i: snapshot[i] for i in snapshot}  # the indexes before the status write lands
    await c.reconcile(("ns", "qwen"))
    events = list(fake.events)
    assert events  # components turned ready
    frozen_cr = frozen["fleets"]
    c.indices = {**{i: FakeIndices(fake)[i] for i in snapshot}, "fleets": frozen_cr}
    fake.writes.clear()
    await c.reconcile(("ns", "qwen"))
    assert fake.events == events
    assert [w for w in fake.writes if w[0].endswith("/status")] == []


def test_every_apply_carries_the_manifest_hash(fake: FakeKube) -> None:
    fake.put(CR_KIND, load_example("aggregated"))
    asyncio.run(_indexed(fake).reconcile(("ns", "qwen")))
    for (plural, _, _), obj in fake.objects.items():
        if plural != CR_KIND.plural:
            assert "kvretention.io/manifest-hash" in obj["metadata"]["annotations"]
            assert obj["metadata"]["managedFields"][-1]["manager"] == FIELD_MANAGER


async def test_no_task_of_a_refused_reconcile_ends_with_an_exception(fake: FakeKube) -> None:
    """kopf re-raises, when it stops, the exception of any task in the loop that ended with one."""
    fake.put(CR_KIND, load_example("aggregated"))
    real_apply = fake.apply

    async def refuse(manifest: Any, **kwargs: Any) -> dict[str, Any]:
        if manifest["kind"] == "Deployment":
            raise k.ApiError(403, "namespace is being terminated")
        return await real_apply(manifest, **kwargs)

    async def fail_get(*_: Any) -> Any:
        raise k.ApiError(500, "etcd is sad")

    fake.apply = refuse  # type: ignore[method-assign]
    with recording_tasks() as created:
        c = _indexed(fake)
        with pytest.raises(k.RetryLater, match="terminated"):
            await c.reconcile(("ns", "qwen"))
        fake.get_or_none = fail_get  # type: ignore[method-assign]
        with pytest.raises(k.ApiError, match="sad"):
            await _indexed(fake).reconcile(("ns", "qwen"))
        await asyncio.sleep(0)
    assert created
    assert ended_with_exception(created) == []


async def test_a_failed_reconcile_leaves_no_side_read_running(fake: FakeKube) -> None:
    """The master's metrics read runs alongside the applies; a reconcile that fails stops it, so
    nothing of that reconcile is left for kopf to find (and re-raise) when it stops."""
    fake.put(CR_KIND, load_example("aggregated"))
    started = asyncio.Event()

    async def hang(url: str, *, now: dt.datetime) -> Any:
        started.set()
        await asyncio.Event().wait()

    async def fail_get(*_: Any) -> Any:
        await started.wait()
        raise k.ApiError(500, "etcd is sad")

    fake.get_or_none = fail_get  # type: ignore[method-assign]
    with recording_tasks() as created:
        c = Controller(fake, clock=lambda: NOW, read_kvstore=hang)  # type: ignore[arg-type]
        c.bind(FakeIndices(fake))
        with pytest.raises(k.ApiError, match="sad"):
            await c.reconcile(("ns", "qwen"))
        await asyncio.sleep(0)
    assert started.is_set()
    assert created and [t for t in created if not t.done()] == []


async def test_a_namespace_being_deleted_gets_no_recreate_attempts(fake: FakeKube) -> None:
    """Creates there are refused (403, cause NamespaceTerminating): the reconcile stops without
    a retry, a status write or an Event, and later ones apply nothing until the fleet is gone."""
    fake.put(CR_KIND, load_example("aggregated"))
    c = master_only_controller(fake)
    await _converge(c, fake, "qwen")
    real_apply = fake.apply
    applies: list[str] = []

    async def terminating(manifest: Any, **kwargs: Any) -> dict[str, Any]:
        applies.append(manifest["metadata"]["name"])
        raise k.ApiError(
            403,
            'deployments.apps "qwen-worker" is forbidden: unable to create new content in '
            "namespace ns because it is being terminated",
            reason="Forbidden",
            causes=("NamespaceTerminating",),
        )

    fake.apply = terminating  # type: ignore[method-assign]
    del fake.objects[("deployments", "ns", "qwen-worker")]  # the namespace's deletion began
    writes, events = len(fake.writes), len(fake.events)
    assert await c.reconcile(("ns", "qwen")) == "terminating"
    assert applies == ["qwen-worker"]
    assert await c.reconcile(("ns", "qwen")) == "terminating"  # no second attempt
    assert applies == ["qwen-worker"]
    assert (len(fake.writes), len(fake.events)) == (writes, events)

    # The fleet deleted with its namespace, then one of the same name in a new namespace ns.
    c.observe(("ns", "qwen"), deleted=True, uid=fake.cr()["metadata"]["uid"])
    assert c.terminating == set()
    fake.apply = real_apply  # type: ignore[method-assign]
    c.observe(("ns", "qwen"))
    assert await c.reconcile(("ns", "qwen")) == "ok"
    assert ("deployments", "qwen-worker") in fake.children()


async def test_a_status_write_for_a_fleet_deleted_meanwhile_is_no_failure(fake: FakeKube) -> None:
    fake.put(CR_KIND, load_example("aggregated"))
    real_apply = fake.apply

    async def gone(manifest: Any, **kwargs: Any) -> dict[str, Any]:
        if kwargs.get("subresource") == "status":
            raise k.NotFound("PATCH /apis/kvretention.io/v1alpha1/.../status: HTTP 404 NotFound")
        return await real_apply(manifest, **kwargs)

    fake.apply = gone  # type: ignore[method-assign]
    assert await _indexed(fake).reconcile(("ns", "qwen")) == "ok"


def _worker_pod(name: str, *, ip: str) -> dict[str, Any]:
    report = {
        "schema": 1,
        "sglang_version": "0.5.23",
        "kv_hints_parameter": True,
        "dialect": "versioned",
        "usable_for_hints": True,
        "retention_plugin": "loaded",
        "retention_target_problems": [],
    }
    probe = {
        "name": "probe",
        "state": {"terminated": {"exitCode": 0, "message": json.dumps(report)}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {
                "app.kubernetes.io/name": "kvretention",
                "app.kubernetes.io/instance": "qwen",
                "app.kubernetes.io/component": "worker",
            },
        },
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
            "initContainerStatuses": [probe],
        },
    }


def _condition(fake: FakeKube, type_: str) -> tuple[str, str, str]:
    return condition_messages(fake.cr())[type_]


async def test_hook_failures_read_from_the_workers_turn_into_a_condition_and_an_event(
    fake: FakeKube,
) -> None:
    """The workers' counters are read at most every READ_INTERVAL; an increase since the last
    read is HookFailures (a Warning Event), the counter staying flat is Applied again."""
    fake.put(CR_KIND, load_example("aggregated"))  # hints.policy Optional
    fake.put(kinds.POD, _worker_pod("qwen-worker-a", ip="10.0.0.7"))
    workers = FakeWorkers({"qwen-worker-a": {"checkpoint": 4}})
    now = [NOW]
    c = Controller(fake, clock=lambda: now[0], read_kvstore=FakeMaster(), read_worker=workers)  # type: ignore[arg-type]
    await _converge(c, fake, "qwen")
    assert workers.urls == ["http://10.0.0.7:9100/metrics"]  # one read in the interval
    assert _condition(fake, "RetentionApplied")[:2] == ("True", "Applied")  # a baseline
    fake.events.clear()

    workers.counts["qwen-worker-a"] = {"checkpoint": 6, "l3_put": 1}
    await c.reconcile(("ns", "qwen"))
    assert len(workers.urls) == 1  # not yet: the same reading
    now[0] += dt.timedelta(seconds=READ_INTERVAL_SECONDS)
    await c.reconcile(("ns", "qwen"))
    assert len(workers.urls) == 2
    status, reason, message = _condition(fake, "RetentionApplied")
    assert (status, reason) == ("False", "HookFailures")
    assert "pod qwen-worker-a: checkpoint 2 (KV left unretained), l3_put 1" in message
    assert _condition(fake, "Ready")[:2] == ("True", "Ready")  # Optional: still serving
    assert ("Warning", "HookFailures") in fake.events

    now[0] += dt.timedelta(seconds=READ_INTERVAL_SECONDS)
    await c.reconcile(("ns", "qwen"))
    assert _condition(fake, "RetentionApplied")[:2] == ("True", "Applied")  # flat: healthy


async def test_a_missing_auth_secret_is_named_until_the_frontend_is_ready(fake: FakeKube) -> None:
    c = await reconciled_with_frontend(fake, {"auth": {"secretRefs": [{"name": "fleet-keys"}]}})
    status, reason, message = _condition(fake, "FrontendReady")
    assert (status, reason) == ("False", "AuthSecretMissing")
    assert "Secret fleet-keys not found in namespace ns" in message
    assert ("GET", "secrets") in fake.reads

    fake.put(kinds.SECRET, {"metadata": {"name": "fleet-keys", "namespace": "ns"}})
    await c.reconcile(("ns", "qwen"))
    assert _condition(fake, "FrontendReady")[1] != "AuthSecretMissing"
    await reconcile_rolled_out(fake, c)
    fake.reads.clear()
    del fake.objects[("secrets", "ns", "fleet-keys")]
    await c.reconcile(("ns", "qwen"))
    assert ("GET", "secrets") not in fake.reads  # a ready frontend: no Secret is read


async def test_an_unreadable_secret_leaves_the_frontend_reason_alone(fake: FakeKube) -> None:
    """Without get on Secrets (an older chart's RBAC) the check says nothing."""
    body = load_example("aggregated")
    body["spec"].setdefault("frontend", {})["auth"] = {"secretRefs": [{"name": "fleet-keys"}]}
    fake.put(CR_KIND, body)

    readable = fake.exists

    async def forbidden(kind: kinds.ResourceKind, ns: str, name: str) -> bool:
        if name != "fleet-keys":  # the fleet's hop key (test_executor_hop_key.py)
            return await readable(kind, ns, name)
        raise k.ApiError(403, "secrets is forbidden", what="GET secrets")

    fake.exists = forbidden  # type: ignore[method-assign]
    c = controller(fake)
    assert await c.reconcile(("ns", "qwen")) == "ok"
    assert _condition(fake, "FrontendReady")[1] != "AuthSecretMissing"

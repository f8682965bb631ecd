"""An in-memory API for the controller's unit tests, and kopf's indexes over it.

The fake keeps the properties of the API server the reconcile relies on: applying what is already
there changes nothing (no new resourceVersion), a spec change bumps the generation, and every
server-side apply leaves a managedFields entry of its field manager. It counts reads, so tests can
pin what a reconcile asks the API server.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvretention.api.names import FIELD_MANAGER, LABEL_COMPONENT, LABEL_INSTANCE
from kvretention.controller import kinds
from kvretention.controller import kube as k
from kvretention.controller.cache import (
    CHILD_INDEXES,
    CR_KIND,
    FLEETS_INDEX,
    PODS_INDEX,
    encode_entry,
)
from kvretention.controller.executor import Controller
from kvretention.controller.kvstore_metrics import KvStoreReading, format_time
from kvretention.controller.planner import comparable
from kvretention.controller.worker_metrics import PodFailures

EXAMPLES = Path(__file__).parents[3] / "examples"
NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
Key = tuple[str, str, str]


def _matches(labels: Mapping[str, str], selector: str) -> bool:
    for term in re.split(r",(?![^()]*\))", selector) if selector else []:
        if " in " in term:
            name, values = term.split(" in ")
            if labels.get(name.strip()) not in values.strip("() ").split(","):
                return False
        else:
            name, value = term.split("=")
            if labels.get(name) != value:
                return False
    return True


class FakeKube:
    """Objects by (plural, namespace, name); counts every write that changed something."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.events: list[tuple[str, str]] = []
        self.reads: list[tuple[str, str]] = []
        """Every GET and LIST: (verb, plural)."""
        self._rv = itertools.count(1)
        self._uid = itertools.count(1)

    def unserve(self, kind: kinds.ResourceKind) -> None:
        """The API server does not serve ``kind`` (its CRD is not installed): applies and lists of
        it are 404s, as the real server answers them."""
        real_apply, real_list = self.apply, self.list

        async def apply(manifest: Any, **kwargs: Any) -> dict[str, Any]:
            if manifest.get("kind") == kind.kind:
                raise k.NotFound(kind.collection_path(manifest["metadata"].get("namespace")))
            return await real_apply(manifest, **kwargs)

        async def list_(of: kinds.ResourceKind, ns: str, **kwargs: Any) -> Any:
            if of is kind:
                raise k.NotFound(of.collection_path(ns))
            return await real_list(of, ns, **kwargs)

        self.apply = apply  # type: ignore[method-assign]
        self.list = list_  # type: ignore[method-assign]

    def put(self, kind: kinds.ResourceKind, body: dict[str, Any]) -> dict[str, Any]:
        body = copy.deepcopy(body)
        meta = body.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self._uid)}")
        meta["resourceVersion"] = str(next(self._rv))
        meta.setdefault("generation", 1)
        self.objects[(kind.plural, meta["namespace"], meta["name"])] = body
        return body

    async def get_or_none(self, kind: kinds.ResourceKind, ns: str, name: str) -> Any:
        self.reads.append(("GET", kind.plural))
        obj = self.objects.get((kind.plural, ns, name))
        return copy.deepcopy(obj) if obj else None

    async def exists(self, kind: kinds.ResourceKind, ns: str, name: str) -> bool:
        self.reads.append(("GET", kind.plural))
        return (kind.plural, ns, name) in self.objects

    async def create_if_absent(self, kind: kinds.ResourceKind, ns: str, body: Any) -> bool:
        name = body["metadata"]["name"]
        if await self.exists(kind, ns, name):
            return False
        self.writes.append(("create " + kind.kind, name))
        self.put(kind, body)
        return True

    async def list(self, kind: kinds.ResourceKind, ns: str, *, selector: str = "") -> Any:
        self.reads.append(("LIST", kind.plural))
        return [
            copy.deepcopy(o)
            for (plural, o_ns, _), o in sorted(self.objects.items())
            if plural == kind.plural
            and o_ns == ns
            and _matches(o["metadata"].get("labels") or {}, selector)
        ]

    async def apply(
        self,
        manifest: Mapping[str, Any],
        *,
        kind: kinds.ResourceKind | None = None,
        dry_run: bool = False,
        subresource: str = "",
    ) -> dict[str, Any]:
        kind = kind or kinds.kind_of(manifest)
        meta = manifest["metadata"]
        key = (kind.plural, meta["namespace"], meta["name"])
        old = self.objects.get(key)
        if subresource == "status":
            assert old is not None
            new = {**copy.deepcopy(old), "status": copy.deepcopy(manifest["status"])}
        else:
            new = copy.deepcopy(dict(manifest))
            if old is not None:
                for field in ("uid", "resourceVersion", "generation"):
                    new["metadata"][field] = old["metadata"][field]
                if "status" in old:
                    new["status"] = old["status"]
                if old.get("spec") != new.get("spec"):
                    new["metadata"]["generation"] += 1
        unchanged = (
            old is not None
            and comparable(old) == comparable(new)
            and old.get("status") == new.get("status")
        )
        if unchanged:
            return copy.deepcopy(old)
        if not subresource:
            new["metadata"]["managedFields"] = [
                *[
                    e
                    for e in (old or {}).get("metadata", {}).get("managedFields", [])
                    if e.get("manager") != FIELD_MANAGER
                ],
                {"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": {"f:spec": {}}},
            ]
        if dry_run:
            return new
        self.writes.append((kind.kind + ("/status" if subresource else ""), meta["name"]))
        if old is None:
            return self.put(kind, new)
        new["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[key] = new
        return copy.deepcopy(new)

    async def delete(self, kind: kinds.ResourceKind, ns: str, name: str, *, uid: str) -> None:
        obj = self.objects.get((kind.plural, ns, name))
        if obj is not None and obj["metadata"]["uid"] == uid:
            del self.objects[(kind.plural, ns, name)]
            self.writes.append(("delete " + kind.kind, name))

    async def post_event(self, involved: Any, *, type_: str, reason: str, **_: Any) -> None:
        self.events.append((type_, reason))

    # helpers for tests

    def children(self) -> set[tuple[str, str]]:
        return {(p, n) for (p, _, n) in self.objects if p != CR_KIND.plural}

    def cr(self, name: str = "qwen") -> dict[str, Any]:
        return self.objects[(CR_KIND.plural, "ns", name)]


def load_example(name: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    body["metadata"]["namespace"] = "ns"
    return body


@pytest.fixture
def fake() -> FakeKube:
    return FakeKube()


class FakeMaster:
    """Stands in for the managed master's /metrics (the real one is read in the L3 tier)."""

    def __init__(self, reading: KvStoreReading | None = None) -> None:
        self.urls: list[str] = []
        self.reading = reading

    async def __call__(self, url: str, *, now: dt.datetime) -> KvStoreReading:
        self.urls.append(url)
        return self.reading or KvStoreReading(format_time(now), error=f"{url}: unreachable")


class FakeWorkers:
    """Stands in for the worker pods' /metrics: each pod's hook failure counts (unset: unread)."""

    def __init__(self, counts: dict[str, dict[str, int]] | None = None) -> None:
        self.counts = counts or {}
        self.urls: list[str] = []

    async def __call__(self, pod: str, url: str) -> PodFailures:
        self.urls.append(url)
        if pod not in self.counts:
            return PodFailures(pod, error=f"{url}: unreachable")
        return PodFailures(pod, counts=dict(self.counts[pod]))


def controller(
    fake: FakeKube, master: FakeMaster | None = None, workers: FakeWorkers | None = None
) -> Controller:
    return Controller(
        fake,  # type: ignore[arg-type]
        clock=lambda: NOW,
        read_kvstore=master or FakeMaster(),
        read_worker=workers or FakeWorkers(),
    )


def master_only_controller(fake: FakeKube) -> Controller:
    """A controller on the fixed clock with a fake master and its default worker reads."""
    return Controller(fake, clock=lambda: NOW, read_kvstore=FakeMaster())  # type: ignore[arg-type]


def make_ready(fake: FakeKube) -> None:
    """What kube-controller-manager and kwok would do: every Deployment fully rolled out."""
    for (plural, _, _), obj in fake.objects.items():
        if plural == "deployments":
            n = obj["spec"].get("replicas", 1)
            obj["status"] = {
                "replicas": n,
                "readyReplicas": n,
                "updatedReplicas": n,
                "availableReplicas": n,
                "observedGeneration": obj["metadata"]["generation"],
            }
            obj["metadata"]["resourceVersion"] = str(next(fake._rv))


def conditions(body: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in body["status"]["conditions"]}


async def reconcile_unserved(fake: FakeKube, c: Controller, kind: str) -> None:
    """Reconcile fleet ``ns/qwen`` twice (the second time with the other children ready) while the
    API server does not serve ``kind``: each reconcile must end waiting for it."""
    for _ in range(2):
        with pytest.raises(k.RetryLater, match=f"does not serve {kind}"):
            await c.reconcile(("ns", "qwen"))
        make_ready(fake)


async def reconciled(
    fake: FakeKube, make: Callable[[FakeKube], Controller] = controller
) -> Controller:
    """The aggregated example put as fleet ``ns/qwen`` and reconciled once by the controller
    ``make`` builds (after the put)."""
    fake.put(CR_KIND, load_example("aggregated"))
    c = make(fake)
    await c.reconcile(("ns", "qwen"))
    return c


async def reconciled_with_frontend(fake: FakeKube, frontend: Mapping[str, Any]) -> Controller:
    """The aggregated example with ``frontend`` fields added to its spec, reconciled once."""
    body = load_example("aggregated")
    body["spec"].setdefault("frontend", {}).update(frontend)
    fake.put(CR_KIND, body)
    c = controller(fake)
    await c.reconcile(("ns", "qwen"))
    return c


def condition_messages(body: Mapping[str, Any]) -> dict[str, tuple[str, str, str]]:
    """Each condition's (status, reason, message), by type."""
    return {
        c["type"]: (c["status"], c["reason"], c["message"]) for c in body["status"]["conditions"]
    }


async def reconcile_rolled_out(fake: FakeKube, c: Controller) -> None:
    """Roll every Deployment out and reconcile fleet ``ns/qwen`` again: its frontend is then
    Ready (``PodsReady``), whatever kept it from being so before."""
    make_ready(fake)
    await c.reconcile(("ns", "qwen"))
    assert condition_messages(fake.cr())["FrontendReady"][:2] == ("True", "PodsReady")


def fleet_deployment(name: str, component: str, replicas: int = 1) -> dict[str, Any]:
    """A Deployment of fleet ``f`` as a builder renders it, reduced to its labels and replicas."""
    labels = {LABEL_COMPONENT: component}
    selector = {"matchLabels": {LABEL_INSTANCE: "f", **labels}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": replicas, "selector": selector},
    }


def live(
    name: str,
    *,
    replicas: int = 1,
    ready: int = 1,
    updated: int | None = None,
    available: int | None = None,
    generation: int = 1,
    observed: int = 1,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Deployment as the API server shows it: ``ready`` of ``replicas`` ready (and, unless
    given, as many available and all updated) at ``observed`` of ``generation``."""
    return {
        "metadata": {"name": name, "generation": generation},
        "status": {
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": replicas if updated is None else updated,
            "availableReplicas": ready if available is None else available,
            "observedGeneration": observed,
            "conditions": conditions or [],
        },
    }


def rolled_out(name: str) -> dict[str, Any]:
    """A one-replica Deployment named ``name`` that its controller has fully rolled out."""
    return {
        "metadata": {"name": name, "generation": 1},
        "status": {
            "observedGeneration": 1,
            "replicas": 1,
            "updatedReplicas": 1,
            "readyReplicas": 1,
            "availableReplicas": 1,
        },
    }


class FakeIndices(Mapping[str, Any]):
    """kopf's indexes as the reconcile reads them, computed from the fake's objects."""

    def __init__(self, fake: FakeKube) -> None:
        self.fake = fake
        self.ids = [FLEETS_INDEX, *CHILD_INDEXES, PODS_INDEX]

    def __getitem__(self, index: str) -> dict[tuple[str, str], list[bytes]]:
        plural = CR_KIND.plural if index == FLEETS_INDEX else index
        out: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for (p, ns, name), obj in sorted(self.fake.objects.items()):
            if p != plural:
                continue
            labels = obj["metadata"].get("labels") or {}
            owner = name if index == FLEETS_INDEX else labels.get(LABEL_INSTANCE)
            if owner:
                out.setdefault((ns, owner), []).append(encode_entry(obj))
        return out

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

"""The children/pods informers: pages listed, objects slimmed on arrival, watch events applied,
an expired watch re-listed with the store replaced (no entry of a deleted object survives)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvretention.controller import kinds
from kvretention.controller import kube as k
from kvretention.controller.cache import PODS_INDEX, decode_entry
from kvretention.controller.informer import POD_SELECTOR, Informer, Informers
from kvretention.controller.objects import Key

NS = "ns"


def pod(name: str, *, fleet: str = "qwen", uid: str | None = None, rv: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid or f"uid-{name}",
            "resourceVersion": rv,
            "labels": {"app.kubernetes.io/instance": fleet},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        },
        "status": {"phase": "Running"},
    }


def line(event_type: str, obj: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": event_type, "object": obj}).encode() + b"\n"


@dataclass
class ScriptedKube:
    """``list_page`` from a list of pages per listing; ``watch_lines`` from scripted watches.
    A watch with nothing scripted blocks until the test ends it (like a quiet real watch)."""

    listings: list[list[dict[str, Any]]]
    watches: list[list[bytes]] = field(default_factory=list)
    list_calls: list[tuple[str, str]] = field(default_factory=list)
    watch_versions: list[str] = field(default_factory=list)
    quiet: threading.Event = field(default_factory=threading.Event)

    async def list_page(
        self,
        kind: kinds.ResourceKind,
        namespace: str | None,
        *,
        selector: str,
        limit: int,
        token: str,
    ) -> dict[str, Any]:
        self.list_calls.append((selector, token))
        pages = self.listings[0]
        index = int(token or 0)
        last = index == len(pages) - 1
        if last:
            self.listings.pop(0)
        return {
            "items": pages[index]["items"],
            "metadata": {
                "resourceVersion": pages[index]["rv"],
                "continue": "" if last else str(index + 1),
            },
        }

    def watch_lines(
        self,
        kind: kinds.ResourceKind,
        namespace: str | None,
        *,
        selector: str,
        version: str,
        timeout_s: int,
    ) -> Iterator[bytes]:
        self.watch_versions.append(version)
        if not self.watches:
            self.quiet.wait(10)
            return
        yield from self.watches.pop(0)


@dataclass
class Recorder:
    calls: list[tuple[Key | None, str, str | None]] = field(default_factory=list)

    def __call__(self, owner: Key | None, uid: str, event_type: str | None) -> None:
        self.calls.append((owner, uid, event_type))


def informer_for(kube: ScriptedKube, notify: Recorder) -> Informer:
    return Informer(kube, PODS_INDEX, kinds.POD, POD_SELECTOR, NS, notify)  # type: ignore[arg-type]


async def until(check: Any, *, timeout_s: float = 10.0) -> None:
    """Until ``check()`` holds (the watch threads hand events to the loop as they go)."""
    for _ in range(int(timeout_s / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not reached in {timeout_s}s")


def names(informer: Informer, fleet: str = "qwen") -> list[str]:
    return sorted(
        decode_entry(e)["metadata"]["name"] for e in informer.store.get((NS, fleet)) or []
    )


@pytest.fixture
def quiet_kube() -> Iterator[list[ScriptedKube]]:
    made: list[ScriptedKube] = []
    yield made
    for kube in made:
        kube.quiet.set()


async def test_lists_every_page_slimmed_then_resumes_the_watch_from_the_list_version(
    quiet_kube: list[ScriptedKube],
) -> None:
    kube = ScriptedKube(
        listings=[[{"items": [pod("a"), pod("b")], "rv": "10"}, {"items": [pod("c")], "rv": "10"}]]
    )
    quiet_kube.append(kube)
    notify = Recorder()
    informer = informer_for(kube, notify)
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(informer.synced.wait(), 10)
    await until(lambda: kube.watch_versions)
    assert names(informer) == ["a", "b", "c"]
    assert [token for _, token in kube.list_calls] == ["", "1"]
    assert all(selector == POD_SELECTOR for selector, _ in kube.list_calls)
    assert kube.watch_versions == ["10"]
    # pods are kept without managedFields (the transform), and the listing told the fleet once
    assert "managedFields" not in decode_entry(informer.store.get((NS, "qwen"))[0])["metadata"]  # type: ignore[index]
    assert notify.calls == [((NS, "qwen"), "", None)]
    task.cancel()


async def test_watch_events_update_the_store_and_notify_the_owner(
    quiet_kube: list[ScriptedKube],
) -> None:
    moved = pod("b", fleet="other", rv="13")
    kube = ScriptedKube(
        listings=[[{"items": [pod("a"), pod("b")], "rv": "10"}]],
        watches=[
            [
                line("ADDED", pod("c", rv="11")),
                line("MODIFIED", {**pod("a", rv="12"), "status": {"phase": "Failed"}}),
                line("MODIFIED", moved),  # relabelled: indexed under the other fleet now
                line("DELETED", pod("c", rv="14")),
                line("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "20"}}),
            ]
        ],
    )
    quiet_kube.append(kube)
    notify = Recorder()
    informer = informer_for(kube, notify)
    task = asyncio.create_task(informer.run())
    await until(lambda: len(kube.watch_versions) == 2)
    assert names(informer) == ["a"]
    assert names(informer, "other") == ["b"]
    (a,) = informer.store.get((NS, "qwen")) or []
    assert decode_entry(a)["status"] == {"phase": "Failed"}
    assert notify.calls[1:] == [
        ((NS, "qwen"), "uid-c", "ADDED"),
        ((NS, "qwen"), "uid-a", "MODIFIED"),
        ((NS, "other"), "uid-b", "MODIFIED"),
        ((NS, "qwen"), "uid-c", "DELETED"),
    ]
    assert kube.watch_versions == ["10", "20"]  # resumed from the bookmark's version
    task.cancel()


async def test_an_expired_watch_relists_and_forgets_what_was_deleted_meanwhile(
    quiet_kube: list[ScriptedKube],
) -> None:
    gone = {"kind": "Status", "code": 410, "message": "too old resource version"}
    kube = ScriptedKube(
        listings=[
            [{"items": [pod("a"), pod("b", fleet="other")], "rv": "10"}],
            [{"items": [pod("a", rv="30")], "rv": "30"}],  # b was deleted while away
        ],
        watches=[[line("ERROR", gone)]],
    )
    quiet_kube.append(kube)
    notify = Recorder()
    informer = informer_for(kube, notify)
    task = asyncio.create_task(informer.run())
    await until(lambda: kube.watch_versions == ["10", "30"])
    assert names(informer) == ["a"]
    assert informer.store.get((NS, "other")) is None
    # both fleets are checked after the re-list: one lost a pod the watch never reported
    assert sorted(c for c in notify.calls[2:] if c[2] is None) == [
        ((NS, "other"), "", None),
        ((NS, "qwen"), "", None),
    ]
    task.cancel()


async def test_a_failed_watch_is_retried_not_fatal(
    quiet_kube: list[ScriptedKube], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kvretention.controller.informer.RETRY_S", 0.01)
    kube = ScriptedKube(
        listings=[[{"items": [pod("a")], "rv": "10"}], [{"items": [], "rv": "40"}]],
        watches=[[b"{not json\n"]],
    )
    quiet_kube.append(kube)
    informer = informer_for(kube, Recorder())
    task = asyncio.create_task(informer.run())
    await until(lambda: kube.watch_versions == ["10", "40"])
    assert informer.store.get((NS, "qwen")) is None
    assert not task.done()
    task.cancel()


async def test_informers_merge_namespaces_into_one_index_and_sync_together(
    quiet_kube: list[ScriptedKube],
) -> None:
    kube = ScriptedKube(listings=[])

    async def list_page(
        kind: kinds.ResourceKind, namespace: str | None, **_: Any
    ) -> dict[str, Any]:
        items = (
            [
                {
                    **pod("p", fleet="f"),
                    "metadata": {
                        **pod("p")["metadata"],
                        "namespace": namespace,
                        "labels": {"app.kubernetes.io/instance": "f"},
                        "uid": f"u-{namespace}",
                    },
                }
            ]
            if kind is kinds.POD
            else []
        )
        return {"items": items, "metadata": {"resourceVersion": "1", "continue": ""}}

    kube.list_page = list_page  # type: ignore[method-assign]
    quiet_kube.append(kube)
    informers = Informers.build(kube, namespaces=("a", "b"), notify=Recorder())  # type: ignore[arg-type]
    tasks = list(informers.run())
    await asyncio.wait_for(informers.wait_synced(), 10)
    pods = informers.indices()[PODS_INDEX]
    assert len(pods.get(("a", "f")) or []) == 1
    assert len(pods.get(("b", "f")) or []) == 1
    assert pods.get(("c", "f")) is None
    for task in tasks:
        task.cancel()


def test_a_watch_error_names_the_watch_and_the_servers_reason() -> None:
    informer = informer_for(ScriptedKube(listings=[], watches=[]), Recorder())
    error = {"kind": "Status", "code": 500, "reason": "InternalError", "message": "etcd is away"}
    with pytest.raises(k.ApiError) as raised:
        informer._parse(line("ERROR", error), "1")
    assert (
        str(raised.value)
        == f"watch /api/v1/namespaces/{NS}/pods: HTTP 500 InternalError: etcd is away"
    )

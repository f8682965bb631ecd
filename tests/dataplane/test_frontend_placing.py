"""A frontend that places requests itself (``--worker``): one HTTP hop to the worker, as processes.

Two stand-in workers (each its own engine record) behind a frontend started with ``--worker``
twice, auth on with two tenants and the hop key on every process: each request reaches a worker
with its tenant's ``cache_salt`` and the frontend's signature, a session's turns stay on one
worker, sessions without a pin spread, a worker that stops is skipped without a failed request,
and the router's placement metrics come from the frontend's ``/metrics``. The same request
through the router reaches the engine with the same arguments (the hop adds nothing).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvretention.common.tenancy import cache_salt_for
from kvretention.ports import free_port
from support.chat_tokenizer import build_tokenizer, save
from support.processes import KvrProcess, StartKvretention
from support.standin_chain import write_key_files

KEYS = {"team-a": "sk-team-a-0123456789abcdef", "team-b": "sk-team-b-0123456789abcdef"}
HOP_KEY = "0123456789abcdef" * 4


@dataclass(frozen=True)
class Plane:
    frontend: KvrProcess
    workers: list[KvrProcess]
    records: list[Path]
    via_router: KvrProcess
    """A frontend in front of a router in front of the first worker: the two-hop path."""
    metrics: str
    """The placing frontend's ``--metrics-port`` (``/metrics`` on the client port needs a key)."""


@pytest.fixture(scope="module")
def plane(kvretention_process: StartKvretention, tmp_path_factory: pytest.TempPathFactory) -> Plane:
    d = tmp_path_factory.mktemp("placing")
    keys = write_key_files(d / "keys", KEYS)
    hop_key = d / "hop-key"
    hop_key.write_text(HOP_KEY + "\n")
    hop = ["--hop-key-file", str(hop_key)]
    tokenizer = save(d / "tokenizer")
    records = [d / f"engine-{i}.jsonl" for i in range(2)]
    workers = [
        kvretention_process(
            ["worker", "--engine", "standin:versioned", "--model-path", str(tokenizer), *hop],
            env={"KVR_STANDIN_RECORD": str(record)},
            timeout=90.0,
        )
        for record in records
    ]
    auth = ["--auth-keys-dir", str(keys)]
    placed = [arg for w in workers for arg in ("--worker", w.base_url)]
    metrics_port = free_port()
    frontend = kvretention_process(
        ["frontend", *placed, *auth, *hop, "--metrics-port", str(metrics_port)],
        ready_path="/readyz",
    )
    router = kvretention_process(["router", "--worker", workers[0].base_url, *hop])
    via_router = kvretention_process(["frontend", "--router-url", router.base_url, *auth, *hop])
    return Plane(frontend, workers, records, via_router, f"http://127.0.0.1:{metrics_port}")


def chat(
    base_url: str, *, tenant: str = "team-a", text: str = "Hello.", session: str | None = None
) -> dict[str, Any]:
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEYS[tenant]}"}
    if session is not None:
        headers["x-session-id"] = session
    request = urllib.request.Request(
        base_url + "/v1/chat/completions", data=json.dumps(body).encode(), headers=headers
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        answer: dict[str, Any] = json.load(resp)
    return answer


def engine_calls(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [c for c in map(json.loads, record.read_text().splitlines()) if c["event"] == "generate"]


TOKENIZER = build_tokenizer()


def prompt(call: Mapping[str, Any]) -> str:
    return str(TOKENIZER.decode(call["kwargs"]["input_ids"]))


def where(plane: Plane, text: str) -> list[int]:
    """Which workers' engines were called with a prompt containing ``text`` (once per call)."""
    return [
        i
        for i, record in enumerate(plane.records)
        for call in engine_calls(record)
        if text in prompt(call)
    ]


def metric(base_url: str, name: str, labels: Mapping[str, str]) -> float:
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    want = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
    for line in text.splitlines():
        if line.startswith(name + want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_each_tenants_request_reaches_a_worker_with_its_salt(plane: Plane) -> None:
    for tenant in KEYS:
        text = f"salt check {tenant}"
        assert chat(plane.frontend.base_url, tenant=tenant, text=text)["choices"][0]["message"]
        [i] = where(plane, text)
        [call] = [c for c in engine_calls(plane.records[i]) if text in prompt(c)]
        assert call["kwargs"]["cache_salt"] == cache_salt_for(tenant)


def test_a_sessions_turns_stay_on_one_worker_and_sessions_spread(plane: Plane) -> None:
    chosen = set()
    for s in range(4):
        turns = [f"session {s} turn {t}" for t in range(3)]
        placed = []
        for text in turns:
            chat(plane.frontend.base_url, text=text, session=f"s-{s}")
            placed += where(plane, text)
        assert len(placed) == 3 and len(set(placed)) == 1, placed
        chosen |= set(placed)
    assert chosen == {0, 1}


def test_the_same_request_reaches_the_engine_as_through_the_router(plane: Plane) -> None:
    direct = chat(plane.frontend.base_url, text="same bytes", session="same-1")
    relayed = chat(plane.via_router.base_url, text="same bytes", session="same-2")
    assert direct["choices"][0]["message"] == relayed["choices"][0]["message"]
    calls = [
        c for record in plane.records for c in engine_calls(record) if "same bytes" in prompt(c)
    ]
    assert len(calls) == 2
    kwargs = [{k: v for k, v in c["kwargs"].items() if k != "rid"} for c in calls]
    assert kwargs[0] == kwargs[1]


def test_the_placement_metrics_come_from_the_frontend(plane: Plane) -> None:
    before = metric(
        plane.metrics,
        "kvretention_router_requests_total",
        {"mode": "aggregated", "outcome": "ok"},
    )
    chat(plane.frontend.base_url, text="counted", session="counted")
    chat(plane.frontend.base_url, text="counted again", session="counted")
    labels = {"mode": "aggregated", "outcome": "ok"}
    assert metric(plane.metrics, "kvretention_router_requests_total", labels) == before + 2
    assert metric(plane.metrics, "kvretention_router_sticky_placements_total", {}) >= 1


def test_a_stopped_worker_is_skipped_without_a_failed_request(plane: Plane) -> None:
    """Last: it stops a worker. The sessions pinned to it move to the other one."""
    pinned = {}
    for s in range(4):
        text = f"before stop {s}"
        chat(plane.frontend.base_url, text=text, session=f"stop-{s}")
        [pinned[s]] = where(plane, text)
    plane.workers[0].stop()
    for s in range(4):
        text = f"after stop {s}"
        assert chat(plane.frontend.base_url, text=text, session=f"stop-{s}")["choices"]
        assert where(plane, text) == [1]
    assert 0 in pinned.values()


def test_without_a_worker_the_frontend_says_not_ready(
    kvretention_process: StartKvretention,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    frontend = kvretention_process(["frontend", "--worker", dead])
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(frontend.base_url + "/readyz", timeout=5)
    assert refused.value.code == 503
    assert b"no worker is ready" in refused.value.read()

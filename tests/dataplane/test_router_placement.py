"""Router and stand-in workers as real processes: sticky sessions, spreading, PD pairs, the hint.

Each worker records its engine calls (``KVR_STANDIN_RECORD``), so placement is read off what each
engine actually received.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from support.kv_retain_rules import retain_envelope
from support.processes import StartKvretention
from support.standin_chain import start_recorded_workers, worker_flags
from support.worker_client import HINT, calls, post, request_body, wait_for

PD_BOOTSTRAP_PORT = 8998


def short(rid: str, **fields: Any) -> bytes:
    """A one-token request: quick even on a worker that sleeps before every chunk."""
    return request_body(rid, sampling={"max_new_tokens": 1}, **fields)


def served(pool: Pool) -> list[int]:
    """Requests each worker has been given so far, in ``pool.records`` order (router's view)."""
    with urllib.request.urlopen(pool.router + "/v1/workers", timeout=5) as resp:
        workers = {w["url"]: w["served"] for w in json.load(resp)}
    return [workers[url] for url in pool.urls]


class Pool:
    def __init__(self, records: list[Path], urls: list[str], router: str) -> None:
        self.records, self.urls, self.router = records, urls, router

    def owner(self, rid: str) -> int:
        """Index of the worker whose engine got this request."""
        (index,) = [i for i, r in enumerate(self.records) if calls(r, rid)]
        return index


@pytest.fixture(scope="module")
def pool(kvretention_process: StartKvretention, tmp_path_factory: pytest.TempPathFactory) -> Pool:
    d = tmp_path_factory.mktemp("placement")
    records = [d / f"w{i}.jsonl" for i in range(2)]
    urls = start_recorded_workers(kvretention_process, records, env={"KVR_STANDIN_DELAY_S": "0.1"})
    router = kvretention_process(["router", *worker_flags(urls)])
    return Pool(records, urls, router.base_url)


def test_sticky_session_by_header_and_by_field_holds(pool: Pool) -> None:
    for i in range(4):
        assert post(pool.router, short(f"hdr-{i}"), {"x-session-id": "alpha"})[0] == 200
        assert post(pool.router, short(f"fld-{i}", session_id="beta"))[0] == 200
    assert len({pool.owner(f"hdr-{i}") for i in range(4)}) == 1
    assert len({pool.owner(f"fld-{i}") for i in range(4)}) == 1


def test_requests_without_session_spread(pool: Pool) -> None:
    for i in range(6):
        assert post(pool.router, short(f"seq-{i}"))[0] == 200
    owners = [pool.owner(f"seq-{i}") for i in range(6)]
    assert sorted(owners) == [0, 0, 0, 1, 1, 1]


def test_concurrent_requests_go_to_the_least_loaded_worker(pool: Pool) -> None:
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(post(pool.router, short(f"par-{i}"))[0]))
        for i in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert results == [200] * 6
    owners = [pool.owner(f"par-{i}") for i in range(6)]
    assert sorted(owners) == [0, 0, 0, 1, 1, 1]


def test_least_outstanding_beats_fewest_served(pool: Pool) -> None:
    """Busy-but-fresh loses to idle-but-seasoned: in-flight load decides before history."""
    for i in range(5):
        assert post(pool.router, short(f"hist-{i}", session_id="delta"))[0] == 200
    seasoned = pool.owner("hist-0")
    fresh = 1 - seasoned
    extra = 0
    while served(pool)[seasoned] <= served(pool)[fresh]:
        assert post(pool.router, short(f"hist-x{extra}", session_id="delta"))[0] == 200
        extra += 1
    # A new session pins to the worker with fewer requests served; hold two long requests there.
    hogs = [
        threading.Thread(
            target=post, args=(pool.router, request_body(f"hog-{i}", session_id="eps"))
        )
        for i in range(2)
    ]
    for t in hogs:
        t.start()
    wait_for(lambda: all(calls(pool.records[fresh], f"hog-{i}") for i in range(2)))
    assert post(pool.router, short("probe"))[0] == 200
    for t in hogs:
        t.join(timeout=20)
    assert pool.owner("hog-0") == pool.owner("hog-1") == fresh
    assert pool.owner("probe") == seasoned


def test_pinned_session_stays_on_a_busier_worker(pool: Pool) -> None:
    assert post(pool.router, short("pin-0", session_id="gamma"))[0] == 200
    home = pool.owner("pin-0")
    hog = threading.Thread(
        target=post, args=(pool.router, request_body("pin-hog", session_id="gamma"))
    )
    hog.start()
    wait_for(lambda: calls(pool.records[home], "pin-hog"))
    # home now has a request in flight and the other worker none: the pin still wins.
    assert post(pool.router, short("pin-1", session_id="gamma"))[0] == 200
    hog.join(timeout=20)
    assert pool.owner("pin-1") == home


def test_hint_reaches_the_engine_through_the_router(pool: Pool) -> None:
    status, _ = post(pool.router, short("via-router", hint=HINT))
    assert status == 200
    (call,) = calls(pool.records[pool.owner("via-router")], "via-router")
    assert call["kwargs"]["kv_hints"] == retain_envelope("via-router", [(0, 3, 1800)])


@pytest.fixture(scope="module")
def pd(
    kvretention_process: StartKvretention, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, Path]:
    d = tmp_path_factory.mktemp("pd")
    prefill_rec, decode_rec = d / "prefill.jsonl", d / "decode.jsonl"
    prefill = kvretention_process(
        [
            "worker",
            "--engine",
            "standin:flat",
            "--role",
            "prefill",
            "--bootstrap-port",
            str(PD_BOOTSTRAP_PORT),
        ],
        env={"KVR_STANDIN_RECORD": str(prefill_rec)},
    )
    decode = kvretention_process(
        ["worker", "--engine", "standin:flat", "--role", "decode"],
        env={"KVR_STANDIN_RECORD": str(decode_rec)},
    )
    router = kvretention_process(
        ["router", "--prefill-worker", prefill.base_url, "--decode-worker", decode.base_url]
    )
    return router.base_url, prefill_rec, decode_rec


@pytest.mark.parametrize("hinted", [True, False])
def test_disaggregated_both_halves_get_the_hint_and_one_room(
    pd: tuple[str, Path, Path], hinted: bool
) -> None:
    router, prefill_rec, decode_rec = pd
    rid = f"pd-{hinted}"
    status, lines = post(router, request_body(rid, hint=HINT if hinted else None))
    assert status == 200
    assert "".join(line["text"] for line in lines) == "Hello from the kvretention stand-in."
    (p,) = calls(prefill_rec, rid)
    (d,) = calls(decode_rec, rid)
    for call in (p, d):
        kwargs: dict[str, Any] = call["kwargs"]
        assert (kwargs["bootstrap_host"], kwargs["bootstrap_port"]) == (
            "127.0.0.1",
            PD_BOOTSTRAP_PORT,
        )
        if hinted:
            assert kwargs["kv_hints"] == HINT
        else:
            assert "kv_hints" not in kwargs
    assert p["kwargs"]["bootstrap_room"] == d["kwargs"]["bootstrap_room"]
    assert json.dumps(p["kwargs"]["bootstrap_room"]).isdigit()


def test_workers_found_through_dns(kvretention_process: StartKvretention, pool: Pool) -> None:
    """``--worker-dns host:port`` resolves the name (a headless Service in Kubernetes)."""
    port = urllib.parse.urlsplit(pool.urls[0]).port
    router = kvretention_process(["router", "--worker-dns", f"localhost:{port}"])
    status, lines = post(router.base_url, short("via-dns"))
    assert status == 200 and lines[-1]["finish_reason"] == "length"
    assert pool.owner("via-dns") == 0
    with urllib.request.urlopen(router.base_url + "/v1/workers", timeout=5) as resp:
        found = {w["url"]: w["healthy"] for w in json.load(resp)}
    assert found.get(f"http://127.0.0.1:{port}") is True

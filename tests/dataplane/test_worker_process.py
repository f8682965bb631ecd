"""The worker as a real process with the engine stand-in: what reaches the engine, and what not.

One worker per dialect; each records its engine calls to a JSONL file (``KVR_STANDIN_RECORD``),
so the test reads exactly what ``Engine.async_generate`` was called with.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from support.kv_retain_rules import retain_envelope
from support.processes import KvrProcess, StartKvretention
from support.worker_client import HINT, calls, post, request_body, wait_for


class Worker:
    def __init__(self, process: KvrProcess, record: Path, trace: Path) -> None:
        self.process, self.record, self.trace = process, record, trace
        self.url = process.base_url

    def traces(self, rid: str) -> list[dict[str, Any]]:
        """The trace records of one request (written just after its stream ends)."""

        def found() -> list[dict[str, Any]]:
            lines = self.trace.read_text().splitlines() if self.trace.exists() else []
            return [e for e in map(json.loads, lines) if e["request_id"] == rid]

        return list(wait_for(found, timeout=5.0))


@pytest.fixture(scope="module")
def workers(
    kvretention_process: StartKvretention, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Worker]:
    out: dict[str, Worker] = {}
    for dialect in ("none", "flat", "versioned"):
        d = tmp_path_factory.mktemp(f"worker-{dialect}")
        record, trace = d / "calls.jsonl", d / "trace.jsonl"
        proc = kvretention_process(
            ["worker", "--engine", f"standin:{dialect}", "--trace-file", str(trace)],
            env={"KVR_STANDIN_RECORD": str(record)},
        )
        out[dialect] = Worker(proc, record, trace)
    return out


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        ("flat", HINT),
        (
            "versioned",
            retain_envelope("hinted-versioned", [(0, 3, 1800)]),
        ),
    ],
)
def test_hinted_request_reaches_the_engine_in_its_dialect(
    workers: dict[str, Worker], dialect: str, expected: dict[str, Any]
) -> None:
    w = workers[dialect]
    rid = f"hinted-{dialect}"
    status, lines = post(w.url, request_body(rid, hint=HINT))
    assert status == 200
    assert "".join(line["text"] for line in lines) == "Hello from the kvretention stand-in."
    assert lines[-1]["finish_reason"] == "stop"
    (call,) = calls(w.record, rid)
    assert call["kwargs"]["kv_hints"] == expected
    assert call["kwargs"]["stream"] is True
    assert call["kwargs"]["rid"] == rid
    assert call["kwargs"]["input_ids"] == [1, 2, 3]
    (trace,) = w.traces(rid)
    assert (trace["outcome"], trace["kv_hints"], trace["kv_hints_passed"]) == ("ok", expected, True)


@pytest.mark.parametrize("dialect", ["none", "flat", "versioned"])
def test_unhinted_request_calls_without_kv_hints(workers: dict[str, Worker], dialect: str) -> None:
    w = workers[dialect]
    rid = f"plain-{dialect}"
    status, lines = post(w.url, request_body(rid, sampling={"max_new_tokens": 2}))
    assert status == 200
    assert [line["text"] for line in lines] == ["Hello", " from"]
    assert lines[-1]["finish_reason"] == "length"
    (call,) = calls(w.record, rid)
    assert call["kv_hints_passed"] is False
    assert "kv_hints" not in call["kwargs"]
    assert call["kwargs"]["sampling_params"] == {"max_new_tokens": 2}
    (trace,) = w.traces(rid)
    assert trace["kv_hints_passed"] is False
    assert "kv_hints" not in trace


def test_hint_on_engine_without_kv_hints_fails_visibly_before_the_engine(
    workers: dict[str, Worker],
) -> None:
    w = workers["none"]
    status, (body,) = post(w.url, request_body("compat", hint=HINT))
    assert status == 501
    assert body["error"]["code"] == "kv_hints_unsupported"
    assert body["error"]["param"] == "kv_hints"
    assert "kv_hints" in body["error"]["message"]
    assert calls(w.record, "compat") == []
    (trace,) = w.traces("compat")
    assert trace["outcome"] == "rejected"
    assert "kv_hints" not in trace


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            request_body("bad-ttl", hint={"retain_full_prompt": {"ttl_seconds": 0}}),
            "kv_hints.retain_full_prompt.ttl_seconds",
        ),
        (request_body("bad-env", hint=[1]), "kv_hints"),
        (b"{not json", None),
    ],
)
def test_malformed_requests_are_400(
    workers: dict[str, Worker], body: bytes, param: str | None
) -> None:
    status, (err,) = post(workers["versioned"].url, body)
    assert status == 400
    assert err["error"]["code"] == "invalid_request"
    assert err["error"].get("param") == param


def test_info_reports_role_and_dialect(workers: dict[str, Worker]) -> None:
    parts = urlsplit(workers["versioned"].url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    conn.request("GET", "/v1/info")
    info = json.loads(conn.getresponse().read())
    conn.close()
    assert info["dialect"] == "versioned"
    assert info["role"] == "aggregated"


def test_metrics_count_passed_hints(workers: dict[str, Worker]) -> None:
    post(workers["flat"].url, request_body("metrics-1", hint=HINT))
    parts = urlsplit(workers["flat"].url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    assert 'kvretention_worker_kv_hints_passed_total{dialect="flat"}' in text

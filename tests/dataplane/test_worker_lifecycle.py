"""Worker behaviour over a request's life: SIGTERM drain, client disconnect, engine failures."""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from support.processes import KvrProcess, StartKvretention, http_ok
from support.standin_chain import StartRecordedWorker, start_recorded_worker
from support.worker_client import calls, leave_after_first_chunk, post, request_body, wait_for


def post_ignoring_errors(url: str, rid: str) -> None:
    """A client whose stream is cut off by the shutdown; only the worker's side is checked."""
    with contextlib.suppress(http.client.HTTPException, OSError, ValueError):
        post(url, request_body(rid))


@pytest.fixture
def worker(kvretention_process: StartKvretention, tmp_path: Path) -> StartRecordedWorker:
    """``worker(env=..., args=...)``: a stand-in worker recording its engine calls under the
    test's own directory (see :func:`start_recorded_worker`)."""
    return functools.partial(start_recorded_worker, kvretention_process, tmp_path)


def status_of(url: str, path: str, method: str = "GET", body: bytes | None = None) -> int:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    try:
        conn.request(method, path, body=body)
        status = conn.getresponse().status
    finally:
        conn.close()
    return status


def test_sigterm_drains_in_flight_streams_then_exits(worker: StartRecordedWorker) -> None:
    proc, record = worker(
        env={"KVR_STANDIN_DELAY_S": "0.25"},
        args=["--drain-seconds", "4"],
    )
    result: dict[str, Any] = {}
    client = threading.Thread(
        target=lambda: result.update(answer=post(proc.base_url, request_body("drain-1")))
    )
    client.start()
    wait_for(lambda: calls(record, "drain-1"))
    proc.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: status_of(proc.base_url, "/readyz") == 503, timeout=3)
    proc.proc.send_signal(signal.SIGINT)  # a second signal while draining changes nothing
    assert status_of(proc.base_url, "/v1/generate", "POST", request_body("late")) == 503
    client.join(timeout=10)
    status, lines = result["answer"]
    assert status == 200
    assert lines[-1]["finish_reason"] == "stop"
    assert "".join(line["text"] for line in lines) == "Hello from the kvretention stand-in."
    assert proc.proc.wait(timeout=10) == 0
    assert calls(record, "late") == []


def sigterm_during_a_slow_request(proc: KvrProcess, record: Path) -> float:
    """SIGTERM the worker while it streams request ``slow-1``: it must exit 0 and abort the
    request in the engine. The seconds from the signal to its exit."""
    client = threading.Thread(target=post_ignoring_errors, args=(proc.base_url, "slow-1"))
    client.start()
    wait_for(lambda: calls(record, "slow-1"))
    started = time.monotonic()
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(timeout=15) == 0
    took = time.monotonic() - started
    client.join(timeout=10)
    assert calls(record, "slow-1", event="abort")
    return took


def test_drain_deadline_aborts_what_is_left(worker: StartRecordedWorker) -> None:
    proc, record = worker(
        env={"KVR_STANDIN_DELAY_S": "2.0"},  # six chunks: left alone, the stream takes 12 s
        args=["--drain-seconds", "0.3"],
    )
    assert sigterm_during_a_slow_request(proc, record) < 8.0  # cut at the deadline, not its end


@pytest.mark.parametrize("engine", ["standin:flat", "standin:versioned"])
def test_sigterm_with_no_drain_time_refuses_new_work_and_exits_at_once(
    worker: StartRecordedWorker, engine: str
) -> None:
    """``--drain-seconds 0``: SIGTERM still stops the worker, promptly, cutting what is in flight
    (before: a second of shutdown grace on top, past twice that under load)."""
    proc, record = worker(
        engine=engine,
        args=["--drain-seconds", "0"],
        env={"KVR_STANDIN_DELAY_S": "9.0"},
    )
    assert sigterm_during_a_slow_request(proc, record) < 1.5


def test_client_disconnect_aborts_the_engine_request(worker: StartRecordedWorker) -> None:
    proc, record = worker(env={"KVR_STANDIN_DELAY_S": "0.3"})
    leave_after_first_chunk(proc.port, request_body("gone-1"))
    (abort,) = wait_for(lambda: calls(record, "gone-1", event="abort"))
    assert abort["rid"] == "gone-1"
    assert http_ok(proc.base_url + "/readyz")


@pytest.mark.parametrize(
    ("fail", "status", "last_code"),
    [("start", 500, "engine_error"), ("midstream", 200, "engine_error")],
)
def test_engine_failures_are_typed_errors(
    worker: StartRecordedWorker,
    fail: str,
    status: int,
    last_code: str,
) -> None:
    proc, _ = worker(env={"KVR_STANDIN_FAIL": fail})
    got, lines = post(proc.base_url, request_body(f"fail-{fail}"))
    assert got == status
    assert lines[-1]["error"]["code"] == last_code
    if fail == "midstream":
        assert lines[0]["text"] == "Hello"
    assert json.dumps(lines).count("Traceback") == 0

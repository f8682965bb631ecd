"""Router failure paths with real processes: no workers, a dying worker, re-admission, disconnects."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from support.processes import KvrProcess, StartKvretention, free_port, http_ok
from support.standin_chain import start_recorded_worker
from support.worker_client import calls, leave_after_first_chunk, post, request_body, wait_for

FAST_HEALTH = ["--health-interval", "0.2", "--health-timeout", "0.5"]


def workers_view(router: str) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(router + "/v1/workers", timeout=5) as resp:
        return {w["url"]: w for w in json.load(resp)}


def test_no_healthy_workers_is_503_no_workers(kvretention_process: StartKvretention) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    router = kvretention_process(["router", "--worker", dead, *FAST_HEALTH])
    assert not http_ok(router.base_url + "/readyz")
    status, (body,) = post(router.base_url, request_body("nobody"))
    assert status == 503
    assert body["error"]["code"] == "no_workers"


def test_no_pd_pair_is_503(kvretention_process: StartKvretention) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    router = kvretention_process(
        ["router", "--prefill-worker", dead, "--decode-worker", dead, *FAST_HEALTH]
    )
    status, (body,) = post(router.base_url, request_body("no-pair"))
    assert (status, body["error"]["code"]) == (503, "no_workers")


def restart(process: KvrProcess, env: dict[str, str]) -> KvrProcess:
    """Start the same worker command line again: same port, so the router can re-admit it."""
    log = process.log_path.with_suffix(".restart.log")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            process.args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )
    again = KvrProcess(proc=proc, base_url=process.base_url, port=process.port, log_path=log)
    again.args = process.args
    wait_for(lambda: http_ok(again.base_url + "/healthz"), timeout=30)
    return again


def test_worker_dying_mid_stream_gives_a_clean_error_then_is_readmitted(
    kvretention_process: StartKvretention, tmp_path: Path
) -> None:
    worker, record = start_recorded_worker(
        kvretention_process, tmp_path, env={"KVR_STANDIN_FAIL": "die"}
    )
    router = kvretention_process(["router", "--worker", worker.base_url, *FAST_HEALTH])
    started = time.monotonic()
    status, lines = post(router.base_url, request_body("dies"))
    assert time.monotonic() - started < 10
    assert status == 200
    assert lines[0]["text"] == "Hello"
    assert lines[-1]["error"]["code"] == "worker_unavailable"
    assert worker.proc.wait(timeout=5) == 17
    assert workers_view(router.base_url)[worker.base_url]["healthy"] is False
    assert not http_ok(router.base_url + "/readyz")
    status, (body,) = post(router.base_url, request_body("while-down"))
    assert (status, body["error"]["code"]) == (503, "no_workers")

    back = restart(worker, {"KVR_STANDIN_RECORD": str(record)})
    try:
        wait_for(lambda: workers_view(router.base_url)[worker.base_url]["healthy"], timeout=10)
        status, lines = post(router.base_url, request_body("after"))
        assert status == 200 and lines[-1]["finish_reason"] == "stop"
        assert calls(record, "after")
    finally:
        back.stop()


def test_killed_worker_is_ejected_and_traffic_moves_on(
    kvretention_process: StartKvretention,
) -> None:
    a = kvretention_process(["worker", "--engine", "standin:flat"])
    b = kvretention_process(["worker", "--engine", "standin:flat"])
    router = kvretention_process(
        # slow polls: the connection failure itself must eject, not the health loop
        ["router", "--worker", a.base_url, "--worker", b.base_url, "--health-interval", "30"]
    )
    a.proc.kill()
    a.proc.wait(timeout=5)
    for i in range(4):
        status, lines = post(router.base_url, request_body(f"survive-{i}"))
        assert status == 200 and lines[-1]["finish_reason"] == "stop"
    view = workers_view(router.base_url)
    assert view[a.base_url]["healthy"] is False
    assert view[b.base_url]["healthy"] is True


def test_client_disconnect_through_the_router_aborts_in_the_engine(
    kvretention_process: StartKvretention, tmp_path: Path
) -> None:
    worker, record = start_recorded_worker(
        kvretention_process, tmp_path, env={"KVR_STANDIN_DELAY_S": "0.3"}
    )
    router = kvretention_process(["router", "--worker", worker.base_url])
    leave_after_first_chunk(router.port, request_body("walk-away"))
    (abort,) = wait_for(lambda: calls(record, "walk-away", event="abort"))
    assert abort["rid"] == "walk-away"


def test_worker_errors_pass_through_unchanged(kvretention_process: StartKvretention) -> None:
    worker = kvretention_process(["worker", "--engine", "standin:none"])
    router = kvretention_process(["router", "--worker", worker.base_url])
    cases: list[tuple[int, Any, str]] = [
        (501, {"retain_full_prompt": {"ttl_seconds": 300}}, "kv_hints_unsupported"),
        (400, {"retain_full_prompt": {"ttl_seconds": 0}}, "invalid_request"),
    ]
    for status_expected, hint, code in cases:
        status, (body,) = post(router.base_url, request_body(f"err-{status_expected}", hint=hint))
        assert (status, body["error"]["code"]) == (status_expected, code)
        assert body["error"]["param"].startswith("kv_hints")

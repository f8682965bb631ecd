"""A busy worker is not a dead one: a burst of 200 KB agent bodies at one worker gets no 503.

frontend -> router -> one worker (the engine stand-in with a real chat template), as real
processes. The worker is made deterministically unable to answer anything (SIGSTOP: on a loaded
node a worker busy rendering prompts misses its polls the same way, only less reliably) until the
router has seen more failed polls in a row than ever eject a worker; a burst of Claude Code-shaped
~200 KB requests then arrives and waits in the router, and the worker is let go (SIGCONT). Every
request must be answered: the pool's last worker is never ejected for slowness.
"""

from __future__ import annotations

import json
import signal
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvretention.replay.sessions import CLAUDE_MODEL, claude_code_session
from support.chat_tokenizer import save
from support.processes import KvrProcess, StartKvretention
from support.worker_client import post_messages, wait_for

SERVED = "standin"
BURST = 8
EJECT_AFTER = 3
AGENT_TURNS = 300
"""About 200 KB of Claude Code body (17 tools, thinking / tool_use / tool_result history)."""


def workers_view(router: KvrProcess) -> dict[str, Any]:
    with urllib.request.urlopen(router.base_url + "/v1/workers", timeout=10) as resp:
        (worker,) = json.load(resp)
        return dict(worker)


def metric(router: KvrProcess, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    with urllib.request.urlopen(router.base_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def post_turn(frontend: KvrProcess, headers: dict[str, str], body: bytes) -> tuple[int, str]:
    return post_messages(frontend.port, {**headers, "x-api-key": "k"}, body, timeout=300)


@pytest.fixture(scope="module")
def path(
    kvretention_process: StartKvretention, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[KvrProcess, KvrProcess, KvrProcess]]:
    tokenizer = save(tmp_path_factory.mktemp("busy") / "tokenizer")
    worker = kvretention_process(
        ["worker", "--engine", "standin:versioned", "--model-path", str(tokenizer)], timeout=90.0
    )
    router = kvretention_process(
        [
            *("router", "--worker", worker.base_url, "--eject-after", str(EJECT_AFTER)),
            *("--health-interval", "0.1", "--health-timeout", "0.2"),
        ]
    )
    frontend = kvretention_process(
        [
            *("frontend", "--router-url", router.base_url, "--model", SERVED),
            *("--model-alias", f"{CLAUDE_MODEL}={SERVED}"),
        ]
    )
    yield frontend, router, worker
    if worker.alive():
        worker.proc.send_signal(signal.SIGCONT)


def test_a_burst_of_agent_bodies_at_a_stalled_worker_gets_no_503(
    path: tuple[KvrProcess, KvrProcess, KvrProcess],
) -> None:
    frontend, router, worker = path
    headers, body = claude_code_session(turns=AGENT_TURNS)[-1]
    raw = json.dumps(body).encode()
    assert len(raw) > 200_000
    wait_for(lambda: workers_view(router)["healthy"], timeout=30)
    status, _ = post_turn(frontend, headers, raw)
    assert status == 200

    worker.proc.send_signal(signal.SIGSTOP)
    try:
        # More failed polls in a row than eject a worker that has company, and still in rotation.
        wait_for(lambda: workers_view(router)["failures"] > EJECT_AFTER, timeout=60)
        assert workers_view(router)["healthy"] is True
        with ThreadPoolExecutor(BURST) as pool:
            answers = [pool.submit(post_turn, frontend, headers, raw) for _ in range(BURST)]
            # Every request is with the router (forwarded, waiting on the stalled worker).
            wait_for(lambda: workers_view(router)["outstanding"] == BURST, timeout=120)
            assert workers_view(router)["healthy"] is True
            worker.proc.send_signal(signal.SIGCONT)
            results = [a.result(timeout=300) for a in answers]
    finally:
        worker.proc.send_signal(signal.SIGCONT)
    assert [status for status, _ in results] == [200] * BURST
    for _, sse in results:
        assert "event: message_stop" in sse and "event: error" not in sse
    assert metric(router, "kvretention_router_worker_kept_total", why="last_worker") > 0
    assert metric(router, "kvretention_router_worker_ejections_total") == 0


def test_a_stalled_worker_with_company_is_ejected_after_failed_polls_in_a_row(
    kvretention_process: StartKvretention, tmp_path: Path
) -> None:
    """The other side of the rule: slowness ejects when another worker can take the traffic.
    (A whole second per poll, so the running worker's polls never time out on a loaded machine.)"""
    slow = kvretention_process(["worker", "--engine", "standin:flat"])
    fine = kvretention_process(["worker", "--engine", "standin:flat"])
    router = kvretention_process(
        [
            *("router", "--worker", slow.base_url, "--worker", fine.base_url),
            *("--health-interval", "0.1", "--health-timeout", "1", "--eject-after", "3"),
        ]
    )

    def view() -> dict[str, dict[str, Any]]:
        with urllib.request.urlopen(router.base_url + "/v1/workers", timeout=10) as resp:
            return {w["url"]: w for w in json.load(resp)}

    wait_for(lambda: all(w["healthy"] for w in view().values()), timeout=30)
    slow.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: not view()[slow.base_url]["healthy"], timeout=60)
        assert view()[fine.base_url]["healthy"] is True
        ejections = metric(router, "kvretention_router_worker_ejections_total", reason="timeout")
        assert ejections == 1
    finally:
        slow.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: view()[slow.base_url]["healthy"], timeout=30)

"""The plane's writes right after readiness: no answer, 429 and 5xx are asked again within a
bounded budget; any other answer (409 included) is the caller's at once."""

from __future__ import annotations

import http.server
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from kvretention_devtools.localcluster.httpjson import is_transient, write
from support.loopback_http import serving

DROP = -1  # close the connection without an answer (what a just-started API server can do)


@dataclass
class Script:
    """Answers in order; the last one repeats."""

    answers: list[int]
    seen: list[str] = field(default_factory=list)

    def next(self, method: str) -> int:
        self.seen.append(method)
        return self.answers[min(len(self.seen), len(self.answers)) - 1]


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script([])

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status = script.next(self.command)
            if status == DROP:
                self.close_connection = True
                return
            body = b'{"kind": "Status", "code": %d}' % status
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PATCH = do_PUT = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Handler) as base_url:
        yield base_url, script


@pytest.mark.parametrize(
    ("answers", "status", "tries"),
    [
        ([201], 201, 1),
        ([DROP, 201], 201, 2),
        ([503, 500, 201], 201, 3),
        ([429, 200], 200, 2),
        ([DROP, 502, 409], 409, 3),
        ([409, 201], 409, 1),  # already there: the caller decides, nothing is asked again
        ([400, 201], 400, 1),  # refused for good: fatal at once
        ([403, 201], 403, 1),
        ([404, 201], 404, 1),
        ([422, 201], 422, 1),
    ],
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, list) else str(v),
)
def test_transient_answers_are_asked_again_until_a_lasting_one(
    server: tuple[str, Script], answers: list[int], status: int, tries: int
) -> None:
    url, script = server
    script.answers = answers
    got, body = write("POST", f"{url}/api/v1/nodes", body={"x": 1}, first_delay_s=0.01)
    assert (got, len(script.seen)) == (status, tries)
    assert body == {"kind": "Status", "code": status}


def test_a_server_that_stays_broken_gives_its_last_answer_within_the_budget(
    server: tuple[str, Script],
) -> None:
    url, script = server
    script.answers = [DROP, 503]
    began = time.monotonic()
    got, body = write("PATCH", f"{url}/x", body={}, budget_s=0.5, first_delay_s=0.01)
    assert time.monotonic() - began < 2.5
    assert (got, body) == (503, {"kind": "Status", "code": 503})
    assert len(script.seen) >= 2, "asked again within the budget"
    assert set(script.seen) == {"PATCH"}


def test_no_server_at_all_ends_with_the_connection_error_shown() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    began = time.monotonic()
    got, body = write("POST", f"http://127.0.0.1:{port}/x", body={}, budget_s=0.3)
    assert time.monotonic() - began < 2.0
    assert got == 0
    assert f"no answer from http://127.0.0.1:{port}/x" in body
    assert "Connection refused" in body


@pytest.mark.parametrize(
    ("status", "transient"),
    [(0, True), (429, True), (500, True), (503, True), (200, False), (409, False), (404, False)],
)
def test_is_transient(status: int, transient: bool) -> None:
    assert is_transient(status) is transient

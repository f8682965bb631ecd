"""``kvretention replay`` against a fleet on SGLang's real engine: the command sends the recorded
Claude Code and Codex sessions through the frontend and reports SGLang's own ``cached_tokens`` per
turn, so a later turn must show its conversation read back from the radix cache."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from support.cpu_engine import SERVED_NAME, start_cpu_fleet
from support.processes import KvrProcess, StartKvretention

pytestmark = pytest.mark.cpu_engine

TURNS = 3
FLEET_TTL = 600
"""Codex sends no cache control: the fleet default retains its prompts."""


@pytest.fixture(scope="module")
def frontend(
    start: StartKvretention, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KvrProcess]:
    tmp = tmp_path_factory.mktemp("replay-fleet")
    fleet = start_cpu_fleet(
        start,
        tmp,
        sglang_args=["--max-total-tokens", "40000", "--context-length", "32768"],
        frontend_args=["--default-ttl-seconds", str(FLEET_TTL)],
    )
    yield fleet.frontend
    assert fleet.worker.shim_functions_called() == []


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvretention", "replay", *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_later_turns_read_their_conversation_from_sglangs_cache(frontend: KvrProcess) -> None:
    result = replay(frontend.base_url, "--turns", str(TURNS), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["model"] == SERVED_NAME  # the first name the fleet lists
    table = report["rows"]
    assert sorted((r["session"], r["turn"]) for r in table) == [
        (s, t) for s in ("claude-code", "codex") for t in range(TURNS)
    ]
    for row in table:
        assert row["prompt_tokens"] > 0, row
        if row["turn"] == 0:
            assert row["ideal"] == 0.0
            continue
        # everything the turn repeats was retained; at most the billing header's block and a
        # page's rounding are read again
        assert row["cached_tokens"] > 0 and row["share"] >= 0.8 * row["ideal"], row
    assert report["summary"]["turns"] == 2 * (TURNS - 1)


def test_the_text_table_ends_with_the_summary(frontend: KvrProcess) -> None:
    result = replay(frontend.base_url, "--turns", "2", "--session", "codex")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].split() == ["session", "turn", "prompt", "cached", "share", "ideal", "s"]
    assert [line.split()[:2] for line in lines[1:3]] == [["codex", "0"], ["codex", "1"]]
    assert lines[-1].startswith("later turns: median share ")


def test_a_refused_turn_stops_the_replay_with_the_providers_error(frontend: KvrProcess) -> None:
    result = replay(frontend.base_url, "--turns", "1", "--model", "not-served")
    assert result.returncode == 1
    assert "404" in result.stderr and "not-served" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
